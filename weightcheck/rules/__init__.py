"""Rule registry, in the style of ruff: stable codes, kebab-case names, a doc with bad/good examples.

A rule is a small function decorated with `@rule(...)`. It receives a `LintContext` and yields findings
through `ctx.report(...)`. Adding a rule means adding a function in a module listed in `RULE_MODULES`;
the CLI, reporters and SARIF metadata pick it up from the registry.

Codes are never reused: a retired rule stays in the registry with `retired=True`.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightcheck.findings import Finding, Location, Severity

if TYPE_CHECKING:
    from weightcheck.checkpoint import Checkpoint

# Modules that define rules; imported on first use of the registry.
RULE_MODULES = (
    "weightcheck.rules.files",
    "weightcheck.rules.index",
    "weightcheck.rules.layers",
    "weightcheck.rules.quant",
    "weightcheck.rules.patterns",
    "weightcheck.rules.arch",
    "weightcheck.rules.content",
    "weightcheck.rules.verify",
)

FAMILIES = {
    "WC1": "files and shards",
    "WC2": "index consistency",
    "WC3": "quantization",
    "WC4": "expected keys and layer coverage",
    "WC5": "dtype and shape",
    "WC6": "tensor content",
    "WC7": "diff and live-sync verification",
}


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    summary: str
    doc: str
    bad: str
    good: str
    check: Callable[[LintContext], None] | None = None
    # What the rule needs: "tensors" (shard headers/index), "config", or "data" (reads tensor bytes: runs
    # only under `lint --content`). Config-only lint skips "tensors" rules.
    needs: frozenset[str] = frozenset({"tensors"})
    # Rules fired by other commands (diff/verify) are registered for docs and SARIF but not run by lint.
    command: str = "lint"
    retired: bool = False

    def explain(self) -> str:
        return (
            f"{self.code} ({self.name}) — default severity: {self.severity.label}\n\n"
            f"{self.summary}\n\n{self.doc}\n\n"
            f"Bad:\n{textwrap.indent(self.bad.strip(), '    ')}\n\n"
            f"Good:\n{textwrap.indent(self.good.strip(), '    ')}\n"
        )


_REGISTRY: dict[str, Rule] = {}
_LOADED = False


def rule(
    code: str,
    name: str,
    severity: Severity,
    *,
    summary: str,
    bad: str,
    good: str,
    needs: Iterable[str] = ("tensors",),
    command: str = "lint",
) -> Callable[[Callable[[LintContext], None]], Callable[[LintContext], None]]:
    """Register `fn` as rule `code`. The function's docstring is the rule's long doc."""

    def wrap(fn: Callable[[LintContext], None]) -> Callable[[LintContext], None]:
        register(
            Rule(
                code=code,
                name=name,
                severity=severity,
                summary=summary,
                doc=inspect.cleandoc(fn.__doc__ or ""),
                bad=textwrap.dedent(bad),
                good=textwrap.dedent(good),
                check=fn,
                needs=frozenset(needs),
                command=command,
            )
        )
        return fn

    return wrap


def register(new: Rule) -> None:
    if new.code in _REGISTRY:
        raise ValueError(f"rule code {new.code} registered twice")
    if any(r.name == new.name for r in _REGISTRY.values()):
        raise ValueError(f"rule name {new.name} registered twice")
    _REGISTRY[new.code] = new


def all_rules() -> dict[str, Rule]:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for module in RULE_MODULES:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:  # only a module not written yet is skipped
                    raise
    return dict(sorted(_REGISTRY.items()))


def get_rule(code_or_name: str) -> Rule | None:
    rules = all_rules()
    key = code_or_name.strip()
    if key.upper() in rules:
        return rules[key.upper()]
    for r in rules.values():
        if r.name == key:
            return r
    return None


def matches_selector(r: Rule, selectors: Iterable[str]) -> bool:
    """ruff-style selection: `WC2` selects every WC2xx rule, `WC201` one rule, a name one rule, ALL all."""
    for sel in selectors:
        s = sel.strip()
        if not s:
            continue
        if s.upper() == "ALL" or r.code.startswith(s.upper()) or r.name == s:
            return True
    return False


@dataclass
class LintContext:
    """What a lint rule sees: the loaded checkpoint, options, and a sink for findings."""

    ckpt: Checkpoint
    options: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    current: Rule | None = None
    # Shared, lazily computed analyses (layer structure, quant config...), keyed by name.
    cache: dict[str, Any] = field(default_factory=dict)

    def report(
        self,
        message: str,
        *,
        file: str | None = None,
        tensor: str | None = None,
        module: str | None = None,
        count: int = 1,
        severity: Severity | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        assert self.current is not None, "report() called outside a rule"
        self.findings.append(
            Finding(
                code=self.current.code,
                name=self.current.name,
                severity=severity or self.current.severity,
                message=message,
                location=Location(file=file, tensor=tensor, module=module),
                count=count,
                details=details or {},
            )
        )

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]


def run_rules(ctx: LintContext, rules: Iterable[Rule]) -> Iterator[Rule]:
    """Run each rule; yields rules that crashed so the caller can report an internal error."""
    for r in rules:
        if r.check is None or r.retired:
            continue
        ctx.current = r
        try:
            r.check(ctx)
        except Exception:  # a rule bug must not hide other findings
            yield r
        finally:
            ctx.current = None
