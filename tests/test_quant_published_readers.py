"""False findings that real published quantization configs raised in config-only lint, each on a bad and a
good fixture: ModelOpt lists read as ModelOpt engines read them (WC302), miles' online NVFP4 quantizes
experts only (WC309), vision-tower and MTP entries that config-only lint cannot enumerate (WC302),
entries naming parameters no quantizer touches (WC302), and a ModelOpt quant_algo with no format model
(WC339). Configs are transformers' own config classes with tiny dimensions (`tools.archgen.tiny`)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import by_code, run


def _lint(tmp_path: Path, model_type: str, quant: dict, **text: object):
    from tools.archgen.tiny import tiny_config
    from weightcheck.patterns import detect_pattern

    cfg = json.loads(tiny_config(model_type, "D").to_json_string())
    cfg["architectures"] = cfg.get("architectures") or detect_pattern({"model_type": model_type}).architectures
    (cfg.get("text_config") or cfg).update(text)
    cfg["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return run(tmp_path)


def _unmatched(result) -> list[str]:
    return [f.details["entry"] for f in by_code(result, "WC302")]


def _nvfp4(ignore: list[str]) -> dict:
    # the shape of nvidia/*-NVFP4 config.json blocks written by ModelOpt (see tests/data/published_quant_configs.json)
    group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    return {"config_groups": {"group_0": {"input_activations": group, "weights": group, "targets": ["Linear"]}},
            "ignore": ignore, "quant_algo": "NVFP4", "producer": {"name": "modelopt", "version": "0.43.0"},
            "quant_method": "modelopt"}  # fmt: skip


def test_modelopt_entries_are_matched_as_modelopt_engines_read_them(tmp_path: Path) -> None:
    good = ["lm_head", "model.layers.0.self_attn*", "model.layers.1.block_sparse_moe.gate"]
    result = _lint(tmp_path, "minimax_m2", _nvfp4([*good, "model.layers.0.block_sparse_moe.gaet"]))
    assert _unmatched(result) == ["model.layers.0.block_sparse_moe.gaet"]


def test_online_nvfp4_does_not_count_as_quantizing_routers_or_embeddings(tmp_path: Path) -> None:
    # radixark/miles quantizer_nvfp4.py packs the experts' fc1/fc2 only: no router/embedding/head hazard
    result = _lint(tmp_path, "qwen3_moe", _nvfp4(["lm_head"]))
    assert not by_code(result, "WC309"), [f.message for f in result.findings]
    # the online INT4 quantizer packs every 2-D weight: the same list still warns there
    int4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}}  # fmt: skip
    (tmp_path / "b").mkdir()
    warned = {f.details["kind"] for f in by_code(_lint(tmp_path / "b", "qwen3_moe", int4), "WC309")}
    assert {"router", "embedding"} <= warned


def test_vision_tower_and_mtp_entries_are_not_reported_in_config_only_mode(tmp_path: Path) -> None:
    entries = ["model.visual.blocks.0.attn.qkv", "model.visual*", "mtp.fc", "mtp.layers.0*"]
    result = _lint(tmp_path, "qwen3_5_moe", _nvfp4([*entries, "model.visul.blocks.0.attn.qkv"]))
    assert _unmatched(result) == ["model.visul.blocks.0.attn.qkv"]
    assert any("were not checked" in n and "model.visual." in n for n in result.notes)
    # compressed-tensors syntax: a regex reaching into the tower is recognised the same way
    ct = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "ignore": ["lm_head", "re:.*visual.*", "re:visual.*"],
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}}}}  # fmt: skip
    (tmp_path / "ct").mkdir()
    assert _unmatched(_lint(tmp_path / "ct", "qwen3_vl", ct)) == ["re:visual.*"]  # anchored: never matches


def test_entries_naming_inert_parameters_are_not_reported(tmp_path: Path) -> None:
    quant = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": [
            "lm_head",
            "model.layers.0.linear_attn.A_log",
            "model.layers.0.linear_attn.dt_bias",
            "model.layers.0.linear_attn.A_lgo",
        ],
    }
    result = _lint(tmp_path, "qwen3_next", quant)
    assert _unmatched(result) == ["model.layers.0.linear_attn.A_lgo"]


def test_modelopt_quant_algo_without_format_model_guesses_no_scheme(tmp_path: Path) -> None:
    from weightcheck.quant.config import parse_quant_spec

    mixed = {**_nvfp4(["lm_head"]), "quant_algo": "MIXED_PRECISION"}
    spec = parse_quant_spec({"quantization_config": mixed})
    assert spec is not None and spec.schemes == [] and spec.unchecked
    [hit] = by_code(_lint(tmp_path, "qwen3_moe", mixed), "WC339")
    assert "WC313" in hit.message  # says which format checks could not run
    plain = parse_quant_spec({"quantization_config": {"quant_method": "modelopt_fp4", "ignore": []}})
    assert plain is not None and plain.schemes and not plain.unchecked  # no quant_algo: the method names it


def test_plain_entry_read_as_prefix_overreaches(tmp_path: Path) -> None:
    fp8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    good = ["lm_head", "model.layers.1.input_layernorm", "model.layers.1.mlp.gate", "model.layers.11.mlp.gate"]
    bad = _lint(tmp_path, "qwen3_next", {**fp8, "modules_to_not_convert": [*good, "model.layers.1"]},
                num_hidden_layers=12, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 3)  # fmt: skip
    [hit] = by_code(bad, "WC305")
    assert hit.details["entry"] == "model.layers.1" and "transformers" in hit.message and "{10..11}" in hit.message
    (tmp_path / "good").mkdir()
    assert not by_code(_lint(tmp_path / "good", "qwen3_next", {**fp8, "modules_to_not_convert": good},
                             num_hidden_layers=12), "WC305")  # fmt: skip
    (tmp_path / "modelopt").mkdir()
    [hit] = by_code(_lint(tmp_path / "modelopt", "minimax_m2", _nvfp4(["lm_head", "model.layers.1"]),
                          num_hidden_layers=12), "WC305")  # fmt: skip
    assert "vLLM ModelOpt" in hit.message  # a substring there
