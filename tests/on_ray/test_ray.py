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
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import edit_tensors

from weightcheck.diffing import DiffOptions, diff
from weightcheck.distributed import KILL_HOOK_ENV
from weightcheck.findings import Result
from weightcheck.linting import lint
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
    # address="local": a new 2-CPU instance, never a cluster some `ray start` left on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
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


# Ray >= 2.52 turns token authentication on for new clusters; this loopback-only test cluster opts out.
CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[str]:
    """Head + worker node, each a `ray start --block` process this fixture owns: terminating them stops
    exactly this cluster's processes (`ray stop` would stop every Ray process on the machine)."""
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    env = {**os.environ, **CLUSTER_ENV}
    ray_bin = str(Path(sys.executable).parent / "ray")
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats", "--block"]
    head = [ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false", *common]
    worker = [ray_bin, "start", f"--address=127.0.0.1:{port}", *common]
    logs = tmp_path_factory.mktemp("ray-logs")
    procs: list[subprocess.Popen] = []
    address = f"127.0.0.1:{port}"
    try:
        for i, cmd in enumerate((head, worker)):
            out = open(logs / f"node{i}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
            if i == 0:
                _wait_port(port, procs, logs)
        _wait_nodes(address, 2, procs, logs)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        # `ray start --head` records its address for later `ray.init()` calls; forget ours (only ours).
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if current.is_file() and f":{port}" in current.read_text():
            current.unlink()


def _wait_port(port: int, procs: list[subprocess.Popen], logs: Path) -> None:
    import time

    for _ in range(600):
        if any(p.poll() is not None for p in procs):
            text = "\n".join(f.read_text()[-2000:] for f in sorted(logs.iterdir()))
            pytest.fail(f"a `ray start` process exited:\n{text}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"the head's GCS port {port} never opened")


def _wait_nodes(address: str, count: int, procs: list[subprocess.Popen], logs: Path) -> None:
    probe = (
        "import ray, time\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "for _ in range(120):\n"
        f"    if sum(n['Alive'] for n in ray.nodes()) >= {count}: break\n"
        "    time.sleep(1)\n"
        "print(sum(n['Alive'] for n in ray.nodes()))\n"
    )
    for _ in range(60):
        if any(p.poll() is not None for p in procs):
            text = "\n".join(f.read_text()[-2000:] for f in sorted(logs.iterdir()))
            pytest.fail(f"a `ray start` process exited:\n{text}")
        env = {**os.environ, **CLUSTER_ENV}
        proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0 and proc.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
    pytest.fail(f"the cluster at {address} never reached {count} node(s)")


def test_two_node_cluster_cli_equals_single_process(two_nodes: str, damaged: Path, _built, tmp_path) -> None:
    env = {**os.environ, **CLUSTER_ENV, "WEIGHTCHECK_RAY_CHUNK_BYTES": CHUNK}

    def wc(*args: str, extra: dict | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "weightcheck", *args, "--format", "json"]
        return subprocess.run(cmd, capture_output=True, text=True, env={**env, **(extra or {})}, timeout=600)

    single = as_json(_lint(damaged))  # the CLI's --format json is this rendering of the same Result
    distributed = wc("lint", str(damaged), "--content", "--ray", two_nodes)
    assert distributed.returncode == 1 and distributed.stdout == single, distributed.stderr[-3000:]
    assert "on 2 node(s)" in distributed.stderr  # both nodes took tasks

    marker = tmp_path / "killed"
    shard = sorted(p.name for p in damaged.glob("model-*.safetensors"))[2]
    killed = wc("lint", str(damaged), "--content", "--ray", two_nodes, extra={KILL_HOOK_ENV: f"{shard}:{marker}"})
    assert marker.exists() and killed.stdout == single
    assert "retried" in killed.stderr

    clean = _built("llama")  # the pristine build, only read
    d_ray = wc("diff", str(clean), str(damaged), "--ray", two_nodes)
    assert d_ray.returncode == 1 and d_ray.stdout == as_json(diff(clean, damaged)), d_ray.stderr[-3000:]
