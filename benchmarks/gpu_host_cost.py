"""Why the tap's per-tensor host work costs more inside a load than in a tight loop (one-off diagnostic, GPU).

    python benchmarks/gpu_host_cost.py

Times the host side of one call (perf_counter, medians of 200) in four settings: back to back; right after a
13.5 MB pageable host-to-device copy (what bench_tap.py's loads do between tensors); right after a 13.5 MB
host-to-host copy (the host's caches churned, no CUDA call); right after a 13.5 MB device-to-device copy (a
CUDA call, the host's caches kept). Calls: the tap's `DeviceBatch.add`, Triton's launch of the kernel alone
(`JITFunction.run`), the compiled kernel launched directly as the tap does (`weightcheck.tritonlaunch`), and
`torch.zeros(4)` on the GPU (any small CUDA call).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    from weightcheck import fuseddigest
    from weightcheck.tap.devicebatch import DeviceBatch, fused_spec

    device = torch.device("cuda")
    n = 4096 * 1728  # BF16 values: 13.5 MiB, the 1 GB stream's tensors
    host_src = torch.randn(n).to(torch.bfloat16)
    host_dst = torch.empty_like(host_src)
    gpu_src = host_src.to(device)
    gpu_dst = torch.empty_like(gpu_src)
    tensors = [torch.randn(n, device=device).to(torch.bfloat16) for _ in range(4)]
    width, pattern = fused_spec(torch.bfloat16)  # type: ignore[misc]
    batch = DeviceBatch()
    batch.hold = False  # the launch on arrival, whose host cost this measures
    out = torch.zeros(4, dtype=torch.int64, device=device)

    def add(t: Any) -> None:
        batch.add({}, t)
        batch.pending.pop()

    def launch(t: Any) -> None:
        words = t.view(torch.int32)
        n_full = words.numel()
        n_blocks = -(-n_full // fuseddigest.BLOCK_WORDS)
        grid = fuseddigest.grid_programs(device, n_blocks)
        fuseddigest._kernel()[(grid,)](words, out, n_full, -(-n_blocks // grid), WIDTH=width, PATTERN=pattern,
                                       BLOCK=fuseddigest.BLOCK_WORDS)  # fmt: skip

    def direct(t: Any) -> None:
        words = t.view(torch.int32)
        n_full = words.numel()
        n_blocks = -(-n_full // fuseddigest.BLOCK_WORDS)
        grid = fuseddigest.grid_programs(device, n_blocks)
        fuseddigest._launcher().launch(grid, (words, out, n_full, -(-n_blocks // grid)),
                                       (width, pattern, fuseddigest.BLOCK_WORDS), 4)  # fmt: skip

    def zeros(_t: Any) -> None:
        torch.zeros(4, dtype=torch.int64, device=device)

    before = {
        "back to back": lambda: None,
        "after a pageable H2D copy": lambda: host_src.to(device),
        "after a host-to-host copy": lambda: host_dst.copy_(host_src),
        "after a device-to-device copy": lambda: gpu_dst.copy_(gpu_src),
    }
    calls = {
        "DeviceBatch.add": add,
        "Triton launch alone (JITFunction.run)": launch,
        "the compiled kernel launched directly (weightcheck.tritonlaunch)": direct,
        "torch.zeros(4) on the GPU": zeros,
    }
    rows = []
    for call_name, call in calls.items():
        for _ in range(20):
            call(tensors[0])
        torch.cuda.synchronize()
        cells = []
        for prep in before.values():
            times = []
            for i in range(200):
                prep()
                t0 = time.perf_counter()
                call(tensors[i % 4])
                times.append(time.perf_counter() - t0)
                if i % 16 == 15:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            cells.append(statistics.median(times) * 1e6)
        rows.append((call_name, cells))
    direct_count = fuseddigest._launcher().direct_launches
    print(f"direct launches: {direct_count} (0: Triton's version or this environment kept them off)")
    print("| host µs per call (median of 200) | " + " | ".join(before) + " |")
    print("|---|" + "---|" * len(before))
    for call_name, cells in rows:
        print(f"| {call_name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
