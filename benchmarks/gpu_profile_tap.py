"""Where the tap's time goes on a GPU load (one-off diagnostic): cProfile of a tapped 1 GB load_weights on CUDA
with the device digest, after warm-up, and the tap's own per-stage profile (WEIGHTCHECK_PROFILE)."""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tap
from safetensors import safe_open

from weightcheck import tap

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
GB = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
work = Path(tempfile.mkdtemp())
ckpt = work / "ckpt"
ckpt.mkdir()
bench_tap.write_checkpoint(ckpt, bench_tap.layers_for(GB))
engine = bench_tap.GenericEngine(bench_tap.layers_for(GB)).to(DEVICE)
tap.set_engine_hooks(tap.EngineHooks(default_loader=bench_tap.default_loader))
tap.install(type(engine))


def stream():
    for shard in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name).to(DEVICE)


for _ in range(2):
    tap.configure(work / "rec", digest="posmix128", profile=True)
    engine.load_weights(stream())
torch.cuda.synchronize() if DEVICE == "cuda" else None
profiler = cProfile.Profile()
tap.configure(work / "rec2", digest="posmix128", profile=True)
profiler.enable()
engine.load_weights(stream())
torch.cuda.synchronize() if DEVICE == "cuda" else None
profiler.disable()
pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
for record in sorted((work / "rec2").rglob("*.jsonl")):
    last = record.read_text().splitlines()[-1]
    print(json.dumps(json.loads(last).get("profile"), indent=1))
