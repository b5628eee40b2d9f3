"""`update_weights_from_ipc` (checkpoint-engine) driven the way SGLang 0.5.23's scheduler drives it, in-process:
`SchedulerWeightUpdaterManager.update_weights_from_ipc` (inside a begin/end session) → the ModelRunner's
`WeightUpdater.update_weights_from_ipc` → SGLang's own `SGLangCheckpointEngineWorkerExtensionImpl`, whose
`get_model_loader()` is the served model's `load_weights` and whose post hook runs `post_load_weights`.

Stubbed, and why (only the transport boundary):
* `checkpoint_engine.worker.update_weights_from_ipc`, the receiver that maps the trainer's CUDA-IPC buffers
  announced over ZMQ and calls `run(named_tensors)` per bucket then `post_hook()`: it needs a GPU (CUDA IPC
  handles cannot be opened on CPU, and SGLang's IPC serializer raises on CPU tensors) and the
  `checkpoint-engine` package is not part of the CPU environment. The stub delivers the same buckets in-process
  with the same `run` / `post_hook` contract;
* the extension's `get_device_uuid` / `get_device_id` (they query the GPU): fixed values;
* the worker/ModelRunner shells, as in test_sglang_sync_paths.py.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("WEIGHTCHECK_REQUIRE_SGLANG"):
    import sglang.srt  # noqa: F401
else:
    pytest.importorskip("sglang.srt")

import test_sglang_sync_paths as paths
from sglang_harness import *  # noqa: F403

from weightcheck.verifying import verify

pytestmark = pytest.mark.sglang

DEVICE = "GPU-weightcheck-cpu-0"


@pytest.fixture
def ipc(plugin_tap: Path, harness: Any, checkpoints: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    posted: dict[str, list[list[tuple[str, Any]]]] = {}

    def receive(zmq_ctx: Any, handle: str, *, device_id: int, run: Any, post_hook: Any = None) -> None:
        for bucket in posted.pop(handle):
            run(bucket)
        if post_hook is not None:
            post_hook()

    worker_module = types.ModuleType("checkpoint_engine.worker")
    worker_module.update_weights_from_ipc = receive  # type: ignore[attr-defined]
    package = types.ModuleType("checkpoint_engine")
    package.worker = worker_module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "checkpoint_engine", package)
    monkeypatch.setitem(sys.modules, "checkpoint_engine.worker", worker_module)
    from sglang.srt.checkpoint_engine import checkpoint_engine_worker as cew

    monkeypatch.setattr(cew.SGLangCheckpointEngineWorkerExtensionImpl, "get_device_uuid", lambda self: DEVICE)
    monkeypatch.setattr(cew.SGLangCheckpointEngineWorkerExtensionImpl, "get_device_id", lambda self: 0)

    ckpt = checkpoints("qwen3_moe")
    model = harness.build_model("qwen3_moe", harness.tiny_config("qwen3_moe"))
    harness.fill_pattern(model)
    stack = paths.Stack(model, ckpt)
    stream = harness.checkpoint_stream(ckpt)

    def push(buckets: list[list[tuple[str, Any]]], version: str) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightsFromIPCReqInput

        handle = f"ipc:///tmp/weightcheck-{version}.sock"
        posted[handle] = buckets
        with stack.session():
            reply = stack.manager.update_weights_from_ipc(
                UpdateWeightsFromIPCReqInput(zmq_handles={DEVICE: handle}, weight_version=version)
            )
        assert reply.success, reply.message
        assert not posted, "the receiver was not reached"

    return push, ckpt, stream


def test_update_from_ipc_clean_then_wrong_tensor_named(records_dir: Path, ipc: Any) -> None:
    push, ckpt, stream = ipc
    push(paths.buckets(stream, 3), "step-1")
    result = verify(records_dir, ckpt, weight_version="step-1")
    assert result.findings == [], [f.message for f in result.findings]
    assert result.checked["syncs"] == 1 and result.checked["tensors"] == len(stream)

    victim = "model.layers.1.mlp.experts.2.down_proj.weight"
    wrong = [(n, t.flip(0) if n == victim else t) for n, t in stream]
    push(paths.buckets(wrong, 3), "step-2")
    result = verify(records_dir, ckpt, weight_version="step-2")
    mismatched = {n for f in paths.by_code(result, "WC727") for n in f.details.get("names", [f.location.tensor])}
    assert victim in mismatched, [f.message for f in result.findings]
    assert paths.serious(result) == {"WC727"}, [f.message for f in result.findings]
