#!/usr/bin/env bash
# Architecture knowledge, SGLang half (.venv-sglang, created by 20-sglang just before; reused, sglang not
# reinstalled): patterns/generated/sglang.json regenerated from the installed SGLang 0.5.23's model sources
# must equal the checked-in file, and every SGLang class named there is in SGLang's ModelRegistry.
# Measured: 2 min 54 s wall (41 s CPU) on the shared 2-core machine; importing the registry dominates.
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=.venv-sglang/bin/python
if [ ! -x "$VPY" ]; then echo ".venv-sglang missing: 20-sglang must run first" >&2; exit 1; fi
set +e
WEIGHTCHECK_REQUIRE_SGLANG=1 "$VPY" -m pytest -m sglang tests/arch_sglang -q -rs -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "no architecture-knowledge SGLang tests were collected" >&2; exit 1; fi
exit "$rc"
