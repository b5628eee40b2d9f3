"""Dequantizers for quantized checkpoint tensors, bit-for-bit equal to the reference implementations.

Formats (tensor layouts as compressed-tensors, transformers and ModelOpt write them):

- `pack-quantized` (INT1..8; sym/asym; tensor/channel/group; `weight_g_idx`): `weight_packed` I32,
  `weight_scale`, `weight_shape`, `weight_zero_point` — reference: compressed-tensors (CT)
  `PackedQuantizationCompressor`.
- `float-quantized` / `int-quantized` / `naive-quantized` (FP8 tensor/channel/block/group, INT8): `weight`
  F8/I8 and `weight_scale` — CT `NaiveQuantizationCompressor`.
- `nvfp4-pack-quantized`: `weight_packed` U8, `weight_scale` F8_E4M3, `weight_global_scale` F32 — CT
  `NVFP4PackedCompressor`.
- `mxfp4-pack-quantized`: `weight_packed` U8, `weight_scale` U8 (E8M0) — CT `MXFP4PackedCompressor`.
- `mxfp8-quantized`: `weight` F8_E4M3, `weight_scale` U8 (E8M0) — CT `MXFP8QuantizationCompressor`.
- Hugging Face fine-grained FP8: `weight` F8_E4M3, `weight_scale_inv` (block size from the config or
  inferred from shapes) — transformers `Fp8Dequantize`.

Bit-exactness comes from doing the same arithmetic in the same dtypes as the reference (`q.to(scale.dtype)
* scale` in bf16 for CT integer and FP8 formats, f32 with a final bf16 cast for NVFP4, f32 for HF FP8);
the scale expansion (groups, blocks, g_idx) is an exact gather, so chunking by rows changes nothing.

The quantization parameters are read from the tensors themselves (scale shapes, presence of a zero
point or g_idx); the config only settles what shapes cannot: group size or block size when a dimension
is not a multiple of it. Nothing from compressed-tensors is imported: the package is optional.

Each dequantizer can also return the *quantization step* (one ULP of the quantized dtype, in
dequantized units) per element, which the comparison engine uses as its tolerance.

Why one ~600-line module: one dequantizer per format above, each short and each checked bit for bit against
its reference in tests/test_dequant.py; splitting them per format would scatter the shared unpacking helpers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightcheck.safetensors_header import TensorInfo

if TYPE_CHECKING:
    import torch

PACK_QUANTIZED = "pack-quantized"
FLOAT_QUANTIZED = "float-quantized"  # CT float-/int-/naive-quantized: the weight is stored unpacked
NVFP4_PACKED = "nvfp4-pack-quantized"
MXFP4_PACKED = "mxfp4-pack-quantized"
MXFP8 = "mxfp8-quantized"
HF_FP8_BLOCK = "fp8-scale-inv"  # Hugging Face fine-grained FP8 (DeepSeek style)

# Companion tensors folded into a quantized module's logical `weight`.
COMPANION_SUFFIXES = (
    "weight_packed",
    "weight_scale",
    "weight_scale_inv",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
    "weight_global_scale",
)
_FP8_WEIGHT_DTYPES = {"F8_E4M3", "F8_E5M2"}
_FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

Fetch = Callable[[str], "torch.Tensor"]


# Dequantizers of formats that live in their own module (weightcheck.bnb registers bitsandbytes' on import), by
# QuantSpec.format: (qt, fetch, r0, r1, with_step) -> (values, step). This module never imports them.
EXTRA_FORMATS: dict[str, Callable[..., tuple[Any, Any]]] = {}


class QuantFormatError(ValueError):
    """Quantized tensors whose shapes or dtypes are inconsistent: they cannot be dequantized."""


@dataclass(frozen=True)
class QuantSpec:
    """How one module's weight is quantized, as far as dequantization needs to know."""

    format: str
    num_bits: int
    type: str  # "int" or "float"
    symmetric: bool = True
    strategy: str = "tensor"  # tensor, channel, group, tensor_group, block
    group_size: int | None = None
    block: tuple[int, int] | None = None
    has_g_idx: bool = False
    legacy_packing: bool = False  # CT < 0.18 packed 32//bits values per word, never across words

    def describe(self) -> str:
        kind = {
            PACK_QUANTIZED: f"INT{self.num_bits} packed",
            FLOAT_QUANTIZED: "FP8" if self.type == "float" else f"INT{self.num_bits}",
            NVFP4_PACKED: "NVFP4",
            MXFP4_PACKED: "MXFP4",
            MXFP8: "MXFP8",
            HF_FP8_BLOCK: "FP8 (weight_scale_inv)",
        }.get(self.format, self.format)
        detail = self.strategy
        if self.strategy in ("group", "tensor_group") and self.group_size:
            detail += f" {self.group_size}"
        if self.block:
            detail = f"block {self.block[0]}x{self.block[1]}"
        if self.type == "int":
            detail += ", symmetric" if self.symmetric else ", asymmetric"
        if self.has_g_idx:
            detail += ", g_idx"
        return f"{kind} ({detail})"


