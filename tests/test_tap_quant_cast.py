"""WC745: the tap notes a loader that copies FP8 codes into a float parameter, or a float tensor into an FP8
parameter (SGLang's loaders copy with a cast, so neither raises), and verify names it without a reference.
A loader that dequantizes first (hands on a float tensor built with the scale) is not a cast. The same
defects inside SGLang 0.5.23's real FP8 Qwen3-MoE: tests/sglang/test_sglang_quantized.py. Also: parameters
the engine marks optional (SGLang's `_skip_weight_check`, its KV-cache scales) are not "never written"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from weightcheck import tap
from weightcheck.tap.coverage import crosses_quantization
from weightcheck.verifying import verify

FP8 = torch.float8_e4m3fn


def copy_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    param.data.copy_(loaded_weight)  # SGLang's default_weight_loader: a cast, never an error


class Engine(nn.Module):
    """An FP8 `proj` with its `weight_scale_inv`, a BF16 `router` (built unquantized), and a BF16 `dense`
    whose model-level loader dequantizes FP8 input with its scale (kept too) before the parameter's loader
    sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_weight = nn.Parameter(torch.zeros(4, 4, dtype=FP8), requires_grad=False)
        self.proj_weight_scale_inv = nn.Parameter(torch.zeros(1, 1), requires_grad=False)
        self.router_weight = nn.Parameter(torch.zeros(2, 4, dtype=torch.bfloat16), requires_grad=False)
        self.dense_weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16), requires_grad=False)
        self.dense_weight_scale_inv = nn.Parameter(torch.zeros(1, 1), requires_grad=False)
        for param in self.parameters():
            param.weight_loader = copy_loader
        # A KV-cache scale as SGLang's BaseKVCacheMethod creates it: optional (`_skip_weight_check`), never sent
        # by an FP8 checkpoint without KV-cache scales; not "never written".
        self.k_scale = nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        self.k_scale._skip_weight_check = True  # type: ignore[attr-defined]

    def load_weights(self, weights: object) -> None:
        params = dict(self.named_parameters())
        scale: torch.Tensor | None = None
        for name, tensor in weights:  # type: ignore[attr-defined]
            key = name.replace(".", "_")
            if key == "dense_weight_scale_inv":  # sent first, so that the weight can be dequantized on arrival
                scale = tensor
            if key == "dense_weight" and tensor.dtype == FP8 and scale is not None:
                dense = (tensor.float() * scale).to(torch.bfloat16)  # the loader is handed BF16
                params["dense_weight"].weight_loader(params["dense_weight"], dense)
                continue
            if key in params:
                params[key].weight_loader(params[key], tensor)


def stream(*, router_fp8: bool = False, proj_bf16: bool = False) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    proj = torch.randn(4, 4, generator=generator).to(torch.bfloat16)
    router = torch.randn(2, 4, generator=generator).to(torch.bfloat16)
    dense = torch.randn(4, 4, generator=generator)
    out = (
        [("proj.weight", proj)]
        if proj_bf16
        else [("proj.weight", proj.to(FP8)), ("proj.weight_scale_inv", torch.ones(1, 1))]
    )
    out += (
        [("router.weight", router.to(FP8)), ("router.weight_scale_inv", torch.ones(1, 1))]
        if router_fp8
        else [("router.weight", router)]
    )
    out += [("dense.weight_scale_inv", torch.full((1, 1), 0.5)), ("dense.weight", dense.to(FP8))]
    return out


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "records"
    tap.configure(root, digest_threads=1)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=copy_loader))
    yield root
    tap.configure(None)
    tap.set_engine_hooks(tap.EngineHooks())


def push(root: Path, items: list[tuple[str, torch.Tensor]]) -> None:
    model = tap.wrap(Engine())
    with tap.sync("step-1"):
        model.load_weights(iter(items))


def test_the_fp8_float_line() -> None:
    assert crosses_quantization("F8_E4M3", "BF16") and crosses_quantization("F32", "F8_E5M2")
    assert not crosses_quantization("F8_E4M3", "F8_E4M3FNUZ")  # both FP8 (ROCm normalisation)
    assert not crosses_quantization("F32", "BF16") and not crosses_quantization("F32", "F8_E8M0")  # a scale
    assert not crosses_quantization("I32", "BF16") and not crosses_quantization(None, "BF16")


