"""Streaming, zero-copy access to the tensors of a loaded checkpoint, one tensor at a time.

Each shard is memory-mapped once, read-only and shared, and a tensor is handed out as a torch view over
that mapping: nothing is copied, and only the pages a computation touches are read. After a tensor has
been processed, `release(name)` drops its pages from this process's resident set (`MADV_DONTNEED` on a
shared file mapping only unmaps them; the page cache keeps them), so a pass over a 100 GB checkpoint
stays at about one tensor of resident memory. Offsets come from `weightcheck.safetensors_header`,
already validated; a shard with layout problems is not read at all (WC1xx rules report it).

torch is imported lazily: this module can be imported by lint without pulling torch in.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weightcheck.checkpoint import Checkpoint, load_checkpoint
from weightcheck.safe_io import UnsafePath, open_regular
from weightcheck.safetensors_header import HeaderReport, TensorInfo

if TYPE_CHECKING:
    import torch

# safetensors dtype name → torch dtype attribute. F4 is stored two values per byte
# (torch.float4_e2m1fn_x2, last dim halved); F6 has no torch dtype: those tensors are readable as raw
# bytes only.
_TORCH_DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}

# Header problems that leave every tensor's bytes where the header says: trailing bytes after the data.
_HARMLESS_PROBLEMS = frozenset({"MetadataIncompleteBuffer"})


_EMPTY = HeaderReport(path="")


class TensorReadError(Exception):
    """A tensor that cannot be read (shard unreadable, file changed, dtype without a torch type...)."""


def torch_dtype(st_dtype: str) -> torch.dtype | None:
    """The torch dtype for a safetensors dtype name, or None when torch has none."""
    import torch

    attr = _TORCH_DTYPE_NAMES.get(st_dtype)
    return getattr(torch, attr, None) if attr else None


def safetensors_dtype(dtype: torch.dtype) -> str | None:
    """The safetensors dtype name for a torch dtype (inverse of `torch_dtype`), or None."""
    import torch

    for name, attr in _TORCH_DTYPE_NAMES.items():
        if getattr(torch, attr, None) == dtype:
            return name
    return None


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes live: its shard, its header entry and the absolute file offset."""

    name: str
    shard: str
    info: TensorInfo
    file_offset: int

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def nbytes(self) -> int:
        return self.info.nbytes


def _shard_unreadable_reason(report: HeaderReport) -> str | None:
    if not report.names_known:
        problem = report.problems[0] if report.problems else None
        return f"shard header unreadable ({problem.kind}: {problem.detail})" if problem else "shard header unreadable"
    bad = [p for p in report.problems if p.kind not in _HARMLESS_PROBLEMS]
    if bad:
        return f"shard layout invalid ({bad[0].kind}: {bad[0].detail})"
    # Trailing bytes are harmless, truncation is not: every tensor must lie inside the file.
    if 8 + report.header_size + report.data_end > report.file_size:
        return "shard is truncated"
    return None


class _Mapping:
    """One shard file mapped read-only and shared; views over it are zero-copy."""

    def __init__(self, path: str, expected_size: int) -> None:
        try:
            fd, st = open_regular(path)
        except UnsafePath as exc:
            raise TensorReadError(exc.reason) from None
        try:
            if st.st_size != expected_size:
                raise TensorReadError(f"file changed since its header was read ({expected_size} → {st.st_size} bytes)")
            self.mm: mmap.mmap | None = (
                mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) if st.st_size else None
            )
        finally:
            os.close(fd)

    def release(self, begin: int, end: int) -> None:
        """Drop the whole pages inside [begin, end) from the resident set (data stays in the page cache)."""
        if self.mm is None or end <= begin:
            return
        start = begin - begin % mmap.PAGESIZE
        # Advisory only; not every platform has MADV_DONTNEED.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        if self.mm is not None:
            # A caller still holding a view keeps the mapping alive; it goes when the view does.
            with contextlib.suppress(BufferError):
                self.mm.close()
            self.mm = None


