"""Per-rank, per-sync record files written by the load_weights tap, and their reader.

One JSON-lines file per engine rank per sync, written once, atomically (temp file + `os.replace`), under
`$WEIGHTCHECK_DIR/sync-{seq:05d}/`. Lines, in order::

    {"t": "header", "kind": "weightcheck-sync-record", "schema_version": "1.2",
     "sync": {"seq": 3, "source": "session", "weight_version": "step-7", "started": 1.7e9, "ended": 1.7e9},
     "rank": {"tp_rank": 0, "tp_size": 2, "pp_rank": 1, "pp_size": 2, "ep_rank": 0, "ep_size": 1, ...},
     "engine": "host:30000", "host": "...", "pid": 1234, "model": {"class": "Qwen3ForCausalLM",
     "start_layer": 2, "end_layer": 4, "num_hidden_layers": 4}, "sglang_version": "0.5.23",
     "weightcheck_version": "0.1.0", "digest": "xxh3_128", "tensors_file": null}
    {"t": "call", "call": 0, "names": 25, "seconds": 0.01, "error": null, "engine_warnings": [...],
     "unattributed_writes": 0}
    {"t": "tensor", "seq": 0, "call": 0, "name": "model.embed_tokens.weight", "dtype": "BF16",
     "shape": [128, 64], "xxh3_128": "…", "zeros": false, "nonfinite": 0, "wrote": ["model.embed_tokens.weight"]}
    {"t": "tensors", "call": 0, "dtype": "BF16", "seq": [1, 2], "name": ["a.weight", "b.weight"],
     "shape": [[64], [64]], "xxh3_128": ["…", "…"], "zeros": [false, false], "nonfinite": [0, 0],
     "wrote": [["a.weight"], ["b.weight"]]}
    {"t": "param", "name": "model.layers.0.self_attn.qkv_proj.weight", "dtype": "F32", "shape": [128, 64],
     "tracked": true, "writes": 3, "shards_expected": ["k", "q", "v"], "shards_written": ["k", "q", "v"],
     "experts_local": null, "experts_written": null}
    {"t": "end", "calls": 1, "tensors": 25, "params": 19}

From schema 1.2 on, a `tensors` line stands for a run of `tensor` lines, as columns: every field a list with one
value per tensor, except `call` and `dtype`, which may be given once for all (the tap writes one for each big
bucket of small tensors: `weightcheck.tap.columns`). It reads back as the `TensorEntry` objects of those `tensor`
lines, each checked the same way, so every reader judges both forms alike; `tensor` and `tensors` lines mix.

Integrity of the line sequence: line kinds come in the order above; tensors (of both kinds of line) in
increasing `seq`; from schema 1.1 on, call lines in non-decreasing `call` (two threads may share one) and
param/state lines in increasing `name` (1.0 records: param and state names unique, their order not checked, as it meant
nothing). A duplicated, swapped or moved line is a RecordError, like a count that disagrees with the `end`
line. These catch accidents (a botched copy or concatenation), not a forger, who can rewrite any file
consistently.

The header's `digest` names the algorithm (`weightcheck.digest.ALGORITHMS`; `sha256` when absent, as in
records written before there was a choice) and each tensor line carries its hex digest under that key.
`wrote` lists the engine parameters an incoming tensor wrote into (`name:shard` or `name:shard:expert` for
stacked or expert parameters; the bare name otherwise); an empty list means the engine dropped it on this
rank. `tracked: false` marks a parameter whose writes could not be observed (its coverage is unknown, not
"never written"). A tensor line may carry `"engine_wrote": true`: the engine wrote into the tensor it was
handed during the call (optional; readers that predate it ignore it). The trailing `end` line carries the
counts, so a truncated or edited file is detected.

Nothing here imports torch: `weightcheck verify` reads records without it.

Why one ~750-line module: the writer and the reader of one file format belong together (the schema above is
their contract); a reader that tolerates every damaged line is most of its length.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck import safe_io
from weightcheck.digest import ALGORITHMS, HEX_LENGTH, SHA256, is_hex_digest
from weightcheck.safe_io import MAX_RECORD_BYTES, UnsafePath, confine, parse_json, read_text

# A tensor entry's `error` when the engine wrote into the tensor it was handed (through it or a view of it: its
# version counter moved) before the tap digested it: what arrived is unknown, so verify compares nothing for it
# and says so (WC746), never "bytes differ". SGLang 0.5.23's Gemma adds 1 to each norm weight it is handed.
ENGINE_WROTE_INTO_SENT = "not digested: the engine wrote into the tensor it was handed before the tap digested it"

RECORD_KIND = "weightcheck-sync-record"
# 1.1: call lines sorted by call index, param and state lines sorted by name (so that a line duplicated,
# swapped or moved breaks an order the reader checks). 1.0 records are still read: their tensor lines were
# always in `seq` order and every file in the kind order below; their call/param/state order carried nothing.
# 1.2: a `tensors` line may stand for a run of `tensor` lines (columns: one list per field, one value per tensor;
# `call` and `dtype` may be given once for all), which the tap writes for a big bucket of small tensors
# (`weightcheck.tap.columns`). It reads back as the same TensorEntry objects, so every check judges both alike.
RECORD_SCHEMA_VERSION = "1.2"
# The kinds of body lines, in the order every writer emitted them (`tensor` and `tensors` lines mix, by seq).
LINE_ORDER = {"call": 0, "tensor": 1, "tensors": 1, "param": 2, "state": 3}
# Fields of a `tensors` line that may be one value for every tensor of the line rather than a list.
_SHARED_COLUMNS = ("call", "dtype")
RECORD_SUFFIX = ".jsonl"
SYNC_DIR_RE = re.compile(r"^sync-([0-9]{1,12})$")  # ASCII and bounded: a 5,000-digit name is not a sync


class RecordError(ValueError):
    """A record file that cannot be used; the message says why."""


def sync_dir_name(seq: int) -> str:
    return f"sync-{seq:05d}"


def rank_file_stem(rank: Mapping[str, Any], host: str, pid: int) -> str:
    """`tp0-pp1-ep0.host.1234`: readable, and unique per process (several engines may share a directory)."""
    parts = [f"{key}{rank.get(f'{key}_rank', 0)}" for key in ("tp", "pp", "ep")]
    safe_host = re.sub(r"[^A-Za-z0-9_.-]", "_", host)[:64] or "host"
    return f"{'-'.join(parts)}.{safe_host}.{pid}"


def write_atomic_text(path: Path, lines: Iterable[str]) -> None:
    """Write `lines` to `path` so that a reader sees either nothing or the whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line)
                fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def encode_line(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_bytes(doc: Mapping[str, Any]) -> bytes:
    """`encode_line` as UTF-8 bytes with the newline, through orjson (a dependency; several times faster on
    the tap's many small lines). orjson writes a NaN float as null where `encode_line` refuses it: no record
    field is such a float (times and counts)."""
    dumps = _orjson_dumps()
    if dumps is None:  # pragma: no cover - orjson is a declared dependency
        return encode_line(doc).encode("utf-8") + b"\n"
    try:
        return dumps(doc, option=_APPEND_NEWLINE)
    except TypeError:  # a value orjson does not take (a subclass of str or int from an engine): the slow path
        return encode_line(doc).encode("utf-8") + b"\n"


# Where two lines meet in an orjson array of line objects whose first key is "t" (`encode_lines`).
_LINE_BOUNDARY = b'},{"t":"'


def encode_lines(docs: list[Mapping[str, Any]]) -> bytes:
    """`encode_bytes` of every doc, joined: the same bytes, made by one orjson call over the whole list.

    The list is serialized as one JSON array and cut into lines where one object ends and the next begins.
    Every doc is a line object whose first key is "t" (the tap's tensor and param lines): the sequence
    `},{"t":"` can only be such a boundary, because inside a JSON string every quote is escaped (`\\"`), so
    no `{"` occurs there. The number of boundaries found is checked against the number of docs; anything
    else (a doc without "t" first, a value orjson refuses) takes one `encode_bytes` per doc."""
    if not docs:
        return b""
    dumps = _orjson_dumps()
    if dumps is not None:
        try:
            blob = dumps(docs)
        except TypeError:
            blob = b""
        if blob[:7] == b'[{"t":"' and blob.count(_LINE_BOUNDARY) == len(docs) - 1:
            return blob[1:-1].replace(_LINE_BOUNDARY, b'}\n{"t":"') + b"\n"
    return b"".join(map(encode_bytes, docs))


_ORJSON: list[Any] = []  # [orjson.dumps or None], filled on first use (an import statement per line costs)
_APPEND_NEWLINE = 1 << 10  # orjson.OPT_APPEND_NEWLINE (checked against orjson on first use)


def orjson_writer() -> tuple[Any, int]:
    """(orjson.dumps or None without orjson, its option that appends the newline): for writers of many lines."""
    return _orjson_dumps(), _APPEND_NEWLINE


def _orjson_dumps() -> Any:
    global _APPEND_NEWLINE
    if not _ORJSON:
        try:
            import orjson
        except ImportError:  # pragma: no cover - orjson is a declared dependency
            _ORJSON.append(None)
        else:
            _APPEND_NEWLINE = orjson.OPT_APPEND_NEWLINE
            _ORJSON.append(orjson.dumps)
    return _ORJSON[0]


def write_atomic_bytes(path: Path, lines: Iterable[bytes]) -> None:
    """`write_atomic_text` for lines already encoded, each ending in a newline (`encode_bytes`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.writelines(lines)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- reading ---------------------------------------------------------------------------------------------


@dataclass
class TensorEntry:
    """One (name, tensor) the engine received."""

    seq: int
    call: int
    name: str
    dtype: str | None
    shape: tuple[int, ...] | None
    hexdigest: str | None
    algorithm: str = SHA256
    zeros: bool | None = None
    nonfinite: int | None = None
    error: str | None = None
    wrote: list[str] = field(default_factory=list)
    tensor_key: str | None = None
    # The loader was reached but the data belongs to another rank (an expert this EP rank does not hold).
    offrank: bool = False
    # The engine wrote into the tensor it was handed (its version counter moved during the call: SGLang's Gemma
    # adds 1 to each norm before loading it), so a parameter written from it need not hold what arrived.
    engine_wrote: bool = False
    # The safetensors file holding the tensor itself (`tensor_key`), when the tap kept tensors.
    tensors_path: Path | None = None

    @property
    def sha256(self) -> str | None:
        """The hex digest when the record used sha256, else None."""
        return self.hexdigest if self.algorithm == SHA256 else None

    @property
    def wrote_params(self) -> set[str]:
        """Parameter names written (shard and expert suffixes removed)."""
        return {w.split(":", 1)[0] for w in self.wrote}


@dataclass
class CallEntry:
    call: int
    names: int
    seconds: float | None = None
    error: str | None = None
    engine_warnings: list[str] = field(default_factory=list)
    unattributed_writes: int = 0


@dataclass
class ParamEntry:
    name: str
    dtype: str | None
    shape: tuple[int, ...] | None
    tracked: bool
    writes: int
    shards_expected: list[str] | None = None
    shards_written: list[str] = field(default_factory=list)
    experts_local: int | None = None
    experts_written: list[int] | None = None
    # dtypes of tensors the loaders copied into this parameter across the FP8/float line (WC745)
    cast_from: list[str] = field(default_factory=list)
    # marked optional by the engine (SGLang's `_skip_weight_check`): never written is not a finding
    optional: bool = False


@dataclass
class StateEntry:
    """One parameter or buffer of the engine's model after the sync (`WEIGHTCHECK_STATE=1`)."""

    name: str
    kind: str  # "param" | "buffer"
    sharded: bool  # split across TP/EP ranks (parallel linear, embedding, fused MoE); else replicated
    dtype: str | None
    shape: tuple[int, ...] | None
    hexdigest: str | None
    algorithm: str
    zeros: bool | None = None
    nonfinite: int | None = None
    error: str | None = None


@dataclass
class SyncRecord:
    """One rank's view of one sync."""

    path: Path
    header: dict[str, Any]
    calls: list[CallEntry]
    tensors: list[TensorEntry]
    params: dict[str, ParamEntry]
    states: dict[str, StateEntry] = field(default_factory=dict)
    # Where the tap's time went (`WEIGHTCHECK_PROFILE=1`): {"seconds": {stage: s}, "tensors": n, "bytes": b}.
    profile: dict[str, Any] | None = None

    @property
    def seq(self) -> int:
        return int(self.header["sync"]["seq"])

    @property
    def weight_version(self) -> str | None:
        version = self.header["sync"].get("weight_version")
        return str(version) if version is not None else None

    @property
    def runner(self) -> str:
        """The engine runner this record belongs to (`target`, or `draft` for a speculative MTP/NextN model in
        the same process); records without the field are the target's."""
        return str(self.header.get("runner") or "target")

    @property
    def rank(self) -> dict[str, Any]:
        return dict(self.header.get("rank") or {})

    @property
    def engine(self) -> str:
        return str(self.header.get("engine") or "engine")

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.header.get("model") or {})

    def rank_label(self) -> str:
        rank = self.rank
        parts = [
            f"{key}_rank {rank[f'{key}_rank']}"
            for key in ("tp", "pp", "ep")
            if rank.get(f"{key}_size", 1) not in (None, 1) and f"{key}_rank" in rank
        ]
        label = ", ".join(parts) or "rank 0"
        return label if self.runner == "target" else f"{self.runner} {label}"


