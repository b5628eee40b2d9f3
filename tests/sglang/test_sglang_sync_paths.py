"""Every SGLang 0.5.23 weight-update entry point, driven the way the scheduler drives it, through SGLang's own
weight-updater components, with the tap installed by SGLang's plugin loader; plus the documented custom-engine
recipe and the engine-state checks (direct writes, a buffer not restored) on real SGLang model classes.

What is real: the model classes, `load_weights`, `SchedulerWeightUpdaterManager` (the scheduler's session and
`update_weights_from_*` handlers, with the plugin's hooks), `WeightUpdater` (the ModelRunner component that
unpacks flattened buckets, runs `load_format="direct"`, reloads from disk through `DefaultModelLoader`),
`TpModelWorker.deserialize_own_rank`, `MultiprocessingSerializer`, `FlattenedTensorBucket`.

Stubbed, and why:
* the `TpModelWorker`/`ModelRunner` objects around them (a `SimpleNamespace` exposing `weight_update_runners()`,
  `model_runner.weight_updater`, `deserialize_own_rank`): building a real ModelRunner allocates the KV cache
  and attention backends, which need a GPU;
* the CUDA-IPC payload serialization (`MultiprocessingSerializer` after SGLang's
  `monkey_patch_torch_reductions`, which rewrites the device index of CUDA tensor handles and raises on CPU
  tensors): the payload objects are handed over in-process instead (one per TP rank, as the real payload);
* the scheduler's `flush_cache` (no requests run here) and `record_weight_version_change` (kept in a list);
* `update_weights_from_disk` gets `load_format="auto"` (what the server fills in from its own server args).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

if os.environ.get("WEIGHTCHECK_REQUIRE_SGLANG"):
    import sglang.srt  # noqa: F401
else:
    pytest.importorskip("sglang.srt")

from sglang_harness import *  # noqa: F403

from weightcheck import tap
from weightcheck.findings import Result, Severity
from weightcheck.verifying import verify

pytestmark = pytest.mark.sglang


def serious(result: Result) -> set[str]:
    return {f.code for f in result.findings if f.severity >= Severity.WARNING}


def by_code(result: Result, code: str) -> list[Any]:
    return [f for f in result.findings if f.code == code]


class Stack:
    """SGLang's scheduler-side manager and ModelRunner-side WeightUpdater around one model."""

    def __init__(self, model: Any, ckpt: Path, draft: Any = None) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
        from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

        self.payloads: dict[bytes, Any] = {}
        self.versions: list[str | None] = []
        self.holder = {"model": model, "draft": draft}

        def updater(role: str) -> Any:
            return WeightUpdater(
                tp_rank=0,
                device="cpu",
                gpu_id=0,
                model_config=ModelConfig(str(ckpt)),
                custom_weight_loaders={},
                get_model=lambda: self.holder[role],
                update_model_fields=lambda model, **kw: self.holder.update({role: model}),
                recapture_cuda_graph=lambda: None,
                # The ModelRunner shell: checkpoint-engine's extension reads `model_runner.model`.
                get_model_runner=lambda: SimpleNamespace(model=self.holder[role]),
            )

        runner = SimpleNamespace(weight_updater=updater("model"))
        # A speculative worker's draft runner (BaseSpecWorker.weight_update_runners: ("draft", runner)); the
        # manager hands it the same deserialized payload after the target.
        draft_worker = None
        if draft is not None:
            draft_runner = SimpleNamespace(weight_updater=updater("draft"))
            draft_worker = SimpleNamespace(weight_update_runners=lambda: [("draft", draft_runner)])
        worker = SimpleNamespace(
            weight_update_runners=lambda: [("target", runner)],
            model_runner=runner,
            # TpModelWorker.deserialize_own_rank takes payload[tp_rank]; here the payload is a handle to the object.
            deserialize_own_rank=lambda payload: self.payloads.pop(payload[0]),
        )
        scheduler = SimpleNamespace(record_weight_version_change=lambda new_version: self.versions.append(new_version))
        self.manager = SchedulerWeightUpdaterManager(
            tp_worker=worker,
            draft_worker=draft_worker,
            memory_saver_adapter=None,
            flush_cache=lambda empty_cache=False: True,
            is_fully_idle=lambda **kw: True,
            scheduler=scheduler,
        )

    def session(self) -> Any:
        from sglang.srt.managers.io_struct import BeginWeightUpdateReqInput, EndWeightUpdateReqInput

        manager = self.manager

        class Session:
            def __enter__(self) -> None:
                assert manager.begin_weight_update(BeginWeightUpdateReqInput()).success

            def __exit__(self, *exc: Any) -> None:
                assert manager.end_weight_update(EndWeightUpdateReqInput()).success

        return Session()

    def tensor_update(self, named: list[tuple[str, Any]], version: str, load_format: str | None = None) -> Any:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        payload: Any = named
        if load_format == "flattened_bucket":  # what slime/miles colocated send per bucket
            bucket = FlattenedTensorBucket(named_tensors=named)
            payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
        handle = f"payload-{len(self.payloads)}-{id(payload)}".encode()
        self.payloads[handle] = payload
        request = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[handle],
            load_format=load_format,
            weight_version=version,
        )
        reply = self.manager.update_weights_from_tensor(request)
        assert reply.success, reply.message
        return reply


