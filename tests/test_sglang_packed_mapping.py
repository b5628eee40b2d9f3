"""WC312 reads SGLang's packed_modules_mapping per fused name.

SGLang 0.5.23's Qwen2_5_VLForConditionalGeneration declares `packed_modules_mapping = {"gate_up_proj":
["gate_proj", "up_proj"]}` (the installed-SGLang record, patterns/generated/sglang/), not `qkv_proj`; the
hand-written pattern's engine flag said "no mapping" for the whole class. So llm-compressor's Qwen2.5-VL
checkpoint, whose saved ignore list names the vision tower's MLPs shard by shard, was a WC312 error (exit 1)
although SGLang expands `gate_up_proj` into those shards and leaves it unquantized. A q/k/v ignored by shard
name is still WC312: SGLang builds `qkv_proj` quantized. The fixture is transformers' own tiny Qwen2.5-VL
quantized by llm-compressor's `oneshot` (compressed-tensors writes the ignore list as module names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import llmcompressor_fp8_dynamic
from helpers import by_code, run

pytest.importorskip("llmcompressor")

LAYER0 = "model.layers.0"  # the names as the released checkpoints spell them (transformers saves them so)


@pytest.fixture(scope="module")
def qwen2_5_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # llm-compressor's Qwen2.5-VL example ignores the vision tower; layer 0's attention and MLP are left
    # unquantized too, by their shards' names, as a per-layer recipe does.
    ignore = ["lm_head", "re:.*visual.*", r"re:.*layers\.0\.self_attn\.(q|k|v)_proj$",
              r"re:.*layers\.0\.mlp\.(gate|up)_proj$"]  # fmt: skip
    return llmcompressor_fp8_dynamic("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"), ignore)


def test_the_saved_list_names_the_shards(qwen2_5_vl: Path) -> None:
    ignore = json.loads((qwen2_5_vl / "config.json").read_text())["quantization_config"]["ignore"]
    assert f"{LAYER0}.mlp.gate_proj" in ignore and f"{LAYER0}.self_attn.q_proj" in ignore
    assert any(e.startswith("visual.") and e.endswith("mlp.up_proj") for e in ignore)
    assert not any(e.endswith(("gate_up_proj", "qkv_proj")) for e in ignore)


def test_only_the_fused_name_sglang_does_not_map_is_wc312(qwen2_5_vl: Path) -> None:
    (finding,) = by_code(run(qwen2_5_vl), "WC312")
    assert "1 fused module(s)" in finding.message and f"{LAYER0}.self_attn.qkv_proj" in finding.message
    assert "gate_up_proj" not in finding.message.split(": ", 1)[1]
    assert "packed_modules_mapping lists only gate_up_proj" in finding.message
