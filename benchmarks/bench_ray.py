"""`lint --content` on Ray with 1 and 2 workers against the single-process run, on a multi-GB checkpoint.

Generates (under --workdir, kept for reuse) the bf16 Llama-shaped checkpoint of bench_content.py (~1 GB
shards, safetensors' writer), about --size-gb GB. Each contender runs in its own subprocess, page cache
warm, medians of --repeat runs after one warm-up run (which starts Ray's workers and their imports; its
time is reported as the cold start):

* single: `lint(path, content=True)` in one process (the baseline);
* ray N: `ray.init(address="local", num_cpus=N)`, the same lint with `--ray`, chunks of --chunk-mb.

Reported: throughput (GB/s) and speed-up against single; scaling efficiency (speed-up / N); per-task
overhead = (ray-1 wall - single wall) / tasks; the sum of task times against the wall time. The JSON
results of every contender must be identical (checked).

    python benchmarks/bench_ray.py [--size-gb 2] [--repeat 3] [--chunk-mb 256] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def contender(mode: str, ckpt: str, repeat: int) -> dict:
    sys.path.insert(0, str(REPO))
    from weightcheck import distributed
    from weightcheck.linting import lint
    from weightcheck.reporters import render

    options: dict = {"content": True, "local_path": ckpt}
    if mode != "single":
        import ray

        ray.init(address="local", num_cpus=int(mode), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})  # fmt: skip
        options["ray"] = "local"
    t = time.perf_counter()
    result = lint(ckpt, options=options)
    cold = time.perf_counter() - t
    walls, tasks = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        result = lint(ckpt, options=options)
        walls.append(time.perf_counter() - t)
        if distributed.LAST_STATS is not None:
            tasks.append(distributed.LAST_STATS.task_seconds)
    out = io.StringIO()
    render(result, "json", out)
    stats = distributed.LAST_STATS
    return {
        "cold": cold,
        "wall": statistics.median(walls),
        "task_seconds": statistics.median(tasks) if tasks else None,
        "tasks": stats.tasks if stats and mode != "single" else 0,
        "json_sha": hashlib.sha256(out.getvalue().encode()).hexdigest(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk-mb", type=int, default=256)
    ap.add_argument("--workdir", type=Path, default=Path("bench-out"))
    ap.add_argument("--contender", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.contender:
        print(json.dumps(contender(args.contender, args.ckpt, args.repeat)))
        return

    sys.path.insert(0, str(HERE))
    import bench_content

    ckpt = bench_content.generate(args.workdir / f"ray-{args.size_gb:g}gb", args.size_gb)
    total = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    env = {**os.environ, "WEIGHTCHECK_RAY_CHUNK_BYTES": str(args.chunk_mb << 20), "RAY_USAGE_STATS_ENABLED": "0"}
    got: dict[str, dict] = {}
    for mode in ("single", "1", "2"):
        cmd = [sys.executable, __file__, "--contender", mode, "--ckpt", str(ckpt), "--repeat", str(args.repeat)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        got[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    single = got["single"]["wall"]
    print(f"checkpoint: {total / 1e9:.2f} GB in {len(list(ckpt.glob('*.safetensors')))} shards, "
          f"chunks of {args.chunk_mb} MB; cpus on this machine: {os.cpu_count()}")  # fmt: skip
    print(f"identical JSON results: {len({g['json_sha'] for g in got.values()}) == 1}")
    for mode, g in got.items():
        label = "single" if mode == "single" else f"ray x{mode}"
        line = f"{label:<8} {g['wall']:7.2f} s  {total / g['wall'] / 1e9:5.2f} GB/s  cold start {g['cold']:6.2f} s"
        if mode != "single":
            speedup = single / g["wall"]
            line += f"  speed-up {speedup:4.2f}x  efficiency {speedup / int(mode):4.2f}  tasks {g['tasks']}"
            line += f"  task time {g['task_seconds']:.2f} s"
        print(line)
    tasks = got["1"]["tasks"] or 1
    print(f"per-task overhead (ray x1 - single) / tasks: {(got['1']['wall'] - single) / tasks * 1000:.0f} ms")


if __name__ == "__main__":
    main()
