"""The console entry point (`weightcheck`, `python -m weightcheck`): a plain `weightcheck lint` runs without
click; every other command line goes to the click CLI (`weightcheck.cli.main`) untouched.

Why: config-only lint runs once per config in converter CI, where start-up is most of its cost, and importing
click (click.core, click.types → uuid → platform, datetime, gettext) costs about as much as parsing the
config.json at all (issue #20: config-only lint within 3× the json-parse floor). So the plain path takes only
command lines it understands completely — `lint`, targets, and the options in `_VALUED` and `_FLAGS` — with
settings that need nothing but `resolve_run_settings`, and hands anything else (an unknown option, --help, a
usage error, a --config, a baseline in the settings file, a missing dependency, any exception before the report
starts) to the click CLI, which then produces its own messages: there is one wording of every error.
tests/test_launch.py runs both paths on the same command lines and requires the same report, stderr and exit
code, and checks that the plain path does not import click.

What both paths do around the lint itself (`lint_options`, `prepare_result`, `report_internal_errors`,
`debug_requested`) lives in `weightcheck.frontend`, which both import.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from weightcheck.frontend import (
    debug_requested,
    escape_undecodable_output,
    lint_options,
    prepare_result,
    report_crash,
    report_internal_errors,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

    from weightcheck.findings import Result
    from weightcheck.settings import Settings

# Options the plain path takes, by every spelling click accepts for them (`--opt value` and `--opt=value`;
# short options only as `-o value`), mapped to their parameter names.
_VALUED = {
    "--format": "fmt",
    "--output-format": "fmt",
    "--select": "select",
    "--ignore": "ignore",
    "--fail-on": "fail_on",
    "--output": "output",
    "-o": "output",
    "--pattern": "pattern",
}
_MULTIPLE = {"select", "ignore"}
_FLAGS = {
    "--exit-zero": ("exit_zero", True),
    "--verbose": ("verbose", True),
    "-v": ("verbose", True),
    "--color": ("color", True),
    "--no-color": ("color", False),
    "--progress": ("progress", True),
    "--no-progress": ("progress", False),
}
_CHOICES = {"fail_on": ("error", "warning", "info")}


class _NotPlain(Exception):
    """This command line is not one the plain path takes: the click CLI runs it."""


def _parse(args: list[str]) -> dict[str, Any]:
    """`lint` arguments → parameters, or _NotPlain for anything the plain path does not take."""
    params: dict[str, Any] = {"targets": [], "select": [], "ignore": []}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "-" or arg == "--":
            raise _NotPlain  # stdin / end of options: click's business
        if not arg.startswith("-"):
            params["targets"].append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name in _VALUED:
            if not eq:
                if i >= len(args):
                    raise _NotPlain  # a missing value: click's usage error
                value = args[i]
                i += 1
            elif not name.startswith("--"):
                raise _NotPlain  # `-o=x`: click reads the value "=x"
            key = _VALUED[name]
            if key in _MULTIPLE:
                params[key].append(value)
            else:
                params[key] = value  # the last one wins, as in click
            continue
        if arg in _FLAGS:
            key, flag = _FLAGS[arg]
            params[key] = flag
            continue
        raise _NotPlain
    if not params["targets"]:
        raise _NotPlain
    for key, allowed in _CHOICES.items():
        if key in params and params[key] not in allowed:
            raise _NotPlain
    return params


def _plain_lint(args: list[str]) -> tuple[Result, Settings, dict[str, Any]]:
    """Lint for `weightcheck lint ARGS` without click: (result, settings, parameters), or _NotPlain.

    Nothing is written here, so any exception can still hand the command line to the click CLI."""
    from weightcheck.reporters import FORMATS
    from weightcheck.settings import resolve_run_settings

    params = _parse(args)
    if params.get("fmt") is not None and params["fmt"] not in FORMATS:
        raise _NotPlain
    targets = [Path(t) for t in params["targets"]]
    settings = resolve_run_settings(
        targets[0],
        None,
        command="lint",
        formats=FORMATS,
        select=params["select"],
        ignore=params["ignore"],
        fail_on=params.get("fail_on"),
        fmt=params.get("fmt"),
    )
    if settings.baseline or settings.validate_with == "compressed-tensors":
        raise _NotPlain  # a baseline file to read, a dependency to require: the click CLI's handling
    from weightcheck.collapse import full_lists
    from weightcheck.linting import lint_many, retain_until_exit

    retain_until_exit()  # console_main ends with os._exit: freeing lint's data on return would be wasted work
    options = lint_options(settings, pattern=params.get("pattern"), progress=params.get("progress"))
    with full_lists(bool(params.get("verbose"))):  # -v: every name pattern, not "(+N more patterns)"
        result = lint_many(targets, select=settings.select, ignore=settings.ignore, options=options)
    prepare_result(result, settings)
    return result, settings, params


def _report(result: Result, settings: Settings, params: dict[str, Any], output: Any) -> int:
    """Write the report as the click CLI's `finish` does (no triage options on this path); the exit code."""
    from weightcheck.findings import Severity
    from weightcheck.reporters import render

    try:
        verbose = bool(params.get("verbose"))
        render(result, settings.format, output, color=params.get("color"), verbose=verbose, quiet=False)
        output.flush()
    finally:
        if output is not sys.stdout:
            output.close()
    report_internal_errors(result, debug_requested())
    return result.exit_code(Severity.parse(settings.fail_on), exit_zero=bool(params.get("exit_zero")))


def _open_output(path: str | None) -> Any:
    """`-o FILE` opened as click's `File("w", errors="backslashreplace")` opens it; stdout for none or `-`."""
    if path is None or path == "-":
        return sys.stdout
    return open(path, "w", errors="backslashreplace")  # closed by _report


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["lint"]:
        escape_undecodable_output()  # as `weightcheck.cli.main`
        try:
            result, settings, params = _plain_lint(args[1:])
            output = _open_output(params.get("output"))  # a file it cannot open: click's words for that
        except Exception:  # _NotPlain, a usage error, a missing dependency, a bug: the click CLI reruns it
            pass
        else:
            try:
                code = _report(result, settings, params, output)
            except BrokenPipeError:
                code = 2
            except Exception as exc:  # as `weightcheck.cli.main`: exit 2 with a short message, never a pass
                report_crash(exc)
                code = 2
            sys.exit(code)
    from weightcheck.cli import main as click_main

    click_main()


def console_main() -> None:
    """The `weightcheck` console script and `python -m weightcheck`: `main`, then the process ends without the
    interpreter's teardown where nothing waits for it. Freeing every module and object at exit costs ~10% of a
    config-only lint (0.19 -> 0.17 s CPU measured) and ~0.05 s of a 90k-tensor header-only one; by then the
    report is written and closed. A normal exit happens when anything is registered to run at exit (atexit,
    e.g. logging's flush) or another thread runs, and for in-process callers of `main` (they get SystemExit)."""
    try:
        main()
    except SystemExit as done:
        _exit_now(done)
        raise
    _exit_now(SystemExit(0))


def _exit_now(done: SystemExit) -> None:
    """`os._exit` with `done`'s status when that is safe (see console_main); else returns."""
    import atexit

    code = 0 if done.code is None else done.code
    pending = getattr(atexit, "_ncallbacks", lambda: 1)()  # CPython: the registered exit callbacks
    threading = sys.modules.get("threading")
    if not isinstance(code, int) or pending or (threading is not None and threading.active_count() > 1):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the normal exit reports it
    os._exit(code)

