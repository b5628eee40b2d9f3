"""The SGLang half of the generated architecture knowledge, against the installed SGLang 0.5.23 (group
scripts/ci-groups/25-arch-knowledge.sh, in .venv-sglang)."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.sglang

if os.environ.get("WEIGHTCHECK_REQUIRE_SGLANG"):  # the CI group: a broken install must fail, not skip
    import sglang  # noqa: F401
else:
    pytest.importorskip("sglang")


def test_sglang_facts_are_current() -> None:
    from tools.archgen.generate import GENERATED_DIR
    from tools.archgen.sglang_facts import generate_sglang

    files = generate_sglang()
    stale = [name for name, text in files.items() if (GENERATED_DIR / name).read_text() != text]
    assert not stale, f"stale: {stale}; run scripts/generate_patterns.py --sglang"
    # one file per architecture: every generated model_type, and no all-architecture file left
    index = json.loads((GENERATED_DIR / "index.json").read_text())
    assert set(files) == {f"sglang/{t}.json" for t in index["model_types"]}
    assert not (GENERATED_DIR / "sglang.json").exists()


def test_named_classes_are_registered_and_cover_forty_architectures() -> None:
    from sglang.srt.models.registry import ModelRegistry

    from tools.archgen.generate import GENERATED_DIR
    from tools.archgen.sglang_facts import registry_doc

    facts = registry_doc(GENERATED_DIR)["model_types"]
    registered = set(ModelRegistry.get_supported_archs())
    named = {t: f["sglang_class"] for t, f in facts.items() if f.get("sglang_class")}
    assert len(named) >= 40
    assert {t: c for t, c in named.items() if c not in registered} == {}
    # and the ones recorded as not registered really are not (by any of their transformers names)
    index = json.loads((GENERATED_DIR / "index.json").read_text())
    for t, f in facts.items():
        if not f.get("sglang_class"):
            doc = json.loads((GENERATED_DIR / index["model_types"][t]).read_text())
            assert not set(doc["family"]["architectures"]) & registered, t


def test_router_facts_match_sglang_classes() -> None:
    """gpt-oss and Llama-4 build their router without the quant config (never quantized by the engine);
    Qwen3-MoE passes it only on the ModelSlim path."""
    from tools.archgen.generate import GENERATED_DIR
    from tools.archgen.sglang_facts import registry_doc

    facts = registry_doc(GENERATED_DIR)["model_types"]
    assert facts["gpt_oss"]["routers"] == {"router": "none"}
    assert facts["llama4_text"]["routers"] == {"router": "none"}
    assert facts["qwen3_moe"]["routers"]["gate"].startswith("conditional")
    assert facts["qwen3_moe"]["packed_modules_mapping"]["qkv_proj"] == ["q_proj", "k_proj", "v_proj"]


def test_routed_expert_layouts_were_probed_through_load_weights() -> None:
    """What SGLang's load_weights was seen to read (tools.archgen.sglang_probe): Mixtral per-expert w1/w2/w3
    only, not transformers 5's fused in-memory names; gpt-oss its fused stacks; Qwen3-VL-MoE the fused names
    only in the released orientation (transposed from what transformers 5.17 saves)."""
    from tools.archgen.generate import GENERATED_DIR
    from tools.archgen.sglang_facts import registry_doc

    facts = registry_doc(GENERATED_DIR)["model_types"]

    def reads(model_type: str) -> dict[str, str]:
        return {lay["source"]: lay["read"] for lay in facts[model_type]["routed_experts"]["layouts"]}

    assert reads("mixtral") == {"save_pretrained": "all", "transformers_in_memory": "none"}
    assert facts["mixtral"]["routed_experts"]["mappings"][0]["ckpt_gate_proj_name"] == "w1"
    assert reads("gpt_oss") == {"save_pretrained": "all"}
    assert reads("qwen3_vl_moe")["save_pretrained"] == "none"
    assert reads("qwen3_vl_moe")["save_pretrained_transposed"] == "all"
    probed = [t for t, f in facts.items() if "layouts" in (f.get("routed_experts") or {})]
    assert len(probed) >= 15


def test_sglang_source_facts_are_current() -> None:
    """patterns/generated/sglang/<model_type>.json (unquantized modules, fused groups, name mappers) regenerated
    from the installed SGLang's model sources."""
    from tools.archgen.generate import GENERATED_DIR
    from tools.archgen.sglang_facts import sglang_source_files

    files = sglang_source_files()
    assert len(files) == len(json.loads((GENERATED_DIR / "index.json").read_text())["model_types"])
    stale = [name for name, text in files.items() if (GENERATED_DIR / name).read_text() != text]
    assert stale == [], "stale: run scripts/generate_patterns.py --engine-sources (in .venv-sglang)"


def test_shared_expert_gates_and_llama4_router_are_unquantized_in_sglang() -> None:
    """The motivating facts, from SGLang's own sources: ReplicatedLinear(..., quant_config=None)."""
    from weightcheck.patterns import engine_source_facts

    for model_type in ("qwen2_moe", "qwen3_next", "qwen3_5_moe"):
        assert "shared_expert_gate" in engine_source_facts("sglang", model_type)["unquantized"], model_type
    assert "router" in engine_source_facts("sglang", "llama4")["unquantized"]
