"""WC320: a compressed-tensors config whose targets quantize a module that SGLang or vLLM builds without the
quant config (`quant_config=None`), read from the engines' model sources (patterns/generated/sglang/ and
vllm/, SGLang 0.5.23 and vLLM 0.33.0), for generated and hand-written architectures alike.

Configs: transformers' own config class of each architecture (tiny dimensions) with the quantization block
written by compressed-tensors' own `QuantizationConfig` (what llm-compressor serializes), the W4A16 preset on
`Linear`. Bad: the ignore list leaves the engine-unquantized module out (llm-compressor's default
`ignore=["lm_head"]`); good: the same list with it in, as llm-compressor's own examples write it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import by_code, run

from weightcheck.findings import Severity

# model_type -> (architecture, the engine-unquantized modules' leaf, the engines that build it so, the
# entries a clean list adds). Each leaf/engine pair is what the engines' sources say (checked below).
CASES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], list[str]]] = {
    "qwen2_moe": ("Qwen2MoeForCausalLM", ("shared_expert_gate",), ("sglang", "vllm"),
                  ["re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]),
    "qwen3_next": ("Qwen3NextForCausalLM", ("shared_expert_gate",), ("sglang", "vllm"),
                   ["re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]),
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", ("shared_expert_gate",), ("sglang", "vllm"),
                    ["re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$", "re:.*visual.*"]),
    "llama4_text": ("Llama4ForCausalLM", ("router",), ("sglang", "vllm"), ["re:.*router$"]),
    "llama4": ("Llama4ForConditionalGeneration", ("router",), ("sglang", "vllm"),
               ["re:.*router$", "re:.*vision_model.*", "re:.*multi_modal_projector.*"]),
    "jamba": ("JambaForCausalLM", ("router",), ("vllm",), ["re:.*router$"]),
    "hunyuan_v1_moe": ("HunYuanMoEV1ForCausalLM", ("wg",), ("sglang",), ["re:.*mlp.gate.wg$"]),
    "olmo": ("OlmoForCausalLM", ("q_proj", "k_proj", "v_proj", "o_proj"), ("sglang",), ["re:.*self_attn\\..*"]),
}  # fmt: skip


def quant_block(ignore: list[str], targets: list[str] | None = None) -> dict:
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, preset_name_to_scheme

    scheme = preset_name_to_scheme("W4A16", targets or ["Linear"])
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore, format="pack-quantized",
                                quantization_status=QuantizationStatus.COMPRESSED)  # fmt: skip
    return json.loads(json.dumps(config.model_dump(), default=str))


def write_config(path: Path, model_type: str, ignore: list[str], targets: list[str] | None = None) -> Path:
    from tools.archgen.tiny import tiny_config

    cfg = json.loads(tiny_config(model_type, "D").to_json_string())
    cfg["architectures"] = [CASES[model_type][0]] if model_type in CASES else cfg.get("architectures")
    cfg["quantization_config"] = quant_block(ignore, targets)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def expected_modules(path: Path, leaves: tuple[str, ...]) -> list[str]:
    """The modules with these leaves that the architecture's pattern expands to for the config."""
    from weightcheck.checkpoint import load_checkpoint
    from weightcheck.quant.analysis import analyze_checkpoint

    qa = analyze_checkpoint(load_checkpoint(path))
    assert qa.inventory is not None
    return sorted(m for m in qa.inventory.modules if m.rsplit(".", 1)[-1] in leaves)


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_engine_unquantized_module_left_out_of_ignore_is_an_error(tmp_path: Path, model_type: str) -> None:
    _, leaves, engines, _ = CASES[model_type]
    path = write_config(tmp_path / "bad", model_type, ["lm_head"])
    result = run(path)
    findings = by_code(result, "WC320")
    assert findings, [f"{f.code} {f.message}" for f in result.findings]
    assert all(f.severity == Severity.ERROR for f in findings)
    reported = sorted(m for f in findings for m in f.details["modules"])
    assert reported == expected_modules(path, leaves) and reported
    assert {e for f in findings for e in f.details["engines"]} == set(engines)
    assert result.exit_code() == 1


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_clean_ignore_list_gets_no_error(tmp_path: Path, model_type: str) -> None:
    extra = CASES[model_type][3]
    result = run(write_config(tmp_path / "good", model_type, ["lm_head", *extra]))
    assert not by_code(result, "WC320")
    assert [f"{f.code} {f.message}" for f in result.findings if f.severity >= Severity.ERROR] == []


