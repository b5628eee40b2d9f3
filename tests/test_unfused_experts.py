"""Stacked experts saved one module each (WC410/WC411).

Qwen3-VL-MoE ships its experts stacked (`mlp.experts.gate_up_proj`, one leading dim per expert) and
transformers 5 builds them so, which is what the generated pattern records. llm-compressor unfuses them to
quantize each expert's Linears and saves `mlp.experts.<e>.gate_proj / up_proj / down_proj` (vLLM's Qwen3-VL-MoE
loader reads that layout too). A clean FP8 checkpoint written that way was "8 experts weight(s) required ...
missing" (WC410, exit 1) plus WC411 for every per-expert tensor. The fixture is transformers' own tiny model
quantized by llm-compressor's `oneshot`, saved compressed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from factories import llmcompressor_fp8_dynamic
from helpers import by_code, rewrite_shard, run

from weightcheck.findings import Severity

pytest.importorskip("llmcompressor")


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ignore = ["lm_head", "re:.*mlp.gate$", "re:.*visual.*"]  # as llm-compressor's Qwen3-VL-MoE example
    return llmcompressor_fp8_dynamic("qwen3_vl_moe", tmp_path_factory.mktemp("qwen3_vl_moe"), ignore)


def test_the_writer_saved_the_experts_one_module_each(unfused: Path) -> None:
    names = json.loads((unfused / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.language_model.layers.0.mlp.experts.1.down_proj.weight" in names
    assert not any(n.endswith("mlp.experts.gate_up_proj") for n in names)


def test_a_clean_unfused_checkpoint_is_clean(unfused: Path) -> None:
    result = run(unfused)
    assert not by_code(result, "WC410") and not by_code(result, "WC411"), [f.message for f in result.findings]
    assert result.exit_code() == 0


def test_one_expert_lost_is_named_per_expert(unfused: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(unfused, tmp_path / "ckpt"))
    lost = "model.language_model.layers.2.mlp.experts.1.down_proj"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    dropped = {n for n in index["weight_map"] if n.startswith(lost + ".")}
    for shard in {index["weight_map"][n] for n in dropped}:
        rewrite_shard(folder / shard, drop=dropped)
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if n not in dropped}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (missing,) = by_code(run(folder), "WC410")
    assert missing.severity is Severity.ERROR and missing.details["missing"] == [f"{lost}.weight"]
