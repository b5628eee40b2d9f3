"""bitsandbytes checkpoints as transformers saves them, for `diff`: found in the stored names and dequantized bit
for bit like bitsandbytes' own default kernels (tests/test_bitsandbytes.py compares with
`bitsandbytes.functional.dequantize_4bit` and `int8_vectorwise_dequant`).

- 4-bit (NF4 / FP4, `load_in_4bit`): `<m>.weight` holds the codes of the `[out, in]` weight two per byte (high
  nibble first), as uint8 or viewed as the storage dtype; beside it `<m>.weight.absmax` (one per block of
  `blocksize` elements), `<m>.weight.quant_map` (the 16 code values), `<m>.weight.quant_state.bitsandbytes__nf4`
  (a uint8 tensor holding JSON: quant_type, blocksize, dtype, shape) and, double-quantized, uint8 absmax codes
  with `<m>.weight.nested_absmax` / `<m>.weight.nested_quant_map` (the JSON adds nested_blocksize, nested_offset).
  Value = quant_map[code] * absmax[block] in float32, cast to the state's dtype (`_dequantize_4bit_compute`).
- 8-bit (LLM.int8, `load_in_8bit`): `<m>.weight` int8 `[out, in]`, `<m>.SCB` float32 `[out]` (row absmax) and a
  `<m>.weight_format` tag. Value = weight * SCB[row] * (1/127) in float32 (`int8_vectorwise_dequant`).

Nothing from bitsandbytes is imported: the package is optional (and large)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from weightcheck.dequant import EXTRA_FORMATS, Fetch, QuantFormatError, QuantizedTensor, QuantSpec
from weightcheck.safetensors_header import DTYPE_BITS, TensorInfo

if TYPE_CHECKING:
    import torch

BNB_4BIT = "bnb-4bit"
BNB_INT8 = "bnb-int8"
_BLOBS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
_QUANT_STATE = "quant_state.bitsandbytes__"
_OUT_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_INT8_SCALE = 7.874015718698502e-3  # bitsandbytes' 1/127 as it writes it
_MAX_STATE_BYTES = 4096


def find(infos: Mapping[str, TensorInfo], read_small: Fetch) -> tuple[dict[str, QuantizedTensor], dict[str, str]]:
    """bitsandbytes modules among the stored tensors: (quantized tensors by logical name, malformed → reason)."""
    found: dict[str, QuantizedTensor] = {}
    malformed: dict[str, str] = {}
    four: dict[str, dict[str, str]] = {}
    for name in infos:
        module, sep, tail = name.partition(".weight.")
        if not sep:
            continue
        if tail.startswith(_QUANT_STATE):
            four.setdefault(module, {})["quant_state"] = name
        elif tail in _BLOBS:
            four.setdefault(module, {})[tail] = name
    for module, parts in four.items():
        if f"{module}.weight" in infos:
            parts["weight"] = f"{module}.weight"
        try:
            qt = _build_4bit(module, parts, infos, read_small)
        except QuantFormatError as exc:
            malformed[module] = str(exc)
            continue
        found[qt.name] = qt
    for name, info in infos.items():
        module, _, leaf = name.rpartition(".")
        weight = infos.get(f"{module}.weight")
        if leaf != "SCB" or weight is None or weight.dtype != "I8":
            continue
        parts = {"weight": f"{module}.weight", "SCB": name}
        if f"{module}.weight_format" in infos:
            parts["weight_format"] = f"{module}.weight_format"
        if len(weight.shape) != 2 or tuple(info.shape) != (weight.shape[0],):
            malformed[module] = f"SCB {list(info.shape)} is not one scale per row of weight {list(weight.shape)}"
            continue
        spec = QuantSpec(BNB_INT8, 8, "int", strategy="channel")
        found[f"{module}.weight"] = QuantizedTensor(f"{module}.weight", module, spec, parts, tuple(weight.shape), "F32")
    return found, malformed


def _build_4bit(
    module: str, parts: dict[str, str], infos: Mapping[str, TensorInfo], read_small: Fetch
) -> QuantizedTensor:
    missing = [role for role in ("weight", "absmax", "quant_map", "quant_state") if role not in parts]
    if missing:
        raise QuantFormatError(f"bitsandbytes 4-bit module without {', '.join(missing)}")
    blob = infos[parts["quant_state"]]
    if blob.dtype != "U8" or math.prod(blob.shape) > _MAX_STATE_BYTES:
        raise QuantFormatError(f"quant_state is {blob.dtype}{list(blob.shape)}, not a small uint8 JSON blob")
    try:
        state = json.loads(read_small(parts["quant_state"]).numpy().tobytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise QuantFormatError(f"quant_state is not JSON: {str(exc)[:80]}") from None
    if not isinstance(state, dict):
        raise QuantFormatError("quant_state is not a JSON object")
    shape, blocksize, dtype = state.get("shape"), state.get("blocksize"), state.get("dtype")
    if not (
        isinstance(shape, list)
        and shape
        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        and isinstance(blocksize, int)
        and not isinstance(blocksize, bool)
        and blocksize > 0
        and isinstance(dtype, str)
        and dtype in _OUT_DTYPES
        and state.get("quant_type") in ("nf4", "fp4")
    ):
        raise QuantFormatError(f"quant_state {str(state)[:120]} lacks a valid shape, blocksize, dtype or quant_type")
    n = math.prod(shape)
    weight = infos[parts["weight"]]
    stored_bytes = math.prod(weight.shape) * DTYPE_BITS.get(weight.dtype, 8) // 8
    if stored_bytes < (n + 1) // 2:
        raise QuantFormatError(f"weight {weight.dtype}{list(weight.shape)} holds fewer than the {n} codes of {shape}")
    blocks = -(-n // blocksize)
    if math.prod(infos[parts["absmax"]].shape) != blocks or math.prod(infos[parts["quant_map"]].shape) != 16:
        raise QuantFormatError(f"absmax / quant_map do not fit {blocks} blocks of {blocksize} and 16 codes")
    if "nested_offset" in state or "nested_absmax" in parts:
        nested = state.get("nested_blocksize")
        offset = state.get("nested_offset")
        if not (
            isinstance(nested, int)
            and nested > 0
            and isinstance(offset, (int, float))
            and not isinstance(offset, bool)
            and math.isfinite(offset)
            and _OUT_DTYPES.get(str(state.get("nested_dtype", "float32"))) is not None
        ):
            raise QuantFormatError("double-quantized quant_state lacks a valid nested_blocksize, offset or dtype")
        if "nested_absmax" not in parts or "nested_quant_map" not in parts:
            raise QuantFormatError("double-quantized module without nested_absmax / nested_quant_map")
        if math.prod(infos[parts["nested_absmax"]].shape) != -(-blocks // nested):
            raise QuantFormatError(f"nested_absmax does not fit {blocks} absmax codes in blocks of {nested}")
    spec = QuantSpec(BNB_4BIT, 4, "float", strategy="group", group_size=blocksize)
    qt = QuantizedTensor(f"{module}.weight", module, spec, parts, tuple(shape), _OUT_DTYPES[dtype])
    qt._cache["bnb_state"] = state
    return qt


def dequantize_rows(
    qt: QuantizedTensor, fetch: Fetch, r0: int, r1: int, with_step: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logical rows r0..r1 as bitsandbytes' default kernels compute them (and the quantization step)."""
    import torch

    if qt.spec.format == BNB_INT8:
        weight = fetch(qt.parts["weight"])[r0:r1]
        scb = fetch(qt.parts["SCB"])[r0:r1].view(-1, 1)
        values = weight * scb * _INT8_SCALE
        step = (scb.to(torch.float32).abs() * _INT8_SCALE).expand(values.shape) if with_step else None
        return values, step
    state = qt._cache["bnb_state"]
    cols, blocksize = qt.cols, state["blocksize"]
    e0, e1 = r0 * cols, r1 * cols
    raw = fetch(qt.parts["weight"]).reshape(-1).view(torch.uint8)
    b0, b1 = e0 // 2, (e1 + 1) // 2
    pairs = raw[b0:b1].to(torch.int64)
    codes = torch.empty(pairs.numel() * 2, dtype=torch.int64)
    codes[0::2] = pairs >> 4
    codes[1::2] = pairs & 0xF
    codes = codes[e0 - 2 * b0 : e0 - 2 * b0 + (e1 - e0)]
    table = fetch(qt.parts["quant_map"]).reshape(-1).to(torch.float32)
    scale = _absmax(qt, fetch)[torch.arange(e0, e1) // blocksize]
    out = getattr(torch, state["dtype"])
    values = (table[codes] * scale).to(out).reshape(r1 - r0, *qt.shape[1:])
    step = None
    if with_step:
        step = (_gaps(table)[codes] * scale.abs()).reshape(values.shape)
    return values, step


def _absmax(qt: QuantizedTensor, fetch: Fetch) -> torch.Tensor:
    """Per-block absmax in float32; double quantization undone as `dequantize_4bit` does it."""
    import torch

    if "absmax" not in qt._cache:
        state = qt._cache["bnb_state"]
        absmax = fetch(qt.parts["absmax"]).reshape(-1)
        if "nested_absmax" in qt.parts:
            nested = fetch(qt.parts["nested_absmax"]).reshape(-1).to(torch.float32)
            table = fetch(qt.parts["nested_quant_map"]).reshape(-1).to(torch.float32)
            size = state["nested_blocksize"]
            absmax = table[absmax.to(torch.int64)] * nested[torch.arange(absmax.numel()) // size]
            absmax = absmax.to(getattr(torch, state.get("nested_dtype", "float32")))  # validated in _build_4bit
            absmax += state["nested_offset"]
        qt._cache["absmax"] = absmax.to(torch.float32)
    return qt._cache["absmax"]


def _gaps(table: torch.Tensor) -> torch.Tensor:
    """For each of the 16 codes, the larger distance to its neighbours in value: the quantization step there."""
    import torch

    order = torch.argsort(table)
    ranked = table[order]
    gap = torch.zeros_like(ranked)
    diffs = ranked[1:] - ranked[:-1]
    gap[1:] = diffs
    gap[:-1] = torch.maximum(gap[:-1], diffs)
    out = torch.empty_like(gap)
    out[order] = gap
    return out


EXTRA_FORMATS[BNB_4BIT] = EXTRA_FORMATS[BNB_INT8] = dequantize_rows
