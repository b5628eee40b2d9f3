"""Regenerate the tiny real checkpoints shipped in sample_configs/ (needs torch + transformers).

Each sample is written by transformers' own `save_pretrained` from a random-init tiny config, then the
documented defect is planted. Run: `.venv/bin/python scripts/make_samples.py`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "sample_configs"
sys.path.insert(0, str(ROOT.parent / "tests"))  # tiny checkpoints and edits: tests/factories.py (and quantized.py)


def broken_moe_export() -> None:
    """A3/A4-style export: one shard never written, and a ghost index entry for an MTP tensor."""
    import torch
    from factories import tiny_qwen3_moe_config
    from transformers import AutoModelForCausalLM

    out = ROOT / "tiny-qwen3-moe-lost-shard"
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(0)
    cfg = tiny_qwen3_moe_config(num_hidden_layers=3, dtype="bfloat16")
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="60KB")
    (out / "generation_config.json").unlink(missing_ok=True)
    shards = sorted(out.glob("model-*.safetensors"))
    shards[2].unlink()
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["mtp.fc.weight"] = shards[-1].name
    index_path.write_text(json.dumps(index, indent=2) + "\n")


def glm_router_packed() -> None:
    """THUDM/slime#1642: a GLM-style MoE quantized to W4A16 by llm-compressor, then the routers packed the way an
    online INT4 quantizer with ignore = ["lm_head"] packs every 2-D weight (compressed-tensors' own
    `pack_to_int32`). SGLang drops the router's quantized names silently: routing on garbage."""
    from quantized import build_quantized, quantize_modules_in_place, set_ignore

    out = ROOT / "tiny-glm4-moe-w4a16-router-packed"
    shutil.rmtree(out, ignore_errors=True)
    build_quantized("glm4_moe", "W4A16", out)
    quantize_modules_in_place(out, ["model.layers.1.mlp.gate", "model.layers.2.mlp.gate"])
    set_ignore(out, ["lm_head"])


if __name__ == "__main__":
    broken_moe_export()
    glm_router_packed()