@dataclass
class QuantizedTensor:
    """One module's quantized weight: the logical `P.weight` and the stored tensors that make it up."""

    name: str  # logical name: "<module>.weight"
    module: str
    spec: QuantSpec
    parts: dict[str, str]  # role ("weight_packed", "weight_scale", ...) → stored tensor name
    shape: tuple[int, ...]  # logical (dequantized) shape
    out_dtype: str  # safetensors dtype of the dequantized values, as the reference produces them
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1] if self.shape else 1


# ---- finding quantized modules ------------------------------------------------------------------
def _config_quant(config: Mapping[str, Any]) -> dict[str, Any]:
    for holder in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        if isinstance(holder, Mapping):
            for key in ("quantization_config", "compression_config"):
                value = holder.get(key)
                if isinstance(value, Mapping):
                    return dict(value)
    return {}


def _config_group_sizes(qcfg: Mapping[str, Any]) -> list[int]:
    out: list[int] = []
    groups = qcfg.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            size = weights.get("group_size") if isinstance(weights, Mapping) else None
            if isinstance(size, int) and size > 0:
                out.append(size)
    return out


def _config_blocks(qcfg: Mapping[str, Any]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    candidates: list[Any] = [qcfg.get("weight_block_size")]
    groups = qcfg.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping):
                candidates.append(weights.get("block_structure"))
    for value in candidates:
        if isinstance(value, str) and re.fullmatch(r"\d+x\d+", value):  # legacy "128x128"
            value = [int(v) for v in value.split("x")]
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
            out.append((int(value[0]), int(value[1])))
    return out


def _legacy_version(qcfg: Mapping[str, Any]) -> bool:
    version = qcfg.get("version")
    if not isinstance(version, str):
        return False
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and (int(match.group(1)), int(match.group(2))) < (0, 18)


def find_quantized(
    infos: Mapping[str, TensorInfo], config: Mapping[str, Any] | None, read_small: Fetch
) -> tuple[dict[str, QuantizedTensor], dict[str, str]]:
    """Group stored tensors into quantized modules.

    `infos` are the stored tensors (header entries); `read_small(name)` reads a small tensor (only
    `weight_shape` is read). Returns (quantized tensors by logical name, malformed modules → reason).
    The stored names consumed by a quantized tensor are in its `parts`.
    """
    qcfg = _config_quant(config or {})
    found: dict[str, QuantizedTensor] = {}
    malformed: dict[str, str] = {}
    modules: dict[str, dict[str, str]] = {}
    for name in infos:
        module, _, leaf = name.rpartition(".")
        if leaf in COMPANION_SUFFIXES or leaf == "weight":
            modules.setdefault(module, {})[leaf] = name
    for module, parts in modules.items():
        if not ({"weight_packed", "weight_scale", "weight_scale_inv"} & set(parts)):
            continue  # a plain weight (or stray companions, left to the caller as plain tensors)
        if "weight_packed" not in parts and "weight" not in parts:
            continue
        try:
            qt = _build(module, parts, infos, qcfg, read_small)
        except QuantFormatError as exc:
            malformed[module] = str(exc)
            continue
        if qt is not None:
            found[qt.name] = qt
    return found, malformed


def _shape2(info: TensorInfo) -> tuple[int, int]:
    """(rows, cols) of a scale-like tensor: 0-D/1-D scales are one row."""
    if len(info.shape) == 0:
        return 1, 1
    if len(info.shape) == 1:
        return 1, info.shape[0]
    return math.prod(info.shape[:-1]), info.shape[-1]


