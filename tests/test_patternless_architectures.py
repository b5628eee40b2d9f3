"""Architectures no pattern describes: what the class itself writes is never an error, a planted defect still is.

A sweep of transformers 5.17's causal-LM model types without a pattern (tiny models written by
`save_pretrained`) found clean checkpoints linted with exit 1: the head stored under the class's own name
(WC407), the first or last layers built differently (WC402), a repeated segment below the root (WC405) and a
config count that is not one stack's (WC401). Without a pattern these are warnings that say why; the same rule
on the same checkpoint with a defect planted where no class puts one is still an error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from factories import edit_tensors
from helpers import by_code, run

from weightcheck.findings import Severity

pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def saved(model_type: str, root: Path) -> Path:
    """The tiny model of `model_type` (tools/archgen/tiny.py), written by `save_pretrained`."""
    from tools.archgen.tiny import build

    build(model_type, "A").save_pretrained(root, max_shard_size="200KB")
    return root


def saved_config(model_type: str, root: Path, **config: Any) -> Path:
    """A model of `model_type` with these config values (the tiny builder cannot shrink GPT-2-style configs),
    written by `save_pretrained`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config)).save_pretrained(root)
    return root


def severities(path: Path, code: str) -> list[Severity]:
    return [f.severity for f in by_code(run(path), code)]


def problems(path: Path) -> list[str]:
    return [f"{f.code} {f.message[:160]}" for f in run(path).findings if f.severity >= Severity.ERROR]


@pytest.mark.parametrize(
    ("model_type", "head"),
    [
        ("bert", "cls.predictions.decoder.weight"),
        ("roberta", "lm_head.decoder.weight"),
        ("rwkv", "head.weight"),
        ("biogpt", "output_projection.weight"),
        ("gpt_neox_japanese", "embed_out.weight"),
        ("deepseek_v4", "head.weight"),
        ("rembert", "cls.predictions.decoder.weight"),  # variant B: its own width (output_embedding_size)
    ],
)
def test_an_untied_head_under_the_class_own_name_is_stored(tmp_path: Path, model_type: str, head: str) -> None:
    from tools.archgen.tiny import build

    path = tmp_path / "ckpt"
    build(model_type, "B" if model_type == "rembert" else "A").save_pretrained(path, max_shard_size="200KB")
    assert severities(path, "WC407") == []
    assert problems(path) == []

    def drop(tensors: dict[str, Any]) -> None:
        del tensors[head]

    edit_tensors(path, drop)  # the head lost: tie_word_embeddings is false and nothing holds the head
    assert severities(path, "WC407") == [Severity.ERROR]


def test_layers_at_the_edge_built_differently_are_a_warning_an_interior_hole_an_error(tmp_path: Path) -> None:
    path = saved("modernbert-decoder", tmp_path / "ckpt")  # layer 0 has no attention norm (nn.Identity)
    found = by_code(run(path), "WC402")
    assert [f.severity for f in found] == [Severity.WARNING] and "model class" in found[0].message
    assert problems(path) == []

    def drop(tensors: dict[str, Any]) -> None:
        del tensors["model.layers.2.mlp.Wo.weight"]

    edit_tensors(path, drop)
    assert Severity.ERROR in severities(path, "WC402")


def test_a_segment_repeated_below_the_root_is_a_warning_at_the_root_an_error(tmp_path: Path) -> None:
    path = saved("cpmant", tmp_path / "ckpt")  # CPM-Ant's own `ffn.ffn`
    assert severities(path, "WC405") == [Severity.WARNING]
    assert problems(path) == []

    def double(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n.startswith("cpmant.")]:
            tensors["cpmant." + name] = tensors.pop(name)

    edit_tensors(path, double)  # a writer that prefixed the names again
    assert Severity.ERROR in severities(path, "WC405")


