"""`weightcheck diff A B`: compare two checkpoints tensor by tensor, and explain every mismatch.

A is the reference, B the candidate; either may be quantized (a quantized module's stored parts are
folded into one logical `P.weight`, dequantized on the fly). Tensors are paired by name after an
optional name map, compared under the policy (weightcheck.compare.policy), and failures classified
(weightcheck.compare.classify). Everything is streamed: two tensors' pages and a few row blocks are
resident at a time.

Coverage is first-class (`Result.checked`): compared = equal + within tolerance + failed; skipped
(with a reason) and tensors only in A or only in B are counted apart. A skip must be allowed
(`--allow-skip PATTERN`); an unexpected one is an error.

Why one ~770-line module: name maps, the logical view, the comparison loop, its Ray driver and the findings
are the one engine of `weightcheck diff`, each a section below; comparison tiers and classification already
live in `weightcheck.compare`, the rules in `weightcheck.rules.diff`.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightcheck import safe_io
from weightcheck.checkpoint import load_checkpoint
from weightcheck.collapse import format_ranges, summarize
from weightcheck.findings import INTERNAL_ERROR_CODE, Finding, Location, Result, Severity
from weightcheck.findings import internal_error as make_internal_error
from weightcheck.names import is_index, segment_layer, segment_layer_wildcard
from weightcheck.rules import Rule
from weightcheck.rules.diff import (
    FILE_REFUSED,
    NO_POLICY_RULE,
    ONLY_IN_CANDIDATE,
    ONLY_IN_REFERENCE,
    QUANTIZED_TENSOR_MALFORMED,
    SKIPPED,
    class_rule,
    diff_rule,
)
from weightcheck.userpattern import PatternSyntaxError, capture_pattern, captures, first_match

if TYPE_CHECKING:
    from weightcheck.compare.classify import Classification, ReferenceIndex
    from weightcheck.compare.engine import Verdict
    from weightcheck.compare.operands import Operand
    from weightcheck.compare.policy import Policy, PolicyRule
    from weightcheck.dequant import QuantizedTensor
    from weightcheck.patterns import Pattern
    from weightcheck.tensors import TensorStore

# Parameters that exist only on a quantized side (activation / KV-cache quantization): a tensor of A
# cannot correspond to them, so being only in one checkpoint is expected (reported as info).
_ACTIVATION_PARAM = re.compile(r"(^|\.)(input|output|q|k|v)_(scale|zero_point|global_scale)$")
# A progress bar only for runs long enough to want one (about a second of reading or more).
PROGRESS_MIN_BYTES = 512 * 1024 * 1024
_ACTIVATION_NOTE = "activation/KV-cache quantization parameter: expected on a quantized side only"
# Per finding, at most this many tensors carry their own evidence in `details`.
_EVIDENCE_LIMIT = 50


class NameMapError(ValueError):
    """A name map that cannot be parsed (usage error)."""


# ---- name maps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NameMapRule:
    """`pattern_a -> pattern_b` in the user-pattern syntax (weightcheck.userpattern): each `*` of a glob
    pattern_a captures lazily (an `re:` pattern_a captures with its groups), and the captures fill
    pattern_b's `*` in order."""

    pattern_a: str
    pattern_b: str
    source: str = "built-in"

    @property
    def regex(self) -> re.Pattern[str]:
        return capture_pattern(self.pattern_a)

    def apply(self, name: str) -> str | None:
        match = self.regex.fullmatch(name)
        if match is None:
            return None
        pieces = self.pattern_b.split("*")
        out = pieces[0]
        for group, piece in zip(match.groups(), pieces[1:], strict=True):
            out += (group or "") + piece
        return out


def parse_name_map(text: str, source: str = "map") -> list[NameMapRule]:
    """Lines `pattern_a -> pattern_b` (`#` comments). Raises NameMapError naming the line."""
    rules: list[NameMapRule] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        left, arrow, right = line.partition("->")
        left, right = left.strip(), right.strip()
        where = f"{source}:{number}"
        if not arrow or not left or not right or " " in left or " " in right:
            raise NameMapError(f"{where}: expected `pattern_a -> pattern_b`, got {raw.strip()!r}")
        try:
            captured = captures(left)
        except PatternSyntaxError as exc:
            raise NameMapError(f"{where}: {exc}") from None
        if captured != right.count("*"):
            what = (
                f"the right side needs the same number of `*` as the regex has groups ({captured})"
                if left.startswith("re:")
                else "both sides need the same number of `*`"
            )
            raise NameMapError(f"{where}: {what} ({left!r} -> {right!r})")
        rules.append(NameMapRule(left, right, where))
    return rules


