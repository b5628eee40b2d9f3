"""A drained bucket's tensor entries kept as columns, from the drain to the record (schema 1.2).

The tap's fast path (`_Call._drained_whole`) describes a full bucket of small CPU tensors at once. Building one
entry dict per tensor, filing each under its seq, and serializing each as its own record line was a third of
the tap's per-tensor time on a stream of many small tensors (issue #22). Here those tensors stay as parallel
lists (`TensorColumns`), the sync's entry table (`EntryTable`) finds any of them by seq for the rare write that
comes late (a proxy, `ColumnEntry`, reads and sets its `wrote` label in place), and the record writes each block
as one `tensors` line (`weightcheck.tap.records`: schema 1.2), which the reader turns back into the same
`TensorEntry` objects as the block's `tensor` lines would give.

A block whose entries gained any other field (an expert found off rank) or whose seqs interleave with other
entries (two loader threads feeding one sync) is written as one `tensor` line per tensor instead: the
columnar line is an encoding of the common case, never a second meaning.

Nothing here imports torch.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from typing import Any

from weightcheck.tap.records import encode_bytes, encode_lines


class TensorColumns:
    """The entries of one drained bucket: one value per tensor in each list, in seq order (increasing)."""

    __slots__ = (
        "algorithm",
        "call",
        "dtype",
        "extra",
        "hexes",
        "names",
        "nonfinite",
        "seqs",
        "shapes",
        "wrote",
        "zeros",
    )

    def __init__(
        self,
        *,
        call: int,
        seqs: list[int],
        names: list[str],
        dtype: str,
        shapes: list[tuple[int, ...]],
        algorithm: str,
        hexes: list[str],
        zeros: list[bool],
        nonfinite: list[int | None],
        wrote: list[tuple[str, ...]],
    ) -> None:
        self.call = call
        self.seqs = seqs
        self.names = names
        self.dtype = dtype
        self.shapes = shapes
        self.algorithm = algorithm
        self.hexes = hexes
        self.zeros = zeros
        self.nonfinite = nonfinite
        self.wrote = wrote
        # Fields other than `wrote` set after the drain (`offrank`), by index: such a block is written as rows.
        self.extra: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.seqs)

    def rows(self) -> list[dict[str, Any]]:
        """The block as the entry dicts `_drained_whole` made before columns (same keys, same order)."""
        out: list[dict[str, Any]] = []
        call, dtype, algorithm, extra = self.call, self.dtype, self.algorithm, self.extra
        for index, (seq, name, label, shape, hexed, zero, bad) in enumerate(
            zip(self.seqs, self.names, self.wrote, self.shapes, self.hexes, self.zeros, self.nonfinite, strict=True)
        ):
            row = {
                "t": "tensor",
                "seq": seq,
                "call": call,
                "name": name,
                "wrote": label,
                "dtype": dtype,
                "shape": shape,
                algorithm: hexed,
                "zeros": zero,
                "nonfinite": bad,
            }
            if index in extra:
                row.update(extra[index])
            out.append(row)
        return out

    def line(self) -> dict[str, Any]:
        """The block's `tensors` line (records.py, schema 1.2): `call` and `dtype` once, every other field a list."""
        return {
            "t": "tensors",
            "call": self.call,
            "dtype": self.dtype,
            "seq": self.seqs,
            "name": self.names,
            "shape": self.shapes,
            self.algorithm: self.hexes,
            "zeros": self.zeros,
            "nonfinite": self.nonfinite,
            "wrote": self.wrote,
        }


class ColumnEntry:
    """One tensor of a `TensorColumns` block, read and written as the entry dict coverage expects
    (`entry.get("wrote")`, `entry["wrote"] = labels`, `entry["offrank"] = True`)."""

    __slots__ = ("block", "index")

    def __init__(self, block: TensorColumns, index: int) -> None:
        self.block = block
        self.index = index

    def get(self, key: str, default: Any = None) -> Any:
        if key == "wrote":
            return self.block.wrote[self.index]
        return self.block.extra.get(self.index, {}).get(key, default)

    def __getitem__(self, key: str) -> Any:
        if key == "wrote":
            return self.block.wrote[self.index]
        return self.block.extra[self.index][key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "wrote":
            self.block.wrote[self.index] = tuple(value)
        else:
            self.block.extra.setdefault(self.index, {})[key] = value


class EntryTable(dict):  # type: ignore[type-arg]
    """The sync's entries: `{seq: entry dict}` for tensors described one at a time, plus the blocks of
    columns (`add_columns`); `get(seq)` finds either (a `ColumnEntry` for a block's tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[TensorColumns] = []
        self._block_of: dict[int, TensorColumns] = {}

    def add_columns(self, block: TensorColumns) -> None:
        self.blocks.append(block)
        self._block_of.update(zip(block.seqs, itertools.repeat(block)))

    def get(self, seq: Any, default: Any = None) -> Any:  # type: ignore[override]
        found = dict.get(self, seq)
        if found is not None:
            return found
        block = self._block_of.get(seq)
        if block is None:
            return default
        first = block.seqs[0]
        index = seq - first if block.seqs[-1] - first == len(block.seqs) - 1 else block.seqs.index(seq)
        return ColumnEntry(block, index)

    def tensor_count(self) -> int:
        return len(self) + sum(map(len, self.blocks))


def tensor_body(entries: dict[int, dict[str, Any]]) -> tuple[bytes, int]:
    """The record's tensor lines, in seq order, and how many tensors they hold: each block of an `EntryTable`
    as one `tensors` line where it can be (see the module doc), every other entry as a `tensor` line."""
    seqs = list(entries)
    rows = list(entries.values()) if seqs == sorted(seqs) else [entries[s] for s in sorted(seqs)]
    blocks = list(getattr(entries, "blocks", ()))
    if not blocks:
        return encode_lines(rows), len(rows)
    whole = [block for block in blocks if not block.extra]
    if len(whole) != len(blocks):
        rows = _merged_rows(rows, [block for block in blocks if block.extra])
    whole.sort(key=lambda block: block.seqs[0])
    row_seqs = [row["seq"] for row in rows]
    if not _disjoint(whole, row_seqs):  # interleaved with rows or with each other: all as rows
        rows = _merged_rows(rows, whole)
        return encode_lines(rows), len(rows)
    return b"".join(_segments(rows, row_seqs, whole)), len(rows) + sum(map(len, whole))


def _merged_rows(rows: list[dict[str, Any]], blocks: list[TensorColumns]) -> list[dict[str, Any]]:
    merged = rows + [row for block in blocks for row in block.rows()]
    merged.sort(key=lambda row: int(row["seq"]))
    return merged


def _disjoint(blocks: list[TensorColumns], row_seqs: list[int]) -> bool:
    """True when no block's seq range holds another block's or a row's seq (blocks sorted by first seq)."""
    last = -1
    for block in blocks:
        first, end = block.seqs[0], block.seqs[-1]
        if first <= last:
            return False
        at = bisect.bisect_left(row_seqs, first)
        if at < len(row_seqs) and row_seqs[at] <= end:
            return False
        last = end
    return True


def _segments(rows: list[dict[str, Any]], row_seqs: list[int], blocks: list[TensorColumns]) -> Iterator[bytes]:
    start = 0
    for block in blocks:
        at = bisect.bisect_left(row_seqs, block.seqs[0])
        if at > start:
            yield encode_lines(rows[start:at])
        yield encode_bytes(block.line())
        start = at
    if start < len(rows):
        yield encode_lines(rows[start:])
