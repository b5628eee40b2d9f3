#!/usr/bin/env bash
# Issue #22 on a CUDA machine: the tap with the digest kernel launched directly (weightcheck.tritonlaunch)
# against the same tap launching through Triton's JITFunction.run (WEIGHTCHECK_TRITON_DIRECT=0), alternated in
# one lease: the GPU tests, the host cost per call (gpu_host_cost.py), bench_tap.py on a ~1 GB stream twice each
# way, then (unless QUICK=1) the ~10 GB stream with direct launches. All text goes to $OUT/checks.log, figures to
# $OUT/tap-*.json (at most 8 files come back from a lease).   bash benchmarks/gpu_direct_launch.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
LOG="$OUT/checks.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  nproc; uptime; } 2>&1 | tee "$LOG"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_fused_digest_cuda.py 2>&1 | tail -15 | tee -a "$LOG"
timeout 90 "$PY" benchmarks/gpu_host_cost.py 2>&1 | tee -a "$LOG"
tap() {  # name, gb, repeats, then extra arguments
  local name=$1 gb=$2 repeats=$3; shift 3
  echo "== bench_tap.py $name (WEIGHTCHECK_TRITON_DIRECT=${WEIGHTCHECK_TRITON_DIRECT:-1})" | tee -a "$LOG"
  timeout 200 "$PY" benchmarks/bench_tap.py --device cuda --digest posmix128 --gb "$gb" --repeats "$repeats" --state \
      --no-small --no-verify "$@" --json "$OUT/tap-$name.json" 2>&1 | tee -a "$LOG"
}
for round in 1 2; do
  tap "1gb-direct-$round" 1 5 --keep /tmp/bench-tap-1gb
  WEIGHTCHECK_TRITON_DIRECT=0 tap "1gb-jitrun-$round" 1 5 --keep /tmp/bench-tap-1gb
done
if [ "${QUICK:-0}" != 1 ]; then
  tap 10gb-direct 10 3 --keep /tmp/bench-tap-10gb
fi
