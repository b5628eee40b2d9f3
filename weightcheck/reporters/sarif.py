"""SARIF 2.1.0 for GitHub code scanning and other SARIF viewers.

What GitHub needs, and what this emitter guarantees (tested against the 2.1.0 schema):
- every artifact URI names a file that exists: relative to the working directory (`uriBaseId`
  `%SRCROOT%`, what code scanning resolves against the repository root) when the file is under it, else an
  absolute `file://` URI; percent-encoded (a path with a space is valid); never a glob, a folder or "A vs B".
  A finding about something that is not a file (a missing shard, a shard-name glob, a sync folder) points at
  the checkpoint's index or config.json instead, and says what it was about in its logical location;
- a `region`: the line and columns where a JSON file (config.json, the index, a record) names the tensor,
  module or key; line 1 otherwise (binary shards have no lines);
- `partialFingerprints` from the rule, the file and the subject (not the message, whose counts change), so
  an alert keeps its identity from one run to the next;
- `invocations[0].executionSuccessful` is false when the run checked nothing or weightcheck failed (WC000).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from weightcheck.findings import Finding, Result, Severity
from weightcheck.version import __version__

LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
# JSON files larger than this are not scanned for a line number (an index of a 92k-tensor model is ~9 MB).
_MAX_SCAN_BYTES = 64 << 20
# Files a finding without a file of its own is attached to, in order of preference.
_ANCHORS = ("model.safetensors.index.json", "config.json", "hf_quant_config.json")


def _root(result: Result) -> Path:
    if result.root is not None:
        return Path(result.root) if result.root else Path()
    target = Path(result.target)
    return target if target.is_dir() else target.parent


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _anchor_in(folder: Path) -> Path | None:
    for name in _ANCHORS:
        if _is_file(folder / name):
            return folder / name
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)[:10_000]
    except OSError:
        return None
    for entry in entries:
        try:
            if entry.is_file():
                return Path(entry.path)
        except OSError:
            continue
    return None


def artifact_path(result: Result, finding: Finding) -> Path | None:
    """An existing file for the finding: its own file, else its folder's index/config, else the target's."""
    root = _root(result)
    file = finding.location.file
    if file:
        for candidate in (root / file, Path(file)):
            if _is_file(candidate):
                return candidate
        for candidate in (root / file, Path(file)):  # a folder (a sync directory): its first file
            try:
                if candidate.is_dir():
                    found = _anchor_in(candidate)
                    if found is not None:
                        return found
            except OSError:
                continue
        # A file that does not exist (a missing shard): its own checkpoint folder's index or config. With
        # several targets the root is the working directory, so this is what keeps each finding on its target.
        folder = _existing_folder(root / file)
        if folder is not None:
            return _anchor_in(folder)
    target = Path(result.target)
    if _is_file(target):
        return target
    return _anchor_in(root) if root != Path() else None


def _existing_folder(path: Path) -> Path | None:
    """The nearest existing folder above `path`, not the working directory itself (whose first file would be
    an arbitrary anchor)."""
    for parent in path.parents:
        if parent == Path() or str(parent) in ("", "."):
            return None
        try:
            if parent.is_dir():
                return parent
        except OSError:
            return None
    return None


def artifact_uri(path: Path, cwd: Path | None = None) -> tuple[str, str | None]:
    """(uri, uriBaseId): relative to the working directory when inside it, else an absolute file URI."""
    cwd = (cwd or Path.cwd()).resolve()
    try:
        absolute = path.resolve()
    except (OSError, RuntimeError):
        absolute = path.absolute()
    try:
        relative = absolute.relative_to(cwd)
        return quote(relative.as_posix(), safe="/-._~"), "%SRCROOT%"
    except ValueError:
        return absolute.as_uri(), None


_FALLBACK_KEYS: dict[str, list[str]] = {
    "WC3": ["ignore", "modules_to_not_convert", "exclude_modules", "quantization_config"],
    "WC205": ["total_size"],
    "WC2": ["weight_map"],
    "WC4": ["num_hidden_layers"],
}

_BRACES = re.compile(r"\{(\d+)[^}]*\}")


def _concrete(name: str) -> str:
    """`model.layers.{0..47}.mlp.gate` → `model.layers.0.mlp.gate` (a name that appears in the file)."""
    name = name.split(", ")[0].split(" ")[0]
    return _BRACES.sub(lambda m: m.group(1), name)


def region(path: Path, finding: Finding, cache: dict[Path, list[str] | None]) -> dict[str, int]:
    """Line/columns of the first mention of the finding's tensor or module in a JSON file; else line 1."""
    if path.suffix not in (".json", ".jsonl", ".toml"):
        return {"startLine": 1}
    if path not in cache:
        try:
            cache[path] = (
                path.read_text(encoding="utf-8", errors="replace").splitlines()
                if path.stat().st_size <= _MAX_SCAN_BYTES
                else None
            )
        except OSError:
            cache[path] = None
    lines = cache[path]
    if not lines:
        return {"startLine": 1}
    tokens = [_concrete(x) for x in (finding.location.tensor, finding.location.module) if x and not x.startswith("(")]
    # Then the key a fix would touch: the ignore list for quantization rules, total_size for WC205.
    tokens += _FALLBACK_KEYS.get(finding.code, _FALLBACK_KEYS.get(finding.code[:3], []))
    for token in tokens:
        for quoted in (f'"{token}"', token):
            for number, line in enumerate(lines, start=1):
                col = line.find(quoted)
                if col >= 0:
                    return {"startLine": number, "startColumn": col + 1, "endColumn": col + 1 + len(quoted)}
    return {"startLine": 1}


