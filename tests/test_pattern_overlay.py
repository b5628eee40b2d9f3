"""Hand-written TOML is an overlay on the generated pattern of its model_type (issue #20 item 7): the generated
file is the base, the TOML adds or replaces named entries (patterns/README.md). Checked end to end on a real
`save_pretrained` Qwen3 checkpoint with a pattern folder holding the shipped generated data and a TOML that
names only one module: the TOML's entry and the generated entries it does not name both take effect."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import by_code, rewrite_shard, run

import weightcheck.patterns as patterns
from weightcheck.findings import Severity

SHIPPED = Path(patterns.__file__).resolve().parent.parent / "patterns"

_CACHES = ("builtin_patterns", "builtin_families", "builtin_pattern", "generated_index", "_generated_doc",
           "generated_pattern", "_overlaid", "engine_source_facts", "_producer_linear", "_handwritten_doc",
           "_handwritten_twins")  # fmt: skip


def _clear() -> None:
    for name in _CACHES:
        getattr(patterns, name).cache_clear()


def _toml(q_proj_rows: str) -> str:
    # Names one module only: every other module of the Qwen3 layers and globals comes from the generated file.
    return f"""
[family]
name = "qwen3_overlay"
model_types = ["qwen3"]
architectures = ["Qwen3ForCausalLM"]
layer_prefix = "model.layers"

[layer]
"self_attn.q_proj" = {{ kind = "linear", shape = ["{q_proj_rows}", "hidden_size"] }}
"""


@pytest.fixture
def pattern_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """A patterns/ folder: the shipped generated data, and one TOML written by the test."""
    folder = tmp_path / "patterns"
    folder.mkdir()
    (folder / "generated").symlink_to(SHIPPED / "generated", target_is_directory=True)
    monkeypatch.setattr(patterns, "_pattern_dir", lambda: folder)
    _clear()

    def write(text: str) -> None:
        (folder / "qwen3_overlay.toml").write_text(text)
        _clear()

    yield write
    monkeypatch.undo()
    _clear()


def _problems(path: Path) -> list[str]:
    return [f"{f.code} {f.message[:200]}" for f in run(path).findings if f.severity >= Severity.WARNING]


def _shard_of(path: Path, tensor: str) -> Path:
    index = json.loads((path / "model.safetensors.index.json").read_text()) if (
        path / "model.safetensors.index.json").exists() else None  # fmt: skip
    return path / index["weight_map"][tensor] if index else path / "model.safetensors"


def test_clean_checkpoint_lints_clean_through_the_overlay(pattern_dir, make_ckpt) -> None:
    pattern_dir(_toml("num_attention_heads * head_dim"))
    path = make_ckpt("qwen3_tied")
    config = json.loads((path / "config.json").read_text())
    assert patterns.detect_pattern(config).name == "qwen3_overlay"
    assert _problems(path) == []


def test_toml_entry_replaces_the_generated_one(pattern_dir, make_ckpt) -> None:
    # the TOML's q_proj shape (one row too many) is what lint checks: the generated entry is replaced
    pattern_dir(_toml("num_attention_heads * head_dim + 1"))
    path = make_ckpt("qwen3_tied")
    found = by_code(run(path), "WC501")
    assert found and all("q_proj" in f.message for f in found), [f.message for f in found]


def test_generated_entries_the_toml_does_not_name_still_apply(pattern_dir, make_ckpt) -> None:
    # the TOML names only q_proj; layer 0's down_proj (from the generated file) removed is a missing weight
    pattern_dir(_toml("num_attention_heads * head_dim"))
    path = make_ckpt("qwen3_tied")
    gone = "model.layers.0.mlp.down_proj.weight"
    rewrite_shard(_shard_of(path, gone), drop={gone})
    result = run(path)
    missing = by_code(result, "WC410")
    assert missing and any("model.layers.0.mlp.down_proj" in f.message for f in missing)
    assert "qwen3_overlay" in missing[0].message  # the overlay, not the bare generated pattern, linted it


def test_overlay_doc_semantics() -> None:
    generated = {
        "family": {"name": "gen_x", "model_types": ["x"], "layer_prefix": "model.layers", "experts": "n"},
        "defaults": {"tie_word_embeddings": False},
        "globals": {"model.embed_tokens": {"kind": "embedding", "shape": ["vocab_size", "hidden_size"]},
                    "lm_head": {"kind": "linear", "when": "not tie_word_embeddings"}},
        "layer": {"mlp.gate": {"kind": "router", "when": "layer >= k"},
                  "self_attn.q_proj": {"kind": "linear", "shape": ["q", "hidden_size"], "bias": "attention_bias"}},
        "provenance": {"class_defaults": {"k": 1, "attention_bias": False, "q": 8}, "validated": {"k": {}}},
    }  # fmt: skip
    hand = {
        "family": {"name": "x", "model_types": ["x"], "layer_prefix": "model.language_model.layers"},
        "defaults": {"q": "hidden_size"},
        "moe_layer": {"self_attn.q_proj": {"kind": "linear"}, "mlp.extra": {"kind": "other"}},
    }
    out = patterns.overlay_doc(generated, hand)
    assert out["family"] == {"name": "x", "model_types": ["x"], "layer_prefix": "model.language_model.layers",
                             "experts": "n"}  # fmt: skip
    assert out["defaults"] == {"tie_word_embeddings": False, "q": "hidden_size"}
    # the root moved: the generated embedding moved with it; lm_head sits outside the root
    assert set(out["globals"]) == {"model.language_model.embed_tokens", "lm_head"}
    # q_proj replaced whole (no bias key left from the generated entry), in the TOML's section
    assert out["layer"] == {"mlp.gate": {"kind": "router", "when": "layer >= k"}}
    assert out["moe_layer"] == {"self_attn.q_proj": {"kind": "linear"}, "mlp.extra": {"kind": "other"}}
    # class defaults only for keys surviving generated entries use; never the TOML's own defaults; no domain
    assert out["provenance"] == {"class_defaults": {"k": 1}}
    patterns.parse_pattern(out, "overlay")  # a valid pattern