# What one `verify` run reads (docs/security.md, memory budget): its memory grows with the records it holds,
# so thousands of sync folders or rank files must not all be loaded. Newest syncs are read first; what is
# left out is reported (never a silent truncation). A real 8-rank sync of a 92k-tensor model is ~240 MB.
MAX_RECORD_FILES = 2048
MAX_RECORDS_BYTES = 512 * 1024 * 1024

# Bounds for numbers that the verifier expands into ranges (ranks, layers, local experts).
MAX_RANKS = 1 << 20
MAX_COUNT = 1 << 20


def _int(value: Any, what: str, limit: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{what} must be an integer, got {str(value)[:40]!r}")
    if limit is not None and not 0 <= value <= limit:
        raise RecordError(f"{what} must be between 0 and {limit}, got {value}")
    return value


def _opt_str(value: Any, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{what} must be a string or null")
    return value


def _shape(value: Any, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise RecordError(f"{what} must be a list of integers")
    return tuple(value)


def _str_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordError(f"{what} must be a list of strings")
    return list(value)


def _parse_header(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("kind") != RECORD_KIND:
        raise RecordError(f"not a weightcheck sync record (kind {doc.get('kind')!r})")
    version = doc.get("schema_version")
    if not isinstance(version, str) or version.split(".")[0] != RECORD_SCHEMA_VERSION.split(".")[0]:
        raise RecordError(f"unsupported record schema_version {version!r} (this reader: {RECORD_SCHEMA_VERSION})")
    sync = doc.get("sync")
    if not isinstance(sync, dict):
        raise RecordError("header has no 'sync' object")
    _int(sync.get("seq"), "sync.seq")
    _opt_str(sync.get("weight_version"), "sync.weight_version")
    for key in ("rank", "model"):
        if doc.get(key) is not None and not isinstance(doc.get(key), dict):
            raise RecordError(f"header '{key}' must be an object")
    # Rank fields become ranges and sets downstream: integers, bounded (no engine has 2**20 ranks).
    for key, value in (doc.get("rank") or {}).items():
        if key.endswith(("_rank", "_size")) and value is not None:
            _int(value, f"rank.{key}", limit=MAX_RANKS)
    for key in ("start_layer", "end_layer", "num_hidden_layers"):
        value = (doc.get("model") or {}).get(key)
        if value is not None:
            _int(value, f"model.{key}", limit=MAX_COUNT)
    algorithm = doc.get("digest", SHA256)
    if algorithm not in ALGORITHMS:
        raise RecordError(f"unknown digest algorithm {algorithm!r} (this reader: {', '.join(ALGORITHMS)})")
    return doc


def record_algorithm(header: Mapping[str, Any]) -> str:
    """The digest algorithm of a (validated) header; records from before the choice existed are sha256."""
    return str(header.get("digest") or SHA256)


def _parse_tensor(doc: dict[str, Any], algorithm: str) -> TensorEntry:
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("tensor entry without a name")
    other = [key for key in ALGORITHMS if key != algorithm and doc.get(key) is not None]
    if other:  # a digest under another algorithm's key would be compared as if it were the header's
        raise RecordError(f"tensor {name!r}: carries a {other[0]} digest but the header says {algorithm}")
    hexdigest = doc.get(algorithm)
    if hexdigest is not None and not is_hex_digest(hexdigest, algorithm):
        raise RecordError(f"tensor {name!r}: {algorithm} must be {HEX_LENGTH[algorithm]} lowercase hex digits")
    zeros = doc.get("zeros")
    if zeros is not None and not isinstance(zeros, bool):
        raise RecordError(f"tensor {name!r}: zeros must be a boolean")
    nonfinite = doc.get("nonfinite")
    if nonfinite is not None:
        _int(nonfinite, f"tensor {name!r}: nonfinite")
    return TensorEntry(
        seq=_int(doc.get("seq"), f"tensor {name!r}: seq"),
        call=_int(doc.get("call"), f"tensor {name!r}: call"),
        name=name,
        dtype=_opt_str(doc.get("dtype"), f"tensor {name!r}: dtype"),
        shape=_shape(doc.get("shape"), f"tensor {name!r}: shape"),
        hexdigest=hexdigest,
        algorithm=algorithm,
        zeros=zeros,
        nonfinite=nonfinite,
        error=_opt_str(doc.get("error"), f"tensor {name!r}: error"),
        wrote=_str_list(doc.get("wrote"), f"tensor {name!r}: wrote"),
        tensor_key=_opt_str(doc.get("tensor_key"), f"tensor {name!r}: tensor_key"),
        offrank=bool(doc.get("offrank", False)),
        engine_wrote=doc.get("engine_wrote") is True,
    )


def _column_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A `tensors` line (schema 1.2) as the `tensor` line docs it stands for, for `_parse_tensor` to check
    each exactly as it checks a `tensor` line."""
    seqs = doc.get("seq")
    if not isinstance(seqs, list) or not seqs:
        raise RecordError("a 'tensors' line needs a non-empty 'seq' list")
    count = len(seqs)
    shared: dict[str, Any] = {"t": "tensor"}
    columns: dict[str, list[Any]] = {}
    for key, value in doc.items():
        if key == "t":
            continue
        if key in _SHARED_COLUMNS and not isinstance(value, list):
            shared[key] = value
        elif isinstance(value, list) and len(value) == count:
            columns[key] = value
        else:
            raise RecordError(f"'tensors' line: {str(key)[:40]!r} must be a list of {count} values, one per tensor")
    keys = list(columns)
    return [{**shared, **dict(zip(keys, values, strict=True))} for values in zip(*columns.values(), strict=True)]


def _parse_state(doc: dict[str, Any], algorithm: str) -> StateEntry:
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("state entry without a name")
    kind = doc.get("kind")
    if kind not in ("param", "buffer"):
        raise RecordError(f"state {name!r}: kind must be 'param' or 'buffer'")
    hexdigest = doc.get(algorithm)
    if hexdigest is not None and not is_hex_digest(hexdigest, algorithm):
        raise RecordError(f"state {name!r}: {algorithm} must be {HEX_LENGTH[algorithm]} lowercase hex digits")
    zeros = doc.get("zeros")
    nonfinite = doc.get("nonfinite")
    if nonfinite is not None:
        _int(nonfinite, f"state {name!r}: nonfinite")
    return StateEntry(
        name=name,
        kind=kind,
        sharded=bool(doc.get("sharded", False)),
        dtype=_opt_str(doc.get("dtype"), f"state {name!r}: dtype"),
        shape=_shape(doc.get("shape"), f"state {name!r}: shape"),
        hexdigest=hexdigest,
        algorithm=algorithm,
        zeros=zeros if isinstance(zeros, bool) else None,
        nonfinite=nonfinite,
        error=_opt_str(doc.get("error"), f"state {name!r}: error"),
    )


def _parse_call(doc: dict[str, Any]) -> CallEntry:
    seconds = doc.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
        raise RecordError("call seconds must be a number")
    return CallEntry(
        call=_int(doc.get("call"), "call index"),
        names=_int(doc.get("names", 0), "call names"),
        seconds=seconds,
        error=_opt_str(doc.get("error"), "call error"),
        engine_warnings=_str_list(doc.get("engine_warnings"), "call engine_warnings"),
        unattributed_writes=_int(doc.get("unattributed_writes", 0), "call unattributed_writes"),
    )


def _parse_param(doc: dict[str, Any]) -> ParamEntry:
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("param entry without a name")
    experts = doc.get("experts_written")
    if experts is not None and (
        not isinstance(experts, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in experts)
    ):
        raise RecordError(f"param {name!r}: experts_written must be a list of integers")
    expected = doc.get("shards_expected")
    local = doc.get("experts_local")
    return ParamEntry(
        name=name,
        dtype=_opt_str(doc.get("dtype"), f"param {name!r}: dtype"),
        shape=_shape(doc.get("shape"), f"param {name!r}: shape"),
        tracked=bool(doc.get("tracked", True)),
        writes=_int(doc.get("writes", 0), f"param {name!r}: writes"),
        shards_expected=None if expected is None else _str_list(expected, f"param {name!r}: shards_expected"),
        shards_written=_str_list(doc.get("shards_written"), f"param {name!r}: shards_written"),
        experts_local=None if local is None else _int(local, f"param {name!r}: experts_local", limit=MAX_COUNT),
        experts_written=experts,
        cast_from=_str_list(doc.get("cast_from"), f"param {name!r}: cast_from"),
        optional=doc.get("optional") is True,
    )


def _minor_version(header: Mapping[str, Any]) -> int:
    minor = str(header.get("schema_version", "")).split(".")[1:2]
    return int(minor[0]) if minor and minor[0].isascii() and minor[0].isdigit() and len(minor[0]) < 6 else 0


def _kind_name(order: int) -> str:
    return next(kind for kind, rank in LINE_ORDER.items() if rank == order)


def _check_name_order(name: str, last: Any, seen: Mapping[str, Any], ordered: bool, kind: str) -> None:
    """A param/state name seen twice (any schema), or out of name order (schema >= 1.1)."""
    if name in seen:
        raise RecordError(f"{kind} {name[:200]!r} appears twice (a line duplicated)")
    if ordered and last is not None and name < last:
        raise RecordError(f"{kind} {name[:200]!r} after {str(last)[:200]!r}: not in name order (a line moved)")


def read_record(path: str | os.PathLike[str]) -> SyncRecord:
    """Read and validate one record file. Raises RecordError (never a bare OSError/JSON error)."""
    target = Path(path)
    try:
        # Through the confinement layer: inside its sync folder, a regular file, bounded size.
        real = confine(target.parent, target.name, what="its sync folder")
        text = read_text(real, MAX_RECORD_BYTES, name=str(target))
    except UnsafePath as exc:
        raise RecordError(f"cannot read {target}: {exc.reason}") from None
    header: dict[str, Any] | None = None
    calls: list[CallEntry] = []
    tensors: list[TensorEntry] = []
    params: dict[str, ParamEntry] = {}
    states: dict[str, StateEntry] = {}
    end: dict[str, Any] | None = None
    ordered = False  # schema >= 1.1: calls, params and states sorted too
    columnar = False  # schema >= 1.2: `tensors` lines
    last_kind = -1
    last_key: Any = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = parse_json(line, f"line {lineno}")
        except UnsafePath as exc:
            raise RecordError(f"line {lineno} is not valid JSON: {exc.reason[:120]}") from None
        if not isinstance(doc, dict):
            raise RecordError(f"line {lineno} is not a JSON object")
        if end is not None:
            raise RecordError(f"line {lineno}: content after the 'end' line")
        kind = doc.get("t")
        try:
            if header is None:
                if kind != "header":
                    raise RecordError("the first line must be the header")
                header = _parse_header(doc)
                ordered = _minor_version(header) >= 1
                columnar = _minor_version(header) >= 2
                continue
            if kind in LINE_ORDER and LINE_ORDER[kind] < last_kind:
                raise RecordError(f"a {kind!r} line after the {_kind_name(last_kind)!r} lines (a line moved)")
            if kind in LINE_ORDER and LINE_ORDER[kind] != last_kind:
                last_kind, last_key = LINE_ORDER[kind], None
            if kind == "call":
                call = _parse_call(doc)
                # Not strictly: loads on two threads inside one sync can share a call index. A duplicated call
                # line is caught by the 'end' line's count.
                if ordered and last_key is not None and call.call < last_key:
                    raise RecordError(f"call {call.call} after call {last_key} (a line moved)")
                last_key = call.call
                calls.append(call)
            elif kind == "tensor" or (kind == "tensors" and columnar):
                algorithm = record_algorithm(header)
                for row in [doc] if kind == "tensor" else _column_rows(doc):
                    tensor = _parse_tensor(row, algorithm)
                    if last_key is not None and tensor.seq <= last_key:
                        raise RecordError(f"tensor seq {tensor.seq} after seq {last_key} (a line duplicated or moved)")
                    last_key = tensor.seq
                    tensors.append(tensor)
            elif kind == "param":
                entry = _parse_param(doc)
                _check_name_order(entry.name, last_key, params, ordered, "param")
                last_key = entry.name
                params[entry.name] = entry
            elif kind == "state":
                algorithm = header.get("state_digest")
                if algorithm not in ALGORITHMS:
                    raise RecordError(f"state lines need a known header 'state_digest', got {algorithm!r}")
                state = _parse_state(doc, algorithm)
                _check_name_order(state.name, last_key, states, ordered, "state")
                last_key = state.name
                states[state.name] = state
            elif kind == "end":
                end = doc
            else:
                raise RecordError(f"unknown line type {kind!r}")
        except RecordError as exc:
            raise RecordError(f"line {lineno}: {exc}") from None
    if header is None:
        raise RecordError("empty record (no header line)")
    tensors_file = header.get("tensors_file")
    if isinstance(tensors_file, str) and tensors_file:
        if "/" in tensors_file or "\\" in tensors_file or tensors_file.startswith("."):
            raise RecordError(f"tensors_file {tensors_file!r} must be a file name next to the record")
        for entry in tensors:
            if entry.tensor_key is not None:
                entry.tensors_path = target.parent / tensors_file
    if end is None:
        raise RecordError("no 'end' line: the record is truncated")
    counts = {"calls": len(calls), "tensors": len(tensors), "params": len(params)}
    if states or "states" in end:
        counts["states"] = len(states)
    for key, count in counts.items():
        if end.get(key) != count:
            raise RecordError(f"'end' line says {end.get(key)!r} {key} but the file holds {count}")
    record = SyncRecord(path=target, header=header, calls=calls, tensors=tensors, params=params, states=states)
    record.profile = _parse_profile(end.get("profile"))
    return record


def _parse_profile(value: Any) -> dict[str, Any] | None:
    """The end line's `profile`, or None when absent or malformed (it is information, never a verdict)."""
    if not isinstance(value, dict) or not isinstance(value.get("seconds"), dict):
        return None
    seconds = {
        str(stage)[:40]: float(v)
        for stage, v in list(value["seconds"].items())[:16]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e9
    }
    counts = {
        key: int(value[key])
        for key in ("tensors", "bytes")
        if isinstance(value.get(key), int) and not isinstance(value.get(key), bool) and value[key] >= 0
    }
    return {"seconds": seconds, **counts}


def profile_notes(records: Iterable[SyncRecord]) -> list[str]:
    """One line per sync whose records carry a tap profile: the stages' seconds summed over its ranks."""
    by_sync: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if record.profile is not None:
            by_sync.setdefault(record.seq, []).append(record.profile)
    notes: list[str] = []
    for seq in sorted(by_sync):
        profiles = by_sync[seq]
        totals: dict[str, float] = {}
        for profile in profiles:
            for stage, seconds in profile["seconds"].items():
                totals[stage] = totals.get(stage, 0.0) + seconds
        tensors = sum(p.get("tensors", 0) for p in profiles)
        size = sum(p.get("bytes", 0) for p in profiles)
        stages = ", ".join(f"{stage} {seconds:.3f}s" for stage, seconds in totals.items())
        per_tensor = sum(totals.values()) / tensors * 1e6 if tensors else 0.0
        notes.append(
            f"tap profile, sync {seq} ({len(profiles)} record(s), {tensors} tensors, {size / 1e6:.1f} MB): {stages}"
            f" (thread seconds; {per_tensor:.1f} µs per tensor)"
        )
    return notes


def find_record_files(root: str | os.PathLike[str]) -> dict[int, list[Path]]:
    """`{sync seq: [record files]}` under a records directory (or a single sync directory or file)."""
    return scan_records(root)[0]


def scan_records(root: str | os.PathLike[str]) -> tuple[dict[int, list[Path]], list[UnsafePath]]:
    """`find_record_files` plus what was refused: sync folders that are symlinks leaving the records folder
    (or loops). Every `*.jsonl` entry of a sync folder is listed whatever its type, so that a FIFO, a loop
    or an escaping symlink is refused by `read_record` (a finding) instead of skipped silently."""
    base = Path(root)
    out: dict[int, list[Path]] = {}
    refused: list[UnsafePath] = []
    if not base.is_dir():
        return ({-1: [base]} if os.path.lexists(base) else out), refused
    match = SYNC_DIR_RE.match(base.name)
    if match:
        return {int(match.group(1)): _record_entries(base)}, refused
    bases = safe_io.allowed_bases(base)
    for name in sorted(os.listdir(base)):
        match = SYNC_DIR_RE.match(name)
        if not match:
            continue
        try:
            child = safe_io.is_dir_inside(base, name, bases=bases, what="the records folder")
        except UnsafePath as exc:
            if exc.kind != "not-regular":  # a plain file named like a sync folder is not ours to judge
                refused.append(exc)
            continue
        files = _record_entries(base / name, real=child)
        if files:
            out[int(match.group(1))] = files
    return out, refused


def _record_entries(folder: Path, real: Path | None = None) -> list[Path]:
    try:
        names = os.listdir(real or folder)
    except OSError:
        return []
    return sorted(folder / n for n in names if n.endswith(RECORD_SUFFIX) and not n.startswith("."))


def bound_record_files(files: Mapping[int, list[Path]]) -> tuple[dict[int, list[Path]], str | None]:
    """The record files one verify run reads: the newest syncs first, until MAX_RECORD_FILES files or
    MAX_RECORDS_BYTES bytes. Returns them (oldest sync first, as `scan_records` orders them) and, when some
    were left out, a message saying which."""
    kept: dict[int, list[Path]] = {}
    count = size = 0
    left: list[int] = []
    left_files = 0
    for seq in sorted(files, reverse=True):
        paths = files[seq]
        if left:
            left.append(seq)
            left_files += len(paths)
            continue
        for i, path in enumerate(paths):
            try:
                nbytes = os.lstat(path).st_size  # not followed: read_record confines and caps each file
            except OSError:
                nbytes = 0
            if count + 1 > MAX_RECORD_FILES or size + nbytes > MAX_RECORDS_BYTES:
                left.append(seq)
                left_files += len(paths) - i
                break
            kept.setdefault(seq, []).append(path)
            count += 1
            size += nbytes
    if not left:
        return dict(sorted(kept.items())), None
    message = (
        f"{left_files} record files of {len(left)} sync folder(s) (sync {min(left)} to {max(left)}) not read: "
        f"one verify run reads at most {MAX_RECORD_FILES} record files and {MAX_RECORDS_BYTES >> 20} MB of "
        f"records, newest syncs first; move older sync folders out of the records folder to check them"
    )
    return dict(sorted(kept.items())), message
