"""Explain a failed comparison: which of the known ways weights go wrong this mismatch looks like.

Classes, checked in this order (cheap evidence from the metrics first, extra reads last):

- `shape-mismatch` refined to `partially-written` (B holds one TP shard of A) or `transposed`;
- `nan-inf`: B (or A) holds NaN/Inf;
- `all-zero`: B is all zeros, A is not;
- `never-written`: B still looks like an engine's reset values: uniform [0, 1) floats, or integer codes
  spread flat over the full range;
- `partially-written`: some rows (or columns) match and the rest do not — one contiguous block that is
  a 1/n fraction is reported as the TP shard it is;
- `shifted/swapped`: B equals A's tensor at another layer or expert index (the offset is reported;
  two tensors holding each other's data are a swap);
- `transposed` (square tensors), `scaled` (B ≈ c·A, c ≠ 1);
- `value-mismatch`: none of the above.

Reference lookups go through a `ReferenceIndex`, which the diff builds over checkpoint A.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightcheck.compare.engine import (
    ALL_ZERO,
    EQUAL,
    NAN_INF,
    NEVER_WRITTEN,
    PARTIAL,
    SCALED,
    SHAPE_MISMATCH,
    SHIFTED,
    TRANSPOSED,
    VALUE_MISMATCH,
    WITHIN,
    Verdict,
    compare_pair,
)
from weightcheck.compare.operands import (
    MAX_MATERIALIZE,
    Operand,
    PlainOperand,
    QuantOperand,
    SlicedOperand,
    TransposedOperand,
)
from weightcheck.compare.policy import PolicyRule
from weightcheck.names import index_kind, is_index

if TYPE_CHECKING:
    import torch

# Shift search: at most this many candidate tensors probed per index position.
_MAX_CANDIDATES = 64
_UNIFORM_STD = 1 / math.sqrt(12)


@dataclass
class Classification:
    klass: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


class ReferenceIndex:
    """The reference checkpoint's logical tensors, indexed for "same name at another index" lookups."""

    def __init__(self, names: list[str], make_operand: Callable[[str], Operand | None]) -> None:
        self._make = make_operand
        self._templates: dict[tuple[int, tuple[str, ...]], dict[int, str]] = {}
        self._probes: dict[str, tuple[list[int], torch.Tensor, torch.Tensor | None]] = {}
        for name in names:
            parts = name.split(".")
            for pos, part in enumerate(parts):
                if is_index(part):
                    key = (pos, (*parts[:pos], "*", *parts[pos + 1 :]))
                    self._templates.setdefault(key, {})[int(part)] = name

    def operand(self, name: str) -> Operand | None:
        return self._make(name)

    def probe(self, name: str, op: Operand) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
        if name not in self._probes:
            self._probes[name] = op.probe()
            op.release()
        return self._probes[name]

    def candidates(self, name: str) -> list[tuple[str, str, int, str]]:
        """(index kind, position label, offset, candidate name): layers first, nearest offsets first."""
        parts = name.split(".")
        out: list[tuple[int, str, str, int, str]] = []
        for pos, part in enumerate(parts):
            if not is_index(part):
                continue
            own = int(part)
            key = (pos, (*parts[:pos], "*", *parts[pos + 1 :]))
            peers = self._templates.get(key, {})
            word = parts[pos - 1] if pos else ""
            kind = index_kind(word)
            rank = {"layer": 0, "expert": 1}.get(kind, 2)
            ordered = sorted((v for v in peers if v != own), key=lambda v: (abs(v - own), v < own))
            for value in ordered[:_MAX_CANDIDATES]:
                out.append((rank, kind, word, value - own, peers[value]))
        out.sort(key=lambda c: (c[0], abs(c[3])))
        return [(kind, word, offset, cand) for _, kind, word, offset, cand in out]


