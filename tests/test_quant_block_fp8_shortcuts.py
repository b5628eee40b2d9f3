"""WC313 and WC314 pass a clean HF block-FP8 module (`weight` F8_E4M3 + `weight_scale_inv`, what DeepSeek-V3
stores 46k times) with a few lookups instead of their full per-module checks (weightcheck/rules/quant.py).
The shortcut must pass exactly the modules the full check passes: a checkpoint written by transformers' own
Fp8Quantize is clean, and each damage below, made with safetensors' writer, is still reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import by_code, run
from quant_fixtures import build_base, hf_fp8_from

from weightcheck.checkpoint import load_checkpoint
from weightcheck.quant.analysis import analyze_checkpoint
from weightcheck.rules.quant import _shape_problem

MODULE = "model.layers.1.self_attn.q_proj"


@pytest.fixture(scope="module")
def _hf_fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-fp8")
    return hf_fp8_from(build_base(root / "base", layers=2), root / "hf-fp8")


@pytest.fixture
def hf_fp8(_hf_fp8: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(_hf_fp8, tmp_path / "ckpt"))


def _edit(path: Path, drop: set[str] = frozenset(), add: dict | None = None) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    shard = path / "model.safetensors"
    with safe_open(str(shard), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys() if k not in drop}
    tensors.update(add or {})
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _tensor(path: Path, name: str):  # type: ignore[no-untyped-def]
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as fh:
        return fh.get_tensor(name)


def test_clean_checkpoint_passes_and_every_module_is_clean_for_the_full_check(hf_fp8: Path) -> None:
    result = run(hf_fp8)
    assert not by_code(result, "WC313") and not by_code(result, "WC314")
    qa = analyze_checkpoint(load_checkpoint(hf_fp8))
    assert qa.inventory is not None
    scheme = next((s for s in qa.spec.schemes if s.quantizes_weights), None)  # type: ignore[union-attr]
    inv_modules = [m for m in qa.inventory.modules.values() if "weight_scale_inv" in m.params]
    assert len(inv_modules) > 10  # the shortcut's case is what this checkpoint holds
    assert all(_shape_problem(qa, m, scheme) is None for m in qa.inventory.modules.values())


def test_scale_grid_off_by_one_row(hf_fp8: Path) -> None:
    import torch

    name = f"{MODULE}.weight_scale_inv"
    scale = _tensor(hf_fp8, name)
    _edit(hf_fp8, drop={name}, add={name: torch.ones(scale.shape[0] + 1, scale.shape[1], dtype=scale.dtype)})
    [finding] = by_code(run(hf_fp8), "WC314")
    assert "block scale" in finding.message and MODULE in finding.message


def test_weight_shape_not_the_patterns_with_a_fitting_grid(hf_fp8: Path) -> None:
    # the stored weight and its grid agree; the config says the layer is wider: only the expected-shape test sees it
    config = json.loads((hf_fp8 / "config.json").read_text())
    config["num_attention_heads"] *= 2
    config.setdefault("head_dim", config["hidden_size"] // (config["num_attention_heads"] // 2))
    (hf_fp8 / "config.json").write_text(json.dumps(config))
    findings = by_code(run(hf_fp8), "WC314")
    assert any("quantized weight shape" in f.message and "q_proj" in f.message for f in findings)


def test_packed_weight_beside_a_block_scale(hf_fp8: Path) -> None:
    import torch

    _edit(hf_fp8, drop={f"{MODULE}.weight"}, add={f"{MODULE}.weight_packed": torch.zeros(8, 4, dtype=torch.int32)})
    findings = by_code(run(hf_fp8), "WC313")
    assert any("weight_scale" in f.message and MODULE in f.message for f in findings)


def test_scales_without_a_weight(hf_fp8: Path) -> None:
    name = f"{MODULE}.weight_scale_inv"
    _edit(hf_fp8, drop={f"{MODULE}.weight"}, add={f"{MODULE}.weight_scale": _tensor(hf_fp8, name)})
    findings = by_code(run(hf_fp8), "WC313")
    assert any("weight or weight_packed" in f.message and MODULE in f.message for f in findings)
