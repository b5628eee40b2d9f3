#!/usr/bin/env bash
# The checks that decide whether holding GPU tensors for one launch (WEIGHTCHECK_DEVICE_HOLD=1, opt-in since
# 2026-11-27) can become the default (issue #22), in one call on a CUDA machine (~4-5 minutes on an H100):
#   1. the GPU tests of the fused kernels and the device batch, the held path included;
#   2. the many-tensor kernel against the one-tensor kernel and the device copy (bench_fused_digest.py);
#   3. where the tap's time goes, held and launched on arrival, alternated twice (gpu_tap_steps.py, 1 GB);
#   4. bench_tap.py at ~1 GB and ~10 GB, launched on arrival and held in the same rounds (medians of pairs).
# Hold becomes the default only if 3 and 4 show it below launching on arrival at both sizes, and the tests pass.
# Logs and JSON go to $OUT (default /tmp/gpu-hold).   bash benchmarks/gpu_hold_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-hold}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format=%h 2>/dev/null; uptime; } 2>&1 | tee "$OUT/machine.txt"
timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_fused_digest_cuda.py 2>&1 | tail -12 | tee "$OUT/tests.txt"
timeout 70 "$PY" benchmarks/bench_fused_digest.py --repeats 10 --json "$OUT/fused.json" 2>&1 | tail -25 | tee "$OUT/fused.txt"
for round in 1 2; do
  for hold in 1 0; do
    WEIGHTCHECK_DEVICE_HOLD=$hold timeout 45 "$PY" benchmarks/gpu_tap_steps.py --gb 1 --rounds 15 --variants on,on-timed \
        --keep /tmp/gpu-hold-1gb --json "$OUT/steps-hold$hold-$round.json" > "$OUT/steps-hold$hold-$round.txt" 2>&1
    head -7 "$OUT/steps-hold$hold-$round.txt"
  done
done
timeout 60 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb 1 --repeats 5 --no-small \
    --json "$OUT/tap-1gb.json" 2>&1 | tail -14 | tee "$OUT/tap-1gb.txt"
timeout 120 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb 10 --repeats 2 --byte-rounds 5 \
    --no-small --no-verify --keep /tmp/gpu-hold-10gb --json "$OUT/tap-10gb.json" 2>&1 | tail -12 | tee "$OUT/tap-10gb.txt"
