"""Compare two logical tensors under a policy rule: a verdict (equal, within tolerance, failed) and metrics.

A is the reference, B the candidate. Bytes are compared as wide integer words where the tier is exact and
the dtypes agree; otherwise both sides are read a block of rows at a time, widened to float32 (float64
when a side is 32/64-bit) and accumulated into `Metrics`, so memory stays at a few blocks whatever the
tensor's size. NaN never equals anything, not even an identical NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightcheck.compare.metrics import CHUNK_ELEMENTS, Metrics, value_range
from weightcheck.compare.operands import Operand, PlainOperand, QuantOperand
from weightcheck.compare.policy import STAT_BANDS, PolicyRule
from weightcheck.compare.ulp import FLOAT_FORMATS

if TYPE_CHECKING:
    import torch

EQUAL = "equal"
WITHIN = "within_tolerance"
FAILED = "failed"
SKIPPED = "skipped"

# Mismatch classes (also the keys of the diff rule codes).
NEVER_WRITTEN = "never-written"
ALL_ZERO = "all-zero"
NAN_INF = "nan-inf"
SHIFTED = "shifted/swapped"
TRANSPOSED = "transposed"
SCALED = "scaled"
PARTIAL = "partially-written"
DTYPE_MISMATCH = "dtype-mismatch"
SHAPE_MISMATCH = "shape-mismatch"
WITHIN_QUANT = "within-quantization-error"
WITHIN_TOLERANCE = "within-tolerance"
VALUE_MISMATCH = "value-mismatch"

# Widening casts that change no value: comparing after them is still an exact comparison. Integers and
# floats are kept apart: a float weight against an integer one is a dtype mismatch even where the
# values happen to convert exactly.
_WIDER: dict[str, tuple[str, ...]] = {
    "BOOL": ("U8", "I8", "I16", "I32", "I64", "U16", "U32", "U64"),
    "U8": ("I16", "I32", "I64", "U16", "U32", "U64"),
    "I8": ("I16", "I32", "I64"),
    "U16": ("I32", "I64", "U32", "U64"),
    "I16": ("I32", "I64"),
    "U32": ("I64", "U64"),
    "I32": ("I64",),
    "F8_E4M3": ("F16", "BF16", "F32", "F64"),
    "F8_E5M2": ("F16", "F32", "F64"),
    "F16": ("F32", "F64"),
    "BF16": ("F32", "F64"),
    "F32": ("F64",),
}
_WIDE_VALUE_DTYPES = {"F32", "F64", "I32", "I64", "U32", "U64"}


def widens(source: str, target: str) -> bool:
    """True when every `source` value is exactly representable in `target` (or they are equal)."""
    return source == target or target in _WIDER.get(source, ())


def lossless(a: str, b: str) -> bool:
    """True when one of the two dtypes widens to the other: values compare exactly in the wider one."""
    return widens(a, b) or widens(b, a)


@dataclass
class Verdict:
    status: str
    tier: str
    message: str
    metrics: Metrics | None = None
    klass: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status in (EQUAL, WITHIN)


def _family(op: Operand) -> str:
    qt = op.quantized
    if qt is None:
        return "cast"
    spec = qt.spec
    if spec.type == "float":
        return "fp4" if spec.num_bits == 4 else "fp8"
    return {8: "int8", 4: "int4"}.get(spec.num_bits, "int")


def _same_layout(a: Operand, b: Operand) -> bool:
    """Both quantized the same way, with parts of equal dtype and shape: then bytes can be compared."""
    if not (isinstance(a, QuantOperand) and isinstance(b, QuantOperand)):
        return False
    if a.qt.spec != b.qt.spec or set(a.qt.parts) != set(b.qt.parts):
        return False
    for role in a.qt.parts:
        ia, ib = a.store.info(a.qt.parts[role]), b.store.info(b.qt.parts[role])
        if ia.dtype != ib.dtype or ia.shape != ib.shape:
            return False
    return True


def _words_equal(wa: torch.Tensor, wb: torch.Tensor) -> bool:
    import torch

    if wa.dtype != wb.dtype:
        wa, wb = wa.view(torch.uint8), wb.view(torch.uint8)
    return wa.shape == wb.shape and torch.equal(wa, wb)


def _stored_nan(store: Any, stored: str) -> bool:
    info = store.info(stored)
    if info.dtype not in FLOAT_FORMATS:
        return False
    found = value_range(store.get(stored))
    return bool(found and found.has_nan)


def measure(a: Operand, b: Operand, *, tolerance: str, ulps: float = 1.0, chunk: int = CHUNK_ELEMENTS) -> Metrics:
    """Stream both operands block by block into Metrics.

    tolerance: "exact" (value equality), "ulp" (ulps × (step_a + step_b)) or "none" (statistics only).
    """
    import torch

    wide = a.value_dtype in _WIDE_VALUE_DTYPES or b.value_dtype in _WIDE_VALUE_DTYPES
    work = torch.float64 if wide else torch.float32
    metrics = Metrics(rows=a.rows)
    per_block = max(1, chunk // max(a.cols, 1))
    need_step = tolerance == "ulp"
    for r0 in range(0, a.rows, per_block):
        r1 = min(a.rows, r0 + per_block)
        va, sa = a.block(r0, r1, with_step=need_step)
        vb, sb = b.block(r0, r1, with_step=need_step)
        va, vb = va.to(work), vb.to(work)
        tol = None
        if need_step:
            total = None
            for step in (sa, sb):
                if step is not None:
                    total = step.to(work) if total is None else total + step.to(work)
            tol = total * ulps if total is not None else torch.zeros((), dtype=work)
        metrics.add(va, vb, r0, tol, exact=tolerance == "exact")
    return metrics


def _band(a: Operand, b: Operand) -> float:
    return max(STAT_BANDS[_family(a)], STAT_BANDS[_family(b)])


def compare_pair(a: Operand, b: Operand, rule: PolicyRule) -> Verdict:
    """Compare reference `a` with candidate `b` under `rule` (tiers: see weightcheck.compare.policy)."""
    if a.shape != b.shape:
        return Verdict(
            FAILED,
            rule.tier,
            f"shape {list(b.shape)} differs from the reference's {list(a.shape)}",
            klass=SHAPE_MISMATCH,
            evidence={"shape_a": list(a.shape), "shape_b": list(b.shape)},
        )
    quantized = a.quantized is not None or b.quantized is not None
    tier = rule.tier
    if tier == "auto":
        if quantized:
            tier = "parts" if _same_layout(a, b) else "ulp"
        elif widens(a.value_dtype, b.value_dtype):
            # B is the reference widened (bf16 → f32): exact. The other way round B is a rounding of A.
            tier = "exact"
        elif a.value_dtype in FLOAT_FORMATS and b.value_dtype in FLOAT_FORMATS:
            tier = "ulp"
        else:
            return _dtype_mismatch(a, b, rule.tier)
    if tier == "parts" or (tier == "exact" and _same_layout(a, b)):
        verdict = _compare_parts(a, b)
        if verdict is not None:
            return verdict
        tier = "ulp" if rule.tier == "auto" else "exact"
    if tier == "exact":
        return _compare_exact(a, b)
    if tier == "ulp":
        ulps = rule.ulps
        metrics = measure(a, b, tolerance="ulp", ulps=ulps)
        if metrics.exceed:
            return Verdict(
                FAILED,
                "ulp",
                f"{metrics.exceed} of {a.numel} elements outside {ulps:g} ULP "
                f"(worst {_fmt(metrics.worst_ratio)}× the tolerance)",
                metrics,
            )
        if metrics.max_abs == 0 and not quantized and a.value_dtype == b.value_dtype:
            return Verdict(EQUAL, "ulp", "values equal", metrics)
        return _within(a, b, "ulp", metrics, f"every element within {ulps:g} ULP")
    # stat
    metrics = measure(a, b, tolerance="none")
    problems = []
    if metrics.nan_a or metrics.nan_b or metrics.inf_a != metrics.inf_b:
        problems.append(f"{metrics.nan_a + metrics.nan_b} NaN and {metrics.inf_a + metrics.inf_b} Inf values")
    limits = {
        "rel_l2": rule.rel_l2 if rule.has_thresholds else _band(a, b),
        "sqnr_db": rule.sqnr_db,
        "cosine": rule.cosine,
        "max_abs": rule.max_abs,
    }
    if limits["rel_l2"] is not None and not metrics.rel_l2 <= limits["rel_l2"]:
        problems.append(f"rel-L2 {_fmt(metrics.rel_l2)} > {limits['rel_l2']:g}")
    if limits["sqnr_db"] is not None and not metrics.sqnr_db >= limits["sqnr_db"]:
        problems.append(f"SQNR {_fmt(metrics.sqnr_db)} dB < {limits['sqnr_db']:g}")
    if limits["cosine"] is not None and not metrics.cosine >= limits["cosine"]:
        problems.append(f"cosine {_fmt(metrics.cosine)} < {limits['cosine']:g}")
    if limits["max_abs"] is not None and not metrics.max_abs <= limits["max_abs"]:
        problems.append(f"max-abs {_fmt(metrics.max_abs)} > {limits['max_abs']:g}")
    if problems:
        return Verdict(FAILED, "stat", "; ".join(problems), metrics)
    if metrics.max_abs == 0:
        return Verdict(EQUAL, "stat", "values equal", metrics)
    return _within(a, b, "stat", metrics, f"rel-L2 {_fmt(metrics.rel_l2)}, SQNR {_fmt(metrics.sqnr_db)} dB")


def _within(a: Operand, b: Operand, tier: str, metrics: Metrics, message: str) -> Verdict:
    quantized = a.quantized is not None or b.quantized is not None
    return Verdict(WITHIN, tier, message, metrics, klass=WITHIN_QUANT if quantized else WITHIN_TOLERANCE)


def _dtype_mismatch(a: Operand, b: Operand, tier: str) -> Verdict:
    return Verdict(
        FAILED,
        tier,
        f"dtype {b.label} cannot be compared exactly with the reference's {a.label}",
        klass=DTYPE_MISMATCH,
        evidence={"dtype_a": a.label, "dtype_b": b.label},
    )


def _compare_parts(a: Operand, b: Operand) -> Verdict | None:
    """Same quantization layout: every stored part bit-for-bit. None when they differ (caller goes on)."""
    assert isinstance(a, QuantOperand) and isinstance(b, QuantOperand)
    for role in sorted(a.qt.parts):
        if not _words_equal(a.store.get_words(a.qt.parts[role]), b.store.get_words(b.qt.parts[role])):
            return None
    for role, stored in a.qt.parts.items():
        if _stored_nan(a.store, stored):
            return Verdict(
                FAILED,
                "exact",
                f"stored parts are identical but {role} holds NaN (NaN never equals anything)",
                klass=NAN_INF,
                evidence={"side": "both", "part": role},
            )
    return Verdict(EQUAL, "exact", "stored quantized parts are bit-identical")


def _compare_exact(a: Operand, b: Operand) -> Verdict:
    if not (a.quantized or b.quantized) and not lossless(a.value_dtype, b.value_dtype):
        return _dtype_mismatch(a, b, "exact")
    if isinstance(a, PlainOperand) and isinstance(b, PlainOperand) and a.value_dtype == b.value_dtype:
        if _words_equal(a.words(), b.words()):
            if a.value_dtype in FLOAT_FORMATS:
                found = value_range(a.view())
                if found is not None and found.has_nan:
                    return Verdict(
                        FAILED,
                        "exact",
                        "bytes are identical but the tensor holds NaN (NaN never equals anything)",
                        klass=NAN_INF,
                        evidence={"side": "both"},
                    )
            return Verdict(EQUAL, "exact", "bit-identical")
        metrics = measure(a, b, tolerance="exact")
        if metrics.exceed == 0:
            return Verdict(
                WITHIN,
                "exact",
                "values equal but bytes differ (signed zeros)",
                metrics,
                klass=WITHIN_TOLERANCE,
            )
        return Verdict(FAILED, "exact", f"{metrics.exceed} of {a.numel} elements differ", metrics)
    metrics = measure(a, b, tolerance="exact")
    if metrics.exceed == 0:
        return Verdict(EQUAL, "exact", "values equal after a lossless widening", metrics)
    return Verdict(FAILED, "exact", f"{metrics.exceed} of {a.numel} elements differ", metrics)


def _fmt(value: float) -> str:
    return f"{value:.4g}"
