"""Machine-readable emitters: JSON (versioned), SARIF 2.1.0, GitHub workflow annotations."""

from __future__ import annotations

import json
import os
from pathlib import Path

from weightcheck.findings import Finding, Result, Severity
from weightcheck.reporters.header import tool_header

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any, TextIO


def result_document(result: Result) -> dict[str, Any]:
    counts = result.counts()
    return {
        **tool_header(result.command),
        "target": result.target,
        "findings": [{**f.as_dict(), "fingerprint": f.fingerprint(result.target)} for f in result.sorted_findings()],
        "summary": {
            **counts,
            "total": len(result.findings),
            "checked": result.checked,
            "nothing_checked": result.nothing_checked,
            # Several targets: those that checked nothing (the run exits 3 even when the others were checked).
            "unchecked_targets": result.unchecked_targets,
            # False when nothing was checked or weightcheck failed (WC000): the run is no verdict either way.
            "execution_successful": result.execution_successful,
            "notes": result.notes,
        },
    }


def emit_json(result: Result, stream: TextIO) -> None:
    # One write: json.dump issues a write per token, which dominated the run on a 10^5-finding report.
    stream.write(json.dumps(result_document(result), indent=2, sort_keys=False) + "\n")


def _artifact(result: Result, finding: Finding, cache: dict[Path, list[str] | None]) -> tuple[str | None, int | None]:
    """The file a GitHub annotation is attached to (an existing file, relative to the working directory) and
    the line in it: the same file and line as the SARIF result. With several targets a finding without a
    file of its own carries no file rather than the targets joined by spaces (not a path)."""
    from weightcheck.reporters.sarif import artifact_path, region

    path = artifact_path(result, finding)
    if path is None:
        return (result.target if result.root != "" else finding.location.file), None
    line = region(path, finding, cache).get("startLine")
    try:
        return os.path.relpath(path), line
    except ValueError:  # another drive (Windows)
        return str(path), line


def emit_sarif(result: Result, stream: TextIO) -> None:
    from weightcheck.reporters.sarif import emit_sarif as emit

    emit(result, stream)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


_GH_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def emit_github(result: Result, stream: TextIO) -> None:
    cache: dict[Path, list[str] | None] = {}
    for finding in result.sorted_findings():
        file, line = _artifact(result, finding, cache)
        props = [f"file={_escape_prop(file)}"] if file else []
        if file and line:
            props.append(f"line={line}")
        props.append(f"title={_escape_prop(finding.code + ' ' + finding.name)}")
        where = f" [{finding.location.tensor}]" if finding.location.tensor else ""
        stream.write(f"::{_GH_LEVEL[finding.severity]} {','.join(props)}::{_escape_data(finding.message + where)}\n")
    for note in result.notes:
        stream.write(f"::notice title=weightcheck::{_escape_data(note)}\n")
    # Exit 3 fails the job: an error annotation says why (a notice is folded away in the summary).
    if result.nothing_checked:
        stream.write("::error title=weightcheck nothing checked::nothing was checked (exit 3)\n")
    for target in [] if result.nothing_checked else result.unchecked_targets:
        stream.write(f"::error title=weightcheck nothing checked::not checked: {_escape_data(target)} (exit 3)\n")
