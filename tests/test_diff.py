"""`weightcheck diff` end to end on real checkpoints (transformers save_pretrained, llm-compressor oneshot),
with defects planted by safetensors' writer and compressed-tensors' packing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import edit_tensors

from weightcheck.diffing import DiffOptions, NameMapError, diff, parse_name_map
from weightcheck.findings import Result

# Shared fixtures: the session-wide quantized suite and private copies of checkpoints.
quant_suite = quant_fixtures.quant_suite
copy_ckpt = quant_fixtures.copy_ckpt

LLAMA_TENSORS = 4 * 9 + 3  # 4 layers x 9 tensors, embed, norm, lm_head


def run_diff(a: Path, b: Path, **options) -> Result:
    return diff(a, b, DiffOptions(**options))


def by_code(result: Result, code: str) -> list:
    return [f for f in result.findings if f.code == code]


def swap_layers(tensors: dict, first: int, second: int, word: str = "layers") -> None:
    renamed = {}
    for key in list(tensors):
        for a, b in ((first, second), (second, first)):
            if f".{word}.{a}." in key:
                renamed[key.replace(f".{word}.{a}.", f".{word}.{b}.")] = tensors.pop(key)
    tensors.update(renamed)


def with_nan(w: torch.Tensor) -> torch.Tensor:
    out = w.clone()
    out[3, 7] = float("nan")
    return out


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)


# ---- lossless paths -------------------------------------------------------------------------------
def test_identical_copy_is_clean_with_full_coverage(make_ckpt, copy_ckpt) -> None:
    a = make_ckpt("llama")
    result = run_diff(a, copy_ckpt(a))
    assert result.exit_code() == 0 and not result.findings
    assert result.checked["compared"] == result.checked["equal"] == LLAMA_TENSORS
    assert result.checked["failed"] == result.checked["skipped"] == 0
    assert result.checked["only_in_reference"] == result.checked["only_in_candidate"] == 0
    assert any(note.startswith("coverage: ") for note in result.notes)


def test_swapped_layers_are_reported_with_their_offsets(make_ckpt, copy_ckpt) -> None:
    """Done criterion: layers 0 and 1 swapped → both layers, class shifted/swapped, offsets +1 and -1."""
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    edit_tensors(b, lambda t: swap_layers(t, 0, 1))
    result = run_diff(a, b)
    assert result.exit_code() == 1
    (finding,) = by_code(result, "WC705")
    assert finding.details["class"] == "shifted/swapped"
    assert finding.details["layers"] == "0..1"
    offsets = {(e["tensor"].split(".")[2], e["evidence"]["offset"]) for e in finding.details["tensors"]}
    assert offsets == {("0", 1), ("1", -1)}
    assert "layer 0 holds the reference's layer 1 (offset +1, swapped)" in finding.message
    assert "layer 1 holds the reference's layer 0 (offset -1, swapped)" in finding.message
    # Random-init norms are all ones, identical across layers: they still compare equal.
    assert finding.count == 2 * 7
    assert {f.code for f in result.findings} == {"WC705"}
    assert result.checked["failed"] == 14 and result.checked["equal"] == LLAMA_TENSORS - 14


def test_shifted_expert_reports_expert_offset(make_ckpt, copy_ckpt) -> None:
    a = make_ckpt("qwen3_moe")
    b = copy_ckpt(a)

    def shift(t: dict) -> None:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            key = "model.layers.1.mlp.experts.{}." + proj + ".weight"
            t[key.format(2)] = t[key.format(3)].clone()  # expert 2 got expert 3's weights

    edit_tensors(b, shift)
    (finding,) = by_code(run_diff(a, b), "WC705")
    assert {(e["evidence"]["index"], e["evidence"]["offset"]) for e in finding.details["tensors"]} == {("expert", 1)}
    assert finding.count == 3


@pytest.mark.parametrize(
    "plant, code",
    [
        (lambda w: torch.rand(w.shape, dtype=torch.float32).to(w.dtype), "WC702"),  # never written
        (lambda w: torch.zeros_like(w), "WC703"),
        (lambda w: w.t().contiguous(), "WC706"),  # square q_proj: same shape, transposed values
        (lambda w: (w.float() * 1.25).to(w.dtype), "WC707"),
        (lambda w: torch.cat([w[:32], torch.zeros_like(w[32:])]), "WC708"),  # TP shard 0 of 2
        (lambda w: w[:, 32:].contiguous(), "WC708"),  # only TP shard 1 of 2 stored
        (with_nan, "WC704"),
    ],
)
def test_mismatch_classes(make_ckpt, copy_ckpt, plant, code: str) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    name = "model.layers.2.self_attn.q_proj.weight"
    edit_tensors(b, lambda t: t.__setitem__(name, plant(t[name])))
    result = run_diff(a, b)
    (finding,) = result.findings
    assert finding.code == code and finding.location.tensor == name and finding.count == 1
    assert result.checked["failed"] == 1


# ---- coverage: maps, only-in, skips, policy ---------------------------------------------------------
def test_name_map_pairs_renamed_tensors(make_ckpt, copy_ckpt, tmp_path: Path) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    edit_tensors(b, lambda t: t.update({k.replace("model.", "model.language_model.", 1): t.pop(k) for k in list(t)}))
    unmapped = run_diff(a, b)
    assert unmapped.checked["only_in_reference"] == unmapped.checked["only_in_candidate"] == LLAMA_TENSORS - 1
    assert {f.code for f in unmapped.findings} == {"WC713", "WC714"} and unmapped.exit_code() == 1
    rules = parse_name_map("# VLM wrapper\nmodel.* -> model.language_model.*\n")
    mapped = run_diff(a, b, maps=rules)
    assert mapped.exit_code() == 0 and mapped.checked["equal"] == LLAMA_TENSORS


def test_name_map_errors() -> None:
    with pytest.raises(NameMapError, match="m:1"):
        parse_name_map("a.* -> b", source="m")
    with pytest.raises(NameMapError, match="expected"):
        parse_name_map("a b", source="m")


def test_missing_tensor_fails_unless_allowed(make_ckpt, copy_ckpt) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    edit_tensors(b, lambda t: t.pop("model.layers.3.mlp.down_proj.weight"))
    result = run_diff(a, b)
    (finding,) = result.findings
    assert finding.code == "WC713" and finding.severity.label == "error" and result.exit_code() == 1
    allowed = run_diff(a, b, allow_skip=["model.layers.3.mlp.*"])
    assert allowed.exit_code() == 0 and allowed.findings[0].severity.label == "info"
    assert allowed.checked["only_in_reference"] == 1


def test_a_tensor_of_any_name_is_compared_by_the_built_in_policy(make_ckpt, copy_ckpt) -> None:
    """A buffer saved with the weights (rotary inv_freq) has no rule of its own: the built-in policy's last rule
    compares it as stored, so equal ones pass and a changed one is a mismatch, never a skip."""
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    for path in (a, b):
        edit_tensors(path, lambda t: t.__setitem__("model.rotary_emb.inv_freq", torch.arange(8, dtype=torch.float32)))
    result = run_diff(a, b)
    assert result.findings == [] and result.exit_code() == 0 and result.checked.get("skipped", 0) == 0
    edit_tensors(b, lambda t: t.__setitem__("model.rotary_emb.inv_freq", torch.arange(8, dtype=torch.float32) * 2))
    changed = run_diff(a, b)
    assert changed.exit_code() == 1 and any("inv_freq" in (f.location.tensor or "") for f in changed.findings)


def test_with_no_default_policy_a_tensor_no_rule_matches_is_an_error_not_a_pass(make_ckpt, copy_ckpt) -> None:
    from weightcheck.compare.policy import parse_policy

    a = make_ckpt("llama")
    b = copy_ckpt(a)
    for path in (a, b):
        edit_tensors(path, lambda t: t.__setitem__("model.rotary_emb.inv_freq", torch.arange(8, dtype=torch.float32)))
    weights_only = parse_policy(r"(^|\.)(weight|bias)$ auto", "test")
    result = run_diff(a, b, policy_rules=weights_only, default_policy=False)
    (finding,) = result.findings
    assert finding.code == "WC716" and result.checked["skipped"] == 1 and result.exit_code() == 1
    allowed = run_diff(a, b, policy_rules=weights_only, default_policy=False, allow_skip=["*.inv_freq"])
    assert allowed.exit_code() == 0


def test_unreadable_shard_is_an_explicit_skip(make_ckpt, copy_ckpt) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    shard = sorted(b.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    result = run_diff(a, b)
    skipped = by_code(result, "WC715")
    assert skipped and "truncated" in skipped[0].message and result.exit_code() == 1
    assert result.checked["skipped"] == skipped[0].count > 0


# ---- quantized checkpoints --------------------------------------------------------------------------
def test_bf16_against_its_w4a16_passes_within_quantization_error(quant_suite: dict[str, Path]) -> None:
    result = run_diff(quant_suite["base"], quant_suite["W4A16"])
    assert result.exit_code() == 0
    assert result.checked["within_tolerance"] == 21 and result.checked["failed"] == 0
    (finding,) = result.findings
    assert finding.code == "WC711" and finding.severity.label == "info" and "rel-L2" in finding.message


@pytest.mark.parametrize("scheme", ["W4A16_ASYM", "W8A8", "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "HF_FP8"])
def test_bf16_against_other_formats_passes(quant_suite: dict[str, Path], scheme: str) -> None:
    result = run_diff(quant_suite["base"], quant_suite[scheme])
    assert result.exit_code() == 0 and result.checked["failed"] == 0, [f.message for f in result.findings]


def test_one_code_two_steps_off_fails(quant_suite: dict[str, Path], copy_ckpt) -> None:
    """Done criterion: one INT4 code moved by 2 steps (one ULP more than the 1 allowed) fails, naming it."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    b = copy_ckpt(quant_suite["W4A16"])
    module = "model.layers.1.mlp.down_proj"

    def corrupt(t: dict) -> None:
        packed = t[f"{module}.weight_packed"]
        shape = torch.Size(t[f"{module}.weight_shape"].tolist())
        codes = unpack_from_int32(packed, 4, shape)
        code = int(codes[10, 20])
        codes[10, 20] = code + 2 if code <= 5 else code - 2
        t[f"{module}.weight_packed"] = pack_to_int32(codes, 4)

    edit_tensors(b, corrupt)
    result = run_diff(quant_suite["base"], b)
    assert result.exit_code() == 1 and result.checked["failed"] == 1
    (failed,) = [f for f in result.findings if f.severity.label == "error"]
    assert failed.location.tensor == f"{module}.weight"
    metrics = failed.details["tensors"][0]["metrics"]
    assert metrics["outside_tolerance"] == 1 and metrics["first_outside_at"] == [10, 20]