class TensorStore:
    """Read-only, streaming access to one checkpoint's tensors.

    `get(name)` returns a zero-copy, read-only torch view (never write to it in place); `raw(name)` the
    bytes as stored; `release(name)` gives the tensor's pages back once the caller is done with it.
    Use as a context manager, or call `close()`.
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self._locations: dict[str, StoredTensor] = {}
        self._unreadable: dict[str, str] = {}
        self._maps: dict[str, _Mapping] = {}
        self.bytes_read = 0
        shard_reason = {name: _shard_unreadable_reason(report) for name, report in ckpt.shards.items()}
        # The index decides which shard holds a name; shards it does not mention come after, sorted.
        order = [s for s in ckpt.indexed_shards if s in ckpt.shards]
        order += sorted(s for s in ckpt.shards if s not in order)
        for shard in order:
            report = ckpt.shards[shard]
            base = 8 + report.header_size
            for name, info in report.tensors.items():
                indexed = ckpt.weight_map.get(name)
                held_by_indexed = indexed is not None and name in ckpt.shards.get(indexed, _EMPTY).tensors
                if name in self._locations or (held_by_indexed and indexed != shard):
                    continue
                self._locations[name] = StoredTensor(name, shard, info, base + info.begin)
        for name, stored in self._locations.items():
            reason = shard_reason.get(stored.shard)
            if reason:
                self._unreadable[name] = reason
        # Index entries whose shard is missing or refused: known names, no bytes.
        for name, shard in ckpt.weight_map.items():
            if name not in self._locations and shard not in ckpt.shards:
                self._unreadable[name] = f"shard {shard} is missing or was refused"

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TensorStore:
        return cls(load_checkpoint(path))

    def __enter__(self) -> TensorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- catalogue --------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Readable tensors in storage order (shard by shard, by file offset): the cheapest order to read."""
        readable = [s for n, s in self._locations.items() if n not in self._unreadable]
        readable.sort(key=lambda s: (s.shard, s.file_offset))
        return [s.name for s in readable]

    def all_names(self) -> set[str]:
        """Every name the checkpoint claims, readable or not."""
        return set(self._locations) | set(self._unreadable)

    def unreadable(self) -> dict[str, str]:
        """Names that are known but cannot be read, with the reason."""
        return dict(self._unreadable)

    def __contains__(self, name: object) -> bool:
        return name in self._locations

    def location(self, name: str) -> StoredTensor:
        try:
            return self._locations[name]
        except KeyError:
            raise TensorReadError(self._unreadable.get(name, f"no tensor named {name!r}")) from None

    def info(self, name: str) -> TensorInfo:
        return self.location(name).info

    # ---- data -------------------------------------------------------------------------------------
    def _mapping(self, stored: StoredTensor) -> _Mapping:
        if stored.name in self._unreadable:
            raise TensorReadError(self._unreadable[stored.name])
        mapping = self._maps.get(stored.shard)
        if mapping is None:
            report = self.ckpt.shards[stored.shard]
            try:
                mapping = _Mapping(report.path, report.file_size)
            except OSError as exc:
                raise TensorReadError(f"cannot map {stored.shard}: {exc.strerror or exc}") from None
            self._maps[stored.shard] = mapping
        return mapping

    def raw(self, name: str) -> memoryview:
        """The tensor's bytes exactly as stored (little-endian), as a zero-copy read-only memoryview."""
        stored = self.location(name)
        if stored.nbytes == 0:
            return memoryview(b"")
        mapping = self._mapping(stored)
        assert mapping.mm is not None
        self.bytes_read += stored.nbytes
        return memoryview(mapping.mm)[stored.file_offset : stored.file_offset + stored.nbytes]

    def get(self, name: str) -> torch.Tensor:
        """A read-only torch view of the tensor (F4 comes back as uint8 bytes, two values per byte)."""
        import torch

        stored = self.location(name)
        dtype = torch.uint8 if stored.dtype == "F4" else torch_dtype(stored.dtype)
        if dtype is None:
            raise TensorReadError(f"dtype {stored.dtype} has no torch equivalent")
        shape = stored.shape
        if stored.dtype == "F4":
            shape = (stored.nbytes,) if not shape else (*shape[:-1], shape[-1] // 2)
        if stored.nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        mapping = self._mapping(stored)
        assert mapping.mm is not None
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = stored.nbytes // itemsize
        self.bytes_read += stored.nbytes
        if stored.file_offset % itemsize:
            # safetensors does not promise element alignment; kernels may assume it, so copy (rare).
            data = bytearray(memoryview(mapping.mm)[stored.file_offset : stored.file_offset + stored.nbytes])
            return torch.frombuffer(data, dtype=dtype, count=count).view(shape)
        with warnings.catch_warnings():
            # The mapping is read-only on purpose; torch warns that writing would be undefined.
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(mapping.mm, dtype=dtype, count=count, offset=stored.file_offset)
        return flat.view(shape)

    def get_words(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a flat view of the widest integer type that tiles them.

        For bit-exact comparison: `torch.equal` on int64 words runs at memory speed, several times faster
        than on bf16 values, and compares bits (a float comparison would equate -0.0 and 0.0).
        """
        import torch

        stored = self.location(name)
        if stored.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        mapping = self._mapping(stored)
        assert mapping.mm is not None
        word = next(
            (dtype, size)
            for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2), (torch.uint8, 1))
            if stored.nbytes % size == 0 and stored.file_offset % size == 0
        )
        dtype, size = word
        self.bytes_read += stored.nbytes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(mapping.mm, dtype=dtype, count=stored.nbytes // size, offset=stored.file_offset)

    def release(self, name: str) -> None:
        """Give back the resident pages of a tensor the caller has finished with (views stay valid)."""
        stored = self._locations.get(name)
        mapping = self._maps.get(stored.shard) if stored else None
        if stored is not None and mapping is not None:
            mapping.release(stored.file_offset, stored.file_offset + stored.nbytes)

    def iter_tensors(self, names: list[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, view) one at a time in storage order, releasing each after the caller moves on."""
        for name in names if names is not None else self.names():
            tensor = self.get(name)
            try:
                yield name, tensor
            finally:
                del tensor
                self.release(name)

    def close(self) -> None:
        for mapping in self._maps.values():
            mapping.close()
        self._maps.clear()
