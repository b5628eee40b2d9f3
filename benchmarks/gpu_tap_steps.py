"""Where the tap's added time goes in a GPU sync, step by step (diagnostic for issue #22, GPU).

    python benchmarks/gpu_tap_steps.py [--gb 1] [--rounds 15] [--keep DIR] [--json FILE]

bench_tap.py's ~1 GB stream (safetensors shard by shard, each tensor moved to the GPU with a pageable `.to`,
then SGLang's loading pattern), timed in alternating rounds in these variants:

- `off`: the untapped `load_weights` (the baseline of every row);
- `read`: off, plus one torch reduction per tensor on the GPU (bench_tap.py's "one extra read pass");
- `launch`: off, plus the tap's fused digest kernel launched per tensor outside the tap (the digest's floor);
- `launch-raw`: the same kernel launched with the tensor's address (`fused_stats_at`), no view made;
- `on`: the tap as shipped (posmix128 on the device);
- `on-views`: the tap with `DeviceBatch.raw_launches` off (each tensor's views made, the launcher reads them);
- `on-nokernel`: the tap with the device digest's kernel left out (the tap's bookkeeping alone);
- `on-state`: the tap with the engine-state digest (`WEIGHTCHECK_STATE=1`);
- `on-timed`: the tap with a timer around each of its steps (inclusive times, per load; the timers add a
  little of their own, so this row's total is not the `on` row's).

WEIGHTCHECK_DEVICE_HOLD=1 in the environment: GPU tensors held and launched together (the many-tensor kernel,
opt-in); run the script both ways in one lease to compare.

Reported: each variant's median load, its median added time against the `off` load of the same round (pairs),
per load and per tensor, and the timed steps' medians per load.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_tap
import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variants", default=None, help="comma-separated subset of the variants (default: all)")
    args = parser.parse_args()

    from safetensors import safe_open

    from weightcheck import tap
    from weightcheck.fuseddigest import fused_lanes_and_stats

    try:
        from weightcheck.fuseddigest import fused_stats_at
    except ImportError:  # a tree before the raw launches (this script run against a baseline's package)

        def fused_stats_at(*_args: Any) -> bool:
            return False

    from weightcheck.posmix import _byte_view
    from weightcheck.tap import core, coverage, devicebatch
    from weightcheck.tap.devicebatch import DeviceBatch, fused_spec

    device = torch.device(args.device)
    work = Path(tempfile.mkdtemp(prefix="gpu-tap-steps-"))
    ckpt = args.keep or work / "ckpt"
    if not (ckpt / "model.safetensors.index.json").exists():
        ckpt.mkdir(parents=True, exist_ok=True)
        bench_tap.write_checkpoint(ckpt, bench_tap.layers_for(args.gb))
    layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    shards = sorted(ckpt.glob("*.safetensors"))
    for shard in shards:
        shard.read_bytes()
    engine = bench_tap.GenericEngine(layers).to(device)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=bench_tap.default_loader))
    tap.install(bench_tap.GenericEngine)
    records = work / "records"
    width, pattern = fused_spec(torch.bfloat16)  # type: ignore[misc]
    rows = torch.zeros((4096, 4), dtype=torch.int64, device=device).unbind(0)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def stream(extra: Any = None) -> Any:
        for shard in shards:
            with safe_open(str(shard), framework="pt") as fh:
                for name in fh.keys():
                    tensor = fh.get_tensor(name).to(device)
                    if extra is not None:
                        extra(tensor)
                    yield name, tensor

    counter = iter(range(1 << 30))

    def read_pass(tensor: Any) -> None:
        tensor.reshape(-1).view(torch.uint8).any()

    def launch(tensor: Any) -> None:
        fused_lanes_and_stats(_byte_view(tensor), width, pattern, out=rows[next(counter) % len(rows)])

    def launch_raw(tensor: Any) -> None:
        row = rows[next(counter) % len(rows)]
        if not fused_stats_at(tensor, width, pattern, row.data_ptr()):
            fused_lanes_and_stats(_byte_view(tensor), width, pattern, out=row)

    # -- the tap's steps, timed (inclusive) ----------------------------------------------------------------
    timings: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    originals: list[tuple[Any, str, Any]] = []

    def timed(owner: Any, attribute: str, label: str) -> None:
        original = owner.__dict__[attribute]
        function = original.__func__ if isinstance(original, staticmethod) else original

        @functools.wraps(function)
        def wrapper(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                timings[label] += time.perf_counter() - started
                calls[label] += 1

        originals.append((owner, attribute, original))
        setattr(owner, attribute, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper)

    def untime() -> None:
        while originals:
            owner, attribute, original = originals.pop()
            setattr(owner, attribute, original)

    steps = [
        (core._Call, "__init__", "call: set-up (_Call.__init__)"),
        (core._Call, "observe", "observe (all of a GPU tensor's engine-thread work)"),
        (core._Call, "finish", "call: finish (drain, collect)"),
        (coverage.CallCoverage, "drain", "  coverage.drain"),
        (coverage.CallCoverage, "note_incoming", "  coverage.note_incoming"),
        (coverage.CallCoverage, "_index_pending", "    coverage._index_pending"),
        (coverage.CallCoverage, "record_plain_write", "write: record_plain_write"),
        (coverage.CallCoverage, "record_write", "write: record_write"),
        (DeviceBatch, "takes", "  DeviceBatch.takes"),
        (DeviceBatch, "add", "  DeviceBatch.add"),
        (DeviceBatch, "collect", "DeviceBatch.collect"),
        (DeviceBatch, "flush", "  DeviceBatch.flush (the held tensors' launch)"),
        (devicebatch, "fused_lanes_and_stats", "    fused_lanes_and_stats"),
        (core, "_close_sync", "sync: close and write the record"),
        (core, "write_atomic_bytes", "  write_atomic_bytes (encode, write, fsync)"),
        (os, "fsync", "    os.fsync"),
    ]

    real_add = DeviceBatch.add

    def add_without_kernel(self: Any, entry: dict[str, Any], tensor: Any) -> None:
        entry["dtype"], entry["shape"] = "BF16", tuple(tensor.shape)
        self.pending.append((entry, "BF16", tensor.nbytes, True, tensor.numel(), rows[0]))

    def load(variant: str) -> tuple[float, float]:
        extra = {"read": read_pass, "launch": launch, "launch-raw": launch_raw}.get(variant)
        if variant.startswith("on"):
            shutil.rmtree(records, ignore_errors=True)
            tap.configure(records, digest="posmix128", state=variant == "on-state")
        else:
            tap.configure(None)
        if variant == "on-views":
            DeviceBatch.raw_launches = False
        if variant == "on-nokernel":
            DeviceBatch.add = add_without_kernel  # type: ignore[method-assign]
        if variant == "on-timed":
            timings.clear()
            calls.clear()
            for owner, attribute, label in steps:
                timed(owner, attribute, label)
        synchronize()
        started, cpu = time.perf_counter(), time.process_time()
        try:
            engine.load_weights(stream(extra))
            synchronize()
            return time.perf_counter() - started, time.process_time() - cpu
        finally:
            untime()
            DeviceBatch.add = real_add  # type: ignore[method-assign]
            DeviceBatch.raw_launches = True
            tap.configure(None)

    variants = ["off", "read", "launch", "launch-raw", "on", "on-views", "on-nokernel", "on-timed", "on-state"]
    if args.variants:
        variants = ["off", *(v for v in variants if v != "off" and v in args.variants.split(","))]
    if device.type != "cuda":  # the kernel is Triton's on a GPU (the CPU run only checks this script)
        variants = [v for v in variants if not v.startswith("launch")]
    for variant in variants:  # warm-up: compile, first touches
        load(variant)
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    steps_per_load: dict[str, list[float]] = defaultdict(list)
    tensors = sum(1 for _ in stream())
    for round_ in range(args.rounds):
        order = variants if round_ % 2 == 0 else [variants[0], *reversed(variants[1:])]
        for variant in order:
            w, c = load(variant)
            wall[variant].append(w)
            cpu[variant].append(c)
            if variant == "on-timed":
                for label, seconds in timings.items():
                    steps_per_load[label].append(seconds)
    tap.uninstall(bench_tap.GenericEngine)

    def paired(variant: str, series: dict[str, list[float]]) -> float:
        return statistics.median(a - b for a, b in zip(series[variant], series["off"], strict=True))

    off = statistics.median(wall["off"])
    print(f"{device}: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, {tensors} tensors, "
          f"{sum(s.stat().st_size for s in shards) / 1e9:.2f} GB, {args.rounds} rounds")  # fmt: skip
    print("| variant | median load ms | added ms (paired median) | added % of off | µs per tensor | CPU added ms |")
    print("|---|---|---|---|---|---|")
    out: dict[str, Any] = {"tensors": tensors, "rounds": args.rounds, "wall": wall, "cpu": cpu}
    for variant in variants:
        added = paired(variant, wall) if variant != "off" else 0.0
        print(
            f"| {variant} | {statistics.median(wall[variant]) * 1e3:.1f} | {added * 1e3:+.2f} | "
            f"{added / off * 100:+.1f} | {added / tensors * 1e6:+.1f} | {paired(variant, cpu) * 1e3:+.2f} |"
        )
    print("\n| step (inclusive, on-timed) | ms per load (median) | calls per load | µs per call |")
    print("|---|---|---|---|")
    steps_out = {}
    for label, series in steps_per_load.items():
        per_load = statistics.median(series)
        count = calls.get(label, 0)
        steps_out[label] = {"ms_per_load": per_load * 1e3, "calls": count}
        print(f"| {label} | {per_load * 1e3:.2f} | {count} | {per_load / max(count, 1) * 1e6:.1f} |")
    out["steps"] = steps_out
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
