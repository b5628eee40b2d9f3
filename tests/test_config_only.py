"""Config-only lint on the shipped real-world configs, explain-ignore, and pattern loading/validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import by_code, run

from weightcheck.patterns import PatternError, builtin_patterns, detect_pattern, expand, load_pattern_file

SAMPLES = Path(__file__).resolve().parent.parent / "sample_configs"


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=120)


def test_router_not_ignored_config_names_routers_and_online_quantizer() -> None:
    result = run(SAMPLES / "glm-4.5-air-w4a16-router-not-ignored")
    [router] = [f for f in by_code(result, "WC309") if f.details["kind"] == "router"]
    assert "model.layers.{1..46}.mlp.gate" in router.message
    assert router.details["consumers"] == ["slime-int4"]  # GLM's router is never quantized by the engines
    assert any("config-only" in n for n in result.notes)


def test_recommended_glm_ignore_list_lints_clean() -> None:
    result = run(SAMPLES / "glm-4.5-air-w4a16-recommended")
    assert result.findings == [], [f.message for f in result.findings]
    assert result.exit_code() == 0


def test_overreaching_layer_regex_lists_captured_layers() -> None:
    result = run(SAMPLES / "glm-4.7-w4a16-layer-regex-overreach" / "config.json")
    over = {f.location.tensor: f for f in by_code(result, "WC305")}
    assert set(over) == {"re:model.layers.1.*", "re:model.layers.2.*"}
    assert "layers {10..19}" in over["re:model.layers.1.*"].message
    assert "model.layers.{10..19}." in over["re:model.layers.1.*"].message


def test_fp8_block_config_with_real_style_ignore_list_is_clean() -> None:
    result = run(SAMPLES / "qwen3-30b-a3b-fp8-block" / "config.json")
    assert result.findings == [], [f.message for f in result.findings]


def test_explain_ignore_reports_disagreement() -> None:
    proc = wc("explain-ignore", str(SAMPLES / "glm-4.7-w4a16-layer-regex-overreach"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    by_entry = {e["entry"]: e for e in doc["entries"]}
    gate = by_entry["re:.*mlp.gate$"]
    assert not gate["agree"]
    assert gate["consumers"]["ct"]["count"] == 90 and gate["consumers"]["slime-int4"]["count"] == 0
    text = wc("explain-ignore", str(SAMPLES / "glm-4.7-w4a16-layer-regex-overreach")).stdout
    assert "consumers disagree" in text and "slime/miles online INT4" in text


def test_every_shipped_pattern_loads_and_expands() -> None:
    patterns = builtin_patterns()
    assert {"llama", "qwen2", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3", "mixtral", "qwen2_5_vl"} <= set(patterns)
    cfg = json.loads((SAMPLES / "glm-4.5-air-w4a16-recommended" / "config.json").read_text())
    assert detect_pattern(cfg).name == "glm4_moe"
    modules, notes = expand(patterns["glm4_moe"], cfg)
    names = {m.name for m in modules}
    assert "model.layers.0.mlp.gate_proj" in names and "model.layers.0.mlp.gate" not in names  # dense layer 0
    assert "model.layers.45.mlp.experts.127.down_proj" in names and "model.layers.46.eh_proj" in names
    shapes = {m.name: m.shape for m in modules}
    assert shapes["model.layers.1.self_attn.q_proj"] == (96 * 128, 4096)
    assert notes == []


def test_kimi_k2_detected_as_deepseek_v3() -> None:
    assert detect_pattern({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}).name == "deepseek_v3"


HEAD = '[family]\nname = "x"\nlayer_prefix = "m"\nmodel_types = ["x"]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[family]\nname = "x"\n', "layer_prefix is required"),
        ('[family]\nname = "x"\nlayer_prefix = "model.layers"\nmodel_types = ["x"]\n[layer]\n"q" = { kind = "lin" }\n',
         "kind 'lin'"),
        (HEAD + '[layer]\n"q" = { kind = "linear", shape = ["__import__(1)"] }\n', "Call"),
        (HEAD + "[wat]\n", "unknown sections"),
        ("not toml =", "pattern"),
    ],
)  # fmt: skip
def test_malformed_pattern_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pattern.toml"
    path.write_text(text)
    with pytest.raises(PatternError, match=None) as err:
        load_pattern_file(path)
    assert message in str(err.value) or str(path) in str(err.value)


def test_pattern_option_errors_are_usage_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[family]\nname = "x"\n')
    target = str(SAMPLES / "glm-4.5-air-w4a16-recommended")
    assert wc("lint", target, "--pattern", str(bad)).returncode == 2
    assert wc("lint", target, "--pattern", "no_such_family").returncode == 2
    assert wc("lint", target, "--pattern", "glm4_moe").returncode == 0


def test_new_architecture_by_one_pattern_file(tmp_path: Path, make_ckpt) -> None:
    """The README recipe: a new family needs one TOML file, passed with --pattern (or dropped in patterns/)."""
    ckpt = make_ckpt("llama")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "tinyllama_x", ["TinyLlamaXForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    src = (Path(__file__).resolve().parent.parent / "patterns" / "llama.toml").read_text()
    new = tmp_path / "tinyllama_x.toml"
    new.write_text(src.replace('name = "llama"', 'name = "tinyllama_x"').replace('"llama", "mistral"', '"tinyllama_x"'))
    assert not by_code(run(ckpt), "WC410")
    result = run(ckpt, options={"pattern": str(new)})
    assert result.findings == [], [f.message for f in result.findings]
    # ...and the pattern really checks: drop a norm from the index, the pattern rule names it.
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shard = index["weight_map"].pop("model.layers.1.input_layernorm.weight")
    from helpers import rewrite_shard

    rewrite_shard(ckpt / shard, drop={"model.layers.1.input_layernorm.weight"})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any("model.layers.1.input_layernorm.weight" in f.message
               for f in by_code(run(ckpt, options={"pattern": str(new)}), "WC410"))  # fmt: skip


def test_vlm_hub_layout_uses_the_root_alias(make_ckpt) -> None:
    path = make_ckpt("qwen2_5_vl")
    result = run(path)
    assert result.findings == [], [f.message for f in result.findings]
    index = json.loads((path / "model.safetensors.index.json").read_text())
    victim = "model.layers.1.self_attn.k_proj.bias"
    shard = index["weight_map"].pop(victim)
    from helpers import rewrite_shard

    rewrite_shard(path / shard, drop={victim})
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any(victim in f.message for f in by_code(run(path), "WC410"))
