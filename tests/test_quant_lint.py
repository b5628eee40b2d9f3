"""WC3xx and pattern rules on real llm-compressor checkpoints, each defect planted afterwards."""

from __future__ import annotations

import json

import pytest
from helpers import by_code, codes, run
from quantized import (
    dequantize_module_in_place,
    edit_tensors,
    index_of,
    quant_config,
    quantize_modules_in_place,
    read_tensor,
    set_ignore,
)


@pytest.mark.parametrize(
    ("family", "scheme"),
    [("qwen3_moe", "W4A16"), ("glm4_moe", "W4A16"), ("llama", "W4A16"), ("qwen3_moe", "FP8_BLOCK"),
     ("llama", "FP8_DYNAMIC")],
)  # fmt: skip
def test_llmcompressor_output_lints_clean_except_online_hazards(make_quant, family: str, scheme: str) -> None:
    path = make_quant(family, scheme)
    result = run(path)
    # llm-compressor writes module names only; the one honest warning is that an online INT4 quantizer
    # (parameter names) would pack the embeddings, which the module-style ignore list does not cover.
    unexpected = [f for f in result.findings if not (f.code == "WC309" and f.severity.label == "warning")]
    assert unexpected == [], [f"{f.code}: {f.message}" for f in unexpected]
    assert result.exit_code() == 0
    assert any("pattern" not in n for n in result.notes) or not result.notes


def test_router_packed_is_named_with_consumers(make_quant) -> None:
    path = make_quant("glm4_moe", "W4A16")
    routers = ["model.layers.1.mlp.gate", "model.layers.2.mlp.gate"]
    quantize_modules_in_place(path, routers)
    set_ignore(path, ["lm_head"])  # what an online quantizer's ignore list looked like (slime#1642)
    result = run(path)
    [finding] = by_code(result, "WC308")
    assert "model.layers.{1..2}.mlp.gate" in finding.message
    assert "SGLang drops" in finding.message and "router" in finding.message
    assert result.exit_code() == 1