def test_two_quantized_copies_compare_their_stored_parts(quant_suite: dict[str, Path], copy_ckpt) -> None:
    a = quant_suite["W4A16"]
    result = run_diff(a, copy_ckpt(a))
    assert result.exit_code() == 0 and result.checked["equal"] == 30 and not result.findings


def test_malformed_quantized_tensor_is_reported(quant_suite: dict[str, Path], copy_ckpt) -> None:
    b = copy_ckpt(quant_suite["W4A16"])
    name = "model.layers.0.mlp.up_proj.weight_scale"
    edit_tensors(b, lambda t: t.__setitem__(name, torch.ones(512, 3, dtype=torch.bfloat16)))
    result = run_diff(quant_suite["base"], b)
    (finding,) = by_code(result, "WC717")
    assert finding.location.tensor == "model.layers.0.mlp.up_proj.weight" and result.exit_code() == 1


def test_a_comparison_bug_is_an_internal_error_not_a_pass(make_ckpt, copy_ckpt, monkeypatch) -> None:
    import weightcheck.compare.engine as engine

    a = make_ckpt("llama")
    real = engine.compare_pair

    def flaky(op_a, op_b, rule):
        if op_a.name == "model.norm.weight":
            raise RuntimeError("boom")
        return real(op_a, op_b, rule)

    monkeypatch.setattr(engine, "compare_pair", flaky)
    result = run_diff(a, copy_ckpt(a))
    (finding,) = result.findings
    assert finding.code == "WC000" and "boom" in finding.message and result.exit_code() == 2
    assert result.checked["equal"] == LLAMA_TENSORS - 1


