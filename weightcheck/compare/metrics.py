"""Streaming comparison metrics: accumulated chunk by chunk, so a tensor is never held twice in float32.

`Metrics` keeps float64 running sums from which the reported statistics derive (relative L2, SQNR, cosine,
the best-fit scale factor), the max-abs difference with its coordinate, NaN/Inf counts per side, and for a
tolerance tier the number of elements outside tolerance, the first of them and which rows/columns hold
them (the evidence for "partially written").

Also here: `value_range`, a one-pass min/max of any stored tensor (NaN propagates, so it doubles as a NaN
check; ±Inf shows in the extremes), used by the content checks and the exact tier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Elements per chunk: ~16 MB per float32 temporary, a handful of temporaries at a time.
CHUNK_ELEMENTS = 4 * 1024 * 1024


@dataclass
class ValueRange:
    minimum: float
    maximum: float
    has_nan: bool
    has_inf: bool

    @property
    def all_zero(self) -> bool:
        return not self.has_nan and self.minimum == 0.0 and self.maximum == 0.0

    @property
    def constant(self) -> bool:
        return not self.has_nan and self.minimum == self.maximum


def value_range(tensor: torch.Tensor) -> ValueRange | None:
    """Min and max of a tensor in one pass (None for an empty tensor).

    `torch.aminmax` propagates NaN, so a NaN anywhere shows as a NaN extreme; only then is the tensor
    scanned again to tell NaN from Inf. FP8 and other dtypes without CPU reductions are widened a chunk
    at a time (exact: every FP8 value is a bf16 value).
    """
    import torch

    if tensor.numel() == 0:
        return None
    flat = tensor.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    direct = flat.dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
    )
    lows: list[float] = []
    highs: list[float] = []
    step = flat.numel() if direct else CHUNK_ELEMENTS
    for start in range(0, flat.numel(), step):
        piece = flat[start : start + step]
        if not direct:
            piece = piece.to(torch.float32) if piece.dtype.is_floating_point else piece.to(torch.int64)
        low, high = torch.aminmax(piece)
        lows.append(float(low))
        highs.append(float(high))
    minimum, maximum = min(lows), max(highs)
    if any(math.isnan(v) for v in (*lows, *highs)):
        # Only a float tensor can hold NaN; find out whether it also holds ±Inf (a second, rare pass).
        has_nan, has_inf = True, False
        for start in range(0, flat.numel(), CHUNK_ELEMENTS):
            if bool(torch.isinf(flat[start : start + CHUNK_ELEMENTS].to(torch.float32)).any()):
                has_inf = True
                break
        minimum = maximum = float("nan")
    else:
        has_nan = False
        has_inf = math.isinf(minimum) or math.isinf(maximum)
    return ValueRange(minimum, maximum, has_nan, has_inf)


@dataclass
class Metrics:
    """Running comparison statistics of a (reference A, candidate B) pair."""

    count: int = 0
    sum_a2: float = 0.0
    sum_b2: float = 0.0
    sum_d2: float = 0.0
    sum_ab: float = 0.0
    sum_b: float = 0.0
    min_a: float = math.inf
    max_a: float = -math.inf
    min_b: float = math.inf
    max_b: float = -math.inf
    max_abs: float = 0.0
    max_abs_index: int = -1
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    # Tolerance tiers: elements outside tolerance ("exceed"), the first one, the worst |d|/tol.
    exceed: int = 0
    first_exceed: int = -1
    worst_ratio: float = 0.0
    tolerance_used: bool = False
    rows: int = 0
    cols: int = 0
    row_fail: torch.Tensor | None = field(default=None, repr=False)
    col_fail: torch.Tensor | None = field(default=None, repr=False)

    # ---- derived -------------------------------------------------------------------------------
    @property
    def finite_count(self) -> int:
        return self.count

    @property
    def rel_l2(self) -> float:
        if self.sum_a2 == 0:
            return 0.0 if self.sum_d2 == 0 else math.inf
        return math.sqrt(self.sum_d2 / self.sum_a2)

    @property
    def sqnr_db(self) -> float:
        if self.sum_d2 == 0:
            return math.inf
        if self.sum_a2 == 0:
            return -math.inf
        return 10.0 * math.log10(self.sum_a2 / self.sum_d2)

    @property
    def cosine(self) -> float:
        if self.sum_a2 == 0 or self.sum_b2 == 0:
            return math.nan
        return self.sum_ab / math.sqrt(self.sum_a2 * self.sum_b2)

    @property
    def scale_factor(self) -> float:
        """c minimising ‖b − c·a‖ (least squares)."""
        return self.sum_ab / self.sum_a2 if self.sum_a2 else math.nan

    @property
    def scale_residual(self) -> float:
        """‖b − c·a‖ / ‖b‖ for the best c: near 0 means b is a scaled copy of a."""
        if self.sum_b2 == 0 or self.sum_a2 == 0:
            return math.nan
        return math.sqrt(max(0.0, self.sum_b2 - self.sum_ab**2 / self.sum_a2) / self.sum_b2)

    @property
    def mean_b(self) -> float:
        return self.sum_b / self.count if self.count else math.nan

    @property
    def std_b(self) -> float:
        if not self.count:
            return math.nan
        return math.sqrt(max(0.0, self.sum_b2 / self.count - self.mean_b**2))

    def index(self, flat: int, shape: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        for dim in reversed(shape or (1,)):
            out.append(flat % dim if dim else 0)
            flat //= dim if dim else 1
        return list(reversed(out))

    def as_dict(self, shape: tuple[int, ...]) -> dict[str, Any]:
        """JSON-friendly summary (non-finite floats as strings)."""

        def num(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)

        out: dict[str, Any] = {
            "elements": self.count,
            "rel_l2": num(round(self.rel_l2, 6) if math.isfinite(self.rel_l2) else self.rel_l2),
            "sqnr_db": num(round(self.sqnr_db, 2) if math.isfinite(self.sqnr_db) else self.sqnr_db),
            "cosine": num(round(self.cosine, 6) if math.isfinite(self.cosine) else self.cosine),
            "max_abs": num(self.max_abs),
        }
        if self.max_abs_index >= 0:
            out["max_abs_at"] = self.index(self.max_abs_index, shape)
        if self.nan_a or self.nan_b or self.inf_a or self.inf_b:
            out.update(nan_a=self.nan_a, nan_b=self.nan_b, inf_a=self.inf_a, inf_b=self.inf_b)
        if self.tolerance_used:
            out["outside_tolerance"] = self.exceed
            if self.first_exceed >= 0:
                out["first_outside_at"] = self.index(self.first_exceed, shape)
                out["worst_in_tolerances"] = num(round(self.worst_ratio, 3))
        return out

    # ---- accumulation --------------------------------------------------------------------------
    def add(self, a: torch.Tensor, b: torch.Tensor, r0: int, tol: torch.Tensor | None, *, exact: bool = False) -> None:
        """Add a chunk: rows r0.. of the [rows, cols] views, as float tensors of equal shape.

        `tol`: per-element tolerance (ULP tier); `exact`: tolerance zero (value equality). NaN is
        outside every tolerance; identical values (including ±Inf) are inside.
        """
        import torch

        cols = a.shape[1] if a.dim() == 2 else 1
        self.cols = cols
        offset = r0 * cols
        d = a - b
        d2 = d * d
        sums = torch.stack([(a * a).sum(), (b * b).sum(), d2.sum(), (a * b).sum(), b.sum()]).to(torch.float64)
        if not bool(torch.isfinite(sums).all()):
            finite = torch.isfinite(a) & torch.isfinite(b)
            self.nan_a += int(torch.isnan(a).sum())
            self.nan_b += int(torch.isnan(b).sum())
            self.inf_a += int(torch.isinf(a).sum())
            self.inf_b += int(torch.isinf(b).sum())
            zero = torch.zeros((), dtype=a.dtype)
            af, bf = torch.where(finite, a, zero), torch.where(finite, b, zero)
            df = af - bf
            sums = torch.stack([(af * af).sum(), (bf * bf).sum(), (df * df).sum(), (af * bf).sum(), bf.sum()]).to(
                torch.float64
            )
            abs_d = torch.where(finite, d.abs(), zero)
            self.count += int(finite.sum())
            a_rng, b_rng = (af, finite), (bf, finite)
        else:
            abs_d = d.abs()
            self.count += a.numel()
            a_rng, b_rng = (a, None), (b, None)
        s = sums.tolist()
        self.sum_a2 += s[0]
        self.sum_b2 += s[1]
        self.sum_d2 += s[2]
        self.sum_ab += s[3]
        self.sum_b += s[4]
        for (values, mask), side in ((a_rng, "a"), (b_rng, "b")):
            if mask is not None:
                if not bool(mask.any()):
                    continue
                values = values[mask]
            low, high = torch.aminmax(values)
            setattr(self, f"min_{side}", min(getattr(self, f"min_{side}"), float(low)))
            setattr(self, f"max_{side}", max(getattr(self, f"max_{side}"), float(high)))
        if abs_d.numel():
            where = int(torch.argmax(abs_d))
            worst = float(abs_d.reshape(-1)[where])
            if worst > self.max_abs or self.max_abs_index < 0:
                self.max_abs, self.max_abs_index = worst, offset + where
        if tol is None and not exact:
            return
        self.tolerance_used = True
        limit = tol if tol is not None else torch.zeros((), dtype=a.dtype)
        inside = (d.abs() <= limit) | (a == b)
        outside = ~inside
        n_out = int(outside.sum())
        if not n_out:
            return
        self.exceed += n_out
        flat = outside.reshape(-1)
        if self.first_exceed < 0:
            self.first_exceed = offset + int(torch.argmax(flat.to(torch.uint8)))
        if tol is not None:
            ratio = (d.abs() / tol)[outside]
            ratio = ratio[torch.isfinite(ratio)]
            if ratio.numel():
                self.worst_ratio = max(self.worst_ratio, float(ratio.max()))
            else:
                self.worst_ratio = math.inf
        else:
            self.worst_ratio = math.inf
        grid = outside.reshape(-1, cols)
        if self.row_fail is None:
            self.row_fail = torch.zeros(self.rows, dtype=torch.bool)
            self.col_fail = torch.zeros(cols, dtype=torch.int64)
        self.row_fail[r0 : r0 + grid.shape[0]] |= grid.any(dim=1)
        assert self.col_fail is not None
        self.col_fail += grid.sum(dim=0)
