"""GPTQ, AWQ and AutoRound's `qweight` packing, for `diff`: found in the stored names and shapes, and dequantized
as the packers define it (tests/test_autoround.py checks it, code for code, against the compressed-tensors
export of the same AutoRound run, whose dequantizer matches compressed-tensors' own bit for bit).

- GPTQ (auto_gptq / gptqmodel; AutoRound's `auto_gptq` and `auto_round` exports): `qweight` int32
  `[in * bits / 32, out]`, input `i`'s code in word `i // (32 / bits)` at bit `bits * (i % (32 / bits))`;
  `qzeros` int32 `[groups, out * bits / 32]`, packed the same way along the output; `scales` `[groups, out]`;
  `g_idx` `[in]` (the group of each input; `i // group_size` without it). The v1 format (every checkpoint
  without `"checkpoint_format": "gptq_v2"`) stores each zero point minus one.
- AWQ (GEMM; AutoRound's `auto_awq` export): `qweight` int32 `[in, out / 8]`, `qzeros` `[groups, out / 8]`, the
  8 codes of a word in the order `[0, 2, 4, 6, 1, 3, 5, 7]` of their output columns; zero points as they are.

Value = (code - zero) * scale, in the scale's dtype (the integer difference is exact). 4-bit and 8-bit (GPTQ);
4-bit (AWQ). Anything else (3-bit GPTQ's word-straddling packing, a shape that fits neither layout) is left to
the caller as not dequantizable. Nothing from auto_gptq, gptqmodel or autoawq is imported."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from weightcheck.dequant import EXTRA_FORMATS, Fetch, QuantFormatError, QuantizedTensor, QuantSpec
from weightcheck.safetensors_header import TensorInfo

if TYPE_CHECKING:
    import torch

GPTQ = "gptq-qweight"
AWQ = "awq-qweight"
# AWQ packs the 8 output columns of a word in the order 0, 2, 4, 6, 1, 3, 5, 7: column k sits at shift slot
# _AWQ_SLOT[k] (the inverse permutation; AutoAWQ's AWQ_REVERSE_ORDER, AutoRound's `new_order_map`).
_AWQ_SLOT = [0, 4, 1, 5, 2, 6, 3, 7]
_FLOATS = {"F16": "F16", "BF16": "BF16", "F32": "F32"}


def _config_bits(config: Mapping[str, Any]) -> tuple[int | None, bool]:
    """(bits, GPTQ zero points stored minus one) from a config's quantization_config."""
    holder = config.get("quantization_config") if isinstance(config, Mapping) else None
    if not isinstance(holder, Mapping):
        text = config.get("text_config") if isinstance(config, Mapping) else None
        holder = text.get("quantization_config") if isinstance(text, Mapping) else None
    if not isinstance(holder, Mapping):
        return None, True
    bits = holder.get("bits", holder.get("w_bit"))
    bits = bits if isinstance(bits, int) and not isinstance(bits, bool) else None
    return bits, holder.get("checkpoint_format") != "gptq_v2"


class Unsupported(QuantFormatError):
    """A qweight packing this module does not read (3-bit GPTQ, AWQ at other widths): not compared, not malformed."""


def find(
    infos: Mapping[str, TensorInfo], config: Mapping[str, Any] | None
) -> tuple[dict[str, QuantizedTensor], dict[str, str], dict[str, str]]:
    """qweight-packed modules: (quantized tensors by logical name, malformed → reason, unsupported → reason)."""
    found: dict[str, QuantizedTensor] = {}
    malformed: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    bits_cfg, minus_one = _config_bits(config or {})
    for name in infos:
        module, _, leaf = name.rpartition(".")
        if leaf != "qweight" or f"{module}.scales" not in infos or f"{module}.weight" in infos:
            continue
        parts = {"qweight": name, "scales": f"{module}.scales"}
        for extra in ("qzeros", "g_idx"):
            if f"{module}.{extra}" in infos:
                parts[extra] = f"{module}.{extra}"
        try:
            found[f"{module}.weight"] = _build(module, parts, infos, bits_cfg, minus_one)
        except Unsupported as exc:
            unsupported[module] = str(exc)
        except QuantFormatError as exc:
            malformed[module] = str(exc)
    return found, malformed, unsupported


