"""Published config.json files per generated model type (tests/data/oracle_configs.json, each with where it
was read) and transformers' documented defaults, reduced only in counts and sizes for tiny models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "oracle_configs.json"
PUBLISHED: list[dict[str, Any]] = json.loads(DATA.read_text())

# Keys set to tiny values (counts and sizes only); every other key (flags, optional ranks, layer lists,
# steps, intervals, shared-expert counts) is kept as published.
_LAYER_LISTS_BY_INDEX = ("moe_layers", "mlp_only_layers", "no_rope_layers", "cross_attention_layers")


def reduce_counts(cfg: dict[str, Any], n_layers: int = 8) -> dict[str, Any]:
    from tools.archgen.tiny import _VISION, EXPERT_KEYS, VARIANTS

    dims = dict(VARIANTS["D"])
    experts = dims.pop("experts")
    dims.pop("num_hidden_layers")
    out = json.loads(json.dumps(cfg))
    out.pop("quantization_config", None)
    text = out.get("text_config") if isinstance(out.get("text_config"), dict) else out
    text.pop("qk_head_dim", None)  # derived by the config class from the head dims reduced below
    old_n = text.get("num_hidden_layers") or len(text.get("layers_block_type") or text.get("hybrid_override_pattern")
                                                   or []) or n_layers  # fmt: skip
    n = min(int(old_n), n_layers)
    for key, value in dims.items():
        if isinstance(text.get(key), int) and not isinstance(text.get(key), bool):
            text[key] = value
    if "num_hidden_layers" in text:
        text["num_hidden_layers"] = n
    for key in EXPERT_KEYS:
        if isinstance(text.get(key), int) and text[key] > 0:
            text[key] = experts
    for key in ("num_experts_per_tok", "moe_k", "moe_topk", "n_group", "topk_group"):
        if isinstance(text.get(key), int) and text[key] > 0:
            text[key] = min(text[key], 2 if "tok" in key or key[-1] == "k" else 1)
    for key in ("max_position_embeddings",):
        if key in text:
            text[key] = 256
    for key, value in list(text.items()):
        if isinstance(value, list) and len(value) == old_n:  # per-layer lists: the first n layers
            text[key] = value[:n]
        elif key in _LAYER_LISTS_BY_INDEX and isinstance(value, list):
            text[key] = [i for i in value if isinstance(i, int) and i < n]
    if isinstance(text.get("hybrid_override_pattern"), str):
        text["hybrid_override_pattern"] = text["hybrid_override_pattern"][:n]
    if text.get("num_key_value_heads", 0) is None:  # documented: None means num_attention_heads
        text["num_key_value_heads"] = text.get("num_attention_heads")
    if "head_dim" in text and text["head_dim"] is None and isinstance(text.get("num_attention_heads"), int):
        text["head_dim"] = text["hidden_size"] // text["num_attention_heads"]  # documented default
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(text.get(key), int) and text[key] >= text.get("vocab_size", 1 << 30):
            text[key] = 0
    if "mamba_d_ssm" in text:  # Falcon-H1 validates it against the head dims: let it follow them
        text["mamba_d_ssm"] = None
    if "mamba_d_head" in text and "mamba_n_heads" in text:  # Mamba-2: n_heads * d_head == expand * hidden
        text["mamba_n_heads"] = 8
        text["mamba_d_head"] = (text.get("mamba_expand") or 2) * text["hidden_size"] // 8
        text["mamba_n_groups"] = 1
    if "mamba_head_dim" in text and "mamba_num_heads" in text:  # n_heads * head_dim == expand * hidden
        text["mamba_num_heads"], text["mamba_head_dim"] = 8, 2 * text["hidden_size"] // 8
        text["n_groups"] = 1
    for key in ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank"):
        if isinstance(text.get(key), int):
            text[key] = min(text[key], dims.get(key, 16))
    for sub, vis in list(out.items()):
        if sub.endswith("_config") and sub != "text_config" and isinstance(vis, dict) and sub != "rope_scaling":
            vis.update({k: v for k, v in _VISION.items() if k in vis and v is not None})
            if "out_hidden_size" in vis:
                vis["out_hidden_size"] = text.get("hidden_size")
            for k in ("num_hidden_layers", "depth"):
                if k in vis:
                    vis[k] = 1
            for k in ("deepstack_visual_indexes", "fullatt_block_indexes"):
                if k in vis:
                    vis[k] = [0]
    return out


def published_configs(model_type: str) -> list[tuple[str, dict[str, Any]]]:
    """(source, config) for a type: vendored Hub config.json files, and transformers' own documented default
    (the config class's defaults, which its docstring says reproduce a named released checkpoint)."""
    from transformers import CONFIG_MAPPING

    out = [(e["source"], e["config"]) for e in PUBLISHED if e["model_type"] == model_type]
    cls = CONFIG_MAPPING[model_type]
    named = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", cls.__doc__ or "")
    default = json.loads(cls().to_json_string(use_diff=False))
    out.append((f"transformers {cls.__name__}() defaults (documented as {named.group(1) if named else '?'})", default))
    return out


