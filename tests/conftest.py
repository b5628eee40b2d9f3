"""Shared fixtures: tiny random-init checkpoints written by the real transformers `save_pretrained`.

Each builder runs once per session; tests get a private copy to plant defects in.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import TINY  # tiny dimensions: fast to build, still genuinely sharded with a small max_shard_size


def _save(model, path: Path, shard: str) -> Path:
    model.save_pretrained(path, max_shard_size=shard)
    return path


def build_llama(path: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(intermediate_size=128, num_hidden_layers=4, tie_word_embeddings=False, **TINY)
    return _save(AutoModelForCausalLM.from_config(cfg), path, "60KB")


def build_qwen3_moe(path: Path) -> Path:
    import torch
    from factories import tiny_qwen3_moe_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_qwen3_moe_config(num_hidden_layers=3)
    return _save(AutoModelForCausalLM.from_config(cfg), path, "100KB")


def build_qwen3_tied(path: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=True, **TINY)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)  # single file, no index
    return path


def build_qwen2_5_vl(path: Path) -> Path:
    """A VLM: transformers writes the Hub layout (`model.layers.*`, `visual.*`), not its in-memory
    `model.language_model.*` names."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    text = dict(intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=False, **TINY)
    text.pop("head_dim")
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, fullatt_block_indexes=[0]
    )
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return _save(Qwen2_5_VLForConditionalGeneration(cfg), path, "100KB")


def build_qwen2_moe(path: Path) -> Path:
    """Singular `shared_expert` + `shared_expert_gate` (Qwen2-MoE), unlike GLM/DeepSeek's `shared_experts`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    torch.manual_seed(0)
    tiny = {k: v for k, v in TINY.items() if k != "head_dim"}
    cfg = Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                         num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                         **tiny)  # fmt: skip
    return _save(AutoModelForCausalLM.from_config(cfg), path, "100KB")


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "qwen2_moe": build_qwen2_moe,
    "qwen2_5_vl": build_qwen2_5_vl,
    "llama": build_llama,
    "qwen3_moe": build_qwen3_moe,
    "qwen3_tied": build_qwen3_tied,
}


@pytest.fixture(scope="session")
def _built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    cache: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = BUILDERS[kind](tmp_path_factory.mktemp(f"built-{kind}") / kind)
        return cache[kind]

    return get


@pytest.fixture
def make_ckpt(_built: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """`make_ckpt("llama")` → a private copy of a real, sharded checkpoint to damage."""

    def make(kind: str) -> Path:
        dest = tmp_path / kind
        shutil.copytree(_built(kind), dest)
        return dest

    return make


def read_index(path: Path) -> dict:
    return json.loads((path / "model.safetensors.index.json").read_text())


def write_index(path: Path, index: dict) -> None:
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def shards(path: Path) -> list[Path]:
    return sorted(path.glob("model-*.safetensors"))


def copy_into_another_shard(path: Path, name: str = "model.layers.0.input_layernorm.weight") -> tuple[Any, ...]:
    """A second, unindexed copy of tensor `name` written into another shard with safetensors' own writer:
    (the index as read, the name, the shard that now holds the copy, the copied tensor)."""
    from helpers import rewrite_shard
    from safetensors import safe_open

    index = read_index(path)
    source = path / index["weight_map"][name]
    with safe_open(str(source), framework="pt") as fh:
        copy = fh.get_tensor(name)
    other = next(f for f in shards(path) if f != source)
    rewrite_shard(other, add={name: copy})
    return index, name, other, copy


@pytest.fixture(scope="session")
def _built_quantized(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    from quantized import build_quantized

    cache: dict[tuple, Path] = {}

    def get(family: str, scheme: str, ignore: tuple[str, ...] | None = None) -> Path:
        key = (family, scheme, ignore)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"q-{family}-{scheme}") / f"{family}-{scheme}"
            cache[key] = build_quantized(family, scheme, out, list(ignore) if ignore else None)
        return cache[key]

    return get


@pytest.fixture
def make_quant(_built_quantized: Callable[..., Path], tmp_path: Path) -> Callable[..., Path]:
    """`make_quant("qwen3_moe", "W4A16")` → a private copy of a real llm-compressor checkpoint."""

    def make(family: str, scheme: str, ignore: tuple[str, ...] | None = None) -> Path:
        dest = tmp_path / f"{family}-{scheme}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(_built_quantized(family, scheme, ignore), dest)
        return dest

    return make


# ---- weightcheck rollout / doctor: a tiny Qwen2 fine-tuned on a toy chat template (tests/rollout_fixtures.py)

PERTURBATION_SCALES = (4.0, 2.0, 1.0, 0.5, 0.25, 0.125)  # of the reference layer's mean |weight|

@pytest.fixture(scope="session")
def rollout_world() -> Iterator[dict[str, Any]]:
    """The trained tiny model and the rollouts every case writes (built once: ~1 minute on a shared CPU)."""
    import rollout_fixtures as rf
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend with the other test workers
    try:
        model = rf.build_model()
        # The first sampling seed whose rewards vary within a prompt group: a real GRPO batch has such
        # groups; one where every group is constant is itself a finding (WC811).
        seed, clean = next(
            (seed, r)
            for seed, r in ((seed, rf.make_rollout(model, seed=seed)) for seed in range(1, 40))
            if rf.varied(r)
        )
        # Preconditions that make a clean verdict mean something: the model follows its template (low
        # per-token NLL, completed answers).
        assert rf.framework_step0(clean)["mean_log_probs"] > -0.8, rf.framework_step0(clean)
        assert all(s["status"] == "completed" for s in clean.samples)
        # A reference differing from the actor in one layer, by the largest of these perturbations whose KL
        # lies well inside WC802's band (above kernel jitter, below the configuration-error line at 1). The
        # model is trained here, so it depends on the CPU's floating-point paths: the same fixed scale gave a
        # KL below 1 on one machine and 2.1 on another machine of the same kind.
        for scale in PERTURBATION_SCALES:
            perturbed = rf.with_reference(clean, rf.perturbed(model, layer=1, scale=scale))
            if 1e-3 <= rf.framework_step0(perturbed)["kl"] <= 0.5:
                break
        else:
            raise AssertionError(f"no perturbation of {PERTURBATION_SCALES} puts the KL in (1e-3, 0.5)")
        yield {
            "model": model,
            "clean": clean,
            "retemplated": rf.make_rollout(model, retemplated=True),
            "perturbed": perturbed,
            "perturbed_scale": scale,
            "jitter": rf.with_jittered_reference(clean, model),
            "swapped": rf.with_reference(clean, rf.tp_shards_swapped(model)),
            "shifted_engine": rf.served_by(rf.pp_shifted(model), model, seed=seed),
        }
    finally:
        torch.set_num_threads(threads)
