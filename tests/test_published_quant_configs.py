"""Real published quantization configs of architectures outside the hand-written families, each on the
config of its architecture (transformers' own config class, tiny dimensions): config-only lint finds no
error, and catches a missing router entry, a partially ignored fused group and an over-reaching layer regex.

The configs and their sources are in tests/data/published_quant_configs.json (`source` of each entry).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import by_code, run

from weightcheck.findings import Severity

DATA = json.loads((Path(__file__).parent / "data" / "published_quant_configs.json").read_text())
OLD_FAMILIES = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "glm4_moe", "deepseek_v3", "mixtral", "qwen2_5_vl"}


def _config(model_type: str, quant: dict) -> dict:
    from weightcheck.arch.tiny import tiny_config

    cfg = json.loads(tiny_config(model_type, "D").to_json_string())
    cfg["architectures"] = [cfg.get("architectures") or []][0] or _arch(model_type)
    cfg["quantization_config"] = quant
    return cfg


def _arch(model_type: str) -> list[str]:
    from weightcheck.patterns import detect_pattern

    return detect_pattern({"model_type": model_type}).architectures


def _lint(tmp_path: Path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return run(tmp_path)


def test_at_least_fifteen_sources_outside_the_old_families() -> None:
    assert len(DATA) >= 15
    assert all(e["source"] and e["model_type"] not in OLD_FAMILIES for e in DATA)


@pytest.mark.parametrize("entry", DATA, ids=[f"{e['model_type']}-{i}" for i, e in enumerate(DATA)])
def test_published_config_lints_config_only_without_error(tmp_path: Path, entry: dict) -> None:
    result = _lint(tmp_path, _config(entry["model_type"], entry["quantization_config"]))
    errors = [f"{f.code} {f.message}" for f in result.findings if f.severity >= Severity.ERROR]
    assert errors == [], entry["source"]
    assert not by_code(result, "WC429"), "the architecture has a pattern: ignore entries were checked"


def _ct(entry_model_type: str) -> dict:
    return next(e for e in DATA if e["model_type"] == entry_model_type
                and e["quantization_config"]["quant_method"] == "compressed-tensors")  # fmt: skip


@pytest.mark.parametrize("model_type", ["gpt_oss", "deepseek_v2", "qwen3_next", "qwen3_vl_moe", "llama4_text"])
def test_missing_router_entry_is_caught(tmp_path: Path, model_type: str) -> None:
    entry = _ct(model_type)
    quant = dict(entry["quantization_config"])
    quant["ignore"] = [e for e in quant["ignore"] if "gate" not in e and "router" not in e]
    result = _lint(tmp_path, _config(model_type, quant))
    routers = [f for f in by_code(result, "WC309") if f.details["kind"] == "router"]
    assert routers and routers[0].details["modules"], [f.message for f in result.findings]


@pytest.mark.parametrize("model_type", ["gpt_oss", "deepseek_v2", "qwen3_next", "mistral3", "gemma3"])
def test_partially_ignored_fused_group_is_caught(tmp_path: Path, model_type: str) -> None:
    from weightcheck.patterns import detect_pattern

    pattern = detect_pattern({"model_type": model_type})
    q = next(s.name for s in pattern.layer if s.name.endswith(("q_proj", "gate_proj")) and "*" not in s.name)
    module = f"{pattern.layer_prefix}.0.{q}"
    entry = _ct(model_type)
    quant = {**entry["quantization_config"], "ignore": [*entry["quantization_config"]["ignore"], module]}
    quant["ignore"] = [e for e in quant["ignore"] if "self_attn" not in e or e == module]
    result = _lint(tmp_path, _config(model_type, quant))
    hits = by_code(result, "WC311")
    assert hits and module.rsplit(".", 1)[0] in hits[0].message, [f.message for f in result.findings]


@pytest.mark.parametrize("model_type", ["gpt_oss", "deepseek_v2", "qwen3_next", "mistral3", "qwen3_vl_moe"])
def test_overreaching_layer_regex_is_caught(tmp_path: Path, model_type: str) -> None:
    from weightcheck.patterns import detect_pattern

    pattern = detect_pattern({"model_type": model_type})
    entry = _ct(model_type)
    cfg = _config(model_type, entry["quantization_config"])
    text = cfg.get("text_config") or cfg
    text["num_hidden_layers"] = 12  # layers 10 and 11 exist: `layers.1.*` reaches them
    if isinstance(text.get("layer_types"), list):  # hybrid models: one entry per layer
        text["layer_types"] = (text["layer_types"] * 12)[:12]
    regex = f"re:{pattern.layer_prefix}.1.*"
    cfg["quantization_config"] = {**entry["quantization_config"],
                                  "ignore": [*entry["quantization_config"]["ignore"], regex]}  # fmt: skip
    result = _lint(tmp_path, cfg)
    [hit] = [f for f in by_code(result, "WC305") if f.location.tensor == regex]
    assert "{10..11}" in hit.message
