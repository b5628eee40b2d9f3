"""Header-only safetensors reader in pure Python.

Reads the 8-byte length and the JSON header, validates every entry the way the Rust validator in the
`safetensors` library does, and never touches tensor data. Problems are returned as values
(`HeaderProblem`), never raised, so a hostile file cannot crash the linter. Error class names follow the
library's `SafetensorError` messages so verdicts can be compared one to one.
"""

from __future__ import annotations

import json
import math
import os
import re

from weightcheck.lightclass import dataclass, field
from weightcheck.native import lintfast
from weightcheck.safe_io import fast_json_loads  # orjson, imported on first use (~3x faster on large headers)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import NamedTuple, Protocol
else:
    from weightcheck.lightclass import NamedTuple

# Bits per element, from the Rust `Dtype` enum (safetensors >= 0.6).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# dtype -> (the same string, its bits): the header loop's one lookup gives both.
_DTYPE_OF: dict[str, tuple[str, int]] = {name: (name, bits) for name, bits in DTYPE_BITS.items()}
# The Rust reader refuses headers above 100 MB; a real DeepSeek-V3 shard header is < 1 MB.
MAX_HEADER_BYTES = 100_000_000
# Shapes or offsets beyond u64 overflow in the Rust validator.
_U64_MAX = 2**64 - 1
# Caps that keep memory bounded whatever a header claims (docs/security.md). The Rust reader has neither, so
# they sit far above anything real: tensor names are < 300 characters (a VLM's deepest module path), and a
# 163-shard DeepSeek-V3 holds ~92k tensors in all, a single-file checkpoint at most that.
MAX_NAME_CHARS = 1024
MAX_HEADER_TENSORS = 1 << 18
# Every key of a JSON object is a string followed by ':' (whitespace allowed between). Counting these in
# the text is an upper bound on the keys; equal to the keys the parser kept means no key was repeated.
_KEY_TOKEN = re.compile(r'"\s*:')


class TensorInfo(NamedTuple):
    # A NamedTuple, not a dataclass: DeepSeek-V3 has ~92k of these and creation cost matters.
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_new_tuple = tuple.__new__  # builds a TensorInfo without the NamedTuple constructor's extra call


@dataclass(frozen=True)
class HeaderProblem:
    """One reason the file would be rejected. `kind` mirrors the safetensors error class."""

    kind: str
    detail: str
    tensor: str | None = None


# Problem kinds that mean "the file is cut short" rather than "the header is garbage".
TRUNCATION_KINDS = frozenset({"HeaderTooSmall", "InvalidHeaderLength", "MetadataIncompleteBuffer"})
# Problem kinds about the data layout described by an otherwise parseable header.
LAYOUT_KINDS = frozenset({"InvalidOffset", "TensorInvalidInfo", "MisalignedSlice", "ValidationOverflow"})


@dataclass
class HeaderReport:
    path: str
    file_size: int = 0
    header_size: int = 0
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    metadata: dict[str, str] | None = None
    problems: list[HeaderProblem] = field(default_factory=list)
    # True when the JSON parsed and tensor names can be trusted even if the layout is broken.
    names_known: bool = False
    bytes_read: int = 0
    # End of the last tensor's data (valid when the offsets tile the buffer): the shard's data bytes.
    data_end: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _key_tokens(text: str) -> int:
    """The `"...":` key tokens of the header text, an upper bound on its keys. The Rust writer (and every
    real header) is compact: when every colon follows a quote, no token has whitespace before its colon and
    the tokens are exactly the `":` pairs (two C-level counts; the regex walk only otherwise)."""
    plain = text.count('":')
    if plain == text.count(":"):
        return plain
    return sum(1 for _ in _KEY_TOKEN.finditer(text))


def _parsed_keys(doc: dict[str, object]) -> int:
    """Keys of the header and of its entries (and `__metadata__`). Deeper objects are not counted: a header
    holding any makes the count fall short of the text's key tokens and takes the exact, slow path. A value
    that is not an object (a list's or string's length counted instead) is an invalid entry, reported anyway."""
    try:
        return len(doc) + sum(map(len, doc.values()))  # type: ignore[arg-type]
    except TypeError:  # a number or null as a value: invalid (reported), and the exact check decides
        return -1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: str | os.PathLike[str]) -> HeaderReport:
    """Read and validate one safetensors header. Never raises for bad content; only reads the header."""
    path = os.fspath(path)
    report = HeaderReport(path=path)
    from weightcheck.safe_io import UnsafePath, open_regular

    try:
        # Non-blocking so that a FIFO cannot hang us; fstat then refuses anything but a regular file.
        fd, st = open_regular(path)
    except UnsafePath as exc:
        kind = "NotRegularFile" if exc.kind == "not-regular" else "IoError"
        report.problems.append(HeaderProblem(kind, exc.reason))
        return report
    try:
        report.file_size = st.st_size
        with os.fdopen(fd, "rb", closefd=False) as fh:
            _parse(fh, report)
    except OSError as exc:
        report.problems.append(HeaderProblem("IoError", f"read failed: {exc.strerror or exc}"))
    finally:
        os.close(fd)
    return report


