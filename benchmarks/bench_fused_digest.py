"""The fused posmix128 digest-and-statistics kernel on a GPU: GB/s against the device's own copy, and against
the kernel it replaced (one program per block of 1,024 words, e2695be), in the same run (issue #22).

    python benchmarks/bench_fused_digest.py [--gb 1] [--repeats 20] [--json out.json]

Three inputs: the tap's stream (BF16 tensors of ~13.5 MB, ~1 GB in all, kernels queued back to back with no
wait, as the tap queues them), one 1 GiB tensor, and many small tensors (16 KiB each: the host's cost per
launch). Each variant of the fixed grid (words per step, programs per multiprocessor, warps per program) is
checked equal, lane for lane and count for count, to the baseline kernel's output before it is timed. Times are
CUDA events around the whole stream, medians of --repeats; GB/s count tensor bytes read once (the copy's figure
counts its read and its write, as device copy bandwidth is usually quoted).

`--device cpu` runs a tiny version under Triton's interpreter (TRITON_INTERPRET=1): a check of this script,
not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def baseline_kernel(tl: Any) -> Any:
    """The kernel of e2695be: one program per block, four reductions and four atomics per block."""
    import triton

    def posmix_blocks(words_ptr, out_ptr, n_words, WIDTH: tl.constexpr, PATTERN: tl.constexpr,  # type: ignore[no-untyped-def]
                      BLOCK: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_words
        w32 = tl.load(words_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        word = w32.to(tl.uint64)
        k = offs.to(tl.uint64) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
        k = k ^ (k >> 31)
        x = (word ^ k) * 0xBF58476D1CE4E5B9
        x = x ^ (x >> 29)
        x = x * 0x94D049BB133111EB
        x = x ^ (x >> 32)
        x = tl.where(mask, x, 0)
        a = tl.sum(x, axis=0)
        b = tl.sum(x * (k | 1), axis=0)
        tl.atomic_add(out_ptr, a.to(tl.int64, bitcast=True))
        tl.atomic_add(out_ptr + 1, b.to(tl.int64, bitcast=True))
        set_words = tl.sum(tl.where(mask & (w32 != 0), 1, 0), axis=0)
        tl.atomic_add(out_ptr + 2, set_words.to(tl.int64))
        if WIDTH == 2:
            low = (w32 & 0x7FFF) >= PATTERN
            high = ((w32 >> 16) & 0x7FFF) >= PATTERN
            bad = tl.where(mask & low, 1, 0) + tl.where(mask & high, 1, 0)
            tl.atomic_add(out_ptr + 3, tl.sum(bad, axis=0).to(tl.int64))

    posmix_blocks.__globals__["tl"] = tl
    return triton.jit(posmix_blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton.language as tl

    from weightcheck import fuseddigest
    from weightcheck.posmix import _byte_view
    from weightcheck.tap.devicebatch import DeviceBatch, fused_spec

    device = torch.device(args.device)
    tiny = device.type == "cpu"
    width, pattern = fused_spec(torch.bfloat16)  # type: ignore[misc]
    per_tensor = (4096 * 1728 * 2) if not tiny else 8192  # bytes: 13.5 MiB, the 1 GB stream's tensors
    count = max(1, int(args.gb * 1e9 // per_tensor)) if not tiny else 3
    generator = torch.Generator(device="cpu").manual_seed(0)

    def random_bf16(n_bytes: int) -> Any:
        return torch.randn(n_bytes // 2, generator=generator).to(torch.bfloat16).to(device)

    stream = [_byte_view(random_bf16(per_tensor)) for _ in range(count)]
    big = [_byte_view(random_bf16((1 << 30) if not tiny else 1 << 16))]
    small = [_byte_view(random_bf16(16384)) for _ in range(4000 if not tiny else 4)]
    repeats = args.repeats if not tiny else 1
    old = baseline_kernel(tl)

    def run_baseline(data: Any) -> Any:
        out = torch.zeros(4, dtype=torch.int64, device=device)
        n_words = data.numel() // 4
        old[(fuseddigest.triton_cdiv(n_words, 1024),)](data.view(torch.int32), out, n_words, WIDTH=width,
                                                       PATTERN=pattern, BLOCK=1024)  # fmt: skip
        return out

    def run_variant(block: int, per_sm: int | None, warps: int) -> Any:
        programs = None
        if per_sm is not None and device.type == "cuda":
            programs = fuseddigest._multiprocessors(device.index) * per_sm

        def run(data: Any) -> Any:
            return fuseddigest.fused_lanes_and_stats(data, width, pattern, block, programs, warps)

        return run

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn: Any, inputs: list[Any]) -> tuple[float, float]:
        """(device seconds for the whole list, host seconds spent queueing it), medians."""
        for data in inputs[:3]:
            fn(data)
        sync()
        device_s, host_s = [], []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            for data in inputs:
                fn(data)
            host_s.append(time.perf_counter() - t0)
            if device.type == "cuda":
                end.record()
                end.synchronize()
                device_s.append(start.elapsed_time(end) / 1e3)
            else:
                device_s.append(host_s[-1])
        return statistics.median(device_s), statistics.median(host_s)

    variants: list[tuple[str, Any]] = [("baseline: one program per block of 1,024 words (e2695be)", run_baseline)]
    for block, per_sm, warps in [(1024, 4, 4), (2048, 4, 4), (2048, 8, 4), (4096, 2, 8), (512, 8, 4)]:
        label = f"fixed grid: {block} words/step, {per_sm}/SM, {warps} warps"
        variants.append((label, run_variant(block, per_sm, warps)))
    variants.append(("fixed grid, the package's defaults", run_variant(fuseddigest.BLOCK_WORDS, None, 4)))
    batch = DeviceBatch()
    batch.hold = False  # each launched on arrival (the held path: the many-tensor table below)

    def tap_path(data: Any) -> Any:
        batch.add({}, data.view(torch.bfloat16))
        return batch.pending.pop()[5]

    variants.append(("the tap's path on arrival: DeviceBatch.add (row of a zeroed block)", tap_path))

    want = [run_baseline(d).tolist() for d in stream[:4] + big + small[:4]]
    rows: list[dict[str, Any]] = []
    copy_s, _ = timed(lambda d: d.clone(), stream)
    total = sum(d.numel() for d in stream)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    mib = per_tensor / 2**20
    print(f"device {name}, torch {torch.__version__}, stream {count} x {mib:.1f} MiB = {total / 1e9:.2f} GB")
    copy_gbps = total / copy_s / 1e9
    print(f"copy (clone) of the stream: {2 * copy_gbps:.0f} GB/s read+write ({copy_gbps:.0f} GB/s of tensor bytes)")
    for label, fn in variants:
        got = [fn(d).tolist() for d in stream[:4] + big + small[:4]]
        equal = got == want
        stream_s, stream_host = timed(fn, stream)
        big_s, _ = timed(fn, big)
        small_s, small_host = timed(fn, small)
        row = {"variant": label, "equal_to_baseline": equal,
               "stream_gbps": total / stream_s / 1e9, "stream_host_us_per_tensor": stream_host / count * 1e6,
               "one_gib_gbps": big[0].numel() / big_s / 1e9,
               "small_device_us_per_tensor": small_s / len(small) * 1e6,
               "small_host_us_per_tensor": small_host / len(small) * 1e6}  # fmt: skip
        rows.append(row)
    print()
    print("| variant | equal | tap stream GB/s | 1 GiB tensor GB/s | host µs/launch, small | device µs/tensor, small |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        equal = "yes" if r["equal_to_baseline"] else "NO"
        print(f"| {r['variant']} | {equal} | {r['stream_gbps']:.0f} | {r['one_gib_gbps']:.0f} | "
              f"{r['small_host_us_per_tensor']:.1f} | {r['small_device_us_per_tensor']:.1f} |")  # fmt: skip
    many = many_tensor_rows(stream, big, width, pattern, repeats, device, [run_baseline(d).tolist() for d in stream])
    print()
    print("| many-tensor kernel (`fused_stats_many`), one launch per group | equal | tap stream GB/s "
          "| 1 GiB tensor GB/s | host µs per launch (stream) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in many:
        equal = "yes" if r["equal_to_baseline"] else "NO"
        print(f"| {r['variant']} | {equal} | {r['stream_gbps']:.0f} | {r['one_gib_gbps']:.0f} | "
              f"{r['host_us_per_launch']:.0f} |")  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps({"copy_gbps_read_write": 2 * total / copy_s / 1e9, "rows": rows, "many": many}, indent=1)
        )
    if not all(r["equal_to_baseline"] for r in rows + many):
        sys.exit(1)


def many_tensor_rows(
    stream: list[Any], big: list[Any], width: int, pattern: int, repeats: int, device: Any, want: list[Any]
) -> list[dict[str, Any]]:
    """The many-tensor kernel over the stream in groups of `per_launch` tensors (the tap's hold: 64 MiB is 4 of
    these tensors; the whole stream), told the tensors are aligned or not; and the tap's held path (`add`, then
    `flush`). Device seconds by CUDA events around the whole stream, medians; checked equal to the one-tensor
    kernel's rows first."""
    import torch

    from weightcheck import fuseddigest
    from weightcheck.tap.devicebatch import DeviceBatch

    def launcher(per_launch: int, aligned: bool) -> Any:
        def run(inputs: list[Any]) -> list[Any]:
            outs = []
            for at in range(0, len(inputs), per_launch):
                group = inputs[at : at + per_launch]
                table = torch.tensor([[d.data_ptr(), d.numel() >> 2] for d in group], dtype=torch.int64).to(device)
                out = torch.zeros((len(group), 4), dtype=torch.int64, device=device)
                most = max(d.numel() >> 2 for d in group)
                fuseddigest.fused_stats_many(table, out, most, width, pattern, aligned=aligned)
                outs.append(out)
            return outs

        return run

    def held(inputs: list[Any]) -> list[Any]:
        batch = DeviceBatch()
        batch.hold = True
        for data in inputs:
            batch.add({}, data.view(torch.bfloat16))
        batch.flush()
        return [out for _group, out in batch._launched]

    def timed(fn: Any, inputs: list[Any]) -> tuple[float, float, int]:
        launches = len(fn(inputs))
        torch.cuda.synchronize() if device.type == "cuda" else None
        device_s, host_s = [], []
        for _ in range(repeats):
            if device.type != "cuda":  # the interpreter: a check of this script
                t0 = time.perf_counter()
                fn(inputs)
                host_s.append(time.perf_counter() - t0)
                device_s.append(host_s[-1])
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn(inputs)
            host_s.append(time.perf_counter() - t0)
            end.record()
            end.synchronize()
            device_s.append(start.elapsed_time(end) / 1e3)
        return statistics.median(device_s), statistics.median(host_s), launches

    variants = [
        (f"{n} tensors per launch, aligned={a}", launcher(n, a)) for n in (4, 16, len(stream)) for a in (False, True)
    ]
    variants.append(("the tap's held path: DeviceBatch.add + flush (package defaults)", held))
    total = sum(d.numel() for d in stream)
    rows = []
    for label, fn in variants:
        got = [row for out in fn(stream) for row in out.tolist()]
        stream_s, host_s, launches = timed(fn, stream)
        big_s, _, _ = timed(fn, big)
        rows.append({"variant": label, "equal_to_baseline": got == want, "stream_gbps": total / stream_s / 1e9,
                     "one_gib_gbps": big[0].numel() / big_s / 1e9,
                     "host_us_per_launch": host_s / launches * 1e6})  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
