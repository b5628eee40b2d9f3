#!/usr/bin/env bash
# Ray group (.venv-ray): `lint --content --ray` and `diff --ray` on ray.init(2 CPUs) and on a two-node
# loopback cluster (`ray start --head` + `ray start --address`), results compared byte for byte with the
# single-process run, a worker killed mid-run. Installs ray 2.60 (~80 MB wheel), torch 2.13 CPU and
# transformers (fixtures come from save_pretrained; tests in tests/on_ray, not tests/ray: that name would shadow the
# ray package as a namespace package). Measured on the shared 2-core dev machine under load
# average ~14 (load avg 14 from 8 parallel sessions): 18 min wall in all, of which tests 4.1 min; CPU time
# 2m46s user+sys counted (Ray daemons not included); an idle 2-core runner should need well under 8 min (not measured).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
[ -x .venv-ray/bin/python ] || "$PY" -m venv .venv-ray
VPY=.venv-ray/bin/python
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q -c scripts/constraints.txt torch
"$VPY" -m pip install -q -c scripts/constraints.txt -e '.[torch,ray,hub]' pytest transformers
export RAY_USAGE_STATS_ENABLED=0
set +e
# Ray's daemons bind and talk on the node's own interface address even with --node-ip-address=127.0.0.1.
# The tests run in a fresh network namespace holding only the loopback device, so nothing can leave
# 127.0.0.1 (Ray then picks 127.0.0.1 itself). Where a namespace cannot be made, the group is refused.
command -v ip >/dev/null || { apt-get update -qq && apt-get install -y -qq iproute2; } || true
if unshare --net -- true 2>/dev/null && command -v ip >/dev/null; then
  unshare --net -- bash -c 'ip link set lo up && exec "$@"' _ \
    "$VPY" -m pytest -q -m ray tests/on_ray -p no:cacheprovider "$@"
  rc=$?
else
  echo "50-ray: cannot create a loopback-only network namespace (unshare --net); Ray tests not run" >&2
  rc=1
fi
set -e
if [ "$rc" -eq 5 ]; then echo "no Ray tests were collected" >&2; exit 1; fi
exit "$rc"
