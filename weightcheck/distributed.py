"""The Ray backend of `lint --content --ray` and `diff --ray`: data-reading work as Ray tasks, merged into
the result a single process gives, in the same order.

This module knows chunks, tasks, placement and retries, not what a task computes: the data-reading
modules (weightcheck.scan, weightcheck.diffing) open a `session`, hand `run_work` their own task function
and work list, and turn failed chunks into their own findings. It imports none of them.

Work units. The single-process work walks its list in storage order (shard by shard, by offset). That list
is cut into contiguous chunks: one per shard, or several for a shard larger than `chunk_bytes`. A lint
task opens only its shard's header and runs the same `scan_tensors` the single process runs; a diff task
rebuilds the same pairing (`plan_diff`, deterministic) and runs `compare_pairs` on its slice. Results are
concatenated in chunk order, so the merged list is the single-process list, element for element, and the
rules and reporters downstream cannot tell the difference.

Placement. Before submitting, one probe task per alive node reports which of the needed files it can read
(same path, same size). When every node sees every file (a shared filesystem, or replicas) tasks go
wherever Ray puts them; otherwise each chunk is pinned (hard node affinity) to the least-loaded node that
holds its files. Every node needs weightcheck (with the [torch] extra) importable at the same version.

Failure. Tasks run with Ray's own retries off and are resubmitted by the driver, up to `max_retries`
times, so each retry is counted and reported in the notes; a chunk that still fails becomes per-tensor
errors (`WC608 content-not-checked` for lint, `WC715` skips for diff), never silently missing tensors.

Memory. A task holds one tensor's pages at a time (the single-process streaming reader) and returns
summaries (ranges, digests, verdicts), not data; the driver keeps only those summaries.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Default largest chunk of one task; a shard above it is split into byte ranges (runs of tensors).
CHUNK_BYTES = 1 << 30
MAX_RETRIES = 3
# Test hook: "SHARD:MARKER" makes the first task that reads SHARD kill its worker (os._exit) and leave
# MARKER behind, so the retry succeeds. Read by the driver and passed to tasks explicitly.
KILL_HOOK_ENV = "WEIGHTCHECK_TEST_RAY_KILL_ONCE"
# The last run's telemetry (benchmarks read it).
LAST_STATS: RunStats | None = None


class RayUnavailable(RuntimeError):
    pass


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        from weightcheck.deps import install_command

        raise RayUnavailable(f"--ray needs Ray: {install_command('ray')}") from None
    return ray


def _chunk_bytes() -> int:
    value = os.environ.get("WEIGHTCHECK_RAY_CHUNK_BYTES")
    return max(1, int(value)) if value and value.isdigit() else CHUNK_BYTES


def _init(ray: Any, address: str | None) -> None:
    """`ray.init` for `--ray [ADDRESS]`; a cluster that cannot be reached is RayUnavailable (one line, exit 2),
    never an internal error."""
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if address and address != "local":
        kwargs["address"] = address
    try:
        _probe_address(address)
        ray.init(**kwargs)
    except Exception as exc:  # ConnectionError, ValueError (bad address), RuntimeError (no cluster), ...
        where = f"the Ray cluster at {address}" if "address" in kwargs else "a local Ray instance"
        hint = "; `--ray` alone starts or joins a local Ray like ray.init()" if "address" in kwargs else ""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayUnavailable(f"--ray: cannot start or reach {where}: {message}{hint}") from None


def _probe_address(address: str | None, timeout: float = 10.0) -> None:
    """A `host:port` (or `ray://host:port`) nobody listens on: ray.init retries its GCS connection for many
    minutes, which looks like a hang. One TCP connect, bounded, says so at once."""
    import socket

    if not address or address in ("local", "auto"):
        return
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port: ray.init judges it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port} ({exc.strerror or exc})") from None


def connect(address: str) -> None:
    """Start or join Ray up front (the CLI, before any work): an unreachable cluster is one line and exit 2.
    The session opened here is the one the content checks then use (`session` joins it)."""
    ray = require_ray()
    if ray.is_initialized():
        return
    saved = sys.stdout
    sys.stdout = sys.stderr  # Ray's start-up banner must not land in a JSON/SARIF report on stdout
    try:
        _init(ray, address)
    finally:
        sys.stdout = saved


@contextmanager
def session(address: str | None) -> Iterator[Any]:
    """Use the running Ray session, else `ray.init(address)` for the duration: "local" (the `--ray` flag
    alone) starts or joins what `ray.init()` would (RAY_ADDRESS if set), anything else is a cluster
    address ("auto" too). Ray's driver prints worker and raylet errors (a killed worker...) to sys.stdout
    from a background thread: stdout is pointed at stderr meanwhile so the report stays parseable, and a
    session opened here is shut down before stdout is given back."""
    ray = require_ray()
    owned = not ray.is_initialized()
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        if owned:
            _init(ray, address)
        yield ray
    finally:
        if owned and ray.is_initialized():
            ray.shutdown()
        sys.stdout = saved


@dataclass
class Chunk:
    """A contiguous run of the work list, and the files it reads (relative to each side's root)."""

    start: int
    stop: int
    nbytes: int
    files: tuple[tuple[str, str], ...]  # (root, file)


@dataclass
class RunStats:
    tasks: int = 0
    retried: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    task_seconds: float = 0.0
    wall_seconds: float = 0.0
    bytes: int = 0  # data bytes the tasks report having read

    def note(self, what: str) -> str:
        text = (
            f"ray: {what} in {self.tasks} task(s) on {len(self.nodes)} node(s), {self.wall_seconds:.2f} s wall, "
            f"{self.task_seconds:.2f} s in tasks"
        )
        if self.retried:
            text += f"; retried: {'; '.join(self.retried[:10])}"
        if self.failed:
            text += f"; FAILED after retries: {'; '.join(self.failed[:10])}"
        return text

    def tell(self, what: str) -> None:
        """Execution telemetry (tasks, nodes, retries) goes to stderr, like progress: the result itself is the
        single-process result. A chunk that failed every attempt is in the result too (as per-item errors)."""
        print(self.note(what), file=sys.stderr)


def plan_chunks(items: list[tuple[int, tuple[tuple[str, str], ...]]], limit: int) -> list[Chunk]:
    """Cut a work list of (bytes, files read) into contiguous chunks: a new chunk when the files change
    (a new shard) or when the chunk would pass `limit` bytes (a byte range of a large shard)."""
    chunks: list[Chunk] = []
    for i, (nbytes, files) in enumerate(items):
        last = chunks[-1] if chunks else None
        if last is not None and set(files) <= set(last.files) and last.nbytes + nbytes <= limit:
            last.stop, last.nbytes = i + 1, last.nbytes + nbytes
        else:
            chunks.append(Chunk(i, i + 1, nbytes, files))
    return chunks


# ---- placement -------------------------------------------------------------------------------------------
def _probe(files: list[tuple[str, str, int]]) -> tuple[str, list[int]]:
    """On one node: which of (root, name, size) are readable regular files of that size."""
    import ray

    held = []
    for i, (root, name, size) in enumerate(files):
        path = os.path.join(root, name)
        try:
            if os.path.isfile(path) and os.path.getsize(path) == size:
                held.append(i)
        except OSError:
            pass
    return ray.get_runtime_context().get_node_id(), held


def placement(ray: Any, chunks: list[Chunk], sizes: dict[tuple[str, str], int]) -> list[Any]:
    """A scheduling strategy per chunk: None when every node holds every file, else hard node affinity to
    the least-loaded node that holds all of the chunk's files (None when no node does: the task then fails
    where Ray runs it, and is reported)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    if len(nodes) <= 1:
        return [None] * len(chunks)
    wanted = sorted(sizes)
    files = [(root, name, sizes[(root, name)]) for root, name in wanted]
    remote = ray.remote(num_cpus=0.01, max_retries=1)(_probe)
    refs = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(files)
        for node in nodes
    ]
    holds = {node: {wanted[i] for i in held} for node, held in ray.get(refs)}
    if all(len(h) == len(wanted) for h in holds.values()):
        return [None] * len(chunks)
    load = dict.fromkeys(holds, 0)
    out: list[Any] = []
    for chunk in chunks:
        candidates = [n for n, h in holds.items() if set(chunk.files) <= h]
        if not candidates:
            out.append(None)
            continue
        node = min(candidates, key=lambda n: load[n])
        load[node] += chunk.nbytes
        out.append(NodeAffinitySchedulingStrategy(node, soft=False))
    return out


# ---- running ---------------------------------------------------------------------------------------------
def run_chunks(
    ray: Any,
    fn: Callable[..., Any],
    chunks: list[Chunk],
    args_of: Callable[[Chunk], tuple[Any, ...]],
    strategies: list[Any],
    *,
    max_retries: int = MAX_RETRIES,
    progress: Any | None = None,
) -> tuple[list[Any], list[str | None], RunStats]:
    """Submit every chunk, collect results as they finish (streaming progress), resubmit failures. Returns
    per-chunk results (None for a chunk that failed every attempt), per-chunk final errors, and stats.
    `progress` (`advance(nbytes, label)`, `close()`) is advanced per finished chunk and closed at the end."""
    try:
        return _run_chunks(ray, fn, chunks, args_of, strategies, max_retries, progress)
    finally:
        if progress is not None:
            progress.close()


def _run_chunks(
    ray: Any,
    fn: Callable[..., Any],
    chunks: list[Chunk],
    args_of: Callable[[Chunk], tuple[Any, ...]],
    strategies: list[Any],
    max_retries: int,
    progress: Any | None,
) -> tuple[list[Any], list[str | None], RunStats]:
    started = time.perf_counter()
    remote = ray.remote(max_retries=0, num_cpus=1)(fn)
    stats = RunStats(tasks=len(chunks))
    results: list[Any] = [None] * len(chunks)
    errors: list[str | None] = [None] * len(chunks)
    attempts = [0] * len(chunks)

    def submit(i: int) -> Any:
        attempts[i] += 1
        options = {"scheduling_strategy": strategies[i]} if strategies[i] is not None else {}
        return remote.options(**options).remote(*args_of(chunks[i]))

    pending = {submit(i): i for i in range(len(chunks))}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            i = pending.pop(ref)
            try:
                value, meta = ray.get(ref)
            except Exception as exc:  # worker died, node lost, task raised
                why = _why(exc)
                if attempts[i] <= max_retries:
                    stats.retried.append(f"chunk {i} attempt {attempts[i]} ({why})")
                    pending[submit(i)] = i
                else:
                    errors[i] = f"Ray task failed {attempts[i]} time(s): {why}"
                    stats.failed.append(f"chunk {i} ({why})")
                    if progress is not None:
                        progress.advance(chunks[i].nbytes, "")
                continue
            results[i] = value
            stats.bytes += meta.get("bytes", 0)
            stats.nodes.add(meta["node"])
            stats.task_seconds += meta["seconds"]
            if progress is not None:
                progress.advance(chunks[i].nbytes, "")
    stats.wall_seconds = time.perf_counter() - started
    global LAST_STATS
    LAST_STATS = stats
    return results, errors, stats


def _why(exc: BaseException) -> str:
    # A RayTaskError's text is the remote traceback: its last line names the real exception.
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1].strip()[:200] if lines else ''}"


def _maybe_die(hook: str | None, files: tuple[tuple[str, str], ...]) -> None:
    if not hook or ":" not in hook:
        return
    shard, marker = hook.split(":", 1)
    if any(name == shard for _, name in files) and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os._exit(1)  # a hard worker death, as an OOM kill or a lost node looks to Ray


def _meta(started: float) -> dict[str, Any]:
    import ray

    return {"node": ray.get_runtime_context().get_node_id(), "seconds": time.perf_counter() - started}


def _run_task(
    task: Callable[..., tuple[Any, dict[str, Any]]], hook: str | None, files: tuple[tuple[str, str], ...], *args: Any
) -> tuple[Any, dict[str, Any]]:
    """What each Ray worker runs: the caller's `task(*args)` (which returns its value and extra telemetry,
    e.g. bytes read), timed and tagged with the node."""
    started = time.perf_counter()
    _maybe_die(hook, files)
    value, extra = task(*args)
    return value, {**_meta(started), **extra}


def run_work(
    ray: Any,
    task: Callable[..., tuple[Any, dict[str, Any]]],
    items: list[tuple[int, tuple[tuple[str, str], ...]]],
    args_of: Callable[[int, int, tuple[tuple[str, str], ...]], tuple[Any, ...]],
    sizes: Mapping[tuple[str, str], int],
    *,
    progress: Any | None = None,
) -> tuple[list[Chunk], list[Any], list[str | None], RunStats]:
    """Run a work list on the `ray` session: `items` is (bytes, files read) per work item, cut into chunks;
    each chunk runs `task(*args_of(start, stop, files))` on a node that holds its files (`sizes`: every
    file's size, for placement). `task` must be a module-level function (Ray pickles it by reference).
    Returns the chunks, per-chunk values (None for a chunk that failed every attempt), per-chunk final
    errors and the run's stats; the caller turns a failed chunk into its own per-item findings."""
    chunks = plan_chunks(items, _chunk_bytes())
    needed = {f for c in chunks for f in c.files}
    strategies = placement(ray, chunks, {f: sizes[f] for f in needed if f in sizes})
    hook = os.environ.get(KILL_HOOK_ENV)

    def chunk_args(chunk: Chunk) -> tuple[Any, ...]:
        return (task, hook, chunk.files, *args_of(chunk.start, chunk.stop, chunk.files))

    results, errors, stats = run_chunks(ray, _run_task, chunks, chunk_args, strategies, progress=progress)
    return chunks, results, errors, stats
