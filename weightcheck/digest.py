"""Per-tensor digests and the weightcheck manifest.

A digest is `(dtype, shape, sha256)` where sha256 covers the tensor's bytes exactly as safetensors stores
them: C order, little-endian, no header. Hashing bytes rather than values is deliberate: `-0.0` and
`0.0` differ, identical NaN payloads agree, and a packed int32 word is compared bit for bit (a float
comparison would lose its low bits). dtype and shape are part of the digest because equal bytes can be
a different tensor (a transposed or reinterpreted one).

Public API (kept small; the live-sync verifier reuses it):

- `TensorDigest(dtype, shape, sha256)`: one tensor; `dtype` is the safetensors name (`"BF16"`).
- `digest_tensor(tensor)`: digest of an in-memory torch tensor, equal to `digest_stored` of the same
  tensor after `safetensors.torch.save_file` (any device, any strides).
- `digest_bytes(data, dtype, shape)`: digest of raw stored bytes (what `digest_stored` uses).
- `digest_stored(store, name)`: digest of one tensor of a `weightcheck.tensors.TensorStore`.
- `write_manifest(path, digests)` / `read_manifest(path)`: the JSON manifest
  `{"schema_version": "1.0", "kind": "weightcheck-manifest", "tensors": {name: {"dtype", "shape", "sha256"}}}`;
  `read_manifest` raises `ManifestError` (with a readable message) on anything malformed.
- `compare_digests(expected, actual)`: which names are missing, extra, or changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightcheck.safetensors_header import DTYPE_BITS

if TYPE_CHECKING:
    import torch

    from weightcheck.tensors import TensorStore

MANIFEST_KIND = "weightcheck-manifest"
MANIFEST_SCHEMA_VERSION = "1.0"
# Large tensors are hashed in slices so that a device tensor is copied to host a slice at a time.
_HASH_SLICE_BYTES = 64 * 1024 * 1024


class ManifestError(ValueError):
    """A manifest that cannot be read or written; the message says why."""


@dataclass(frozen=True)
class TensorDigest:
    dtype: str
    shape: tuple[int, ...]
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "sha256": self.sha256}

    def difference(self, other: TensorDigest) -> str | None:
        """What differs from `other` ("dtype BF16 → F16", "bytes"...), or None when equal."""
        if self.dtype != other.dtype:
            return f"dtype {self.dtype} → {other.dtype}"
        if self.shape != other.shape:
            return f"shape {list(self.shape)} → {list(other.shape)}"
        if self.sha256 != other.sha256:
            return "bytes differ (sha256)"
        return None


def digest_bytes(data: bytes | bytearray | memoryview, dtype: str, shape: tuple[int, ...] | list[int]) -> TensorDigest:
    """Digest of a tensor given its stored bytes (for example a `TensorStore.raw` view)."""
    hasher = hashlib.sha256()
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _HASH_SLICE_BYTES):
        hasher.update(view[start : start + _HASH_SLICE_BYTES])
    return TensorDigest(dtype=dtype, shape=tuple(int(d) for d in shape), sha256=hasher.hexdigest())


def digest_stored(store: TensorStore, name: str) -> TensorDigest:
    """Digest of one tensor of a checkpoint, read through its memory mapping (raises TensorReadError)."""
    info = store.info(name)
    return digest_bytes(store.raw(name), info.dtype, info.shape)


def digest_tensor(tensor: torch.Tensor) -> TensorDigest:
    """Digest of a torch tensor, equal to the digest of the same tensor saved with safetensors.

    Works for any device and strides (the tensor is made contiguous and copied to host a slice at a
    time). `torch.float4_e2m1fn_x2` is digested as safetensors stores it: dtype F4, last dim doubled.
    Raises TypeError for dtypes safetensors cannot store and for non-strided (sparse...) tensors.
    """
    import torch

    from weightcheck.tensors import safetensors_dtype

    if tensor.layout != torch.strided:
        raise TypeError(f"cannot digest a {tensor.layout} tensor; safetensors stores dense tensors only")
    dtype = safetensors_dtype(tensor.dtype)
    shape = tuple(tensor.shape)
    if tensor.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        dtype = "F4"
        shape = (*shape[:-1], shape[-1] * 2) if shape else shape
    if dtype is None or dtype not in DTYPE_BITS:
        raise TypeError(f"cannot digest a {tensor.dtype} tensor: safetensors has no such dtype")
    flat = tensor.detach().contiguous().reshape(-1)
    hasher = hashlib.sha256()
    itemsize = flat.element_size()
    step = max(1, _HASH_SLICE_BYTES // max(itemsize, 1))
    for start in range(0, flat.numel(), step):
        piece = flat[start : start + step].cpu()
        raw = piece.view(torch.uint8) if itemsize > 0 else piece
        data = raw.numpy()
        if sys.byteorder == "big" and itemsize > 1:  # safetensors stores little-endian
            data = data.view(f">u{itemsize}").byteswap().view("u1")
        hasher.update(memoryview(data))
    return TensorDigest(dtype=dtype, shape=shape, sha256=hasher.hexdigest())


# ---- manifest ------------------------------------------------------------------------------------
def manifest_document(digests: Mapping[str, TensorDigest]) -> dict[str, Any]:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "tensors": {name: digests[name].as_dict() for name in sorted(digests)},
    }


def write_manifest(path: str | os.PathLike[str], digests: Mapping[str, TensorDigest]) -> None:
    """Write the manifest atomically (a reader never sees half a file). Raises ManifestError."""
    target = os.fspath(path)
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(manifest_document(digests), fh, indent=1, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ManifestError(f"cannot write manifest {target}: {exc.strerror or exc}") from None


def _parse_entry(name: str, entry: Any) -> TensorDigest:
    if not isinstance(entry, dict):
        raise ManifestError(f"tensor {name!r}: entry must be an object")
    dtype, shape, sha = entry.get("dtype"), entry.get("shape"), entry.get("sha256")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ManifestError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ManifestError(f"tensor {name!r}: shape must be a list of non-negative integers")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ManifestError(f"tensor {name!r}: sha256 must be 64 lowercase hex digits")
    return TensorDigest(dtype=dtype, shape=tuple(shape), sha256=sha)


def parse_manifest(doc: Any) -> dict[str, TensorDigest]:
    """Validate a decoded manifest document. Raises ManifestError."""
    if not isinstance(doc, dict):
        raise ManifestError("manifest must be a JSON object")
    if doc.get("kind") != MANIFEST_KIND:
        raise ManifestError(f"not a weightcheck manifest (kind {doc.get('kind')!r}, expected {MANIFEST_KIND!r})")
    version = doc.get("schema_version")
    if not isinstance(version, str) or version.split(".")[0] != MANIFEST_SCHEMA_VERSION.split(".")[0]:
        raise ManifestError(f"unsupported manifest schema_version {version!r} (this reader: {MANIFEST_SCHEMA_VERSION})")
    tensors = doc.get("tensors")
    if not isinstance(tensors, dict):
        raise ManifestError("manifest has no 'tensors' object")
    return {name: _parse_entry(name, entry) for name, entry in tensors.items()}


def read_manifest(path: str | os.PathLike[str]) -> dict[str, TensorDigest]:
    """Read and validate a manifest. Raises ManifestError (never a bare OSError/JSON error)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {os.fspath(path)}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ManifestError(f"manifest {os.fspath(path)} is not valid JSON: {str(exc)[:160]}") from None
    return parse_manifest(doc)


@dataclass
class DigestComparison:
    missing: list[str] = field(default_factory=list)  # expected, not found
    extra: list[str] = field(default_factory=list)  # found, not expected
    changed: dict[str, str] = field(default_factory=dict)  # name → what differs
    equal: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed)


def compare_digests(expected: Mapping[str, TensorDigest], actual: Mapping[str, TensorDigest]) -> DigestComparison:
    out = DigestComparison()
    for name in sorted(expected):
        got = actual.get(name)
        if got is None:
            out.missing.append(name)
            continue
        why = expected[name].difference(got)
        if why:
            out.changed[name] = why
        else:
            out.equal += 1
    out.extra = sorted(set(actual) - set(expected))
    return out
