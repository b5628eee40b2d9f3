"""Engine-side coverage: which parameters received data during one `load_weights` call, and from which
incoming tensor.

SGLang writes every parameter through a loader it looks up on the parameter itself:
`getattr(param, "weight_loader", default_weight_loader)`, or the read-only `weight_loader` property of
`BasevLLMParameter` backed by `_weight_loader`. For the duration of one call the tap replaces that attribute
with a recording wrapper and restores it afterwards. Version counters cannot replace this: the loaders write
through `param.data`, whose version counter is not the parameter's (`param.data.copy_(x)` leaves
`param._version` unchanged).

A write is attributed to the incoming tensor whose memory holds the `loaded_weight` the loader received
(loaders pass the incoming tensor or a view of it: a TP narrow, a transpose). Loaders that build a new
tensor (DeepSeek concatenates `q_a_proj` and `kv_a_proj_with_mqa` before writing the fused parameter) are
matched by value against the recent incoming tensors. A loader that writes from a thread pool (DeepSeek on
host tensors: `maybe_executor_submit`) can run a write hundreds of incoming tensors after its sources
arrived; an incoming tensor that leaves the recent window unattributed keeps a small fingerprint (shape and
the first/last elements of its first/last row), and such late writes are matched against those, whole or
as a two-part concatenation, only when exactly one candidate fits. As a last resort a write made on the
thread that consumes the stream is credited to the name it consumed last (single-threaded loaders write the
name they just received).

Parameters without a loader attribute are wrapped with the engine's default loader only when no module of
the model class compares a loader with `is default_weight_loader` (SGLang's inkling model does: a wrapper
would change its behaviour); otherwise their coverage is recorded as untracked, never as "not written".

Why one ~1,200-line module: it runs inside the engine's `load_weights` on every tensor, so the attribution
structures (address ranges, recent window, batched filing) stay together where their invariants can be read
at once; tests/test_tap_cost.py and test_tap_fingerprints.py pin them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import re
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

from weightcheck.gcpause import GCPaused
from weightcheck.posmix import torch_module
from weightcheck.tap.wrapplan import MISSING, WrapPlan

if TYPE_CHECKING:
    import torch

# Attribute the tap sets on its wrappers, pointing at the loader it wraps (never wrap a wrapper).
WRAPPED_ORIGINAL = "__weightcheck_original__"
# Incoming tensors kept for value matching of loader-built tensors (a fused pair arrives back to back).
_RECENT_FOR_VALUE_MATCH = 64
# Incoming tensors at most this big wait in a queue before being indexed (`CallCoverage.note_incoming`).
_PENDING_TENSOR_BYTES = 1 << 18
# At most this many `name:shard:expert` labels are listed per incoming tensor.
_MAX_WROTE_LABELS = 32
# Elements kept from each end of an evicted, unattributed incoming tensor, and at most this many fingerprints
# per call (a PP stage skips half the stream: each skipped tensor leaves one).
_FINGERPRINT_ELEMENTS = 8
_MAX_FINGERPRINTS = 65536
# Unattributed tensors leaving the recent window are fingerprinted lazily: only when a late write needs them,
# or when more than this many (or bytes) wait (they are the sender's tensors: kept alive only that long).
_MAX_EVICTED = 1024
_MAX_EVICTED_BYTES = 64 << 20
# Weight dtypes of the two classes a loader must never cross by a plain copy: FP8 codes mean nothing without
# their scale, and a float written into an FP8 parameter is cast without one. (E8M0 is a scale format: left out.)
_FP8_WEIGHT_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
_FLOAT_DTYPES = frozenset({"BF16", "F16", "F32", "F64"})
_IDENTITY_CHECK = re.compile(r"\bis\s+(?:not\s+)?default_weight_loader\b|==\s*default_weight_loader\b")


_NBYTES = operator.attrgetter("nbytes")
_DTYPE_OF = operator.attrgetter("dtype")
_WRITES = operator.attrgetter("writes")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_NONE: frozenset[Any] = frozenset()  # the sets below until their first element (no allocation per parameter)


@dataclass(slots=True)
class ParamCoverage:
    """What one parameter received during a sync (accumulated over its load_weights calls). Built for every
    parameter at every sync: slotted, its sets made on first use (`_add`)."""

    dtype: str
    shape: tuple[int, ...]
    tracked: bool
    writes: int = 0
    shards_expected: list[str] | None = None
    shards_written: set[str] | frozenset[str] = _NONE
    experts_local: int | None = None
    experts_written: set[int] | frozenset[int] = _NONE
    # dtypes of loaded tensors that crossed the FP8/float line on their way into this parameter
    cast_from: set[str] | frozenset[str] = _NONE
    # The engine marks it optional (SGLang's `_skip_weight_check`: KV-cache `k_scale`/`v_scale`, which a
    # checkpoint may or may not carry and which default to 1.0): never written is not a finding.
    optional: bool = False

    def as_line(self, name: str) -> dict[str, Any]:
        line = {
            "t": "param",
            "name": name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "tracked": self.tracked,
            "writes": self.writes,
            "shards_expected": self.shards_expected,
            "shards_written": sorted(self.shards_written),
            "experts_local": self.experts_local,
            "experts_written": sorted(self.experts_written) if self.experts_local is not None else None,
        }
        if self.cast_from:  # only when it happened: records of unquantized engines keep their shape
            line["cast_from"] = sorted(self.cast_from)
        if self.optional:
            line["optional"] = True
        return line


# The last sync's parameter names and their sorted order: a steady sync has the same names in the same order
# (one list comparison instead of a sort of tens of thousands of strings).
_SORTED_NAMES: list[list[str]] = [[], []]


def param_lines(params: dict[str, ParamCoverage]) -> list[dict[str, Any]]:
    """`as_line` of every parameter, in name order (the record's order), built inline for the common
    parameter (no cast, not optional): the same lines, at about half the cost of one `as_line` call each."""
    names = list(params)
    if names == _SORTED_NAMES[0]:
        order = _SORTED_NAMES[1]
    else:
        order = sorted(names)
        _SORTED_NAMES[:] = [names, order]
    return [
        {
            "t": "param",
            "name": name,
            "dtype": c.dtype,
            "shape": list(c.shape),
            "tracked": c.tracked,
            "writes": c.writes,
            "shards_expected": c.shards_expected,
            "shards_written": sorted(c.shards_written) if c.shards_written else [],
            "experts_local": c.experts_local,
            "experts_written": sorted(c.experts_written) if c.experts_local is not None else None,
        }
        if not (c.cast_from or c.optional)
        else c.as_line(name)
        for name, c in zip(order, map(params.__getitem__, order), strict=True)
    ]


# Every field a param line is made of (all of `ParamCoverage`'s), read in one C call per parameter.
_LINE_STATE = operator.attrgetter(
    "dtype",
    "shape",
    "tracked",
    "writes",
    "shards_expected",
    "shards_written",
    "experts_local",
    "experts_written",
    "cast_from",
    "optional",
)
# name -> (the fields its line was made of, the encoded line): a steady sync writes the same param lines again.
_LINE_BYTES: dict[str, tuple[tuple[Any, ...], bytes]] = {}
_MAX_CACHED_LINES = 1 << 20
# The last body written: (its name order, as `_SORTED_NAMES` keeps it, the fields of every line, the bytes). A
# steady sync's lines are all the same as the last sync's: one comparison of the fields, no per-name lookup.
_LAST_BODY: list[Any] = [None, None, b""]


def param_line_bytes(params: dict[str, ParamCoverage], encode: Callable[[dict[str, Any]], bytes]) -> bytes:
    """The encoded param lines (`encode` of each `param_lines` line), in name order. A line is a function of
    the parameter's name and its coverage's fields, so a parameter whose fields equal those its cached line
    was made of at an earlier sync reuses that line's bytes; the others are encoded (and cached)."""
    names = list(params)
    if names == _SORTED_NAMES[0]:
        order = _SORTED_NAMES[1]
    else:
        order = sorted(names)
        _SORTED_NAMES[:] = [names, order]
    coverages = list(map(params.__getitem__, order))
    states = list(map(_LINE_STATE, coverages))
    last_order, last_states, last_blob = _LAST_BODY
    if order is last_order and states == last_states:  # the steady sync: the same names, every line as last time
        return last_blob
    cache = _LINE_BYTES
    if len(cache) > _MAX_CACHED_LINES:
        cache.clear()
    known = list(map(cache.get, order))
    if None not in known and list(map(_FIRST, known)) == states:
        blob = b"".join(map(_SECOND, known))
        _LAST_BODY[:] = [order, states, blob]
        return blob
    out: list[bytes] = []
    for name, state, coverage, hit in zip(order, states, coverages, known, strict=True):
        if hit is not None and hit[0] == state:
            out.append(hit[1])
        else:
            line = encode(coverage.as_line(name))
            cache[name] = (state, line)
            out.append(line)
    blob = b"".join(out)
    _LAST_BODY[:] = [order, states, blob]
    return blob


def _add(values: set[Any] | frozenset[Any], value: Any) -> set[Any]:
    """`values` with `value` added: a new set the first time (`_NONE`), else the same set."""
    if not isinstance(values, set):
        values = set(values)
    values.add(value)
    return values


def crosses_quantization(loaded_dtype: str | None, param_dtype: str) -> bool:
    """True when a plain copy of `loaded_dtype` into a `param_dtype` parameter reinterprets quantized data:
    FP8 codes into a float parameter (the scale is lost) or a float into an FP8 parameter (no scale at all)."""
    if loaded_dtype is None:
        return False
    return (loaded_dtype in _FP8_WEIGHT_DTYPES and param_dtype in _FLOAT_DTYPES) or (
        loaded_dtype in _FLOAT_DTYPES and param_dtype in _FP8_WEIGHT_DTYPES
    )


@dataclass(frozen=True)
class Fingerprint:
    """Enough of a tensor to recognise it, or the two ends of a concatenation of it, without keeping it."""

    shape: tuple[int, ...]
    head: tuple[float, ...]  # first elements of the first row (a row: all leading indices 0)
    tail: tuple[float, ...]  # last elements of the last row

    def prefix_of(self, other: Fingerprint) -> bool:
        return bool(self.head) and other.head[: len(self.head)] == self.head

    def suffix_of(self, other: Fingerprint) -> bool:
        return bool(self.tail) and other.tail[-len(self.tail) :] == self.tail


def fingerprint(tensor: Any) -> Fingerprint | None:
    """The tensor's fingerprint; reads 2 x 8 elements (no copy of the tensor, whatever its strides)."""
    import torch

    try:
        if tensor.numel() == 0:
            return None
        if tensor.dim() == 0:
            value = tuple(tensor.reshape(1).to(torch.float64).tolist())
            return Fingerprint((), value, value)
        first_row = tensor[(0,) * (tensor.dim() - 1)]
        last_row = tensor[(-1,) * (tensor.dim() - 1)]
        head = first_row[:_FINGERPRINT_ELEMENTS].to(torch.float64).tolist()
        tail = last_row[-_FINGERPRINT_ELEMENTS:].to(torch.float64).tolist()
        return Fingerprint(tuple(tensor.shape), tuple(head), tuple(tail))
    except (RuntimeError, TypeError, NotImplementedError, IndexError):
        return None


def fingerprints(tensors: list[tuple[int, Any]]) -> dict[int, Fingerprint]:
    """`fingerprint` of many tensors: {key: fingerprint} for those that have one. Contiguous CPU tensors of
    one dtype are read together (one strided view each holds both ends; one conversion for the lot), which
    is what a pipeline stage skipping half the stream needs (one fingerprint per skipped tensor)."""
    import torch

    out: dict[int, Fingerprint] = {}
    groups: dict[tuple[Any, int], list[tuple[int, Any, Any]]] = {}
    for key, tensor in tensors:
        try:
            simple = (
                type(tensor) is torch.Tensor
                and tensor.device.type == "cpu"
                and tensor.dim() >= 1
                and tensor.numel() > 0
                and tensor.is_contiguous()
                and not (tensor.is_conj() or tensor.is_neg())
            )
            if simple:
                numel = tensor.numel()
                width = min(_FINGERPRINT_ELEMENTS, tensor.shape[-1])
                ends = tensor.as_strided((2, width), (numel - width, 1), tensor.storage_offset())
                groups.setdefault((tensor.dtype, width), []).append((key, tuple(tensor.shape), ends))
                continue
        except (RuntimeError, TypeError, NotImplementedError, IndexError):
            pass
        found = fingerprint(tensor)
        if found is not None:
            out[key] = found
    for members in groups.values():
        try:
            values = torch.stack([ends for _, _, ends in members]).to(torch.float64).tolist()
        except (RuntimeError, TypeError, NotImplementedError):
            continue
        for (key, shape, _), (head, tail) in zip(members, values, strict=True):
            out[key] = Fingerprint(shape, tuple(head), tuple(tail))
    return out


def match_fingerprints(target: Fingerprint, candidates: dict[int, Fingerprint]) -> list[int]:
    """The one candidate equal to `target`, or the one pair whose concatenation along one dimension it is
    (first part's head, last part's tail, sizes adding up); [] when none or more than one fits."""
    whole = [seq for seq, fp in candidates.items() if fp == target]
    if whole:
        return whole if len(whole) == 1 else []
    rank = len(target.shape)
    for dim in range(rank):

        def fits(fp: Fingerprint, dim: int = dim) -> bool:
            return (
                len(fp.shape) == rank
                and fp.shape[dim] < target.shape[dim]
                and all(fp.shape[d] == target.shape[d] for d in range(rank) if d != dim)
            )

        firsts = [(seq, fp) for seq, fp in candidates.items() if fits(fp) and fp.prefix_of(target)]
        lasts = [(seq, fp) for seq, fp in candidates.items() if fits(fp) and fp.suffix_of(target)]
        pairs = [
            (a, b)
            for a, first in firsts
            for b, last in lasts
            if a != b and first.shape[dim] + last.shape[dim] == target.shape[dim]
        ]
        if len(pairs) == 1:
            return list(pairs[0])
    return []


@functools.lru_cache(maxsize=512)
def _argument_positions(function: Callable[..., Any]) -> tuple[int | None, int | None]:
    """Positions of `shard_id` and `expert_id` in a loader's call (after `self` for bound methods)."""
    try:
        params = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None, None
    if params and params[0] == "self":
        params = params[1:]

    def position(*names: str) -> int | None:
        return next((params.index(name) for name in names if name in params), None)

    return position("shard_id", "loaded_shard_id"), position("expert_id")


def _loader_argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, position: int | None) -> Any:
    if name in kwargs:
        return kwargs[name]
    if position is not None and position < len(args):
        return args[position]
    return None


