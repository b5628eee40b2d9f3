"""weightcheck's SGLang matchers against SGLang's own functions (optional group: needs a real sglang)."""

from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.sglang

NAMES = [
    "model.layers.3.mlp.gate",
    "model.layers.3.mlp.gate_proj",
    "model.layers.3.mlp.shared_expert_gate",
    "model.layers.12.mlp.down_proj",
    "model.layers.1.self_attn.q_proj",
    "model.layers.0.mlp.experts.0.gate_proj",
    "model.layers.0.mlp.experts",
    "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa",
    "model.visual.blocks.0.attn.qkv",
    "language_model.model.layers.0.self_attn.o_proj",
    "model.embed_tokens",
    "lm_head",
]
ENTRIES = [
    "model.layers.3.mlp.gate", "mlp.gate", "re:.*mlp\\.gate$", "re:.*mlp\\.gate\\..*", "re:.*mlp.gate",
    "re:model.layers.1.*", "model.layers.1", "layers.1", "re:visual.*", "lm_head", "gate", "o_proj",
    "model.layers.0.mlp.experts.0", "model.layers.0.mlp.experts", "*mlp.gate", "mtp*", "q_a_proj",
    "model.layers.0.self_attn.kv_a_proj_with_mqa", "*visual*", "model.layers.3.mlp.GATE",
]  # fmt: skip
CASES = list(itertools.product(NAMES, ENTRIES))


def test_sglang_ct_matchers_agree_with_sglang() -> None:
    utils = pytest.importorskip("sglang.srt.layers.quantization.compressed_tensors.utils")
    from weightcheck.quant.matchers import sglang_ct_match, sglang_ct_substring_match

    for name, entry in CASES:
        assert sglang_ct_match(name, entry) == utils.check_equal_or_regex_match(name, [entry]), (name, entry)
        # The substring era (#14572 → #32736) is the same helper with check_contains=True.
        era = utils._is_equal_or_regex_match(name, entry, check_contains=True)
        assert sglang_ct_substring_match(name, entry) == bool(era), (name, entry)


def test_sglang_fp8_matcher_agrees_with_sglang() -> None:
    quant_utils = pytest.importorskip("sglang.srt.layers.quantization.utils")
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    from weightcheck.quant.matchers import sglang_fp8_match

    for name, entry in CASES:
        if entry.startswith("re:"):
            continue  # the FP8 path has no regex syntax
        config = Fp8Config.from_config(
            {"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": [entry]}
        )
        expected = quant_utils.is_layer_skipped(name, config.ignored_layers)
        assert sglang_fp8_match(name, entry) == expected, (name, entry)


def test_sglang_modelopt_matcher_agrees_with_sglang() -> None:
    modelopt = pytest.importorskip("sglang.srt.layers.quantization.modelopt_quant")
    from weightcheck.quant.matchers import sglang_modelopt_match

    for name, entry in CASES:
        config = modelopt.ModelOptFp8Config(is_checkpoint_fp8_serialized=True, exclude_modules=[entry])
        assert sglang_modelopt_match(name, entry) == config.is_layer_excluded(name), (name, entry)
