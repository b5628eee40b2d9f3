"""Where verify's checks put their findings: --select/--ignore applied, each finding built from its Rule
object (`weightcheck.rules.verify`); a rule that is not one of verify's raises (`UnknownRuleCode`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from weightcheck.findings import Finding
from weightcheck.rules import Rule, matches_selector
from weightcheck.rules.verify import VERIFY_RULES, make_finding, verify_rule


class FindingSink:
    def __init__(self, select: Sequence[str], ignore: Sequence[str]) -> None:
        self.enabled = {
            code for code, r in VERIFY_RULES.items() if matches_selector(r, select) and not matches_selector(r, ignore)
        }
        self.items: list[Finding] = []

    def add(self, rule: Rule, message: str, **where: Any) -> None:
        """Keep a finding of `rule` if the selection enables it; `where` are `make_finding`'s keywords
        (file, tensor, module, count, severity, details)."""
        rule = verify_rule(rule)  # before the selection: a wrong rule fails even when deselected
        if rule.code in self.enabled:
            self.items.append(make_finding(rule, message, **where))