def load_name_map(spec: str, base_dir: Path | None = None) -> list[NameMapRule]:
    """A map file path, or one inline `a -> b` rule (as written in [tool.weightcheck] map)."""
    if "->" in spec:
        return parse_name_map(spec, source="inline map")
    path = Path(spec)
    if not path.is_absolute() and base_dir is not None and not path.exists():
        path = base_dir / path
    try:
        text = safe_io.read_text(path)  # an option file: a regular file, bounded (a FIFO would hang)
    except safe_io.UnsafePath as exc:
        raise NameMapError(f"cannot read name map {spec}: {exc}") from None
    return parse_name_map(text, source=str(path))


def builtin_name_maps(
    config: Mapping[str, Any], names_a: Iterable[str] = (), names_b: Iterable[str] = ()
) -> list[NameMapRule]:
    """Name maps known for the model family, from its pattern (patterns/*.toml): when the two checkpoints
    spell the language-model root differently (`model.language_model.layers` vs `model.layers`, the
    transformers >= 4.52 VLM layout vs the Hub layout), map A's spelling onto B's."""
    from weightcheck.patterns import PatternError, detect_causal_pattern, for_architecture, layer_root

    try:
        causal = detect_causal_pattern(dict(config))
    except PatternError:
        return []
    if causal is None:
        return []
    names_a, names_b = list(names_a), list(names_b)
    moved = _base_layout_maps(causal, dict(config), names_a, names_b)
    if moved:
        return moved
    pattern = for_architecture(causal, dict(config))  # what detect_pattern gives
    if not pattern.root_aliases:
        return []
    root_a, root_b = layer_root(pattern, names_a), layer_root(pattern, names_b)
    if root_a == root_b:
        return []
    # Only the language model's own modules move (a blanket `model.*` rule would also drag `model.visual.*`).
    canonical = pattern.layer_prefix.rsplit(".", 1)[0]
    leaves = [pattern.layer_prefix.rsplit(".", 1)[-1]]
    leaves += [g.name[len(canonical) + 1 :] for g in pattern.globals if g.name.startswith(canonical + ".")]
    source = f"pattern {pattern.name}"
    return [NameMapRule(f"{root_a}.{leaf}.*", f"{root_b}.{leaf}.*", source=source) for leaf in leaves]


def _base_layout_maps(
    pattern: Pattern, config: dict[str, Any], names_a: list[str], names_b: list[str]
) -> list[NameMapRule]:
    """One checkpoint holds the decoder under its root (`model.layers...`, a causal LM or a reward model) and the
    other as the base class saves it (`layers...`, Qwen3-Embedding's layout, `patterns.base_layout`): the same
    modules, so map the decoder's own names across the root (the LM head and a task head are left to pair by
    name). `pattern` is the model_type's causal LM; only for a model_type whose base class transformers saves
    without the root (`patterns.backbone_class`)."""
    from weightcheck.patterns import backbone_class, decoder_root

    if backbone_class(pattern, config) is None:
        return []
    root = decoder_root(pattern)
    leaf = pattern.layer_prefix[len(root) + 1 :]
    leaves = [leaf, *(g.name[len(root) + 1 :] for g in pattern.globals if g.name.startswith(root + "."))]

    def rooted(names: list[str]) -> bool | None:
        """True: the decoder under the root; False: without it; None: neither (or both)."""
        under = any(n.startswith(f"{root}.{leaf}.") for n in names)
        bare = any(n.startswith(f"{leaf}.") for n in names)
        return under if under != bare else None

    side_a, side_b = rooted(names_a), rooted(names_b)
    if side_a is None or side_b is None or side_a == side_b:
        return []
    source = f"base-model layout ({pattern.name})"
    if side_a:
        return [NameMapRule(f"{root}.{x}.*", f"{x}.*", source=source) for x in leaves]
    return [NameMapRule(f"{x}.*", f"{root}.{x}.*", source=source) for x in leaves]


def map_name(name: str, rules: Iterable[NameMapRule]) -> str:
    return _mapped(name, rules)[0]


def _mapped(name: str, rules: Iterable[NameMapRule]) -> tuple[str, NameMapRule | None]:
    """(the name the first matching rule makes, that rule); the name itself and None when none matches."""
    for rule in rules:
        mapped = rule.apply(name)
        if mapped is not None:
            return mapped, rule
    return name, None


def skip_allowed(name: str, patterns: Iterable[str]) -> str | None:
    """The first `--allow-skip` pattern (glob, or `re:` regex) matching the whole name: the syntax verify's
    `--skip` and every other user pattern share (weightcheck.userpattern)."""
    return first_match(name, patterns)