def test_clean_sync_and_a_dequantizing_loader_are_not_casts(records: Path) -> None:
    push(records, stream())
    result = verify(records)
    assert result.findings == [], [f.message for f in result.findings]
    record = tap.read_record(next((records / "sync-00000").glob("*.jsonl")))
    assert record.params["k_scale"].optional and record.params["k_scale"].writes == 0
    assert not record.params["proj_weight"].optional


def test_fp8_router_into_bf16_parameter(records: Path) -> None:
    push(records, stream(router_fp8=True))
    result = verify(records)
    (cast,) = [f for f in result.findings if f.code == "WC745"]
    assert cast.details["params"] == ["router_weight"] and cast.details["names"] == ["router.weight"]
    assert (cast.details["from"], cast.details["to"]) == ("F8_E4M3", "BF16")
    assert "lose their scale" in cast.message


def test_bf16_weight_into_fp8_parameter(records: Path) -> None:
    push(records, stream(proj_bf16=True))
    result = verify(records)
    (cast,) = [f for f in result.findings if f.code == "WC745"]
    assert cast.details["params"] == ["proj_weight"] and (cast.details["from"], cast.details["to"]) == (
        "BF16",
        "F8_E4M3",
    )
    assert "rounded to FP8 with no scale" in cast.message
    assert {f.code for f in result.findings} == {"WC732", "WC745"}  # and the scale got nothing


class LateFusedScales(nn.Module):
    """Like SGLang's DeepSeek loader on host tensors: `a` and `b` (FP8 weight + one block scale each) are
    concatenated into `fused`, and every write runs late, from a queue drained after the whole stream (its
    thread pool), behind 80 other one-block scales with the same value."""

    others = 80

    def __init__(self) -> None:
        super().__init__()
        self.fused_weight = nn.Parameter(torch.zeros(4, 4, dtype=FP8), requires_grad=False)
        self.fused_weight_scale_inv = nn.Parameter(torch.zeros(2, 1), requires_grad=False)
        for i in range(self.others):
            self.register_parameter(f"o{i}_weight_scale_inv", nn.Parameter(torch.zeros(1, 1), requires_grad=False))
        for param in self.parameters():
            param.weight_loader = copy_loader

    def load_weights(self, weights: object) -> None:
        params = dict(self.named_parameters())
        cached: dict[str, torch.Tensor] = {}
        queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, tensor in weights:  # type: ignore[attr-defined]
            base, _, suffix = name.partition(".")
            if base in ("a", "b"):
                cached[name] = tensor
                if f"a.{suffix}" in cached and f"b.{suffix}" in cached:
                    fused = torch.cat([cached.pop(f"a.{suffix}"), cached.pop(f"b.{suffix}")])
                    queue.append((params[f"fused_{suffix}"], fused))
            else:
                queue.append((params[name.replace(".", "_")], tensor))
        for param, tensor in queue:
            param.weight_loader(param, tensor)


def test_late_concatenated_scales_with_repeated_values_are_not_dropped(records: Path) -> None:
    one = torch.ones(1, 1)
    a, b = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(1)).to(FP8)
    items = [("a.weight", a), ("a.weight_scale_inv", one.clone()), ("b.weight", b), ("b.weight_scale_inv", one.clone())]
    items += [(f"o{i}.weight_scale_inv", one.clone()) for i in range(LateFusedScales.others)]
    model = tap.wrap(LateFusedScales())
    with tap.sync("step-1"):
        model.load_weights(iter(items))
    result = verify(records)
    assert result.findings == [], [f.message for f in result.findings]

    # A companion whose weight went into a parameter without a companion parameter is still dropped.
    items = [("a.weight", a), ("b.weight", b), ("b.weight_scale_inv", one.clone()), ("a.weight_scale_2", one.clone())]
    with tap.sync("step-2"):
        model.load_weights(iter(items))
    (dropped,) = [f for f in verify(records, sync="latest").findings if f.code == "WC731"]
    assert dropped.details["names"] == ["a.weight_scale_2", "b.weight_scale_inv"]
