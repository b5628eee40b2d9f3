"""Machine-readable emitters: JSON (versioned), SARIF 2.1.0, GitHub workflow annotations."""

from __future__ import annotations

import json
from typing import Any, TextIO

from weightcheck import __version__
from weightcheck.findings import Finding, Result, Severity
from weightcheck.reporters import SCHEMA_VERSION


def result_document(result: Result) -> dict[str, Any]:
    counts = result.counts()
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "weightcheck", "version": __version__},
        "command": result.command,
        "target": result.target,
        "findings": [f.as_dict() for f in result.sorted_findings()],
        "summary": {
            **counts,
            "total": len(result.findings),
            "checked": result.checked,
            "nothing_checked": result.nothing_checked,
            "notes": result.notes,
        },
    }


def emit_json(result: Result, stream: TextIO) -> None:
    json.dump(result_document(result), stream, indent=2, sort_keys=False)
    stream.write("\n")


_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _artifact(result: Result, finding: Finding) -> str:
    base = result.target.rstrip("/")
    file = finding.location.file
    if not file:
        return base
    if file.startswith("/") or file == base:
        return file
    return f"{base}/{file}"


def emit_sarif(result: Result, stream: TextIO) -> None:
    from weightcheck.rules import all_rules

    rules = list(all_rules().values())
    index = {r.code: i for i, r in enumerate(rules)}
    results = []
    for finding in result.sorted_findings():
        entry: dict[str, Any] = {
            "ruleId": finding.code,
            "level": _SARIF_LEVEL[finding.severity],
            "message": {"text": finding.message},
            "locations": [
                {
                    "physicalLocation": {"artifactLocation": {"uri": _artifact(result, finding)}},
                    **(
                        {"logicalLocations": [{"fullyQualifiedName": finding.location.tensor, "kind": "member"}]}
                        if finding.location.tensor
                        else {}
                    ),
                }
            ],
            "properties": {"count": finding.count},
        }
        if finding.code in index:
            entry["ruleIndex"] = index[finding.code]
        results.append(entry)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "weightcheck",
                        "version": __version__,
                        "informationUri": "https://pypi.org/project/weightcheck/",
                        "rules": [
                            {
                                "id": r.code,
                                "name": r.name,
                                "shortDescription": {"text": r.summary},
                                "fullDescription": {"text": r.doc or r.summary},
                                "help": {"text": r.explain()},
                                "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
                            }
                            for r in rules
                        ],
                    }
                },
                "results": results,
            }
        ],
    }
    json.dump(doc, stream, indent=2)
    stream.write("\n")


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
