"""`lint --content` (WC6xx) and the digest/manifest API, on real checkpoints with planted defects.

Each rule is shown a checkpoint with its defect and the untouched original (which must stay clean)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import edit_tensors

from weightcheck.digest import (
    ManifestError,
    TensorDigest,
    compare_digests,
    digest_stored,
    digest_tensor,
    read_manifest,
    write_manifest,
)
from weightcheck.findings import Result
from weightcheck.linting import lint
from weightcheck.tensors import TensorStore

# Shared fixtures: the session-wide quantized suite and private copies of checkpoints.
quant_suite = quant_fixtures.quant_suite
copy_ckpt = quant_fixtures.copy_ckpt


def content(path: Path, **options) -> Result:
    return lint(path, options={"content": True, **options})


def wc6(result: Result) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in result.findings:
        if f.code.startswith("WC6"):
            out.setdefault(f.code, []).append(f)
    return out


def set_tensor(path: Path, name: str, value) -> None:
    edit_tensors(path, lambda t: t.__setitem__(name, value(t[name]) if callable(value) else value))


Q_PROJ = "model.layers.1.self_attn.q_proj.weight"


def test_clean_checkpoints_have_no_content_findings(make_ckpt, quant_suite: dict[str, Path]) -> None:
    for path in (make_ckpt("llama"), make_ckpt("qwen3_moe"), quant_suite["W4A16"], quant_suite["MXFP4A16"]):
        assert wc6(content(path)) == {}, path


def test_content_rules_run_only_with_content(make_ckpt) -> None:
    path = make_ckpt("llama")
    set_tensor(path, Q_PROJ, lambda w: torch.zeros_like(w))
    assert not wc6(lint(path))
    assert "WC602" in wc6(content(path))


def test_nan_and_inf(make_ckpt) -> None:
    path = make_ckpt("llama")

    def plant(w: torch.Tensor) -> torch.Tensor:
        w = w.clone()
        w[0, :3] = float("nan")
        w[1, 0] = float("-inf")
        return w

    set_tensor(path, Q_PROJ, plant)
    (finding,) = wc6(content(path))["WC601"]
    assert finding.location.tensor == Q_PROJ and finding.details == {"nan": 3, "inf": 1}


def test_inf_alone(make_ckpt) -> None:
    path = make_ckpt("llama")
    set_tensor(path, "model.norm.weight", lambda w: torch.where(torch.arange(w.numel()) == 5, float("inf"), w))
    (finding,) = wc6(content(path))["WC601"]
    assert finding.details == {"nan": 0, "inf": 1}


def test_all_zero_matrix_but_not_zero_bias(make_ckpt) -> None:
    path = make_ckpt("llama")
    set_tensor(path, Q_PROJ, lambda w: torch.zeros_like(w))
    edit_tensors(path, lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.bias", torch.zeros(64)))
    found = wc6(content(path))
    assert [f.location.tensor for f in found["WC602"]] == [Q_PROJ]
    assert "WC604" not in found  # all-zero is reported once, as WC602


def test_constant_matrix_but_not_constant_norm(make_ckpt) -> None:
    path = make_ckpt("llama")  # random-init norms are all 1.0: legitimate
    set_tensor(path, Q_PROJ, lambda w: torch.full_like(w, 0.5))
    found = wc6(content(path))
    (finding,) = found["WC604"]
    assert finding.location.tensor == Q_PROJ and "0.5" in finding.message


def test_packed_weight_of_one_repeated_code_is_constant(quant_suite: dict[str, Path], copy_ckpt) -> None:
    path = copy_ckpt(quant_suite["W4A16"])
    name = "model.layers.0.mlp.up_proj.weight_packed"
    set_tensor(path, name, lambda w: torch.zeros_like(w))  # every code -8
    (finding,) = wc6(content(path))["WC604"]
    assert finding.location.tensor == name


def test_zero_and_negative_scales(quant_suite: dict[str, Path], copy_ckpt) -> None:
    path = copy_ckpt(quant_suite["W4A16"])
    name = "model.layers.0.mlp.down_proj.weight_scale"

    def plant(scale: torch.Tensor) -> torch.Tensor:
        scale = scale.clone()
        scale[0, 0] = 0
        scale[1, 0] = -scale[1, 0]
        return scale

    set_tensor(path, name, plant)
    (finding,) = wc6(content(path))["WC603"]
    assert finding.location.tensor == name and finding.details == {"zero": 1, "negative": 1}


def test_e8m0_scale_nan_code(quant_suite: dict[str, Path], copy_ckpt) -> None:
    path = copy_ckpt(quant_suite["MXFP4A16"])
    name = "model.layers.2.mlp.gate_proj.weight_scale"
    set_tensor(path, name, lambda s: torch.where(torch.arange(s.numel()).reshape(s.shape) == 0, 255, s).to(s.dtype))
    (finding,) = wc6(content(path))["WC603"]
    assert "0xFF" in finding.message


def test_tied_embeddings_that_differ(make_ckpt) -> None:
    path = make_ckpt("qwen3_tied")  # tie_word_embeddings true, lm_head not stored: fine
    assert "WC605" not in wc6(content(path))
    embed = "model.embed_tokens.weight"
    edit_tensors(path, lambda t: t.__setitem__("lm_head.weight", t[embed].clone()))
    assert "WC605" not in wc6(content(path))  # stored twice but identical (WC407 warns about storing it)
    edit_tensors(path, lambda t: t.__setitem__("lm_head.weight", t[embed] * 2))
    (finding,) = wc6(content(path))["WC605"]
    assert finding.location.tensor == "lm_head.weight"


def test_unreadable_shard_is_reported_as_not_checked(make_ckpt) -> None:
    path = make_ckpt("llama")
    shard = sorted(path.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-64])
    result = content(path)
    (finding,) = wc6(result)["WC608"]
    assert "truncated" in finding.message and finding.count > 0
    assert any(f.code.startswith("WC1") for f in result.findings)


# ---- manifest ------------------------------------------------------------------------------------
def test_hash_manifest_round_trip_and_mismatches(make_ckpt, tmp_path: Path) -> None:
    path = make_ckpt("llama")
    manifest = tmp_path / "manifest.json"
    assert not wc6(content(path, hash_out=str(manifest)))
    doc = json.loads(manifest.read_text())
    assert doc["schema_version"] == "1.0" and doc["kind"] == "weightcheck-manifest"
    assert len(doc["tensors"]) == 4 * 9 + 3
    entry = doc["tensors"][Q_PROJ]
    assert entry["dtype"] == "F32" and entry["shape"] == [64, 64] and len(entry["sha256"]) == 64
    assert not wc6(content(path, against_manifest=str(manifest)))

    set_tensor(path, Q_PROJ, lambda w: torch.where(w == w.flatten()[0], -w, w))  # one element's sign
    edit_tensors(path, lambda t: t.pop("model.layers.3.mlp.up_proj.weight"))
    edit_tensors(path, lambda t: t.__setitem__("extra.weight", torch.ones(2)))
    found = wc6(content(path, against_manifest=str(manifest)))["WC606"]
    messages = {f.location.tensor: f.message for f in found}
    assert messages[Q_PROJ].startswith("bytes differ (sha256)")
    assert "not in the checkpoint" in messages["model.layers.3.mlp.up_proj.weight"]
    assert "not in the manifest" in messages["extra.weight"]


@pytest.mark.parametrize(
    "text, error",
    [
        ("{", "not valid JSON"),
        ('{"kind": "other"}', "not a weightcheck manifest"),
        ('{"kind": "weightcheck-manifest", "schema_version": "9.0", "tensors": {}}', "schema_version"),
        ('{"kind": "weightcheck-manifest", "schema_version": "1.0", "tensors": {"a": {"dtype": "X"}}}', "dtype"),
    ],
)
def test_invalid_manifest_is_a_finding(make_ckpt, tmp_path: Path, text: str, error: str) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(text)
    with pytest.raises(ManifestError, match=error):
        read_manifest(manifest)
    (finding,) = wc6(content(make_ckpt("llama"), against_manifest=str(manifest)))["WC607"]
    assert error in finding.message


def test_unwritable_hash_output_is_a_finding(make_ckpt, tmp_path: Path) -> None:
    (finding,) = wc6(content(make_ckpt("llama"), hash_out=str(tmp_path / "missing-dir" / "m.json")))["WC607"]
    assert "cannot write" in finding.message


def test_cli_content_hash_and_manifest(make_ckpt, tmp_path: Path) -> None:
    path = make_ckpt("llama")
    manifest = tmp_path / "m.json"

    def wc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)

    assert wc("lint", str(path), "--content", "--hash", str(manifest)).returncode == 0
    assert wc("lint", str(path), "--content", "--against-manifest", str(manifest)).returncode == 0
    set_tensor(path, Q_PROJ, lambda w: w * 2)
    proc = wc("lint", str(path), "--content", "--against-manifest", str(manifest), "--format", "json", "--no-progress")
    assert proc.returncode == 1 and proc.stderr == ""
    assert {f["code"] for f in json.loads(proc.stdout)["findings"]} == {"WC606"}


# ---- digest API ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(7, 5, dtype=torch.bfloat16),
        torch.randn(3, 4).to(torch.float8_e4m3fn),
        torch.tensor(3.5),  # 0-D
        torch.tensor([True, False, True]),
        torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),  # non-contiguous
        torch.zeros(0, 4),
        torch.randint(0, 255, (2, 3), dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
    ],
    ids=["bf16", "fp8", "scalar", "bool", "transposed", "empty", "fp4"],
)
def test_digest_tensor_equals_digest_of_the_saved_tensor(tmp_path: Path, tensor: torch.Tensor) -> None:
    """The live-sync contract: hashing a tensor in memory gives what hashing it on disk gives."""
    from safetensors.torch import save_file

    save_file({"t": tensor.contiguous()}, str(tmp_path / "model.safetensors"))
    stored = digest_stored(TensorStore.open(tmp_path), "t")
    assert digest_tensor(tensor) == stored


def test_digest_sees_signed_zero_and_dtype() -> None:
    zeros = torch.zeros(4)
    assert digest_tensor(zeros) != digest_tensor(-zeros)
    assert digest_tensor(zeros).difference(digest_tensor(zeros.to(torch.float64))) == "dtype F32 → F64"
    assert digest_tensor(zeros).difference(digest_tensor(zeros.reshape(2, 2))) == "shape [4] → [2, 2]"


def test_manifest_write_read_compare(tmp_path: Path) -> None:
    digests = {"a": digest_tensor(torch.ones(3)), "b": digest_tensor(torch.zeros(2, dtype=torch.int8))}
    write_manifest(tmp_path / "m.json", digests)
    assert read_manifest(tmp_path / "m.json") == digests
    changed = {"a": TensorDigest("F32", (3,), "0" * 64), "c": digests["b"]}
    result = compare_digests(digests, changed)
    assert (result.missing, result.extra, result.changed) == (["b"], ["c"], {"a": "bytes differ (sha256)"})
    assert compare_digests(digests, dict(digests)).ok


def test_against_an_xxh3_manifest(make_ckpt, tmp_path: Path) -> None:
    """A trainer-side xxh3_128 manifest checks a checkpoint too: hashed with the manifest's algorithm."""
    path = make_ckpt("llama")
    manifest = tmp_path / "manifest.json"
    with TensorStore.open(path) as store:
        write_manifest(manifest, {name: digest_stored(store, name, "xxh3_128") for name in store.names()})
    assert "xxh3_128" in json.loads(manifest.read_text())["tensors"][Q_PROJ]
    assert not wc6(content(path, against_manifest=str(manifest)))
    # --hash still writes sha256 (a published manifest stays cryptographic) in the same run
    out = tmp_path / "out.json"
    assert not wc6(content(path, against_manifest=str(manifest), hash_out=str(out)))
    assert len(json.loads(out.read_text())["tensors"][Q_PROJ]["sha256"]) == 64
    set_tensor(path, Q_PROJ, lambda w: w * 2)
    (finding,) = wc6(content(path, against_manifest=str(manifest)))["WC606"]
    assert finding.location.tensor == Q_PROJ and finding.message.startswith("bytes differ (xxh3_128)")
