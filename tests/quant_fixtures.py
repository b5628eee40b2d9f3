"""Quantized fixtures for the comparison engine, made by the real tools.

One tiny bf16 Llama (transformers `save_pretrained`) is quantized by llm-compressor `oneshot` with every
data-free scheme compressed-tensors can write (one output per scheme, all from the *same* weights, so a
diff of the base against each must pass within quantization error). HF fine-grained FP8 checkpoints are
written with transformers' own `Fp8Quantize`. Built once per test session (`quant_suite`); tests copy a
checkpoint before planting a defect.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from factories import edit_tensors  # noqa: F401  (re-exported: tests import it from here)

# W4A16 needs in_features % 128 == 0 (group size 128); hidden 256 / intermediate 512 satisfy it.
DIMS = dict(vocab_size=256, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)

_INT4_CHANNEL_ASYM = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "channel"}
_FP8_TENSOR = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}
_DYNAMIC_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}

# Scheme name → llm-compressor preset, or config_groups for schemes without a preset.
SCHEMES: dict[str, Any] = {
    "W4A16": "W4A16",  # INT4 symmetric, group 128
    "W4A16_ASYM": "W4A16_ASYM",  # INT4 asymmetric, group 128 (packed zero point)
    "W8A16": "W8A16",  # INT8 packed, group 128
    "W8A8": "W8A8",  # int-quantized: I8 weight, channel scale
    "INT4_CHANNEL_ASYM": {"group_0": {"targets": ["Linear"], "weights": _INT4_CHANNEL_ASYM}},
    "INT4_TENSOR": {"group_0": {"targets": ["Linear"], "weights": {**_INT4_CHANNEL_ASYM, "strategy": "tensor"}}},
    "FP8_TENSOR": {"group_0": {"targets": ["Linear"], "weights": _FP8_TENSOR, "input_activations": _DYNAMIC_TOKEN}},
    "FP8_DYNAMIC": "FP8_DYNAMIC",  # FP8 channel
    "FP8_BLOCK": "FP8_BLOCK",  # FP8 128x128 blocks
    "NVFP4A16": "NVFP4A16",
    "MXFP4A16": "MXFP4A16",
    "MXFP8A16": "MXFP8A16",
}
# Expected `QuantSpec.describe()` fragments: proves the format was recognised, not just decoded.
EXPECTED_SPEC = {
    "W4A16": "INT4 packed (group 128, symmetric)",
    "W4A16_ASYM": "INT4 packed (group 128, asymmetric)",
    "W8A16": "INT8 packed (group 128, symmetric)",
    "W8A8": "INT8 (channel, symmetric)",
    "INT4_CHANNEL_ASYM": "INT4 packed (channel, asymmetric)",
    "INT4_TENSOR": "INT4 packed (tensor, asymmetric)",
    "FP8_TENSOR": "FP8 (tensor)",
    "FP8_DYNAMIC": "FP8 (channel)",
    "FP8_BLOCK": "FP8 (block 128x128)",
    "FP8_BLOCK_PADDED": "FP8 (block 128x128)",
    "NVFP4A16": "NVFP4 (tensor_group 16)",
    "MXFP4A16": "MXFP4 (group 32)",
    "MXFP8A16": "MXFP8 (group 32)",
}


def build_base(path: Path, intermediate: int = 512, layers: int = 3) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(intermediate_size=intermediate, num_hidden_layers=layers, tie_word_embeddings=False, **DIMS)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path, max_shard_size="400KB")
    return path


def quantize(base: Path, scheme: Any, out: Path) -> Path:
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    # oneshot validates model.config.name_or_path: the model must come from a saved directory.
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    if isinstance(scheme, str):
        recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
    else:
        recipe = QuantizationModifier(config_groups=scheme, ignore=["lm_head"])
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True, max_shard_size="400KB")
    for extra in ("recipe.yaml",):
        (out / extra).unlink(missing_ok=True)
    return out


def hf_fp8_from(base: Path, out: Path, block: tuple[int, int] = (128, 128)) -> Path:
    """An HF fine-grained FP8 checkpoint (`weight` F8_E4M3 + `weight_scale_inv`) made by transformers'
    own `Fp8Quantize` from the base's Linear weights (embeddings, norms and lm_head stay bf16)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    quantizer = SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=list(block), scale_fmt=None))
    op = Fp8Quantize(quantizer)
    out.mkdir(parents=True)
    tensors = {}
    for shard in sorted(base.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as fh:
            for key in fh.keys():
                value = fh.get_tensor(key)
                if key.endswith("proj.weight"):
                    tensors.update(op.convert({key: value}))
                else:
                    tensors[key] = value
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": list(block),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def build_suite(root: Path) -> dict[str, Path]:
    paths = {"base": build_base(root / "base")}
    for name, scheme in SCHEMES.items():
        paths[name] = quantize(paths["base"], scheme, root / name)
    # Dimensions that are not multiples of the 128x128 block: CT pads, scales cover partial blocks.
    paths["padded-base"] = build_base(root / "padded-base", intermediate=320, layers=1)
    paths["FP8_BLOCK_PADDED"] = quantize(paths["padded-base"], "FP8_BLOCK", root / "FP8_BLOCK_PADDED")
    paths["HF_FP8"] = hf_fp8_from(paths["base"], root / "HF_FP8")
    return paths


_SUITE: dict[str, Path] = {}


@pytest.fixture(scope="session")
def quant_suite(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every quantized variant of one base model. Cached per process: several test modules share it."""
    if not _SUITE:
        _SUITE.update(build_suite(tmp_path_factory.mktemp("quant-suite")))
    return _SUITE


@pytest.fixture
def copy_ckpt(tmp_path: Path) -> Callable[[Path], Path]:
    """`copy_ckpt(path)` → a private copy to damage."""

    def copy(path: Path) -> Path:
        dest = tmp_path / f"{path.name}-copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(path, dest)
        return dest

    return copy
