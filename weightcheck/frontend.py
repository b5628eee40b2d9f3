"""What every front end does around a command's engine: the options of a lint run, the result's fix texts and
notes, internal errors on stderr. Shared by the click CLI (`weightcheck.cli`) and the launcher's plain-lint path
(`weightcheck.launch`), which must not import click; so this module imports neither.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

    from weightcheck.findings import Result
    from weightcheck.settings import Settings


def debug_requested() -> bool:
    return "--debug" in sys.argv[1:] or os.environ.get("WEIGHTCHECK_DEBUG", "") not in ("", "0")


def escape_undecodable_output() -> None:
    """A file name that is not UTF-8 comes back from os.listdir as a lone surrogate: reported as an escape
    (`\\udcff`, valid inside a JSON string), never an encoding crash of the report writer."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def report_crash(exc: BaseException) -> None:
    """An internal error outside any rule: one short line on stderr (the traceback too with --debug); the
    caller exits 2, never a pass."""
    if debug_requested():
        import traceback

        traceback.print_exception(exc)
    print(f"weightcheck: internal error: {type(exc).__name__}: {exc} (--debug shows the traceback)", file=sys.stderr)


def lint_options(settings: Settings, **given: Any) -> dict[str, Any]:
    """The options of one lint run: the command line's (`given`, by parameter name) over the settings'."""
    from weightcheck.progress import choose_mode

    return {
        "pattern": given.get("pattern") or settings.pattern,
        "validate_with": given.get("validate_with") or settings.validate_with,
        "content": bool(given.get("content")),
        "hash_out": given.get("hash_out"),
        "against_manifest": given.get("against_manifest"),
        "progress": choose_mode(given.get("progress")),
        "revision": given.get("revision"),
        "download": bool(given.get("download")),
        "ray": given.get("ray_address"),
        "per_tensor_ignores": settings.per_tensor_ignores,
        "consumers": settings.consumers,
    }


def prepare_result(result: Result, settings: Settings) -> None:
    """What every command's result gets before triage and rendering: fix texts and the settings' notes."""
    from weightcheck.triage import fill_fix_texts

    fill_fix_texts(result.findings)  # every command's findings say what to do (lint fills them already)
    if settings.not_applied:
        result.notes.append(settings.not_applied_note())


def report_internal_errors(result: Result, debug: bool) -> None:
    """WC000 tracebacks on stderr with --debug (the report itself keeps them in details.traceback)."""
    from weightcheck.findings import INTERNAL_ERROR_CODE

    internal = [f for f in result.findings if f.code == INTERNAL_ERROR_CODE]
    for finding in internal:
        if debug:
            trace = finding.details.get("traceback", "")
            print(f"weightcheck: {finding.message}\n{trace}", file=sys.stderr, flush=True)
    if internal and not debug:
        print("weightcheck: internal error (WC000); rerun with --debug for the traceback", file=sys.stderr, flush=True)
