"""Digest and cheap statistics of one incoming tensor: what the tap records per (name, tensor).

The digest is `weightcheck.digest.digest_tensor` (sha256 of the bytes as safetensors would store them), so
a tensor sent by the trainer and the same tensor read from a checkpoint or a trainer manifest agree bit
for bit. The statistics (all values zero, count of NaN/Inf) are taken a slice at a time so that a large
tensor never needs a second full-size temporary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Statistics are reduced over slices of this many elements (bounded temporaries on huge embeddings).
_STATS_SLICE_ELEMENTS = 16 * 1024 * 1024


def tensor_stats(tensor: torch.Tensor) -> tuple[bool | None, int | None]:
    """`(all values zero, number of NaN/Inf values)`; None where the dtype does not support the question."""
    import torch

    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return None, 0
    zeros: bool | None = True
    nonfinite: int | None = 0 if flat.is_floating_point() or flat.is_complex() else None
    for start in range(0, flat.numel(), _STATS_SLICE_ELEMENTS):
        piece = flat[start : start + _STATS_SLICE_ELEMENTS]
        try:
            if zeros and bool(piece.any()):
                zeros = False
        except (RuntimeError, TypeError):  # float8 and friends lack some reductions on some devices
            zeros = None
        if nonfinite is not None:
            try:
                finite = torch.isfinite(piece)
                if not bool(finite.all()):
                    nonfinite += int(finite.numel() - int(finite.sum()))
            except (RuntimeError, TypeError):
                nonfinite = None
    return zeros, nonfinite


def describe_tensor(tensor: torch.Tensor) -> dict[str, Any]:
    """dtype (safetensors name), shape, sha256, zeros, nonfinite; `error` when the tensor cannot be digested."""
    from weightcheck.digest import digest_tensor
    from weightcheck.tensors import safetensors_dtype

    out: dict[str, Any] = {}
    try:
        digest = digest_tensor(tensor)
        out["dtype"], out["shape"], out["sha256"] = digest.dtype, list(digest.shape), digest.sha256
    except (TypeError, RuntimeError, ValueError) as exc:
        out["dtype"] = safetensors_dtype(tensor.dtype) or str(tensor.dtype)
        out["shape"] = list(tensor.shape)
        out["sha256"] = None
        out["error"] = f"cannot digest: {exc}"[:300]
    try:
        out["zeros"], out["nonfinite"] = tensor_stats(tensor)
    except (TypeError, RuntimeError, ValueError):
        out["zeros"], out["nonfinite"] = None, None
    return out