@pytest.fixture
def stack(harness: Any, checkpoints: Any) -> Any:
    def make(kind: str, **overrides: Any) -> tuple[Stack, Any, Path, list[tuple[str, Any]]]:
        ckpt = checkpoints(kind, **overrides)
        model = harness.build_model(kind, harness.tiny_config(kind, **overrides))
        harness.fill_pattern(model)
        return Stack(model, ckpt), model, ckpt, harness.checkpoint_stream(ckpt)

    return make


def buckets(stream: list[tuple[str, Any]], n: int) -> list[list[tuple[str, Any]]]:
    size = -(-len(stream) // n)
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def test_session_with_flattened_buckets(plugin_tap: Path, records_dir: Path, stack: Any) -> None:
    """slime/miles colocated: begin_weight_update, update_weights_from_tensor(load_format="flattened_bucket")
    per bucket, end_weight_update; one sync, clean. Then the same push with one bucket lost: named."""
    s, _, ckpt, stream = stack("qwen3_moe")
    with s.session():
        for bucket in buckets(stream, 3):
            s.tensor_update(bucket, "step-1", load_format="flattened_bucket")
    assert s.versions == ["step-1"] * 3
    result = verify(records_dir, ckpt, weight_version="step-1")
    assert result.findings == [], [f.message for f in result.findings]
    assert result.checked["syncs"] == 1 and result.checked["tensors"] == len(stream)

    lost = buckets(stream, 3)[1]
    with s.session():
        for bucket in buckets(stream, 3)[::2]:
            s.tensor_update(bucket, "step-2", load_format="flattened_bucket")
    result = verify(records_dir, ckpt, weight_version="step-2")
    missing = {n for f in by_code(result, "WC722") for n in f.details["names"]}
    assert missing == {n for n, _ in lost}


def test_update_from_disk_through_the_default_model_loader(
    plugin_tap: Path, records_dir: Path, stack: Any, tmp_path: Path
) -> None:
    """update_weights_from_disk through SGLang's DefaultModelLoader: a clean reload is clean; a saved step that
    lacks one tensor is named (SGLang loads it without complaint)."""
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

    s, _, ckpt, stream = stack("qwen3")
    request = UpdateWeightFromDiskReqInput(model_path=str(ckpt), load_format="auto", weight_version="v2")
    reply = s.manager.update_weights_from_disk(request)
    assert reply.success, reply.message
    result = verify(records_dir, ckpt, weight_version="v2")
    assert result.findings == [], [f.message for f in result.findings]
    (record_file,) = records_dir.rglob("*.jsonl")
    assert tap.read_record(record_file).header["sync"]["source"] == "request:update_weights_from_disk"

    # Planted: the trainer's saved step lacks one tensor (a filtered save). SGLang's loader raises nothing and
    # the parameter keeps its old values; verify against the reference names it.
    import shutil

    from safetensors.torch import save_file

    lost = "model.layers.1.self_attn.o_proj.weight"
    saved = tmp_path / "step-3"
    saved.mkdir()
    shutil.copy(ckpt / "config.json", saved / "config.json")
    save_file({n: t for n, t in stream if n != lost}, str(saved / "model.safetensors"), metadata={"format": "pt"})
    request = UpdateWeightFromDiskReqInput(model_path=str(saved), load_format="auto", weight_version="v3")
    assert s.manager.update_weights_from_disk(request).success
    result = verify(records_dir, ckpt, weight_version="v3")
    # One defect, one finding: the parameter left unwritten is the missing tensor's follow-on (related).
    assert serious(result) == {"WC722"}, [f.message for f in result.findings]
    assert {n for f in by_code(result, "WC722") for n in f.details["names"]} == {lost}
    assert [r.code for f in by_code(result, "WC722") for r in f.related] == ["WC732"]


def test_direct_load_format_bypasses_load_weights_and_state_checks_catch_it(
    plugin_tap: Path, records_dir: Path, stack: Any
) -> None:
    """update_weights_from_tensor(load_format="direct") writes SGLang-internal names with default_weight_loader,
    never through load_weights. With the state digest on, a clean direct push passes and one that writes a
    wrong tensor is reported (WC740 against the startup state)."""
    from weightcheck.tap import core

    s, model, ckpt, stream = stack("qwen3")
    base = tap.current_config()
    assert base is not None
    tap.configure(core.TapConfig(directory=records_dir, digest=base.digest, state=True))
    model.load_weights(iter(stream))  # sync 0: the startup load (a bare call)
    params = dict(model.named_parameters())
    internal = [(name, p.detach().clone()) for name, p in params.items()]  # what a direct sender sends
    with s.session():
        s.tensor_update(internal, "step-1", load_format="direct")
    clean = verify(records_dir, ckpt, weight_version="step-1")
    assert serious(clean) == set(), [f.message for f in clean.findings]
    assert by_code(clean, "WC744")  # judged by state alone, no flood of WC722

    wrong = [(n, t.flip(0) if n.endswith("layers.1.mlp.gate_up_proj.weight") else t) for n, t in internal]
    with s.session():
        s.tensor_update(wrong, "step-2", load_format="direct")
    result = verify(records_dir, ckpt, weight_version="step-2")
    (diverged,) = by_code(result, "WC740")
    assert diverged.details["params"] == ["model.layers.1.mlp.gate_up_proj.weight"]
    assert serious(result) == {"WC740"}


def test_buffer_released_and_not_restored(plugin_tap: Path, records_dir: Path, stack: Any) -> None:
    from weightcheck.tap import core

    s, model, ckpt, stream = stack("qwen3")
    base = tap.current_config()
    assert base is not None
    tap.configure(core.TapConfig(directory=records_dir, digest=base.digest, state=True))
    model.load_weights(iter(stream))  # startup
    buffers = dict(model.named_buffers())
    assert buffers, "Qwen3 registers its rotary cos/sin cache as a buffer"
    name = next(iter(buffers))
    with s.session():
        s.tensor_update(stream, "step-1")
    assert serious(verify(records_dir, ckpt, weight_version="step-1")) == set()
    buffers[name].zero_()  # release_memory_occupation freed it; resume did not restore it
    with s.session():
        s.tensor_update(stream, "step-2")
    result = verify(records_dir, ckpt, weight_version="step-2")
    (changed,) = by_code(result, "WC742")
    assert changed.details["names"] == [name] and "all zeros" in changed.message


def test_documented_custom_engine_recipe_on_deepseek(records_dir: Path, harness: Any, checkpoints: Any) -> None:
    """docs/live-verify.md's recipe (configure + install, no engine hooks) on DeepSeek-V3 (first_k_dense_replace=1:
    layer 0 dense, norms, q/kv a-norms, mlp.gate.weight and e_score_correction_bias go through the default
    loader): a clean sync has no finding; three bare load_weights calls of one version are one clean sync."""
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    from weightcheck.tap import core

    ckpt = checkpoints("deepseek_v3")
    stream = harness.checkpoint_stream(ckpt)
    saved = core._STATE.hooks
    tap.set_engine_hooks(tap.EngineHooks(current_weight_version=lambda: "step-1"))  # the recipe: no default_loader
    try:
        model = harness.build_model("deepseek_v3", harness.tiny_config("deepseek_v3"))
        harness.fill_pattern(model)
        tap.install(DeepseekV3ForCausalLM)  # already tapped by the plugin: a no-op, as documented
        with tap.sync("step-0"):
            model.load_weights(iter(stream))
        result = verify(records_dir, ckpt, weight_version="step-0")
        assert result.findings == [], [f.message for f in result.findings]
        record = tap.read_record(next((records_dir / "sync-00000").glob("*.jsonl")))
        assert all(p.tracked for p in record.params.values())  # SGLang's default loader found on its own
        # Three buckets, bare calls, one version (the engine's): one sync, clean. The q_a/kv_a pair stays together.
        harness.fill_pattern(model)
        for bucket in buckets(stream, 3):
            model.load_weights(iter(bucket))
        result = verify(records_dir, ckpt, weight_version="step-1")
        assert result.findings == [], [f.message for f in result.findings]
        assert result.checked["syncs"] == 1
    finally:
        tap.set_engine_hooks(saved)


def test_untracked_parameters_are_unknown_on_a_real_model(
    records_dir: Path, harness: Any, checkpoints: Any, tmp_path: Path
) -> None:
    """A served class whose module tests `is default_weight_loader` (as SGLang's inkling does) leaves loader-less
    parameters untracked: DeepSeek's norms and router arrive and are not called dropped (the false WC731 of
    the issue); a quantized router companion sent alongside is still a real drop."""
    import sys

    import torch

    check = "weight_loader is default" + "_weight_loader"  # split: this module must not match itself
    (tmp_path / "strict_deepseek.py").write_text(
        "from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM\n"
        "class StrictDeepseek(DeepseekV3ForCausalLM):\n"
        f"    def uses_default(self, weight_loader):\n        return {check}\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import strict_deepseek

        ckpt = checkpoints("deepseek_v3")
        stream = harness.checkpoint_stream(ckpt)
        model = strict_deepseek.StrictDeepseek(harness.tiny_config("deepseek_v3"))
        harness.fill_pattern(model)
        tap.install(strict_deepseek.StrictDeepseek)
        with tap.sync("step-1"):
            model.load_weights(iter(stream))
        record = tap.read_record(next(records_dir.rglob("*.jsonl")))
        untracked = {n for n, p in record.params.items() if not p.tracked}
        assert "model.layers.1.mlp.gate.weight" in untracked and "model.norm.weight" in untracked
        result = verify(records_dir, ckpt, weight_version="step-1")
        assert result.findings == [], [f.message for f in result.findings]

        extra = ("model.layers.1.mlp.gate.weight_packed", torch.zeros(4, 8, dtype=torch.int32))
        with tap.sync("step-2"):
            model.load_weights(iter([*stream, extra]))
        (dropped,) = by_code(verify(records_dir, ckpt, weight_version="step-2"), "WC731")
        assert dropped.details["names"] == [extra[0]] and dropped.severity == Severity.ERROR
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("strict_deepseek", None)
