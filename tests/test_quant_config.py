"""Quantization config parsing, and the built-in validator mirror against compressed-tensors' own models."""

from __future__ import annotations

import copy

import pytest

from weightcheck.quant.config import parse_quant_spec, validate_ct, validate_ct_mirror, validate_with_compressed_tensors

W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "format": "pack-quantized",
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128},
        }
    },
}


def variant(path: list[str], value) -> dict:
    cfg = copy.deepcopy(W4A16)
    node = cfg
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return cfg


W = ["config_groups", "group_0", "weights"]
TABLE = {
    "valid-w4a16": W4A16,
    "valid-preset": {"quant_method": "compressed-tensors", "config_groups": {"W4A16": ["Linear"]}},
    "valid-fp8-block": variant(W, {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}),
    "valid-channel": variant(W, {"num_bits": 8, "type": "int", "strategy": "channel"}),
    "unknown-weights-key": variant([*W, "pytorch_dtype"], "fp4"),
    "unknown-scheme-key": variant(["config_groups", "group_0", "bogus"], 1),
    "group-without-size": variant([*W, "group_size"], KeyError),
    "size-with-channel": variant([*W, "strategy"], "channel"),
    "block-without-structure": variant(W, {"num_bits": 8, "type": "float", "strategy": "block"}),
    "bad-strategy": variant([*W, "strategy"], "row"),
    "bad-type": variant([*W, "type"], "fixed"),
    "bad-group-format": variant(["config_groups", "group_0", "format"], "mixed-precision"),
    "unknown-preset": {"quant_method": "compressed-tensors", "config_groups": {"W3A99": ["Linear"]}},
    "no-groups": {"quant_method": "compressed-tensors", "ignore": []},
    "static-token": variant(W, {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": False}),
    "actorder-on-channel": variant(W, {"num_bits": 4, "strategy": "channel", "actorder": "group"}),
}
VALID = {k for k in TABLE if k.startswith("valid")}


@pytest.mark.parametrize("case", sorted(TABLE))
def test_mirror_agrees_with_compressed_tensors(case: str) -> None:
    mirror = validate_ct_mirror(TABLE[case])
    assert (mirror == []) == (case in VALID), mirror
    real = validate_with_compressed_tensors(TABLE[case])
    if real is None:
        pytest.skip("compressed-tensors not installed")
    assert (real == []) == (case in VALID), real


def test_parse_ct_spec() -> None:
    spec = parse_quant_spec({"quantization_config": W4A16})
    assert spec.method == "compressed-tensors" and spec.ignore == ["lm_head"]
    [scheme] = spec.schemes
    assert (scheme.num_bits, scheme.group_size, scheme.strategy, scheme.format) == (4, 128, "group", "pack-quantized")


def test_parse_vlm_nested_and_hf_fp8_and_modelopt() -> None:
    spec = parse_quant_spec({"text_config": {"quantization_config": W4A16}})
    assert spec.source.endswith("text_config.quantization_config")
    fp8 = parse_quant_spec(
        {
            "quantization_config": {
                "quant_method": "fp8",
                "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"],
            }
        }
    )
    assert fp8.weight_block_size == [128, 128] and fp8.ignore_field == "modules_to_not_convert"
    assert parse_quant_spec(
        {"quantization_config": {"quant_method": "fp8", "ignored_layers": ["a"], "modules_to_not_convert": ["b"]}}
    ).ignore == ["a"]
    mo = parse_quant_spec({}, {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}})
    assert mo.method == "modelopt" and mo.ignore == ["lm_head"] and mo.bits() == 4
    bad = parse_quant_spec({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}})
    assert bad.problems


def test_names_the_mirror_does_not_know_are_left_to_the_package() -> None:
    """A strategy/format the mirror does not know may come from a newer compressed-tensors: the installed
    package decides; a problem the mirror understands stays the mirror's (no import needed)."""
    unknown = {"config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "future"}}}}
    real = validate_with_compressed_tensors(unknown)
    assert real is not None  # compressed-tensors is installed in the test environment
    assert validate_ct(unknown) == real and real != validate_ct_mirror(unknown)
    known = {"config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group"}}}}
    assert validate_ct(known) == validate_ct_mirror(known) != []