# ---- command line -----------------------------------------------------------------------------------
def test_cli_json_and_exit_codes(make_ckpt, copy_ckpt, tmp_path: Path) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    clean = wc("diff", str(a), str(b), "--format", "json", "--no-progress")
    assert clean.returncode == 0, clean.stderr
    doc = json.loads(clean.stdout)
    assert doc["command"] == "diff" and doc["summary"]["checked"]["equal"] == LLAMA_TENSORS
    assert clean.stderr == ""  # --no-progress: nothing on stderr (else a line every 10 s off a terminal)
    edit_tensors(b, lambda t: t.pop("lm_head.weight"))
    assert wc("diff", str(a), str(b)).returncode == 1
    assert wc("diff", str(a), str(b), "--allow-skip", "lm_head.weight").returncode == 0
    assert wc("diff", str(a), str(tmp_path / "nope")).returncode == 3
    bad_map = tmp_path / "bad.map"
    bad_map.write_text("a.* -> b\n")
    usage = wc("diff", str(a), str(b), "--map", str(bad_map))
    assert usage.returncode == 2 and "same number" in usage.stderr
    policy = tmp_path / "policy.txt"
    policy.write_text("lm_head fuzzy\n")
    assert wc("diff", str(a), str(b), "--policy", str(policy)).returncode == 2
    sarif = json.loads(wc("diff", str(a), str(b), "--format", "sarif").stdout)
    assert sarif["runs"][0]["results"][0]["ruleId"] == "WC713"


