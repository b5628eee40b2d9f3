#!/usr/bin/env bash
# The GPU checks behind the README's GPU figures (issue #22), in one run on a CUDA machine:
#   1. the fused posmix128 kernel compiled for the GPU against the CPU reference (tests/test_fused_digest_cuda.py);
#   2. the kernel's GB/s against the device copy and the kernel it replaced (bench_fused_digest.py);
#   3. bench_tap.py on a ~1 GB and (unless QUICK=1) a ~10 GB stream into an engine on the GPU, tap on with the
#      device digest (posmix128) and with the engine-state digest (WEIGHTCHECK_STATE), alternated with the tap off;
#   4. with PROFILE=1, where the tap's time goes in a 1 GB sync (gpu_profile_tap.py: cProfile and the tap's profile).
# Logs and JSON figures go to $OUT (default /tmp/gpu-out). Needs torch with CUDA, Triton, safetensors, xxhash,
# orjson, pytest.   bash benchmarks/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  nproc; git log -1 --format=%h 2>/dev/null; } 2>&1 | tee "$OUT/machine.txt"
timeout 140 "$PY" -m pytest -q -p no:cacheprovider tests/test_fused_digest_cuda.py 2>&1 | tail -20 | tee "$OUT/fused-test.txt"
timeout 150 "$PY" benchmarks/bench_fused_digest.py --json "$OUT/fused-digest.json" 2>&1 | tee "$OUT/fused-digest.txt"
timeout 150 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb 1 --repeats 5 --state --no-small \
    --json "$OUT/tap-1gb.json" 2>&1 | tee "$OUT/tap-1gb.txt"
if [ "${PROFILE:-0}" = 1 ]; then
  timeout 90 "$PY" benchmarks/gpu_profile_tap.py cuda 1 > "$OUT/profile-1gb.txt" 2>&1
  head -c 3000 "$OUT/profile-1gb.txt"
fi
if [ "${QUICK:-0}" != 1 ]; then
  timeout 280 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb 10 --repeats 3 --state --no-small \
      --no-verify --keep /tmp/bench-tap-10gb --json "$OUT/tap-10gb.json" 2>&1 | tee "$OUT/tap-10gb.txt"
fi