def _class_names(obj: object) -> set[str]:
    return {klass.__name__ for klass in type(obj).__mro__}


def expected_shards(param_name: str, module: object | None) -> list[str] | None:
    """The shard ids a stacked or expert parameter needs before it is whole, or None when it is not stacked."""
    if module is None:
        return None
    names = _class_names(module)
    if "QKVParallelLinear" in names:
        return ["k", "q", "v"]
    if "MergedColumnParallelLinear" in names:
        sizes = getattr(module, "output_sizes", None)
        return [str(i) for i in range(len(sizes))] if isinstance(sizes, (list, tuple)) and len(sizes) > 1 else None
    if hasattr(module, "_map_global_expert_id_to_local_expert_id"):
        leaf = param_name.rsplit(".", 1)[-1]
        if leaf.startswith("w13_"):
            return ["w1", "w3"]
        if leaf.startswith("w2_"):
            return ["w2"]
    return None


@functools.lru_cache(maxsize=256)
def class_compares_default_loader(klass: type) -> bool:
    """True when a module defining the model class (or a base) tests a loader's identity against the default."""
    for base in klass.__mro__:
        module = sys.modules.get(base.__module__)
        if module is None or base.__module__ in ("builtins", "torch.nn.modules.module"):
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        if _IDENTITY_CHECK.search(source):
            return True
    return False


