"""Machine-readable emitters: JSON (versioned), SARIF 2.1.0, GitHub workflow annotations."""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

from weightcheck.findings import Finding, Result, Severity
from weightcheck.reporters import tool_header


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
            # False when nothing was checked or weightcheck failed (WC000): the run is no verdict either way.
            "execution_successful": result.execution_successful,
            "notes": result.notes,
        },
    }


def emit_json(result: Result, stream: TextIO) -> None:
    # One write: json.dump issues a write per token, which dominated the run on a 10^5-finding report.
    stream.write(json.dumps(result_document(result), indent=2, sort_keys=False) + "\n")




def _artifact(result: Result, finding: Finding) -> str:
    """The file a GitHub annotation is attached to: an existing file, relative to the working directory."""
    from weightcheck.reporters.sarif import artifact_path

    path = artifact_path(result, finding)
    if path is None:
        return result.target
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def emit_sarif(result: Result, stream: TextIO) -> None:
    from weightcheck.reporters.sarif import emit_sarif as emit

    emit(result, stream)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


_GH_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def emit_github(result: Result, stream: TextIO) -> None:
    for finding in result.sorted_findings():
        props = [f"title={_escape_prop(finding.code + ' ' + finding.name)}"]
        props.insert(0, f"file={_escape_prop(_artifact(result, finding))}")
        where = f" [{finding.location.tensor}]" if finding.location.tensor else ""
        stream.write(f"::{_GH_LEVEL[finding.severity]} {','.join(props)}::{_escape_data(finding.message + where)}\n")
    for note in result.notes:
        stream.write(f"::notice title=weightcheck::{_escape_data(note)}\n")