if TYPE_CHECKING:  # only annotations use it (and typing is not imported at run time)

    class RangeReader(Protocol):
        """Anything with `read(n)` from the current position: a local file, or a remote file read by ranges."""

        def read(self, n: int, /) -> bytes: ...


def parse_header(reader: RangeReader, file_size: int, path: str) -> HeaderReport:
    """Validate the header of a file of `file_size` bytes read through `reader` (e.g. HTTP ranges).

    The same checks as `read_header`: the header length is checked against `file_size` before the header
    is read, so a lying length costs 8 bytes, never a large read."""
    report = HeaderReport(path=path, file_size=file_size)
    try:
        _parse(reader, report)
    except OSError as exc:
        report.problems.append(HeaderProblem("IoError", f"read failed: {exc.strerror or exc}"))
    return report


def _parse(fh: RangeReader, report: HeaderReport) -> None:
    size = report.file_size
    prefix = fh.read(8)
    report.bytes_read += len(prefix)
    if len(prefix) < 8:
        report.problems.append(HeaderProblem("HeaderTooSmall", f"file is {size} bytes, shorter than 8"))
        return
    n = int.from_bytes(prefix, "little")  # the header length, a little-endian u64 (no `struct` to import)
    report.header_size = n
    if n > MAX_HEADER_BYTES:
        report.problems.append(HeaderProblem("HeaderTooLarge", f"header length {n} exceeds {MAX_HEADER_BYTES} bytes"))
        return
    if 8 + n > size:
        report.problems.append(
            HeaderProblem("InvalidHeaderLength", f"header length {n} runs past end of file ({size} bytes)")
        )
        return
    raw = fh.read(n)
    report.bytes_read += len(raw)
    if len(raw) != n:
        report.problems.append(HeaderProblem("InvalidHeaderLength", "file shrank while reading"))
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        report.problems.append(HeaderProblem("InvalidHeader", f"header is not UTF-8 ({exc.reason})"))
        return
    if not text.startswith("{"):
        report.problems.append(HeaderProblem("InvalidHeaderStart", "header does not start with '{'"))
        return
    # Bounded before parsing: the parsed form of a 100 MB header of tiny entries would be gigabytes.
    claimed = text.count('"data_offsets"')
    if claimed > MAX_HEADER_TENSORS:
        report.problems.append(
            HeaderProblem("TooManyTensors", f"header lists about {claimed} tensors, more than {MAX_HEADER_TENSORS}")
        )
        return
    try:
        try:
            doc = fast_json_loads(text)
        except ValueError:
            doc = json.loads(text)  # the stdlib parser gives the reference verdict and message
            # The stdlib accepts a lone surrogate escape ("\ud800"), which no UTF-8 string can hold (serde
            # refuses it too): such a name would crash every report writer.
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        # A dict silently keeps the last of duplicate keys (serde refuses them), at any level: `__metadata__`
        # twice, a tensor twice, `dtype` twice in one entry. Only when the key tokens in the text outnumber
        # the keys parsed, pay for the slow pairs-hook parse that names the duplicate.
        if isinstance(doc, dict) and _key_tokens(text) != _parsed_keys(doc):
            json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as dup:
        report.problems.append(HeaderProblem("InvalidHeaderDeserialization", "duplicate key in header", tensor=dup.key))
        return
    except UnicodeEncodeError:
        report.problems.append(
            HeaderProblem("InvalidHeaderDeserialization", "header has a lone UTF-16 surrogate escape (not UTF-8 text)")
        )
        return
    except (ValueError, RecursionError) as exc:
        report.problems.append(
            HeaderProblem("InvalidHeaderDeserialization", f"header is not valid JSON: {str(exc)[:120]}")
        )
        return
    if not isinstance(doc, dict):
        report.problems.append(HeaderProblem("InvalidHeaderDeserialization", "header is not a JSON object"))
        return

    meta = doc.pop("__metadata__", None)
    if meta is not None:
        if isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()):
            report.metadata = meta
        else:
            report.problems.append(
                HeaderProblem("InvalidHeaderDeserialization", "__metadata__ must map strings to strings")
            )
            return

    if doc and max(map(len, doc)) > MAX_NAME_CHARS:
        long_name = max(doc, key=len)
        report.problems.append(
            HeaderProblem(
                "NameTooLong",
                f"a tensor name of {len(long_name)} characters (more than {MAX_NAME_CHARS})",
                tensor=long_name[:200] + "...",
            )
        )
        return

    fast = lintfast()
    if fast is not None:
        # The same loop in C (weightcheck/_native/lintfast.c): well-formed entries there, the rest here.
        got = fast.tensor_entries(doc, _DTYPE_OF, TensorInfo, lambda name, entry: _one_entry(name, entry, report))
        if got is None:
            return
        tensors, tiled_end = got
    else:
        tensors = {}
        # Writers lay tensors out in header order: while each entry starts where the previous one ended, the
        # offsets tile in sorted order too (the check below then needs no list of spans and no sort).
        tiled = True
        pos = 0
        for name, entry in doc.items():
            info = _one_entry(name, entry, report)
            if info is None:
                return
            tensors[name] = info
            if tiled:
                if info[3] == pos and info[4] >= pos:
                    pos = info[4]
                else:
                    tiled = False
        tiled_end = pos if tiled else None
    report.names_known = True
    report.tensors = tensors
    if tiled_end is not None:
        report.data_end = expected = tiled_end
    else:
        expected = _tiling_end(tensors, report)
        if expected is None:
            return
    if 8 + n + expected != size:
        report.problems.append(
            HeaderProblem(
                "MetadataIncompleteBuffer",
                f"header describes {8 + n + expected} bytes but the file has {size}"
                + (" (truncated)" if size < 8 + n + expected else " (trailing bytes)"),
            )
        )