class CallCoverage:
    """Coverage bookkeeping for one `load_weights` call; thread-safe (DeepSeek loads in a thread pool)."""

    def __init__(
        self,
        entries: dict[int, dict[str, Any]],
        params: dict[str, ParamCoverage],
        default_loader: Callable[..., Any] | None,
    ) -> None:
        self._lock = threading.Lock()
        self._entries = entries
        self._params = params
        self._default_loader = default_loader
        # device -> storage address -> (start, end, seq) of the one incoming tensor in that storage, or a list
        # of them (several views of one buffer): nested, not keyed by (device, address), and a bare tuple in the
        # common case, so that filing a small tensor allocates one tuple (the cyclic GC stops tracking it).
        self._ranges: dict[Any, dict[int, tuple[int, int, int] | list[tuple[int, int, int]]]] = {}
        self._recent: deque[tuple[int, torch.Tensor]] = deque()
        self._fingerprints: dict[int, Fingerprint] = {}
        self._attributed: set[int] = set()
        self._evicted: deque[tuple[int, torch.Tensor]] = deque()
        self._evicted_bytes = 0
        self._wrapping: ModelWrapping | None = None
        self._owned: ModelWrapping | None = None
        self._last: Any = None  # the latest incoming tensor
        # Small incoming tensors not yet indexed (address range, recent window): most writes are of the tensor
        # just received (`_last`) and need no index, so indexing waits until a lookup needs it or this fills.
        self._pending: list[int] = []
        self._pending_tensors: list[Any] = []
        self._consumer = threading.get_ident()
        self.current_seq: int | None = None
        self.unattributed_writes = 0
        # The bucket: small CPU tensors the stream handed on (`_Call`'s fast path appends them here, under the
        # lock, and does nothing else per tensor), and the writes of the tensor just received, logged as
        # tuples. `drain` turns them into what `note_incoming` and `record_write` would have made one by one:
        # first `on_drain` (the caller's entries and digests), then the logged writes in order, then the
        # filing. Any other write or incoming tensor drains first, so every lookup sees what it saw before.
        self.bucket_seqs: list[int] = []
        self.bucket_names: list[Any] = []
        self.bucket_tensors: list[Any] = []
        self.bucket_bytes = 0
        self.last_in_bucket = False  # `_last` is the bucket's newest tensor (its writes may be logged)
        self._logged: list[tuple[Any, ...]] = []
        # The plain writes logged since the last other one, as two lists (seq, parameter name), not a tuple
        # each: the common bucket (one plain write per tensor) is then checked by one list comparison, and
        # its writes leave nothing for the cyclic GC to track. `_logged_in_order` merges them when needed.
        self._plain_seqs: list[int] = []
        self._plain_names: list[str] = []
        self.on_drain: Callable[[list[int], list[Any], list[Any], int, list[str] | None], None] | None = None
        # `WEIGHTCHECK_PROFILE`: called with None as a drain starts (returns a token) and with that token when it
        # ends, so that the drain's work (the hook's deferred bookkeeping) is counted where it is done.
        self.drain_timer: Callable[[Any], Any] | None = None

    # ---- incoming tensors ---------------------------------------------------------------------------------
    def note_incoming(self, seq: int, tensor: torch.Tensor, nbytes: int | None = None) -> None:
        """Remember where an incoming tensor lives so that loader writes can be traced back to it.

        A small tensor (`nbytes` at most `_PENDING_TENSOR_BYTES`) is only queued: `_index_pending` files it
        (address range, recent window, eviction) in arrival order when a lookup needs it or the queue is full,
        which gives the same window and the same matches as filing it now, at a fraction of the per-tensor
        cost (the common write, of the tensor just received, needs no lookup)."""
        with self._lock:
            self._drain_locked()
            self.last_in_bucket = False
            self.current_seq = seq
            self._last = tensor
            pending = self._pending
            pending.append(seq)
            self._pending_tensors.append(tensor)
            if nbytes is None or nbytes > _PENDING_TENSOR_BYTES or len(pending) >= _RECENT_FOR_VALUE_MATCH:
                self._index_pending()

    def drain(self) -> None:
        """Process the bucket and the logged writes (see `__init__`)."""
        with self._lock:
            self._drain_locked()

    def _logged_in_order(self) -> list[tuple[Any, ...]]:
        """Every logged write in order, the plain ones as (seq, name) tuples; the plain lists emptied."""
        logged = self._logged
        if self._plain_seqs:
            logged.extend(zip(self._plain_seqs, self._plain_names, strict=True))
            self._plain_seqs, self._plain_names = [], []
        return logged

    def _drain_locked(self) -> None:
        seqs, logged, plain_seqs = self.bucket_seqs, self._logged, self._plain_seqs
        if not seqs and not logged and not plain_seqs:
            return
        names, tensors, nbytes = self.bucket_names, self.bucket_tensors, self.bucket_bytes
        self.bucket_seqs, self.bucket_names, self.bucket_tensors, self.bucket_bytes = [], [], [], 0
        wrote: list[str] | None = None
        if not logged and plain_seqs == seqs and seqs:
            # The common bucket: each tensor written once, by a plain loader, as it came. (Checked before
            # `_logged_in_order` makes a tuple per write.)
            wrote = self._plain_names if _one_dtype(tensors) else None
        if wrote is not None:
            self._plain_seqs, self._plain_names = [], []
        else:
            logged = self._logged_in_order()
        self._logged = []
        self.last_in_bucket = False
        timer = self.drain_timer
        token = timer(None) if timer is not None else None
        with GCPaused():
            # The common bucket: each tensor written once, by a plain loader, as it came (one dtype). Its entries
            # are made with their `wrote` label, and the writes credited in one pass.
            if wrote is None:
                wrote = self._one_plain_write_each(logged, seqs, tensors)
            if seqs and self.on_drain is not None:
                self.on_drain(seqs, names, tensors, nbytes, wrote)
            if wrote is not None:
                self._credit_plain(seqs, wrote, tensors[0].dtype)
            elif logged:
                self._apply_logged(logged, seqs, tensors)
            if seqs:
                self._index_pending()  # (older small tensors that came through `note_incoming`)
                if not self._file_bulk(seqs, tensors):
                    self._file(seqs, tensors)
        if timer is not None:
            timer(token)

    @staticmethod
    def _one_plain_write_each(logged: list[tuple[Any, ...]], seqs: list[int], tensors: list[Any]) -> list[str] | None:
        """The parameter names written, in bucket order, when the logged writes are one plain write of each bucket
        tensor, in order, and the tensors have one dtype; else None."""
        if not seqs or len(logged) != len(seqs) or set(map(len, logged)) != {2}:
            return None
        if list(map(_FIRST, logged)) != seqs or not _one_dtype(tensors):
            return None
        return list(map(_SECOND, logged))

    def _credit_plain(self, seqs: list[int], wrote: list[str], dtype: Any) -> None:
        """`_apply_logged` for `_one_plain_write_each`'s case (the entries already carry their label)."""
        self._attributed.update(seqs)
        loaded = _DTYPE_NAMES.get(dtype) or _dtype_name(dtype)
        coverages = list(map(self._params.get, wrote))
        # A name the engine's parameters do not have (a loader of its own making). (By identity: `None in` would
        # call the dataclass's `__eq__` once per parameter.)
        if not all(map(operator.is_not, coverages, repeat(None))):
            coverages = [coverage for coverage in coverages if coverage is not None]
        # `writes += 1` for each, with C-level maps (lazy: a parameter written twice is counted twice).
        deque(map(setattr, coverages, repeat("writes"), map(operator.add, map(_WRITES, coverages), repeat(1))), 0)
        for param_dtype in set(map(_DTYPE_OF, coverages)) - {loaded}:
            if crosses_quantization(loaded, param_dtype):
                for coverage in coverages:
                    if coverage.dtype == param_dtype:
                        coverage.cast_from = _add(coverage.cast_from, str(loaded))

    def _apply_logged(self, logged: list[tuple[Any, ...]], seqs: list[int], tensors: list[Any]) -> None:
        """The logged writes, each as `record_plain_write` / `record_write` would have recorded it then (each
        wrote the bucket tensor of its seq: the loader got the very object)."""
        first = seqs[0]
        contiguous = seqs[-1] - first == len(seqs) - 1
        by_seq = None if contiguous else dict(zip(seqs, tensors, strict=True))
        entries, params, attributed = self._entries, self._params, self._attributed
        for write in logged:
            seq = write[0]
            tensor = tensors[seq - first] if by_seq is None else by_seq[seq]
            if len(write) == 2:
                param_name = write[1]
                attributed.add(seq)
                entry = entries.get(seq)
                if entry is not None:
                    wrote = entry.get("wrote") or ()
                    if param_name not in wrote and len(wrote) < _MAX_WROTE_LABELS:
                        entry["wrote"] = (*wrote, param_name)
                coverage = params.get(param_name)
                if coverage is not None:
                    coverage.writes += 1
                    dtype = _DTYPE_NAMES.get(tensor.dtype) or _dtype_name(tensor.dtype)
                    if dtype != coverage.dtype and crosses_quantization(dtype, coverage.dtype):
                        coverage.cast_from = _add(coverage.cast_from, str(dtype))
            else:
                self._credit([seq], write[1], tensor, *write[2:])

    def _index_pending(self) -> None:
        """File the queued incoming tensors, oldest first (the caller holds the lock)."""
        pending, tensors = self._pending, self._pending_tensors
        if not pending:
            return
        self._pending, self._pending_tensors = [], []
        with GCPaused():
            self._file(pending, tensors)

    def _file_bulk(self, seqs: list[int], tensors: list[Any]) -> bool:
        """`_file` of bucket tensors (CPU, exactly `torch.Tensor`) in the common case, with C-level maps instead
        of a loop: every tensor contiguous, in a storage of its own that no filed range shares, and every
        tensor leaving the recent window already attributed (nothing to fingerprint). False, having changed
        nothing, when that is not so: `_file` then does it one tensor at a time."""
        tensor_type = torch_module().Tensor
        count = len(seqs)
        try:
            if not all(map(tensor_type.is_contiguous, tensors)):
                return False
            starts = list(map(tensor_type.data_ptr, tensors))
            sizes = map(tensor_type.element_size, tensors)
            offsets = map(operator.mul, map(tensor_type.storage_offset, tensors), sizes)
            keys = list(map(operator.sub, starts, offsets))  # the storage's address, as `untyped_storage()` gives
            ends = list(map(operator.add, starts, map(_NBYTES, tensors)))
        except (RuntimeError, TypeError, NotImplementedError, AttributeError):
            return False
        by_address = self._ranges.get(-1)
        if by_address is None:
            by_address = self._ranges[-1] = {}
        if len(set(keys)) != count or not by_address.keys().isdisjoint(keys):
            return False
        recent, attributed = self._recent, self._attributed
        overflow = len(recent) + count - _RECENT_FOR_VALUE_MATCH
        leaving_old = min(max(overflow, 0), len(recent))
        leaving_new = max(overflow, 0) - leaving_old
        if any(recent[i][0] not in attributed for i in range(leaving_old)) or not attributed.issuperset(
            seqs[:leaving_new]
        ):
            return False
        by_address.update(zip(keys, zip(starts, ends, seqs, strict=True), strict=True))
        for _ in range(leaving_old):
            recent.popleft()
        recent.extend(zip(seqs[leaving_new:], tensors[leaving_new:], strict=True))
        return True

    def _file(self, pending: list[int], tensors: list[Any]) -> None:
        """`note_incoming`'s filing, for each queued tensor in arrival order."""
        ranges_by_device = self._ranges
        recent = self._recent
        attributed = self._attributed
        for seq, tensor in zip(pending, tensors, strict=True):
            try:
                device = -1 if tensor.is_cpu else tensor.device  # (-1: CPU, without a torch.device per tensor)
                key = tensor.untyped_storage().data_ptr()
                start = tensor.data_ptr()
                if tensor.is_contiguous():
                    end = start + tensor.nbytes
                elif tensor.numel() == 0:
                    end = start
                else:
                    span = sum(
                        (dim - 1) * abs(stride) for dim, stride in zip(tensor.shape, tensor.stride(), strict=True)
                    )
                    end = start + (span + 1) * tensor.element_size()
            except (RuntimeError, TypeError, NotImplementedError):  # storage-less tensors (meta, some subclasses)
                continue
            by_address = ranges_by_device.get(device)
            if by_address is None:
                by_address = ranges_by_device[device] = {}
            ranges = by_address.get(key)
            if ranges is None:
                by_address[key] = (start, end, seq)
            elif type(ranges) is tuple:
                by_address[key] = [ranges, (start, end, seq)]
            else:
                ranges.append((start, end, seq))
            if len(recent) >= _RECENT_FOR_VALUE_MATCH:
                old_seq, old_tensor = recent.popleft()
                if old_seq not in attributed:
                    self._evicted.append((old_seq, old_tensor))
                    self._evicted_bytes += _nbytes(old_tensor)
                    if len(self._evicted) > _MAX_EVICTED or self._evicted_bytes > _MAX_EVICTED_BYTES:
                        self._fingerprint_evicted(keep=_MAX_EVICTED // 2)
            recent.append((seq, tensor))

    def _fingerprint_evicted(self, keep: int = 0) -> None:
        """Fingerprint the waiting evicted tensors (all but the newest `keep`) and let them go."""
        batch: list[tuple[int, torch.Tensor]] = []
        while len(self._evicted) > keep or (self._evicted and self._evicted_bytes > _MAX_EVICTED_BYTES // 2):
            old_seq, old_tensor = self._evicted.popleft()
            self._evicted_bytes -= _nbytes(old_tensor)
            if old_seq not in self._attributed and len(self._fingerprints) + len(batch) < _MAX_FINGERPRINTS:
                batch.append((old_seq, old_tensor))
        self._fingerprints.update(fingerprints(batch))

    def _by_memory(self, loaded: torch.Tensor) -> int | None:
        try:
            device = -1 if loaded.is_cpu else loaded.device  # (as `_file` keys them)
            key = loaded.untyped_storage().data_ptr()
            pointer = loaded.data_ptr()
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        found = self._ranges.get(device, {}).get(key, ())
        # Latest first: a freed incoming tensor's memory may be reused by a later one.
        for start, end, seq in reversed(found) if type(found) is list else (found,) if found else ():
            if start <= pointer < end or (start == end == pointer):
                return seq
        return None

    def _by_value(self, loaded: torch.Tensor) -> list[int]:
        """Incoming tensors that `loaded` holds, whole or as the first/last block of a concatenation."""
        import torch

        found: list[int] = []
        for seq, candidate in reversed(self._recent):
            if seq in self._attributed or candidate.dim() != loaded.dim() or candidate.numel() == 0:
                continue
            try:
                probe = candidate if candidate.dtype == loaded.dtype else candidate.to(loaded.dtype)
                if probe.device != loaded.device:
                    probe = probe.to(loaded.device)
                if probe.shape == loaded.shape:
                    if torch.equal(probe, loaded):
                        found.append(seq)
                    continue
                for dim in range(loaded.dim()):
                    same_elsewhere = all(probe.shape[d] == loaded.shape[d] for d in range(loaded.dim()) if d != dim)
                    if not same_elsewhere or probe.shape[dim] >= loaded.shape[dim]:
                        continue
                    length = probe.shape[dim]
                    for offset in (0, loaded.shape[dim] - length):
                        block = loaded.narrow(dim, offset, length)
                        if torch.equal(block.flatten()[:1], probe.flatten()[:1]) and torch.equal(block, probe):
                            found.append(seq)
                            break
                    else:
                        continue
                    break
            except (RuntimeError, TypeError):
                continue
        return found

    def _whole_match(self, seqs: list[int], loaded: torch.Tensor) -> bool:
        recent = dict(self._recent)
        return len(seqs) > 1 or any(seq in recent and recent[seq].shape == loaded.shape for seq in seqs)

    def _by_fingerprint(self, loaded: torch.Tensor) -> list[int]:
        """A late write (thread-pool loaders) of incoming tensors of which one or all already left the recent
        window: matched against their fingerprints and those of the unattributed tensors still in it."""
        target = fingerprint(loaded)
        if target is None:
            return []
        self._fingerprint_evicted()
        pending = {seq: fp for seq, fp in self._fingerprints.items() if seq not in self._attributed}
        for seq, tensor in self._recent:
            if seq not in self._attributed and (kept := fingerprint(tensor)) is not None:
                pending[seq] = kept
        found = match_fingerprints(target, pending)
        for seq in found:
            self._fingerprints.pop(seq, None)
        return found

    # ---- parameter loaders -----------------------------------------------------------------------------
    def wrap_model(self, model: Any) -> None:
        """Install a recording loader on every parameter of `model` for this call (undone by `restore`).
        The tap itself keeps one `ModelWrapping` per sync (`attach`), so that a sync of many calls wraps once."""
        wrapping = ModelWrapping(model, self._params, self._default_loader)
        wrapping.install()
        self._owned = wrapping
        self.attach(wrapping)

    def attach(self, wrapping: ModelWrapping) -> None:
        """Make this call the one `wrapping`'s loaders record into (until `detach`)."""
        wrapping.active = self
        self._wrapping = wrapping

    def record_plain_write(self, param_name: str, loaded: Any) -> None:
        """`record_write` for a plain `(param, loaded_weight)` loader of a parameter that is not an expert's: the
        common write, of the tensor just received, in a few steps; anything else takes `record_write`."""
        with self._lock:
            if loaded is self._last and self.last_in_bucket:
                self._plain_seqs.append(self.current_seq)  # type: ignore[arg-type]
                self._plain_names.append(param_name)
                return
            self._drain_locked()
            if loaded is not self._last or loaded is None:
                fast = False
            else:
                fast = True
                seq = self.current_seq
                self._attributed.add(seq)  # type: ignore[arg-type]
                entry = self._entries.get(seq)  # type: ignore[arg-type]
                if entry is not None:
                    wrote = entry.get("wrote") or ()
                    if param_name not in wrote and len(wrote) < _MAX_WROTE_LABELS:
                        entry["wrote"] = (*wrote, param_name)
                coverage = self._params.get(param_name)
                if coverage is not None:
                    coverage.writes += 1
                    dtype = _DTYPE_NAMES.get(loaded.dtype) or _dtype_name(loaded.dtype)
                    if dtype != coverage.dtype and crosses_quantization(dtype, coverage.dtype):
                        coverage.cast_from = _add(coverage.cast_from, str(dtype))
        if not fast:
            self.record_write(param_name, loaded, None, None, None, False)

    def record_write(
        self,
        param_name: str,
        loaded: Any,
        shard: Any,
        expert: Any,
        local_expert: int | None,
        expert_param: bool,
    ) -> None:
        torch = torch_module()
        with self._lock:
            if loaded is self._last and self.last_in_bucket:
                self._logged_in_order().append(
                    (self.current_seq, param_name, shard, expert, local_expert, expert_param)
                )
                return
            self._drain_locked()
            seqs: list[int] = []
            if isinstance(loaded, torch.Tensor):
                # Most loaders write the tensor they were just handed: no address lookup for that one.
                if loaded is self._last:
                    seq = self.current_seq
                else:
                    self._index_pending()
                    seq = self._by_memory(loaded)
                seqs = [seq] if seq is not None else self._by_value(loaded)
                late = self._fingerprints or self._evicted
                if seq is None and late and not self._whole_match(seqs, loaded):
                    # Nothing, or one part of a concatenation whose other part already left the window.
                    seqs = self._by_fingerprint(loaded) or seqs
            if not seqs and threading.get_ident() == self._consumer and self.current_seq is not None:
                seqs = [self.current_seq]
            if not seqs:
                self.unattributed_writes += 1
            self._credit(seqs, param_name, loaded, shard, expert, local_expert, expert_param)

    def _credit(
        self,
        seqs: list[int],
        param_name: str,
        loaded: Any,
        shard: Any,
        expert: Any,
        local_expert: int | None,
        expert_param: bool,
    ) -> None:
        """A write of `loaded` into `param_name`, attributed to the incoming tensors `seqs` (the caller holds the
        lock): their entries' `wrote` labels and the parameter's coverage."""
        torch = torch_module()
        nonlocal_expert = expert_param and local_expert is not None and local_expert < 0
        label = param_name
        if shard is not None:
            label += f":{shard}"
        if expert is not None:
            label += f":{expert}"
        entries = self._entries
        for seq in seqs:
            self._attributed.add(seq)
            entry = entries.get(seq)
            if entry is None:
                continue
            if nonlocal_expert:
                entry["offrank"] = True
                continue
            # A tuple, not a list: entries stay untracked by the cyclic GC (see `_Call.observe`).
            wrote = entry.get("wrote") or ()
            if label not in wrote and len(wrote) < _MAX_WROTE_LABELS:
                entry["wrote"] = (*wrote, label)
        if nonlocal_expert:
            return
        coverage = self._params.get(param_name)
        if coverage is None:
            return
        coverage.writes += 1
        if isinstance(loaded, torch.Tensor):
            # The loader's own input, not the incoming tensor: a loader that dequantizes (scale applied)
            # hands on a float tensor and is not a cast.
            loaded_dtype = _dtype_name(loaded.dtype)
            if crosses_quantization(loaded_dtype, coverage.dtype):
                coverage.cast_from = _add(coverage.cast_from, str(loaded_dtype))
        if shard is not None:
            coverage.shards_written = _add(coverage.shards_written, str(shard))
        if local_expert is not None and local_expert >= 0:
            coverage.experts_written = _add(coverage.experts_written, local_expert)

    def detach(self) -> None:
        """Stop recording (the loaders stay installed until their wrapping is restored) and drop the tensors."""
        wrapping, self._wrapping = self._wrapping, None
        if wrapping is not None and wrapping.active is self:
            wrapping.active = None
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.restore()
        self._pending.clear()
        self._pending_tensors.clear()
        self.bucket_seqs, self.bucket_names, self.bucket_tensors, self.bucket_bytes = [], [], [], 0
        self._logged = []
        self._plain_seqs, self._plain_names = [], []
        self.last_in_bucket = False
        self._recent.clear()
        self._fingerprints.clear()
        self._evicted.clear()
        self._evicted_bytes = 0
        self._ranges.clear()
        self._last = None

    restore = detach


def _one_dtype(tensors: list[Any]) -> bool:
    dtypes = list(map(_DTYPE_OF, tensors))
    return dtypes.count(dtypes[0]) == len(dtypes)


def _nbytes(tensor: Any) -> int:
    try:
        return int(tensor.nbytes)
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
        return 0


class ModelWrapping:
    """The recording loaders on one model's parameters, installed once per sync (not per call: a sync of
    many small calls would otherwise pay a wrapper per parameter per call) and restored when the sync ends.

    Between calls the loaders pass through (`active` is None). The wrappers themselves are kept per model
    across syncs (`_WRAPPER_CACHE`): a later sync only puts them back, checking that the engine did not
    change a loader meanwhile."""

    def __init__(self, model: Any, params: dict[str, ParamCoverage], default_loader: Callable[..., Any] | None) -> None:
        self.model = model
        self.active: CallCoverage | None = None
        self._params = params
        self._default_loader = default_loader
        # (param, attribute, whether it was the parameter's own, original loader), or the wrapper-cache entry
        # that holds the same (a parameter wrapped as at the last sync).
        self._restore: list[tuple[Any, ...]] = []
        # name -> parameter, of the parameters handled this sync (identity compared: a replaced one is new)
        self._seen: dict[str, Any] = {}
        self.installed = False
        # (plan, the parameters' __dict__s) when this sync's wrappers went in in bulk (`weightcheck.tap.wrapplan`)
        self._bulk: tuple[WrapPlan, list[dict[str, Any]]] | None = None
        self.fresh_wraps = 0  # parameters the last full install wrapped afresh (not as at the last sync)
        self._walked: list[tuple[str, Any]] = []  # (name, parameter) as the last full install walked them

    def install(self) -> None:
        """Wrap the model's parameters; at a later call of the same sync, only those the engine created or
        replaced since (a `process_weights_after_loading` between two update requests).

        When the model is laid out as at the last full install (`WrapPlan`), both are done in bulk: the
        same wrappers go in, nothing is walked one parameter at a time."""
        with GCPaused():
            if self._install_planned():
                _wrapper_cache(self.model).full_installs = 0
                return
            self.fresh_wraps = 0
            self._install()
            cache = _wrapper_cache(self.model)
            cache.full_installs += 1
            # An engine that replaces parameters at every sync would pay for a plan it never uses: after two
            # full installs in a row, a plan is made only at the 4th, 8th, 16th..., or as soon as a full install
            # found every parameter as it was (the engine stopped changing them).
            runs = cache.full_installs
            if runs <= 2 or runs & (runs - 1) == 0 or not self.fresh_wraps:
                self._make_plan()
            else:
                cache.plan = None

    def _install_planned(self) -> bool:
        cache = _wrapper_cache(self.model)
        plan = cache.plan
        if plan is None:
            return False
        if self.installed:  # a later call of this sync: nothing to do if no parameter or module changed
            return plan.current_params() is not None
        wrap_defaults = self._default_loader is not None and not class_compares_default_loader(type(self.model))
        if plan.default_loader is not self._default_loader or plan.wrap_defaults != wrap_defaults or self._params:
            return False
        params = plan.current_params()
        dicts = plan.unchanged(params) if params is not None else None
        if params is None or dicts is None:
            return False
        cache.slot.wrapping = self
        plan.install(dicts, self._params, ParamCoverage)
        self._seen = dict(zip(plan.names, params, strict=True))
        self._bulk = (plan, dicts)
        self.installed = True
        return True

    def _make_plan(self) -> None:
        """After a full install: the plan of what it left, for the next sync (None when a parameter's state is
        not one the bulk path reproduces exactly)."""
        cache = _wrapper_cache(self.model)
        cache.plan = None
        model = self.model
        named, self._walked = self._walked, []
        try:
            modules = [module for _, module in model.named_modules()]
        except Exception:  # not a torch module
            return
        wrap_defaults = self._default_loader is not None and not class_compares_default_loader(type(model))
        rows: list[tuple[Any, ...]] = []
        for name, param in named:
            coverage = self._params.get(name)
            own = getattr(param, "__dict__", None)
            if coverage is None or own is None or self._seen.get(name) is not param:
                return
            cached = cache.wrappers.get(name)
            if cached is not None and cached[1]() is param and own.get(cached[5], MISSING) is cached[2]:
                original, _, wrapper, shards, experts, attribute, had_attribute = cached
                if not (had_attribute or (wrap_defaults and original is self._default_loader)):
                    return  # a loader found on the class: the full install handles it
                if not coverage.tracked:
                    return
                before = original if had_attribute else MISSING
                row = (name, param, coverage.dtype, coverage.shape, attribute, before)
                rows.append((*row, own.get("_skip_weight_check", False), wrapper, had_attribute, shards, experts))
            else:
                read_only = isinstance(getattr(type(param), "weight_loader", None), property)
                attribute = "_weight_loader" if read_only else "weight_loader"
                before = own.get(attribute, MISSING)
                if coverage.tracked or hasattr(before, WRAPPED_ORIGINAL):
                    return
                row = (name, param, coverage.dtype, coverage.shape, attribute, before)
                rows.append((*row, own.get("_skip_weight_check", False), None, False, None, None))
        try:
            cache.plan = WrapPlan(model, self._default_loader, wrap_defaults, modules, rows)
        except TypeError:  # a module or parameter that cannot be referenced weakly
            cache.plan = None

    def _install(self) -> None:
        import torch

        model = self.model
        wrap_defaults = self._default_loader is not None and not class_compares_default_loader(type(model))
        cache = _wrapper_cache(model)
        cache.slot.wrapping = self
        params = self._params
        seen = self._seen
        wrappers = cache.wrappers
        restore = self._restore
        default_loader = self._default_loader
        dtype_names = _DTYPE_NAMES
        tensor_type = torch.Tensor
        # Kept for `_make_plan`, which would otherwise walk the model a second time.
        self._walked = walked = list(model.named_parameters())
        for name, param in walked:
            if not isinstance(param, tensor_type):
                continue
            if seen.get(name) is param:  # a later call of the sync: this parameter is wrapped already
                continue
            seen[name] = param
            dtype = dtype_names.get(param.dtype) or _dtype_name(param.dtype)
            shape = tuple(param.shape)
            coverage = params.get(name)
            if coverage is None or coverage.shape != shape or coverage.dtype != dtype:
                coverage = ParamCoverage(dtype, shape, False)
                params[name] = coverage
            own = getattr(param, "__dict__", None)
            # `_wrap_param`'s first case inlined (the same parameter as at the last sync, its loader left alone):
            # what every parameter takes from the second sync on.
            cached = wrappers.get(name)
            if cached is not None and own is not None and cached[1]() is param:
                original, _, wrapper, shards, experts, attribute, had_attribute = cached
                if (
                    own.get(attribute) is original
                    if had_attribute
                    else (attribute not in own and wrap_defaults and original is default_loader)
                ):
                    if coverage.shards_expected is None:
                        coverage.shards_expected = shards
                    if coverage.experts_local is None and experts is not None:
                        coverage.experts_local = experts
                    own[attribute] = wrapper
                    restore.append(cached)  # (no new tuple per parameter: see `restore`)
                    coverage.tracked = True
                    coverage.optional = bool(own.get("_skip_weight_check", False))
                    continue
            self.fresh_wraps += 1
            coverage.tracked = self._wrap_param(cache, name, param, coverage, wrap_defaults) or coverage.tracked
            skip = own.get("_skip_weight_check", False) if own is not None else getattr(param, "_skip_weight_check", 0)
            coverage.optional = bool(skip)
        self.installed = True

    def _wrap_param(
        self, cache: _ModelWrappers, name: str, param: Any, coverage: ParamCoverage, wrap_defaults: bool
    ) -> bool:
        cached = cache.wrappers.get(name)
        if cached is not None and cached[1]() is param:
            # The same parameter as at the last sync: put its wrapper back if the engine left its loader alone.
            original, _, wrapper, shards, experts, attribute, had_attribute = cached
            own = getattr(param, "__dict__", None)
            unchanged = own is not None and (
                own.get(attribute) is original
                if had_attribute
                else (attribute not in own and wrap_defaults and original is self._default_loader)
            )
            if unchanged:
                if coverage.shards_expected is None:
                    coverage.shards_expected = shards
                if coverage.experts_local is None and experts is not None:
                    coverage.experts_local = experts
                own[attribute] = wrapper  # type: ignore[index]
                self._restore.append((param, attribute, had_attribute, original))
                return True
        read_only = isinstance(getattr(type(param), "weight_loader", None), property)
        attribute = "_weight_loader" if read_only else "weight_loader"
        had_attribute = attribute in getattr(param, "__dict__", {})
        current = getattr(param, attribute, None)
        original = getattr(current, WRAPPED_ORIGINAL, current)
        if original is None:
            if read_only or not wrap_defaults:
                return False
            original = self._default_loader
        if not callable(original):
            return False
        if cached is not None and cached[0] is original and cached[1]() is param:
            wrapper, shards, experts = cached[2], cached[3], cached[4]
        else:
            module = getattr(original, "__self__", None)
            shards = expected_shards(name, module)
            experts = None
            if hasattr(module, "_map_global_expert_id_to_local_expert_id"):
                local = getattr(module, "num_local_experts", None)
                experts = int(local) if isinstance(local, int) else int(param.shape[0])
            wrapper = _make_wrapper(cache.slot, name, original, module)
            # A parameter that cannot be referenced weakly is wrapped afresh every sync.
            with contextlib.suppress(TypeError):
                ref = weakref.ref(param)
                cache.wrappers[name] = (original, ref, wrapper, shards, experts, attribute, had_attribute)
        if coverage.shards_expected is None:
            coverage.shards_expected = shards
        if coverage.experts_local is None and experts is not None:
            coverage.experts_local = experts
        try:
            setattr(param, attribute, wrapper)
        except (AttributeError, TypeError):
            return False
        self._restore.append((param, attribute, had_attribute, original))
        return True

    def restore(self) -> None:
        self.active = None
        cache = _WRAPPER_CACHE.get(id(self.model))
        if cache is not None and cache.slot.wrapping is self:
            cache.slot.wrapping = None
        for item in reversed(self._restore):
            if len(item) == 4:
                param, attribute, had_attribute, original = item
            else:  # a wrapper-cache entry (original, weakref to the parameter, wrapper, ..., attribute, had_attribute)
                param = item[1]()
                if param is None:
                    continue
                original, attribute, had_attribute = item[0], item[5], item[6]
            try:
                own = param.__dict__
                if had_attribute:
                    own[attribute] = original
                else:
                    own.pop(attribute, None)
            except Exception:  # no instance dict: through the attribute protocol
                # A parameter that refuses its old attribute back keeps a pass-through wrapper.
                with contextlib.suppress(Exception):
                    if had_attribute:
                        setattr(param, attribute, original)
                    else:
                        delattr(param, attribute)
        self._restore.clear()
        if self._bulk is not None:  # put in first, so taken off last
            plan, dicts = self._bulk
            self._bulk = None
            plan.restore(dicts)
        self._seen.clear()
        self.installed = False


class _Slot:
    """What a model's wrappers record into: the wrapping of the open sync (None: pass through)."""

    __slots__ = ("wrapping",)

    def __init__(self) -> None:
        self.wrapping: ModelWrapping | None = None


@dataclass
class _ModelWrappers:
    model: Any  # weakref to the model
    slot: _Slot = field(default_factory=_Slot)
    # param name -> (original loader, weakref to param, wrapper, shards expected, local experts, attribute,
    # whether the attribute was the parameter's own)
    wrappers: dict[str, tuple[Any, Any, Any, list[str] | None, int | None, str, bool]] = field(default_factory=dict)
    # The layout the last full install left (`weightcheck.tap.wrapplan`), or None, and how many installs in a
    # row were full ones (the plan did not fit).
    plan: WrapPlan | None = None
    full_installs: int = 0


_WRAPPER_CACHE: dict[int, _ModelWrappers] = {}


def _wrapper_cache(model: Any) -> _ModelWrappers:
    key = id(model)
    found = _WRAPPER_CACHE.get(key)
    if found is not None and found.model() is model:
        return found
    for stale in [k for k, v in _WRAPPER_CACHE.items() if v.model() is None]:
        del _WRAPPER_CACHE[stale]
    try:
        ref = weakref.ref(model)
    except TypeError:
        return _ModelWrappers(model=lambda: model)  # not cached: wrapped afresh every sync
    found = _WRAPPER_CACHE[key] = _ModelWrappers(model=ref)
    return found


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """The safetensors name of a torch dtype (the torch name when it has none), cached: asked per write."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        from weightcheck.tensors import safetensors_dtype

        name = _DTYPE_NAMES[dtype] = safetensors_dtype(dtype) or str(dtype)
        return name


def _make_wrapper(
    slot: _Slot, param_name: str, original: Callable[..., Any], module: object | None
) -> Callable[..., Any]:
    shard_pos, expert_pos = _argument_positions(getattr(original, "__func__", original))
    maps_experts = getattr(module, "_map_global_expert_id_to_local_expert_id", None)
    plain = shard_pos is None and expert_pos is None and maps_experts is None

    @functools.wraps(original)
    def recording_loader(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        wrapping = slot.wrapping
        call = wrapping.active if wrapping is not None else None
        if call is None:  # between the calls of a sync, or after it: the engine's own loader, nothing else
            return result
        try:
            if plain and len(args) == 2 and not kwargs:  # the common write, `loader(param, loaded_weight)`
                call.record_plain_write(param_name, args[1])
                return result
            # The parameter is the first argument of every SGLang loader; the loaded weight the second.
            loaded = args[1] if len(args) > 1 else kwargs.get("loaded_weight")
            if shard_pos is None and expert_pos is None and not kwargs:  # a plain (param, weight) loader
                if maps_experts is None:
                    call.record_plain_write(param_name, loaded)
                else:
                    call.record_write(param_name, loaded, None, None, None, True)
                return result
            shard = _loader_argument(args, kwargs, "shard_id", shard_pos)
            if shard is None:
                shard = _loader_argument(args, kwargs, "loaded_shard_id", shard_pos)
            expert = _loader_argument(args, kwargs, "expert_id", expert_pos)
            local_expert: int | None = None
            if maps_experts is not None and isinstance(expert, int):
                local_expert = int(maps_experts(expert))
            call.record_write(param_name, loaded, shard, expert, local_expert, maps_experts is not None)
        except Exception:  # coverage is best effort: never break the engine's load
            pass
        return result

    setattr(recording_loader, WRAPPED_ORIGINAL, original)
    return recording_loader
