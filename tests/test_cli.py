"""The console script end to end: formats, exit codes, selection, config file, rules listing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_index, write_index


def wc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.fixture
def broken(make_ckpt) -> Path:
    """A real checkpoint with one error (ghost entry) and one warning (total_size)."""
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(index["weight_map"].values()))
    index["metadata"]["total_size"] += 1
    write_index(path, index)
    return path


def test_clean_checkpoint_exits_0(make_ckpt) -> None:
    proc = wc("lint", str(make_ckpt("llama")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "clean" in proc.stdout


def test_findings_exit_1_and_json_document(broken: Path) -> None:
    proc = wc("lint", str(broken), "--format", "json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == "1.0"
    assert {"code", "name", "severity", "message", "location"} <= set(doc["findings"][0])
    assert set(doc["findings"][0]["location"]) == {"file", "tensor", "module"}
    codes = {f["code"] for f in doc["findings"]}
    assert {"WC202", "WC205"} <= codes
    assert doc["summary"]["error"] >= 1 and doc["summary"]["warning"] >= 1
    assert doc["summary"]["checked"]["shards"] >= 3


def test_fail_on_and_exit_zero(broken: Path) -> None:
    assert wc("lint", str(broken), "--ignore", "WC202,WC402").returncode == 0  # only a warning left
    assert wc("lint", str(broken), "--ignore", "WC202,WC402", "--fail-on", "warning").returncode == 1
    assert wc("lint", str(broken), "--exit-zero").returncode == 0


def test_select_prefix(broken: Path) -> None:
    doc = json.loads(wc("lint", str(broken), "--select", "WC205", "--format", "json").stdout)
    assert {f["code"] for f in doc["findings"]} == {"WC205"}


def test_sarif_is_2_1_0_with_rules_from_registry(broken: Path) -> None:
    proc = wc("lint", str(broken), "--format", "sarif")
    doc = json.loads(proc.stdout)
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert "WC201" in rule_ids and len(rule_ids) == len(set(rule_ids))
    for res in run["results"]:
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in {"error", "warning", "note"}
        assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]


def test_github_annotations(broken: Path) -> None:
    lines = wc("lint", str(broken), "--format", "github").stdout.splitlines()
    assert any(line.startswith("::error file=") and "WC202" in line for line in lines)
    assert any(line.startswith("::warning file=") and "WC205" in line for line in lines)


def test_typo_path_never_passes(tmp_path: Path) -> None:
    proc = wc("lint", str(tmp_path / "no-such-dir"))
    assert proc.returncode == 3
    assert wc("lint", str(tmp_path / "no-such-dir"), "--exit-zero").returncode == 3


def test_usage_errors_exit_2(make_ckpt, tmp_path: Path) -> None:
    assert wc("lint").returncode == 2
    assert wc("lint", str(tmp_path), "--format", "yaml").returncode == 2
    assert wc("rules", "WC999").returncode == 2


def test_pyproject_next_to_checkpoint(broken: Path) -> None:
    settings = broken.parent / "pyproject.toml"  # the project folder holding the checkpoint
    settings.write_text('[tool.weightcheck]\nignore = ["WC202", "WC402"]\nfail-on = "warning"\n')
    assert wc("lint", str(broken)).returncode == 1  # the warning now fails
    settings.write_text('[tool.weightcheck]\nignore = ["WC2", "WC402"]\n')
    assert wc("lint", str(broken)).returncode == 0
    settings.write_text('[tool.weightcheck]\nignroe = ["WC2"]\n')
    proc = wc("lint", str(broken))
    assert proc.returncode == 2 and "unknown" in proc.stderr


def test_explicit_config(broken: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "wc.toml"
    cfg.write_text('[tool.weightcheck]\nselect = ["WC205"]\n')
    doc = json.loads(wc("lint", str(broken), "--config", str(cfg), "--format", "json").stdout)
    assert {f["code"] for f in doc["findings"]} == {"WC205"}


def test_rules_listing_and_explain() -> None:
    listing = wc("rules").stdout
    assert "WC201" in listing and "indexed-shard-missing" in listing
    explained = wc("rules", "WC206").stdout
    assert "Bad:" in explained and "Good:" in explained and "index-path-escapes" in explained
    by_name = json.loads(wc("rules", "shard-truncated", "--format", "json").stdout)
    assert by_name["rule"]["code"] == "WC101" and by_name["schema_version"] and by_name["tool"]["name"]


def test_every_rule_documents_bad_and_good() -> None:
    from weightcheck.rules import all_rules

    for r in all_rules().values():
        assert r.doc and r.bad.strip() and r.good.strip() and r.summary, r.code
        assert r.name == r.name.lower() and " " not in r.name


def test_lint_does_not_import_torch(make_ckpt) -> None:
    code = (
        "import sys; from weightcheck.linting import lint; "
        f"r = lint({str(make_ckpt('qwen3_moe'))!r}); "
        "from weightcheck.reporters import render; import io; render(r, 'json', io.StringIO()); "
        "render(r, 'text', io.StringIO()); "
        "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules, 'heavy import'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_repo_id_resolves_to_the_local_hub_cache_offline(make_ckpt, tmp_path: Path) -> None:
    """`weightcheck lint org/name` lints the cached snapshot (cache layout: blobs + snapshots + refs)."""
    import os

    src = make_ckpt("llama")
    repo = tmp_path / "hub" / "models--acme--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap, blobs = repo / "snapshots" / commit, repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for i, f in enumerate(sorted(src.iterdir())):
        (blobs / f"blob{i}").write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(os.path.relpath(blobs / f"blob{i}", snap))
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}

    def run(target: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "weightcheck", "lint", target, "--format", "json"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

    proc = run("acme/tiny-llama")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["checked"]["shards"] >= 3
    assert any("cached snapshot" in n for n in doc["summary"]["notes"])
    assert run("acme/not-cached").returncode == 3
