"""Suppression and targets: per-name ignores, baselines of known findings, the consumers a team deploys to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_index, write_index
from helpers import by_code, run
from quantized import set_ignore

from weightcheck.findings import Finding, Location, Severity


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)


def codes_sev(proc: subprocess.CompletedProcess[str]) -> set[tuple[str, str]]:
    return {(f["code"], f["severity"]) for f in json.loads(proc.stdout)["findings"]}


def pyproject(path: Path, body: str) -> Path:
    """Settings for the checkpoint at `path`, in the project folder above it (one inside the checkpoint is
    not applied when it is linted from elsewhere)."""
    (path.parent / "pyproject.toml").write_text("[tool.weightcheck]\n" + body)
    return path.parent / "pyproject.toml"


# ---- consumers ------------------------------------------------------------------------------------------
def test_consumers_silence_online_quantizer_warning_but_not_engine_errors(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    # llm-compressor's own output: one WC309 warning (online INT4 would pack the embeddings)
    assert codes_sev(wc("lint", str(path), "--format", "json")) == {("WC309", "warning")}
    proc = wc("lint", str(path), "--format", "json", "--consumers", "vllm,sglang")
    assert proc.returncode == 0 and codes_sev(proc) == set()
    # the router missing from the list is an engine error: a deploy list never hides it
    set_ignore(path, ["lm_head", "re:.*embed_tokens($|\\..*)"])
    proc = wc("lint", str(path), "--format", "json", "--consumers", "vllm,sglang")
    assert proc.returncode == 1 and ("WC309", "error") in codes_sev(proc)
    pyproject(path, 'consumers = ["sglang"]\n')  # SGLang builds the router unquantized
    assert codes_sev(wc("lint", str(path), "--format", "json")) == set()


def test_unknown_consumer_is_a_usage_error(make_ckpt) -> None:
    path = make_ckpt("llama")
    assert wc("lint", str(path), "--consumers", "vlm").returncode == 2
    pyproject(path, 'consumers = ["sglang", "trtllm"]\n')
    proc = wc("lint", str(path))
    assert proc.returncode == 2 and "trtllm" in proc.stderr


# ---- per-name ignores -----------------------------------------------------------------------------------
def test_per_tensor_ignores_drop_only_matching_names_and_codes(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    set_ignore(path, ["lm_head"])  # router error + embedding warning
    before = codes_sev(wc("lint", str(path), "--format", "json"))
    assert before == {("WC309", "error"), ("WC309", "warning")}
    pyproject(path, '[tool.weightcheck.per-tensor-ignores]\n"model.embed_tokens*" = ["WC309"]\n')
    proc = wc("lint", str(path), "--format", "json")
    assert codes_sev(proc) == {("WC309", "error")}  # the router is not covered by the glob
    assert any("per-tensor-ignores" in n for n in json.loads(proc.stdout)["summary"]["notes"])
    pyproject(path, '[tool.weightcheck.per-tensor-ignores]\n"model.embed_tokens*" = ["WC308"]\n')
    assert codes_sev(wc("lint", str(path), "--format", "json")) == before  # another code: nothing hidden


def test_per_tensor_ignores_keep_a_finding_about_other_names_too() -> None:
    from weightcheck.triage import suppress_per_name

    both = Finding("WC402", "layer-keys-differ", Severity.ERROR, "m", Location(),
                   details={"tensors": ["model.embed_tokens.weight", "model.layers.0.mlp.gate.weight"]})  # fmt: skip
    kept, dropped = suppress_per_name([both], {"model.embed_tokens.*": ["WC4"]})
    assert kept == [both] and dropped == 0
    kept, dropped = suppress_per_name([both], {"model.embed_tokens.*": ["WC4"], "*.mlp.gate.*": ["WC402"]})
    assert kept == [] and dropped == 1


@pytest.mark.parametrize("body", ['per-tensor-ignores = ["WC309"]\n',
                                  '[tool.weightcheck.per-tensor-ignores]\n"x*" = ["WC9999"]\n'])  # fmt: skip
def test_bad_per_tensor_ignores_are_usage_errors(make_ckpt, body: str) -> None:
    path = make_ckpt("llama")
    pyproject(path, body)
    assert wc("lint", str(path)).returncode == 2


# ---- baseline -------------------------------------------------------------------------------------------
def test_baseline_hides_known_findings_and_shows_new_ones(make_ckpt, tmp_path: Path) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(index["weight_map"].values()))
    write_index(path, index)
    baseline = tmp_path / "baseline.json"
    written = wc("lint", str(path), "--write-baseline", str(baseline))
    assert written.returncode == 0, written.stdout + written.stderr
    doc = json.loads(baseline.read_text())
    assert doc["kind"] == "weightcheck-baseline" and [f["code"] for f in doc["findings"]] == ["WC202"]
    proc = wc("lint", str(path), "--baseline", str(baseline), "--format", "json")
    assert proc.returncode == 0 and codes_sev(proc) == set()
    # a new defect is still reported
    index["weight_map"].pop("model.norm.weight")
    write_index(path, index)
    proc = wc("lint", str(path), "--baseline", str(baseline), "--format", "json")
    assert proc.returncode == 1 and {c for c, _ in codes_sev(proc)} == {"WC203"}
    # from config, relative to the config file
    (path.parent / "known.json").write_text(baseline.read_text())
    pyproject(path, 'baseline = "known.json"\n')
    assert {c for c, _ in codes_sev(wc("lint", str(path), "--format", "json"))} == {"WC203"}
    # (an unreadable baseline is a usage error, never a silent pass)
    (tmp_path / "bad.json").write_text("{}")
    assert wc("lint", str(path), "--baseline", str(tmp_path / "bad.json")).returncode == 2


def test_fingerprints_are_stable_across_copies(make_ckpt, tmp_path: Path) -> None:
    import shutil

    prints = []
    first = make_ckpt("llama")
    for path in (first, shutil.copytree(first, tmp_path / "elsewhere" / "copy")):
        index = read_index(path)
        index["metadata"]["total_size"] += 1
        write_index(path, index)
        result = run(path)
        (finding,) = by_code(result, "WC205")
        prints.append((finding.fingerprint(result.target), str(path)))
    assert prints[0][0] == prints[1][0] and prints[0][1] != prints[1][1]