# ---- logical view of a checkpoint ---------------------------------------------------------------
@dataclass
class LogicalCheckpoint:
    """A checkpoint's logical tensors: stored tensors, plus quantized modules folded into `P.weight`."""

    path: Path
    store: TensorStore
    plain: dict[str, str] = field(default_factory=dict)  # logical name → stored name
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)
    unavailable: dict[str, tuple[str, str]] = field(default_factory=dict)  # name → (code, reason)
    order: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return self.order

    def operand(self, name: str) -> Operand | None:
        from weightcheck.compare.operands import PlainOperand, QuantOperand

        if name in self.quantized:
            return QuantOperand(self.store, self.quantized[name])
        if name in self.plain:
            return PlainOperand(self.store, self.plain[name], name)
        return None

    def nbytes(self, name: str) -> int:
        if name in self.quantized:
            return sum(self.store.info(s).nbytes for s in self.quantized[name].parts.values())
        if name in self.plain:
            return self.store.info(self.plain[name]).nbytes
        return 0

    def close(self) -> None:
        self.store.close()


def load_logical(path: Path) -> LogicalCheckpoint:
    from weightcheck.dequant import COMPANION_SUFFIXES, find_quantized
    from weightcheck.tensors import TensorReadError, TensorStore

    ckpt = load_checkpoint(path)
    store = TensorStore(ckpt)
    view = LogicalCheckpoint(path=path, store=store)
    readable = store.names()
    infos = {n: store.info(n) for n in readable}

    def read_small(stored: str) -> Any:
        try:
            return store.get(stored)
        except TensorReadError as exc:
            from weightcheck.dequant import QuantFormatError

            raise QuantFormatError(f"cannot read {stored}: {exc}") from None

    quantized, malformed = find_quantized(infos, ckpt.config_data, read_small)
    from weightcheck import bnb  # bitsandbytes' layout, and its dequantizer registered with weightcheck.dequant

    more, bad = bnb.find({n: i for n, i in infos.items() if n not in quantized}, read_small)
    quantized.update(more)
    malformed.update(bad)
    consumed = {stored for qt in quantized.values() for stored in qt.parts.values()}
    # GPTQ / AWQ / AutoRound packing (`qweight`, `qzeros`, `scales`, `g_idx`): dequantized where weightcheck.gptq
    # reads the layout; another one is reported as not compared, with the reason, not as tensors only here.
    from weightcheck import gptq

    packed, bad, unsupported = gptq.find({n: i for n, i in infos.items() if n not in consumed}, ckpt.config_data)
    quantized.update(packed)
    malformed.update(bad)
    consumed.update(stored for qt in packed.values() for stored in qt.parts.values())
    for module, reason in unsupported.items():
        view.unavailable[f"{module}.weight" if module else "weight"] = (SKIPPED.code, f"{reason}: not compared")
        consumed.update(f"{module}.{p}" for p in ("qweight", "qzeros", "scales", "g_idx"))
    for module, reason in malformed.items():
        name = f"{module}.weight" if module else "weight"
        view.unavailable[name] = (QUANTIZED_TENSOR_MALFORMED.code, reason)
        prefix = f"{module}." if module else ""
        consumed.update(n for n in infos if n.startswith(prefix) and n[len(prefix) :].startswith("weight"))
    for stored, reason in store.unreadable().items():
        module, _, leaf = stored.rpartition(".")
        if leaf in COMPANION_SUFFIXES:  # a lost quantization part: the module's weight is what is lost
            logical = f"{module}.weight" if module else "weight"
            quantized.pop(logical, None)
            view.unavailable.setdefault(logical, (SKIPPED.code, reason))
        else:
            view.unavailable.setdefault(stored, (SKIPPED.code, reason))
    view.quantized = quantized
    position = {stored: i for i, stored in enumerate(readable)}
    order: list[tuple[int, str]] = []
    for stored in readable:
        if stored not in consumed and stored not in quantized and stored not in view.unavailable:
            view.plain[stored] = stored
            order.append((position[stored], stored))
    for name, qt in quantized.items():
        order.append((min(position[s] for s in qt.parts.values()), name))
    view.order = [n for _, n in sorted(order)] + sorted(n for n in view.unavailable if n not in view.plain)
    return view


