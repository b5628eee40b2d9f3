"""The tensor-scan engine of `lint --content`: one streaming pass over a checkpoint's tensors.

Every readable tensor is viewed through its shard's memory mapping, reduced once with a min/max (NaN
propagates through it, ±Inf shows in the extremes, all-zero and constant tensors have min == max),
optionally hashed for a manifest, and its pages are given back before the next tensor. A tensor already
found bad has its bad elements counted where its bytes were read, so the WC6xx rules (weightcheck.rules.
content) never read it again.

It knows tensors and stores, not rules: the rules read the TensorScans it returns. On a Ray cluster the
same `scan_tensors` runs per shard chunk; the cluster is passed in as a backend (weightcheck.distributed).
torch is imported inside the scan only: lint without `--content` never imports it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weightcheck.compare.metrics import ValueRange
    from weightcheck.digest import TensorDigest
    from weightcheck.tensors import TensorStore

# A progress bar only for runs long enough to want one (about a second of reading or more).
_PROGRESS_MIN_BYTES = 512 * 1024 * 1024
# Names whose values are quantization scales: they must be positive.
SCALE_NAME = re.compile(r"(_scale|_scale_inv|_scale_2|_global_scale|(^|\.)[kvq]_scale)$")
# Dtypes whose values cannot be reduced (F4 is packed, F6 has no torch type): hashed, not range-checked.
NO_RANGE_DTYPES = frozenset({"F4", "F6_E2M3", "F6_E3M2"})


@dataclass
class TensorScan:
    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    value_range: ValueRange | None = None
    digests: dict[str, TensorDigest] = field(default_factory=dict)  # algorithm → digest
    error: str | None = None
    # Element counts of a tensor already found bad ("nan", "inf", "zero", "negative", "255"), taken where
    # its bytes were read: rules never read the tensor again (a Ray worker may be the only reader).
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def digest(self) -> TensorDigest | None:
        """The sha256 digest (what `--hash` writes), when one was taken."""
        return self.digests.get("sha256")


def scan_tensors(store: Any, names: list[str], algorithms: list[str], advance: Any = None) -> list[TensorScan]:
    """Reduce (and hash) each of `names`, in order, one tensor's pages at a time. The unit of work of both
    the single-process scan and a Ray task, so both give the same TensorScans."""
    from weightcheck.compare.metrics import value_range
    from weightcheck.digest import digest_bytes
    from weightcheck.tensors import TensorReadError

    out: list[TensorScan] = []
    for name in names:
        stored = store.location(name)
        scan = TensorScan(name, stored.shard, stored.dtype, stored.shape)
        try:
            if stored.dtype not in NO_RANGE_DTYPES:
                tensor = store.get(name)
                scan.value_range = value_range(tensor)
                del tensor
                scan.counts = _flag_counts(store, scan)
            for algorithm in algorithms:
                scan.digests[algorithm] = digest_bytes(store.raw(name), stored.dtype, stored.shape, algorithm)
        except TensorReadError as exc:
            scan.error = str(exc)
        finally:
            store.release(name)
        out.append(scan)
        if advance is not None:
            advance(stored.nbytes)
    return out


def _flag_counts(store: Any, scan: TensorScan) -> dict[str, int]:
    found = scan.value_range
    counts: dict[str, int] = {}
    if found is None:
        return counts
    if found.has_nan:
        counts["nan"] = _count_in(store, scan.name, "nan")
    if found.has_inf:
        counts["inf"] = _count_in(store, scan.name, "inf")
    if SCALE_NAME.search(scan.name) and not found.has_nan:
        if scan.dtype == "U8":
            if found.maximum >= 255:
                counts["255"] = count_value_in(store, scan.name, 255)
        elif found.minimum <= 0:
            counts["zero"] = _count_in(store, scan.name, "zero")
            counts["negative"] = _count_in(store, scan.name, "negative")
    return counts


def _count_in(store: Any, name: str, predicate: str) -> int:
    """Count elements of one (already flagged) tensor: "nan", "inf", "zero" or "negative"."""
    import torch

    from weightcheck.compare.metrics import CHUNK_ELEMENTS

    flat = store.get(name).reshape(-1)
    total = 0
    try:
        for start in range(0, flat.numel(), CHUNK_ELEMENTS):
            piece = flat[start : start + CHUNK_ELEMENTS]
            if not piece.dtype.is_floating_point and predicate in ("nan", "inf"):
                return 0
            piece = piece.to(torch.float32) if piece.dtype.is_floating_point else piece.to(torch.int64)
            mask = {
                "nan": torch.isnan,
                "inf": torch.isinf,
                "zero": lambda t: t == 0,
                "negative": lambda t: t < 0,
            }[predicate](piece)
            total += int(mask.sum())
    finally:
        del flat
        store.release(name)
    return total


def count_value_in(store: Any, name: str, value: int) -> int:
    try:
        return int((store.get(name) == value).sum())
    finally:
        store.release(name)


def scan_progress(mode: bool | str | None, total: int) -> Any:
    """A Progress (weightcheck.progress) when the run asked for one (`mode`: "bar", "lines", True to pick
    by stderr, or off) and the work is long enough."""
    if mode is True:  # older callers passed a bool
        mode = "bar" if sys.stderr.isatty() else "lines"
    if not mode or (mode == "bar" and total < _PROGRESS_MIN_BYTES):  # lines are gated by their interval
        return None
    from weightcheck.progress import Progress

    return Progress("content", total, mode)


# ---- on a Ray cluster ------------------------------------------------------------------------------------
def _scan_task(root: str, shard: str, names: list[str], algorithms: list[str]) -> tuple[list[TensorScan], dict]:
    """A Ray task: scan `names` of one shard. Only this shard's header is read: the driver already decided
    which shard holds each name."""
    from weightcheck.checkpoint import Checkpoint, resolve_inside
    from weightcheck.safetensors_header import read_header
    from weightcheck.tensors import TensorStore

    ckpt = Checkpoint(root=Path(root), files_on_disk=[shard])
    real, refusal = resolve_inside(Path(root), shard)
    if refusal is not None:
        raise FileNotFoundError(f"{shard}: {refusal.reason} on this node")
    ckpt.shards[shard] = read_header(real)  # type: ignore[arg-type]
    store = TensorStore(ckpt)
    try:
        return scan_tensors(store, names, algorithms), {}
    finally:
        store.close()


def ray_scan_tensors(
    ray: Any, store: TensorStore, names: list[str], algorithms: list[str], root: Path, progress: Any = None
) -> tuple[list[TensorScan], str | None]:
    """`scan_tensors` over `names` as Ray tasks on the `ray` session (one chunk of a shard each), merged in
    the single-process order. A chunk that failed every retry comes back as per-tensor errors (WC608),
    never as missing tensors. Returns the scans and a note for the result when some chunk failed."""
    from weightcheck.distributed import run_work

    if root.is_file():
        root = root.parent
    where = str(root)
    ckpt = store.ckpt
    items = [(store.info(n).nbytes, ((where, store.location(n).shard),)) for n in names]
    sizes = {(where, shard): report.file_size for shard, report in ckpt.shards.items()}

    def args_of(start: int, stop: int, files: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
        return (where, files[0][1], names[start:stop], algorithms)

    chunks, results, errors, stats = run_work(ray, _scan_task, items, args_of, sizes, progress=progress)
    out: list[TensorScan] = []
    for chunk, value, error in zip(chunks, results, errors, strict=True):
        if value is not None:
            out.extend(value)
            continue
        for name in names[chunk.start : chunk.stop]:  # reported by WC608, never dropped
            stored = store.location(name)
            out.append(TensorScan(name, stored.shard, stored.dtype, stored.shape, error=error))
    what = f"{len(names)} tensors"
    stats.tell(what)
    return out, stats.note(what) if stats.failed else None