def test_fix_entry_clears_the_error(tmp_path: Path) -> None:
    """The entries the finding proposes are enough: added to the list, the error is gone."""
    [finding] = by_code(run(write_config(tmp_path / "a", "qwen3_next", ["lm_head", "re:.*mlp.gate$"])), "WC320")
    fixed = write_config(tmp_path / "b", "qwen3_next", ["lm_head", "re:.*mlp.gate$", *finding.details["add_ignore"]])
    assert not by_code(run(fixed), "WC320")


def test_router_not_a_linear_in_transformers_is_not_targeted_by_linear(tmp_path: Path) -> None:
    """Mixtral's router is built unquantized by both engines, but transformers builds it as a TopK-router
    nn.Module, not an nn.Linear: a `Linear` target leaves it alone, so leaving it out is no error; a target
    that names it by regex does quantize it."""
    from weightcheck.patterns import engine_unquantized_leaves, producer_linear_leaves

    assert "gate" in engine_unquantized_leaves("sglang", "mixtral")
    assert "gate" not in producer_linear_leaves("mixtral")
    assert not by_code(run(write_config(tmp_path / "a", "mixtral", ["lm_head"])), "WC320")
    named = run(write_config(tmp_path / "b", "mixtral", ["lm_head"], ["Linear", "re:.*block_sparse_moe.gate$"]))
    [finding] = by_code(named, "WC320")
    assert all(m.endswith("block_sparse_moe.gate") for m in finding.details["modules"])


def test_declared_consumers_limit_the_engines(tmp_path: Path) -> None:
    """OLMo's attention is unquantized only in SGLang 0.5.23: a team that deploys to vLLM alone is not told."""
    from weightcheck.linting import lint_many

    path = write_config(tmp_path / "a", "olmo", ["lm_head"])
    assert by_code(lint_many([path], options={"consumers": ["sglang"]}), "WC320")
    assert not by_code(lint_many([path], options={"consumers": ["vllm"]}), "WC320")


def test_facts_come_from_the_engine_sources() -> None:
    """The leaves above are what the generated engine facts say (so a stale case list fails here), with the
    source file each was read from."""
    from weightcheck.patterns import engine_source_facts, engine_unquantized_leaves
    from weightcheck.rules.quant import _engine_attr

    for model_type, (_arch, leaves, engines, _) in CASES.items():
        for engine in ("sglang", "vllm"):
            facts = engine_source_facts(engine, model_type)
            unquantized = engine_unquantized_leaves(engine, model_type)
            renames = (facts.get("load_weights") or {}).get("renames") or []
            # by the module's own name, or as the engine's load_weights renames it (Hunyuan's `mlp.gate.wg`)
            found = {leaf for leaf in leaves if _engine_attr(f"model.layers.0.mlp.gate.{leaf}", unquantized, renames)}
            assert found == (set(leaves) if engine in engines else set()), (model_type, engine)
            if engine in engines:
                assert facts["module"].endswith(".py") and facts.get(f"{engine}_class")
    assert engine_source_facts("sglang", "qwen3_next")["sglang"] == "0.5.23"
    assert engine_source_facts("vllm", "qwen3_next")["vllm"] == "0.33.0"
    # every fused group, not only q/k/v and gate/up
    assert engine_source_facts("sglang", "qwen3_next")["fused"]["in_proj_qkvz"] == ["in_proj_qkv", "in_proj_z"]
    # how the engine renames checkpoint (and ignore-list) names before matching
    mapper = engine_source_facts("sglang", "qwen2_5_vl")["weights_mapper"]
    assert mapper["orig_to_new_prefix"]["model.language_model."] == "language_model.model."


