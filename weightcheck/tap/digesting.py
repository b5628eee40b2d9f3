"""Digest and cheap statistics of one incoming tensor: what the tap records per (name, tensor).

The digest is `weightcheck.digest.digest_tensor` (the tap's algorithm, xxh3_128 by default, over the bytes
as safetensors would store them), so a tensor sent by the trainer and the same tensor read from a checkpoint
or a trainer manifest agree bit for bit. The statistics (all bytes zero, count of NaN/Inf) are cheap: the
zero test reads the bytes once at memory speed and NaN/Inf presence comes from one min/max pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _all_bytes_zero(tensor: torch.Tensor) -> bool:
    """True when every byte is zero (numpy's `any` on a zero-copy byte view runs at memory speed on CPU)."""
    import torch

    flat = tensor.detach().reshape(-1)
    if flat.device.type == "cpu" and flat.is_contiguous():
        try:
            return not bool(flat.view(torch.uint8).numpy().any())
        except (RuntimeError, TypeError):
            pass
    return not bool(flat.contiguous().view(torch.uint8).any())


def _nonfinite_count(tensor: torch.Tensor) -> int | None:
    """NaN/Inf values; 0 for integers. Presence is read off min/max (NaN propagates, ±Inf shows at the
    extremes: one fast pass); only a tensor that has some pays for the exact count."""
    import torch

    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    flat = tensor.detach().reshape(-1)
    try:
        low, high = torch.aminmax(flat) if not flat.is_complex() else (flat.abs().min(), flat.abs().max())
        if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
            return 0
        return int(flat.numel() - int(torch.isfinite(flat).sum()))
    except (RuntimeError, TypeError):  # float8 and friends lack reductions on some devices
        return None


def tensor_stats(tensor: torch.Tensor) -> tuple[bool | None, int | None]:
    """`(all bytes zero, number of NaN/Inf values)`; None where the dtype does not support the question.

    "All zero" is judged on the bytes: `-0.0` is not zero here (the same convention as the digest).

    One min/max pass answers both questions for real dtypes: all bytes zero implies min == max == 0, so the
    byte test runs only on tensors whose values are all ±0 (a second full pass on every tensor cost as much
    as the digest itself)."""
    import torch

    if tensor.numel() == 0:
        return None, 0
    flat = tensor.detach().reshape(-1)
    if not flat.is_complex() and flat.dtype != torch.bool:
        try:
            low, high = torch.aminmax(flat)
        except (RuntimeError, TypeError):  # float8 and friends lack reductions on some devices
            low = high = None
        if low is not None and high is not None:
            nonfinite = 0
            if flat.is_floating_point() and not (bool(torch.isfinite(low)) and bool(torch.isfinite(high))):
                nonfinite = int(flat.numel() - int(torch.isfinite(flat).sum()))
            zeros = nonfinite == 0 and bool(low == 0) and bool(high == 0) and _all_bytes_zero(flat)
            return zeros, nonfinite
    return _all_bytes_zero(tensor), _nonfinite_count(tensor)


def describe_tensor(tensor: torch.Tensor, algorithm: str = "sha256") -> dict[str, Any]:
    """dtype (safetensors name), shape, the hex digest under the algorithm's name (`"xxh3_128": ...`), zeros,
    nonfinite; `error` when the tensor cannot be digested."""
    from weightcheck.digest import digest_tensor
    from weightcheck.tensors import safetensors_dtype

    out: dict[str, Any] = {}
    try:
        digest = digest_tensor(tensor, algorithm)
        out["dtype"], out["shape"], out[algorithm] = digest.dtype, list(digest.shape), digest.hexdigest
    except (TypeError, RuntimeError, ValueError) as exc:
        out["dtype"] = safetensors_dtype(tensor.dtype) or str(tensor.dtype)
        out["shape"] = list(tensor.shape)
        out[algorithm] = None
        out["error"] = f"cannot digest: {exc}"[:300]
    try:
        out["zeros"], out["nonfinite"] = tensor_stats(tensor)
    except (TypeError, RuntimeError, ValueError):
        out["zeros"], out["nonfinite"] = None, None
    return out
