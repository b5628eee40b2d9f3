#!/usr/bin/env bash
# The optional real-SGLang test group (pytest marker `sglang`) in its own environment, .venv-sglang.
# A full CPU install of sglang is about 11 GB and takes 4-7 minutes the first time; the tests take about
# a few minutes (see scripts/ci-groups/20-sglang.sh). .ci/run calls this after the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=.venv-sglang
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
# Pinned: the tests build SGLang 0.5.23 model classes (constructors, loaders and plugin API of that release).
"$VPY" -m pip install -q "sglang==0.5.23" pytest
# weightcheck itself without its dependency resolution (sglang pins torch/transformers), plus its light deps.
"$VPY" -m pip install -q --no-deps -e .
"$VPY" -m pip install -q click rich orjson "xxhash>=3" google-re2
set +e
# WEIGHTCHECK_REQUIRE_SGLANG: an sglang that fails to import is an error here, not a skipped (green) group.
WEIGHTCHECK_REQUIRE_SGLANG=1 "$VPY" -m pytest -m sglang tests/sglang -q -rs -p no:cacheprovider "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected (sglang not importable, marker typo): never green.
if [ "$rc" -eq 5 ]; then echo "no SGLang tests were collected" >&2; exit 1; fi
exit "$rc"
