#!/usr/bin/env bash
# Megatron group (pytest marker `megatron`): a real megatron-core trainer (PP=2, EP=2 in gloo processes),
# exported by mbridge, feeding SGLang 0.5.23 model classes with the tap on; and the framework adapters
# (weightcheck.integrations). It reuses .venv-sglang (built by 20-sglang, or here when run alone) and adds
# megatron-core and mbridge to it: both are pure Python and need only torch, numpy and packaging, which
# SGLang already pins, so SGLang stays importable (checked below).
# Time, measured on the shared 2-core dev machine under load ~15 with .venv-sglang present: 8 min 55 s wall
# (3 min 17 s CPU) for the whole script, of which the 10 tests took 273 s (two trainer groups of two
# processes, ~85 s each to start: importing megatron-core and mbridge). A fresh .venv-sglang adds the
# 4-7 min sglang install of 20-sglang.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
VENV=.venv-sglang
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import sglang" 2>/dev/null; then
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q "sglang==0.5.23" pytest
  "$VPY" -m pip install -q --no-deps -e .
  "$VPY" -m pip install -q click rich orjson "xxhash>=3"
fi
# megatron-core as pinned for the main suite (scripts/constraints.txt); mbridge 0.15.1 (the bridge verl and
# slime use; NVIDIA's megatron-bridge needs Transformer Engine, see tests/megatron/megatron_harness.py).
MCORE=$(grep -E '^megatron-core==' scripts/constraints.txt)
"$VPY" -m pip install -q "$MCORE" "mbridge==0.15.1"
# Nothing SGLang pins was disturbed (the tests then import SGLang in the parent and megatron-core/mbridge in
# the trainer processes; WEIGHTCHECK_REQUIRE_MEGATRON turns a missing one into an error, not a skip).
"$VPY" -m pip check
set +e
WEIGHTCHECK_REQUIRE_MEGATRON=1 "$VPY" -m pytest -m megatron tests/megatron -q -rs -p no:cacheprovider \
  -W ignore::DeprecationWarning -W ignore::UserWarning "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: never green.
if [ "$rc" -eq 5 ]; then echo "no Megatron tests were collected" >&2; exit 1; fi
exit "$rc"
