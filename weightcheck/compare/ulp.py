"""ULPs (units in the last place) of stored float formats, the unit of the per-element tolerance tier.

Two faithful roundings of one value differ by at most one ULP of each format, so `|a - b| <= ulp(a) +
ulp(b)` holds for any two correct quantizations or casts of the same weight while a single wrong element
still fails (a mean threshold would let it hide in a large tensor: radixark/miles#812).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# safetensors dtype → (eps = 2^-mantissa_bits, smallest normal). Integers are exact: no entry.
FLOAT_FORMATS: dict[str, tuple[float, float]] = {
    "F64": (2.0**-52, 2.0**-1022),
    "F32": (2.0**-23, 2.0**-126),
    "F16": (2.0**-10, 2.0**-14),
    "BF16": (2.0**-7, 2.0**-126),
    "F8_E4M3": (2.0**-3, 2.0**-6),
    "F8_E5M2": (2.0**-2, 2.0**-14),
    "F8_E4M3FNUZ": (2.0**-3, 2.0**-7),
    "F8_E5M2FNUZ": (2.0**-2, 2.0**-15),
}


def float_ulp(values: torch.Tensor, *, eps: float, smallest_normal: float) -> torch.Tensor:
    """ULP of each value: 2^floor(log2|x|) * eps, zeros and subnormals clamped to the smallest normal
    (their spacing is the subnormal step). NaN and Inf give NaN, so a comparison against them fails.
    Computed in float32 (float64 for float64 input)."""
    import torch

    work = torch.float64 if values.dtype == torch.float64 else torch.float32
    magnitude = values.to(work).abs().clamp_min(smallest_normal)
    _, exponent = torch.frexp(magnitude)
    ulp = torch.ldexp(torch.full_like(magnitude, eps), exponent - 1)
    return torch.where(torch.isfinite(magnitude), ulp, torch.full_like(ulp, float("nan")))


def dtype_ulp(values: torch.Tensor, dtype: str) -> torch.Tensor | None:
    """ULP of each value stored as `dtype` (a safetensors name); None for exact (integer) dtypes."""
    fmt = FLOAT_FORMATS.get(dtype)
    if fmt is None:
        return None
    return float_ulp(values, eps=fmt[0], smallest_normal=fmt[1])
