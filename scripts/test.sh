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
"$VPY" -m ruff check weightcheck tests benchmarks tools scripts
set +e
"$VPY" -m pytest -q "$@"
rc=$?
# The fused digest's Triton kernel under Triton's interpreter, in a process where TRITON_INTERPRET is set
# before anything imports Triton (tests/test_fused_digest.py says why); a missing Triton fails, never skips.
TRITON_INTERPRET=1 WEIGHTCHECK_REQUIRE_TRITON=1 "$VPY" -m pytest -q -m triton tests/test_fused_digest.py
rc_triton=$?
set -e
# pytest exit 5 = no tests collected: that must never look green.
if [ "$rc" -eq 5 ] || [ "$rc_triton" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$rc_triton"
