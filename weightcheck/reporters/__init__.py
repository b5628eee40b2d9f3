"""Reporters: one emitter per output format. They read a Result and know nothing of rules' logic."""

from __future__ import annotations

from weightcheck.findings import Result
from weightcheck.reporters.header import SCHEMA_VERSION, tool_header

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import TextIO

__all__ = ["FORMATS", "SCHEMA_VERSION", "render", "tool_header"]

FORMATS = ("text", "json", "sarif", "github")


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
