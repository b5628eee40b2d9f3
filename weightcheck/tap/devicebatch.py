"""Digests and statistics of a call's GPU tensors with one device-to-host copy per call, not several per tensor.

With the on-device digest (`posmix128`), each incoming CUDA tensor of a dtype below is digested (the fused
kernel, `weightcheck.fuseddigest`, or the eager kernels) and reduced for its statistics on its own device, into
device scalars, on the engine's thread and stream: nothing waits for the GPU. When the call ends, one copy brings
every tensor's values back and their entries are filled, with exactly what `describe_tensor` records.

Why: the digest threads waited for the GPU several times per tensor (the digest's two lanes, then min/max, each a
device-to-host copy queued behind the engine's own copies on the stream). On an H100 that was +34 % (1 GB) to
+50 % (10 GB) of `load_weights` (benchmarks/bench_tap.py --device cuda), for kernels that take a few percent.

Stream order keeps this right: the kernels are queued on the stream the engine loads on, after the tensor was
made and before the engine's allocator can hand its memory to anything else.

Held for one launch (opt-in, WEIGHTCHECK_DEVICE_HOLD=1): a contiguous tensor of a fused dtype is not launched
on arrival but held (a reference, no copy) until the call ends or HOLD_BYTES / HOLD_TENSORS are held, then the
held tensors of a dtype class go to the device in one launch of the many-tensor kernel
(`fuseddigest.fused_stats_many`). Why: a launch costs the host 47-70 µs right after the engine's own copy, about
the whole 5 % budget of a 13.5 MB tensor's load (an H100, benchmarks/gpu_host_cost.py); held, a tensor costs a
few list appends. What it assumes: the engine does not write into the tensor it was handed before the call
ends. A write through the tensor or a view of it moves its version counter, and new storage moves its address:
such a tensor is recorded as not digested, never with the bytes the engine wrote, and its name is launched on
arrival from then on (tensors made under `torch.inference_mode` have no version counter: a write into one goes
unseen; SGLang's scheduler runs without it unless SGLANG_ENABLE_TORCH_INFERENCE_MODE is set).

Why it is not the default: SGLang 0.5.23 has loaders that write into what they are handed (Gemma adds 1 to
each norm weight, `models/gemma.py`; GPT-OSS zeroes `w2_weight_bias` on TP ranks above 0 of a BF16 model,
`models/gpt_oss.py`), so the first sync would report those tensors as not digested; and on an H100 the held
path was measured only before its table copy stopped waiting for the stream (benchmarks/results/h100-2026-11-27-hold/).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from weightcheck.fuseddigest import fused_lanes_and_stats, fused_stats_at, fused_stats_many
from weightcheck.posmix import _byte_view, torch_module
from weightcheck.tap.digesting import digest_on_arrival, fast_dtype, note_wrote_into, version_of
from weightcheck.tap.records import ENGINE_WROTE_INTO_SENT

# The dtypes the batch takes: those whose statistics `tensor_stats` computes with plain reductions on every
# device (float8 and complex keep the per-tensor path). Their safetensors names, widths and NaN/Inf patterns
# come from the one-pass table (`weightcheck.tap.digesting.fast_dtype`).
TAKEN = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")

# The fused kernel adds into a row of a zeroed block of this many rows (one allocation and fill per block, not
# per tensor: on the tap's GPU path the host's work per tensor is what the sync pays for, benchmarks/bench_tap.py).
SLAB_ROWS = 256

# Held for one launch: at most this many bytes of received tensors (references to the engine's own tensors; on
# the engine's update paths a call's tensors are alive for the whole call anyway) and this many tensors (one row
# each in the launch's table), then launched. Not one launch per call: a launch at the call's end reads every
# byte while the sync waits, where launches during the call run while the host makes the engine's next copies
# (1 GiB held: the call's end waited 9 ms for a 1 GB stream on an H100, benchmarks/gpu_tap_steps.py).
ENV_HOLD = "WEIGHTCHECK_DEVICE_HOLD"
HOLD_BYTES = 64 << 20
HOLD_TENSORS = 256


def hold_enabled(environ: Any = None) -> bool:
    """WEIGHTCHECK_DEVICE_HOLD=1 holds; off by default (see the module's docstring for why)."""
    env = os.environ if environ is None else environ
    return (env.get(ENV_HOLD) or "0").strip().lower() in ("1", "true", "yes", "on")


def fused_spec(dtype: Any) -> tuple[int, int] | None:
    """(float width in bytes, exponent-all-ones pattern) of a taken dtype for the fused digest-and-statistics
    kernel (`weightcheck.fuseddigest.fused_lanes_and_stats`): width 0 (no NaN/Inf to count) for integers and
    bool; None for float64, whose pattern needs 64-bit words (it takes the eager reductions)."""
    _name, itemsize, pattern = fast_dtype(dtype)  # type: ignore[misc]
    if pattern is None:
        return (0, 0)
    return (itemsize, int(pattern)) if itemsize in (2, 4) else None


class DeviceBatch:
    """The device values of one call's GPU tensors, until `collect` fills their entries.

    The per-tensor path is kept short on purpose (a dtype's plan and whether the fused kernel may run are decided
    once per batch, imports are bound once): on the GPU the sync waits for the host's work per tensor, not for the
    kernel (benchmarks/bench_fused_digest.py, bench_tap.py --device cuda)."""

    def __init__(self) -> None:
        # (entry, dtype name, byte count, whether the 4th value counts NaN/Inf (else finite values), element
        # count, [lane a, lane b, nonzero, NaN/Inf or finite count] on the device)
        self.pending: list[tuple[dict[str, Any], str, int, bool, int, Any]] = []
        # device -> an iterator over the zeroed rows of its current block not handed out yet
        self._slabs: dict[Any, Any] = {}
        self.raw_added = 0  # tensors launched with raw addresses (the tests and benchmarks read it)
        # device -> rows taken for a raw launch that did not happen (still zero): handed out before new ones
        self._spares: dict[Any, list[tuple[Any, int]]] = {}
        # dtype -> (safetensors name, the fused kernel's (width, pattern) or None)
        self._plans: dict[Any, tuple[str, tuple[int, int] | None]] = {}
        # device type -> whether the fused kernel may run (decided at the batch's first tensor; off after a failure)
        self._fused_ok: dict[str, bool] = {}
        # Held for one launch: (device, (width, pattern)) -> [(entry, dtype name, byte count, element count,
        # tensor, its address, its version counter or None)]; guarded by the lock (a loader thread may add too).
        self.hold = hold_enabled()
        self._held: dict[tuple[Any, tuple[int, int]], list[tuple[dict[str, Any], str, int, int, Any, int, Any]]] = {}
        self._held_bytes = 0
        self._held_count = 0
        self._lock = threading.Lock()
        # Entries of held tensors not digested: written into or given new storage while held, or not launchable
        self._undigested: list[dict[str, Any]] = []
        # Launched held tensors: (their items, as `pending`'s without values; the launch's int64 [T, 4] output)
        self._launched: list[tuple[list[tuple[dict[str, Any], str, int, bool, int, Any]], Any]] = []
        self.many_launches = 0  # launches of the many-tensor kernel (the tests and benchmarks read it)
        # device -> (a zeroed int64 [SLAB_ROWS, 4] block of launch rows, how many rows were handed out)
        self._blocks: dict[Any, tuple[Any, int]] = {}

    # Whether `add` may launch the fused kernel with raw addresses (`fused_stats_at`): off, every tensor takes
    # the view-making path (benchmarks/gpu_tap_steps.py compares the two in one run; the tests, both).
    raw_launches = True

    @staticmethod
    def takes(tensor: Any) -> bool:
        """A dense CUDA tensor of a dtype above (the others keep the per-tensor path). No complex dtype is
        taken, so the conjugate bit cannot be set; the negative bit can (`torch._neg_view`)."""
        return (
            tensor.is_cuda and tensor.dtype in _taken_dtypes() and tensor.layout is _strided() and not tensor.is_neg()
        )

    def add(self, entry: dict[str, Any], tensor: Any) -> None:
        """Queue the tensor's digest and statistics on its device, or hold it for one launch with others
        (raises what the kernels raise)."""
        plan = self._plans.get(tensor.dtype)
        if plan is None:
            plan = self._plans[tensor.dtype] = (fast_dtype(tensor.dtype)[0], fused_spec(tensor.dtype))  # type: ignore[index]
        st_name, spec = plan
        if spec is not None and self.hold and tensor.is_contiguous() and not digest_on_arrival(entry.get("name")):
            n_bytes = tensor.nbytes
            address = tensor.data_ptr()
            if n_bytes and not (n_bytes & 3 or address & 3) and self._usable(tensor.device):
                entry["dtype"], entry["shape"] = st_name, tuple(tensor.shape)
                item = (entry, st_name, n_bytes, tensor.numel(), tensor, address, version_of(tensor))
                with self._lock:
                    self._held.setdefault((tensor.device, spec), []).append(item)
                    self._held_bytes += n_bytes
                    self._held_count += 1
                    full = self._held_bytes >= HOLD_BYTES or self._held_count >= HOLD_TENSORS
                if full:
                    self.flush()
                return
        self._add_now(entry, tensor, st_name, spec)

    def _add_now(self, entry: dict[str, Any], tensor: Any, st_name: str, spec: tuple[int, int] | None) -> None:
        """Queue the tensor's kernels on its device now."""
        if spec is not None and self.raw_launches and tensor.is_contiguous():
            # The common tensor: launched with raw addresses, no view made (`fused_stats_at`).
            row = self._row(tensor.device)
            if row is not None:
                try:
                    launched = fused_stats_at(tensor, spec[0], spec[1], row[1])
                except Exception as exc:
                    self._failed(tensor.device, exc)
                    launched = False
                if launched:
                    self.raw_added += 1
                    entry["dtype"], entry["shape"] = st_name, tuple(tensor.shape)
                    self.pending.append((entry, st_name, tensor.nbytes, True, tensor.numel(), row[0]))
                    return
                # Not launched: the row is still zero; the next row handed out on this device is this one.
                self._spares.setdefault(tensor.device, []).append(row)
        torch = torch_module()
        data = _byte_view(tensor)
        numel = tensor.numel()
        values = self._fused(data, spec) if numel and spec is not None else None
        counts_nonfinite = values is not None
        if values is None:
            from weightcheck.devdigest import device_lanes

            lanes = device_lanes(data)
            if numel == 0:
                values = lanes
            else:
                nonzero = data.any().reshape(1).to(torch.int64)
                if tensor.is_floating_point():
                    finite = torch.isfinite(tensor.detach()).sum().reshape(1)
                else:
                    finite = torch.full((1,), numel, dtype=torch.int64, device=data.device)
                values = torch.cat((lanes, nonzero, finite))
        entry["dtype"], entry["shape"] = st_name, tuple(tensor.shape)
        self.pending.append((entry, st_name, data.numel(), counts_nonfinite, numel, values))

    def _row(self, device: Any) -> tuple[Any, int] | None:
        """A zeroed row of the device's block not handed out before, with its device address; None where the
        fused kernel may not run (not usable here, or it failed)."""
        if not self._usable(device):
            return None
        spares = self._spares.get(device)
        if spares:
            try:
                return spares.pop()  # one step under the GIL: a spare row goes to one caller
            except IndexError:  # another thread took the last one meanwhile
                pass
        # A row is handed out once, whatever the kernel does with it; `next` on the rows' iterator is one step
        # under the GIL, so two threads adding at once never share a row.
        rows = self._slabs.get(device)
        row = next(rows, None) if rows is not None else None
        if row is None:
            torch = torch_module()
            slab = torch.zeros((SLAB_ROWS, 4), dtype=torch.int64, device=device)
            base, stride = slab.data_ptr(), 4 * slab.element_size()
            addresses = range(base, base + SLAB_ROWS * stride, stride)
            rows = self._slabs[device] = zip(slab.unbind(0), addresses, strict=True)
            row = next(rows)
        return row

    def _usable(self, device: Any) -> bool:
        """Whether the fused kernels may run on this device (decided once per batch; off after a failure)."""
        usable = self._fused_ok.get(device.type)
        if usable is None:
            from weightcheck.devdigest import fused_usable

            usable = self._fused_ok[device.type] = fused_usable(device.type)
        return usable

    def flush(self) -> None:
        """Launch the held tensors: one many-tensor launch per device and dtype class. A tensor written into
        (its version counter moved) or given new storage (its address moved) while held is recorded as not
        digested; if a launch fails, its tensors take the one-at-a-time path (the eager kernels from then on)."""
        with self._lock:
            held, self._held = self._held, {}
            self._held_bytes = self._held_count = 0
        if not held:
            return
        for (device, spec), items in held.items():
            live = []
            for item in items:
                tensor, address, version = item[4], item[5], item[6]
                if tensor.data_ptr() != address or (version is not None and version_of(tensor) != version):
                    self._undigested.append(item[0])  # (recorded as such at `collect`; WC746)
                    item[0]["engine_wrote"] = True
                    if "name" in item[0]:
                        note_wrote_into(item[0]["name"])
                    continue
                live.append(item)
            # Addresses on 16 bytes and word counts of 16 (a fresh allocation of the usual sizes): the kernel told
            # so loads four words at a time; the others (views at odd offsets, odd sizes) in a launch of their own.
            aligned = [item for item in live if not (item[5] & 15 or item[2] & 63)]
            if len(aligned) < len(live):
                others = [item for item in live if item[5] & 15 or item[2] & 63]
                self._launch(device, spec, others, False)
            self._launch(device, spec, aligned, True)

    def _launch(self, device: Any, spec: tuple[int, int], live: list[Any], aligned: bool) -> None:
        """One launch of the many-tensor kernel over held tensors; if it fails, they take the one-at-a-time path."""
        if not live:
            return
        torch = torch_module()
        rows: list[int] = []
        for item in live:
            rows += (item[5], item[2] >> 2)
        try:
            table = torch.tensor(rows, dtype=torch.int64).reshape(-1, 2)
            # From pinned memory without waiting: a copy from pageable memory waits for the stream, that is for
            # every copy the engine queued before (+140 ms on a 10 GB sync on an H100). The host allocator keeps
            # the pinned block until the copy is done.
            pinned = device.type == "cuda"
            table = table.pin_memory().to(device, non_blocking=True) if pinned else table.to(device)
            out = self._block(device, len(live))
            fused_stats_many(table, out, max(item[2] for item in live) >> 2, *spec, aligned=aligned)
        except Exception as exc:
            self._failed(device, exc)
            for entry, st_name, _n_bytes, _numel, tensor, _address, _version_then in live:
                try:
                    self._add_now(entry, tensor, st_name, spec)
                except Exception as again:  # as `describe_tensor` records a tensor it cannot digest
                    self._undigested.append(entry)
                    entry["error"] = f"cannot digest: {again}"[:300]
            return
        self.many_launches += 1
        # No view per row: the block is read whole at `collect` (a view costs the host a few µs each).
        group = [(entry, st_name, n_bytes, True, numel, None) for entry, st_name, n_bytes, numel, *_ in live]
        self._launched.append((group, out))

    def _block(self, device: Any, n_rows: int) -> Any:
        """`n_rows` zeroed rows of the device's current block of launch rows not handed out before (a view), or
        of a new block: one allocation and fill per SLAB_ROWS rows, not per launch."""
        torch = torch_module()
        if n_rows > SLAB_ROWS:
            return torch.zeros((n_rows, 4), dtype=torch.int64, device=device)
        with self._lock:
            block, used = self._blocks.get(device, (None, SLAB_ROWS))
            if block is None or used + n_rows > SLAB_ROWS:
                block, used = torch.zeros((SLAB_ROWS, 4), dtype=torch.int64, device=device), 0
            self._blocks[device] = (block, used + n_rows)
        return block[used : used + n_rows]

    def _failed(self, device: Any, exc: Exception) -> None:
        from weightcheck.devdigest import fused_failed

        self._fused_ok[device.type] = False
        fused_failed(exc)

    def _fused(self, data: Any, spec: tuple[int, int]) -> Any:
        """[lane a, lane b, words with a bit set, NaN/Inf count] from one fused kernel, in a fresh zeroed row of
        the device's block, or None (not usable here, or it failed: logged once, the eager kernels from then on)."""
        try:
            row = self._row(data.device)
            if row is None:
                return None
            return fused_lanes_and_stats(data, *spec, out=row[0])
        except Exception as exc:
            self._failed(data.device, exc)
            return None

    def waiting(self) -> bool:
        """Whether anything is held or queued for `collect`."""
        return bool(self.pending or self._held or self._undigested or self._launched)

    def collect(self, algorithm: str) -> None:
        """Fill every queued entry (one copy per device); on a device error, each entry says it could not be
        digested, as `describe_tensor` does."""
        import torch

        from weightcheck.posmix import finalize

        self.flush()
        written, self._undigested = self._undigested, []
        for entry in written:
            entry.update({algorithm: None, "zeros": None, "nonfinite": None})
            entry.setdefault("error", ENGINE_WROTE_INTO_SENT)
        pending, self.pending = self.pending, []
        launched, self._launched = self._launched, []
        # Per device: the items in order and their values (a tensor's own, or one launch's [T, 4] block).
        by_device: dict[Any, tuple[list[tuple[dict[str, Any], str, int, bool, int, Any]], list[Any]]] = {}
        for item in pending:
            items, values = by_device.setdefault(item[5].device, ([], []))
            items.append(item)
            values.append(item[5])
        for group, block in launched:
            items, values = by_device.setdefault(block.device, ([], []))
            items += group
            values.append(block.reshape(-1))
        for items, values in by_device.values():
            try:
                flat = torch.cat(values).tolist()
            except (RuntimeError, TypeError, ValueError) as exc:
                for entry, *_ in items:
                    entry.update({algorithm: None, "zeros": None, "nonfinite": None})
                    entry["error"] = f"cannot digest: {exc}"[:300]
                continue
            at = 0
            for entry, _name, n_bytes, counts_nonfinite, numel, _values in items:
                entry[algorithm] = finalize(flat[at], flat[at + 1], n_bytes)
                if numel == 0:  # as `tensor_stats`: nothing to judge
                    entry["zeros"], entry["nonfinite"] = None, 0
                    at += 2
                    continue
                entry["zeros"] = flat[at + 2] == 0
                # The fused kernel counts NaN/Inf values; the eager reductions count finite ones.
                entry["nonfinite"] = flat[at + 3] if counts_nonfinite else numel - flat[at + 3]
                at += 4


@functools.cache
def _strided() -> Any:
    return torch_module().strided


@functools.cache
def _taken_dtypes() -> frozenset[Any]:
    torch = torch_module()
    return frozenset(getattr(torch, name) for name in TAKEN)
