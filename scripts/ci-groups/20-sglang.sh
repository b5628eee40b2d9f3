#!/usr/bin/env bash
# Real-SGLang group (.venv-sglang): SGLang 0.5.23 model classes on CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/test-sglang.sh
