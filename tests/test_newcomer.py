"""A newcomer's first hour (issue #19): several targets, annotations, install hints, notes, explain-ignore."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from test_adoption import REPO, validate_sarif, wc
from test_verify import bench  # noqa: F401  (fixture: a checkpoint and tapped engine records)

SAMPLES = REPO / "sample_configs"
LOST_SHARD = "tiny-qwen3-moe-lost-shard"  # WC201 + WC202 (a checkpoint written by transformers)
CONFIG_ONLY = "glm-4.5-air-w4a16-router-not-ignored"  # WC309 warnings, config-only


@pytest.fixture
def targets(tmp_path: Path) -> Path:
    """Two checkpoints (`a`: a lost shard, `b`: a config-only folder) side by side, as pre-commit passes them."""
    shutil.copytree(SAMPLES / LOST_SHARD, tmp_path / "a")
    shutil.copytree(SAMPLES / CONFIG_ONLY, tmp_path / "b")
    return tmp_path


def _github(stdout: str) -> list[tuple[str, dict[str, str], str]]:
    """(level, properties, message) of each workflow command."""
    out = []
    for line in stdout.splitlines():
        assert line.startswith("::"), line
        head, message = line[2:].split("::", 1)
        level, _, props = head.partition(" ")
        out.append((level, dict(p.split("=", 1) for p in props.split(",") if p), message))
    return out


# ---- item 7: several targets, each finding on its own target ----------------------------------------------


def test_github_annotations_of_several_targets_name_one_existing_file_each(targets: Path) -> None:
    proc = wc("lint", "a", "b", "--format", "github", cwd=targets)
    assert proc.returncode == 1, proc.stderr
    findings = [(lvl, p, m) for lvl, p, m in _github(proc.stdout) if p.get("title", "").startswith("WC")]
    assert {p["title"].split()[0] for _, p, _ in findings} == {"WC201", "WC202", "WC309"}
    for _, props, _ in findings:
        assert (targets / props["file"]).is_file(), props  # never "a b"
    wc201 = next(p for _, p, _ in findings if p["title"].startswith("WC201"))
    assert wc201["file"] == "a/model.safetensors.index.json"  # the missing shard's own checkpoint


def test_sarif_of_several_targets_gives_every_result_a_physical_location(targets: Path) -> None:
    proc = wc("lint", "a", "b", "--format", "sarif", cwd=targets)
    doc = json.loads(proc.stdout)
    validate_sarif(doc, targets)
    results = doc["runs"][0]["results"]
    assert {r["ruleId"] for r in results} == {"WC201", "WC202", "WC309"}
    for r in results:
        uri = r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.split("/")[0] == ("b" if r["ruleId"] == "WC309" else "a"), r


def test_a_missing_target_among_good_ones_is_named_not_nothing_checked(targets: Path) -> None:
    proc = wc("lint", "a", "typo", cwd=targets)
    assert proc.returncode == 3  # a gate never goes green on a path it did not read
    assert "nothing was checked" not in proc.stdout
    assert "not checked: typo" in proc.stdout and "2 errors" in proc.stdout
    doc = json.loads(wc("lint", "a", "typo", "--format", "json", cwd=targets).stdout)
    assert doc["summary"]["nothing_checked"] is False and doc["summary"]["unchecked_targets"] == ["typo"]
    assert doc["summary"]["execution_successful"] is False
    assert not any(n.startswith("typo: typo:") for n in doc["summary"]["notes"])  # named once
    sarif = json.loads(wc("lint", "a", "typo", "--format", "sarif", cwd=targets).stdout)
    notes = sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert {"level": "error", "message": {"text": "not checked: typo"}} in notes
    only_typos = wc("lint", "typo", "typo2", "--format", "json", cwd=targets)
    assert only_typos.returncode == 3 and json.loads(only_typos.stdout)["summary"]["nothing_checked"] is True


# ---- item 15: line= and exit 3 as an error ------------------------------------------------------------


def test_github_annotation_carries_the_sarif_line(tmp_path: Path) -> None:
    sample = SAMPLES / "glm-4.7-w4a16-layer-regex-overreach"
    gh = _github(wc("lint", "config.json", "--format", "github", cwd=sample).stdout)
    sarif = json.loads(wc("lint", "config.json", "--format", "sarif", cwd=sample).stdout)
    lines = {
        (r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in sarif["runs"][0]["results"]
    }
    annotated = {(p["title"].split()[0], int(p["line"])) for _, p, _ in gh if p.get("title", "").startswith("WC")}
    assert annotated == lines and any(line > 1 for _, line in annotated)


def test_nothing_checked_is_an_error_annotation(tmp_path: Path) -> None:
    proc = wc("lint", str(tmp_path / "typo"), "--format", "github")
    assert proc.returncode == 3
    assert any(level == "error" and "nothing was checked" in m for level, _, m in _github(proc.stdout))
    partial = wc("lint", str(SAMPLES / CONFIG_ONLY), str(tmp_path / "typo"), "--format", "github")
    assert partial.returncode == 3
    assert any(level == "error" and "not checked:" in m for level, _, m in _github(partial.stdout))


# ---- item 16: notes once across targets; explain-ignore summary and filter --------------------------------


def test_config_only_notes_are_given_once_for_several_configs(tmp_path: Path) -> None:
    for name in ("x", "y", "z"):
        shutil.copytree(SAMPLES / CONFIG_ONLY, tmp_path / name)
    proc = wc("lint", "x/config.json", "y/config.json", "z/config.json", cwd=tmp_path)
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 2, notes  # each note once, naming the three configs
    assert all("x/config.json, y/config.json, z/config.json:" in n for n in notes)


def test_explain_ignore_summary_and_disagreements_only() -> None:
    big = SAMPLES / "qwen3-30b-a3b-fp8-block"  # the published 145-entry list: every consumer agrees
    full = wc("explain-ignore", str(big))
    assert full.returncode == 0, full.stderr
    assert full.stdout.rstrip().splitlines()[-1] == "145 entries: 145 read alike by every consumer, 0 read differently"
    only = wc("explain-ignore", str(big), "--disagreements-only")
    assert len(only.stdout.splitlines()) < 10, only.stdout
    mixed = SAMPLES / "glm-4.7-w4a16-layer-regex-overreach"
    doc = json.loads(wc("explain-ignore", str(mixed), "--disagreements-only", "--format", "json").stdout)
    assert doc["entries"] and all(not e["agree"] for e in doc["entries"])
    assert doc["summary"]["entries"] > len(doc["entries"]) and doc["summary"]["disagree"] == len(doc["entries"])


# ---- item 11: the install hint works for this installation ------------------------------------------------


def _dist(site: Path, direct_url: dict | None) -> None:
    info = site / "weightcheck-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: weightcheck\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


@pytest.mark.parametrize(
    ("direct_url", "expected"),
    [
        ({"url": "file:///src/my%20wc", "dir_info": {"editable": True}}, "pip install -e '/src/my wc[content]'"),
        ({"url": "file:///src/wc", "dir_info": {}}, "pip install '/src/wc[content]'"),
        (None, "pip install 'weightcheck[content]'"),  # installed from a registry or a wheel
    ],
)
def test_install_hint_follows_how_weightcheck_was_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_url: dict | None, expected: str
) -> None:
    import weightcheck.deps as deps
    from weightcheck.deps import install_command

    _dist(tmp_path, direct_url)  # real PEP 610 metadata, found by importlib.metadata first on sys.path
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    if direct_url is None:  # a registry or wheel install: the package lives in site-packages, not a checkout
        monkeypatch.setattr(deps, "_source_tree", lambda: None)
    assert install_command("content") == expected


# ---- item 14: one defect, one finding ------------------------------------------------------------------


def test_partial_fused_group_is_one_finding_naming_the_engines(make_quant) -> None:
    from helpers import by_code, run
    from quantized import set_ignore

    path = make_quant("llama", "W4A16")  # written by llm-compressor
    set_ignore(path, ["lm_head", "re:.*mlp.gate"])  # over-reaches to gate_proj, not up_proj
    (fused,) = by_code(run(path), "WC311")
    engines = fused.details["engines"]
    assert len(engines) >= 2 and all(engine in fused.message for engine in engines)
    assert "gate_up_proj" in fused.message


def test_a_tensor_never_sent_is_one_finding_with_its_unwritten_parameter_attached(bench) -> None:  # noqa: F811
    from weightcheck.verifying import verify

    b = bench("llama")
    lost = "model.layers.1.self_attn.o_proj.weight"
    b.push([(n, t) for n, t in b.stream if n != lost])
    result = verify(b.records, b.ckpt)
    (missing,) = result.findings
    assert missing.code == "WC722" and missing.details["names"] == [lost]
    assert [(r.code, r.details["params"]) for r in missing.related] == [("WC732", [lost])]
    # A parameter left unwritten with its tensor sent (a loader that skips it) stays its own finding.
    b.push(b.stream, "step-2")
    assert not verify(b.records, b.ckpt, weight_version="step-2").findings


# ---- item 18: what ruff and Hub CLI users reach for ------------------------------------------------------


def test_statistics_quiet_and_output_format_alias(targets: Path) -> None:
    stats = wc("lint", "a", "b", "--statistics", cwd=targets)
    assert stats.returncode == 1  # the exit code is the run's, not the printing's
    rows = [line.split("\t") for line in stats.stdout.splitlines()]
    assert rows == [["    2", "WC309", "non-linear-not-ignored"], ["    1", "WC201", "indexed-shard-missing"],
                    ["    1", "WC202", "indexed-key-not-in-shard"]]  # fmt: skip
    as_json = json.loads(wc("lint", "a", "--statistics", "--output-format", "json", cwd=targets).stdout)
    assert as_json == [{"code": "WC201", "name": "indexed-shard-missing", "count": 1},
                       {"code": "WC202", "name": "indexed-key-not-in-shard", "count": 1}]  # fmt: skip
    quiet = wc("lint", "a", "b", "-q", cwd=targets)
    assert quiet.returncode == 1 and "note:" not in quiet.stdout and "2 errors" not in quiet.stdout
    assert "WC201" in quiet.stdout
    assert "not checked: typo" in wc("lint", "a", "typo", "-q", cwd=targets).stdout  # exit 3 keeps its reason


def test_one_run_writes_the_annotations_and_the_sarif(targets: Path) -> None:
    proc = wc("lint", "a", "b", "--format", "github", "--output-sarif", "out.sarif", cwd=targets)
    assert proc.returncode == 1
    sarif = json.loads((targets / "out.sarif").read_text())
    validate_sarif(sarif, targets)
    annotated = sorted(p["title"].split()[0] for _, p, _ in _github(proc.stdout) if p.get("title", "")[:2] == "WC")
    assert sorted(r["ruleId"] for r in sarif["runs"][0]["results"]) == annotated


def test_diff_alone_previews_what_fix_would_change(tmp_path: Path) -> None:
    shutil.copytree(SAMPLES / CONFIG_ONLY, tmp_path / "b")
    before = (tmp_path / "b" / "config.json").read_text()
    proc = wc("lint", "b", "--diff", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # edits pending
    assert proc.stdout.startswith("--- a/config.json") and '+      "re:' in proc.stdout
    assert (tmp_path / "b" / "config.json").read_text() == before  # nothing written


def test_hub_options_on_every_command_that_takes_a_hub_target(tmp_path: Path) -> None:
    from hubserver import HubServer

    for command in ("lint", "diff", "verify", "explain-ignore"):
        text = wc(command, "--help").stdout
        assert all(option in text for option in ("--token", "--cache-dir", "--revision")), command
    server = HubServer().start()
    try:
        server.add("acme/glm-air", SAMPLES / CONFIG_ONLY)
        env = {"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        cache = tmp_path / "my-cache"
        ok = wc("explain-ignore", "acme/glm-air", "--revision", "main", "--token", "hf_secret", "--cache-dir",
                str(cache), env=env)  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert "Bearer hf_secret" in server.authorization
        assert any("/revision/main" in r or "/tree/main" in r or "/resolve/main" in r for r in server.requests)
        wrong = wc("explain-ignore", "acme/glm-air", "--revision", "v9-nope", env=env)
        assert wrong.returncode == 3 and any("v9-nope" in r for r in server.requests)
        linted = wc("lint", "acme/glm-air", "--token", "hf_other", "--format", "json", env=env)
        assert {f["code"] for f in json.loads(linted.stdout)["findings"]} == {"WC309"}
        assert "Bearer hf_other" in server.authorization
    finally:
        server.stop()


def test_verify_wait_says_what_it_waits_for(bench) -> None:  # noqa: F811
    b = bench("llama")
    b.push(b.stream)
    proc = wc("verify", str(b.records), "--against", str(b.ckpt), "--expect-records", "2", "--wait", "0.5")
    assert proc.returncode == 1  # one record of the two expected: WC734
    assert "waiting up to 0.5s for 2 rank records: 1 so far" in proc.stderr
    assert "stopped waiting after 0.5s with 1 of 2" in proc.stderr


# ---- item 17: the Action lints once and takes targets with spaces ---------------------------------------


def test_action_lints_once_and_keeps_targets_with_spaces(targets: Path, tmp_path: Path) -> None:
    import os

    import yaml

    action = yaml.safe_load((REPO / "action.yml").read_text())
    (step,) = [s for s in action["runs"]["steps"] if s.get("id") == "lint"]
    shutil.move(targets / "a", targets / "my model")  # a checkpoint folder whose name has a space
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    shim = bin_dir / "weightcheck"  # the installed console script, counting its runs
    shim.write_text(f'#!/bin/sh\necho run >> "{calls}"\nexec "{sys.executable}" -m weightcheck "$@"\n')
    shim.chmod(0o755)
    output = tmp_path / "github-output"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "WC_TARGETS": "my model\nb/config.json\n", "WC_ARGS": "--fail-on error", "WC_SARIF": "out.sarif",
           "GITHUB_OUTPUT": str(output)}  # fmt: skip
    import subprocess

    proc = subprocess.run(["bash", "-c", step["run"]], cwd=targets, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # the gate is a later step
    assert calls.read_text().split() == ["run"]  # one lint
    assert "exit-code=1" in output.read_text()
    files = {p["file"] for _, p, _ in _github(proc.stdout.split("weightcheck exit code")[0]) if "file" in p}
    assert files == {"my model/model.safetensors.index.json", "my model/model-00005-of-00005.safetensors",
                     "b/config.json"}  # fmt: skip
    validate_sarif(json.loads((targets / "out.sarif").read_text()), targets)
    legacy = subprocess.run(["bash", "-c", step["run"]], cwd=targets, capture_output=True, text=True, timeout=300,
                            env={**env, "WC_TARGETS": "b/config.json typo"})  # fmt: skip
    # The former space-separated form still works: two targets, one of them missing (exit 3, named).
    assert legacy.returncode == 0 and output.read_text().splitlines()[-1] == "exit-code=3"
    assert "not checked: typo" in legacy.stdout and "WC309" in legacy.stdout


def test_sarif_rules_link_their_doc_section_and_the_doc_is_current(tmp_path: Path) -> None:
    import subprocess

    check = subprocess.run([sys.executable, str(REPO / "scripts" / "make_rules_doc.py"), "--check"],
                           env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)  # fmt: skip
    assert check.returncode == 0, "docs/rules.md is stale: run scripts/make_rules_doc.py"
    doc = json.loads(wc("lint", str(SAMPLES / CONFIG_ONLY), "--format", "sarif", cwd=tmp_path).stdout)
    validate_sarif(doc, tmp_path)
    rules = doc["runs"][0]["tool"]["driver"]["rules"]
    sections = set(re.findall(r"^## (WC\d{3})$", (REPO / "docs" / "rules.md").read_text(), flags=re.M))
    for rule in rules:
        uri, _, anchor = rule["helpUri"].partition("#")
        assert anchor == rule["id"].lower() and rule["id"] in sections, rule["helpUri"]
        if uri.startswith("file://"):
            assert Path(unquote(urlparse(uri).path)).is_file()


# ---- a pickled checkpoint: nothing checked, and the run says what it found and why it did not read it ------


def test_a_pickled_checkpoint_is_named_in_the_nothing_checked_note(tmp_path: Path) -> None:
    """A folder holding only `pytorch_model.bin` (torch.save's format: a pickle) and tokenizer files exits 3 as
    before, and its note names the file, why it was not opened and what to do; a folder without one does not."""
    import torch

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"lm_head.weight": torch.zeros(2, 2)}, ckpt / "pytorch_model.bin")
    (ckpt / "tokenizer_config.json").write_text("{}")
    proc = wc("lint", str(ckpt), "--format", "json")
    assert proc.returncode == 3, proc.stderr
    notes = json.loads(proc.stdout)["summary"]["notes"]
    assert any("pytorch_model.bin" in n and "never opened" in n and "convert them to safetensors" in n for n in notes)
    (ckpt / "pytorch_model.bin").unlink()
    bare = wc("lint", str(ckpt), "--format", "json")
    assert bare.returncode == 3 and not any("pickle weights" in n for n in json.loads(bare.stdout)["summary"]["notes"])
