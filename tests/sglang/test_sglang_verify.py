"""Real SGLang model classes, real `load_weights`, the tap installed by SGLang's plugin loader: every sync
defect the issue lists is streamed through the engine and diagnosed by `weightcheck verify`.

Each scenario fills the engine's parameters with a fixed random pattern first (as SGLang's own checker
does), then streams tensors read back from a transformers-written checkpoint, which is also the reference.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("WEIGHTCHECK_REQUIRE_SGLANG"):  # scripts/test-sglang.sh: a broken install must fail, not skip
    import sglang.srt  # noqa: F401
else:  # not "sglang": tests/sglang/ itself imports as a namespace package when sglang is absent
    pytest.importorskip("sglang.srt")

# The harness's fixtures (its `__all__`): a star import is how a test module picks up fixtures defined elsewhere.
from sglang_harness import *  # noqa: F403

from weightcheck import tap
from weightcheck.findings import Finding, Result
from weightcheck.verifying import TrainerLayout, verify


def with_related(result: Result, code: str) -> list[Finding]:
    """Findings of `code`, also where attached to another as its follow-on (one defect, one finding: a
    parameter left unwritten because its tensor was never sent, WC732, is that WC722's related finding)."""
    return [f for top in result.findings for f in (top, *top.related) if f.code == code]


pytestmark = pytest.mark.sglang

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def by_code(result: Result, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


def codes(result: Result) -> set[str]:
    return {f.code for f in result.findings}


def layer_of(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(2)) if match else None


def relabel_layer(name: str, layer: int) -> str:
    return _LAYER.sub(lambda m: f"{m.group(1)}layers.{layer}.", name, count=1)


@pytest.fixture
def engine(harness: Any, checkpoints: Any) -> Any:
    """`engine(kind, **config)` → (SGLang model filled with the reset pattern, checkpoint path, its stream)."""

    def make(kind: str, **overrides: Any) -> tuple[Any, Path, list[tuple[str, Any]]]:
        path = checkpoints(kind, **overrides)
        model = harness.build_model(kind, harness.tiny_config(kind, **overrides))
        harness.fill_pattern(model)
        return model, path, harness.checkpoint_stream(path)

    return make


def push(model: Any, buckets: list[list[tuple[str, Any]]], version: str) -> None:
    """One sync (SGLang's begin/end weight-update session), each bucket one load_weights call, streamed
    through a one-shot generator."""
    with tap.sync(version, source="session"):
        for bucket in buckets:
            model.load_weights(item for item in bucket)


def test_plugin_installed_the_tap_through_hook_registry(plugin_tap: Path, harness: Any) -> None:
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry

    for module, name in harness.targets.values():
        klass = getattr(importlib.import_module(module), name)
        assert f"{module}.{name}.load_weights" in HookRegistry._patched
        assert getattr(klass.load_weights, "__wrapped__", None) is not None
        marker = getattr(klass.load_weights, "_supports_quantized_rl_reload", None)
        assert marker is None or marker is klass.load_weights or name not in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
    assert tap.current_config() is not None


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "qwen3_moe", "deepseek_v3"])
def test_clean_sync_passes(kind: str, engine: Any, records_dir: Path) -> None:
    model, ckpt, stream = engine(kind)
    push(model, [stream], "step-1")
    result = verify(records_dir, ckpt)
    assert result.findings == [], [f.message for f in result.findings]
    assert result.checked["tensors"] == len(stream)
    (record_file,) = (records_dir / "sync-00000").glob("*.jsonl")
    record = tap.read_record(record_file)
    assert record.weight_version == "step-1"
    assert record.header["model"]["class"] == type(model).__name__
    assert all(p.writes > 0 for p in record.params.values() if p.tracked)
    # Every parameter of these models is observable (none is left "untracked").
    assert {n for n, p in record.params.items() if not p.tracked} == set()


@pytest.mark.parametrize("state", [False, True], ids=["stream", "with-engine-state"])
def test_gemma_norms_the_engine_writes_into_are_not_called_mismatched(
    engine: Any, records_dir: Path, monkeypatch: pytest.MonkeyPatch, state: bool
) -> None:
    """SGLang's own Gemma adds 1 to each norm weight it is handed (`loaded_weight += 1.0`): the first sync of an
    engine process reports those norms as not compared (WC746, a warning), never as "bytes differ" (WC727,
    what it was before), and later syncs digest them on arrival and compare them: no finding. With the engine
    state (`WEIGHTCHECK_STATE=1`), the norm parameters holding what arrived + 1 are not WC743."""
    from weightcheck.tap import digesting

    monkeypatch.setattr(digesting, "_WROTE_INTO", set())  # a fresh engine process
    if state:
        base = tap.current_config()
        assert base is not None
        tap.configure(tap.TapConfig(directory=records_dir, digest_threads=base.digest_threads, state=True))
    model, ckpt, stream = engine("gemma")
    norms = sorted(name for name, _ in stream if "norm.weight" in name)
    assert norms
    for step in range(2):
        push(model, [[(name, tensor.clone()) for name, tensor in stream]], f"step-{step}")
    first = verify(records_dir, ckpt, sync=0)
    assert [(f.code, f.severity.label) for f in first.findings] == [("WC746", "warning")], [
        (f.code, f.message) for f in first.findings
    ]
    assert first.findings[0].details["names"] == norms
    second = verify(records_dir, ckpt, sync=1)
    assert second.findings == [], [(f.code, f.message) for f in second.findings]
    assert second.checked["tensors"] == len(stream)