def fingerprint(finding: Finding, uri: str) -> str:
    subject = "|".join(x or "" for x in (finding.code, uri, finding.location.tensor, finding.location.module))
    return hashlib.sha256(subject.encode("utf-8", "replace")).hexdigest()[:32]


def _message(finding: Finding) -> dict[str, str]:
    text = finding.message
    out = {"text": text}
    fix = getattr(finding, "fix", None)
    if fix:
        fix_text = getattr(fix, "text", None) or getattr(fix, "description", None) or str(fix)
        out["text"] = f"{text} Fix: {fix_text}"
        out["markdown"] = f"{text}\n\n**Fix:** {fix_text}\n\nSee `weightcheck rules {finding.code}`."
    return out


def physical_location(path: Path, finding: Finding, cache: dict[Path, list[str] | None]) -> tuple[str, dict[str, Any]]:
    """The artifact URI of `path` and the SARIF physicalLocation of `finding` in it."""
    uri, base = artifact_uri(path)
    artifact: dict[str, Any] = {"uri": uri}
    if base:
        artifact["uriBaseId"] = base
    return uri, {"artifactLocation": artifact, "region": region(path, finding, cache)}


def _result(result: Result, finding: Finding, index: dict[str, int], cache: dict[Path, list[str] | None]) -> dict:
    entry: dict[str, Any] = {
        "ruleId": finding.code,
        "level": LEVEL[finding.severity],
        "message": _message(finding),
        "properties": {"count": finding.count},
    }
    if finding.code in index:
        entry["ruleIndex"] = index[finding.code]
    path = artifact_path(result, finding)
    logical = [
        {"fullyQualifiedName": name, "kind": kind}
        for name, kind in ((finding.location.tensor, "member"), (finding.location.module, "module"))
        if name
    ]
    if finding.location.file and (path is None or not str(path).endswith(finding.location.file)):
        logical.append({"fullyQualifiedName": finding.location.file, "kind": "resource"})
    location: dict[str, Any] = {}
    uri = ""
    if path is not None:
        uri, location["physicalLocation"] = physical_location(path, finding, cache)
    if logical:
        location["logicalLocations"] = logical
    if location:
        entry["locations"] = [location]
    entry["partialFingerprints"] = {"weightcheck/v1": fingerprint(finding, uri or result.target)}
    related = getattr(finding, "related", None) or []
    rel_locations = []
    for i, rel in enumerate(related):
        rel_path = artifact_path(result, rel) if isinstance(rel, Finding) else None
        rel_loc: dict[str, Any] = {"id": i + 1, "message": {"text": getattr(rel, "message", str(rel))}}
        if rel_path is not None:
            _, rel_loc["physicalLocation"] = physical_location(rel_path, rel, cache)
        rel_locations.append(rel_loc)
    if rel_locations:
        entry["relatedLocations"] = rel_locations
    return entry


def rule_doc_base() -> str | None:
    """Where docs/rules.md (one `## WCxxx` section per rule) is read: the project's repository when its
    metadata names one on GitHub (`[project.urls] Repository`), else this installation's own copy (a source
    checkout, which is how weightcheck is installed today), else nowhere (no helpUri)."""
    from importlib import metadata

    try:
        urls = metadata.distribution("weightcheck").metadata.get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        url = url.strip().rstrip("/")
        if label.strip().lower() in ("repository", "source") and url.startswith("https://github.com/"):
            return f"{url}/blob/HEAD/docs/rules.md"
    local = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
    return local.as_uri() if local.is_file() else None


def sarif_document(result: Result) -> dict[str, Any]:
    from weightcheck.rules import all_rules

    rules = list(all_rules().values())
    index = {r.code: i for i, r in enumerate(rules)}
    doc_base = rule_doc_base()
    help_uri = (lambda code: {"helpUri": f"{doc_base}#{code.lower()}"}) if doc_base else (lambda code: {})
    cache: dict[Path, list[str] | None] = {}
    results = [_result(result, f, index, cache) for f in result.sorted_findings()]
    notifications = [{"level": "note", "message": {"text": note}} for note in result.notes]
    if result.nothing_checked:
        notifications.insert(0, {"level": "error", "message": {"text": "nothing was checked"}})
    else:
        notifications[:0] = [
            {"level": "error", "message": {"text": f"not checked: {target}"}} for target in result.unchecked_targets
        ]
    invocation: dict[str, Any] = {
        "executionSuccessful": result.execution_successful,
        "toolExecutionNotifications": notifications,
        "properties": {"command": result.command, "target": result.target, "checked": result.checked},
    }
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "weightcheck",
                "version": __version__,
                "rules": [
                    {
                        "id": r.code,
                        "name": r.name,
                        "shortDescription": {"text": r.summary},
                        "fullDescription": {"text": r.doc or r.summary},
                        "help": {"text": r.explain()},
                        **help_uri(r.code),
                        "defaultConfiguration": {"level": LEVEL[r.severity]},
                        "properties": {"command": r.command, "severities": [s.label for s in r.severities]},
                    }
                    for r in rules
                ],
            }
        },
        "invocations": [invocation],
        "results": results,
    }
    if any(
        loc.get("physicalLocation", {}).get("artifactLocation", {}).get("uriBaseId") == "%SRCROOT%"
        for res in results
        for loc in res.get("locations", [])
    ):
        run["originalUriBaseIds"] = {"%SRCROOT%": {"uri": Path.cwd().resolve().as_uri() + "/"}}
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0", "runs": [run]}


def emit_sarif(result: Result, stream: TextIO) -> None:
    json.dump(sarif_document(result), stream, indent=2)
    stream.write("\n")
