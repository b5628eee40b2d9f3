#!/usr/bin/env bash
# Real-SGLang group (.venv-sglang): SGLang 0.5.23 model classes on CPU, in-process (single gloo rank) and in
# two spawned gloo processes per parallel layout (TP=2 with moe-EP=2 for the TP and EP scenarios, PP=2), plus
# update_weights_from_distributed with a trainer process and an engine process (test_sglang_distributed.py).
# Time: install ~4-7 min; tests measured on the shared 2-core machine under a load average of 10-20
# (8 sessions): in-process sync-path tests ~2.5 min, the two layouts ~11.5 min. Later, under a load average
# of 6-8: the whole group 5.7 min, of which the distributed launch 92 s (77-108 s over 6 runs).
# On an idle CI runner the tests should take a fraction of that (not measured there); the spawned processes
# stay below ~2.5 GB (two SGLang processes with tiny models at ~1.2 GB each; the distributed launch: one
# engine and a trainer at ~0.8 GB), beside the pytest process (~1.2 GB).
# The FP8 quantized-engine tests (test_sglang_quantized.py, in-process) add ~5 s to the group (~70 s alone,
# nearly all of it the SGLang import the in-process tests share), load average ~5.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/test-sglang.sh