def _probe_matches(
    ref: tuple[list[int], torch.Tensor, torch.Tensor | None],
    got: tuple[list[int], torch.Tensor, torch.Tensor | None],
    rule: PolicyRule,
) -> bool:
    """Would the rows sampled from both tensors pass the rule? A cheap filter before a full compare."""
    import torch

    rows_a, va, sa = ref
    rows_b, vb, sb = got
    if rows_a != rows_b or va.shape != vb.shape:
        return False
    a, b = va.to(torch.float64), vb.to(torch.float64)
    if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
        return False
    d = (a - b).abs()
    if rule.tier == "stat":
        norm = float((a * a).sum().sqrt())
        limit = rule.rel_l2 if rule.rel_l2 is not None else 0.5
        return norm > 0 and float((d * d).sum().sqrt()) / norm <= 2 * limit
    tol = torch.zeros((), dtype=torch.float64)
    for step in (sa, sb):
        if step is not None:
            tol = tol + step.to(torch.float64)
    if rule.tier == "ulp" or (rule.tier == "auto" and (sa is not None or sb is not None)):
        return bool((d <= tol * rule.ulps).all())
    return bool((d == 0).all())


def _matches(a: Operand, b: Operand, rule: PolicyRule) -> bool:
    verdict = compare_pair(a, b, rule)
    return verdict.status in (EQUAL, WITHIN)


def _as_rule(rule: PolicyRule, verdict: Verdict) -> PolicyRule:
    """The rule as the failed comparison applied it (auto resolved), for re-use on candidates."""
    if rule.tier != "auto":
        return rule
    tier = "ulp" if verdict.tier in ("ulp", "parts") else verdict.tier
    return PolicyRule(pattern=rule.pattern, tier=tier if tier in ("exact", "ulp", "stat") else "ulp", ulps=rule.ulps)


def classify(
    a: Operand, b: Operand, verdict: Verdict, rule: PolicyRule, reference: ReferenceIndex | None = None
) -> Classification:
    """Explain why `b` failed against `a` (whose name is the reference-side name). Reads more data only
    when cheap evidence is not enough."""
    applied = _as_rule(rule, verdict)
    if verdict.klass == SHAPE_MISMATCH:
        return _classify_shape(a, b, applied, verdict)
    if verdict.klass is not None and verdict.klass not in (VALUE_MISMATCH,):
        return Classification(verdict.klass, verdict.message, dict(verdict.evidence))
    m = verdict.metrics
    if m is not None:
        if m.nan_b or m.inf_b or m.nan_a or m.inf_a:
            side = "B" if (m.nan_b or m.inf_b) else "A (the reference)"
            counts = {"nan_a": m.nan_a, "inf_a": m.inf_a, "nan_b": m.nan_b, "inf_b": m.inf_b}
            return Classification(
                NAN_INF,
                f"{side} holds {m.nan_b or m.nan_a} NaN and {m.inf_b or m.inf_a} Inf values",
                counts,
            )
        if m.count and m.min_b == 0 == m.max_b and not (m.min_a == 0 == m.max_a):
            return Classification(ALL_ZERO, "every element is zero; the reference's are not", {})
        never = _never_written(a, b, verdict)
        if never is not None:
            return never
        partial = _partial(a, b, verdict)
        if partial is not None:
            return partial
    if reference is not None:
        shifted = _shifted(a.name, b, applied, reference)
        if shifted is not None:
            return shifted
    if len(a.shape) == 2 and a.shape[0] == a.shape[1] and _corner_transposed(a, b, applied):
        transposed = TransposedOperand(b)
        try:
            if _matches(a, transposed, applied):
                return Classification(TRANSPOSED, "B equals the reference transposed", {})
        finally:
            transposed.release()
    if m is not None and m.count and m.sum_a2 > 0 and math.isfinite(m.scale_factor):
        factor, residual = m.scale_factor, m.scale_residual
        if abs(factor - 1) > 1e-3 and residual < 0.25 * abs(factor - 1) and m.rel_l2 > 4 * residual:
            return Classification(
                SCALED,
                f"B ≈ {factor:.6g} × reference (residual {residual:.2g})",
                {"factor": round(factor, 6), "residual": round(residual, 6)},
            )
    return Classification(VALUE_MISMATCH, verdict.message, {})