# ---- the diff -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    """One compared (or skipped) pair: what a Ray task sends back, so public (weightcheck.distributed
    carries it without knowing what it is)."""

    name_a: str
    name_b: str
    status: str
    verdict: Verdict | None = None
    klass: str | None = None
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    code: str | None = None
    allowed_by: str | None = None
    shape: tuple[int, ...] = ()


@dataclass
class DiffOptions:
    maps: list[NameMapRule] = field(default_factory=list)
    policy_rules: list[PolicyRule] = field(default_factory=list)
    # False (`--no-default-policy`): only `policy_rules` apply; a tensor none of them matches is WC716.
    default_policy: bool = True
    allow_skip: list[str] = field(default_factory=list)
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    # weightcheck.progress mode: "bar", "lines", or False/None (off); True picks by stderr.
    progress: bool | str | None = False
    # A repo id operand is downloaded into the HF cache (diff reads tensor data; nothing is fetched unasked).
    download: bool = False
    ray: str | None = None  # `--ray [ADDRESS]`: compare on a Ray cluster ("auto" or an address)


def diff(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str], options: DiffOptions | None = None) -> Result:
    """Compare checkpoint B against reference A. Never raises for bad input: problems are findings."""
    from weightcheck.hub import HubError, resolve

    opts = options or DiffOptions()
    result = Result(target=f"{os.fspath(path_a)} vs {os.fspath(path_b)}", command="diff")
    paths: list[Path] = []
    for label, spec in (("reference", path_a), ("candidate", path_b)):
        try:
            resolved = resolve(spec, needs_data=True, download_ok=opts.download, what="diff")
        except HubError as exc:
            result.nothing_checked = True
            result.notes.append(f"{label}: {exc}")
            continue
        assert resolved.path is not None
        if resolved.note:
            result.notes.append(f"{label}: {resolved.note}")
        if not resolved.path.exists():
            result.nothing_checked = True
            result.notes.append(f"{label} {resolved.path}: no such file or directory")
        paths.append(resolved.path)
    if len(paths) == 2:
        # Findings point into the candidate (the checkpoint under test); SARIF needs one folder, not "A vs B".
        result.root = str(paths[1] if paths[1].is_dir() else paths[1].parent)
    if result.nothing_checked:
        return result
    a_path, b_path = paths
    if opts.ray is not None:
        from weightcheck.distributed import session

        with session(opts.ray) as ray:  # Ray is the backend the comparisons run on
            return _ray_diff(ray, a_path, b_path, opts, result)
    view_a = load_logical(a_path)
    view_b = load_logical(b_path)
    try:
        if nothing_to_compare(result, (("reference", view_a), ("candidate", view_b))):
            return result
        return _run(view_a, view_b, opts, result)
    finally:
        view_a.close()
        view_b.close()


def nothing_to_compare(result: Result, views: tuple[tuple[str, LogicalCheckpoint], ...]) -> bool:
    """Marks `result` nothing-checked, with a note per labelled view that holds no tensor; True if any."""
    for label, view in views:
        if not view.order:
            result.nothing_checked = True
            result.notes.append(f"{label} {view.path}: no tensors to compare")
    return result.nothing_checked


@dataclass
class DiffPlan:
    """Which tensor of A is compared with which of B (deterministic: every Ray task rebuilds the same)."""

    pairs: list[tuple[str, str]]
    only_a: list[str]
    only_b: list[str]
    policy: Policy
    reference: ReferenceIndex
    # Built-in name maps that paired names (the user's own `--map` rules are theirs to know), said in a note.
    builtin_maps: list[str] = field(default_factory=list)


def plan_diff(view_a: LogicalCheckpoint, view_b: LogicalCheckpoint, opts: DiffOptions) -> DiffPlan:
    from weightcheck.compare.classify import ReferenceIndex
    from weightcheck.compare.policy import Policy

    policy = Policy.with_user_rules(opts.policy_rules, include_default=opts.default_policy)
    builtin = builtin_name_maps(view_a.store.ckpt.config_data, view_a.names(), view_b.names())
    maps = [*opts.maps, *builtin]
    b_names = set(view_b.names())
    pairs: list[tuple[str, str]] = []
    only_a: list[str] = []
    paired_b: set[str] = set()
    used: set[str] = set()  # sources of the built-in rules that paired a name
    for name in view_a.names():
        target, rule = _mapped(name, maps)
        if target in b_names and target not in paired_b:
            pairs.append((name, target))
            paired_b.add(target)
            if rule is not None and rule in builtin and target != name:
                used.add(rule.source)
        else:
            only_a.append(name)
    only_b = [n for n in view_b.names() if n not in paired_b]
    reference = ReferenceIndex([n for n in view_a.names() if n not in view_a.unavailable], view_a.operand)
    return DiffPlan(pairs, only_a, only_b, policy, reference, builtin_maps=sorted(used))


def compare_pairs(
    view_a: LogicalCheckpoint,
    view_b: LogicalCheckpoint,
    plan: DiffPlan,
    pairs: list[tuple[str, str]],
    opts: DiffOptions,
    advance: Any = None,
) -> list[Outcome]:
    """Compare `pairs` in order: the unit of work of the single-process diff and of a Ray task."""
    outcomes: list[Outcome] = []
    for name_a, name_b in pairs:
        outcomes.append(_compare_one(view_a, view_b, name_a, name_b, plan.policy, plan.reference, opts))
        if advance is not None:
            advance(view_a.nbytes(name_a) + view_b.nbytes(name_b), name_a)
    return outcomes


def make_progress(opts: DiffOptions, total: int) -> Any:
    """A weightcheck.progress.Progress when the run asked for one and the work is long enough."""
    mode = opts.progress if isinstance(opts.progress, str) else ("bar" if sys.stderr.isatty() else "lines")
    if not opts.progress or (mode == "bar" and total < PROGRESS_MIN_BYTES):  # lines are gated by their interval
        return None
    from weightcheck.progress import Progress

    return Progress("diff", total, mode)


def _run(view_a: LogicalCheckpoint, view_b: LogicalCheckpoint, opts: DiffOptions, result: Result) -> Result:
    plan = plan_diff(view_a, view_b, opts)
    progress = make_progress(opts, sum(view_a.nbytes(a) + view_b.nbytes(b) for a, b in plan.pairs))
    try:
        outcomes = compare_pairs(view_a, view_b, plan, plan.pairs, opts, progress.advance if progress else None)
    finally:
        if progress is not None:
            progress.close()
    return finish_diff(outcomes, plan, view_a, view_b, opts, result, view_a.store.bytes_read + view_b.store.bytes_read)


def finish_diff(
    outcomes: list[Outcome],
    plan: DiffPlan,
    view_a: LogicalCheckpoint,
    view_b: LogicalCheckpoint,
    opts: DiffOptions,
    result: Result,
    bytes_read: int,
) -> Result:
    from weightcheck.triage import fill_fix_texts

    only_a, only_b = plan.only_a, plan.only_b
    for source in plan.builtin_maps:
        result.notes.append(f"names paired across the two checkpoints' layouts by the built-in map of the {source}")
    lossy = set(view_a.quantized) | set(view_b.quantized)
    result.findings = _findings(outcomes, only_a, only_b, opts, lossy) + _refusal_findings(view_a, view_b, opts)
    fill_fix_texts(result.findings)  # the Python API's findings say what to do, as the CLI's do
    counts: dict[str, int] = defaultdict(int)
    for outcome in outcomes:
        counts[outcome.status] += 1
    compared = counts["equal"] + counts["within_tolerance"] + counts["failed"]
    result.checked = {
        "tensors": len(plan.pairs) + len(only_a) + len(only_b),
        "compared": compared,
        "equal": counts["equal"],
        "within_tolerance": counts["within_tolerance"],
        "failed": counts["failed"],
        "skipped": counts["skipped"],
        "only_in_reference": len(only_a),
        "only_in_candidate": len(only_b),
        "reference_tensors": len(view_a.names()),
        "candidate_tensors": len(view_b.names()),
        "bytes_read": bytes_read,
    }
    result.notes.append(
        "coverage: "
        + ", ".join(
            f"{v} {k.replace('_', ' ')}" for k, v in result.checked.items() if k not in ("tensors", "bytes_read")
        )
    )
    return result


def _compare_one(
    view_a: LogicalCheckpoint,
    view_b: LogicalCheckpoint,
    name_a: str,
    name_b: str,
    policy: Policy,
    reference: ReferenceIndex,
    opts: DiffOptions,
) -> Outcome:
    from weightcheck.compare.classify import classify
    from weightcheck.compare.engine import FAILED, compare_pair
    from weightcheck.dequant import QuantFormatError
    from weightcheck.tensors import TensorReadError

    outcome = Outcome(name_a, name_b, "skipped")
    for view, name in ((view_a, name_a), (view_b, name_b)):
        if name in view.unavailable:
            code, reason = view.unavailable[name]
            side = "reference" if view is view_a else "candidate"
            return _skip(outcome, f"{side}: {reason}", code, opts)
    rule = policy.rule_for(name_a)
    if rule is None:
        return _skip(outcome, "no comparison policy rule matches this name", NO_POLICY_RULE.code, opts)
    a, b = view_a.operand(name_a), view_b.operand(name_b)
    assert a is not None and b is not None
    outcome.shape = a.shape
    try:
        verdict = compare_pair(a, b, rule)
        outcome.verdict = verdict
        outcome.status = verdict.status
        outcome.klass = verdict.klass
        outcome.message = verdict.message
        outcome.evidence = dict(verdict.evidence)
        if verdict.status == FAILED:
            found: Classification = classify(a, b, verdict, rule, reference)
            outcome.klass, outcome.message, outcome.evidence = found.klass, found.message, found.evidence
    except (TensorReadError, QuantFormatError) as exc:
        code = QUANTIZED_TENSOR_MALFORMED.code if isinstance(exc, QuantFormatError) else SKIPPED.code
        return _skip(outcome, str(exc), code, opts)
    except Exception as exc:  # a comparison bug: reported (exit 2) without hiding the other tensors' results
        outcome.status = "crashed"
        outcome.reason = f"{type(exc).__name__}: {exc}"
        outcome.evidence = {"traceback": traceback.format_exc()}
        return outcome
    finally:
        a.release()
        b.release()
    return outcome


def _skip(outcome: Outcome, reason: str, code: str, opts: DiffOptions) -> Outcome:
    outcome.status = "skipped"
    outcome.reason = reason
    outcome.code = code
    outcome.allowed_by = skip_allowed(outcome.name_a, opts.allow_skip) or skip_allowed(outcome.name_b, opts.allow_skip)
    return outcome


# ---- on a Ray cluster (weightcheck.distributed runs the chunks) ---------------------------------------
def _diff_task(path_a: str, path_b: str, opts: DiffOptions, start: int, stop: int) -> tuple[list[Outcome], dict]:
    """A Ray task: rebuild the (deterministic) plan and compare its pairs[start:stop]."""
    view_a, view_b = load_logical(Path(path_a)), load_logical(Path(path_b))
    try:
        plan = plan_diff(view_a, view_b, opts)
        before = view_a.store.bytes_read + view_b.store.bytes_read  # header-time reads: the driver counts them
        outcomes = compare_pairs(view_a, view_b, plan, plan.pairs[start:stop], opts)
        read = view_a.store.bytes_read + view_b.store.bytes_read - before
        return outcomes, {"bytes": read}
    finally:
        view_a.close()
        view_b.close()


def _files_of(view: LogicalCheckpoint, name: str, root: str) -> set[tuple[str, str]]:
    store = view.store
    if name in view.quantized:
        return {(root, store.location(s).shard) for s in view.quantized[name].parts.values()}
    if name in view.plain:
        return {(root, store.location(view.plain[name]).shard)}
    return set()


def _ray_diff(ray: Any, path_a: Path, path_b: Path, opts: DiffOptions, result: Result) -> Result:
    from weightcheck.distributed import run_work

    view_a, view_b = load_logical(path_a), load_logical(path_b)
    try:
        if nothing_to_compare(result, (("checkpoint A", view_a), ("checkpoint B", view_b))):
            return result
        plan = plan_diff(view_a, view_b, opts)
        root_a = str(path_a if path_a.is_dir() else path_a.parent)
        root_b = str(path_b if path_b.is_dir() else path_b.parent)
        items = [
            (
                view_a.nbytes(a) + view_b.nbytes(b),
                tuple(sorted(_files_of(view_a, a, root_a) | _files_of(view_b, b, root_b))),
            )
            for a, b in plan.pairs
        ]
        sizes: dict[tuple[str, str], int] = {}
        for root, view in ((root_a, view_a), (root_b, view_b)):
            for shard, report in view.store.ckpt.shards.items():
                sizes[(root, shard)] = report.file_size
        progress = make_progress(opts, sum(nbytes for nbytes, _ in items))

        def args_of(start: int, stop: int, files: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
            return (str(path_a), str(path_b), opts, start, stop)

        chunks, results, errors, stats = run_work(ray, _diff_task, items, args_of, sizes, progress=progress)
        outcomes: list[Outcome] = []
        for chunk, value, error in zip(chunks, results, errors, strict=True):
            if value is not None:
                outcomes.extend(value)
                continue
            for name_a, name_b in plan.pairs[chunk.start : chunk.stop]:  # reported as skips, never dropped
                outcomes.append(Outcome(name_a, name_b, "skipped", reason=str(error), code=SKIPPED.code))
        bytes_read = view_a.store.bytes_read + view_b.store.bytes_read + stats.bytes
        finish_diff(outcomes, plan, view_a, view_b, opts, result, bytes_read)
        if stats.failed:
            result.notes.append(stats.note(f"{len(plan.pairs)} pairs"))
        stats.tell(f"{len(plan.pairs)} pairs")
        return result
    finally:
        view_a.close()
        view_b.close()


# ---- findings -----------------------------------------------------------------------------------
def _layer_of(name: str) -> int | None:
    return segment_layer(name)


def _finding(rule: Rule, severity: Severity | None, message: str, names: list[str], details: dict[str, Any]) -> Finding:
    return Finding(
        code=rule.code,
        name=rule.name,
        severity=severity or rule.severity,
        message=message,
        location=Location(tensor=summarize(names, limit=4)),
        count=len(names),
        details=details,
    )


def _tensor_evidence(outcome: Outcome) -> dict[str, Any]:
    item: dict[str, Any] = {"tensor": outcome.name_a}
    if outcome.name_b != outcome.name_a:
        item["tensor_b"] = outcome.name_b
    if outcome.message:
        item["message"] = outcome.message
    if outcome.evidence:
        item["evidence"] = outcome.evidence
    verdict = outcome.verdict
    if verdict is not None:
        item["tier"] = verdict.tier
        if verdict.metrics is not None:
            item["metrics"] = verdict.metrics.as_dict(outcome.shape)
    return item


# The fix of a value mismatch between a tensor and its quantized form: a quantizer that clips or compensates error
# moves some weights past one step on purpose, and the stat tier is how the README says to compare such pairs.
_LOSSY_FIX = (
    "one side is quantized: a quantizer that clips or compensates error (GPTQ, AWQ, AutoRound's optimized RTN) "
    "leaves some weights past one quantization step; if that is the quantizer, compare with the stat tier "
    '(a --policy file with the line "*.weight stat"); otherwise find the conversion step that changed the values'
)


def _findings(
    outcomes: list[Outcome], only_a: list[str], only_b: list[str], opts: DiffOptions, lossy: set[str] | None = None
) -> list[Finding]:
    from weightcheck.linting import selected_rules

    findings: list[Finding] = []
    by_class: dict[str, list[Outcome]] = defaultdict(list)
    skips: dict[tuple[str, str, bool], list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.status == "crashed":
            findings.append(
                Finding(
                    code=INTERNAL_ERROR_CODE,
                    name="internal-error",
                    severity=Severity.ERROR,
                    message=f"comparing {outcome.name_a} crashed: {outcome.reason}",
                    location=Location(tensor=outcome.name_a),
                    details=outcome.evidence,
                )
            )
        elif outcome.status == "skipped":
            skips[(outcome.code or SKIPPED.code, outcome.reason, outcome.allowed_by is not None)].append(outcome)
        elif outcome.status in ("failed", "within_tolerance") and outcome.klass:
            by_class[outcome.klass].append(outcome)
    for klass, items in sorted(by_class.items()):
        found = class_rule(klass)  # an unknown class raises: it must not vanish from the report
        groups: dict[tuple[int, ...], list[Outcome]] = defaultdict(list)
        if items[0].status == "failed":
            # One finding per class and layer set, so a swap of layers 0 and 1 reads as one finding.
            layers_by_tensor = defaultdict(set)
            for o in items:
                layers_by_tensor[_strip_layer(o.name_a)].add(_layer_of(o.name_a))
            for o in items:
                key = tuple(sorted(x for x in layers_by_tensor[_strip_layer(o.name_a)] if x is not None))
                groups[key].append(o)
        else:
            groups[()] = items
        for layers, group in sorted(groups.items()):
            finding = _class_finding(found, klass, layers, group)
            if klass == "value-mismatch" and lossy and all(o.name_a in lossy or o.name_b in lossy for o in group):
                finding.fix = _LOSSY_FIX
            findings.append(finding)
    for (code, reason, allowed), items in sorted(skips.items()):
        names = [o.name_a for o in items]
        severity = Severity.INFO if allowed else None
        how = f"allowed by --allow-skip {items[0].allowed_by}" if allowed else "not allowed by --allow-skip"
        message = f"not compared: {reason} ({how})"
        if code == QUANTIZED_TENSOR_MALFORMED.code:
            message = f"quantized tensor cannot be dequantized: {reason}"
            if allowed:
                message += f" (allowed by --allow-skip {items[0].allowed_by})"
        details = {"reason": reason, "allowed": allowed}
        findings.append(_finding(diff_rule(code), severity, message, names, details))  # unknown code: raises
    findings.extend(_only_findings(ONLY_IN_REFERENCE, "A", only_a, opts))
    findings.extend(_only_findings(ONLY_IN_CANDIDATE, "B", only_b, opts))
    codes = {r.code for r in selected_rules(opts.select, opts.ignore, command="diff")}
    return [f for f in findings if f.code in codes or f.code == INTERNAL_ERROR_CODE]


def _refusal_findings(view_a: LogicalCheckpoint, view_b: LogicalCheckpoint, opts: DiffOptions) -> list[Finding]:
    """Files either checkpoint references that the loader refused (leaving the checkpoint, a loop, not a
    regular file): the diff may still find every tensor elsewhere, but the checkpoint is not clean."""
    from weightcheck.linting import selected_rules

    rule = FILE_REFUSED
    if rule.code not in {r.code for r in selected_rules(opts.select, opts.ignore, command="diff")}:
        return []
    out: list[Finding] = []
    for label, view in (("A", view_a), ("B", view_b)):
        for refusal in view.store.ckpt.refused:
            if refusal.kind == "missing":
                continue  # a missing shard leaves its tensors unavailable: WC715 says so per tensor
            out.append(Finding(code=rule.code, name=rule.name, severity=rule.severity,
                               message=f"{label}: refused to open {refusal.name}: {refusal.reason}",
                               location=Location(file=str(view.path / refusal.name))))  # fmt: skip
    return out


def _strip_layer(name: str) -> str:
    return segment_layer_wildcard(name)


def _class_finding(rule: Rule, klass: str, layers: tuple[int, ...], group: list[Outcome]) -> Finding:
    names = [o.name_a for o in group]
    details: dict[str, Any] = {"class": klass, "tensors": [_tensor_evidence(o) for o in group[:_EVIDENCE_LIMIT]]}
    if layers:
        details["layers"] = format_ranges(layers)
    if len(group) > _EVIDENCE_LIMIT:
        details["tensors_omitted"] = len(group) - _EVIDENCE_LIMIT
    where = f"layers {format_ranges(layers)}: " if len(layers) > 1 else f"layer {layers[0]}: " if layers else ""
    if klass == "shifted/swapped":
        message = where + _shift_message(group)
    elif klass in ("within-quantization-error", "within-tolerance"):
        worst = max(
            (o for o in group if o.verdict and o.verdict.metrics),
            key=lambda o: o.verdict.metrics.rel_l2 if o.verdict and o.verdict.metrics else 0.0,
            default=None,
        )
        tail = ""
        if worst is not None and worst.verdict is not None and worst.verdict.metrics is not None:
            m = worst.verdict.metrics
            tail = f"; worst rel-L2 {m.rel_l2:.4g} (SQNR {m.sqnr_db:.1f} dB) in {worst.name_a}"
        message = f"{len(group)} tensor(s) {group[0].message}{tail}"
    else:
        distinct = sorted({o.message for o in group})
        message = where + distinct[0] + (f" (and {len(distinct) - 1} other variants)" if len(distinct) > 1 else "")
    return _finding(rule, None, message, names, details)


def _shift_message(group: list[Outcome]) -> str:
    moves: dict[tuple[str, int, int], int] = {}
    for o in group:
        ev = o.evidence
        own = _index_at(o.name_a, ev.get("reference", ""))
        if own is None:
            continue
        moves[(ev.get("index", "index"), own, own + int(ev.get("offset", 0)))] = int(ev.get("offset", 0))
    parts = []
    for (kind, own, ref), offset in sorted(moves.items(), key=lambda kv: kv[0][1]):
        swapped = (kind, ref, own) in moves
        parts.append(
            f"{kind} {own} holds the reference's {kind} {ref} (offset {offset:+d}{', swapped' if swapped else ''})"
        )
    return "; ".join(parts) if parts else group[0].message


def _index_at(name: str, reference: str) -> int | None:
    """The number in `name` at the first position where `reference` has a different number."""
    a, b = name.split("."), reference.split(".")
    if len(a) != len(b):
        return None
    for x, y in zip(a, b, strict=True):
        if x != y and is_index(x) and is_index(y):
            return int(x)
    return None


def _only_findings(rule: Rule, side: str, names: list[str], opts: DiffOptions) -> list[Finding]:
    # One vocabulary: the reference (first argument) and the candidate (second).
    other = "candidate" if side == "A" else "reference"
    side_name = "reference" if side == "A" else "candidate"
    groups: dict[tuple[str, Severity | None], list[str]] = defaultdict(list)
    for name in names:
        if skip_allowed(name, opts.allow_skip):
            groups[("allowed by --allow-skip", Severity.INFO)].append(name)
        elif _ACTIVATION_PARAM.search(name):
            groups[(_ACTIVATION_NOTE, Severity.INFO)].append(name)
        else:
            groups[("", None)].append(name)
    out = []
    for (why, severity), group in sorted(groups.items(), key=lambda kv: kv[0][0]):
        many = len(group) != 1
        message = (
            f"{len(group)} tensor{'s' if many else ''} of the {side_name} {'have' if many else 'has'} "
            f"no counterpart in the {other}"
        )
        if why:
            message += f" ({why})"
        out.append(_finding(rule, severity, message, group, {"side": side}))
    return out


def internal_error(target: str, exc: BaseException) -> Result:
    """A crash inside diff, as a result (exit 2) rather than a traceback."""
    result = Result(target=target, command="diff")
    result.findings.append(make_internal_error("diff", exc))
    return result
