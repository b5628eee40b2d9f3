"""Reporters: one emitter per output format. They read a Result and know nothing of rules' logic."""

from __future__ import annotations

from typing import TextIO

from weightcheck.findings import Result

FORMATS = ("text", "json", "sarif", "github")
SCHEMA_VERSION = "1.0"


def tool_header(command: str) -> dict[str, object]:
    """The keys every JSON document of every command starts with."""
    from weightcheck import __version__

    tool = {"name": "weightcheck", "version": __version__}
    return {"schema_version": SCHEMA_VERSION, "tool": tool, "command": command}


def render(
    result: Result, fmt: str, stream: TextIO, *, color: bool | None = None, verbose: bool = False, quiet: bool = False
) -> None:
    # Emitters are imported on demand so that `--format json` never imports rich.
    if fmt == "text":
        from weightcheck.reporters.text import emit_text

        emit_text(result, stream, color=color, verbose=verbose, quiet=quiet)
    elif fmt == "json":
        from weightcheck.reporters.machine import emit_json

        emit_json(result, stream)
    elif fmt == "sarif":
        from weightcheck.reporters.machine import emit_sarif

        emit_sarif(result, stream)
    elif fmt == "github":
        from weightcheck.reporters.machine import emit_github

        emit_github(result, stream)
    else:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
