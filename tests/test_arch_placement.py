"""Layer placement the generator fits over probes (issue #18): which layers are MoE decided by an interval,
a start and an end index (ERNIE-4.5-MoE) or by a list of layer numbers (Llama-4's `moe_layers`).

Checkpoints carry exactly the names and shapes transformers' own class writes for the config (built on the
meta device, as tests/test_arch_oracle.py does and checks against a real save_pretrained), so a clean one
must lint clean from the generated pattern alone, inside coverage (no "outside" note, and torch-free too);
the planted defect (one layer's weights removed) must still be an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import run

from weightcheck.findings import Severity
from weightcheck.patterns import ORACLE_ENV

pytest.importorskip("transformers")
pytest.importorskip("torch")

OUTSIDE = "outside what pattern"


def _config(model_type: str, **changes: Any) -> Any:
    from tools.archgen.generate import _with
    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.oracle import build_config, full_config_dict

    full = full_config_dict(tiny_config(model_type, "A"))
    for key, value in changes.items():
        full = _with(full, key, value)
    return build_config(full)


def _checkpoint(tmp: Path, obj: Any, drop: str = "", **raw: Any) -> Path:
    """The class's own names and shapes for `obj`; `drop`: leave out every tensor starting with it; `raw`:
    config.json values written as given (what a hand-edited or published file may hold)."""
    from test_arch_oracle import write_sparse_checkpoint

    from weightcheck.arch.oracle import expected_tensors

    shapes, _ = expected_tensors(json.loads(obj.to_json_string(use_diff=False)))
    assert shapes, "the class wrote nothing"
    if drop:
        kept = {n: s for n, s in shapes.items() if not n.startswith(drop)}
        assert len(kept) < len(shapes), f"nothing starts with {drop}"
        shapes = kept
    config = json.loads(obj.to_json_string()) | raw
    return write_sparse_checkpoint(tmp, config, shapes)


def _lint(path: Path, torch_free: bool = False) -> tuple[list[str], list[str]]:
    """(findings of warning or above, notes)."""
    if torch_free:
        os.environ[ORACLE_ENV] = "0"
    try:
        result = run(path)
    finally:
        os.environ.pop(ORACLE_ENV, None)
    problems = [f"{f.code} {f.message[:200]}" for f in result.findings
                if f.severity >= Severity.WARNING and f.code != "WC404"]  # fmt: skip
    return problems, list(result.notes)


def _errors(path: Path, torch_free: bool) -> set[str]:
    if torch_free:
        os.environ[ORACLE_ENV] = "0"
    try:
        return {f.code for f in run(path).findings if f.severity >= Severity.ERROR}
    finally:
        os.environ.pop(ORACLE_ENV, None)


# ERNIE-4.5-MoE: MoE on layers start..end (inclusive) every `interval` layers. End index 3 of 6 layers, and
# interval 2 from layer 1: configs whose dense layers the old `layer >= moe_layer_interval` got wrong.
ERNIE_CASES = [
    {"num_hidden_layers": 6, "moe_layer_end_index": 3},
    {"num_hidden_layers": 6, "moe_layer_end_index": 5, "moe_layer_interval": 2},
    {"num_hidden_layers": 5, "moe_layer_end_index": 4, "moe_layer_start_index": 2},
]


@pytest.mark.parametrize("changes", ERNIE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_ernie_moe_placement_inside_coverage_lints_clean(tmp_path: Path, changes: dict[str, Any],
                                                         torch_free: bool) -> None:  # fmt: skip
    path = _checkpoint(tmp_path, _config("ernie4_5_moe", **changes))
    problems, notes = _lint(path, torch_free)
    assert problems == []
    assert not any(OUTSIDE in n for n in notes), notes  # the pattern itself vouches for it


@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_ernie_dense_layer_after_end_index_missing_is_an_error(tmp_path: Path, torch_free: bool) -> None:
    # layer 5 is dense (end index 3): its MLP removed is caught by the pattern, with or without transformers
    obj = _config("ernie4_5_moe", num_hidden_layers=6, moe_layer_end_index=3)
    path = _checkpoint(tmp_path, obj, drop="model.layers.5.mlp.")
    assert "WC410" in _errors(path, torch_free)


@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_ernie_end_index_sentinel_is_outside_coverage_not_an_error(tmp_path: Path, torch_free: bool) -> None:
    # `moe_layer_end_index: -1` ("to the last layer") is resolved by the config class at load; lint reads
    # config.json as text and must not evaluate `layer <= -1` (every MoE layer a false WC410)
    obj = _config("ernie4_5_moe", num_hidden_layers=6, moe_layer_end_index=5)
    path = _checkpoint(tmp_path, obj, moe_layer_end_index=-1)
    problems, notes = _lint(path, torch_free)
    assert any(OUTSIDE in n and "moe_layer_end_index" in n for n in notes), notes
    if torch_free:  # the pattern's findings are at most warnings there
        assert not _errors(path, torch_free=True)
    else:  # the class builds the exact expectations
        assert problems == []


@pytest.mark.parametrize("moe_layers", [[1, 3], [0, 2], [3], []], ids=str)
@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_llama4_interleaved_moe_layers_lint_clean(tmp_path: Path, moe_layers: list[int], torch_free: bool) -> None:
    path = _checkpoint(tmp_path, _config("llama4_text", moe_layers=moe_layers))
    problems, notes = _lint(path, torch_free)
    assert problems == []
    assert not any(OUTSIDE in n for n in notes), notes


@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_llama4_dense_layer_mlp_missing_is_an_error(tmp_path: Path, torch_free: bool) -> None:
    obj = _config("llama4_text", moe_layers=[1, 3])
    path = _checkpoint(tmp_path, obj, drop="model.layers.0.feed_forward.gate_proj.")
    assert "WC410" in _errors(path, torch_free)


# Qwen-MoE family (no hand-written TOML for Qwen3-VL-MoE): MoE every `decoder_sparse_step` layers except those in
# `mlp_only_layers`. Step 0 is buildable only with every layer in mlp_only_layers (the modeling code tests the
# list first): the generated condition must not divide by it there.
QWEN_VL_MOE_CASES = [
    {"decoder_sparse_step": 2},
    {"mlp_only_layers": [0, 2]},
    {"decoder_sparse_step": 0, "mlp_only_layers": [0, 1, 2, 3]},
]


@pytest.mark.parametrize("changes", QWEN_VL_MOE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_qwen_moe_sparse_step_and_mlp_only_layers_lint_clean(tmp_path: Path, changes: dict[str, Any],
                                                             torch_free: bool) -> None:  # fmt: skip
    path = _checkpoint(tmp_path, _config("qwen3_vl_moe", **changes))
    problems, notes = _lint(path, torch_free)
    assert problems == []
    assert not any(OUTSIDE in n for n in notes), notes


@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_qwen_moe_dense_layer_mlp_missing_is_an_error(tmp_path: Path, torch_free: bool) -> None:
    obj = _config("qwen3_vl_moe", mlp_only_layers=[0, 2])
    path = _checkpoint(tmp_path, obj, drop="model.language_model.layers.2.mlp.")
    assert "WC410" in _errors(path, torch_free)


@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_llama4_interleave_step_lints_clean(tmp_path: Path, torch_free: bool) -> None:
    # `interleave_moe_layer_step: 2` (Llama-4 Maverick's): the config class derives moe_layers [1, 3] from it and
    # save_pretrained writes both; lint places the MoE layers by the written list, inside coverage
    obj = _config("llama4_text", interleave_moe_layer_step=2, moe_layers=None)
    assert obj.moe_layers == [1, 3]
    path = _checkpoint(tmp_path, obj)
    problems, notes = _lint(path, torch_free)
    assert problems == []
    assert not any(OUTSIDE in n for n in notes), notes


@pytest.mark.parametrize("torch_free", [False, True], ids=["transformers", "torch-free"])
def test_llama4_interleave_step_without_the_list_is_outside_coverage(tmp_path: Path, torch_free: bool) -> None:
    # a hand-written config.json with the step and no moe_layers: the list exists only once the class has
    # derived it, so lint says so (and builds the exact expectations when transformers is installed)
    obj = _config("llama4_text", interleave_moe_layer_step=2, moe_layers=None)
    path = _checkpoint(tmp_path, obj)
    config = json.loads((path / "config.json").read_text())
    config.pop("moe_layers")
    config["interleave_moe_layer_step"] = 2
    (path / "config.json").write_text(json.dumps(config))
    problems, notes = _lint(path, torch_free)
    assert any(OUTSIDE in n and "moe_layers" in n for n in notes), notes
    if torch_free:
        assert not _errors(path, torch_free=True)
    else:
        assert problems == []
