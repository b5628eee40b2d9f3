"""Quantized fixtures made by the real tools: transformers writes a tiny random-init model, llm-compressor's
`oneshot` quantizes it (data-free schemes), `save_pretrained(save_compressed=True)` writes it. Defects are
planted afterwards with safetensors' writer and compressed-tensors' own packing (`pack_to_int32`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from factories import drop_add_tensors as edit_tensors
from factories import index_of

# W4A16 uses group_size 128, so every quantized Linear needs in_features % 128 == 0.
DIMS = dict(vocab_size=256, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def tiny_config(family: str) -> Any:
    from factories import tiny_qwen3_moe_config
    from transformers import Glm4MoeConfig, LlamaConfig, Qwen3Config

    if family == "llama":
        return LlamaConfig(intermediate_size=512, num_hidden_layers=2, tie_word_embeddings=False, **DIMS)
    if family == "qwen3":
        return Qwen3Config(intermediate_size=512, num_hidden_layers=2, tie_word_embeddings=False, **DIMS)
    if family == "qwen3_moe":
        return tiny_qwen3_moe_config(intermediate_size=512, moe_intermediate_size=128, **DIMS)
    if family == "glm4_moe":
        return Glm4MoeConfig(intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=3, n_routed_experts=4,
                             num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                             num_nextn_predict_layers=0, partial_rotary_factor=0.5, tie_word_embeddings=False,
                             **DIMS)  # fmt: skip
    raise ValueError(family)


def build_quantized(family: str, scheme: str, out: Path, ignore: list[str] | None = None) -> Path:
    """Tiny `family` model quantized with llm-compressor `scheme` (W4A16, FP8_BLOCK, FP8_DYNAMIC)."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = out.parent / f"{out.name}-base"
    AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.bfloat16).save_pretrained(base)
    # oneshot needs a model with a name_or_path: load the saved one back.
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore or ["lm_head", "re:.*mlp.gate$"])
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True, max_shard_size="300KB")
    shutil.rmtree(base)
    for extra in ("recipe.yaml", "generation_config.json"):
        (out / extra).unlink(missing_ok=True)
    return out


# ---- planting defects -------------------------------------------------------------------------------


def read_tensor(path: Path, name: str) -> Any:
    from safetensors import safe_open

    shard = index_of(path)["weight_map"][name]
    with safe_open(str(path / shard), framework="pt") as fh:
        return fh.get_tensor(name)


def pack_int4(weight: Any, group_size: int = 128) -> dict[str, Any]:
    """Symmetric INT4 group quantization packed with compressed-tensors' own `pack_to_int32`, giving the
    exact tensors an online INT4 quantizer emits for a module (`weight_packed`, `weight_scale`, `weight_shape`)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    out, inp = weight.shape
    w = weight.float().reshape(out, -1, group_size)
    scale = (w.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-8)
    q = torch.round(w / scale).clamp(-8, 7).reshape(out, inp).to(torch.int8)
    return {
        "weight_packed": pack_to_int32(q, 4),
        "weight_scale": scale.squeeze(-1).to(weight.dtype),
        "weight_shape": torch.tensor([out, inp], dtype=torch.int64),
    }


def quantize_modules_in_place(path: Path, modules: list[str]) -> None:
    """Replace each module's bf16 `weight` by INT4 companions (what the online quantizer does to an
    unignored 2-D weight)."""
    drop, add = set(), {}
    for module in modules:
        weight = read_tensor(path, f"{module}.weight")
        drop.add(f"{module}.weight")
        add.update({f"{module}.{k}": v for k, v in pack_int4(weight).items()})
    edit_tensors(path, drop=drop, add=add)


def dequantize_module_in_place(path: Path, module: str) -> None:
    """Store a quantized module as a plain bf16 weight (companions removed)."""
    import torch

    wm = index_of(path)["weight_map"]
    companions = {n for n in wm if n.startswith(module + ".weight_")}
    shape = read_tensor(path, f"{module}.weight_shape").tolist()
    edit_tensors(path, drop=companions, add={f"{module}.weight": torch.zeros(shape, dtype=torch.bfloat16)})


def set_ignore(path: Path, ignore: list[str]) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = ignore
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def quant_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())["quantization_config"]
