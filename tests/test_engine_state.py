"""Engine-state checks (WC740–WC744): the tap digests every parameter and buffer after each sync
(`state=True`), and verify compares them with the startup state, with what the tap saw written, and across
replicas. Here on a small engine that loads like SGLang; tests/sglang/ runs them on real SGLang classes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from weightcheck import tap
from weightcheck.findings import Result, Severity
from weightcheck.verifying import verify


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    assert param.shape == loaded_weight.shape
    param.data.copy_(loaded_weight)


class RMSNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8), requires_grad=False)


class RotaryEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.arange(32, dtype=torch.float32).reshape(4, 8))


class RowParallelLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8, 8), requires_grad=False)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.rotary = RotaryEmbedding()
        self.o_proj = RowParallelLinear()

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in params:
                getattr(params[name], "weight_loader", default_loader)(params[name], tensor)

    def load_direct(self, weights: Any) -> None:
        """`load_format="direct"`: copies into the parameters without load_weights."""
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, Path, list[tuple[str, torch.Tensor]]]]:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    stream = [("norm.weight", torch.randn(8)), ("o_proj.weight", torch.randn(8, 8))]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file(dict(stream), str(ckpt / "model.safetensors"))
    records = tmp_path / "records"
    tap.configure(records, state=True, digest="posmix128")
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    try:
        yield records, ckpt, stream
    finally:
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())


def startup(stream: list[tuple[str, torch.Tensor]]) -> Model:
    model = tap.wrap(Model())
    model.load_weights(iter(stream))  # sync 0: the startup disk load, a bare call
    return model


def codes(result: Result, at_least: Severity = Severity.WARNING) -> set[str]:
    return {f.code for f in result.findings if f.severity >= at_least}


def test_clean_syncs_record_state_and_pass(setup: Any) -> None:
    records, ckpt, stream = setup
    model = startup(stream)
    with tap.sync("step-1"):
        model.load_weights(iter(stream))
    record = tap.read_record(next((records / "sync-00001").glob("*.jsonl")))
    assert record.header["state_digest"] == "posmix128"
    assert {n: (s.kind, s.sharded) for n, s in record.states.items()} == {
        "norm.weight": ("param", False),
        "rotary.cos_sin_cache": ("buffer", False),
        "o_proj.weight": ("param", True),
    }
    result = verify(records, ckpt)
    assert result.findings == [], [f.message for f in result.findings]


def test_direct_write_of_a_wrong_tensor_is_reported(setup: Any) -> None:
    records, ckpt, stream = setup
    model = startup(stream)
    with tap.sync("step-1"):  # begin/end weight update around update_weights_from_tensor(load_format="direct")
        tap.note_model(model)
        model.load_direct([("norm.weight", stream[0][1]), ("o_proj.weight", stream[1][1].t())])  # transposed
    result = verify(records, ckpt, sync=1)
    assert codes(result) == {"WC740"}, [f.message for f in result.findings]
    (diverged,) = [f for f in result.findings if f.code == "WC740"]
    assert diverged.details["params"] == ["o_proj.weight"]
    (bypass,) = [f for f in result.findings if f.code == "WC744"]
    assert bypass.details["changed"] == ["o_proj.weight"]
    # Written right: the same path is clean (no WC722 flood: the stream checks have nothing to judge).
    with tap.sync("step-2"):
        model.load_direct(stream)
    assert codes(verify(records, ckpt, sync=2)) == set()


def test_buffer_released_and_not_restored_is_reported(setup: Any) -> None:
    records, ckpt, stream = setup
    model = startup(stream)
    model.rotary.cos_sin_cache.zero_()  # release_memory_occupation freed it; resume did not restore it
    with tap.sync("step-1"):
        model.load_weights(iter(stream))
    result = verify(records, ckpt, sync=1)
    assert codes(result) == {"WC742"}
    (buffer,) = [f for f in result.findings if f.code == "WC742"]
    assert buffer.details["names"] == ["rotary.cos_sin_cache"] and "all zeros" in buffer.message


def test_parameter_not_holding_what_it_received_is_reported(setup: Any) -> None:
    records, ckpt, stream = setup
    model = startup(stream)
    with tap.sync("step-1"):
        model.load_weights(iter(stream))
        model.norm.weight.data.mul_(2)  # a later write outside load_weights in the same sync
    result = verify(records, ckpt, sync=1)
    assert {"WC743", "WC740"} <= codes(result)
    (received,) = [f for f in result.findings if f.code == "WC743"]
    assert received.details["params"] == ["norm.weight"]


def test_replicas_that_disagree_are_reported(setup: Any) -> None:
    records, _ckpt, stream = setup
    from weightcheck.tap import core

    for tp_rank in (0, 1):  # two TP ranks of one engine, each its own process (same sync numbers)
        core._STATE.next_seq = 0
        tap.set_engine_hooks(
            tap.EngineHooks(default_loader=default_loader, rank_info=lambda r=tp_rank: {"tp_rank": r, "tp_size": 2})
        )
        model = tap.wrap(Model())
        if tp_rank == 1:
            model.rotary.cos_sin_cache.add_(1)  # a replicated buffer that differs on one rank
            model.o_proj.weight.data.add_(1)  # sharded: ranks legitimately differ (not reported)
        with tap.sync("step-1"):
            model.load_weights(iter(stream[:1]))
    result = verify(records, None)
    (replicas,) = [f for f in result.findings if f.code == "WC741"]
    assert replicas.details["names"] == ["rotary.cos_sin_cache"]
    assert "tp_rank 1" in replicas.message


def test_dp_engines_that_disagree_are_reported(tmp_path: Path) -> None:
    records = tmp_path / "records"
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    try:
        for engine, scale in (("engine-a", 1.0), ("engine-b", 2.0)):
            tap.configure(records, state=True, engine=engine)
            model = tap.wrap(Model())
            with tap.sync("step-1"):
                model.load_weights([("norm.weight", torch.full((8,), scale))])
    finally:
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())
    (dp,) = [f for f in verify(records, None).findings if f.code == "WC741"]
    assert dp.details["engines"] == ["engine-a", "engine-b"] and dp.details["names"] == ["norm.weight"]