def _one_entry(name: str, entry: object, report: HeaderReport) -> TensorInfo | None:
    """One header entry as a TensorInfo, or None (the problem reported)."""
    # Fast path for well-formed entries (the hot loop on a 90k-tensor checkpoint, also in C: lintfast.c);
    # anything unusual goes through `_entry`, which names the exact problem.
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]  # type: ignore[index]
        # the table's own dtype string (one object per dtype, its hash cached) instead of the parser's
        # copy: 92k fewer strings held, and every later `dtype in {...}` test skips hashing it.
        # An unknown dtype (None) fails to unpack: TypeError, the exact path below.
        dtype, bits = _DTYPE_OF.get(dtype) if type(dtype) is str else None  # type: ignore[misc]
        numel = 1
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise TypeError
            numel *= dim
        if (
            not numel  # an empty tensor: `_entry` checks the running product as the library does
            or type(shape) is not list
            or type(begin) is not int
            or type(end) is not int
            or not 0 <= begin <= end <= _U64_MAX
            or numel * bits > _U64_MAX
            or (numel * bits) % 8
            or end - begin != (numel * bits) >> 3
        ):
            raise TypeError
        return _new_tuple(TensorInfo, (name, dtype, tuple(shape), begin, end))  # type: ignore[no-any-return]
    except (TypeError, KeyError, ValueError):
        return _entry(name, entry, report)


def _tiling_end(tensors: dict[str, TensorInfo], report: HeaderReport) -> int | None:
    """Where the data ends when the offsets tile [0, end) in sorted order; None (problem reported) if not."""
    spans = [(info.begin, info.end, name) for name, info in tensors.items()]
    # Offsets must tile [0, max_end) exactly, in order, without holes or overlaps.
    expected = 0
    for begin, end, name in sorted(spans):
        if begin != expected or end < begin:
            where = "overlaps the previous tensor" if begin < expected else "leaves a gap"
            if end < begin:
                where = "ends before it begins"
            report.problems.append(
                HeaderProblem(
                    "InvalidOffset",
                    f"data_offsets [{begin}, {end}] {where} (expected start {expected})",
                    tensor=name,
                )
            )
            return None
        expected = end
    report.data_end = expected
    return expected


def _entry(name: str, entry: object, report: HeaderReport) -> TensorInfo | None:
    def bad(kind: str, detail: str) -> None:
        report.problems.append(HeaderProblem(kind, detail, tensor=name))

    # Unknown extra fields are ignored, as the library's serde model does.
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        bad("InvalidHeaderDeserialization", "entry must have dtype, shape and data_offsets")
        return None
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        bad("InvalidHeaderDeserialization", f"unknown dtype {str(dtype)[:40]!r}")
        return None
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        bad("InvalidHeaderDeserialization", "shape must be a list of integers")
        return None
    if any(d < 0 or d > _U64_MAX for d in shape):
        bad("InvalidHeaderDeserialization", f"shape {shape[:8]} has a negative or oversized dimension")
        return None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) and 0 <= o <= _U64_MAX for o in offsets)
    ):
        bad("InvalidHeaderDeserialization", "data_offsets must be two non-negative integers")
        return None
    # The library multiplies the dimensions left to right in u64 and refuses the header at the first overflow,
    # even when a later zero would make the product 0 (`[2**40, 2**40, 0]`: "overflow computing buffer size").
    numel = 1
    for dim in shape:
        numel *= dim
        if numel > _U64_MAX:
            bad("ValidationOverflow", f"shape {shape[:8]} overflows")
            return None
    bits = numel * DTYPE_BITS[dtype]
    if bits > _U64_MAX:
        bad("ValidationOverflow", f"shape {shape[:8]} overflows")
        return None
    if bits % 8:
        bad("MisalignedSlice", f"{numel} elements of {dtype} is not a whole number of bytes")
        return None
    begin, end = offsets
    if end >= begin and end - begin != bits // 8:
        bad(
            "TensorInvalidInfo",
            f"{dtype}{list(shape)} needs {bits // 8} bytes but data_offsets span {end - begin}",
        )
        return None
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)