def _classify_shape(a: Operand, b: Operand, rule: PolicyRule, verdict: Verdict) -> Classification:
    evidence = dict(verdict.evidence)
    if a.shape and len(a.shape) == len(b.shape):
        # One TP shard: B's shape is A's with its first or last dimension divided by n.
        last = len(a.shape) - 1
        for dim in sorted({0, last}):
            da, db = a.shape[dim], b.shape[dim]
            others_equal = all(x == y for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if i != dim)
            if not others_equal or db == 0 or da % db or da == db:
                continue
            n = da // db
            view_dim = 0 if dim == 0 and len(a.shape) > 1 else 1  # rows or columns of the [rows, cols] view
            for k in range(n):
                shard = SlicedOperand(a, view_dim, k, n)
                if (shard.rows, shard.cols) != (b.rows, b.cols):
                    break
                if _matches(shard, _Reshaped(b, shard.shape), rule):
                    evidence.update(dim=dim, shard=k, shards=n)
                    return Classification(
                        PARTIAL,
                        f"B holds only shard {k} of {n} (TP split along dim {dim}) of the reference",
                        evidence,
                    )
    if len(a.shape) == 2 and b.shape == (a.shape[1], a.shape[0]) and _corner_transposed(a, b, rule):
        transposed = TransposedOperand(b)
        try:
            if _matches(a, transposed, rule):
                return Classification(TRANSPOSED, "B is the reference transposed", evidence)
        finally:
            transposed.release()
    return Classification(SHAPE_MISMATCH, verdict.message, evidence)


def _corner_transposed(a: Operand, b: Operand, rule: PolicyRule) -> bool:
    """Does A's top-left corner equal B's transposed (under the rule)? A cheap filter: only then is B
    materialized transposed for the full comparison."""
    if a.numel > MAX_MATERIALIZE or not a.rows or not a.cols:
        return False
    k = min(64, a.rows, a.cols)
    va, sa = a.block(0, k, with_step=True)
    vb, sb = b.block(0, k, with_step=True)
    corner_a = (va[:, :k], sa.expand_as(va)[:, :k] if sa is not None else None)
    corner_b = (vb[:, :k].t(), sb.expand_as(vb)[:, :k].t() if sb is not None else None)
    return _probe_matches(([0], *corner_a), ([0], *corner_b), rule)


