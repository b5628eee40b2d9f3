"""Remote lint (`weightcheck lint org/name`) through a loopback Hub-protocol server vs local-cache lint.

Uses the DeepSeek-V3-scale checkpoint of bench_lint.py (163 shards, ~92k tensor names, block-FP8
companions; tiny tensors) served by the test suite's Hub-protocol server (tests/hubserver.py: the
endpoints huggingface_hub calls, ranged GETs, every body byte counted). In one run:

* bytes: what the server sent for files, against the floor a header-only lint needs (every JSON file whole,
  plus per shard its 8-byte length and its header), and the listing response on top (budget: +1 %);
* wall time (with --latency-ms added to every request, 20 ms by default, a stand-in for the round trip to
  the Hub): remote lint with 16 parallel requests (default) and with 1, against linting the same
  directory on disk (what the local-cache mode does once the snapshot is complete); medians;
* findings: identical to the local lint's.

    python benchmarks/bench_remote.py [--workdir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent)]


def floor_bytes(ckpt: Path) -> int:
    total = 0
    for p in ckpt.iterdir():
        if p.suffix == ".json":
            total += p.stat().st_size
        elif p.suffix == ".safetensors":
            with open(p, "rb") as fh:
                total += 8 + struct.unpack("<Q", fh.read(8))[0]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("bench-out"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added per request (a network round trip)")
    args = ap.parse_args()

    import bench_lint
    from hubserver import HubServer

    ckpt = bench_lint.generate(args.workdir)
    server = HubServer().start()
    os.environ["HF_ENDPOINT"] = server.url
    os.environ["HF_HUB_CACHE"] = str(args.workdir / "empty-hf-cache")
    os.environ.pop("HF_HUB_OFFLINE", None)
    server.add("bench/deepseek-v3-names", ckpt)
    server.latency = args.latency_ms / 1000

    from weightcheck import hub
    from weightcheck.linting import lint

    def view(result) -> list:
        return [(f.code, f.message, f.location.as_dict()) for f in result.findings]

    try:
        local = lint(ckpt)  # warm the page cache and the imports
        times: dict[str, list[float]] = {"local": [], "remote x16": [], "remote x1": []}
        served = listing = 0
        remote = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            lint(ckpt)
            times["local"].append(time.perf_counter() - t)
            for label, workers in (("remote x16", 16), ("remote x1", 1)):
                hub.MAX_WORKERS = workers
                server.reset_counts()
                t = time.perf_counter()
                remote = lint("bench/deepseek-v3-names")
                times[label].append(time.perf_counter() - t)
                served = sum(server.served.values())
                listing = server.bytes_served - served
        hub.MAX_WORKERS = 16
    finally:
        server.stop()
    assert remote is not None and not remote.nothing_checked, remote.notes if remote else None
    floor = floor_bytes(ckpt)
    repo_bytes = sum(p.stat().st_size for p in ckpt.iterdir())
    same = view(remote) == view(local)
    med = {k: statistics.median(v) for k, v in times.items()}
    shards = len(list(ckpt.glob("*.safetensors")))
    print(f"latency per request: {args.latency_ms} ms")
    print(f"repo: {shards} shards, {repo_bytes / 1e6:.1f} MB on the server; findings identical to local: {same}")
    print(f"bytes: files served {served:,} vs header+JSON floor {floor:,} ({served / floor:.4f}x); "
          f"listing {listing:,} ({100 * (served + listing - floor) / floor:.2f} % over the floor in all)")  # fmt: skip
    for label, value in med.items():
        print(f"{label:<11} {value:7.3f} s  ({value / med['local']:.2f}x local)")


if __name__ == "__main__":
    main()
