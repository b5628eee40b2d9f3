"""`lint --content --ray` and `diff --ray` on real local Ray clusters (run by scripts/ci-groups/50-ray.sh in
.venv-ray): the distributed result must equal the single-process result byte for byte (JSON), including
when a worker is killed mid-run, and a chunk that fails every attempt must be reported, not dropped."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import edit_tensors

from weightcheck.diff import DiffOptions, diff
from weightcheck.distributed import KILL_HOOK_ENV
from weightcheck.findings import Result
from weightcheck.lint import lint
from weightcheck.reporters import render

ray = pytest.importorskip("ray")
copy_ckpt = quant_fixtures.copy_ckpt
pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]
# Small chunks so that the tiny fixture's shards are split into several byte-range tasks.
CHUNK = "40000"


def as_json(result: Result) -> str:
    out = io.StringIO()
    render(result, "json", out)
    return out.getvalue()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """`ray.init()` with 2 CPUs; workers import this checkout."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def damaged(make_ckpt) -> Path:
    """A real llama checkpoint with content defects in two shards: NaN/Inf in one tensor, a zeroed matrix."""
    path = make_ckpt("llama")

    def plant(t: dict) -> None:
        w = t["model.layers.1.self_attn.q_proj.weight"].clone()
        w[0, :3] = float("nan")
        w[1, 0] = float("inf")
        t["model.layers.1.self_attn.q_proj.weight"] = w
        t["model.layers.3.mlp.up_proj.weight"] = torch.zeros_like(t["model.layers.3.mlp.up_proj.weight"])

    edit_tensors(path, plant)
    return path


def _lint(path: Path, **options) -> Result:
    return lint(path, options={"content": True, "local_path": str(path), **options})


def test_lint_content_on_ray_equals_single_process(local_ray, damaged: Path, monkeypatch) -> None:
    monkeypatch.setenv("WEIGHTCHECK_RAY_CHUNK_BYTES", CHUNK)
    single = _lint(damaged)
    assert {f.code for f in single.findings} >= {"WC601", "WC602"}
    assert as_json(_lint(damaged, ray="local")) == as_json(single)


def test_hash_manifest_on_ray_equals_single_process(local_ray, damaged: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WEIGHTCHECK_RAY_CHUNK_BYTES", CHUNK)
    _lint(damaged, hash_out=tmp_path / "single.json")
    _lint(damaged, ray="local", hash_out=tmp_path / "ray.json")
    assert (tmp_path / "ray.json").read_bytes() == (tmp_path / "single.json").read_bytes()


def test_diff_on_ray_equals_single_process(local_ray, make_ckpt, copy_ckpt, monkeypatch) -> None:
    monkeypatch.setenv("WEIGHTCHECK_RAY_CHUNK_BYTES", CHUNK)
    a = make_ckpt("llama")
    b = copy_ckpt(a)

    def change(t: dict) -> None:
        t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"] * 2
        t["model.layers.2.self_attn.o_proj.weight"] = t["model.layers.2.self_attn.o_proj.weight"].t().contiguous()

    edit_tensors(b, change)
    single = diff(a, b)
    assert single.findings and single.checked["failed"] == 2
    assert as_json(diff(a, b, DiffOptions(ray="local"))) == as_json(single)


def test_killed_worker_is_retried_and_the_result_is_unchanged(local_ray, damaged: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WEIGHTCHECK_RAY_CHUNK_BYTES", CHUNK)
    single = _lint(damaged)
    shard = sorted(p.name for p in damaged.glob("model-*.safetensors"))[1]
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_HOOK_ENV, f"{shard}:{marker}")
    distributed = _lint(damaged, ray="local")
    assert marker.exists(), "the hook never fired: nothing was killed"
    assert as_json(distributed) == as_json(single)


def test_a_chunk_failing_every_attempt_is_reported_not_dropped(local_ray, damaged: Path, monkeypatch) -> None:
    monkeypatch.setenv("WEIGHTCHECK_RAY_CHUNK_BYTES", CHUNK)
    shard = sorted(p.name for p in damaged.glob("model-*.safetensors"))[0]
    # The marker cannot be written: the hook raises on every attempt.
    monkeypatch.setenv(KILL_HOOK_ENV, f"{shard}:/nonexistent-dir/marker")
    result = _lint(damaged, ray="local")
    lost = [f for f in result.findings if f.code == "WC608" and "Ray task failed" in f.message]
    assert lost and result.exit_code() == 1
    assert any("FAILED after retries" in n for n in result.notes)
    # Every tensor is accounted for: the failed ones are listed, the rest were checked.
    assert sum(f.count or 0 for f in lost) == sum(1 for _ in _shard_tensors(damaged, shard))


def _shard_tensors(path: Path, shard: str) -> list[str]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return [k for k, v in index["weight_map"].items() if v == shard]


# ---- a two-node cluster started with `ray start` on loopback ------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[str]:
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    ray_bin = str(Path(sys.executable).parent / "ray")
    head = [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
            "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
    worker = [ray_bin, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
              "--disable-usage-stats"]  # fmt: skip
    try:
        for cmd in (head, worker):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_two_node_cluster_cli_equals_single_process(two_nodes: str, damaged: Path, make_ckpt, tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WEIGHTCHECK_RAY_CHUNK_BYTES": CHUNK}

    def wc(*args: str, extra: dict | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "weightcheck", *args, "--format", "json"]
        return subprocess.run(cmd, capture_output=True, text=True, env={**env, **(extra or {})}, timeout=600)

    single = wc("lint", str(damaged), "--content")
    assert single.returncode == 1, single.stderr
    distributed = wc("lint", str(damaged), "--content", "--ray", two_nodes)
    assert distributed.stdout == single.stdout, distributed.stderr[-3000:]
    assert "on 2 node(s)" in distributed.stderr  # both nodes took tasks

    marker = tmp_path / "killed"
    shard = sorted(p.name for p in damaged.glob("model-*.safetensors"))[2]
    killed = wc("lint", str(damaged), "--content", "--ray", two_nodes, extra={KILL_HOOK_ENV: f"{shard}:{marker}"})
    assert marker.exists() and killed.stdout == single.stdout
    assert "retried" in killed.stderr

    clean = make_ckpt("llama")
    d_single = wc("diff", str(clean), str(damaged))
    d_ray = wc("diff", str(clean), str(damaged), "--ray", two_nodes)
    assert d_single.returncode == 1 and d_ray.stdout == d_single.stdout, d_ray.stderr[-3000:]
