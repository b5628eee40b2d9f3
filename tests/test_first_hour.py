"""A newcomer's first hour (issue #19): no silent pass. Each test is a gate that was green on a broken
checkpoint: several targets naming one checkpoint, an index that cannot be read, the pre-commit hook on a
deleted shard, a validator asked for by name that is not installed, a local typo sent to the Hub."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import shards

from weightcheck.linting import lint_many

REPO = Path(__file__).resolve().parents[1]
SAMPLE_CT = REPO / "sample_configs" / "glm-4.5-air-w4a16-recommended" / "config.json"


def wc(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, cwd=cwd, env=environ,
        timeout=300,
    )  # fmt: skip


@pytest.fixture
def lost_shard(make_ckpt) -> Path:
    """A real sharded llama checkpoint with its second shard deleted (WC201 when linted whole)."""
    path = make_ckpt("llama")
    shards(path)[1].unlink()
    return path


# ---- item 1: targets are resolved to checkpoints first, each linted once and whole --------------------
@pytest.mark.parametrize(
    "names",
    [
        ("config.json", "model.safetensors.index.json"),
        ("model.safetensors.index.json", "config.json"),
        ("config.json", "."),
        ("config.json", "model-00001-of-00014.safetensors"),
    ],
)
def test_config_plus_index_folder_or_shard_lints_the_checkpoint_whole(lost_shard: Path, names) -> None:
    targets = [lost_shard / n if n != "." else lost_shard for n in names]
    result = lint_many(targets)
    assert "WC201" in {f.code for f in result.findings}, result.notes
    assert result.checked["targets"] == 1 and result.checked["shards"] == len(shards(lost_shard))
    assert result.exit_code() == 1
    proc = wc("lint", *map(str, targets))
    assert proc.returncode == 1 and "WC201" in proc.stdout, proc.stdout + proc.stderr


def test_targets_of_different_checkpoints_are_each_linted(make_ckpt, lost_shard: Path) -> None:
    good = make_ckpt("qwen3_tied")
    result = lint_many([good / "config.json", lost_shard / "config.json", lost_shard])
    assert result.checked["targets"] == 2
    lost = [f for f in result.findings if f.code == "WC201"]
    assert lost and all(f.location.file.startswith(str(lost_shard)) for f in lost)
    assert not [f for f in result.findings if f.location.file.startswith(str(good))]


def test_a_lone_config_json_stays_config_only(lost_shard: Path) -> None:
    """What the weightcheck-config hook passes: config-only, as documented (it does not read shards)."""
    result = lint_many([lost_shard / "config.json"])
    assert not result.findings and result.checked["shards"] == 0


def test_a_folder_without_weights_does_not_read_as_a_clean_checkpoint(make_ckpt, tmp_path: Path) -> None:
    """A converter that crashed after writing config.json (slime's tools/convert_hf_to_int4_direct.py without
    its CUDA kernel does) leaves a folder that config-only lint checks; the report said "clean: 0 shards, 0
    tensors". It now says no weights were found (exit 0 as documented: the config's checks ran)."""
    folder = tmp_path / "converted"
    folder.mkdir()
    shutil.copy(make_ckpt("llama") / "config.json", folder / "config.json")
    proc = wc("lint", str(folder))
    assert proc.returncode == 0 and "config only: no weights were found or read" in proc.stdout, proc.stdout
    assert "clean: 0 shards" not in proc.stdout


