"""Each consumer's matcher against the consumer itself (where installable) and its documented behaviour."""

from __future__ import annotations

import itertools

import pytest

from weightcheck.quant.matchers import (
    ct_match,
    fused_groups,
    miles_nvfp4_match,
    overreach,
    sglang_ct_match,
    sglang_ct_substring_match,
    sglang_fp8_match,
    sglang_modelopt_match,
    slime_int4_match,
    transformers_match,
    vllm_awq_match,
    vllm_bnb_match,
)

NAMES = [
    "model.layers.3.mlp.gate",
    "model.layers.3.mlp.gate_proj",
    "model.layers.3.mlp.gate_up_proj",
    "model.layers.3.mlp.shared_expert_gate",
    "model.layers.12.mlp.down_proj",
    "model.layers.1.self_attn.q_proj",
    "model.layers.10.self_attn.q_proj",
    "model.layers.0.mlp.experts.0.gate_proj",
    "model.visual.blocks.0.attn.qkv",
    "model.embed_tokens",
    "lm_head",
]
ENTRIES = [
    "model.layers.3.mlp.gate",
    "mlp.gate",
    "re:.*mlp\\.gate$",
    "re:.*mlp\\.gate\\..*",
    "re:.*mlp\\.gate\\.*",
    "re:.*mlp.gate",
    "re:model.layers.1.*",
    "re:^model\\.layers\\.1\\..*",
    "model.layers.1",
    "re:visual.*",
    "re:.*visual.*",
    "model.embed_tokens.weight",
    "lm_head",
    "gate",
    "re:.*mlp\\.gate($|\\..*)",
    "model.layers.0.mlp.experts.0",
]
CASES = list(itertools.product(NAMES, ENTRIES))


def test_ct_matcher_agrees_with_compressed_tensors() -> None:
    match = pytest.importorskip("compressed_tensors.utils.match")
    for name, entry in CASES:
        assert ct_match(name, entry) == match.match_name(name, entry), (name, entry)


def test_transformers_matcher_agrees_with_transformers() -> None:
    utils = pytest.importorskip("transformers.quantizers.quantizers_utils")
    for name, entry in CASES:
        # should_convert_module returns False for skipped modules
        expected = not utils.should_convert_module(name, [entry])
        assert transformers_match(name, entry) == expected, (name, entry)


# The worked table (one row per ignore entry, checked against each consumer's source).
# Columns: CT/vLLM, SGLang 0.5.23, SGLang substring era, slime online INT4
# (on the parameter `<module>.weight`), transformers. Rows list what each reader matches among
# router = model.layers.3.mlp.gate, gate_proj = model.layers.3.mlp.gate_proj, l12 = model.layers.12.mlp.down_proj.
WORKED = {
    "model.layers.3.mlp.gate": ({"router"}, {"router"}, {"router", "gate_proj"}, {"router", "gate_proj"},
                                {"router", "gate_proj"}),
    "mlp.gate": (set(), {"router"}, {"router", "gate_proj"}, set(), {"router"}),
    "re:.*mlp\\.gate$": ({"router"}, {"router"}, {"router"}, set(), set()),
    "re:.*mlp\\.gate\\..*": (set(), set(), set(), {"router"}, set()),
    "re:.*mlp\\.gate\\.*": ({"router", "gate_proj"}, {"router", "gate_proj"}, {"router", "gate_proj"},
                            {"router", "gate_proj"}, set()),
    "model.embed_tokens.weight": (set(), set(), set(), set(), set()),
    "re:model.layers.1.*": ({"l12"}, {"l12"}, {"l12"}, {"l12"}, set()),
    "model.layers.1": (set(), set(), {"l12"}, {"l12"}, {"l12"}),
}  # fmt: skip
SUBJECTS = {
    "router": "model.layers.3.mlp.gate",
    "gate_proj": "model.layers.3.mlp.gate_proj",
    "l12": "model.layers.12.mlp.down_proj",
}


@pytest.mark.parametrize("entry", sorted(WORKED))
def test_worked_table_from_matching_notes(entry: str) -> None:
    readers = [
        lambda n, e: ct_match(n, e),
        sglang_ct_match,
        sglang_ct_substring_match,
        lambda n, e: slime_int4_match(n + ".weight", e),
        transformers_match,
    ]
    for reader, expected in zip(readers, WORKED[entry], strict=True):
        got = {k for k, n in SUBJECTS.items() if reader(n, entry)}
        assert got == expected, (entry, reader, got, expected)


def test_sglang_ct_never_matches_a_prefix() -> None:
    # sgl-project/sglang#32736: a parent entry must not swallow its quantized children.
    assert not sglang_ct_match("model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0")
    assert sglang_ct_substring_match("model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0")
    assert sglang_ct_match("model.layers.0.self_attn.o_proj", "o_proj")


def test_sglang_fp8_dotted_boundaries() -> None:
    assert sglang_fp8_match("model.layers.3.mlp.gate", "mlp.gate")
    assert not sglang_fp8_match("model.layers.3.mlp.gate_up_proj", "mlp.gate")  # Qwen3.6-FP8 comment
    assert sglang_fp8_match("model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0")
    assert sglang_fp8_match("model.layers.1.self_attn.q_proj", "layers.1")  # model. variants
    assert not sglang_fp8_match("model.layers.12.self_attn.q_proj", "model.layers.1")


def test_online_quantizers() -> None:
    assert slime_int4_match("model.layers.12.mlp.gate.weight", "model.layers.1")  # bare prefix
    assert not miles_nvfp4_match("model.layers.12.mlp.gate.weight", "model.layers.1")  # dot boundary
    assert miles_nvfp4_match("model.layers.1.mlp.gate.weight", "model.layers.1")
    assert slime_int4_match("model.layers.3.mlp.gate.weight", "re:.*mlp\\.gate($|\\..*)")


def test_other_vllm_methods() -> None:
    assert vllm_awq_match("model.layers.0.mlp.gate", "mlp")  # SGLang's own AWQ test case
    assert vllm_bnb_match("model.layers.0.mlp.gate", "gate")
    assert not vllm_bnb_match("model.layers.0.mlp.gate_proj", "gate")
    assert sglang_modelopt_match("model.layers.0.mlp.gate", "*mlp.gate")
    assert sglang_modelopt_match("model.layers.0.mlp.gate", "gate")


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("model.layers.1.*", "model.layers.12.mlp", True),
        ("model.layers.1.*", "model.layers.1.mlp", False),
        (".*mlp.gate", "model.layers.0.mlp.gate_proj", True),
        (".*mlp.gate", "model.layers.0.mlp.gate", False),
        (".*mlp\\.gate$", "model.layers.0.mlp.gate", False),
        (".*mlp\\.gate\\.*", "model.layers.0.mlp.gate_up_proj", True),
        ("^model\\.layers\\.1\\..*", "model.layers.1.mlp", False),
        (".*self_attn.*", "model.layers.1.self_attn.q_proj", False),
    ],
)
def test_overreach(pattern: str, name: str, expected: bool) -> None:
    assert overreach(pattern, name) is expected


def test_fused_groups() -> None:
    mods = [f"m.layers.0.self_attn.{x}_proj" for x in "qkvo"] + ["m.layers.0.mlp.gate_proj", "m.layers.0.mlp.up_proj"]
    groups = fused_groups(mods)
    assert groups["m.layers.0.self_attn.qkv_proj"] == [f"m.layers.0.self_attn.{x}_proj" for x in "qkv"]
    assert groups["m.layers.0.mlp.gate_up_proj"] == ["m.layers.0.mlp.gate_proj", "m.layers.0.mlp.up_proj"]
