"""Dequantizers against the reference implementations, bit for bit, on real llm-compressor output.

Every quantized module of every scheme in the suite is decompressed by compressed-tensors' own
compressor (chosen from the checkpoint's config, as vLLM does) and by weightcheck; the results must be
identical to the last bit. HF FP8 is checked against transformers' `Fp8Dequantize`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import EXPECTED_SPEC, edit_tensors

from weightcheck.dequant import (
    HF_FP8_BLOCK,
    QuantFormatError,
    dequantize,
    dequantize_rows,
    find_quantized,
    unpack_fp4,
    unpack_int32,
)
from weightcheck.tensors import TensorStore

# Shared fixtures: the session-wide quantized suite and private copies of checkpoints.
quant_suite = quant_fixtures.quant_suite
copy_ckpt = quant_fixtures.copy_ckpt

CT_SCHEMES = sorted(set(EXPECTED_SPEC))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers: equality of these is bit-for-bit equality (-0.0 != 0.0)."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def quantized_of(path: Path) -> tuple[TensorStore, dict]:
    store = TensorStore.open(path)
    config = json.loads((path / "config.json").read_text())
    found, malformed = find_quantized({n: store.info(n) for n in store.names()}, config, store.get)
    assert not malformed
    return store, found


@pytest.mark.parametrize("scheme", CT_SCHEMES)
def test_dequantizers_match_compressed_tensors_bit_for_bit(quant_suite: dict[str, Path], scheme: str) -> None:
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig

    path = quant_suite[scheme]
    config = json.loads((path / "config.json").read_text())
    qconfig = QuantizationConfig.model_validate(config["quantization_config"])
    (group,) = qconfig.config_groups.values()
    compressor = BaseCompressor.get_value_from_registry(group.format or qconfig.format)
    store, found = quantized_of(path)
    assert len(found) == 7 * (3 if scheme != "FP8_BLOCK_PADDED" else 1)  # every Linear but lm_head
    for qt in found.values():
        assert qt.spec.describe() == EXPECTED_SPEC[scheme]
        parts = {role: store.get(stored).clone() for role, stored in qt.parts.items()}
        reference = compressor.decompress(parts, group)["weight"]
        ours = dequantize(qt, store.get)
        assert ours.dtype == reference.dtype and ours.shape == reference.shape, qt.name
        assert torch.equal(bits(ours), bits(reference)), f"{scheme} {qt.name} differs from compressed-tensors"


def test_row_blocks_equal_whole_tensor(quant_suite: dict[str, Path]) -> None:
    """Streaming in row blocks (what diff does) gives the same bits as one whole dequantization."""
    for scheme in ("W4A16_ASYM", "FP8_BLOCK_PADDED", "NVFP4A16"):
        store, found = quantized_of(quant_suite[scheme])
        qt = next(q for q in found.values() if q.rows > 200)
        whole = dequantize(qt, store.get).reshape(qt.rows, qt.cols)
        blocks = [dequantize_rows(qt, store.get, r, min(r + 37, qt.rows))[0] for r in range(0, qt.rows, 37)]
        assert torch.equal(bits(torch.cat(blocks)), bits(whole)), scheme


@pytest.mark.parametrize("num_bits", range(1, 9))
def test_unpack_matches_compressed_tensors_packing(num_bits: int) -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    generator = torch.Generator().manual_seed(num_bits)
    low, high = -(1 << (num_bits - 1)), 1 << (num_bits - 1)
    codes = torch.randint(low, high, (5, 77), generator=generator, dtype=torch.int8)
    packed = pack_to_int32(codes, num_bits)
    assert torch.equal(unpack_int32(packed, num_bits, 77), codes)


def test_legacy_packing_never_straddles_words() -> None:
    """CT < 0.18 packed 32//bits values per word (3-bit: 10 per word, 2 bits unused)."""
    codes = torch.arange(-4, 4, dtype=torch.int8).repeat(3)[:20].reshape(1, 20)
    words = torch.zeros(1, 2, dtype=torch.int64)
    for i, value in enumerate((codes[0] + 4).tolist()):
        words[0, i // 10] |= value << ((i % 10) * 3)
    assert torch.equal(unpack_int32(words.to(torch.int32), 3, 20, legacy=True), codes)


def test_unpack_fp4_matches_compressed_tensors() -> None:
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    packed = torch.arange(256, dtype=torch.uint8).reshape(8, 32)  # every pair of nibbles, signed zeros too
    assert torch.equal(bits(unpack_fp4(packed)), bits(unpack_fp4_from_uint8(packed, 8, 64)))


def test_g_idx_takes_each_columns_own_group(quant_suite: dict[str, Path], copy_ckpt) -> None:
    """Activation-ordered GPTQ stores `weight_g_idx`: column c uses group g_idx[c], not c // group_size."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    path = copy_ckpt(quant_suite["W4A16"])
    module = "model.layers.0.self_attn.q_proj"
    permutation = torch.randperm(256, generator=torch.Generator().manual_seed(0))
    g_idx = (torch.arange(256) // 128)[permutation].to(torch.int32)
    edit_tensors(path, lambda t: t.__setitem__(f"{module}.weight_g_idx", g_idx))
    store, found = quantized_of(path)
    qt = found[f"{module}.weight"]
    assert qt.spec.has_g_idx and "g_idx" in qt.spec.describe()
    scale = store.get(f"{module}.weight_scale")
    codes = unpack_from_int32(store.get(f"{module}.weight_packed"), 4, torch.Size(qt.shape))
    expected = codes.to(scale.dtype) * scale[:, g_idx.long()]
    assert torch.equal(bits(dequantize(qt, store.get)), bits(expected))
    other = found["model.layers.0.self_attn.k_proj.weight"]
    assert not other.spec.has_g_idx


def test_hf_fp8_matches_transformers(quant_suite: dict[str, Path]) -> None:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    store, found = quantized_of(quant_suite["HF_FP8"])
    assert len(found) == 21 and all(q.spec.format == HF_FP8_BLOCK for q in found.values())
    reference_op = Fp8Dequantize(None)
    for qt in found.values():
        weight, scale = store.get(qt.parts["weight"]), store.get(qt.parts["weight_scale_inv"])
        assert qt.spec.block == (128, 128)
        reference = reference_op._dequantize_one(weight, scale)
        assert torch.equal(bits(dequantize(qt, store.get)), bits(reference)), qt.name


def test_hf_fp8_block_size_inferred_and_padded(tmp_path: Path) -> None:
    """No block size in the config and dimensions that are not multiples of 128 (DeepSeek's
    kv_a_proj_with_mqa is 576 rows): the scale grid is ceil-divided and partial blocks use their scale."""
    from safetensors.torch import save_file

    weight = (torch.randn(200, 300) * 4).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3) + 0.5
    save_file({"m.weight": weight, "m.weight_scale_inv": scale}, str(tmp_path / "model.safetensors"))
    store = TensorStore.open(tmp_path)
    found, malformed = find_quantized({n: store.info(n) for n in store.names()}, {}, store.get)
    qt = found["m.weight"]
    assert not malformed and qt.spec.block == (128, 128)
    expanded = scale.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    assert torch.equal(dequantize(qt, store.get), weight.to(torch.float32) * expanded)


def test_quantization_step_is_one_ulp_of_the_format(quant_suite: dict[str, Path]) -> None:
    store, found = quantized_of(quant_suite["W4A16"])
    qt = found["model.layers.0.mlp.down_proj.weight"]
    _, step = dequantize_rows(qt, store.get, 0, 4, with_step=True)
    scale = store.get(qt.parts["weight_scale"])[:4].float()
    assert torch.equal(step, scale.repeat_interleave(128, 1))  # one INT step = the group's scale

    store, found = quantized_of(quant_suite["FP8_TENSOR"])
    qt = found["model.layers.0.mlp.down_proj.weight"]
    _, step = dequantize_rows(qt, store.get, 0, 1, with_step=True)
    codes = store.get(qt.parts["weight"])[0].float()
    scale = float(store.get(qt.parts["weight_scale"]).float())
    one = codes.abs() == 1.0
    if bool(one.any()):  # e4m3 ULP at 1.0 is 2^-3
        assert torch.allclose(step[0][one], torch.full_like(step[0][one], 0.125 * scale))
    zero = codes == 0
    if bool(zero.any()):  # zeros: the subnormal step 2^-9
        assert torch.allclose(step[0][zero], torch.full_like(step[0][zero], 2.0**-9 * scale))
    assert bool((step > 0).all())


def test_inconsistent_quantized_tensors_are_reported_not_raised(quant_suite: dict[str, Path], copy_ckpt) -> None:
    """Bad: a scale whose group count does not divide the columns. Good: the untouched modules."""
    path = copy_ckpt(quant_suite["W4A16"])
    name = "model.layers.1.mlp.up_proj.weight_scale"
    edit_tensors(path, lambda t: t.__setitem__(name, torch.ones(512, 3, dtype=torch.bfloat16)))
    store = TensorStore.open(path)
    config = json.loads((path / "config.json").read_text())
    found, malformed = find_quantized({n: store.info(n) for n in store.names()}, config, store.get)
    assert set(malformed) == {"model.layers.1.mlp.up_proj"}
    assert "does not divide" in malformed["model.layers.1.mlp.up_proj"]
    assert len(found) == 20


def test_dequantize_rejects_a_missing_dequantizer() -> None:
    from weightcheck.dequant import QuantizedTensor, QuantSpec

    qt = QuantizedTensor("x.weight", "x", QuantSpec("awq", 4, "int"), {}, (2, 2), "BF16")
    with pytest.raises(QuantFormatError):
        dequantize(qt, lambda name: torch.zeros(1))
