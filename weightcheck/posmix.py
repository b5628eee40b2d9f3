"""The posmix128 digest's constants and shared arithmetic (defined in weightcheck.devdigest's docstring): the
lane sums in torch, the finalizer, the byte view. Both the eager kernels (weightcheck.devdigest) and the fused
Triton kernel (weightcheck.fuseddigest) build on these; devdigest dispatches to the fused kernel, so the shared
part lives here, below both, rather than in devdigest."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MASK64 = (1 << 64) - 1
G = 0x9E3779B97F4A7C15
S = 0x632BE59BD9B4E019
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 torch stores."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def fmix_int(z: int) -> int:
    z &= MASK64
    z ^= z >> 29
    z = (z * M2) & MASK64
    z ^= z >> 32
    return z


def finalize(a: int, b: int, n_bytes: int) -> str:
    """The hex digest from the two lane sums (Python ints, any sign) and the byte length."""
    a_final = fmix_int((a & MASK64) ^ (n_bytes & MASK64))
    b_final = fmix_int((b & MASK64) ^ a_final)
    return f"{a_final:016x}{b_final:016x}"


# ---- torch (any device) ------------------------------------------------------------------------------------


def _lsr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic on signed integers)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _lanes_torch(words: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum x_i, sum x_i * (k_i | 1)) of int64 words holding uint32 values, positions start.. (device scalars)."""
    import torch

    index = torch.arange(start, start + words.numel(), dtype=torch.int64, device=words.device)
    k = index.mul_(_signed(G)).add_(_signed(S))
    k ^= _lsr(k, 31)
    x = (words ^ k).mul_(_signed(M1))
    x ^= _lsr(x, 29)
    x.mul_(_signed(M2))
    x ^= _lsr(x, 32)
    a = x.sum()
    b = x.mul_(k.bitwise_or_(1)).sum()
    return a, b


@functools.cache
def torch_module() -> Any:
    """torch, imported on first use and bound once: the digest's per-tensor paths (the tap's device batch, the
    fused kernel's launch) call it for every tensor, where a function-level `import torch` costs a lookup each time."""
    import torch

    return torch


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor on its device (copies only to make it contiguous)."""
    uint8 = torch_module().uint8
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype is uint8:
        return flat
    return flat.view(uint8)
