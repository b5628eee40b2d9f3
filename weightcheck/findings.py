"""Findings and results: what rules produce and reporters consume.

Nothing here knows about files or about output formats.
"""

from __future__ import annotations

import enum

from weightcheck.lightclass import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    ERROR = 3

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}: use error, warning or info") from None

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Location:
    """Where a finding points. Every field is optional; `tensor` may be a collapsed pattern."""

    file: str | None = None
    tensor: str | None = None
    module: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"file": self.file, "tensor": self.tensor, "module": self.module}


@dataclass
class Finding:
    """One problem a rule found: code, severity, message, where, and the fix."""

    code: str
    name: str
    severity: Severity
    message: str
    location: Location = field(default_factory=Location)
    # Full list of subjects (tensor names, layer ids...) behind a collapsed location.
    count: int = 1
    details: dict[str, Any] = field(default_factory=dict)
    # What to change to make the finding go away (filled from the rule's default when a rule gives none).
    fix: str = ""
    # Follow-on findings this one explains (same defect seen by other rules): shown with -v and in JSON.
    related: list[Finding] = field(default_factory=list)

    def subjects(self) -> frozenset[str]:
        """Names this finding is about: files and tensors/modules, from its location and its details'
        full lists. A collapsed pattern (`layers.{0..3}`) is not a name and never matches one."""
        out: set[str] = set()
        for key in ("tensors", "modules", "files", "names"):
            items = self.details.get(key)
            if isinstance(items, list):
                out.update(x for x in items if isinstance(x, str))
        if out:  # the details' full list is the precise one; the location may name where it was seen
            return frozenset(out)
        for value in (self.location.file, self.location.tensor, self.location.module):
            if value and "{" not in value and "*" not in value and ", " not in value:
                out.add(value)
        return frozenset(out)

    def fingerprint(self, target: str = "") -> str:
        """Stable across runs and machines: code + location relative to the target, never the message
        (which carries counts and byte sizes that change when something else changes)."""
        base = target.rstrip("/") + "/" if target else ""
        parts = [self.code]
        for value in (self.location.file, self.location.tensor, self.location.module):
            value = value or ""
            parts.append(value[len(base) :] if base and value.startswith(base) else value)
        import hashlib  # here: only baselines and SARIF fingerprint findings; config-only lint does not

        # surrogatepass: a non-UTF-8 file name (a lone surrogate from os.listdir) still hashes; valid text is unchanged
        return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.label,
            "message": self.message,
            "location": self.location.as_dict(),
            "count": self.count,
        }
        if self.details:
            out["details"] = self.details
        out["fix"] = self.fix
        out["related"] = [r.as_dict() for r in self.related]
        return out


EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_NOTHING_CHECKED = 3
# A rule that crashed: reported as a finding so other findings still show, but the run exits 2.
INTERNAL_ERROR_CODE = "WC000"


def internal_error(what: str, exc: BaseException, location: Location | None = None) -> Finding:
    """WC000 for an exception caught while checking: the message names it, `details.traceback` keeps all of
    it (taken from the exception object, so it survives being reported outside the `except` block)."""
    import traceback

    return Finding(
        code=INTERNAL_ERROR_CODE,
        name="internal-error",
        severity=Severity.ERROR,
        message=f"{what} crashed: {type(exc).__name__}: {exc}",
        location=location or Location(),
        details={"traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))},
    )


@dataclass
class Result:
    """Outcome of one run (lint, diff, verify): findings plus what was actually checked."""

    target: str
    command: str
    findings: list[Finding] = field(default_factory=list)
    # Counters of what was looked at ("shards": 4, "tensors": 1200, ...). Empty means nothing checked.
    checked: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    nothing_checked: bool = False
    # Several targets: the ones that checked nothing (a typo among good paths). The run still exits 3 (a
    # gate must not go green on a path it never read), but what the other targets found is a real verdict.
    unchecked_targets: list[str] = field(default_factory=list)
    # The folder finding files are relative to: the checkpoint folder (lint), "" for paths relative to the
    # working directory (several targets), None when the reporter should use `target`.
    root: str | None = None
    # The lowest severity that fails this run (the API's `fail_on=` or the settings file's `fail-on`):
    # `exit_code()` without an argument uses it, so a Result judges itself as the CLI would.
    fail_on: Severity = Severity.ERROR

    def counts(self) -> dict[str, int]:
        out = {s.label: 0 for s in sorted(Severity, reverse=True)}
        for finding in self.findings:
            out[finding.severity.label] += 1
        return out

    @property
    def execution_successful(self) -> bool:
        """False when the run checked nothing or weightcheck itself failed (WC000): not a verdict either way."""
        if self.nothing_checked or self.unchecked_targets:
            return False
        return not any(f.code == INTERNAL_ERROR_CODE for f in self.findings)

    def exit_code(self, fail_on: Severity | str | None = None, exit_zero: bool = False) -> int:
        """0 clean, 1 findings at/above `fail_on` (a Severity or "error"/"warning"/"info"; default: the
        run's own), 2 internal error, 3 nothing checked (whatever `exit_zero` says)."""
        threshold = self.fail_on if fail_on is None else fail_on
        threshold = Severity.parse(threshold) if isinstance(threshold, str) else threshold
        if any(f.code == INTERNAL_ERROR_CODE for f in self.findings):
            return EXIT_ERROR
        if self.nothing_checked or self.unchecked_targets:
            return EXIT_NOTHING_CHECKED
        if exit_zero:
            return EXIT_CLEAN
        if any(f.severity >= threshold for f in self.findings):
            return EXIT_FINDINGS
        return EXIT_CLEAN

    def sorted_findings(self) -> list[Finding]:
        return sorted(
            self.findings,
            key=lambda f: (-f.severity, f.code, f.location.file or "", f.location.tensor or ""),
        )
