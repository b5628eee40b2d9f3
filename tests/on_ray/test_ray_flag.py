"""`--ray` as a newcomer types it (issue #19): the bare flag starts or joins a local Ray like `ray.init()`, and
a cluster that cannot be reached is one line and exit 2, never an internal error (WC000)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # nothing to join: the flag must start one
    env.update(PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=600,
                          env=env)  # fmt: skip


def test_bare_ray_flag_starts_a_local_ray_and_matches_the_single_process_run(make_ckpt) -> None:
    ckpt = str(make_ckpt("llama"))
    single = wc("lint", ckpt, "--content", "--format", "json", "--no-progress")
    distributed = wc("lint", ckpt, "--content", "--ray", "--format", "json", "--no-progress")
    assert distributed.returncode == single.returncode == 0, distributed.stdout + distributed.stderr
    assert "WC000" not in distributed.stdout and "Could not find any running Ray instance" not in distributed.stderr
    strip = lambda text: [line for line in text.splitlines() if "header_bytes_read" not in line]  # noqa: E731
    assert strip(distributed.stdout) == strip(single.stdout)


def test_unreachable_cluster_is_one_line_and_exit_2(make_ckpt) -> None:
    ckpt = str(make_ckpt("llama"))
    for args in (("lint", ckpt, "--content", "--ray", "127.0.0.1:9"), ("diff", ckpt, ckpt, "--ray", "127.0.0.1:9")):
        proc = wc(*args, "--no-progress")
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "WC000" not in proc.stdout and "internal error" not in proc.stderr, proc.stderr
        assert "cannot start or reach the Ray cluster at 127.0.0.1:9" in proc.stderr, proc.stderr
