"""Per-tensor digests and the weightcheck manifest.

A digest is `(dtype, shape, hash, algorithm)` where the hash covers the tensor's bytes exactly as
safetensors stores them: C order, little-endian, no header. Hashing bytes rather than values is deliberate: `-0.0` and
`0.0` differ, identical NaN payloads agree, and a packed int32 word is compared bit for bit (a float
comparison would lose its low bits). dtype and shape are part of the digest because equal bytes can be
a different tensor (a transposed or reinterpreted one).

Algorithms (`ALGORITHMS`): `"sha256"` (cryptographic, ~1 GB/s per core: the default for manifests that
are published next to a checkpoint) and `"xxh3_128"` (from the optional `xxhash` package: not
cryptographic, but ~8 GB/s per core and it releases the GIL, so the live-sync tap can hash at the speed
the engine copies; it detects corruption and mix-ups, not a forger). Two digests of different algorithms
are never equal; comparing them needs one side recomputed (`TensorDigest.comparable`).

Public API (kept small; the live-sync verifier reuses it):

- `TensorDigest(dtype, shape, hexdigest, algorithm="sha256")`: one tensor; `dtype` is the safetensors
  name (`"BF16"`). `.sha256` is the hex digest when the algorithm is sha256, else None.
- `digest_tensor(tensor, algorithm="sha256")`: digest of an in-memory torch tensor, equal to
  `digest_stored` of the same tensor after `safetensors.torch.save_file` (any device, any strides).
- `digest_bytes(data, dtype, shape, algorithm="sha256")`: digest of raw stored bytes.
- `digest_stored(store, name, algorithm="sha256")`: digest of one tensor of a `weightcheck.tensors.TensorStore`.
- `live_algorithm(environ=None)`: the algorithm of the live path (tap and trainer manifests): xxh3_128 when
  `xxhash` is importable, else sha256; `WEIGHTCHECK_DIGEST=sha256|xxh3_128|posmix128` overrides.
- `"posmix128"` (`weightcheck.devdigest`): computed on the tensor's device with torch integer kernels (no
  host copy), bit-identical on CPU, CUDA and stored bytes; for GPU engines and trainers.
- `write_manifest(path, digests)` / `read_manifest(path)`: the JSON manifest
  `{"schema_version": "1.0", "kind": "weightcheck-manifest", "tensors": {name: {"dtype", "shape", ALG: hex}}}`
  where the key `ALG` names the algorithm (`"sha256": ...` or `"xxh3_128": ...`, one per entry);
  `read_manifest` raises `ManifestError` (with a readable message) on anything malformed.
- `compare_digests(expected, actual)`: which names are missing, extra, changed, or not comparable
  (digests of different algorithms).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightcheck.safetensors_header import DTYPE_BITS

if TYPE_CHECKING:
    import torch

    from weightcheck.tensors import TensorStore

log = logging.getLogger("weightcheck.digest")

SHA256 = "sha256"
XXH3_128 = "xxh3_128"
# On-device digest (weightcheck.devdigest): torch integer kernels where the tensor lives, no host copy.
POSMIX128 = "posmix128"
ALGORITHMS = (SHA256, XXH3_128, POSMIX128)
# Length of each algorithm's lowercase hex digest: what a manifest or record entry must carry.
HEX_LENGTH = {SHA256: 64, XXH3_128: 32, POSMIX128: 32}
ENV_DIGEST = "WEIGHTCHECK_DIGEST"
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
    hexdigest: str
    # Part of equality and hashing: a sha256 and an xxh3_128 digest are never equal, whatever their hex says.
    algorithm: str = SHA256

    @property
    def sha256(self) -> str | None:
        """The hex digest when this is a sha256 digest (the field's name before other algorithms), else None."""
        return self.hexdigest if self.algorithm == SHA256 else None

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), self.algorithm: self.hexdigest}

    def comparable(self, other: TensorDigest) -> bool:
        """Whether the bytes of the two can be compared (same algorithm)."""
        return self.algorithm == other.algorithm

    def difference(self, other: TensorDigest) -> str | None:
        """What differs from `other` ("dtype BF16 → F16", "bytes"...), or None when equal.

        Digests of different algorithms with equal dtype and shape say "not comparable", never "bytes
        differ": nothing is known about their bytes."""
        if self.dtype != other.dtype:
            return f"dtype {self.dtype} → {other.dtype}"
        if self.shape != other.shape:
            return f"shape {list(self.shape)} → {list(other.shape)}"
        if not self.comparable(other):
            return f"not comparable: digests by {self.algorithm} and {other.algorithm}"
        if self.hexdigest != other.hexdigest:
            return f"bytes differ ({self.algorithm})"
        return None