def test_a_layer_count_over_two_equal_stacks_is_a_warning_one_truncated_stack_an_error(tmp_path: Path) -> None:
    path = saved("hrm_text", tmp_path / "hrm")  # num_hidden_layers counts HRM's unrolled cycles
    found = by_code(run(path), "WC401")
    assert [f.severity for f in found] == [Severity.WARNING] and "L_module" in found[0].message
    assert problems(path) == []

    single = saved("rwkv", tmp_path / "rwkv")

    def truncate(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n.startswith("rwkv.blocks.3.")]:
            del tensors[name]

    edit_tensors(single, truncate)  # the last stage never gathered
    assert severities(single, "WC401") == [Severity.ERROR]


@pytest.mark.parametrize(
    ("model_type", "config", "block"),
    [
        ("gpt2", {"n_embd": 64, "n_layer": 4, "n_head": 4, "n_positions": 64}, "transformer.h.3."),
        ("mpt", {"d_model": 64, "n_layers": 4, "n_heads": 4, "max_seq_len": 64}, "transformer.blocks.3."),
    ],
)
def test_a_layer_count_under_another_name_is_read(tmp_path: Path, model_type: str, config: dict, block: str) -> None:
    """GPT-2's `n_layer` and MPT's `n_layers`: no "lacks num_hidden_layers" warning, and the count is used."""
    path = saved_config(model_type, tmp_path / "ckpt", vocab_size=160, **config)
    assert severities(path, "WC107") == []
    assert problems(path) == []

    def truncate(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n.startswith(block)]:
            del tensors[name]

    edit_tensors(path, truncate)
    assert severities(path, "WC401") == [Severity.ERROR]


def test_a_second_layer_count_that_the_stored_layers_match_makes_a_missing_tail_a_warning(tmp_path: Path) -> None:
    """LongCat-Flash: `num_layers` physical layers of two sublayers each; transformers writes `num_hidden_layers`
    as twice that. Layers stored 0..num_layers-1: a warning naming the key; one of them gone: an error."""
    small = {"vocab_size": 160, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    moe = {"n_routed_experts": 4, "moe_topk": 2, "expert_ffn_hidden_size": 32, "ffn_hidden_size": 96}
    mla = {"kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}
    path = saved_config("longcat_flash", tmp_path / "ckpt", num_layers=2, **small, **moe, **mla)
    found = by_code(run(path), "WC401")
    assert [f.severity for f in found] == [Severity.WARNING] and "num_layers (2)" in found[0].message

    def truncate(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n.startswith("model.layers.1.")]:
            del tensors[name]

    edit_tensors(path, truncate)
    assert severities(path, "WC401") == [Severity.ERROR]


def test_a_linear_named_like_an_embedding_quantized_under_linear_targets_is_a_linear(tmp_path: Path) -> None:
    """llm-compressor's FP8 of ELECTRA quantizes `electra.embeddings_project` (an nn.Linear) under
    `targets: ["Linear"]`: not a quantized embedding. The same module under a target that any module matches, or
    a real embedding table stored quantized, is still WC308."""
    import json

    import torch
    from factories import llmcompressor_fp8_dynamic

    path = llmcompressor_fp8_dynamic("electra", tmp_path, ["lm_head"])
    from safetensors import safe_open

    stored = set()
    for shard in path.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as fh:
            stored.update(fh.keys())
    assert "electra.embeddings_project.weight_scale" in stored  # llm-compressor quantized the Linear
    assert not any("embeddings_project" in f.message for f in by_code(run(path), "WC308"))

    config = json.loads((path / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        group["targets"] = ["re:.*"]
    (path / "config.json").write_text(json.dumps(config))
    assert any("embeddings_project" in f.message for f in by_code(run(path), "WC308"))

    for group in config["quantization_config"]["config_groups"].values():
        group["targets"] = ["Linear"]
    (path / "config.json").write_text(json.dumps(config))

    def quantize_table(tensors: dict[str, Any]) -> None:
        tensors["electra.embeddings.word_embeddings.weight_scale"] = torch.ones(1)

    edit_tensors(path, quantize_table)
    found = by_code(run(path), "WC308")
    assert any("word_embeddings" in f.message for f in found) and found[0].severity is Severity.ERROR
