"""A bad and a good test for the codes that had none (WC316, WC701, WC709, WC710, WC712, WC718), and diff's
rules as objects: an unknown code or mismatch class fails loudly instead of vanishing from the report.

Fixtures come from real writers: transformers' save_pretrained (tests/conftest.py `make_ckpt`), damaged with
safetensors' own writer (`edit_tensors`); the ModelOpt pair is NVIDIA's published MiniMax-M2.5-NVFP4
config.json + hf_quant_config.json, vendored verbatim in tests/data/published_quant_configs.json.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import edit_tensors

from weightcheck.diffing import DiffOptions, diff
from weightcheck.findings import Result, Severity

copy_ckpt = quant_fixtures.copy_ckpt

Q_PROJ = "model.layers.2.self_attn.q_proj.weight"
DATA = json.loads((Path(__file__).parent / "data" / "published_quant_configs.json").read_text())


def codes(result: Result) -> set[str]:
    return {f.code for f in result.findings}


def set_tensor(path: Path, name: str, make) -> None:
    edit_tensors(path, lambda t: t.__setitem__(name, make(t[name])))


def pair(make_ckpt, copy_ckpt) -> tuple[Path, Path]:
    a = make_ckpt("llama")
    return a, copy_ckpt(a)


# ---- WC701 diff-value-mismatch ------------------------------------------------------------------------------
def _noise(w: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return (w.float() + torch.randn(w.shape, generator=g) * w.float().std()).to(w.dtype)


def test_wc701_bad_noise_in_no_recognised_pattern(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, _noise)
    result = diff(a, b, DiffOptions())
    (finding,) = result.findings
    assert finding.code == "WC701" and finding.name == "diff-value-mismatch" and finding.location.tensor == Q_PROJ
    assert finding.details["class"] == "value-mismatch" and finding.severity is Severity.ERROR
    assert result.exit_code() == 1 and result.checked["failed"] == 1


def test_wc701_good_noise_of_zero_amplitude(make_ckpt, copy_ckpt) -> None:
    """The same rewrite of the tensor through safetensors' writer, values unchanged: no finding."""
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, lambda w: w.clone())
    result = diff(a, b, DiffOptions())
    assert result.findings == [] and result.exit_code() == 0 and result.checked["equal"] == result.checked["compared"]


# ---- WC709 diff-dtype-mismatch ------------------------------------------------------------------------------
def test_wc709_bad_integer_candidate_without_scale(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, lambda w: (w.float() * 100).round().to(torch.int8))
    result = diff(a, b, DiffOptions())
    (finding,) = result.findings
    assert finding.code == "WC709" and finding.location.tensor == Q_PROJ
    assert finding.details["tensors"][0]["evidence"]["dtype_b"].upper().startswith("I8")


def test_wc709_good_lossless_widening(make_ckpt, copy_ckpt) -> None:
    """A float32 candidate of a float32/bfloat16 reference holds the same values: compared exactly."""
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, lambda w: w.to(torch.float64).to(torch.float32))
    result = diff(a, b, DiffOptions())
    assert "WC709" not in codes(result) and result.exit_code() == 0


# ---- WC710 diff-shape-mismatch ------------------------------------------------------------------------------
def test_wc710_bad_rows_missing_in_no_shard_pattern(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, lambda w: w[:-8].clone())  # 56 of 64 rows: no 1/n TP shard, not a transpose
    result = diff(a, b, DiffOptions())
    (finding,) = result.findings
    assert finding.code == "WC710" and finding.details["class"] == "shape-mismatch" and result.exit_code() == 1


def test_wc710_good_same_shape(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, lambda w: w.reshape(w.shape).clone())
    assert "WC710" not in codes(diff(a, b, DiffOptions()))


# ---- WC712 diff-within-tolerance ----------------------------------------------------------------------------
def _with_zero(value: float):
    def plant(w: torch.Tensor) -> torch.Tensor:
        out = w.clone()
        out[0, :4] = value
        return out

    return plant


def test_wc712_bad_signed_zeros_equal_in_value_not_in_bytes(make_ckpt, copy_ckpt) -> None:
    """+0.0 in the reference, -0.0 in the candidate: equal values, different bytes → info, exit 0."""
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(a, Q_PROJ, _with_zero(0.0))
    set_tensor(b, Q_PROJ, _with_zero(-0.0))
    result = diff(a, b, DiffOptions())
    (finding,) = result.findings
    assert finding.code == "WC712" and finding.severity is Severity.INFO and finding.location.tensor == Q_PROJ
    assert result.exit_code() == 0 and result.checked["within_tolerance"] == 1


