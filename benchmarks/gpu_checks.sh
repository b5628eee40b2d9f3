#!/usr/bin/env bash
# The GPU checks behind the README's GPU figures (issue #22), in one run on a CUDA machine:
#   1. the fused posmix128 kernel compiled for the GPU against the CPU reference (tests/test_fused_digest_cuda.py);
#   2. bench_tap.py on a ~1 GB and a ~10 GB stream into an engine on the GPU, tap on with the device digest
#      (posmix128) and with the engine-state digest (WEIGHTCHECK_STATE), alternated with the tap off.
# Logs and JSON figures go to $OUT (default /tmp/gpu-out). Needs torch with CUDA, Triton, safetensors, xxhash,
# orjson, pytest.   bash benchmarks/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  nproc; } 2>&1 | tee "$OUT/machine.txt"
timeout 140 "$PY" -m pytest -q -p no:cacheprovider tests/test_fused_digest_cuda.py 2>&1 | tail -20 | tee "$OUT/fused-test.txt"
timeout 150 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb 1 --repeats 5 --state --no-small \
    --json "$OUT/tap-1gb.json" 2>&1 | tee "$OUT/tap-1gb.txt"
timeout 280 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb 10 --repeats 3 --state --no-small \
    --no-verify --keep /tmp/bench-tap-10gb --json "$OUT/tap-10gb.json" 2>&1 | tee "$OUT/tap-10gb.txt"
