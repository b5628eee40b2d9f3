"""`posmix128`: a position-sensitive 128-bit digest computed where the tensor lives (CPU or GPU), with integer
arithmetic only, bit-identical on every device and on raw bytes read from disk.

Why: the xxh3/sha256 digests need the bytes on the host, so a GPU tensor costs a device-to-host copy of every
byte the sync moves. `posmix128` runs as ordinary torch integer kernels on the tensor's own device and only
two 64-bit scalars come back. Every operation it uses has exact integer semantics in torch on both CPU and
CUDA (int64 add and multiply wrap modulo 2^64 in two's complement; xor, and, shifts are exact; an integer
sum is associative, so the reduction order of a device does not matter). A checkpoint on disk is digested by
the same function over its stored bytes (`PosmixHasher`, numpy uint64), so a trainer, an engine and a
checkpoint agree. It is not cryptographic: it detects corruption and mix-ups, not a forger. Files keep xxh3 or
sha256.

Definition (all arithmetic modulo 2^64, `>>>` a logical shift). The tensor's bytes as safetensors stores them
(C order, little-endian) are padded with zero bytes to a multiple of 4 and read as little-endian uint32
words `w_i`, i = 0 .. W-1::

    k_i = splitmix(i * G + S)                      # a per-position key
    x_i = fmix((w_i xor k_i) * M1)                 # the word, keyed by its position
    A = sum_i x_i ;  B = sum_i x_i * (k_i | 1)
    A' = fmix(A xor n_bytes) ;  B' = fmix(B xor A')
    hexdigest = "%016x%016x" % (A', B')

with `splitmix(z) = z xor (z >>> 31)` and `fmix(z)`: `z ^= z >>> 29; z *= M2; z ^= z >>> 32`. Because every
word is keyed by its absolute position before the (commutative) sums, permuting words changes the digest: a
transpose, swapped TP shards, rows moved between experts. `n_bytes` tells trailing zero bytes from padding.
dtype and shape are kept next to the digest (`TensorDigest`), as for the other algorithms.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from weightcheck.posmix import M1, M2, G, S, _byte_view, _lanes_torch, finalize

if TYPE_CHECKING:
    import torch

POSMIX128 = "posmix128"
# Words per kernel batch: bounds the int64 temporaries (8 bytes per 4-byte word, a few of them live at once).
CPU_CHUNK_WORDS = 1 << 21
DEVICE_CHUNK_WORDS = 1 << 24


def posmix128_tensor(tensor: torch.Tensor, chunk_words: int | None = None) -> str:
    """`posmix128` of a torch tensor's stored bytes, computed on the tensor's device (no host copy: two
    int64 scalars come back). Equal to `posmix128_bytes` of the same bytes, on every device."""
    import sys

    if sys.byteorder != "little":  # the word reading below assumes the host's little-endian layout
        raise TypeError("posmix128 on a big-endian host is not supported")
    if tensor.device.type == "cuda" and chunk_words is None:
        fused = _fused_digest(tensor)
        if fused is not None:
            return fused
    data = _byte_view(tensor)
    a, b = eager_lanes(data, chunk_words).tolist()
    return finalize(int(a), int(b), data.numel())


def fused_usable(device_type: str) -> bool:
    """The fused kernels can run on this device: CUDA (or any device under Triton's interpreter, as the tests
    run them), Triton importable, not turned off, and not failed before in this process."""
    if _fused_failed or not (device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    from weightcheck.fuseddigest import fused_enabled, triton_available

    return fused_enabled() and triton_available()


def device_lanes(data: torch.Tensor) -> torch.Tensor:
    """posmix128's two lane sums over the flat uint8 tensor `data` as an int64[2] tensor on its device, by the
    fused kernel on CUDA where it is available (else the eager kernels); nothing waits for the device."""
    if data.device.type == "cuda" and fused_usable("cuda"):
        from weightcheck.fuseddigest import fused_lanes

        try:
            return fused_lanes(data)
        except Exception as exc:
            fused_failed(exc)
    return eager_lanes(data)


def eager_lanes(data: torch.Tensor, chunk_words: int | None = None) -> torch.Tensor:
    """`device_lanes` by the eager torch kernels (any device)."""
    import torch

    n_bytes = data.numel()
    n_full = n_bytes // 4
    if chunk_words is None:
        chunk_words = CPU_CHUNK_WORDS if data.device.type == "cpu" else DEVICE_CHUNK_WORDS
    a = torch.zeros((), dtype=torch.int64, device=data.device)
    b = torch.zeros((), dtype=torch.int64, device=data.device)
    if n_full:
        # A uint8 view of a contiguous tensor starts at its storage offset: int32 needs 4-byte alignment.
        aligned = data.data_ptr() % 4 == 0
        body = data[: n_full * 4]
        words32 = body.view(torch.int32) if aligned else body.clone().view(torch.int32)
        for start in range(0, n_full, chunk_words):
            words = words32[start : start + chunk_words].to(torch.int64) & 0xFFFFFFFF
            da, db = _lanes_torch(words, start)
            a += da
            b += db
    tail = n_bytes - n_full * 4
    if tail:
        weights = torch.tensor([1, 1 << 8, 1 << 16, 1 << 24][:tail], dtype=torch.int64, device=data.device)
        word = (data[n_full * 4 :].to(torch.int64) * weights).sum().reshape(1)
        da, db = _lanes_torch(word, n_full)
        a += da
        b += db
    return torch.stack([a, b])


_fused_failed = False


def _fused_digest(tensor: torch.Tensor) -> str | None:
    """The one-kernel Triton digest (`weightcheck.fuseddigest`) when Triton is there and not turned off; None
    to use the eager kernels (also after the fused kernel failed once: logged, never raised)."""
    if not fused_usable("cuda"):
        return None
    from weightcheck.fuseddigest import posmix128_fused

    try:
        return posmix128_fused(tensor)
    except Exception as exc:  # a Triton that cannot compile here: the eager kernels give the same digest
        fused_failed(exc)
        return None


def fused_failed(exc: Exception) -> None:
    """A fused kernel raised: logged once, and the eager kernels used from now on."""
    global _fused_failed
    import logging

    _fused_failed = True
    logging.getLogger("weightcheck.digest").warning("fused posmix128 kernel unavailable (%s); using torch kernels", exc)


# ---- numpy (host bytes: checkpoints on disk) -------------------------------------------------------------


def _lanes_numpy(words: Any, start: int) -> tuple[int, int]:
    import numpy as np

    u = np.uint64
    with np.errstate(over="ignore"):
        k = np.arange(start, start + words.size, dtype=np.uint64)
        k *= u(G)
        k += u(S)
        k ^= k >> u(31)
        x = words ^ k
        x *= u(M1)
        x ^= x >> u(29)
        x *= u(M2)
        x ^= x >> u(32)
        a = int(x.sum(dtype=np.uint64))
        x *= k | u(1)
        b = int(x.sum(dtype=np.uint64))
    return a, b


class PosmixHasher:
    """hashlib-style streaming `posmix128` over stored bytes (`update(bytes)`, `hexdigest()`): what a
    checkpoint on disk digests to. Bytes may arrive in pieces of any length."""

    name = POSMIX128

    def __init__(self) -> None:
        self._a = 0
        self._b = 0
        self._words = 0
        self._carry = b""
        self._bytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        import numpy as np

        view = memoryview(data).cast("B")
        self._bytes += len(view)
        if self._carry:
            need = 4 - len(self._carry)
            self._carry += bytes(view[:need])
            view = view[need:]
            if len(self._carry) < 4:
                return
            self._add(np.frombuffer(self._carry, dtype="<u4"))
            self._carry = b""
        n_full = len(view) // 4
        for start in range(0, n_full, CPU_CHUNK_WORDS):
            stop = min(n_full, start + CPU_CHUNK_WORDS)
            self._add(np.frombuffer(view[start * 4 : stop * 4], dtype="<u4"))
        self._carry = bytes(view[n_full * 4 :])

    def _add(self, words32: Any) -> None:
        import numpy as np

        a, b = _lanes_numpy(words32.astype(np.uint64), self._words)
        self._a += a
        self._b += b
        self._words += words32.size

    def hexdigest(self) -> str:
        import numpy as np

        a, b = self._a, self._b
        if self._carry:
            word = np.frombuffer(self._carry + b"\0" * (4 - len(self._carry)), dtype="<u4").astype(np.uint64)
            da, db = _lanes_numpy(word, self._words)
            a, b = a + da, b + db
        return finalize(a, b, self._bytes)


def posmix128_bytes(data: bytes | bytearray | memoryview) -> str:
    hasher = PosmixHasher()
    hasher.update(data)
    return hasher.hexdigest()
