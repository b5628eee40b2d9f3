#!/usr/bin/env bash
# Record `weightcheck lint --format json` of every shipped sample (and optional extra targets) into DIR, so a
# refactor that must not change behaviour can be checked byte for byte: record before, record after, `diff -r`.
#   scripts/record_lint_json.sh DIR [EXTRA_TARGET ...]
set -u
# Set iteration order must not leak into the output; pin the hash seed so two runs compare byte for byte.
export PYTHONHASHSEED=${PYTHONHASHSEED:-0}
out=${1:?usage: record_lint_json.sh DIR [EXTRA_TARGET ...]}; shift
mkdir -p "$out"
py=${PYTHON:-python}
for target in sample_configs/*/ "$@"; do
  name=$(basename "$target")
  "$py" -m weightcheck lint "$target" --format json >"$out/$name.json" 2>"$out/$name.stderr"
  echo "exit=$?" >>"$out/$name.stderr"
  # config-only mode on the same config
  if [ -f "$target/config.json" ]; then
    "$py" -m weightcheck lint "$target/config.json" --format json >"$out/$name.config.json" 2>"$out/$name.config.stderr"
    echo "exit=$?" >>"$out/$name.config.stderr"
  fi
done