def test_pp_stage_that_forgot_its_offset_is_named(engine: Any, records_dir: Path) -> None:
    model, ckpt, stream = engine("qwen3", num_hidden_layers=4)
    stage0 = [(n, t) for n, t in stream if (layer_of(n) is not None and layer_of(n) < 2) or "embed_tokens" in n]
    # Stage 1 holds layers 2..3 and sends them under their local ids 0..1 (offset 2 forgotten).
    stage1 = [
        (relabel_layer(n, layer_of(n) - 2) if layer_of(n) is not None else n, t)
        for n, t in stream
        if (layer_of(n) is not None and layer_of(n) >= 2) or n in ("model.norm.weight", "lm_head.weight")
    ]
    push(model, [stage0, stage1], "step-2")

    result = verify(records_dir, ckpt)
    (shift,) = by_code(result, "WC725")
    assert "layers 0..1 from pp_rank 1 shifted by −2" in shift.message
    assert shift.details["stage"] == "pp_rank 1" and shift.details["forgot_offset"] is True
    # The engine's layers 2..3 never got data; layers 0..1 were written twice (stage 1 last).
    never = with_related(result, "WC732")
    assert never and all(layer_of(n) in (2, 3) for f in never for n in f.details["params"])
    assert by_code(result, "WC724")
    assert any(f.details.get("explained_by_shift") for f in by_code(result, "WC722"))

    exact = verify(records_dir, ckpt, trainer=TrainerLayout(pp_size=2))
    (shift,) = by_code(exact, "WC725")
    assert shift.details["stage_inferred_from"] == "from the trainer layout"


def test_ep_rank_that_forgot_its_expert_offset_is_named(engine: Any, records_dir: Path) -> None:
    model, ckpt, stream = engine("qwen3_moe")

    def expert(name: str) -> int | None:
        match = _EXPERT.search(name)
        return int(match.group(1)) if match else None

    # Trainer EP=2 over 4 experts: ep_rank 1 holds experts 2..3 and sends them as 0..1.
    ep0 = [(n, t) for n, t in stream if expert(n) is None or expert(n) < 2]
    ep1 = [(_EXPERT.sub(f".experts.{expert(n) - 2}.", n), t) for n, t in stream if (expert(n) or 0) >= 2]
    push(model, [ep0 + ep1], "step-3")

    result = verify(records_dir, ckpt)
    (shift,) = by_code(result, "WC726")
    assert "experts 0..1 from ep_rank 1 shifted by −2" in shift.message
    partial = by_code(result, "WC733")
    assert partial and all("local experts 2..3 never written" in f.message for f in partial)


