#!/usr/bin/env bash
# Install everything the test suite needs into .venv (created if absent) and run lint + tests.
# This is the README's test command and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
# torch first, pinned: an unpinned resolver pulls the multi-GB CUDA build.
"$VPY" -m pip install -q -c scripts/constraints.txt torch
"$VPY" -m pip install -q -c scripts/constraints.txt -e '.[test,megatron]'
"$VPY" -m ruff check weightcheck tests benchmarks
set +e
WEIGHTCHECK_REQUIRE_TRITON=1 "$VPY" -m pytest -q "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that must never look green.
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
