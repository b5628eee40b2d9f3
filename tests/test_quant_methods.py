"""Quantization methods as transformers and SGLang accept them: never an error for a loadable method,
a WC339 warning naming the checks that could not run otherwise; FP8 `fmt` spellings; tied lm_head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import by_code, run

from weightcheck.quant.config import FP8_FMTS, TRANSFORMERS_METHODS, parse_quant_spec


def _write(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _qwen3(**extra) -> dict:
    from transformers import Qwen3Config

    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, vocab_size=128, num_hidden_layers=2, **extra)  # fmt: skip
    return cfg.to_dict()


def test_transformers_method_list_matches_installed_registry() -> None:
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    installed = {k.removesuffix("_4bit").removesuffix("_8bit") for k in AUTO_QUANTIZATION_CONFIG_MAPPING}
    assert installed == set(TRANSFORMERS_METHODS)


def test_mxfp4_as_transformers_writes_it_is_accepted(tmp_path: Path) -> None:
    from transformers import Mxfp4Config

    qc = Mxfp4Config(modules_to_not_convert=["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                             "model.embed_tokens", "lm_head"]).to_dict()  # fmt: skip
    qc = json.loads(json.dumps(qc))  # as it lands in config.json (the method is a str enum)
    spec = parse_quant_spec({"quantization_config": qc})
    assert spec is not None and spec.method == "mxfp4" and not spec.problems and not spec.unchecked
    assert spec.ignore_field == "modules_to_not_convert" and spec.bits() == 4
    result = run(_write(tmp_path, _qwen3(quantization_config=qc)))
    assert not by_code(result, "WC301") and not by_code(result, "WC339")


@pytest.mark.parametrize("fmt", sorted(FP8_FMTS))
def test_fp8_fmt_spellings_are_not_errors(tmp_path: Path, fmt: str) -> None:
    from transformers import FineGrainedFP8Config

    qc = json.loads(json.dumps(FineGrainedFP8Config(modules_to_not_convert=["lm_head"]).to_dict())) | {"fmt": fmt}
    result = run(_write(tmp_path, _qwen3(quantization_config=qc)))
    assert not by_code(result, "WC301") and not by_code(result, "WC339"), [f.message for f in result.findings]


def test_fp8_odd_fmt_is_a_warning_and_bad_scale_fmt_an_error(tmp_path: Path) -> None:
    from transformers import FineGrainedFP8Config

    qc = json.loads(json.dumps(FineGrainedFP8Config().to_dict())) | {"fmt": "e3m4", "scale_fmt": "fp16"}
    result = run(_write(tmp_path, _qwen3(quantization_config=qc)))
    [warn] = by_code(result, "WC339")
    assert "e3m4" in warn.message and warn.severity.name == "WARNING"
    [err] = by_code(result, "WC301")
    assert "scale_fmt" in err.message
    with pytest.raises(ValueError, match="scale_fmt"):  # transformers rejects it too
        FineGrainedFP8Config(scale_fmt="fp16")


def test_unknown_method_is_a_warning_naming_skipped_checks(tmp_path: Path) -> None:
    result = run(_write(tmp_path, _qwen3(quantization_config={"quant_method": "my_int3", "ignore": ["lm_head"]})))
    assert not by_code(result, "WC301")
    [warn] = by_code(result, "WC339")
    assert "my_int3" in warn.message and "WC313" in warn.message
    assert result.exit_code() == 0


def test_known_unmodelled_method_says_who_loads_it(tmp_path: Path) -> None:
    result = run(_write(tmp_path, _qwen3(quantization_config={"quant_method": "hqq"})))
    [warn] = by_code(result, "WC339")
    assert "transformers" in warn.message and not by_code(result, "WC301")


@pytest.mark.parametrize(("method", "field"), [("modelopt_fp4", "exclude_modules"),
                                              ("awq_marlin", "modules_to_not_convert"),
                                              ("nvfp4", "modules_to_not_convert")])  # fmt: skip
def test_sglang_and_transformers_spellings_are_modelled(method: str, field: str) -> None:
    spec = parse_quant_spec({"quantization_config": {"quant_method": method, field: ["lm_head"]}})
    assert spec is not None and not spec.problems and not spec.unchecked and spec.ignore == ["lm_head"]


def test_tied_head_default_lm_head_entry_is_not_a_finding(tmp_path: Path) -> None:
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group",
                                                                             "group_size": 32}}}}  # fmt: skip
    tied = run(_write(tmp_path, _qwen3(tie_word_embeddings=True, quantization_config=qc)))
    assert not by_code(tied, "WC302"), [f.message for f in tied.findings]
    # bad: on the tied model an entry that names nothing real is still reported
    qc["ignore"] = ["lm_head", "re:visual.*"]
    tied = run(_write(tmp_path, _qwen3(tie_word_embeddings=True, quantization_config=qc)))
    assert [f.location.tensor for f in by_code(tied, "WC302")] == ["re:visual.*"]


def test_config_only_without_pattern_is_an_info_finding(tmp_path: Path) -> None:
    cfg = _qwen3(quantization_config={"quant_method": "fp8", "modules_to_not_convert": ["lm_head"]})
    cfg["model_type"], cfg["architectures"] = "unheard_of_moe", ["UnheardOfMoeForCausalLM"]
    result = run(_write(tmp_path, cfg))
    [info] = by_code(result, "WC429")
    assert info.severity.name == "INFO" and "could not be matched" in info.message
    good = run(_write(tmp_path, _qwen3(quantization_config={"quant_method": "fp8"})))
    assert not by_code(good, "WC429")