def _strategy_from_scale(
    scale: TensorInfo, rows: int, cols: int, qcfg: Mapping[str, Any], *, allow_block: bool
) -> tuple[str, int | None, tuple[int, int] | None]:
    """Infer (strategy, group_size, block) from the scale's shape against the weight's (rows, cols)."""
    s_rows, s_cols = _shape2(scale)
    if math.prod(scale.shape) == 1:
        return "tensor", None, None
    if s_rows == rows and s_cols == 1:
        return "channel", None, None
    if s_rows == rows and s_cols > 1:
        for size in _config_group_sizes(qcfg):
            if math.ceil(cols / size) == s_cols:
                return "group", size, None
        if cols % s_cols == 0:
            return "group", cols // s_cols, None
        raise QuantFormatError(f"scale has {s_cols} groups per row, which does not divide {cols} columns")
    if allow_block:
        block = _infer_block(rows, cols, s_rows, s_cols, qcfg)
        if block is not None:
            return "block", None, block
    raise QuantFormatError(f"scale shape {list(scale.shape)} fits no strategy for a [{rows}, {cols}] weight")


def _infer_block(rows: int, cols: int, s_rows: int, s_cols: int, qcfg: Mapping[str, Any]) -> tuple[int, int] | None:
    for block in [*_config_blocks(qcfg), (128, 128)]:
        if math.ceil(rows / block[0]) == s_rows and math.ceil(cols / block[1]) == s_cols:
            return block
    if rows % s_rows == 0 and cols % s_cols == 0:
        return rows // s_rows, cols // s_cols
    return None


