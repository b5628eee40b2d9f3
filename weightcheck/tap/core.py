"""The load_weights tap: record every (name, tensor) a model receives, per sync, per rank.

`tap_load_weights(original_fn, model, *args, **kwargs)` has the signature of an SGLang `HookRegistry`
AROUND hook and works as well around any `load_weights(weights, ...)`: it wraps the weights iterable
lazily (a one-shot generator stays one-shot; a list is recorded up front and passed on unchanged), digests
each tensor as it passes, and installs recording loaders on the model's parameters for the duration of the
call (see `weightcheck.tap.coverage`).

Syncs group calls. A sync is opened by `begin_sync` (the SGLang plugin does so on `begin_weight_update`), or
implicitly around one update request or one bare `load_weights` call, and its record is written when it
closes: one JSON-lines file per rank (`weightcheck.tap.records`), atomically.

Off unless configured (`WEIGHTCHECK_DIR` or `configure(...)`): a disabled hook only checks one attribute.
Never raises into the engine unless `strict` is set: a failure of the tap is logged and the load goes on.

Why one ~1,100-line module: the hook (`_Call`), sync lifetime and record writing share one per-process state
that must stay consistent under SGLang's threads; keeping them in one module keeps that state private.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import operator
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck.digest import live_algorithm
from weightcheck.gcpause import GCPaused
from weightcheck.posmix import torch_module
from weightcheck.tap.columns import EntryTable, TensorColumns, tensor_body
from weightcheck.tap.coverage import CallCoverage, ModelWrapping, ParamCoverage, param_line_bytes
from weightcheck.tap.devicebatch import DeviceBatch
from weightcheck.tap.digesting import SMALL_TENSOR_BYTES as _SMALL_TENSOR_BYTES
from weightcheck.tap.digesting import digest_on_arrival, note_wrote_into, version_of, wrote_into_names
from weightcheck.tap.records import (
    ENGINE_WROTE_INTO_SENT,
    RECORD_KIND,
    RECORD_SCHEMA_VERSION,
    encode_bytes,
    rank_file_stem,
    sync_dir_name,
    write_atomic_bytes,
)

log = logging.getLogger("weightcheck.tap")

ENV_DIR = "WEIGHTCHECK_DIR"
ENV_TENSORS = "WEIGHTCHECK_TAP_TENSORS"
ENV_STRICT = "WEIGHTCHECK_STRICT"
ENV_SYNC_DIGEST = "WEIGHTCHECK_TAP_SYNC_DIGEST"
ENV_THREADS = "WEIGHTCHECK_DIGEST_THREADS"
ENV_ENGINE = "WEIGHTCHECK_ENGINE"
ENV_STATE = "WEIGHTCHECK_STATE"  # 1: digest the engine's parameters and buffers after every sync
ENV_DIGEST = "WEIGHTCHECK_DIGEST"  # sha256 | xxh3_128 | posmix128 (default: xxh3_128 when xxhash is installed)
ENV_PROFILE = "WEIGHTCHECK_PROFILE"  # 1: write where the tap's time went (per stage) into each record's end line
# Small CPU tensors wait in a batch until this many bytes or tensors (then one flatten and a few vectorized
# reductions digest them all); bigger ones go to the digest threads one by one.
_BATCH_BYTES = 16 << 20
_BATCH_TENSORS = 4096
# A drain of at least this many tensors, with none waiting in the batch, is digested at once (`_drained_whole`).
_DIRECT_DIGEST_TENSORS = 256
# Loggers whose warnings during a call are kept in the record ("Parameter X not found in params_dict").
ENGINE_LOGGERS = ("sglang.srt",)
_MAX_WARNINGS_PER_CALL = 50


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class TapConfig:
    """How the tap records. `directory` is where `sync-*/` folders are written."""

    directory: Path
    keep_tensors: bool = False  # also save every incoming tensor (CPU copy) next to the record
    strict: bool = False  # let tap failures raise into the engine
    synchronous_digest: bool = False  # digest before handing each tensor on (senders that reuse buffers)
    # Threads digesting the large tensors while the load goes on; 0: each on the loading thread as it passes
    # (`default_digest_threads`: the default where the process has at most 2 cores).
    digest_threads: int = 2
    engine: str | None = None  # engine id in the record; default host:port from SGLang, else the host name
    # Digest algorithm (`weightcheck.digest.live_algorithm`): the trainer manifest must use the same one.
    digest: str = field(default_factory=lambda: live_algorithm())
    # Digest every parameter and buffer of the engine's model after each sync (`weightcheck.tap.state`).
    state: bool = False
    # Time the tap's stages and write the figures into each record's end line (`verify` prints them).
    profile: bool = False


def config_from_env(environ: Mapping[str, str] | None = None) -> TapConfig | None:
    """The tap configuration from `WEIGHTCHECK_*` variables, or None when `WEIGHTCHECK_DIR` is unset."""
    env = os.environ if environ is None else environ
    directory = env.get(ENV_DIR, "").strip()
    if not directory:
        return None
    try:
        threads = int(env.get(ENV_THREADS, "") or default_digest_threads())
    except ValueError:
        threads = default_digest_threads()
    return TapConfig(
        directory=Path(directory),
        keep_tensors=_truthy(env.get(ENV_TENSORS)),
        strict=_truthy(env.get(ENV_STRICT)),
        synchronous_digest=_truthy(env.get(ENV_SYNC_DIGEST)),
        digest_threads=max(0, threads),
        engine=env.get(ENV_ENGINE) or None,
        digest=live_algorithm(environ=env),
        state=_truthy(env.get(ENV_STATE)),
        profile=_truthy(env.get(ENV_PROFILE)),
    )


@dataclass
class EngineHooks:
    """What an engine integration tells the tap (all optional).

    `rank_info() -> {"tp_rank", "tp_size", "pp_rank", "pp_size", "ep_rank", "ep_size", ...}`: this process's
    place in the engine. `default_loader(param, loaded_weight)`: the loader the engine uses for parameters
    without a `weight_loader` attribute (without it, such parameters are recorded `tracked: false`: their
    coverage is unknown); SGLang classes get SGLang's `default_weight_loader` automatically.
    `current_weight_version()`, `engine_id()`, `engine_version()`: header fields."""

    rank_info: Callable[[], dict[str, Any]] | None = None
    default_loader: Callable[..., Any] | None = None
    current_weight_version: Callable[[], str | None] | None = None
    engine_id: Callable[[], str | None] | None = None
    engine_version: Callable[[], str | None] | None = None


@dataclass
class _Sync:
    seq: int
    source: str
    weight_version: str | None
    started: float
    calls: list[dict[str, Any]] = field(default_factory=list)
    # Entry dicts by seq, and the blocks of columns of big drains (`weightcheck.tap.columns`).
    entries: EntryTable = field(default_factory=EntryTable)
    params: dict[str, ParamCoverage] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    rank: dict[str, Any] | None = None
    runner: str = "target"
    # Other runners of this process in the same sync (a draft/MTP model fed the same stream): own records.
    parts: dict[str, _Sync] = field(default_factory=dict)
    # The recording loaders, per model (id), installed at the sync's first call and restored when it closes.
    wrappings: dict[int, ModelWrapping] = field(default_factory=dict)
    # Seconds per stage (`WEIGHTCHECK_PROFILE=1`), else None: see `_Profile`.
    profile: _Profile | None = None
    counter: Iterator[int] = field(default_factory=itertools.count)

    def part(self, runner: str) -> _Sync:
        if runner == self.runner:
            return self
        if runner not in self.parts:
            self.parts[runner] = _Sync(self.seq, self.source, self.weight_version, self.started, runner=runner)
            if self.profile is not None:
                self.parts[runner].profile = _Profile()
        return self.parts[runner]

    def wrapping_for(self, model: Any, default_loader: Callable[..., Any] | None) -> ModelWrapping:
        wrapping = self.wrappings.get(id(model))
        if wrapping is None or wrapping.model is not model:
            wrapping = self.wrappings[id(model)] = ModelWrapping(model, self.params, default_loader)
        wrapping.install()  # at later calls: only parameters created or replaced since (one pass, no rewrap)
        return wrapping

    def restore_loaders(self) -> None:
        for wrapping in self.wrappings.values():
            wrapping.restore()
        self.wrappings.clear()
        for part in self.parts.values():
            part.restore_loaders()


class _Profile:
    """Where the tap's time went in one sync (`WEIGHTCHECK_PROFILE=1`). Seconds summed over threads:
    `bookkeeping` (the per-tensor and per-call path on the engine's thread: names, entries, coverage writes,
    wrapping the loaders), `digest` and `stats` (the one read pass, split by what it computed), `wait` (the end
    of a call waiting for the digest threads), `serialization` (writing the record), `state` (the engine-state
    digests, `WEIGHTCHECK_STATE=1`)."""

    STAGES = ("bookkeeping", "digest", "stats", "wait", "serialization", "state")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(self.STAGES, 0.0)
        self.tensors = 0
        self.bytes = 0
        self.lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.seconds[stage] += seconds

    def add_timings(self, timings: Mapping[str, float]) -> None:
        with self.lock:
            for stage, seconds in timings.items():
                self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": {stage: round(value, 6) for stage, value in self.seconds.items()},
            "tensors": self.tensors,
            "bytes": self.bytes,
            "clock": "thread seconds summed (digest threads run beside the engine)",
        }


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.config: TapConfig | None = None
        self.hooks = EngineHooks()
        self.current: _Sync | None = None
        self.next_seq = 0
        self.pool: ThreadPoolExecutor | None = None
        self.local = threading.local()
        self.last_written: Path | None = None
        self.warned: set[str] = set()
        self.exit_hook = False
        self.model: Any = None  # weakref to the engine's model: its state is digested when a sync closes


_STATE = _State()


# ---- configuration ---------------------------------------------------------------------------------------


def configure(
    directory: str | os.PathLike[str] | TapConfig | None,
    *,
    keep_tensors: bool = False,
    strict: bool = False,
    synchronous_digest: bool = False,
    digest_threads: int | None = None,
    engine: str | None = None,
    digest: str | None = None,
    state: bool = False,
    profile: bool = False,
) -> TapConfig | None:
    """Turn the tap on (records under `directory`) or off (`None`). Closes a sync left open.

    `digest`: "sha256", "xxh3_128" or "posmix128" (on the tensor's device); default
    `weightcheck.digest.live_algorithm()` (xxh3_128 when xxhash is installed, `WEIGHTCHECK_DIGEST` overrides).
    `digest_threads`: threads digesting large tensors beside the load; 0 digests each on the loading thread as
    it passes; default `default_digest_threads()` (0 on at most 2 cores, else min(4, cores))."""
    if isinstance(directory, TapConfig) or directory is None:
        config = directory
    else:
        config = TapConfig(
            directory=Path(directory),
            keep_tensors=keep_tensors,
            strict=strict,
            synchronous_digest=synchronous_digest,
            digest_threads=default_digest_threads() if digest_threads is None else max(0, digest_threads),
            engine=engine,
            digest=live_algorithm(digest),
            state=state,
            profile=profile,
        )
    with _STATE.lock:
        if _STATE.current is not None:
            _close_sync(incomplete=True)
        previous = _STATE.config
        if config is None or previous is None or previous.directory != config.directory:
            _STATE.next_seq = 0  # sync numbers are per records directory
        _STATE.config = config
        if config is not None and not _STATE.exit_hook:
            # A sync still open when the process exits (engine killed mid-session) is written, marked
            # incomplete, so that verify reports it (WC739) instead of never seeing it.
            atexit.register(_flush_at_exit)
            _STATE.exit_hook = True
    return config


def default_digest_threads() -> int:
    """Digest threads when none are asked for: min(4, cores), or 0 (digest on the loading thread) where this
    process may run on at most 2 cores. There a digest thread only takes turns with the engine's own threads
    (torch's copy uses every core) and reads each tensor again once it has left the cache: on 2 cores it cost
    ~1.4 read passes of CPU against ~1.1 digesting each tensor as it passes (`benchmarks/bench_tap.py`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return 0 if cores <= 2 else min(4, cores)


def _flush_at_exit() -> None:
    try:
        flush()
    except Exception as exc:  # never turn an engine's exit into a traceback
        log.warning("weightcheck tap: could not write the open sync at exit: %s", exc)


def configure_from_env(environ: Mapping[str, str] | None = None) -> TapConfig | None:
    return configure(config_from_env(environ))


def set_engine_hooks(hooks: EngineHooks) -> None:
    _STATE.hooks = hooks


def note_model(model: Any) -> None:
    """The engine's model, whose parameters and buffers are digested when a sync closes (`state=True`).
    A tapped `load_weights` call notes its model; call this for a model that syncs bypass (load_format
    "direct", custom loaders, RDMA) before any call reached it. Held weakly."""
    import weakref

    try:
        _STATE.model = weakref.ref(model)
    except TypeError:
        _STATE.model = lambda: model


# SGLang's speculative-decoding draft classes (DeepseekV3ForCausalLMNextN, Qwen3NextForCausalLMMTP,
# MiMoMTP, LlamaForCausalLMEagle3, ...): they receive the whole stream and keep only their own layer.
_DRAFT_CLASS = re.compile(r"(NextN|MTP|Eagle\d*|Draft)$")


def set_runner(model: Any, runner: str) -> Any:
    """Name the runner `model` serves in this process (`"target"`, `"draft"`, ...). Records of different runners
    are written and judged apart (a draft drops the target's names by design). Default: `"draft"` for a class
    whose name ends in NextN/MTP/Eagle/Draft, else `"target"`. Returns `model`."""
    object.__setattr__(model, "_weightcheck_runner", str(runner))
    return model


def runner_of(model: Any) -> str:
    explicit = getattr(model, "_weightcheck_runner", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    return "draft" if _DRAFT_CLASS.search(type(model).__name__) else "target"


def current_config() -> TapConfig | None:
    return _STATE.config


def last_record_path() -> Path | None:
    """The record file this process wrote last (None before the first)."""
    return _STATE.last_written


def _fail(what: str, exc: BaseException) -> None:
    """A tap failure: raise in strict mode, else log it once per kind and carry on."""
    config = _STATE.config
    if config is not None and config.strict:
        raise exc
    if what not in _STATE.warned:
        _STATE.warned.add(what)
        log.warning("weightcheck tap: %s failed (%s: %s); the load continues unrecorded", what, type(exc).__name__, exc)


# ---- syncs -----------------------------------------------------------------------------------------------


def begin_sync(*, source: str = "manual", weight_version: str | None = None) -> int | None:
    """Open a sync (no-op returning the open one's seq if one is open, None when the tap is off)."""
    with _STATE.lock:
        if _STATE.config is None:
            return None
        if _STATE.current is not None:
            if weight_version is not None:
                _STATE.current.weight_version = weight_version
            return _STATE.current.seq
        _STATE.current = _Sync(seq=_STATE.next_seq, source=source, weight_version=weight_version, started=time.time())
        if _STATE.config.profile:
            _STATE.current.profile = _Profile()
        _STATE.next_seq += 1
        return _STATE.current.seq


def note_weight_version(weight_version: str | None) -> None:
    """The weight version an update request carries (SGLang gives it to the scheduler, not to load_weights)."""
    with _STATE.lock:
        if _STATE.current is not None and weight_version is not None:
            _STATE.current.weight_version = str(weight_version)


def end_sync() -> Path | None:
    """Close the open sync and write its records; returns the record path (None if nothing was open)."""
    with _STATE.lock:
        if _STATE.current is None:
            return None
        return _close_sync(incomplete=False)


@contextlib.contextmanager
def sync(weight_version: str | None = None, *, source: str = "manual") -> Iterator[int | None]:
    """Group the load_weights calls inside the block into one sync (like SGLang's begin/end weight update)."""
    opened = _STATE.current is None
    seq = begin_sync(source=source, weight_version=weight_version)
    try:
        yield seq
    finally:
        if opened:
            end_sync()


@contextlib.contextmanager
def request_scope(weight_version: str | None = None, *, source: str = "request") -> Iterator[None]:
    """One update request: joins the open sync (a session) or is a sync of its own."""
    try:
        opened = _STATE.config is not None and _STATE.current is None
        begin_sync(source=source, weight_version=weight_version)
        note_weight_version(weight_version)
    except Exception as exc:
        _fail("opening a sync", exc)
        opened = False
    try:
        yield
    finally:
        if opened:
            try:
                end_sync()
            except Exception as exc:
                _fail("writing a sync record", exc)


def flush() -> Path | None:
    """Write a sync left open (marked incomplete): for shutdown."""
    with _STATE.lock:
        if _STATE.current is None:
            return None
        return _close_sync(incomplete=True)


def _engine_value(getter: Callable[[], Any] | None) -> Any:
    if getter is None:
        return None
    try:
        return getter()
    except Exception:
        return None


def _close_sync(*, incomplete: bool) -> Path | None:
    current, config = _STATE.current, _STATE.config
    _STATE.current = None
    if current is not None:
        current.restore_loaders()  # the engine's own loaders back, whatever happens next
    if current is None or config is None:
        return None
    model_known = config.state and _STATE.model is not None and _STATE.model() is not None
    any_calls = bool(current.calls) or any(part.calls for part in current.parts.values())
    if current.source.startswith("request") and not any_calls and not model_known:
        # A request the engine refused before loading anything (e.g. outside a session): no sync happened.
        if _STATE.next_seq == current.seq + 1:
            _STATE.next_seq = current.seq
        return None
    hooks = _STATE.hooks
    if current.weight_version is None:
        version = _engine_value(hooks.current_weight_version)
        current.weight_version = None if version is None else str(version)
    last: Path | None = None
    if current.calls or not current.parts or model_known:
        last = _write_record(current, config, incomplete=incomplete, with_state=True)
    for part in current.parts.values():
        part.weight_version = current.weight_version
        part.rank = part.rank if part.rank is not None else current.rank
        last = _write_record(part, config, incomplete=incomplete, with_state=False) or last
    return last


def _write_record(current: _Sync, config: TapConfig, *, incomplete: bool, with_state: bool) -> Path | None:
    with GCPaused():  # two small dicts and their bytes per tensor, all acyclic
        return _write_record_now(current, config, incomplete=incomplete, with_state=with_state)


def _write_record_now(current: _Sync, config: TapConfig, *, incomplete: bool, with_state: bool) -> Path | None:
    written_from = time.perf_counter()
    hooks = _STATE.hooks
    rank = current.rank if current.rank is not None else (_engine_value(hooks.rank_info) or {})
    host = socket.gethostname()
    pid = os.getpid()
    engine = config.engine or _engine_value(hooks.engine_id) or host
    from weightcheck.version import __version__

    folder = config.directory / sync_dir_name(current.seq)
    stem = rank_file_stem(rank, host, pid)
    if current.runner != "target":
        stem = f"{stem}.{re.sub(r'[^A-Za-z0-9_-]', '_', current.runner)[:32]}"
    tensors_file: str | None = None
    if config.keep_tensors and current.kept:
        tensors_file = f"{stem}.safetensors"
        _write_tensors(folder / tensors_file, current.kept)
    header = {
        "t": "header",
        "kind": RECORD_KIND,
        "schema_version": RECORD_SCHEMA_VERSION,
        "sync": {
            "seq": current.seq,
            "source": current.source,
            "weight_version": current.weight_version,
            "started": current.started,
            "ended": None if incomplete else time.time(),
            "incomplete": incomplete,
        },
        "rank": rank,
        "engine": str(engine),
        "host": host,
        "pid": pid,
        "model": current.model,
        "sglang_version": _engine_value(hooks.engine_version),
        "weightcheck_version": __version__,
        "digest": config.digest,
        "tensors_file": tensors_file,
    }
    if current.runner != "target":  # absent means target: records written before runners stay valid
        header["runner"] = current.runner
    # In seq order: the tensor lines, and the big drains' blocks as one `tensors` line each (schema 1.2).
    tensor_bytes, tensor_count = tensor_body(current.entries)
    # Schema 1.1 order (calls by index, params and states by name): the reader checks it, so a line duplicated,
    # swapped or moved after writing is detected (weightcheck/tap/records.py).
    params = current.params
    states: list[dict[str, Any]] = []
    model = _STATE.model() if _STATE.model is not None and with_state else None
    if config.state and model is not None:
        from weightcheck.tap.state import engine_state

        state_from = time.perf_counter()
        states = sorted(engine_state(model, config.digest), key=lambda line: str(line["name"]))
        if current.profile is not None:
            current.profile.add("state", time.perf_counter() - state_from)
            written_from += time.perf_counter() - state_from
        header["state_digest"] = config.digest
        if not current.model:
            header["model"] = _model_info(model)

    def lines() -> Iterator[bytes]:
        yield encode_bytes(header)
        for call in sorted(current.calls, key=lambda line: int(line["call"])):
            yield encode_bytes(call)
        # The per-tensor lines in one orjson call (the same bytes as one call per line, at a fraction of the
        # cost: `encode_lines`), a block of columns in one line; the per-parameter lines as encoded at an
        # earlier sync where they are the same.
        yield tensor_bytes
        yield param_line_bytes(params, encode_bytes)
        for state in states:
            yield encode_bytes(state)
        end: dict[str, Any] = {"t": "end", "calls": len(current.calls), "tensors": tensor_count, "params": len(params)}
        if states:
            end["states"] = len(states)
        if current.profile is not None:
            # Up to this line: the last line and the file's fsync are not in it.
            current.profile.add("serialization", time.perf_counter() - written_from)
            end["profile"] = current.profile.as_dict()
        yield encode_bytes(end)

    path = folder / f"{stem}.jsonl"
    write_atomic_bytes(path, lines())
    _STATE.last_written = path
    return path


def _write_tensors(path: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# ---- the hook --------------------------------------------------------------------------------------------


class _WarningCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < _MAX_WARNINGS_PER_CALL:
            with contextlib.suppress(Exception):
                self.messages.append(record.getMessage()[:300])


def _model_info(model: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"class": type(model).__name__, "module": type(model).__module__}
    inner = getattr(model, "model", None)
    for key in ("start_layer", "end_layer"):
        value = getattr(inner, key, getattr(model, key, None))
        if isinstance(value, int):
            info[key] = value
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int):
        info["num_hidden_layers"] = layers
    return info


def _digest_pool(config: TapConfig) -> ThreadPoolExecutor:
    if _STATE.pool is None:
        _STATE.pool = ThreadPoolExecutor(max_workers=config.digest_threads, thread_name_prefix="weightcheck-digest")
    return _STATE.pool


class _Call:
    """One tapped load_weights call inside a sync."""

    def __init__(self, sync_: _Sync, model: Any, config: TapConfig, implicit: bool) -> None:
        started = time.perf_counter()
        self.sync = sync_
        self.config = config
        self.implicit = implicit
        self.index = len(sync_.calls)
        self.names = 0
        self.started = started
        self.error: str | None = None
        self.futures: list[Future[None]] = []
        # Small CPU tensors waiting to be digested together (`_flush_batch`), and their bytes.
        # (Two lists, not a list of pairs: one tuple less per tensor for the cyclic GC to look at.)
        self.batch: list[dict[str, Any]] = []
        # seq -> the incoming tensor's version counter when it arrived, for tensors digested later (the bucket, the
        # digest batch): a tensor the engine wrote into meanwhile is recorded as such, never with its new bytes.
        self.arrival_versions: dict[int, int] = {}
        # The last tensor digested on arrival (`observe`: the synchronous digest, or a name the engine wrote into
        # before) with its version then, read again when the next one comes or the call ends (the engine has
        # loaded it by then): a tensor it wrote into is marked, and its name learned. One, not all: a stream's
        # tensors must not stay alive for the whole call.
        self.previous: tuple[dict[str, Any], Any, int] | None = None
        # A list's tensors (`wrap`): (seq, name, tensor, version when it arrived), checked when the call ends.
        self.listed: list[tuple[int | None, Any, Any, int]] = []
        self.batch_tensors: list[Any] = []
        self.batch_bytes = 0
        self.profile = sync_.profile
        self.algorithm = config.digest
        # Looked up once per call, not once per tensor (`observe`).
        self.entries = sync_.entries
        self.counter = sync_.counter
        self.keep_tensors = config.keep_tensors
        self.synchronous_digest = config.synchronous_digest
        default_loader = _default_loader_for(model)
        self.coverage = CallCoverage(sync_.entries, sync_.params, default_loader)
        self.coverage.on_drain = self._drained
        if self.profile is not None:
            self.coverage.drain_timer = self._drain_timer
        self.lock = self.coverage._lock  # guards the bucket, the digest batch and the counts below
        # The stream's small CPU tensors take the bucket (`_lazy`): nothing but two appends per tensor.
        self.bucketed = not (self.keep_tensors or self.synchronous_digest)
        # GPU tensors, with the on-device digest: queued on the device, collected once (`weightcheck.tap.devicebatch`).
        self.device_batch: DeviceBatch | None = None
        if config.digest == "posmix128" and not self.synchronous_digest:
            self.device_batch = DeviceBatch()
        self.capture = _WarningCapture()
        if not sync_.model:
            sync_.model = _model_info(model)
        if sync_.runner == "target":  # the state digest is the served (target) model's
            note_model(model)
        if sync_.rank is None:
            sync_.rank = _engine_value(_STATE.hooks.rank_info) or {}
        for name in ENGINE_LOGGERS:
            logging.getLogger(name).addHandler(self.capture)
        self.coverage.attach(sync_.wrapping_for(model, default_loader))
        if sync_.runner != "target":
            self._untrack_shared(model)
        if self.profile is not None:
            self.profile.add("bookkeeping", time.perf_counter() - started)

    def _untrack_shared(self, model: Any) -> None:
        """A draft runner shares some parameters with the target (SGLang's speculative workers hand the draft the
        target's embedding and head through `set_embed_and_head`): written through the target's loader, their
        coverage is unknown from the draft's calls, never "not written"."""
        target = _STATE.model() if _STATE.model is not None else None
        if target is None or target is model:
            return
        try:
            shared = {p.data_ptr() for p in target.parameters() if p.numel()}
            for name, param in model.named_parameters():
                coverage = self.sync.params.get(name)
                if coverage is not None and param.numel() and param.data_ptr() in shared:
                    coverage.tracked = False
        except Exception as exc:  # a model that is not a torch module: nothing to compare
            _fail("comparing draft and target parameters", exc)

    def observe(self, name: Any, tensor: Any) -> None:
        """Record one incoming tensor: an entry, where it lives (for coverage), and its digest, now (synchronous
        digest), in the current batch (small CPU tensors) or on a digest thread (the others).

        This runs once per tensor on the engine's thread, so it does the least it can (each step here costs
        about as much as SGLang's own per-tensor work): the coverage index and the digests of small tensors
        are done in batches."""
        profile = self.profile
        if profile is not None:
            started = time.perf_counter()
        self.coverage.drain()  # the bucket's tensors came first: their entries go in first
        seq = next(self.counter)
        # Only atomic values and tuples (never lists) in an entry, so that the cyclic garbage collector stops
        # tracking it at its first pass: tens of thousands of tracked entries alive for the whole sync made
        # the collections the engine's own allocations trigger several times slower (written as JSON arrays).
        entry: dict[str, Any] = {
            "t": "tensor",
            "seq": seq,
            "call": self.index,
            "name": name if type(name) is str else str(name),
            "wrote": (),
            "dtype": None,
            "shape": None,
            self.algorithm: None,
        }
        self.entries[seq] = entry
        with self.lock:  # (a loader thread's write may drain the bucket meanwhile: `_drained` counts too)
            self.names += 1
        if not isinstance(tensor, torch_module().Tensor):
            entry["error"] = f"not a tensor: {type(tensor).__name__}"
            return
        entry["shape"] = tuple(tensor.shape)
        try:
            nbytes = tensor.nbytes
        except (RuntimeError, TypeError, NotImplementedError):  # a storage-less subclass: one at a time
            nbytes = _SMALL_TENSOR_BYTES + 1
        self.coverage.note_incoming(seq, tensor, nbytes)
        if self.keep_tensors:
            key = str(seq)
            self.sync.kept[key] = tensor.detach().to("cpu", copy=True).contiguous()
            entry["tensor_key"] = key
        if profile is not None:
            with self.lock:
                profile.tensors += 1
                profile.bytes += nbytes
            profile.add("bookkeeping", time.perf_counter() - started)
        if self.synchronous_digest or digest_on_arrival(entry["name"]):
            version = version_of(tensor)
            _fill_digest(entry, tensor, self.algorithm, profile)
            with self.lock:
                self._check_previous()
                self.previous = (entry, tensor, version) if version is not None else None
        elif nbytes <= _SMALL_TENSOR_BYTES and tensor.is_cpu:
            # The digest batch is shared with `_drained`, which a loader thread's write may run: both under the
            # coverage lock, so that entries and tensors stay paired.
            version = version_of(tensor)
            with self.lock:
                if version is not None:
                    self.arrival_versions[seq] = version
                self.batch.append(entry)
                self.batch_tensors.append(tensor)
                self.batch_bytes += nbytes
                if self.batch_bytes >= _BATCH_BYTES or len(self.batch) >= _BATCH_TENSORS:
                    self._flush_batch()
        elif self.device_batch is not None and self.device_batch.takes(tensor):
            self._queue_on_device(entry, tensor)
        else:
            self._digest_one(entry, tensor, profile)

    def _check_previous(self) -> None:
        """Mark the previous tensor digested on arrival if the engine wrote into it (`previous`). The caller holds
        `self.lock`."""
        previous, self.previous = self.previous, None
        if previous is not None and version_of(previous[1]) != previous[2]:
            previous[0]["engine_wrote"] = True
            note_wrote_into(previous[0]["name"])

    def _digest_one(self, entry: dict[str, Any], tensor: Any, profile: _Profile | None) -> None:
        """One tensor's digest on a digest thread, or, with no digest threads, on this thread while its bytes
        are in cache."""
        if self.config.digest_threads:
            pool = _digest_pool(self.config)
            version = version_of(tensor)  # a thread digests it later: the engine may have written into it by then
            self.futures.append(pool.submit(_fill_digest, entry, tensor, self.algorithm, profile, version))
        else:
            _fill_digest(entry, tensor, self.algorithm, profile)

    def _queue_on_device(self, entry: dict[str, Any], tensor: Any) -> None:
        """A GPU tensor's digest and statistics, queued on its device (`DeviceBatch`); the digest threads' path
        if the kernels cannot be queued."""
        assert self.device_batch is not None
        profile = self.profile
        started = time.perf_counter() if profile is not None else 0.0
        try:
            self.device_batch.add(entry, tensor)
        except Exception:  # digested the per-tensor way, which records any error in the entry (and its time)
            self._digest_one(entry, tensor, profile)
            return
        if profile is not None:
            profile.add("digest", time.perf_counter() - started)

    def _drain_timer(self, token: Any) -> Any:
        """`CallCoverage.drain_timer` (profiling): a drain's time, less the digest and statistics time it added
        itself, is bookkeeping (what `observe` used to count per tensor)."""
        profile = self.profile
        assert profile is not None
        digested = profile.seconds["digest"] + profile.seconds["stats"]
        if token is None:
            return time.perf_counter(), digested
        started, digested_before = token
        profile.add("bookkeeping", max(0.0, time.perf_counter() - started - (digested - digested_before)))
        return None

    def _drained(
        self, seqs: list[int], names: list[Any], tensors: list[Any], nbytes: int, wrote: list[str] | None
    ) -> None:
        """The coverage bucket's tensors (`CallCoverage.drain`, lock held): their entries, as `observe` makes
        them (with the one parameter each wrote, when `wrote` says so), then into the digest batch."""
        call, algorithm = self.index, self.algorithm
        direct = not self.batch and len(seqs) >= _DIRECT_DIGEST_TENSORS
        if direct and self._drained_whole(seqs, names, tensors, nbytes, wrote):
            return
        labels = zip(wrote, strict=True) if wrote is not None else itertools.repeat(())  # (name,) each
        entries = [
            {
                "t": "tensor",
                "seq": seq,
                "call": call,
                "name": name if type(name) is str else str(name),
                "wrote": label,
                "dtype": None,
                "shape": tuple(tensor.shape),
                algorithm: None,
            }
            for seq, name, tensor, label in zip(seqs, names, tensors, labels, strict=False)
        ]
        self.entries.update(zip(seqs, entries, strict=True))
        self.names += len(seqs)
        profile = self.profile
        if profile is not None:
            profile.tensors += len(seqs)
            profile.bytes += nbytes
        self.batch.extend(entries)
        self.batch_tensors.extend(tensors)
        self.batch_bytes += nbytes
        if self.batch_bytes >= _BATCH_BYTES or len(self.batch) >= _BATCH_TENSORS:
            self._flush_batch()

    def _drained_whole(
        self, seqs: list[int], names: list[Any], tensors: list[Any], nbytes: int, wrote: list[str] | None
    ) -> bool:
        """A big drain of one dtype (a full bucket) digested at once and kept as columns (`TensorColumns`, one
        `tensors` line in the record: no dict per tensor); False, having done nothing, otherwise."""
        from weightcheck.tap.digesting import describe_bucket

        if self.arrival_versions and not self._unwritten(seqs, tensors):
            return False  # the per-entry path records the tensors the engine wrote into
        timings: dict[str, float] | None = {} if self.profile is not None else None
        try:
            with GCPaused():
                # (The bucket's tensors are exactly `torch.Tensor` on the CPU: `_lazy` checked each.)
                columns = describe_bucket(tensors, self.algorithm, timings)
        except Exception as exc:  # the batch path digests them (one at a time if need be)
            _fail("digesting a batch of tensors", exc)
            return False
        if columns is None:
            return False
        dtype, hexes, zeros, nonfinite, shapes = columns
        count = len(seqs)
        with GCPaused():
            if set(map(type, names)) != {str}:
                names = [name if type(name) is str else str(name) for name in names]
            block = TensorColumns(
                call=self.index,
                seqs=seqs,
                names=names,
                dtype=dtype,
                # Plain tuples (torch.Size is a subclass orjson does not take), which the collector stops tracking.
                shapes=shapes,
                algorithm=self.algorithm,
                hexes=hexes,
                zeros=zeros,
                nonfinite=nonfinite,
                wrote=list(zip(wrote, strict=True)) if wrote is not None else [()] * count,  # (name,) each
            )
            self.entries.add_columns(block)
        self.names += count
        if self.profile is not None:
            self.profile.tensors += count
            self.profile.bytes += nbytes
            if timings:
                self.profile.add_timings(timings)
        return True

    def _moved(self, seqs: Iterable[int], tensors: list[Any]) -> list[int]:
        """The positions of the tensors whose version counter moved since they arrived (the engine wrote into
        them); their arrival versions are taken. The caller holds `self.lock`. (Only a tensor with an arrival
        version has its counter read: one made under `torch.inference_mode` has none, and reading it raises.)"""
        pop = self.arrival_versions.pop
        return [
            i
            for i, (seq, tensor) in enumerate(zip(seqs, tensors, strict=True))
            if (v := pop(seq, None)) is not None and v != tensor._version
        ]

    def _unwritten(self, seqs: list[int], tensors: list[Any]) -> bool:
        """Whether no tensor of these moved its version counter since it arrived (`_moved`); a moved one's
        arrival version is put back as -1 (never a version), so that `_flush_batch` records it."""
        moved = self._moved(seqs, tensors)
        for i in moved:
            self.arrival_versions[seqs[i]] = -1
        return not moved

    def _flush_batch(self) -> None:
        """Digest the waiting small tensors on this thread (handing thousands of tiny jobs to the digest threads
        costs more in hand-offs and GIL waits than the digests themselves). The caller holds `self.lock`."""
        batch, tensors = self.batch, self.batch_tensors
        self.batch, self.batch_tensors, self.batch_bytes = [], [], 0
        if not batch:
            return
        if self.arrival_versions:
            moved = self._moved(map(operator.itemgetter("seq"), batch), tensors)
            if moved:  # the engine wrote into a tensor it was handed: recorded as such, the others digested
                for i in moved:
                    _mark_wrote_into(batch[i], tensors[i], self.algorithm)
                gone = set(moved)
                batch = [e for i, e in enumerate(batch) if i not in gone]
                tensors = [t for i, t in enumerate(tensors) if i not in gone]
                if not batch:
                    return
        from weightcheck.tap.digesting import describe_batch

        timings: dict[str, float] | None = {} if self.profile is not None else None
        try:
            with GCPaused():
                describe_batch(tensors, self.algorithm, timings, into=batch)
        except Exception as exc:  # one odd tensor must not cost the others their digest
            _fail("digesting a batch of tensors", exc)
            for entry, tensor in zip(batch, tensors, strict=True):
                _fill_digest(entry, tensor, self.algorithm, self.profile)
            return
        if self.profile is not None and timings:
            self.profile.add_timings(timings)

    def wrap(self, weights: Any) -> Any:
        """The weights to pass on: a list is recorded now and passed unchanged, an iterator lazily.

        A list's tensors stay alive for the call (the caller holds them), so each one's version counter is kept
        with it and read again when the call ends (`finish`): one the engine wrote into is marked (a parameter
        written from it need not hold what arrived: WC743 does not judge it) and its name is digested on
        arrival from then on."""
        if isinstance(weights, (list, tuple)):
            tensor_type = torch_module().Tensor
            listed = self.listed
            coverage = self.coverage
            for item in weights:
                self._observe_item(item)
                try:
                    name, tensor = item[0], item[1]
                    if isinstance(tensor, tensor_type):
                        listed.append((coverage.current_seq, name, tensor, tensor._version))
                except (TypeError, IndexError, KeyError, RuntimeError):  # (RuntimeError: no version counter)
                    continue
            return weights
        return self._lazy(weights)

    def _observe_item(self, item: Any) -> None:
        for _ in self._lazy((item,)):
            pass

    def _lazy(self, weights: Iterable[Any]) -> Iterator[Any]:
        """Each item handed on as it comes. A small CPU tensor (the common case of a many-tensor stream) only
        goes into the coverage bucket, under its lock: its entry, digest and filing wait for the bucket to be
        drained (`CallCoverage.drain`: when it is full, before any other incoming tensor or write that needs
        the index, and when the call ends). Everything else goes through `observe`."""
        observe = self.observe
        coverage = self.coverage
        lock = coverage._lock
        counter = self.counter
        tensor_type = torch_module().Tensor
        bucketed = self.bucketed
        versions = self.arrival_versions
        wrote_into = wrote_into_names()
        for item in weights:
            try:
                name, tensor = item[0], item[1]
            except (TypeError, IndexError, KeyError):
                yield item
                continue
            try:
                # Exactly `torch.Tensor` (a subclass may lack storage or override the properties read here).
                # (A name the engine wrote into before goes through `observe`, which digests it on arrival.)
                if (
                    bucketed
                    and type(tensor) is tensor_type
                    and tensor.is_cpu
                    and not (wrote_into and name in wrote_into)
                ):
                    nbytes = tensor.nbytes
                    if nbytes <= _SMALL_TENSOR_BYTES:
                        with lock:
                            # A full bucket is drained when the next tensor comes, not as it fills: by then the
                            # writes of its last tensor are logged too (the drain's common case).
                            if coverage.bucket_bytes >= _BATCH_BYTES or len(coverage.bucket_seqs) >= _BATCH_TENSORS:
                                coverage._drain_locked()
                            seq = next(counter)
                            # Checked when it is digested (`_flush_batch`, `_drained_whole`). (Not
                            # `contextlib.suppress`: a context manager per tensor costs more than the read.)
                            try:  # noqa: SIM105
                                versions[seq] = tensor._version
                            except RuntimeError:  # a tensor made under torch.inference_mode has none
                                pass
                            coverage.current_seq = seq
                            coverage._last = tensor
                            coverage.last_in_bucket = True
                            coverage.bucket_seqs.append(seq)
                            coverage.bucket_names.append(name)
                            coverage.bucket_tensors.append(tensor)
                            coverage.bucket_bytes += nbytes
                        yield item
                        continue
                observe(name, tensor)
            except Exception as exc:
                _fail("recording a tensor", exc)
            yield item

    def finish(self) -> None:
        profile = self.profile
        try:
            try:
                self.coverage.drain()
            finally:
                with self.lock:
                    self._flush_batch()
        finally:
            if profile is not None:
                waited = time.perf_counter()
            for future in self.futures:
                future.result()
            self.futures.clear()
            if self.device_batch is not None and self.device_batch.waiting():
                self.device_batch.collect(self.algorithm)
            with self.lock:
                self._check_previous()
            for seq, name, tensor, version in self.listed:
                if version_of(tensor) != version:
                    listed_entry = self.entries.get(seq) if seq is not None else None
                    if listed_entry is not None:
                        listed_entry["engine_wrote"] = True
                    note_wrote_into(name)
            self.listed.clear()
            if profile is not None:
                finishing = time.perf_counter()
                profile.add("wait", finishing - waited)
            self.coverage.detach()
            for name in ENGINE_LOGGERS:
                logging.getLogger(name).removeHandler(self.capture)
            self.sync.calls.append(
                {
                    "t": "call",
                    "call": self.index,
                    "names": self.names,
                    "seconds": round(time.perf_counter() - self.started, 6),
                    "error": self.error,
                    "engine_warnings": self.capture.messages,
                    "unattributed_writes": self.coverage.unattributed_writes,
                }
            )
            if profile is not None:
                profile.add("bookkeeping", time.perf_counter() - finishing)


def _default_loader_for(model: Any) -> Callable[..., Any] | None:
    """The loader the engine uses for parameters without a `weight_loader` attribute: the engine hooks' one,
    else SGLang's `default_weight_loader` for a class defined in an `sglang` module (so that `tap.install` on
    an SGLang class tracks norms and routers without extra setup), else None (those parameters untracked)."""
    if _STATE.hooks.default_loader is not None:
        return _STATE.hooks.default_loader
    if not type(model).__module__.startswith("sglang.") and not any(
        base.__module__.startswith("sglang.") for base in type(model).__mro__
    ):
        return None
    try:
        from sglang.srt.model_loader.weight_utils import default_weight_loader
    except Exception:
        return None
    return default_weight_loader  # type: ignore[no-any-return]


def _fill_digest(
    entry: dict[str, Any], tensor: Any, algorithm: str, profile: _Profile | None = None, version: int | None = None
) -> None:
    """The tensor's digest and statistics into its entry; `version`: its version counter when it arrived (a
    digest thread's tensor), checked after the digest."""
    from weightcheck.tap.digesting import describe_one_pass

    timings: dict[str, float] | None = {} if profile is not None else None
    entry.update(describe_one_pass(tensor, algorithm, timings))
    if version is not None and version_of(tensor) != version:
        _mark_wrote_into(entry, tensor, algorithm)
    if profile is not None and timings:
        profile.add_timings(timings)


def _mark_wrote_into(entry: dict[str, Any], tensor: Any, algorithm: str) -> None:
    """The entry of a tensor the engine wrote into before the tap digested it: its dtype and shape, no digest
    (what arrived is unknown), and why (verify reports it as not compared, WC746); its name is digested on
    arrival from now on."""
    from weightcheck.tensors import safetensors_dtype

    entry.update(
        {
            "dtype": safetensors_dtype(tensor.dtype) or str(tensor.dtype),
            "shape": tuple(tensor.shape),
            algorithm: None,
            "zeros": None,
            "nonfinite": None,
            "error": ENGINE_WROTE_INTO_SENT,
            "engine_wrote": True,
        }
    )
    note_wrote_into(entry["name"])


def _split_weights(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    if args:
        return args[0], args[1:], kwargs
    rest = dict(kwargs)
    return rest.pop("weights"), (), rest


def tap_load_weights(original_fn: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook for `Model.load_weights(self, weights, ...)` (SGLang `HookType.AROUND` signature)."""
    config = _STATE.config
    if config is None or getattr(_STATE.local, "active", False) or (not args and "weights" not in kwargs):
        return original_fn(model, *args, **kwargs)
    call: _Call | None = None
    try:
        with _STATE.lock:
            implicit = _STATE.current is None
            begin_sync(source="call")
            assert _STATE.current is not None
            call = _Call(_STATE.current.part(runner_of(model)), model, config, implicit)
        weights, rest, extra = _split_weights(args, kwargs)
        weights = call.wrap(weights)
    except Exception as exc:
        if call is not None:
            with contextlib.suppress(Exception):
                call.finish()
        _fail("starting the tap", exc)
        return original_fn(model, *args, **kwargs)
    _STATE.local.active = True
    try:
        return original_fn(model, weights, *rest, **extra)
    except BaseException as exc:
        call.error = f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        _STATE.local.active = False
        try:
            with _STATE.lock:
                call.finish()
                if call.implicit:
                    end_sync()
        except Exception as exc:
            _fail("finishing the tap", exc)


# ---- installing without a plugin system ------------------------------------------------------------------


def install(klass: type, method: str = "load_weights") -> None:
    """Class patch (the fallback for engines without SGLang's plugin hooks): wrap `klass.<method>`."""
    import functools

    original = getattr(klass, method)
    if getattr(original, "__weightcheck_tap__", False):
        return

    @functools.wraps(original)
    def tapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return tap_load_weights(original, self, *args, **kwargs)

    tapped.__wrapped__ = original  # type: ignore[attr-defined]
    tapped.__weightcheck_tap__ = True  # type: ignore[attr-defined]
    # functools.wraps copies SGLang's FlashRL marker, which must point at the callable actually installed.
    if getattr(original, "_supports_quantized_rl_reload", None) is not None:
        tapped._supports_quantized_rl_reload = tapped  # type: ignore[attr-defined]
    setattr(klass, method, tapped)


def uninstall(klass: type, method: str = "load_weights") -> None:
    """Undo `install` (only the tap's own wrapper is removed)."""
    current = klass.__dict__.get(method)
    if current is not None and getattr(current, "__weightcheck_tap__", False):
        setattr(klass, method, current.__wrapped__)


def wrap(model: Any, method: str = "load_weights") -> Any:
    """Instance wrap: tap `model.<method>` (a bound method) of this one object, leaving its class alone.

    For a model built elsewhere, a trainer-side replica (P2P transports), or a loader object whose method is
    not on a class you want to patch. Returns `model`; `unwrap(model)` undoes it. Idempotent."""
    import functools

    bound = getattr(model, method)
    if getattr(bound, "__weightcheck_tap__", False):
        return model
    original = getattr(bound, "__func__", None)

    if original is not None and getattr(bound, "__self__", None) is model:

        @functools.wraps(original)
        def tapped(*args: Any, **kwargs: Any) -> Any:
            return tap_load_weights(original, model, *args, **kwargs)

    else:  # a plain callable stored on the instance (no `self`): adapt it to the hook's signature

        def call(_model: Any, *args: Any, **kwargs: Any) -> Any:
            return bound(*args, **kwargs)

        @functools.wraps(bound)
        def tapped(*args: Any, **kwargs: Any) -> Any:
            return tap_load_weights(call, model, *args, **kwargs)

    tapped.__wrapped__ = bound  # type: ignore[attr-defined]
    tapped.__weightcheck_tap__ = True  # type: ignore[attr-defined]
    if getattr(bound, "_supports_quantized_rl_reload", None) is not None:
        tapped._supports_quantized_rl_reload = tapped  # type: ignore[attr-defined]
    # nn.Module.__setattr__ stores plain callables in the instance __dict__, which shadows the class method.
    object.__setattr__(model, method, tapped)
    return model


def unwrap(model: Any, method: str = "load_weights") -> Any:
    """Undo `wrap` on this object."""
    current = model.__dict__.get(method)
    if current is not None and getattr(current, "__weightcheck_tap__", False):
        wrapped = current.__wrapped__
        if getattr(wrapped, "__self__", None) is model:
            del model.__dict__[method]
        else:
            object.__setattr__(model, method, wrapped)
    return model