def test_untrusted_model_type_is_never_a_path() -> None:
    from weightcheck.patterns import engine_source_facts

    assert engine_source_facts("sglang", "../index") == {}
    assert engine_source_facts("vllm", "qwen3_next/../../x") == {}
    assert engine_source_facts("../sglang", "qwen3_next") == {}


def test_published_configs_have_no_engine_unquantized_error(tmp_path: Path) -> None:
    """Every real published config of tests/data/published_quant_configs.json (as that suite writes it)."""
    import test_published_quant_configs as published

    for i, entry in enumerate(published.DATA):
        (tmp_path / str(i)).mkdir()
        assert not by_code(run(published._write(tmp_path / str(i), entry)), "WC320"), entry["source"]


def test_lint_fix_adds_the_entry_and_lint_is_then_clean(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write_config(tmp_path / "a", "llama4_text", ["lm_head"])
    fix = subprocess.run([sys.executable, "-m", "weightcheck", "lint", str(path), "--fix"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "router" in json.loads((path / "config.json").read_text())["quantization_config"]["ignore"][-1], fix.stdout
    assert not by_code(run(path), "WC320")


# ---- the generated engine facts are current -----------------------------------------------------------


def test_producer_linear_facts_are_current() -> None:
    """generated/producer/transformers_linear.json regenerated from the installed (pinned) transformers."""
    from tools.archgen.engine_sources import generate_producer_linear
    from tools.archgen.generate import GENERATED_DIR

    for name, text in generate_producer_linear(GENERATED_DIR / "index.json").items():
        assert (GENERATED_DIR / name).read_text() == text, "stale: run scripts/generate_patterns.py --engine-sources"


def test_every_generated_model_type_has_engine_facts() -> None:
    """One file per architecture per engine, each from the pinned engine version; the vLLM class named is the
    one vLLM's registry maps one of the type's architectures to."""
    from tools.archgen.generate import GENERATED_DIR
    from weightcheck.patterns import engine_source_facts, generated_model_types

    types = generated_model_types()
    for engine, version in (("sglang", "0.5.23"), ("vllm", "0.33.0")):
        assert {p.stem for p in (GENERATED_DIR / engine).glob("*.json")} == set(types)
        for t in types:
            assert engine_source_facts(engine, t)[engine] == version, (engine, t)
    served = [t for t in types if engine_source_facts("vllm", t).get("vllm_class")]
    assert len(served) >= 50


def test_vllm_facts_are_current() -> None:
    """Regenerated from vLLM 0.33.0's sources when they are at hand (WEIGHTCHECK_VLLM_SRC: an unzipped
    `pip download vllm==0.33.0 --no-deps` wheel; vLLM is never installed). CI has no copy: the always-run
    tests above check the files' shape, this one their content where the sources are."""
    import os

    from tools.archgen.engine_sources import generate_vllm
    from tools.archgen.generate import GENERATED_DIR

    src = os.environ.get("WEIGHTCHECK_VLLM_SRC")
    if not src:
        pytest.skip("WEIGHTCHECK_VLLM_SRC not set (an unzipped vllm 0.33.0 wheel)")
    files = generate_vllm(Path(src) / "vllm" / "model_executor" / "models", "0.33.0", GENERATED_DIR / "index.json")
    stale = [name for name, text in files.items() if (GENERATED_DIR / name).read_text() != text]
    assert stale == [], "stale: run scripts/generate_patterns.py --engine-sources --vllm-src DIR"


# ---- with tensors: a checkpoint llm-compressor really wrote --------------------------------------------


def _olmo_w4a16(root: Path, ignore: list[str]) -> Path:
    """A tiny OLMo (transformers save_pretrained) quantized by llm-compressor oneshot, W4A16 on Linear."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, OlmoConfig

    base, out = root / "base", root / "w4a16"
    if not base.exists():
        torch.manual_seed(0)
        cfg = OlmoConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)  # fmt: skip
        AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="W4A16", ignore=ignore))
    model.save_pretrained(out, save_compressed=True)
    (out / "recipe.yaml").unlink(missing_ok=True)
    return out


def test_checkpoint_with_engine_unquantized_modules_stored_packed(tmp_path: Path) -> None:
    """SGLang 0.5.23 builds OLMo's attention without the quant config: llm-compressor's default ignore list
    packs it, and the checkpoint's attention cannot load there. With attention ignored it is clean."""
    bad = _olmo_w4a16(tmp_path / "bad", ["lm_head"])
    findings = by_code(run(bad), "WC320")
    assert findings and all(f.details["target"] == "stored quantized" for f in findings)
    assert {m.rsplit(".", 1)[-1] for f in findings for m in f.details["modules"]} == {"q_proj", "k_proj", "v_proj",
                                                                                      "o_proj"}  # fmt: skip
    assert all(f.details["add_ignore"] == [] for f in findings)  # re-quantize: no ignore entry fixes packed data
    good = _olmo_w4a16(tmp_path / "good", ["lm_head", "re:.*self_attn\\..*"])
    result = run(good)
    assert not by_code(result, "WC320")
    assert [f"{f.code} {f.message}" for f in result.findings if f.severity >= Severity.ERROR] == []


def test_layer_placement_keys_each_engine_reads() -> None:
    """Which layers an engine builds follows from the config keys its class reads (`config_reads`): both read
    DeepSeek's `first_k_dense_replace`/`moe_layer_freq`, Llama-4's `interleave_moe_layer_step`, ERNIE's MoE
    interval and start/end index; vLLM reads Qwen2-MoE's `mlp_only_layers`/`decoder_sparse_step` and SGLang
    0.5.23 does not (it builds every Qwen2-MoE layer sparse)."""
    from weightcheck.patterns import engine_source_facts

    def reads(engine: str, model_type: str) -> set[str]:
        return set(engine_source_facts(engine, model_type)["config_reads"])

    for engine in ("sglang", "vllm"):
        assert {"first_k_dense_replace", "moe_layer_freq", "q_lora_rank"} <= reads(engine, "deepseek_v2")
        assert "interleave_moe_layer_step" in reads(engine, "llama4_text")
        assert {"moe_layer_interval", "moe_layer_start_index", "moe_layer_end_index"} <= reads(engine, "ernie4_5_moe")
    assert {"mlp_only_layers", "decoder_sparse_step"} <= reads("vllm", "qwen2_moe")
    assert not {"mlp_only_layers", "decoder_sparse_step"} & reads("sglang", "qwen2_moe")


def test_router_left_out_is_an_engine_error_only_where_the_engine_source_quantizes_it(tmp_path: Path) -> None:
    """WC309 asks vLLM's source too: vLLM 0.33.0 builds Qwen3-MoE's gate with the quant config (a bf16 router
    has no home there: error) but Qwen2-MoE's as a GateLinear without it, whatever the hand-written pattern's
    `quantized_by` says (only the online INT4 quantizer's warning is left)."""
    from weightcheck.patterns import engine_source_facts

    assert "gate" in engine_source_facts("vllm", "qwen2_moe")["unquantized"]
    assert "gate" not in engine_source_facts("vllm", "qwen3_moe")["unquantized"] + engine_source_facts(
        "vllm", "qwen3_moe")["mixed"]  # fmt: skip

    def router_findings(model_type: str) -> list:
        result = run(write_config(tmp_path / model_type, model_type, ["lm_head", "re:.*shared_expert_gate$"]))
        return [f for f in by_code(result, "WC309") if f.details["kind"] == "router"]

    [qwen3] = router_findings("qwen3_moe")
    assert qwen3.severity == Severity.ERROR and "vllm" in qwen3.details["consumers"]
    assert all(f.severity == Severity.WARNING and "vllm" not in f.details["consumers"]
               for f in router_findings("qwen2_moe"))  # fmt: skip
    assert router_findings("qwen2_moe")


def test_class_name_ignore_entry_is_honoured_as_the_producer_does(tmp_path: Path) -> None:
    """llm-compressor skips modules whose class an ignore entry names: `Llama4Router` keeps Llama-4's routers
    unquantized (no WC320); a class entry naming something else does not."""
    assert not by_code(run(write_config(tmp_path / "a", "llama4_text", ["lm_head", "Llama4Router"])), "WC320")
    assert by_code(run(write_config(tmp_path / "b", "llama4_text", ["lm_head", "Llama4TextAttention"])), "WC320")
