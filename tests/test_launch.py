"""The console entry (`weightcheck.launch:main`) runs a plain `weightcheck lint` without click, and every other
command line through the click CLI: both paths must give the same report, stderr and exit code.

Each case runs twice as a real process from the same working directory: once through the launcher (what the
console script and `python -m weightcheck` run) and once through the click CLI alone (`weightcheck.cli.main`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_configs"
CLICK_ONLY = "import sys; from weightcheck.cli import main; sys.argv[0] = 'weightcheck'; main()"
LAUNCH = "import sys; from weightcheck.launch import console_main; sys.argv[0] = 'weightcheck'; console_main()"
# Prints, after the run, whether click was imported (the plain path must not import it).
PROBE = (
    "import atexit, sys; atexit.register(lambda: sys.stderr.write('click imported: %s\\n' % ('click' in "
    "sys.modules))); sys.argv[0] = 'weightcheck'; from weightcheck.launch import main; main()"
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.pop("WEIGHTCHECK_DEBUG", None)
    env["COLUMNS"] = "120"
    return env


def _run(code: list[str], args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *code, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )


def _both(args: list[str], cwd: Path, output: str | None = None) -> tuple[tuple[int, str, str, str], ...]:
    """(exit code, stdout, stderr, the -o file's text) through the launcher and through click alone."""
    out = []
    for name, code in (("launch", ["-c", LAUNCH]), ("click", ["-c", CLICK_ONLY])):
        given = [a.replace("{OUT}", f"{output}.{name}") for a in args] if output else args
        proc = _run(code, given, cwd)
        text = ""
        if output and (cwd / f"{output}.{name}").exists():
            text = (cwd / f"{output}.{name}").read_text()
        out.append((proc.returncode, proc.stdout, proc.stderr, text))
    return tuple(out)


CASES = {
    "clean config, json": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--format", "json"],
    "clean config, text": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block")],
    "findings, text -v": ["lint", str(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored"), "-v"],
    "findings, sarif": ["lint", str(SAMPLES / "glm-4.7-w4a16-layer-regex-overreach"), "--format=sarif"],
    "findings, github": ["lint", str(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored"), "--output-format", "github"],
    "findings, exit zero": ["lint", "--exit-zero", str(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored")],
    "select and ignore": ["lint", str(SAMPLES / "tiny-qwen3-moe-lost-shard"), "--select", "WC2,WC4", "--ignore=WC201"],
    "fail on warning": ["lint", str(SAMPLES / "glm-4.7-w4a16-layer-regex-overreach"), "--fail-on", "warning"],
    "checkpoint with shards": ["lint", str(SAMPLES / "tiny-glm4-moe-w4a16-router-packed"), "--no-color"],
    "two targets": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), str(SAMPLES / "tiny-qwen3-moe-lost-shard")],
    "missing target: exit 3": ["lint", "no/such/dir"],
    "unknown selector: usage error": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--select", "WC999"],
    "bad format: usage error": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--format", "yaml"],
    "bad fail-on: usage error": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--fail-on", "never"],
    "missing value: usage error": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--format"],
    "no target: usage error": ["lint", "--format", "json"],
    "an option the plain path leaves to click": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--statistics"],
    "unknown pattern: usage error": ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--pattern", "nosuch"],
    "help": ["lint", "--help"],
    "another command": ["rules", "WC302"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_launcher_and_click_cli_agree(case: str, tmp_path: Path) -> None:
    launched, clicked = _both(CASES[case], tmp_path)
    assert launched == clicked
    assert launched[0] in (0, 1, 2, 3)


def test_report_file_and_settings_file_agree(tmp_path: Path) -> None:
    """`-o FILE` and a discovered settings file (format, fail-on, ignore) give the same report either way."""
    (tmp_path / "weightcheck.toml").write_text('format = "json"\nfail-on = "warning"\nignore = ["WC316"]\n')
    args = ["lint", str(SAMPLES / "glm-4.7-w4a16-layer-regex-overreach"), "-o", "{OUT}"]
    launched, clicked = _both(args, tmp_path, output="report.json")
    assert launched == clicked
    assert launched[3].startswith("{") and launched[0] == 1


def test_a_non_utf8_target_name_is_reported_alike(tmp_path: Path) -> None:
    """A folder name that is not UTF-8 reaches the report as an escape on both paths (never a crash)."""
    import shutil

    odd = tmp_path / os.fsdecode(b"qwen3-\xff")
    odd.mkdir()
    shutil.copy(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored" / "config.json", odd / "config.json")
    for fmt in ("text", "json"):
        launched, clicked = _both(["lint", str(odd), "--format", fmt, "--fail-on", "warning"], tmp_path)
        assert launched == clicked
        assert launched[0] == 1
    assert "\\udcff" in launched[1]  # the JSON report's target, escaped


def test_unwritable_report_file_is_clicks_error(tmp_path: Path) -> None:
    args = ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "-o", str(tmp_path / "missing-dir" / "r.json")]
    launched, clicked = _both(args, tmp_path)
    assert launched == clicked
    assert launched[0] == 2


@pytest.mark.parametrize(
    ("args", "plain"),
    [
        (["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--format", "json"], True),
        (["lint", str(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored"), "-v", "--fail-on=warning"], True),
        (["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--statistics"], False),
        (["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--select", "WC999"], False),
        (["rules"], False),
    ],
)
def test_plain_lint_does_not_import_click(args: list[str], plain: bool, tmp_path: Path) -> None:
    """The point of the launcher: the common lint command lines start without click; the others use it."""
    proc = _run(["-c", PROBE], args, tmp_path)
    assert f"click imported: {not plain}" in proc.stderr, proc.stderr[-2000:]


def test_python_m_weightcheck_runs_the_launcher(tmp_path: Path) -> None:
    proc = _run(["-m", "weightcheck"], ["lint", str(SAMPLES / "qwen3-30b-a3b-fp8-block"), "--format", "json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"command": "lint"' in proc.stdout


@pytest.mark.parametrize("registered", [False, True], ids=["nothing at exit", "an atexit callback"])
def test_console_entry_skips_teardown_only_when_nothing_waits_for_it(registered: bool, tmp_path: Path) -> None:
    """`console_main` ends the process with `os._exit` once the report is written, unless something is
    registered to run at exit (then that must run: a normal exit)."""
    probe = (
        "import os, sys, atexit; real = os._exit\n"
        "def fast(code):\n    sys.stderr.write('fast exit %d\\n' % code); sys.stderr.flush(); real(code)\n"
        "os._exit = fast\n"
        + ("atexit.register(lambda: sys.stderr.write('atexit ran\\n'))\n" if registered else "")
        + "sys.argv[0] = 'weightcheck'; from weightcheck.launch import console_main; console_main()"
    )
    args = ["lint", str(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored"), "--format", "json", "--fail-on", "warning"]
    proc = _run(["-c", probe], args, tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.rstrip().endswith("}")  # the whole report, flushed before the exit
    assert ("fast exit 1" in proc.stderr) is not registered
    assert ("atexit ran" in proc.stderr) is registered
