"""Where verify's checks put their findings: --select/--ignore applied, each finding built from its Rule
object (`weightcheck.rules.verify`); a rule that is not one of verify's raises (`UnknownRuleCode`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from weightcheck.findings import Finding, Severity
from weightcheck.rules import Rule, matches_selector
from weightcheck.rules.verify import VERIFY_RULES, make_finding, verify_rule


class FindingSink:
    def __init__(self, select: Sequence[str], ignore: Sequence[str]) -> None:
        self.enabled = {
            code for code, r in VERIFY_RULES.items() if matches_selector(r, select) and not matches_selector(r, ignore)
        }
        self.items: list[Finding] = []

    def add(
        self,
        rule: Rule,
        message: str,
        *,
        file: str | None = None,
        tensor: str | None = None,
        module: str | None = None,
        count: int = 1,
        severity: Severity | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        rule = verify_rule(rule)  # before the selection: a wrong rule fails even when deselected
        if rule.code not in self.enabled:
            return
        self.items.append(
            make_finding(
                rule,
                message,
                file=file,
                tensor=tensor,
                module=module,
                count=count,
                severity=severity,
                details=details,
            )
        )