def test_router_not_ignored_names_consumers(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    set_ignore(path, ["lm_head"])
    findings = [f for f in by_code(run(path), "WC309") if f.details["kind"] == "router"]
    [finding] = findings
    assert "model.layers.{0..1}.mlp.gate" in finding.message
    assert set(finding.details["consumers"]) >= {"vllm", "slime-int4"}
    assert finding.severity.label == "error"


def test_slimes_online_int4_quantizer_is_a_consumer_of_integer_configs_only(make_quant) -> None:
    """slime's and miles' online compressed-tensors quantizer packs INT weights (pack_layer with the first
    group's group_size): for a W4A16 config it is a consumer of the ignore list; for FP8_DYNAMIC it is not
    deployed (their FP8 path reads `quant_method: fp8`), so an unignored router or embedding is judged by the
    engines alone. `consumers = ["slime-int4"]` in the settings still asks for it."""
    w4 = make_quant("qwen3_moe", "W4A16")
    set_ignore(w4, ["lm_head"])
    assert any("slime-int4" in f.details["consumers"] for f in by_code(run(w4), "WC309"))
    fp8 = make_quant("qwen3_moe", "FP8_DYNAMIC")
    set_ignore(fp8, ["lm_head"])
    assert not any("slime-int4" in f.details.get("consumers", ()) for f in run(fp8).findings)
    from weightcheck.checkpoint import load_checkpoint
    from weightcheck.quant.analysis import analyze_checkpoint

    qa = analyze_checkpoint(load_checkpoint(fp8))
    qa.deployed = ["slime-int4"]
    assert "slime-int4" in [c.key for c in qa.consumers]


def test_router_param_style_entry_fixes_online_quantizer_only(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    set_ignore(path, ["lm_head", "re:.*mlp\\.gate\\..*"])  # slime's recommended spelling
    result = run(path)
    [router] = [f for f in by_code(result, "WC309") if f.details["kind"] == "router"]
    assert router.details["consumers"] == ["vllm"]
    [param] = by_code(result, "WC304")
    assert "gate($|" in param.message


def test_recommended_glm_ignore_list_is_clean(make_quant) -> None:
    path = make_quant("glm4_moe", "W4A16")
    set_ignore(path, ["lm_head", "re:.*embed_tokens($|\\..*)", "re:.*mlp\\.gate($|\\..*)"])
    result = run(path)
    assert result.findings == [], [f"{f.code}: {f.message}" for f in result.findings]


def test_overreaching_regex_and_partial_fused_group(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    set_ignore(path, ["lm_head", "re:.*mlp.gate"])
    result = run(path)
    [over] = by_code(result, "WC305")
    assert "model.layers.{0..1}.mlp.gate_proj" in over.message
    fused = by_code(result, "WC311")
    assert fused and all("gate_up_proj" in f.message for f in fused)


def test_a_word_followed_by_dot_star_asks_for_its_extensions(make_quant) -> None:
    """slime's default ignore rules (tools/convert_hf_to_int4_direct.py) spell `re:.*embed.*` and `re:.*norm.*`:
    `embed_tokens` and `input_layernorm` are what they mean, not an overreach. Its `re:.*mlp\\.gate\\.*` (zero or
    more dots after `gate`) does reach every `gate_proj` of a dense model: still WC305."""
    path = make_quant("llama", "W4A16")
    set_ignore(path, ["lm_head", "re:.*embed.*", "re:.*norm.*"])
    assert not by_code(run(path), "WC305")
    set_ignore(path, ["lm_head", "re:.*embed.*", "re:.*mlp\\.gate\\.*"])
    [over] = by_code(run(path), "WC305")
    assert "mlp\\\\.gate" in over.message and "gate_proj" in over.message


def test_ignored_module_stored_quantized(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    set_ignore(path, [*quant_config(path)["ignore"], "model.layers.0.self_attn.o_proj"])
    [finding] = by_code(run(path), "WC306")
    assert "model.layers.0.self_attn.o_proj" in finding.message


def test_targeted_module_stored_unquantized(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    dequantize_module_in_place(path, "model.layers.1.self_attn.o_proj")
    [finding] = by_code(run(path), "WC307")
    assert "model.layers.1.self_attn.o_proj" in finding.message and "SGLang" in finding.message


def test_missing_companion(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    edit_tensors(path, drop={"model.layers.0.mlp.down_proj.weight_scale"})
    [finding] = by_code(run(path), "WC313")
    assert "weight_scale" in finding.message and "model.layers.0.mlp.down_proj" in finding.message


def test_companion_shape_mismatch(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    name = "model.layers.0.mlp.down_proj.weight_scale"
    scale = read_tensor(path, name)
    edit_tensors(path, drop={name}, add={name: scale[:, :1].contiguous()})
    [finding] = by_code(run(path), "WC314")
    assert "groups" in finding.message and "down_proj" in finding.message


def test_block_fp8_scale_grid(make_quant) -> None:
    path = make_quant("qwen3_moe", "FP8_BLOCK")
    name = "model.layers.0.self_attn.q_proj.weight_scale"
    scale = read_tensor(path, name)
    import torch

    edit_tensors(path, drop={name}, add={name: torch.ones(scale.shape[0] + 1, scale.shape[1], dtype=scale.dtype)})
    assert "WC314" in codes(run(path))


def test_experts_with_mixed_schemes(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    dequantize_module_in_place(path, "model.layers.1.mlp.experts.3.down_proj")
    [finding] = by_code(run(path), "WC315")
    assert "layer 1" in finding.message and "experts.3.down_proj" in finding.message


def test_lm_head_quantized(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    quantize_modules_in_place(path, ["lm_head"])
    set_ignore(path, [])
    assert "WC310" in codes(run(path))


def test_packed_name_not_weight(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    name = "model.layers.0.mlp.experts.0.gate_proj.weight_packed"
    t = read_tensor(path, name)
    edit_tensors(path, add={"model.layers.0.mlp.experts.gate_up_proj_packed": t})
    assert "WC317" in codes(run(path))


def test_config_entry_kinds(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    entries = ["lm_head", "re:visual.*", "model.embed_tokens.weight", "re:.*mlp\\.gate(", "LlamaRotaryEmbedding"]
    set_ignore(path, entries)
    result = run(path)
    unmatched = by_code(result, "WC302")
    assert any("re:visual.*" in f.message and "re:.*visual.*" in f.message for f in unmatched)
    assert any("model.embed_tokens.weight" in f.message for f in by_code(result, "WC304"))
    assert by_code(result, "WC303") and by_code(result, "WC318")


def test_invalid_ct_config_rejected_by_package_and_mirror(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["pytorch_dtype"] = "fp4"
    (path / "config.json").write_text(json.dumps(cfg))
    [finding] = by_code(run(path), "WC301")
    assert "pytorch_dtype" in finding.message


def test_shard_name_ignore_on_class_without_packed_mapping(make_quant) -> None:
    qkv = tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    path = make_quant("qwen3", "W4A16", ignore=("lm_head", *qkv))
    result = run(path)
    [finding] = by_code(result, "WC312")
    assert "model.layers.0.self_attn.qkv_proj" in finding.message and "Qwen3ForCausalLM" in finding.message
    assert "WC311" not in codes(result)  # all three shards ignored: no partial group


def test_experts_ignored_by_shard_name_are_not_fused_linears(make_quant) -> None:
    """GLM4-MoE in SGLang (no packed_modules_mapping): dense layer 0's q/k/v ignored by shard name is WC312;
    layer 1's routed experts ignored by shard name are not (SGLang builds them as one FusedMoE, with no
    per-expert `gate_up_proj`; its MoE method probes expert 0's shards)."""
    qkv = tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    experts = r"re:model\.layers\.1\.mlp\.experts\..*"
    path = make_quant("glm4_moe", "W4A16", ignore=("lm_head", "re:.*mlp.gate$", *qkv, experts))
    [finding] = by_code(run(path), "WC312")
    assert "1 fused module(s)" in finding.message and "model.layers.0.self_attn.qkv_proj" in finding.message
    assert "experts" not in finding.message


def test_pattern_expected_unexpected_and_shape(make_quant) -> None:
    import torch

    path = make_quant("qwen3_moe", "W4A16")
    edit_tensors(
        path,
        drop={"model.layers.1.mlp.gate.weight", "model.norm.weight"},
        add={"model.layers.0.mlp.gate_up_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
             "model.norm.weight": torch.ones(255, dtype=torch.bfloat16)},
    )  # fmt: skip
    result = run(path)
    assert any("model.layers.1.mlp.gate.weight" in f.message for f in by_code(result, "WC410"))
    assert any("gate_up_proj" in f.message for f in by_code(result, "WC411"))
    assert any("[255]" in f.message and "[256]" in f.message for f in by_code(result, "WC501"))


def test_unknown_family_falls_back_and_says_so(make_quant) -> None:
    path = make_quant("llama", "W4A16")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "my_new_arch", ["MyNewArchForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    result = run(path)
    assert any("no architecture pattern" in n for n in result.notes)
    assert not by_code(result, "WC410")
    assert index_of(path)  # still a real checkpoint; pattern-free rules ran
    assert result.checked["layers"] == 2