def test_rules_listing_documents_diff_codes() -> None:
    from weightcheck.rules import all_rules

    codes = {c for c, r in all_rules().items() if r.command == "diff"}
    assert {f"WC7{n:02d}" for n in range(1, 18)} <= codes
    assert all(c < "WC720" for c in codes if c.startswith("WC70") or c.startswith("WC71"))


def test_builtin_name_map_from_pattern_root_alias() -> None:
    from weightcheck.diffing import builtin_name_maps, map_name

    cfg = {"model_type": "qwen2_5_vl"}
    new_layout = ["model.language_model.layers.0.mlp.down_proj.weight", "model.language_model.norm.weight",
                  "model.visual.blocks.0.attn.qkv.weight"]  # fmt: skip
    hub_layout = ["model.layers.0.mlp.down_proj.weight", "model.norm.weight", "visual.blocks.0.attn.qkv.weight"]
    rules = builtin_name_maps(cfg, new_layout, hub_layout)
    assert [map_name(n, rules) for n in new_layout] == [*hub_layout[:2], "model.visual.blocks.0.attn.qkv.weight"]
    assert builtin_name_maps(cfg, hub_layout, hub_layout) == []
    assert builtin_name_maps({"model_type": "llama"}, new_layout, hub_layout) == []


@pytest.mark.parametrize("model_type", ["gpt_oss", "gemma3", "rwkv"])
def test_two_saves_of_one_model_are_equal_whatever_their_tensors_are_called(tmp_path: Path, model_type: str) -> None:
    """gpt-oss's attention `sinks`, Gemma-3's SigLIP `probe` and `in_proj_weight`, RWKV's `time_*`: no rule of
    their own, compared by the built-in policy's last rule. Two saves of one model (different sharding) are
    equal: exit 0, nothing skipped; one sink changed is a mismatch."""
    from tools.archgen.tiny import build

    model = build(model_type, "A")
    model.save_pretrained(tmp_path / "a")
    model.save_pretrained(tmp_path / "b", max_shard_size="200KB")
    result = run_diff(tmp_path / "a", tmp_path / "b")
    assert result.exit_code() == 0 and result.findings == [] and result.checked.get("skipped", 0) == 0
    if model_type == "gpt_oss":
        sink = "model.layers.1.self_attn.sinks"
        edit_tensors(tmp_path / "b", lambda t: t.__setitem__(sink, t[sink] + 1))
        changed = run_diff(tmp_path / "a", tmp_path / "b")
        assert changed.exit_code() == 1 and any(sink in (f.location.tensor or "") for f in changed.findings)