def _build(
    module: str, parts: dict[str, str], infos: Mapping[str, TensorInfo], bits: int | None, minus_one: bool
) -> QuantizedTensor:
    qweight, scales = infos[parts["qweight"]], infos[parts["scales"]]
    if qweight.dtype != "I32" or len(qweight.shape) != 2 or len(scales.shape) != 2 or scales.dtype not in _FLOATS:
        raise QuantFormatError(
            f"qweight {qweight.dtype}{list(qweight.shape)} / scales {scales.dtype}{list(scales.shape)}: not a packing"
        )
    groups, out = scales.shape
    rows, cols = qweight.shape
    if cols == out and bits in (4, 8):  # GPTQ: packed along the input
        layout, per_word = GPTQ, 32 // bits
        in_features = rows * per_word
    elif cols * 8 == out and bits in (4, None):  # AWQ GEMM: packed along the output, 4-bit
        layout, per_word, bits = AWQ, 8, 4
        in_features = rows
    else:
        raise Unsupported(
            f"qweight {list(qweight.shape)} with scales {list(scales.shape)} and {bits}-bit codes: no dequantizer "
            "for this packing (GPTQ 4/8-bit and AWQ 4-bit GEMM are read)"
        )
    if groups == 0 or (in_features % groups and "g_idx" not in parts):
        raise QuantFormatError(f"{groups} scale groups do not divide {in_features} inputs")
    qzeros = infos.get(parts.get("qzeros", ""))
    if qzeros is not None and (qzeros.dtype != "I32" or tuple(qzeros.shape) != (groups, out // per_word)):
        raise QuantFormatError(f"qzeros {qzeros.dtype}{list(qzeros.shape)} does not fit {groups} groups of {out}")
    g_idx = infos.get(parts.get("g_idx", ""))
    if g_idx is not None and (g_idx.dtype != "I32" or tuple(g_idx.shape) != (in_features,)):
        raise QuantFormatError(f"g_idx {g_idx.dtype}{list(g_idx.shape)} is not one group per input ({in_features})")
    spec = QuantSpec(layout, bits, "int", symmetric=qzeros is None, strategy="group",
                     group_size=in_features // groups)  # fmt: skip
    qt = QuantizedTensor(f"{module}.weight", module, spec, parts, (out, in_features), _FLOATS[scales.dtype])
    qt._cache["zero_offset"] = 1 if (layout == GPTQ and minus_one) else 0
    return qt


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., n] int32 words → [..., n * 32 / bits] codes, lowest bits first."""
    import torch

    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(*words.shape[:-1], words.shape[-1] * per_word)


def _awq_columns(words: torch.Tensor) -> torch.Tensor:
    """[..., n] AWQ words → [..., 8n] 4-bit codes in output-column order."""
    return _unpack(words, 4).reshape(*words.shape, 8)[..., _AWQ_SLOT].reshape(*words.shape[:-1], -1)


def dequantize_rows(
    qt: QuantizedTensor, fetch: Fetch, r0: int, r1: int, with_step: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Output rows (channels) r0..r1 of the `[out, in]` weight, and the quantization step (the scale)."""
    import torch

    spec, parts = qt.spec, qt.parts
    scales = fetch(parts["scales"])
    if spec.format == GPTQ:
        codes = _unpack(fetch(parts["qweight"])[:, r0:r1].t().contiguous(), spec.num_bits)  # [rows, in]
    else:
        w0, w1 = r0 // 8, -(-r1 // 8)  # the words holding output columns r0..r1 of qweight [in, out / 8]
        codes = _awq_columns(fetch(parts["qweight"])[:, w0:w1])[:, r0 - 8 * w0 : r1 - 8 * w0].t()  # [rows, in]
    group = _groups(qt, fetch)  # [in]
    scale = scales[:, r0:r1].t()[:, group]  # [rows, in]
    zero = _zeros(qt, fetch, r0, r1)[:, group] if "qzeros" in parts else (1 << (spec.num_bits - 1))
    values = (codes.to(torch.int32) - zero).to(scales.dtype) * scale
    step = scale.to(torch.float32).abs() if with_step else None
    return values, step


def _groups(qt: QuantizedTensor, fetch: Fetch) -> torch.Tensor:
    import torch

    if "groups" not in qt._cache:
        in_features = qt.shape[1]
        if "g_idx" in qt.parts:
            g_idx = fetch(qt.parts["g_idx"]).to(torch.int64)
            groups = fetch(qt.parts["scales"]).shape[0]
            if bool(((g_idx < 0) | (g_idx >= groups)).any()):
                raise QuantFormatError(f"g_idx names a group outside 0..{groups - 1}")
            qt._cache["groups"] = g_idx
        else:
            qt._cache["groups"] = torch.arange(in_features) // (qt.spec.group_size or in_features)
    return qt._cache["groups"]


def _zeros(qt: QuantizedTensor, fetch: Fetch, r0: int, r1: int) -> torch.Tensor:
    """Zero points of output rows r0..r1, per group: [rows, groups]."""
    import torch

    packed = fetch(qt.parts["qzeros"])
    unpack = _unpack(packed, qt.spec.num_bits) if qt.spec.format == GPTQ else _awq_columns(packed)
    return unpack[:, r0:r1].t().to(torch.int32) + qt._cache["zero_offset"]


EXTRA_FORMATS[GPTQ] = EXTRA_FORMATS[AWQ] = dequantize_rows