def test_quantized_router_is_reported_as_dropped_by_the_engine(engine: Any, records_dir: Path) -> None:
    import torch

    model, ckpt, stream = engine("qwen3_moe")
    sent: list[tuple[str, Any]] = []
    for name, tensor in stream:
        if name.endswith("mlp.gate.weight"):
            base = name[: -len("weight")]
            # compressed-tensors pack-quantized router: int32 words, group scales, original shape.
            sent.append((f"{base}weight_packed", torch.randint(-(2**31), 2**31 - 1, (4, 8), dtype=torch.int32)))
            sent.append((f"{base}weight_scale", torch.rand(4, 2, dtype=torch.bfloat16)))
            sent.append((f"{base}weight_shape", torch.tensor([4, 64], dtype=torch.int32)))
        else:
            sent.append((name, tensor))
    push(model, [sent], "step-4")

    result = verify(records_dir, ckpt)
    dropped = by_code(result, "WC731")
    assert dropped, [f.message for f in result.findings]
    names = {n for f in dropped for n in f.details["names"]}
    assert names == {f"model.layers.{i}.mlp.gate.weight_{s}" for i in (0, 1) for s in ("packed", "scale", "shape")}
    assert "quantized tensor for a parameter the engine holds unquantized" in dropped[0].message
    assert "silently" in dropped[0].message  # Qwen3-MoE logs nothing
    never = {n for f in with_related(result, "WC732") for n in f.details["params"]}
    assert never == {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight"}
    assert {n for f in by_code(result, "WC722") for n in f.details["names"]} == {
        "model.layers.0.mlp.gate.weight",
        "model.layers.1.mlp.gate.weight",
    }


def test_tensor_never_sent(engine: Any, records_dir: Path) -> None:
    model, ckpt, stream = engine("qwen3")
    withheld = {"model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight"}
    push(model, [[(n, t) for n, t in stream if n not in withheld]], "step-5")

    result = verify(records_dir, ckpt)
    assert {n for f in by_code(result, "WC722") for n in f.details["names"]} == withheld
    assert {n for f in with_related(result, "WC732") for n in f.details["params"]} == {
        "model.layers.1.mlp.down_proj.weight"
    }
    (partial,) = by_code(result, "WC733")
    assert partial.details["params"] == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert "shard k never written" in partial.message


def test_deepseek_fused_pair_split_across_buckets(engine: Any, records_dir: Path) -> None:
    model, ckpt, stream = engine("deepseek_v3")
    split = "model.layers.1.self_attn.q_a_proj.weight"
    first = [(n, t) for n, t in stream if n == split]
    rest = [(n, t) for n, t in stream if n != split]
    push(model, [first, rest], "step-6")

    result = verify(records_dir, ckpt)
    (pair,) = by_code(result, "WC736")
    assert pair.details["pair"] == [split, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]
    never = {n for f in with_related(result, "WC732") for n in f.details["params"]}
    assert never == {"model.layers.1.self_attn.fused_qkv_a_proj_with_mqa.weight"}
    # The pair is reported once, as split, not also as an unexplained drop.
    assert not by_code(result, "WC731")


def test_deepseek_whole_stream_in_one_call_with_many_experts(engine: Any, records_dir: Path) -> None:
    """The whole stream in one load_weights call (disk-style) on a DeepSeek with 32 routed experts: SGLang
    writes the fused q_a/kv_a pair from its thread pool (`maybe_executor_submit` on host tensors), queued
    behind a layer's expert writes, long after the pair arrived. Clean: no finding (it was a false WC731).
    Then a layer's `kv_a_proj_with_mqa` withheld: its `q_a_proj` is cached and never written, and is named."""
    config = dict(num_hidden_layers=5, n_routed_experts=32)
    model, ckpt, stream = engine("deepseek_v3", **config)
    push(model, [stream], "step-7")
    result = verify(records_dir, ckpt)
    assert result.findings == [], [f.message for f in result.findings]

    withheld = "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"
    push(model, [[(n, t) for n, t in stream if n != withheld]], "step-8")
    result = verify(records_dir, ckpt, weight_version="step-8")
    assert {n for f in by_code(result, "WC722") for n in f.details["names"]} == {withheld}
    assert {n for f in by_code(result, "WC731") for n in f.details["names"]} == {
        "model.layers.3.self_attn.q_a_proj.weight"
    }
    never = {n for f in with_related(result, "WC732") for n in f.details["params"]}
    assert never == {"model.layers.3.self_attn.fused_qkv_a_proj_with_mqa.weight"}


def test_weight_version_comes_from_the_update_request(plugin_tap: Path, records_dir: Path, engine: Any) -> None:
    """The scheduler-side hook reads `weight_version` off the request (load_weights never sees it)."""
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

    model, ckpt, stream = engine("qwen3")
    manager = object.__new__(SchedulerWeightUpdaterManager)
    manager._session = None  # no engine behind it: SGLang refuses the request after our hook has read it
    tap.begin_sync(source="session")
    reply = SchedulerWeightUpdaterManager.update_weights_from_tensor(
        manager, UpdateWeightsFromTensorReqInput(serialized_named_tensors=[], weight_version="step-7")
    )
    assert reply.success is False
    model.load_weights(iter(stream))
    tap.end_sync()
    result = verify(records_dir, ckpt, weight_version="step-7")
    assert result.checked["syncs"] == 1 and result.findings == []


def test_model_built_by_sglangs_loader_is_tapped_through_initialize_model(
    plugin_tap: Path, records_dir: Path, harness: Any, tmp_path: Path
) -> None:
    """Production path: SGLang's `_initialize_model` builds the served class (here Llama, not listed in
    WEIGHTCHECK_SGLANG_TARGETS); the plugin's AFTER hook taps that class before its first load."""
    import torch
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import loader
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=256,
    )
    torch.manual_seed(3)
    ckpt = tmp_path / "llama"
    AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    model = loader._initialize_model(ModelConfig(str(ckpt)), LoadConfig())
    assert type(model).__name__ == "LlamaForCausalLM"
    assert getattr(type(model).load_weights, "__wrapped__", None) is not None
    harness.fill_pattern(model)
    model.load_weights(iter(harness.checkpoint_stream(ckpt)))  # a bare call: a sync of its own, like startup
    result = verify(records_dir, ckpt)
    assert result.findings == [], [f.message for f in result.findings]
    (record_file,) = (records_dir / "sync-00000").glob("*.jsonl")
    record = tap.read_record(record_file)
    assert record.header["model"]["class"] == "LlamaForCausalLM" and record.header["sync"]["source"] == "call"