class _Reshaped(Operand):
    """`base` presented with the [rows, cols] of another operand of equal size (for shard matching)."""

    def __init__(self, base: Operand, shape: tuple[int, ...]) -> None:
        self.base = base
        self.name = base.name
        self.shape = shape
        self.label = base.label
        self.value_dtype = base.value_dtype

    def block(self, r0: int, r1: int, *, with_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.base.block(r0, r1, with_step=with_step)

    def release(self) -> None:
        self.base.release()


def _never_written(a: Operand, b: Operand, verdict: Verdict) -> Classification | None:
    m = verdict.metrics
    assert m is not None
    # <= 1, not < 1: uniform [0, 1) values rounded to bf16 can reach 1.0.
    if m.count >= 256 and m.min_b >= 0 and m.max_b <= 1:
        uniform = abs(m.mean_b - 0.5) < 0.05 and abs(m.std_b - _UNIFORM_STD) < 0.03
        if uniform and not (m.min_a >= 0 and m.max_a <= 1):
            return Classification(
                NEVER_WRITTEN,
                f"values look like an uninitialised buffer: uniform [0, 1) (mean {m.mean_b:.3f}, std {m.std_b:.3f})",
                {"mean": round(m.mean_b, 4), "std": round(m.std_b, 4), "min": m.min_b, "max": m.max_b},
            )
    if isinstance(b, QuantOperand):
        histogram = b.codes_histogram()
        if histogram is not None:
            levels, counts = histogram
            total = int(counts.sum())
            if total >= 16 * levels:
                low, high = int(counts.min()), int(counts.max())
                if low > 0 and high / low < 1.5:
                    return Classification(
                        NEVER_WRITTEN,
                        f"INT{levels.bit_length() - 1} codes are spread flat over the full range "
                        "(random integers, not a quantized weight)",
                        {"levels": levels, "min_count": low, "max_count": high},
                    )
    if isinstance(b, PlainOperand) and b.value_dtype in _INT_RANGES and m.count >= 256:
        lo, hi = _INT_RANGES[b.value_dtype]
        span = hi - lo
        full = m.min_b <= lo + 0.02 * span and m.max_b >= hi - 0.02 * span
        if full and m.std_b >= 0.8 * span / math.sqrt(12) and not (m.min_a <= lo + 0.02 * span):
            return Classification(
                NEVER_WRITTEN,
                f"{b.value_dtype} values span the full range uniformly (random integers)",
                {"min": m.min_b, "max": m.max_b, "std": round(m.std_b, 2)},
            )
    return None


_INT_RANGES = {
    "I8": (-128, 127),
    "U8": (0, 255),
    "I16": (-(2**15), 2**15 - 1),
    "I32": (-(2**31), 2**31 - 1),
}


def _runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """Contiguous [start, end) runs of True."""
    values = mask.to(dtype=mask.dtype).tolist()
    runs: list[tuple[int, int]] = []
    start = None
    for i, v in enumerate(values):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(values)))
    return runs


def _partial(a: Operand, b: Operand, verdict: Verdict) -> Classification | None:
    m = verdict.metrics
    assert m is not None
    if m.row_fail is None or m.col_fail is None or a.cols < 8:
        return None
    for dim, failing, length in ((0, m.row_fail, a.rows), (1, m.col_fail > 0, a.cols)):
        if length < 2:
            continue
        good = ~failing
        n_good = int(good.sum())
        if n_good == 0 or n_good == length:
            continue
        runs = _runs(good)
        evidence: dict[str, Any] = {"dim": dim, "matching": n_good, "of": length}
        if len(runs) == 1:
            start, end = runs[0]
            size = end - start
            evidence["range"] = [start, end]
            if length % size == 0 and start % size == 0:
                n = length // size
                evidence.update(shard=start // size, shards=n)
                return Classification(
                    PARTIAL,
                    f"only {'rows' if dim == 0 else 'columns'} {start}..{end - 1} match: TP shard "
                    f"{start // size} of {n} along dim {dim} was written, the rest was not",
                    evidence,
                )
            return Classification(
                PARTIAL,
                f"only {'rows' if dim == 0 else 'columns'} {start}..{end - 1} of {length} match",
                evidence,
            )
        if n_good >= length // 2:
            continue  # scattered bad rows or columns are not a partial write (a lossy quantizer's clipped columns)
        return Classification(PARTIAL, f"{n_good} of {length} {'rows' if dim == 0 else 'columns'} match", evidence)
    return None


def _shifted(name: str, b: Operand, rule: PolicyRule, reference: ReferenceIndex) -> Classification | None:
    candidates = reference.candidates(name)
    if not candidates:
        return None
    got = None
    for kind, _word, offset, name in candidates:
        op = reference.operand(name)
        if op is None or op.shape != b.shape:
            continue
        if got is None:
            got = b.probe()
        if not _probe_matches(reference.probe(name, op), got, rule):
            continue
        try:
            if _matches(op, b, rule):
                return Classification(
                    SHIFTED,
                    f"equals the reference's {kind} {'+' if offset > 0 else ''}{offset} ({name})",
                    {"index": kind, "offset": offset, "reference": name},
                )
        finally:
            op.release()
    return None