def check_algorithm(algorithm: str) -> str:
    """`algorithm` if known, else ValueError naming the known ones."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    return algorithm


def xxhash_available() -> bool:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


_warned_fallback: set[str] = set()


def live_algorithm(requested: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The digest algorithm of the live path (tap records and trainer manifests): both sides must agree.

    `requested` (an argument) wins, then `WEIGHTCHECK_DIGEST=sha256|xxh3_128|posmix128`, then xxh3_128 when `xxhash`
    is importable (sha256 is ~8x slower than the engine's copy and would add several times the load time).
    xxh3_128 without `xxhash` falls back to sha256 with a warning (once): the record is still verifiable,
    only slower to take. An unknown name is a ValueError when passed, a warning when it comes from the
    environment (a typo in an engine's environment must not stop the engine)."""
    if requested is not None:
        wanted = check_algorithm(requested)
    else:
        env = os.environ if environ is None else environ
        wanted = (env.get(ENV_DIGEST) or "").strip().lower()
        if wanted and wanted not in ALGORITHMS:
            if wanted not in _warned_fallback:
                _warned_fallback.add(wanted)
                log.warning("weightcheck: %s=%r is not one of %s; using the default", ENV_DIGEST, wanted, ALGORITHMS)
            wanted = ""
    if wanted in (SHA256, POSMIX128):
        return wanted
    if xxhash_available():
        return XXH3_128
    if XXH3_128 not in _warned_fallback:
        _warned_fallback.add(XXH3_128)
        log.warning(
            "weightcheck: the xxhash package is not installed; digesting with sha256 (correct, but several "
            "times slower than the weight load: pip install xxhash)"
        )
    return SHA256


def _hasher(algorithm: str) -> Any:
    """A fresh hashlib-style object (`update`, `hexdigest`) for `algorithm`."""
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == XXH3_128:
        import xxhash  # optional dependency: imported only when this algorithm is asked for

        return xxhash.xxh3_128()
    if algorithm == POSMIX128:
        from weightcheck.devdigest import PosmixHasher

        return PosmixHasher()
    return check_algorithm(algorithm)  # raises


def digest_bytes(
    data: bytes | bytearray | memoryview,
    dtype: str,
    shape: tuple[int, ...] | list[int],
    algorithm: str = SHA256,
) -> TensorDigest:
    """Digest of a tensor given its stored bytes (for example a `TensorStore.raw` view)."""
    hasher = _hasher(algorithm)
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _HASH_SLICE_BYTES):
        hasher.update(view[start : start + _HASH_SLICE_BYTES])
    return TensorDigest(dtype, tuple(int(d) for d in shape), hasher.hexdigest(), algorithm)


def digest_stored(store: TensorStore, name: str, algorithm: str = SHA256) -> TensorDigest:
    """Digest of one tensor of a checkpoint, read through its memory mapping (raises TensorReadError)."""
    info = store.info(name)
    return digest_bytes(store.raw(name), info.dtype, info.shape, algorithm)


