"""One home for tiny checkpoints and tensor edits, shared by tests, harnesses (tests/sglang, tests/megatron),
scripts and benchmarks.

Tests import it directly (`from factories import ...`: pytest puts tests/ on the path through conftest).
Scripts and benchmarks, which run from the repository root, put tests/ on `sys.path` first, as
scripts/make_samples.py always has:

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from factories import tiny_qwen3_moe_config

It lives under tests/ (not in the weightcheck package) because it needs torch and transformers, which the
light core must never import, and because it is test infrastructure, not something a user installs.

Configs come from the real transformers classes, checkpoints from the real `save_pretrained`, edits from
safetensors' own writer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Tiny dimensions: fast to build, still genuinely sharded with a small max_shard_size.
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128)

# The tiny Qwen3-MoE every suite builds: 4 experts (2 per EP rank with ep_size 2), top-2 routing, separate head.
QWEN3_MOE = dict(
    TINY,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_experts=4,
    num_experts_per_tok=2,
    tie_word_embeddings=False,
)


def tiny_qwen3_moe_config(**overrides: Any) -> Any:
    """A transformers `Qwen3MoeConfig` with the tiny dimensions above; `overrides` replace any of them (a
    W4A16 fixture needs 128-multiple widths, SGLang's block FP8 whole 128-blocks, ...)."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**{**QWEN3_MOE, **overrides})


# ---- tensor edits ---------------------------------------------------------------------------------------


def edit_tensors(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Load every shard, let `edit` change the dict of tensors (add, drop, rename, replace) and write each
    shard back with safetensors' own writer. Tensors keep their shard; new ones go to the first shard. The
    index's weight_map follows; its total_size is left as it was (a test may be about it)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = sorted(path.glob("*.safetensors"))
    owner: dict[str, Path] = {}
    tensors: dict[str, Any] = {}
    metadata: dict[Path, dict[str, str] | None] = {}
    for shard in files:
        with safe_open(str(shard), framework="pt") as fh:
            metadata[shard] = fh.metadata()
            for key in fh.keys():
                tensors[key] = fh.get_tensor(key)
                owner[key] = shard
    edit(tensors)
    per_shard: dict[Path, dict[str, Any]] = {shard: {} for shard in files}
    for key, value in tensors.items():
        per_shard[owner.get(key, files[0])][key] = value.contiguous()
    for shard, content in per_shard.items():
        save_file(content, str(shard), metadata=metadata[shard])
    index = path / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"] = {k: owner.get(k, files[0]).name for k in tensors}
        index.write_text(json.dumps(doc, indent=2))


def index_of(path: Path) -> dict:
    return json.loads((path / "model.safetensors.index.json").read_text())


def drop_add_tensors(path: Path, drop: set[str] = frozenset(), add: dict[str, Any] | None = None) -> None:
    """Drop/add tensors, rewriting only the shards concerned (new ones go to the last shard), and keep the
    index in step, total_size included, so only the planted defect shows."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = index_of(path)
    wm = index["weight_map"]
    add = dict(add or {})
    touched = {wm[n] for n in drop if n in wm}
    target_shard = sorted(set(wm.values()))[-1]
    if add:
        touched.add(target_shard)
    for shard in touched:
        file = path / shard
        with safe_open(str(file), framework="pt") as fh:
            meta = fh.metadata()
            tensors = {k: fh.get_tensor(k) for k in fh.keys() if k not in drop}
        if shard == target_shard:
            tensors.update(add)
        save_file(tensors, str(file), metadata=meta)
    for n in drop:
        wm.pop(n, None)
    for n in add:
        wm[n] = target_shard
    if "total_size" in index.get("metadata", {}):
        from weightcheck.safetensors_header import read_header

        index["metadata"]["total_size"] = sum(read_header(path / s).data_end for s in set(wm.values()))
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def llmcompressor_fp8_dynamic(model_type: str, root: Path, ignore: list[str]) -> Path:
    """transformers' tiny `model_type` (tools.archgen.tiny) quantized FP8_DYNAMIC by llm-compressor's
    `oneshot` (targets Linear, `ignore` as its recipe takes it) and saved compressed, as a user's run writes
    it: `root / "fp8"`."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    from tools.archgen import tiny
    from weightcheck.arch.oracle import model_class

    config = tiny.tiny_config(model_type, "A")
    tiny.materialize(config).save_pretrained(root / "base")
    model = model_class(config).from_pretrained(root / "base", dtype=torch.bfloat16)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=ignore))
    model.save_pretrained(root / "fp8", save_compressed=True, max_shard_size="300KB")
    return root / "fp8"
