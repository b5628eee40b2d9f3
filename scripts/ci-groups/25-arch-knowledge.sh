#!/usr/bin/env bash
# Architecture knowledge, SGLang half (.venv-sglang, created by 20-sglang just before; reused, sglang not
# reinstalled): the `registry` half of patterns/generated/sglang/*.json, regenerated from the installed
# SGLang 0.5.23's model sources, must equal the checked-in files, and every SGLang class named there is in SGLang's ModelRegistry. Since the
# expert-layout probe, regenerating it builds each MoE class on CPU and runs its load_weights (tiny models).
# patterns/generated/sglang/<model_type>.json (what each class builds unquantized, fuses and renames: WC320)
# is regenerated from the same sources (ast only, seconds) and must equal the checked-in files too.
# Measured: 2 min 17 s - 3 min 51 s wall for the 4 tests on the shared 2-core machine (the slower with the
# main suite running beside it); the registry import and the first SGLang model import dominate, each
# probed class adds about a second.
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
