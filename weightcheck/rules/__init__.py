"""Rule registry, in the style of ruff: stable codes, kebab-case names, a doc with bad/good examples.

A rule is a small function decorated with `@rule(...)`. It receives a `LintContext` and yields findings
through `ctx.report(...)`. Adding a rule means adding a function in a module listed in `RULE_MODULES`;
the CLI, reporters and SARIF metadata pick it up from the registry.

Codes are never reused: a retired rule stays in the registry with `retired=True`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping

from weightcheck.findings import Finding, Location, Severity
from weightcheck.lightclass import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

    from weightcheck.checkpoint import Checkpoint

# Modules that define rules, by the command that runs their rules; imported on first use of the registry. A
# plain lint imports only lint's: the other commands' modules are ~3 ms of a config-only lint's start-up (#20).
# tests/test_rule_modules.py checks that each module registers only its command's rules.
RULE_MODULES_BY_COMMAND: dict[str, tuple[str, ...]] = {
    "lint": (
        "weightcheck.rules.files",
        "weightcheck.rules.index",
        "weightcheck.rules.layers",
        "weightcheck.rules.quant",
        "weightcheck.rules.patterns",
        "weightcheck.rules.arch",
        "weightcheck.rules.fused_experts",
        "weightcheck.rules.expert_layout",
        "weightcheck.rules.adapter",
        "weightcheck.rules.content",
        "weightcheck.fixes",
    ),
    "diff": ("weightcheck.rules.diff",),
    "verify": ("weightcheck.rules.verify",),
    "rollout": ("weightcheck.rules.rollout",),
    "doctor": ("weightcheck.rules.rollout",),
}
RULE_MODULES = tuple(dict.fromkeys(m for modules in RULE_MODULES_BY_COMMAND.values() for m in modules))

FAMILIES = {
    "WC0": "weightcheck itself",
    "WC1": "files and shards",
    "WC2": "index consistency",
    "WC3": "quantization",
    "WC4": "expected keys and layer coverage",
    "WC5": "dtype and shape",
    "WC6": "tensor content",
    "WC7": "diff and live-sync verification",
    "WC8": "rollout dumps and run diagnosis (rollout, doctor)",
}


def cleandoc(doc: str) -> str:
    """`inspect.cleandoc` (tabs expanded, the common indentation of the lines after the first removed, blank
    lines at both ends dropped), here because importing `inspect` (ast, dis, tokenize) is ~7 ms of a
    config-only lint's start-up; tests/test_startup_path.py checks it against inspect's on every rule."""
    lines = doc.expandtabs().split("\n")
    indents = [len(line) - len(line.lstrip()) for line in lines[1:] if line.lstrip()]
    margin = min(indents) if indents else 0
    lines = [lines[0].lstrip()] + [line[margin:] for line in lines[1:]]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


def dedent(text: str) -> str:
    """`textwrap.dedent` (lines of only spaces and tabs emptied, the common leading spaces and tabs of the other
    lines removed), here because importing textwrap (and compiling its wrapping regexes) is ~1 ms of a
    config-only lint's start-up; tests/test_startup_path.py checks it against textwrap's on every rule."""
    lines = ["" if not line.strip(" \t") else line for line in text.split("\n")]
    margin: str | None = None
    for line in lines:
        if not line:
            continue
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if margin is None or margin.startswith(indent):
            margin = indent
        elif not indent.startswith(margin):
            common = 0
            while common < len(margin) and margin[common] == indent[common]:
                common += 1
            margin = margin[:common]
    if margin:
        lines = [line[len(margin) :] for line in lines]  # every non-empty line starts with the margin
    return "\n".join(lines)


@dataclass(frozen=True)
class Rule:
    """A registered rule: its stable code and name, severity, docs, bad/good examples and check."""

    code: str
    name: str
    severity: Severity
    summary: str
    doc: str
    bad: str
    good: str
    check: Callable[[LintContext], None] | None = None
    # What the rule needs: "tensors" (shard headers/index), "config", or "data" (reads tensor bytes: runs
    # only under `lint --content`), "index" (the index file itself) or "files" (which files are there).
    # Config-only lint skips "tensors" rules.
    needs: frozenset[str] = frozenset({"tensors"})
    # Rules fired by other commands (diff/verify) are registered for docs and SARIF but not run by lint.
    command: str = "lint"
    retired: bool = False
    # Other severities the rule emits in some cases (e.g. WC309: error when an engine is affected, warning
    # when only an RL online quantizer is). `rules` shows them all, so the registry never lies.
    also: frozenset[Severity] = frozenset()

    @property
    def severities(self) -> list[Severity]:
        return sorted({self.severity, *self.also}, reverse=True)

    @property
    def severity_label(self) -> str:
        """`warning`, or `warning|error` when the rule also emits other severities (default first)."""
        rest = [s.label for s in self.severities if s != self.severity]
        return "|".join([self.severity.label, *rest])

    # What to change, when the finding itself gives nothing more specific.
    fix: str = ""
    # Root causes: findings of these codes that this rule's finding explains are attached to it as related
    # instead of being reported on their own. "subjects": only when every name the follow-on is about
    # (files, tensors) is one this finding is about; "all": any finding of that code in the same run.
    implies: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    def fix_text(self) -> str:
        if self.fix:
            return self.fix
        from weightcheck.rules.fixtexts import FIX_TEXTS

        if self.code in FIX_TEXTS:
            return FIX_TEXTS[self.code]
        first = next((line.strip() for line in self.good.strip().splitlines() if line.strip()), "")
        return f"make it look like the rule's good example: {first}" if first else ""

    def explain(self) -> str:
        import textwrap

        fix = f"Fix:\n{textwrap.indent(self.fix_text(), '    ')}\n\n" if self.fix_text() else ""
        also = ""
        if self.also:
            also = f" (also emitted as: {', '.join(s.label for s in self.severities if s != self.severity)})"
        return (
            f"{self.code} ({self.name}) — {self.command}, default severity: {self.severity.label}{also}\n\n"
            f"{self.summary}\n\n{self.doc}\n\n"
            f"Bad:\n{textwrap.indent(self.bad.strip(), '    ')}\n\n"
            f"Good:\n{textwrap.indent(self.good.strip(), '    ')}\n\n{fix}"
        ).rstrip() + "\n"


_REGISTRY: dict[str, Rule] = {}
# name -> code of every registered rule: `register` is the only writer of both (a scan of the registry per
# new rule was ~8,000 comparisons at start-up).
_CODE_OF_NAME: dict[str, str] = {}


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
    also: Iterable[Severity] = (),
    fix: str = "",
    implies: Mapping[str, str] | None = None,
) -> Callable[[Callable[[LintContext], None]], Callable[[LintContext], None]]:
    """Register `fn` as rule `code`. The function's docstring is the rule's long doc."""

    def wrap(fn: Callable[[LintContext], None]) -> Callable[[LintContext], None]:
        register(
            Rule(
                code=code,
                name=name,
                severity=severity,
                summary=summary,
                doc=cleandoc(fn.__doc__ or ""),
                bad=dedent(bad),
                good=dedent(good),
                check=fn,
                needs=frozenset(needs),
                command=command,
                also=frozenset(also),
                fix=fix,
                implies=dict(implies or {}),
            )
        )
        return fn

    return wrap


def register(new: Rule) -> None:
    if new.code in _REGISTRY:
        raise ValueError(f"rule code {new.code} registered twice")
    if new.name in _CODE_OF_NAME:
        raise ValueError(f"rule name {new.name} registered twice")
    _REGISTRY[new.code] = new
    _CODE_OF_NAME[new.name] = new.code


class UnknownRuleCode(KeyError):
    """A code that is not one of a command's registered rules (diff, verify): a bug in the caller, raised so
    that a mistyped code fails loudly instead of being dropped by the selection filter."""


def metadata_rule(
    code: str,
    name: str,
    severity: Severity,
    summary: str,
    doc: str,
    bad: str,
    good: str,
    fix: str,
    *,
    command: str,
    needs: frozenset[str] = frozenset(),
    also: frozenset[Severity] = frozenset(),
) -> Rule:
    """Register and return a rule with no `check` of its own: its command's engine (diff, verify, rollout,
    doctor) decides when it fires and builds the finding from it. The rule carries doc, examples and fix."""
    made = Rule(
        code=code,
        name=name,
        severity=severity,
        summary=summary,
        doc=cleandoc(doc),
        bad=dedent(bad),
        good=dedent(good),
        check=None,
        needs=needs,
        command=command,
        also=also,
        fix=fix,
    )
    register(made)
    return made


INTERNAL_ERROR_RULE = Rule(
    code="WC000",
    name="internal-error",
    severity=Severity.ERROR,
    summary="weightcheck itself failed while checking (a bug): the run exits 2 whatever --exit-zero says.",
    doc=(
        "A rule, comparison or verification step raised an unexpected exception. The other findings are still "
        "reported, but the run is not a pass: it exits 2. The finding keeps the full traceback in "
        "`details.traceback` (JSON) and `--debug` prints it on stderr; please attach it to a bug report. "
        "WC000 cannot be selected away with --ignore."
    ),
    bad="WC000 internal-error: rule WC199 crashed: ZeroDivisionError: division by zero",
    good="(no WC000 finding)",
    command="any",
)


_IMPORTED: set[str] = set()


def _import_rule_modules(modules: Iterable[str]) -> None:
    if INTERNAL_ERROR_RULE.code not in _REGISTRY:
        register(INTERNAL_ERROR_RULE)
    for module in modules:
        if module in _IMPORTED:
            continue
        _IMPORTED.add(module)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # only a module not written yet is skipped
                raise


def all_rules() -> dict[str, Rule]:
    _import_rule_modules(RULE_MODULES)  # each module once: `_IMPORTED`
    return dict(sorted(_REGISTRY.items()))


def command_rules(command: str) -> dict[str, Rule]:
    """The rules `command` runs, by code: what `all_rules()` holds for it, importing only its modules."""
    modules = RULE_MODULES_BY_COMMAND.get(command)
    if modules is None:
        return {code: r for code, r in all_rules().items() if r.command == command}
    _import_rule_modules(modules)
    return {code: r for code, r in sorted(_REGISTRY.items()) if r.command == command}


def rules_covering(codes: Iterable[str]) -> Mapping[str, Rule]:
    """A registry to look `codes` up in: the rules loaded so far when they include every one of them (a lint
    run has loaded lint's), else every rule. Either way each code finds the same rule, or none."""
    if set(codes) <= _REGISTRY.keys():
        return _REGISTRY
    return all_rules()


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


class UnknownSelector(ValueError):
    """A --select/--ignore entry (or a config one) that names no rule: a usage error, like ruff's."""


def unknown_selectors(selectors: Iterable[str]) -> list[str]:
    """Entries that are neither ALL, nor a code prefix of some rule (`WC2`, `WC201`), nor a rule name."""
    named = [s for s in (sel.strip() for sel in selectors) if s and s.upper() != "ALL"]
    rules = all_rules() if named else {}  # only ALL: nothing to look up in every rule
    bad = []
    for s in named:
        if not any(code.startswith(s.upper()) or r.name == s for code, r in rules.items()):
            bad.append(s)
    return bad


def check_selectors(select: Iterable[str], ignore: Iterable[str], *, command: str | None = None) -> None:
    """Raise UnknownSelector for a selector that names no rule, or a selection that leaves `command` no rule."""
    for option, values in (("select", list(select)), ("ignore", list(ignore))):
        bad = unknown_selectors(values)
        if bad:
            raise UnknownSelector(
                f"unknown rule selector{'s' if len(bad) > 1 else ''} in {option}: {', '.join(bad)} "
                "(a rule code, a code prefix such as WC2, a rule name, or ALL; see `weightcheck rules`)"
            )
    if command is None:
        return
    chosen = list(select) or ["ALL"]
    own = [r for r in command_rules(command).values() if not r.retired]
    if own and not any(matches_selector(r, chosen) and not matches_selector(r, ignore) for r in own):
        raise UnknownSelector(
            f"the selection ({', '.join(chosen)}" + (f"; ignore {', '.join(ignore)}" if list(ignore) else "")
            + f") leaves no {command} rule to run: nothing would be checked"
        )


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
        fix: str = "",
        related: list[Finding] | None = None,
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
                fix=fix,
                related=related or [],
            )
        )

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]