# ---- item 2: an index that cannot be read is a finding, never a config-only pass ----------------------
def test_index_symlinked_out_of_the_folder_is_a_finding(make_ckpt, tmp_path: Path) -> None:
    source = make_ckpt("llama")
    outside = tmp_path / "elsewhere.json"
    shutil.copy(source / "model.safetensors.index.json", outside)
    folder = tmp_path / "ck"
    folder.mkdir()
    shutil.copy(source / "config.json", folder / "config.json")
    (folder / "model.safetensors.index.json").symlink_to(outside)
    proc = wc("lint", str(folder), "--format", "json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stdout
    found = [f for f in doc["findings"] if f["code"] == "WC207"]
    assert found and "refused to open" in found[0]["message"]


def test_an_index_with_an_empty_weight_map_beside_a_config_is_not_clean(make_ckpt, tmp_path: Path) -> None:
    source = make_ckpt("llama")
    folder = tmp_path / "ck"
    folder.mkdir()
    shutil.copy(source / "config.json", folder / "config.json")
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')  # malformed on purpose
    proc = wc("lint", str(folder))
    assert proc.returncode == 1 and "WC207" in proc.stdout, proc.stdout


# ---- item 3: the checkpoint hook runs on shard changes, deletions included ----------------------------
def _hooks() -> dict[str, dict]:
    return {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}


def _pre_commit(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Real pre-commit running the shipped weightcheck-checkpoint hook as declared (files, always_run, entry),
    from a `repo: local` copy whose only change is the interpreter (`language: system`, no network)."""
    hook = dict(_hooks()["weightcheck-checkpoint"])
    assert hook["entry"].startswith("weightcheck ")
    hook["entry"] = f"{sys.executable} -m {hook['entry']}"
    hook["language"] = "system"
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{"repo": "local", "hooks": [hook]}]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PRE_COMMIT_HOME": str(repo.parent / "pc-home")}
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", *args, "-v"], cwd=repo, capture_output=True, text=True,
        env=env, timeout=600,
    )  # fmt: skip


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.invalid", "-c", "user.name=ci", *args], cwd=repo, check=True,
                   capture_output=True)  # fmt: skip


@pytest.fixture
def model_repo(make_ckpt, tmp_path: Path) -> Path:
    pytest.importorskip("pre_commit")
    if shutil.which("git") is None:
        pytest.skip("pre-commit needs git")
    repo = tmp_path / "model-repo"
    repo.mkdir()
    shutil.copytree(make_ckpt("llama"), repo / "ck")
    (repo / "README.md").write_text("a model\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "model")
    return repo


def test_pre_commit_hook_runs_when_a_shard_is_deleted(model_repo: Path) -> None:
    _git(model_repo, "rm", "-q", "ck/model-00002-of-00014.safetensors")
    proc = _pre_commit(model_repo)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "WC201" in out and "Skipped" not in out


def test_pre_commit_hook_runs_when_a_shard_is_truncated(model_repo: Path) -> None:
    shard = model_repo / "ck" / "model-00003-of-00014.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    _git(model_repo, "add", "-A")
    proc = _pre_commit(model_repo)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "WC10" in out and "model-00003-of-00014.safetensors" in out


def test_pre_commit_hook_passes_a_commit_that_touches_no_checkpoint_file(model_repo: Path) -> None:
    (model_repo / "README.md").write_text("a better model\n")
    _git(model_repo, "add", "-A")
    proc = _pre_commit(model_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no checkpoint file changed" in proc.stdout + proc.stderr


def test_pre_commit_hook_on_a_clean_checkpoint_change_passes(model_repo: Path) -> None:
    index = model_repo / "ck" / "model.safetensors.index.json"
    index.write_text(json.dumps(json.loads(index.read_text()), indent=4))  # same content, new formatting
    _git(model_repo, "add", "-A")
    proc = _pre_commit(model_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- item 4: a validator asked for by name that is not installed is exit 2, one line -----------------
@pytest.mark.parametrize("where", ["cli", "config"])
def test_validate_with_compressed_tensors_missing_is_exit_2(tmp_path: Path, monkeypatch, capsys, where) -> None:
    from weightcheck.cli import main

    monkeypatch.setitem(sys.modules, "compressed_tensors", None)  # import fails, find_spec says absent
    monkeypatch.chdir(tmp_path)
    args = ["weightcheck", "lint", str(SAMPLE_CT)]
    if where == "cli":
        args += ["--validate-with", "compressed-tensors"]
    else:
        (tmp_path / "weightcheck.toml").write_text('validate-with = "compressed-tensors"\n')
        args += ["--config", str(tmp_path / "weightcheck.toml")]
    monkeypatch.setattr(sys, "argv", args)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "compressed_tensors" in err and "[quant]" in err and len(err.strip().splitlines()) == 1


def test_validate_with_compressed_tensors_installed_runs() -> None:
    pytest.importorskip("compressed_tensors")
    proc = wc("lint", str(SAMPLE_CT), "--validate-with", "compressed-tensors")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr


# ---- item 6: a local-looking typo never leaves the machine; a Hub lookup says both were tried ---------
@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    pytest.importorskip("huggingface_hub")
    from hubserver import HubServer

    server = HubServer().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("spec", ["ck/nope", "ck/nope@main", "typo/config.json", "typo/model.safetensors"])
def test_a_local_looking_typo_says_no_such_file_and_asks_no_hub(hub, make_ckpt, tmp_path, monkeypatch, spec) -> None:
    from weightcheck.linting import lint

    hub.add("ck/nope", make_ckpt("llama"))  # the same spelling on the Hub must not be what gets linted
    work = tmp_path / "work"
    (work / "ck").mkdir(parents=True)
    monkeypatch.chdir(work)
    result = lint(spec)
    assert result.nothing_checked and not result.findings
    assert any("no such file or directory" in n and "a local path" in n for n in result.notes), result.notes
    assert hub.requests == []


def test_a_repo_id_with_no_local_candidate_goes_to_the_hub_and_says_both_were_tried(hub, tmp_path, monkeypatch):
    from weightcheck.linting import lint

    monkeypatch.chdir(tmp_path)
    result = lint("acme/absent")
    assert result.nothing_checked
    note = " ".join(result.notes)
    assert "no such local file or directory" in note and "hf://acme/absent" in note, note
    assert hub.requests


def test_hf_uri_is_always_the_hub_even_when_a_local_folder_shares_the_first_name(hub, make_ckpt, tmp_path, monkeypatch):
    from weightcheck.linting import lint

    hub.add("ck/model", make_ckpt("llama"))
    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    result = lint("hf://ck/model")
    assert not result.nothing_checked and result.checked["shards"] > 0 and result.exit_code() == 0
    assert lint("ck/model").nothing_checked  # the bare spelling is the local folder's typo


def test_cli_typo_message(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    proc = wc("lint", "ck/nope", cwd=tmp_path, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert proc.returncode == 3
    assert "no such file or directory" in proc.stdout + proc.stderr and "cannot list" not in proc.stdout


def test_several_shards_and_the_index_of_one_folder_are_one_checkpoint(lost_shard: Path) -> None:
    """What pre-commit passes after a re-export: every changed shard and the index, file by file."""
    result = lint_many([*shards(lost_shard)[:3], lost_shard / "model.safetensors.index.json"])
    assert result.checked["targets"] == 1 and result.checked["shards"] == len(shards(lost_shard))
    assert "WC201" in {f.code for f in result.findings}


def test_a_stray_file_beside_an_index_lints_the_folder_with_it(lost_shard: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"model.extra.weight": torch.zeros(2, 2)}, str(lost_shard / "extra.safetensors"), {"format": "pt"})
    result = lint_many([lost_shard / "config.json", lost_shard / "extra.safetensors"])
    assert result.checked["targets"] == 1
    assert {"WC105", "WC201"} <= {f.code for f in result.findings}


def test_a_refused_side_file_in_a_config_only_folder_is_a_finding(make_ckpt, tmp_path: Path) -> None:
    source = make_ckpt("llama")
    folder = tmp_path / "ck"
    folder.mkdir()
    shutil.copy(source / "config.json", folder / "config.json")
    (folder / "hf_quant_config.json").symlink_to(source / "generation_config.json")  # out of the folder
    result = lint_many([folder])
    refused = [f for f in result.findings if f.code == "WC104"]
    assert refused and refused[0].location.file == "hf_quant_config.json" and result.exit_code() == 1


def test_a_refused_config_says_to_replace_the_link(make_ckpt, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").symlink_to(make_ckpt("llama") / "config.json")
    [finding] = [f for f in lint_many([folder]).findings if f.code == "WC107"]
    assert "refused to open" in finding.message and "regular file" in finding.fix


def test_api_validate_with_compressed_tensors_missing_raises(monkeypatch) -> None:
    import weightcheck

    monkeypatch.setitem(sys.modules, "compressed_tensors", None)
    with pytest.raises(weightcheck.MissingDependency, match="\\[quant\\]"):
        weightcheck.lint(SAMPLE_CT, config=False, validate_with="compressed-tensors")


# ---- a selection the target or the options rule out ---------------------------------------------------
def test_selecting_only_content_rules_without_content_checks_nothing(make_ckpt) -> None:
    """`lint CKPT --select WC601` (NaN/Inf) without --content ran no rule and printed "clean", exit 0: the
    user read it as "no NaN". Now exit 3 and a note naming the rules and the option; with --content it runs
    (and finds the planted NaN); a selection that still runs something keeps its exit and notes the rest."""
    import torch
    from factories import edit_tensors

    path = make_ckpt("llama")
    name = "model.layers.1.mlp.down_proj.weight"

    def poison(tensors: dict) -> None:
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] = torch.nan

    edit_tensors(path, poison)
    out = wc("lint", str(path), "--select", "WC601")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "WC601 need tensor data: not run without --content" in out.stdout + out.stderr
    out = wc("lint", str(path), "--select", "WC601", "--content")
    assert out.returncode == 1 and "WC601" in out.stdout, out.stdout + out.stderr
    out = wc("lint", str(path), "--select", "WC601,WC201")
    assert out.returncode == 0 and "not run without --content" in out.stdout + out.stderr
    config = path / "config.json"
    out = wc("lint", str(config), "--select", "WC201")  # a config alone: index rules need the weights
    assert out.returncode == 3 and "not run on a config without weights" in out.stdout + out.stderr


def test_a_run_folder_names_the_checkpoints_inside_it(make_ckpt, tmp_path: Path) -> None:
    """`lint OUTPUT_DIR` of a training run (checkpoints one or more levels down, as Trainer's checkpoint-N/ and
    verl's global_step_N/actor/huggingface/ lay them out): still exit 3, and the note names them to lint."""
    run = tmp_path / "run"
    shutil.copytree(make_ckpt("llama"), run / "checkpoint-100")
    (run / "global_step_10" / "actor" / "huggingface").mkdir(parents=True)
    shutil.copy(run / "checkpoint-100" / "config.json", run / "global_step_10" / "actor" / "huggingface")
    (run / "logs").mkdir()
    (run / "logs" / "train.log").write_text("step 1\n")
    out = wc("lint", str(run))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "checkpoints in its subfolders, lint each: checkpoint-100, global_step_10/actor/huggingface" in (
        out.stdout + out.stderr
    )
    empty = tmp_path / "empty"
    (empty / "logs").mkdir(parents=True)
    out = wc("lint", str(empty))
    assert out.returncode == 3 and "subfolders" not in out.stdout + out.stderr
