"""Python API parity with the CLI (issue #19 item 8): every option of `lint`, `diff` and `verify` has its
keyword in `weightcheck.lint/diff/verify`, `Result.exit_code` takes a severity name, and `allow-skip`
means one syntax (glob or `re:`) in diff and verify alike."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from conftest import read_index, write_index
from test_verify import Bench, bench  # noqa: F401  (fixture: a checkpoint and tapped engine records)

import weightcheck
from weightcheck.cli import _load_commands, cli
from weightcheck.commands.rollout import THRESHOLD_OPTIONS

# CLI parameter name -> API keyword, where the CLI's click name differs from the API's.
RENAMED = {
    "config_path": "config",
    "ray_address": "ray",
    "policy_path": "policy",
    "sync_choice": "sync",
    "hub_revision": "revision",
}
# Options about presenting a Result, not about what is checked: the API returns the Result, and each has
# its place there (checked below), so a keyword would have nothing to do.
PRESENTATION = {
    "fmt": "weightcheck.reporters.render(result, format, ...)",
    "output": "weightcheck.reporters.render(result, ..., output)",
    "color": "weightcheck.reporters.render(..., color=)",
    "verbose": "weightcheck.reporters.render(..., verbose=)",
    "debug": "Finding.details['traceback'] of a WC000 finding",
    "exit_zero": "Result.exit_code(exit_zero=True)",
    "quiet": "weightcheck.reporters.render(..., quiet=)",
    "statistics": "collections.Counter(f.code for f in result.findings)",
    "output_sarif": "weightcheck.reporters.render(result, 'sarif', file)",
}
# lint --pre-commit asks git which files a commit deletes: a hook entry point, not a lint setting.
HOOK_ONLY = {"pre_commit"}
# rollout/doctor's threshold options are one `thresholds={attribute: value}` keyword (checked below).
THRESHOLDS = {"routing_replay", *(attr for _, attr, _, _ in THRESHOLD_OPTIONS)}


def _command(name: str) -> click.Command:
    _load_commands()
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command


@pytest.mark.parametrize("name", ["lint", "diff", "verify", "rollout", "doctor"])
def test_every_cli_option_has_its_api_keyword(name: str) -> None:
    from weightcheck import api as api_module

    api = getattr(api_module, name)  # rollout/doctor: weightcheck.api only (their names are also modules)
    keywords = {p.name for p in inspect.signature(api).parameters.values()}
    options = [p for p in _command(name).params if isinstance(p, click.Option) and p.name not in ("help",)]
    assert len(options) > 10  # the walk sees the shared options (select, fail-on, baseline, ...)
    missing = []
    for option in options:
        assert option.name is not None
        if option.name in PRESENTATION or option.name in HOOK_ONLY:
            continue
        if option.name in THRESHOLDS and "thresholds" in keywords:
            from weightcheck.rollouts import Thresholds

            Thresholds().updated({option.name: None})  # the attribute name is one `thresholds=` accepts
            continue
        if RENAMED.get(option.name, option.name) not in keywords:
            missing.append(f"{option.opts[0]} ({option.name})")
    assert not missing, f"weightcheck.{name}() lacks keywords for {missing}"


def test_presentation_options_live_where_the_exemption_says() -> None:
    from weightcheck.reporters import render

    render_params = set(inspect.signature(render).parameters)
    assert {"color", "verbose", "quiet"} <= render_params
    assert "exit_zero" in inspect.signature(weightcheck.Result.exit_code).parameters


@pytest.fixture
def ghost(make_ckpt) -> Path:
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(index["weight_map"].values()))
    index["metadata"]["total_size"] += 1  # a WC205 warning besides the WC202 error
    write_index(path, index)
    return path


def test_lint_keywords_fail_on_consumers_revision_validate_with(ghost: Path, make_quant) -> None:
    errors_only = weightcheck.lint(ghost, config=False, select=["WC205"])
    assert errors_only.findings and errors_only.exit_code() == 0  # a warning does not fail by default
    assert errors_only.exit_code(fail_on="warning") == 1
    strict = weightcheck.lint(ghost, config=False, select=["WC205"], fail_on="warning")
    assert strict.exit_code() == 1  # the keyword sets the run's own threshold
    assert weightcheck.lint(ghost, config=False, revision="main").checked["shards"] > 0
    with pytest.raises(ValueError):
        weightcheck.lint(ghost, config=False, consumers=["no-such-engine"])
    quant = make_quant("qwen3_moe", "W4A16")
    cfg = json.loads((quant / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = ["lm_head"]  # routers not ignored: WC309 for vLLM and others
    (quant / "config.json").write_text(json.dumps(cfg))

    def routers(result: weightcheck.Result) -> list:
        return [f for f in result.findings if f.code == "WC309" and f.details.get("kind") == "router"]

    [every] = routers(weightcheck.lint(quant, config=False))
    assert set(every.details["consumers"]) > {"vllm"}
    [mine] = routers(weightcheck.lint(quant, config=False, consumers=["vllm"], validate_with="mirror"))
    assert mine.details["consumers"] == ["vllm"]


def test_lint_baseline_keywords(ghost: Path, tmp_path: Path) -> None:
    known = tmp_path / "baseline.json"
    first = weightcheck.lint(ghost, config=False, write_baseline=known)
    assert known.exists() and first.findings
    again = weightcheck.lint(ghost, config=False, baseline=known)
    assert again.findings == [] and again.exit_code() == 0


def test_lint_fix_and_fix_diff_keywords(ghost: Path) -> None:
    index = read_index(ghost)
    index["weight_map"].pop("model.layers.0.mlp.ghost.weight")
    write_index(ghost, index)  # only the total_size warning is left: a mechanical fix
    before = (ghost / "model.safetensors.index.json").read_text()
    preview = weightcheck.lint(ghost, config=False, fix=True, fix_diff=True)
    assert any(n.startswith("fix --diff:") and "total_size" in n for n in preview.notes)
    assert (ghost / "model.safetensors.index.json").read_text() == before  # nothing written
    fixed = weightcheck.lint(ghost, config=False, fix=True)
    assert any(n.startswith("fixed:") for n in fixed.notes) and fixed.findings == []
    with pytest.raises(ValueError):
        weightcheck.lint(ghost, config=False, fix_diff=True)


def test_exit_code_takes_a_severity_name_or_the_enum() -> None:
    from weightcheck.findings import Finding, Result, Severity

    result = Result(target="t", command="lint", checked={"shards": 1})
    result.findings.append(Finding("WC205", "index-total-size", Severity.WARNING, "m"))
    assert result.exit_code() == 0
    assert result.exit_code(fail_on="warning") == 1 == result.exit_code(Severity.WARNING)
    assert result.exit_code(fail_on="error") == 0
    with pytest.raises(ValueError):
        result.exit_code(fail_on="loud")


# ---- one syntax for allow-skip in diff and verify ---------------------------------------------------
@pytest.mark.parametrize(
    "entry", ["re:model\\.norm\\.weight", "re:.*\\.norm\\.weight", "model.norm.weight", "*.norm.w*"]
)
def test_verify_skip_reads_re_entries_as_regexes_like_diff(bench: Callable[[str], Bench], entry: str) -> None:  # noqa: F811
    b = bench("llama")
    b.push([(n, t) for n, t in b.stream if n != "model.norm.weight"])  # the trainer never sent the norm
    missing = [f for f in weightcheck.verify(b.records, b.ckpt, config=False).findings if f.code == "WC722"]
    assert missing and "model.norm.weight" in json.dumps([f.message for f in missing])
    skipped = weightcheck.verify(b.records, b.ckpt, config=False, skip=[entry])
    assert not [f for f in skipped.findings if f.code == "WC722"], [f.message for f in skipped.findings]


def test_an_invalid_re_skip_entry_is_a_usage_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    with pytest.raises(ValueError, match="not a valid regex"):
        weightcheck.verify(tmp_path, tmp_path, config=False, skip=["re:(unclosed"])
    records = tmp_path / "records"
    records.mkdir()
    proc = CliRunner().invoke(cli, ["verify", str(records), "--skip", "re:(unclosed"])
    assert proc.exit_code == 2 and "not a valid regex" in proc.output


def test_hub_keywords_apply_for_the_call_only(ghost: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """token= / cache_dir= reach weightcheck.hub during the call (as --token / --cache-dir do) and leave the
    caller's environment as it was."""
    import importlib

    lint_module = importlib.import_module("weightcheck.linting")  # the engine module (`weightcheck.lint` is the API)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", "/elsewhere")
    seen: dict[str, str | None] = {}
    real = lint_module.lint_many

    def spy(*args: object, **kwargs: object) -> weightcheck.Result:
        import os

        seen.update(token=os.environ.get("HF_TOKEN"), cache=os.environ.get("HF_HUB_CACHE"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lint_module, "lint_many", spy)
    weightcheck.lint(ghost, config=False, token="hf_secret", cache_dir=tmp_path)
    assert seen == {"token": "hf_secret", "cache": str(tmp_path)}
    import os

    assert "HF_TOKEN" not in os.environ and os.environ["HF_HUB_CACHE"] == "/elsewhere"


def test_api_waits_for_expected_records_before_verifying(bench, tmp_path: Path) -> None:  # noqa: F811
    """`expect_records=` with `wait=` waits for the rank records *before* verify reads them, as the CLI's
    --wait does: records that land during the wait are checked, not reported as missing."""
    import shutil
    import threading

    from weightcheck.verifying import count_records

    b = bench("llama")
    b.push(b.stream)
    expected = count_records(b.records, None)
    late, staging = tmp_path / "late", tmp_path / "staging"
    shutil.copytree(b.records, staging)
    timer = threading.Timer(1.0, staging.rename, args=(late,))  # whole, at once: no half-written record
    timer.start()
    try:
        result = weightcheck.verify(late, b.ckpt, config=False, expect_records=expected, wait=60)
    finally:
        timer.join()
    assert not result.nothing_checked and not result.findings, [f.message for f in result.findings]