def run_rules(ctx: LintContext, rules: Iterable[Rule]) -> Iterator[tuple[Rule, Exception]]:
    """Run each rule; yields (rule, exception) for rules that crashed so the caller can report WC000."""
    from weightcheck.deps import MissingDependency

    for r in rules:
        if r.check is None or r.retired:
            continue
        ctx.current = r
        try:
            r.check(ctx)
        except MissingDependency:  # not a rule bug: one usage error for the whole run
            raise
        except Exception as exc:  # a rule bug must not hide other findings
            yield r, exc
        finally:
            ctx.current = None


def templates_of(ctx: LintContext) -> dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]]:
    """The checkpoint's tensors (all_tensors) grouped by name template, built once per run and shared by the
    rules that reason over templates instead of walking every name (see weightcheck.names)."""
    from weightcheck.names import group_by_template

    return ctx.memo("name-templates", lambda: group_by_template(ctx.ckpt.all_tensors()))


def name_templates(ctx: LintContext) -> dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]]:
    """The templates of `ckpt.tensor_names()` (which adds the index keys of unreadable shards): the shared
    `templates_of` when the two name sets are the same (the usual case), else built once on their own."""
    from weightcheck.names import group_by_template

    def compute() -> dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]]:
        names = ctx.ckpt.tensor_names()
        if len(names) == len(ctx.ckpt.all_tensors()):  # all_tensors' keys are a subset of tensor_names
            return templates_of(ctx)
        return group_by_template(names)

    return ctx.memo("tensor-name-templates", compute)
