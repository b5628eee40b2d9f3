"""After the rules ran: one finding per defect, each saying what to do, minus what the team suppressed.

- `attach_related`: a follow-on finding (a layer missing a key because the index entry is a ghost, a
  shard "not indexed" because the index is unparseable) is attached to the finding of its root cause, as
  declared by the root rule's `implies`; it stays visible with `-v` and in JSON (`related`).
- `fill_fix_texts`: every finding carries a fix text (the rule's own when the finding gives none) and
  names `weightcheck rules CODE`.
- `suppress_per_name` / baselines: per-name ignores from config and a baseline file of known findings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from weightcheck.findings import Finding, Result

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

BASELINE_KIND = "weightcheck-baseline"


def attach_related(findings: list[Finding]) -> list[Finding]:
    """Return the top-level findings; follow-ons are moved into their root's `related` list. A root's
    severity is raised to its worst follow-on so that collapsing never weakens the exit code."""
    from weightcheck.rules import rules_covering

    rules = rules_covering(f.code for f in findings)
    # follow-on code -> [(root index, scope)]: only findings of rules that declare `implies` can be roots.
    roots: dict[str, list[tuple[int, str]]] = {}
    for j, root in enumerate(findings):
        rule = rules.get(root.code)
        for code, scope in (rule.implies.items() if rule else ()):
            roots.setdefault(code, []).append((j, scope))
    parent: dict[int, int] = {}
    for i, follow in enumerate(findings):
        candidates = roots.get(follow.code)
        if not candidates:
            continue
        subjects = follow.subjects()
        for j, scope in candidates:
            if i == j or parent.get(j) == i:
                continue
            if scope == "all" or (subjects and subjects <= findings[j].subjects()):
                parent[i] = j
                break

    def top(i: int) -> int:
        seen = {i}
        while i in parent and parent[i] not in seen:
            i = parent[i]
            seen.add(i)
        return i

    out: list[Finding] = []
    for i, finding in enumerate(findings):
        if i not in parent:
            out.append(finding)
    for i in sorted(parent):
        root = findings[top(i)]
        if root is findings[i]:  # a cycle: keep it at the top level
            out.append(findings[i])
            continue
        root.related.append(findings[i])
        root.related.extend(findings[i].related)
        findings[i].related = []
        root.severity = max(root.severity, findings[i].severity)
    return out


def fill_fix_texts(findings: Iterable[Finding]) -> None:
    from weightcheck.rules import rules_covering

    findings = list(findings)
    rules = rules_covering(f.code for f in findings)
    for finding in findings:
        rule = rules.get(finding.code)
        if not finding.fix and rule is not None:
            finding.fix = rule.fix_text()
        fill_fix_texts(finding.related)


def finalize(result: Result, per_name_ignores: Mapping[str, list[str]] | None = None) -> None:
    """Per-name suppression, then root-cause collapsing, then fix texts (in that order: a suppressed root
    must not take its follow-ons with it)."""
    findings = result.findings
    if per_name_ignores:
        findings, dropped = suppress_per_name(findings, per_name_ignores)
        if dropped:
            result.notes.append(f"{dropped} finding(s) suppressed by per-tensor-ignores")
    result.findings = attach_related(findings)
    fill_fix_texts(result.findings)


# ---- suppression ----------------------------------------------------------------------------------------


def _code_matches(code: str, selectors: Iterable[str]) -> bool:
    return any(s.upper() == "ALL" or code.startswith(s.upper()) for s in selectors)


def suppress_per_name(
    findings: list[Finding], ignores: Mapping[str, list[str]]
) -> tuple[list[Finding], int]:
    """ruff's per-file-ignores for names: `{"model.embed_tokens.*": ["WC309"]}` drops a finding of those
    codes when every name it is about matches one of the patterns (glob or `re:`, whole name:
    weightcheck.userpattern). A finding about several names is kept if any of them is not covered (the
    others still need looking at)."""
    from weightcheck.userpattern import first_match  # only with per-tensor-ignores: not on every lint's path

    kept: list[Finding] = []
    dropped = 0
    for finding in findings:
        names = finding.subjects()
        codes_for = [g for g, codes in ignores.items() if _code_matches(finding.code, codes)]
        if codes_for and names and all(first_match(n, codes_for) is not None for n in names):
            dropped += 1
            continue
        kept.append(finding)
    return kept, dropped


def baseline_document(result: Result) -> dict[str, Any]:
    return {
        "kind": BASELINE_KIND,
        "schema_version": "1.0",
        "command": result.command,
        "findings": [
            {"fingerprint": f.fingerprint(result.target), "code": f.code, "message": f.message}
            for f in result.sorted_findings()
        ],
    }


def write_baseline(result: Result, path: Path) -> None:
    import os
    import tempfile

    text = json.dumps(baseline_document(result), indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class BaselineError(ValueError):
    pass


def read_baseline(path: Path) -> set[str]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"baseline {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != BASELINE_KIND or not isinstance(doc.get("findings"), list):
        raise BaselineError(f"baseline {path}: not a weightcheck baseline (write one with --write-baseline)")
    prints = {e.get("fingerprint") for e in doc["findings"] if isinstance(e, dict)}
    return {p for p in prints if isinstance(p, str)}


def apply_baseline(result: Result, known: set[str]) -> None:
    before = len(result.findings)
    result.findings = [f for f in result.findings if f.fingerprint(result.target) not in known]
    if before - len(result.findings):
        result.notes.append(f"{before - len(result.findings)} known finding(s) filtered by the baseline")
