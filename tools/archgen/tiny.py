"""Tiny models of real architectures, built from each architecture's own transformers config class.

Three variants of dimensions: A and B drive pattern derivation (an expression over the config is kept
only when it reproduces the shapes and layer sets of both), C is used by the tests (it checks that what
was derived from A and B generalises). Needs torch and transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weightcheck.arch.oracle import model_class  # the runtime half: the meta build needs it too

EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")

# Distinct, non-multiple values per variant so that coincidences between config keys do not survive.
# A dimension left at its default in every variant invites one: Kimi Linear's KDA head dim 128 equals
# qk_rope_head_dim * head_dim in A, B and C, so `linear_head_dim`/`linear_num_heads` vary too.
VARIANTS: dict[str, dict[str, int]] = {
    "A": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=160, num_hidden_layers=4, moe_intermediate_size=32, experts=3, num_experts_per_tok=2,
              shared_expert_intermediate_size=48, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
              qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=1, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12, mamba_d_state=8,
              ssm_state_size=8, shared_intermediate_size=48, intermediate_size_mlp=96,
              linear_head_dim=10, linear_num_heads=3),
    "B": dict(hidden_size=96, intermediate_size=80, num_attention_heads=3, num_key_value_heads=1, head_dim=8,
              vocab_size=176, num_hidden_layers=5, moe_intermediate_size=40, experts=7, num_experts_per_tok=2,
              shared_expert_intermediate_size=56, kv_lora_rank=24, q_lora_rank=36, qk_rope_head_dim=4,
              qk_nope_head_dim=12, v_head_dim=20, first_k_dense_replace=2, linear_num_key_heads=1,
              linear_num_value_heads=3, linear_key_head_dim=12, linear_value_head_dim=16, mamba_d_state=12,
              ssm_state_size=12, shared_intermediate_size=72, intermediate_size_mlp=88,
              linear_head_dim=14, linear_num_heads=2),
    # C confirms what A and B derived; D is for the tests only (what was derived must generalise to it).
    "C": dict(hidden_size=128, intermediate_size=112, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
              vocab_size=192, num_hidden_layers=3, moe_intermediate_size=16, experts=6, num_experts_per_tok=2,
              shared_expert_intermediate_size=24, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
              qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, linear_num_key_heads=2,
              linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=8, mamba_d_state=16,
              ssm_state_size=16, shared_intermediate_size=40, intermediate_size_mlp=104,
              linear_head_dim=18, linear_num_heads=5),
    "D": dict(hidden_size=80, intermediate_size=144, num_attention_heads=5, num_key_value_heads=1, head_dim=16,
              vocab_size=208, num_hidden_layers=3, moe_intermediate_size=24, experts=4, num_experts_per_tok=2,
              shared_expert_intermediate_size=32, kv_lora_rank=20, q_lora_rank=28, qk_rope_head_dim=6,
              qk_nope_head_dim=10, v_head_dim=14, first_k_dense_replace=1, linear_num_key_heads=1,
              linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, mamba_d_state=4,
              ssm_state_size=4, shared_intermediate_size=36, intermediate_size_mlp=120,
              linear_head_dim=22, linear_num_heads=3),
}  # fmt: skip

# Keys of the text config that other keys are derived from; shrunk in every variant.
_FIXED = dict(
    max_position_embeddings=256, n_shared_experts=1, tie_word_embeddings=False, num_nextn_predict_layers=0,
    mamba_d_state=8, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_chunk_size=16, mamba_d_conv=4,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, sliding_window=64, attention_chunk_size=64, topk_group=1, n_group=1,
    num_experts_per_tok=2, moe_topk=2, shared_intermediate_size=48, ssm_state_size=8, time_step_rank=8,
    n_groups=1, num_heads=8, conv_kernel=4, expand=2, attn_layer_period=2, attn_layer_offset=1,
    expert_layer_period=2, expert_layer_offset=1, hidden_size_per_head=16, rope_interleave=True,
    global_attn_every_n_layers=2, layer_types=None, intermediate_size_mlp=96, interleave_moe_layer_step=1,
    num_local_experts=None, moe_layer_freq=1, pad_token_id=0, mamba_d_ssm=None,
)  # fmt: skip

# Sub-configs (vision towers, audio) shrunk to one small block: not itemized by the patterns.
_VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, depth=1, num_attention_heads=2, num_heads=2,
    embed_dim=32, projection_dim=32, image_size=28, patch_size=14, num_layers=1, vision_output_dim=32,
    hidden_sizes=None, num_global_layers=1, deepstack_visual_indexes=[0], spatial_merge_size=2,
    temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0], intermediate_layers_indices=[0],
    vision_feature_layer=-1, mm_tokens_per_image=4,
)  # fmt: skip

# Per-architecture needs of the config classes (invariants they assert), each with the reason.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Gemma-3 pools image tokens to mm_tokens_per_image from (image/patch)^2 patches: must divide evenly.
    "gemma3": {"mm_tokens_per_image": 4},
}


# Per-architecture keys of the text config, each with the reason.
TEXT_OVERRIDES: dict[str, dict[str, Any]] = {
    # Llama-4's VLM config ships 48-entry per-layer lists; None lets the config class derive them from the
    # variant's layer count (NoPE every 4th layer, MoE every interleave_moe_layer_step).
    "llama4": {"no_rope_layers": None, "moe_layers": None},
}

# Hybrid layer-type lists whose length is the layer count (Nemotron-H has no num_hidden_layers key in
# transformers 5: the count is len(layers_block_type)); cycled to the variant's layer count.
_BLOCK_TYPES: dict[str, tuple[str, list[str]]] = {
    "nemotron_h": ("layers_block_type", ["linear_attention", "moe", "full_attention", "moe", "linear_attention"]),
    # LFM2's class default is all full-attention layers, but every published LFM2 mixes in short-conv layers
    # (`conv`: in_proj, conv.conv, out_proj); without them in the samples the pattern never learns that kind.
    "lfm2": ("layer_types", ["conv", "full_attention", "conv"]),
}


def _scaled(cfg_dict: dict[str, Any], variant: str) -> dict[str, Any]:
    dims = dict(VARIANTS[variant])
    experts = dims.pop("experts")
    out: dict[str, Any] = {}
    for key, value in {**_FIXED, **dims}.items():
        if key in cfg_dict:
            out[key] = value
    for key in EXPERT_KEYS:
        if isinstance(cfg_dict.get(key), int) and cfg_dict[key] > 0:
            out[key] = experts
    # Mamba-2 mixers assert n_heads * d_head == expand * hidden_size.
    if "mamba_d_head" in cfg_dict and "hidden_size" in out:
        expand = cfg_dict.get("mamba_expand") if isinstance(cfg_dict.get("mamba_expand"), int) else 2
        out["mamba_d_head"] = expand * out["hidden_size"] // out.get("mamba_n_heads", 8)
    return out


def _sub_configs(cfg_dict: dict[str, Any]) -> list[str]:
    return [k for k, v in cfg_dict.items() if k.endswith("_config") and isinstance(v, dict) and k != "text_config"]


def tiny_config(model_type: str, variant: str = "A") -> Any:
    """A transformers config of `model_type` with tiny dimensions of the given variant."""
    from transformers import CONFIG_MAPPING, AutoConfig

    cls = CONFIG_MAPPING[model_type]
    base = cls().to_dict()
    kwargs: dict[str, Any] = {}
    text = base.get("text_config")
    if isinstance(text, dict) and text:
        text_kwargs = {**text, **_scaled(text, variant), **TEXT_OVERRIDES.get(model_type, {})}
        if variant in ("B",) and "first_k_dense_replace" in text:
            pass
        kwargs["text_config"] = text_kwargs
        hidden = text_kwargs.get("hidden_size")
    else:
        kwargs.update(_scaled(base, variant))
        hidden = kwargs.get("hidden_size")
    for sub in _sub_configs(base):
        vis = dict(base[sub])
        vis.update({k: v for k, v in _VISION.items() if k in vis and v is not None})
        if "out_hidden_size" in vis:
            vis["out_hidden_size"] = hidden
        kwargs[sub] = vis
    kwargs.update({k: v for k, v in OVERRIDES.get(model_type, {}).items() if k in base})
    if model_type in _BLOCK_TYPES:
        key, cycle = _BLOCK_TYPES[model_type]
        n = VARIANTS[variant]["num_hidden_layers"]
        kwargs[key] = [cycle[i % len(cycle)] for i in range(n)]
    if "tie_word_embeddings" in base or isinstance(text, dict):
        kwargs["tie_word_embeddings"] = False
    return AutoConfig.for_model(model_type, **kwargs)


MAX_PARAMS = 20_000_000  # a "tiny" model bigger than this means a dimension was not shrunk


def build(model_type: str, variant: str = "A", seed: int = 0) -> Any:
    """A randomly initialised tiny model (CPU; sized on the meta device first so nothing big is allocated)."""
    return materialize(tiny_config(model_type, variant), seed)


def materialize(config: Any, seed: int = 0) -> Any:
    """A randomly initialised model of any (small) config, sized on the meta device first."""
    import torch

    auto = model_class(config)
    model_type = config.model_type
    with torch.device("meta"):
        probe = auto.from_config(config)
    n = sum(p.numel() for p in probe.parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"{model_type}: tiny config still has {n:,} parameters")
    # Materialise the meta model instead of building it twice (half the cost): the values only need to
    # be finite; tied parameters stay one tensor.
    model = probe.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32) * 0.02)
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.zero_()
    if getattr(config, "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
        model.tie_weights()  # to_empty gives the head its own storage: tie it again, as from_pretrained does
    model.eval()
    return model


def save(model_type: str, path: Path, variant: str = "A", shard: str = "200KB") -> Path:
    """save_pretrained of the tiny model, sharded (the real writer, including its key conversions)."""
    model = build(model_type, variant)
    model.save_pretrained(path, max_shard_size=shard)
    return path