def _build(
    module: str, parts: dict[str, str], infos: Mapping[str, TensorInfo], qcfg: Mapping[str, Any], read_small: Fetch
) -> QuantizedTensor | None:
    name = f"{module}.weight" if module else "weight"
    info = {role: infos[stored] for role, stored in parts.items()}
    roles = {r: s for r, s in parts.items() if r != "weight" or "weight_packed" not in parts}

    if "weight_packed" in parts:
        packed = info["weight_packed"]
        scale = info.get("weight_scale")
        if scale is None:
            raise QuantFormatError("weight_packed without weight_scale")
        if packed.dtype == "I32":
            return _build_packed_int(name, module, roles, info, qcfg, read_small)
        if packed.dtype == "U8":
            if len(packed.shape) != 2:
                raise QuantFormatError(f"packed FP4 weight must be 2-D, got {list(packed.shape)}")
            rows, cols = packed.shape[0], packed.shape[1] * 2
            s_rows, s_cols = _shape2(scale)
            if s_rows != rows or s_cols == 0 or cols % s_cols:
                raise QuantFormatError(f"FP4 scale {list(scale.shape)} does not tile a [{rows}, {cols}] weight")
            if scale.dtype == "U8":
                spec = QuantSpec(MXFP4_PACKED, 4, "float", strategy="group", group_size=cols // s_cols)
            elif scale.dtype == "F8_E4M3" and "weight_global_scale" in info:
                spec = QuantSpec(NVFP4_PACKED, 4, "float", strategy="tensor_group", group_size=cols // s_cols)
            else:
                raise QuantFormatError(f"packed FP4 with a {scale.dtype} scale and no recognised layout")
            return QuantizedTensor(name, module, spec, roles, (rows, cols), "BF16")
        raise QuantFormatError(f"weight_packed of dtype {packed.dtype} is not a known packing")

    weight = info["weight"]
    if len(weight.shape) < 2:
        raise QuantFormatError(f"quantized weight must be at least 2-D, got {list(weight.shape)}")
    rows, cols = math.prod(weight.shape[:-1]), weight.shape[-1]
    if "weight_scale_inv" in info:
        scale = info["weight_scale_inv"]
        if weight.dtype not in _FP8_WEIGHT_DTYPES:
            raise QuantFormatError(f"weight_scale_inv next to a {weight.dtype} weight (expected FP8)")
        s_rows, s_cols = _shape2(scale)
        if math.prod(scale.shape) == 1:
            block = (rows, cols)
        else:
            per_expert = weight.shape[-2]
            experts = rows // per_expert
            found_block = _infer_block(per_expert, cols, s_rows // max(experts, 1), s_cols, qcfg)
            if found_block is None or s_rows % max(experts, 1):
                raise QuantFormatError(
                    f"weight_scale_inv {list(scale.shape)} does not tile weight {list(weight.shape)}"
                )
            block = found_block
        out = scale.dtype if scale.dtype in ("F32", "BF16", "F16", "F64") else "BF16"
        spec = QuantSpec(HF_FP8_BLOCK, 8, "float", strategy="block", block=block)
        return QuantizedTensor(name, module, spec, roles, tuple(weight.shape), out)

    scale = info["weight_scale"]
    if weight.dtype in _FP8_WEIGHT_DTYPES:
        qtype, bits = "float", 8
    elif weight.dtype in ("I8", "U8") and scale.dtype != "U8":
        qtype, bits = "int", 8
    else:
        raise QuantFormatError(f"{weight.dtype} weight with a {scale.dtype} weight_scale is not a known format")
    if scale.dtype == "U8":  # E8M0 exponents: MX format
        s_rows, s_cols = _shape2(scale)
        if s_rows != rows or cols % s_cols:
            raise QuantFormatError(f"MX scale {list(scale.shape)} does not tile weight {list(weight.shape)}")
        spec = QuantSpec(MXFP8, 8, "float", strategy="group", group_size=cols // s_cols)
        return QuantizedTensor(name, module, spec, roles, tuple(weight.shape), "BF16")
    if len(weight.shape) > 2 and math.prod(scale.shape) != 1 and len(scale.shape) != len(weight.shape):
        raise QuantFormatError(f"scale {list(scale.shape)} does not match a {len(weight.shape)}-D weight")
    strategy, group_size, block = _strategy_from_scale(scale, rows, cols, qcfg, allow_block=len(weight.shape) == 2)
    symmetric = "weight_zero_point" not in info
    spec = QuantSpec(FLOAT_QUANTIZED, bits, qtype, symmetric, strategy, group_size, block)
    return QuantizedTensor(name, module, spec, roles, tuple(weight.shape), scale.dtype)


def _build_packed_int(
    name: str,
    module: str,
    roles: dict[str, str],
    info: dict[str, TensorInfo],
    qcfg: Mapping[str, Any],
    read_small: Fetch,
) -> QuantizedTensor:
    packed = info["weight_packed"]
    scale = info["weight_scale"]
    if "weight_shape" not in info:
        raise QuantFormatError("weight_packed without weight_shape")
    shape_info = info["weight_shape"]
    if shape_info.dtype not in ("I64", "I32") or len(shape_info.shape) != 1 or not 2 <= shape_info.shape[0] <= 3:
        raise QuantFormatError(f"weight_shape must be a 2- or 3-element integer vector, got {shape_info.dtype}")
    shape = tuple(int(v) for v in read_small(roles["weight_shape"]).tolist())
    if any(d <= 0 for d in shape) or len(packed.shape) != len(shape) or packed.shape[:-1] != shape[:-1]:
        raise QuantFormatError(f"weight_shape {list(shape)} does not match weight_packed {list(packed.shape)}")
    rows, cols = math.prod(shape[:-1]), shape[-1]
    words = packed.shape[-1]
    bits_options = [b for b in (4, 8, 2, 1, 3, 5, 6, 7) if math.ceil(cols * b / 32) == words]
    legacy = [b for b in (4, 8, 2, 1, 3, 5, 6, 7) if math.ceil(cols / (32 // b)) == words]
    configured = _config_num_bits(qcfg)
    legacy_packing = False
    if configured in bits_options and not (configured in legacy and _legacy_version(qcfg)):
        bits = configured
    elif configured in legacy:
        bits, legacy_packing = configured, configured not in bits_options or _legacy_version(qcfg)
    elif bits_options:
        bits = bits_options[0]
    else:
        raise QuantFormatError(f"{words} packed words per row fit no bit width for {cols} columns")
    if len(scale.shape) > 2 and len(scale.shape) != len(shape):
        raise QuantFormatError(f"scale {list(scale.shape)} does not match weight_shape {list(shape)}")
    strategy, group_size, _ = _strategy_from_scale(scale, rows, cols, qcfg, allow_block=False)
    has_g_idx = "weight_g_idx" in info
    if has_g_idx:
        g_idx = info["weight_g_idx"]
        if len(g_idx.shape) != 1 or g_idx.shape[0] != cols or g_idx.dtype not in ("I32", "I64"):
            raise QuantFormatError(f"weight_g_idx {g_idx.dtype}{list(g_idx.shape)} must be an int vector of {cols}")
        if strategy not in ("group", "channel"):
            raise QuantFormatError("weight_g_idx with a per-tensor scale")
        strategy = "group"
    symmetric = "weight_zero_point" not in info
    if not symmetric:
        zp = info["weight_zero_point"]
        s_rows, s_cols = _shape2(scale)
        if strategy in ("group", "channel"):
            expected = (math.ceil(s_rows * bits / 32), s_cols) if not legacy_packing else None
            if zp.dtype != "I32" or (expected is not None and _shape2(zp) != expected):
                raise QuantFormatError(f"packed zero point {zp.dtype}{list(zp.shape)} does not match scale")
        elif math.prod(zp.shape) != math.prod(scale.shape):
            raise QuantFormatError(f"zero point {list(zp.shape)} does not match scale {list(scale.shape)}")
    spec = QuantSpec(PACK_QUANTIZED, bits, "int", symmetric, strategy, group_size, None, has_g_idx, legacy_packing)
    return QuantizedTensor(name, module, spec, roles, shape, scale.dtype)


def _config_num_bits(qcfg: Mapping[str, Any]) -> int | None:
    groups = qcfg.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            bits = weights.get("num_bits") if isinstance(weights, Mapping) else None
            if isinstance(bits, int) and weights.get("type", "int") == "int":
                return bits
    return None


# ---- unpacking -----------------------------------------------------------------------------------
def unpack_int32(packed: torch.Tensor, num_bits: int, cols: int, *, legacy: bool = False) -> torch.Tensor:
    """Unpack rows of int32 words into signed ints (int8), element i at bit i*num_bits of the row.

    Same layout as compressed-tensors `pack_to_int32` (dense since CT 0.18; `legacy=True` is the older
    32//num_bits-per-word layout). Values are stored offset by 2**(num_bits-1).
    """
    import torch

    words = packed.reshape(-1, packed.shape[-1]).to(torch.int64) & 0xFFFFFFFF
    mask = (1 << num_bits) - 1
    index = torch.arange(cols, dtype=torch.int64)
    if legacy:
        per_word = 32 // num_bits
        word_idx, offset = index // per_word, (index % per_word) * num_bits
        values = (words[:, word_idx] >> offset) & mask
    else:
        bit = index * num_bits
        word_idx, offset = bit // 32, bit % 32
        low = words[:, word_idx] >> offset
        straddle = (offset + num_bits > 32).nonzero().flatten()
        if straddle.numel():  # 3/5/6/7-bit values cross a word boundary
            high = words[:, word_idx[straddle] + 1] << (32 - offset[straddle])
            low[:, straddle] |= high
        values = low & mask
    return (values - (1 << (num_bits - 1))).to(torch.int8).reshape(*packed.shape[:-1], cols)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """E2M1 nibbles (low nibble first) → bf16 values, as CT's `unpack_fp4_from_uint8` (signed zeros kept)."""
    import torch

    flat = packed.reshape(-1)
    codes = torch.stack((flat & 0x0F, (flat & 0xF0) >> 4), dim=1).reshape(-1)
    negative = (codes & 0x08).to(torch.bool)
    magnitude = torch.tensor(_FP4_MAGNITUDES, dtype=torch.float32)[(codes & 0x07).long()]
    values = magnitude * torch.where(negative, -1.0, 1.0)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * 2).to(torch.bfloat16)


def e8m0_to_bf16(exponents: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent bytes → bf16 scales, as CT's `decompress_mx_scale` (2 ** (e - 127) in bf16)."""
    import torch

    return 2.0 ** (exponents.to(torch.int32) - 127).to(torch.bfloat16)


# ---- scale expansion -----------------------------------------------------------------------------
def _expand_columns(per_row: torch.Tensor, width: int | None, cols: int, g_idx: torch.Tensor | None) -> torch.Tensor:
    """[rows, groups] → [rows, cols]: column c takes group g_idx[c] (or c // width)."""
    if g_idx is not None:
        return per_row.index_select(1, g_idx)
    if per_row.shape[1] == 1:
        return per_row.expand(per_row.shape[0], cols)
    assert width is not None
    return per_row.repeat_interleave(width, dim=1)[:, :cols]


def _scale_rows(
    qt: QuantizedTensor, scale: torch.Tensor, r0: int, r1: int, g_idx: torch.Tensor | None = None
) -> torch.Tensor:
    """The scale (or zero point) expanded to the weight rows r0..r1, all columns."""
    import torch

    spec, cols = qt.spec, qt.cols
    if spec.strategy == "tensor" or scale.numel() == 1:
        return scale.reshape(1, 1).expand(r1 - r0, cols)
    if spec.strategy == "block":
        assert spec.block is not None
        bh, bw = spec.block
        per_expert = qt.shape[-2] if len(qt.shape) > 1 else 1
        blocks_per_expert = math.ceil(per_expert / bh)
        grid = scale.reshape(-1, scale.shape[-1])
        rows = torch.arange(r0, r1)
        index = (rows // per_expert) * blocks_per_expert + (rows % per_expert) // bh
        return _expand_columns(grid.index_select(0, index), bw, cols, None)
    grid = scale.reshape(-1, scale.shape[-1])[r0:r1]
    return _expand_columns(grid, spec.group_size, cols, g_idx)


# ---- dequantization ------------------------------------------------------------------------------
def dequantize_rows(
    qt: QuantizedTensor, fetch: Fetch, r0: int = 0, r1: int | None = None, *, with_step: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dequantize logical rows r0..r1 (of the weight viewed as [rows, cols]).

    Returns (values as the reference computes them, in `qt.out_dtype`; the quantization step per
    element in float32 when `with_step`). Raises QuantFormatError on inconsistent data.
    """
    import torch

    r1 = qt.rows if r1 is None else r1
    spec = qt.spec
    parts = qt.parts
    step: torch.Tensor | None = None
    if spec.format == PACK_QUANTIZED:
        scale = fetch(parts["weight_scale"])
        stored = fetch(parts["weight_packed"])
        packed = stored.reshape(-1, stored.shape[-1])[r0:r1]
        codes = unpack_int32(packed, spec.num_bits, qt.cols, legacy=spec.legacy_packing)
        g_idx = _g_idx(qt, fetch)
        scale_full = _scale_rows(qt, scale, r0, r1, g_idx)
        values = codes.to(scale.dtype)
        if not spec.symmetric:
            zero = _zero_point(qt, fetch)
            values = values - _scale_rows(qt, zero, r0, r1, g_idx).to(scale.dtype)
        values = values * scale_full
        if with_step:
            step = scale_full.to(torch.float32).abs()
        return values, step
    if spec.format == FLOAT_QUANTIZED:
        scale = fetch(parts["weight_scale"])
        weight = fetch(parts["weight"])
        codes = weight.reshape(-1, weight.shape[-1])[r0:r1]
        scale_full = _scale_rows(qt, scale, r0, r1)
        values = codes.to(scale.dtype)
        if not spec.symmetric:
            values = values - _scale_rows(qt, fetch(parts["weight_zero_point"]), r0, r1).to(scale.dtype)
        values = values * scale_full
        if with_step:
            unit = _fp8_ulp(codes) if spec.type == "float" else torch.ones((), dtype=torch.float32)
            step = unit * scale_full.to(torch.float32).abs()
        return values, step
    if spec.format in (NVFP4_PACKED, MXFP4_PACKED):
        packed = fetch(parts["weight_packed"])[r0:r1]
        codes = unpack_fp4(packed)
        raw_scale = fetch(parts["weight_scale"])
        if spec.format == MXFP4_PACKED:
            scale = e8m0_to_bf16(raw_scale).to(torch.bfloat16)
            scale_full = _scale_rows(qt, scale, r0, r1)
            values = (codes.to(scale.dtype) * scale_full).to(torch.bfloat16)
        else:
            # CT divides the bf16 block scale by the f32 global scale (promoting to f32), multiplies in
            # f32 and casts the product to bf16: the same ops in the same order give the same bits.
            scale = raw_scale.to(torch.bfloat16)
            effective = scale / fetch(parts["weight_global_scale"])
            scale_full = _scale_rows(qt, effective, r0, r1)
            values = (codes.to(effective.dtype) * scale_full).to(torch.bfloat16)
        if with_step:
            step = _fp4_ulp(codes) * scale_full.to(torch.float32).abs()
        return values, step
    if spec.format == MXFP8:
        weight = fetch(parts["weight"])
        codes = weight.reshape(-1, weight.shape[-1])[r0:r1]
        scale = e8m0_to_bf16(fetch(parts["weight_scale"]))
        scale_full = _scale_rows(qt, scale, r0, r1)
        values = codes.to(scale.dtype) * scale_full
        if with_step:
            step = _fp8_ulp(codes) * scale_full.to(torch.float32).abs()
        return values, step
    if spec.format == HF_FP8_BLOCK:
        weight = fetch(parts["weight"])
        codes = weight.reshape(-1, weight.shape[-1])[r0:r1]
        raw_scale = fetch(parts["weight_scale_inv"])
        if raw_scale.dtype == torch.uint8:  # UE8M0 exponent bytes
            scale32 = (raw_scale.to(torch.float32) - 127.0).exp2()
        else:
            scale32 = raw_scale.to(torch.float32)
        scale_full = _scale_rows(qt, scale32, r0, r1)
        out = getattr(torch, {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}[qt.out_dtype])
        values = (codes.to(torch.float32) * scale_full).to(out)
        if with_step:
            step = _fp8_ulp(codes) * scale_full.abs()
        return values, step
    other = EXTRA_FORMATS.get(spec.format)
    if other is not None:
        return other(qt, fetch, r0, r1, with_step)
    raise QuantFormatError(f"no dequantizer for format {spec.format}")


def dequantize(qt: QuantizedTensor, fetch: Fetch) -> torch.Tensor:
    """The whole dequantized weight, in its logical shape."""
    values, _ = dequantize_rows(qt, fetch)
    return values.reshape(qt.shape)


def _g_idx(qt: QuantizedTensor, fetch: Fetch) -> torch.Tensor | None:
    import torch

    if not qt.spec.has_g_idx:
        return None
    if "g_idx" not in qt._cache:
        g_idx = fetch(qt.parts["weight_g_idx"]).to(torch.int64)
        groups = _scale_groups(qt, fetch)
        if bool((g_idx == -1).any()):  # CT writes -1 when activation ordering was not used
            g_idx = None
        elif g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            raise QuantFormatError(f"weight_g_idx values outside [0, {groups})")
        qt._cache["g_idx"] = g_idx
    return qt._cache["g_idx"]


def _scale_groups(qt: QuantizedTensor, fetch: Fetch) -> int:
    scale = fetch(qt.parts["weight_scale"])
    return int(scale.shape[-1]) if scale.dim() else 1


def _zero_point(qt: QuantizedTensor, fetch: Fetch) -> torch.Tensor:
    """The unpacked zero point, [rows, groups] (CT packs it along dim 0 for group/channel strategies)."""
    if "zero" not in qt._cache:
        stored = fetch(qt.parts["weight_zero_point"])
        spec = qt.spec
        scale = fetch(qt.parts["weight_scale"])
        if spec.strategy in ("group", "channel") and stored.dim() >= 2:  # packed along dim 0
            groups = int(scale.shape[-1])
            packed_t = stored.reshape(-1, stored.shape[-1]).transpose(0, 1).contiguous()  # [groups, words]
            zero = unpack_int32(packed_t, spec.num_bits, qt.rows, legacy=spec.legacy_packing).transpose(0, 1)
            if zero.shape[1] != groups:
                raise QuantFormatError(f"zero point has {zero.shape[1]} groups, scale has {groups}")
        else:
            zero = stored
        qt._cache["zero"] = zero.contiguous()
    return qt._cache["zero"]


# ---- quantization steps (ULPs in the quantized domain) --------------------------------------------
def _fp8_ulp(codes: torch.Tensor) -> torch.Tensor:
    """One ULP of each FP8 code, in code units (e4m3: 2^(e-3); zeros and subnormals: the subnormal step)."""
    import torch

    from weightcheck.compare.ulp import float_ulp

    info = torch.finfo(codes.dtype)
    return float_ulp(codes.to(torch.float32), eps=info.eps, smallest_normal=info.smallest_normal)


def _fp4_ulp(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 spacing at each value: 0.5 below 2, 1 below 4, 2 above."""
    import torch

    magnitude = codes.to(torch.float32).abs()
    return torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0)).to(torch.float32)
