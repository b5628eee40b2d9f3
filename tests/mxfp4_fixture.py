"""gpt-oss MXFP4 checkpoints: a tiny GptOss model saved by transformers `save_pretrained`, its stacked
experts then stored the way the published gpt-oss checkpoints and transformers' mxfp4 integration lay them
out: `<proj>_blocks` [experts, rows, groups, 16] uint8 (two FP4 E2M1 codes a byte, 32 values a group) and
`<proj>_scales` [experts, rows, groups] uint8 (E8M0 exponents, bias 127), rows being the output dim. The
packing is checked against transformers' own dequantizer (`convert_moe_packed_tensors`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from quantized import index_of

MODULES_TO_NOT_CONVERT = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def pack_mxfp4(weight: Any) -> tuple[Any, Any]:
    """[experts, in, out] (transformers' in-memory layout) -> (blocks, scales)."""
    import torch
    from transformers.integrations.mxfp4 import FP4_VALUES

    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    w = weight.float().transpose(1, 2)  # [E, out, in]: one row per output
    e, rows, cols = w.shape
    groups = w.reshape(e, rows, cols // 32, 32)
    amax = groups.abs().amax(-1).clamp(min=2.0**-126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = groups / torch.ldexp(torch.ones_like(exp), exp.int()).unsqueeze(-1)
    idx = (scaled.unsqueeze(-1) - lut).abs().argmin(-1).to(torch.uint8)
    blocks = idx[..., 0::2] | (idx[..., 1::2] << 4)
    return blocks.contiguous(), (exp.int() + 127).to(torch.uint8).contiguous()


def save_gpt_oss_mxfp4(path: Path) -> Path:
    """A sharded tiny gpt-oss checkpoint with MXFP4 experts and gpt-oss's published quantization_config."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from weightcheck.safetensors_header import read_header

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = GptOssConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128, layer_types=None,
    )  # fmt: skip
    GptOssForCausalLM(cfg).save_pretrained(path, max_shard_size="40KB")
    index = index_of(path)
    wm = index["weight_map"]
    for shard in sorted(set(wm.values())):  # each stack replaced inside its own shard, index kept in step
        with safe_open(str(path / shard), framework="pt") as fh:
            meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
        for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            weight = tensors.pop(name)
            blocks, scales = pack_mxfp4(weight)
            back = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            assert back.shape == weight.shape, (back.shape, weight.shape)
            assert torch.allclose(back, weight.float(), atol=weight.abs().max().item() / 4)
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            del wm[name]
            wm[f"{name}_blocks"] = wm[f"{name}_scales"] = shard
        save_file(tensors, str(path / shard), metadata=meta)
    index["metadata"]["total_size"] = sum(read_header(path / s).data_end for s in set(wm.values()))
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    doc = json.loads((path / "config.json").read_text())
    doc["quantization_config"] = {"modules_to_not_convert": MODULES_TO_NOT_CONVERT, "quant_method": "mxfp4"}
    (path / "config.json").write_text(json.dumps(doc, indent=2))
    return path


def replace_tensors(path: Path, new: dict[str, Any | None]) -> None:
    """Replace (or with None drop) tensors inside the shard that holds them; the index stays in step."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = index_of(path)
    wm = index["weight_map"]
    for shard in sorted({wm[n] for n in new}):
        with safe_open(str(path / shard), framework="pt") as fh:
            meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
        for name, tensor in new.items():
            if wm[name] == shard:
                if tensor is None:
                    del tensors[name]
                else:
                    tensors[name] = tensor
        save_file(tensors, str(path / shard), metadata=meta)
    for name, tensor in new.items():
        if tensor is None:
            del wm[name]
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