def test_wc712_good_same_zeros(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(a, Q_PROJ, _with_zero(0.0))
    set_tensor(b, Q_PROJ, _with_zero(0.0))
    result = diff(a, b, DiffOptions())
    assert result.findings == [] and result.checked["within_tolerance"] == 0


# ---- WC718 diff-file-refused --------------------------------------------------------------------------------
def _shard_symlinked_out(path: Path) -> Path:
    victim = sorted(path.glob("model-*.safetensors"))[1]
    outside = path.parent / f"{path.name}-outside.safetensors"
    shutil.move(victim, outside)
    victim.symlink_to(outside)
    return victim


def test_wc718_bad_shard_symlinked_out_of_the_candidate(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    link = _shard_symlinked_out(b)
    result = diff(a, b, DiffOptions())
    refused = [f for f in result.findings if f.code == "WC718"]
    assert len(refused) == 1 and refused[0].location.file == str(b / link.name)
    assert refused[0].message.startswith(f"B: refused to open {link.name}") and result.exit_code() == 1


def test_wc718_good_regular_shard(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    link = _shard_symlinked_out(b)
    data = link.read_bytes()
    link.unlink()
    link.write_bytes(data)  # the fix: a regular file inside the checkpoint
    result = diff(a, b, DiffOptions())
    assert "WC718" not in codes(result) and result.exit_code() == 0


def test_wc718_is_selected_like_every_diff_rule(make_ckpt, copy_ckpt) -> None:
    a, b = pair(make_ckpt, copy_ckpt)
    _shard_symlinked_out(b)
    assert "WC718" not in codes(diff(a, b, DiffOptions(ignore=["WC718"])))


# ---- WC316 ignore-lists-disagree (ModelOpt's two exclusion lists) -------------------------------------------
def _modelopt_entry() -> dict:
    return next(e for e in DATA if e.get("hf_quant_config") and "MiniMax-M2.5-NVFP4" in e["source"])


def _write_modelopt(path: Path, exclude: list[str] | None = None) -> Path:
    """The published config.json quantization block and hf_quant_config.json on the architecture's own
    config (transformers' config class, tiny dimensions, the release's structure)."""
    from tools.archgen.tiny import tiny_config

    entry = _modelopt_entry()
    cfg = json.loads(tiny_config(entry["model_type"], "D").to_json_string())
    cfg["architectures"] = cfg.get("architectures") or ["MiniMaxM2ForCausalLM"]
    (cfg.get("text_config") or cfg).update(entry.get("structure", {}))
    cfg["quantization_config"] = entry["quantization_config"]
    hf = entry["hf_quant_config"]
    if exclude is not None:
        hf = {**hf, "quantization": {**hf["quantization"], "exclude_modules": exclude}}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "hf_quant_config.json").write_text(json.dumps(hf))
    return path


def test_wc316_good_published_lists_agree(tmp_path: Path) -> None:
    from weightcheck.linting import lint

    entry = _modelopt_entry()
    assert entry["quantization_config"]["ignore"] == entry["hf_quant_config"]["quantization"]["exclude_modules"]
    assert "WC316" not in codes(lint(_write_modelopt(tmp_path)))


def test_wc316_bad_side_file_excludes_one_module_more(tmp_path: Path) -> None:
    from weightcheck.linting import lint

    ignore = _modelopt_entry()["quantization_config"]["ignore"]
    extra = "model.layers.0.self_attn.o_proj"
    assert extra not in ignore
    result = lint(_write_modelopt(tmp_path, exclude=[*ignore, extra]))
    (finding,) = [f for f in result.findings if f.code == "WC316"]
    assert finding.severity is Severity.WARNING and finding.location.file == "hf_quant_config.json"
    assert extra in finding.message and "only in hf_quant_config.json" in finding.message


# ---- diff's rules are objects: an unknown code fails loudly ------------------------------------------------
def test_every_mismatch_class_has_a_diff_rule() -> None:
    """Every class the comparison engine and classifier can give (read from their source: `klass=NAME` of a
    Verdict, the first argument of a Classification) has a diff rule; otherwise that diff would raise."""
    import ast
    import inspect

    from weightcheck.compare import classify, engine
    from weightcheck.rules.diff import class_rule

    names: set[str] = set()
    for module in (engine, classify):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if not isinstance(node, ast.Call):
                continue
            given = [k.value for k in node.keywords if k.arg == "klass"]
            if isinstance(node.func, ast.Name) and node.func.id == "Classification" and node.args:
                given.append(node.args[0])
            names.update(x.id for g in given for x in ast.walk(g) if isinstance(x, ast.Name))
    classes = {getattr(engine, n) for n in names if isinstance(getattr(engine, n, None), str)}
    assert {"within-quantization-error", "value-mismatch"} <= classes and len(classes) >= 12, classes
    for klass in classes:
        assert class_rule(klass).command == "diff", klass


def test_unknown_diff_code_and_class_raise() -> None:
    from weightcheck.rules.diff import UnknownRuleCode, class_rule, diff_rule

    assert diff_rule("WC715").name == "diff-skipped"
    with pytest.raises(UnknownRuleCode, match="WC7l5"):
        diff_rule("WC7l5")  # a typo
    with pytest.raises(UnknownRuleCode):
        diff_rule("WC301")  # a lint code is not a diff code
    with pytest.raises(UnknownRuleCode, match="transposd"):
        class_rule("transposd")


def test_a_finding_with_an_unknown_code_fails_the_diff(make_ckpt, copy_ckpt, monkeypatch) -> None:
    """Before: a mistyped code was dropped by the selection filter and the diff passed. Now it raises (the
    API and CLI turn that into WC000 / exit 2)."""
    diff_module = importlib.import_module("weightcheck.diffing")  # the engine module (`weightcheck.diff` is the API)
    from weightcheck.compare.policy import parse_policy
    from weightcheck.rules.diff import UnknownRuleCode

    a, b = pair(make_ckpt, copy_ckpt)
    for path in (a, b):  # a tensor no policy rule matches: reported under NO_POLICY_RULE's code
        edit_tensors(path, lambda t: t.__setitem__("model.rotary_emb.inv_freq", torch.arange(8, dtype=torch.float32)))
    options = DiffOptions(policy_rules=parse_policy(r"(^|\.)(weight|bias)$ auto", "test"), default_policy=False)
    assert codes(diff(a, b, options)) == {"WC716"}

    class Mistyped:
        code = "WC7l6"

    monkeypatch.setattr(diff_module, "NO_POLICY_RULE", Mistyped)
    with pytest.raises(UnknownRuleCode, match="WC7l6"):
        diff(a, b, options)


def test_an_unknown_class_through_the_cli_is_an_internal_error(make_ckpt, copy_ckpt, monkeypatch) -> None:
    """The CLI reports it as WC000 and exits 2: never exit 0 with the mismatch gone."""
    from click.testing import CliRunner

    diff_module = importlib.import_module("weightcheck.diffing")  # the engine module (`weightcheck.diff` is the API)
    from weightcheck.cli import cli
    from weightcheck.rules.diff import class_rule

    a, b = pair(make_ckpt, copy_ckpt)
    set_tensor(b, Q_PROJ, lambda w: w.t().contiguous())  # WC706 diff-transposed
    monkeypatch.setattr(diff_module, "class_rule", lambda klass: class_rule(klass + "?"))
    out = CliRunner().invoke(cli, ["diff", str(a), str(b), "--format", "json", "--no-progress"])
    assert out.exit_code == 2, out.output
    found = {f["code"] for f in json.loads(out.stdout)["findings"]}
    assert "WC000" in found and "WC706" not in found


# ---- WC851-WC854 good: ordinary logs (the bad ones are tests/test_doctor.py's signal phrases) -----------
def test_log_signals_good_ordinary_logs_have_none(tmp_path: Path) -> None:
    """Logs as a healthy run leaves them, with the words the signals are made of in harmless places: an env
    dump naming NCCL_TIMEOUT, a JSONDecodeError outside the compiler, a worker that exited on request."""
    from weightcheck import api

    logs = tmp_path / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-01.err").write_text("NCCL_TIMEOUT=900 NCCL_DEBUG=INFO\n[rank0] broadcast done in 0.2 s\n")
    (logs / "other.err").write_text("json.decoder.JSONDecodeError: unrelated to the compiler\n")
    (logs / "driver.out").write_text("step 1: loss 2.31, memory access pattern ok\nworker exited (requested)\n")
    result, lines = api.doctor(tmp_path, config=False)
    assert not {"WC851", "WC852", "WC853", "WC854"} & codes(result)
    signals = next(x for x in lines if x.key == "log-signals")
    assert signals.verdict == "ok", (signals.verdict, signals.why_not, signals.evidence)