def digest_tensor(tensor: torch.Tensor, algorithm: str = SHA256) -> TensorDigest:
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
    if algorithm == POSMIX128:  # on the tensor's own device: no host copy
        from weightcheck.devdigest import posmix128_tensor

        return TensorDigest(dtype, shape, posmix128_tensor(tensor), algorithm)
    hasher = _hasher(algorithm)
    flat = tensor.detach().contiguous().reshape(-1)
    itemsize = flat.element_size()
    step = max(1, _HASH_SLICE_BYTES // max(itemsize, 1))
    for start in range(0, flat.numel(), step):
        piece = flat[start : start + step].cpu()
        raw = piece.view(torch.uint8) if itemsize > 0 else piece
        data = raw.numpy()
        if sys.byteorder == "big" and itemsize > 1:  # safetensors stores little-endian
            data = data.view(f">u{itemsize}").byteswap().view("u1")
        hasher.update(memoryview(data))
    return TensorDigest(dtype, shape, hasher.hexdigest(), algorithm)


# ---- manifest ------------------------------------------------------------------------------------
def manifest_document(digests: Mapping[str, TensorDigest]) -> dict[str, Any]:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "tensors": {name: digests[name].as_dict() for name in sorted(digests)},
    }


def manifest_algorithms(digests: Mapping[str, TensorDigest]) -> set[str]:
    """The algorithms a manifest's digests use (one, for any manifest weightcheck writes)."""
    return {digest.algorithm for digest in digests.values()}


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
    dtype, shape = entry.get("dtype"), entry.get("shape")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ManifestError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ManifestError(f"tensor {name!r}: shape must be a list of non-negative integers")
    algorithms = [key for key in ALGORITHMS if key in entry]
    if len(algorithms) != 1:
        # Zero: nothing to compare. Several: which one a reader trusts would be a silent choice.
        found = "none" if not algorithms else " and ".join(algorithms)
        raise ManifestError(f"tensor {name!r}: needs exactly one digest ({' or '.join(ALGORITHMS)}), found {found}")
    algorithm = algorithms[0]
    hexdigest = entry[algorithm]
    if not is_hex_digest(hexdigest, algorithm):
        raise ManifestError(f"tensor {name!r}: {algorithm} must be {HEX_LENGTH[algorithm]} lowercase hex digits")
    return TensorDigest(dtype, tuple(shape), hexdigest, algorithm)


def is_hex_digest(value: Any, algorithm: str) -> bool:
    """Whether `value` is a well-formed lowercase hex digest of `algorithm` (its exact length)."""
    return (
        isinstance(value, str) and len(value) == HEX_LENGTH[algorithm] and all(c in "0123456789abcdef" for c in value)
    )


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
    from weightcheck import safe_io

    try:
        # A manifest named by the user: a regular file (not a FIFO), bounded size, confined to its folder.
        real = safe_io.confine_self(path)
        doc = safe_io.load_json(real, safe_io.MAX_MANIFEST_BYTES, name=os.fspath(path))
    except safe_io.UnsafePath as exc:
        what = "is not valid JSON" if exc.kind == "invalid" else "cannot be read"
        raise ManifestError(f"manifest {os.fspath(path)} {what}: {exc.reason}") from None
    return parse_manifest(doc)


@dataclass
class DigestComparison:
    missing: list[str] = field(default_factory=list)  # expected, not found
    extra: list[str] = field(default_factory=list)  # found, not expected
    changed: dict[str, str] = field(default_factory=dict)  # name → what differs
    # same dtype and shape but digests of different algorithms: unverified, never reported as "changed"
    incomparable: dict[str, str] = field(default_factory=dict)  # name → "sha256 vs xxh3_128"
    equal: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.incomparable)


def compare_digests(expected: Mapping[str, TensorDigest], actual: Mapping[str, TensorDigest]) -> DigestComparison:
    out = DigestComparison()
    for name in sorted(expected):
        got = actual.get(name)
        if got is None:
            out.missing.append(name)
            continue
        want = expected[name]
        if (want.dtype, want.shape) == (got.dtype, got.shape) and not want.comparable(got):
            out.incomparable[name] = f"{want.algorithm} vs {got.algorithm}"
            continue
        why = want.difference(got)
        if why:
            out.changed[name] = why
        else:
            out.equal += 1
    out.extra = sorted(set(actual) - set(expected))
    return out
