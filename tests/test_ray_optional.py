"""Ray is an optional extra: without it `--ray` is a usage error (exit 2) and nothing else changes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from weightcheck.distributed import Chunk, plan_chunks


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here")
def test_ray_flag_without_ray_is_a_usage_error(make_ckpt) -> None:
    ckpt = make_ckpt("llama")
    for args in (["lint", str(ckpt), "--content", "--ray"], ["diff", str(ckpt), str(ckpt), "--ray", "auto"]):
        proc = subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "[ray]'" in proc.stderr and "pip install 'weightcheck[ray]'" not in proc.stderr


def test_ray_needs_content(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "weightcheck", "lint", str(tmp_path), "--ray"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "--ray needs --content" in proc.stderr


def test_chunks_follow_shards_and_split_large_ones() -> None:
    a, b = (("r", "a.safetensors"),), (("r", "b.safetensors"),)
    items = [(40, a), (40, a), (40, a), (10, b), (10, b)]
    assert plan_chunks(items, 100) == [Chunk(0, 2, 80, a), Chunk(2, 3, 40, a), Chunk(3, 5, 20, b)]
    # Concatenating the chunks in order gives back the work list: the merge keeps single-process order.
    chunks = plan_chunks(items, 1)
    assert [i for c in chunks for i in range(c.start, c.stop)] == list(range(len(items)))
