"""Quantization configs as their consumers read them, normalized into one `QuantSpec`.

Styles: compressed-tensors (`quantization_config` / `text_config.quantization_config` / legacy
`compression_config`), HF fine-grained FP8 (`quant_method: fp8`), AWQ, GPTQ, bitsandbytes, ModelOpt
(`hf_quant_config.json` `exclude_modules`, or flat `quant_method: modelopt` with `ignore`).

Validation of compressed-tensors configs uses a built-in mirror of the package's pydantic rules
(`validate_ct_mirror`), so lint never imports compressed-tensors (it pulls torch and transformers: seconds)
unless asked to (`--validate-with compressed-tensors`) or the mirror meets a name it does not know
(`validate_ct`). Tests cross-check the mirror against the package's own models on a table of configs.
"""

from __future__ import annotations

import math

from weightcheck.lightclass import dataclass, field
from weightcheck.names import is_index

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

CT_FORMATS = {
    "dense",
    "sparse-bitmask",
    "sparse-24-bitmask",
    "int-quantized",
    "float-quantized",
    "naive-quantized",
    "pack-quantized",
    "marlin-24",
    "mixed-precision",
    "nvfp4-pack-quantized",
    "mxfp4-pack-quantized",
    "mxfp8-quantized",
}
CT_STRATEGIES = {"tensor", "channel", "group", "block", "token", "tensor_group", "attn_head"}
CT_STATUSES = {"initialized", "calibration", "frozen", "compressed", "decompressed"}
CT_PRESETS = {
    "UNQUANTIZED", "W4A16", "W4A16_ASYM", "W8A8", "W4AFP8", "W8A16", "FP8", "FP8_DYNAMIC", "FP8_BLOCK",
    "NVFP4A16", "NVFP4", "MXFP4A16", "MXFP4", "MXFP8A16", "MXFP8",
    *(f"W{w}A{a}" for w in range(2, 9) for a in (4, 8, 16)),
}  # fmt: skip
_ARGS_KEYS = {
    "num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic", "actorder",
    "scale_dtype", "zp_dtype", "observer", "observer_kwargs",
}  # fmt: skip
_SCHEME_KEYS = {"targets", "weights", "input_activations", "output_activations", "format"}


@dataclass
class WeightScheme:
    """What one config group does to weights (the part the linter needs)."""

    name: str
    targets: list[str]
    num_bits: int | None = None
    type: str | None = None  # "int" | "float"
    strategy: str | None = None
    group_size: int | None = None
    block_structure: list[int] | None = None
    symmetric: bool = True
    actorder: Any = None
    format: str | None = None  # per-group format, else the config's
    has_input_activations: bool = False

    @property
    def quantizes_weights(self) -> bool:
        return self.num_bits is not None

    def describe(self) -> str:
        if not self.quantizes_weights:
            return "activations only"
        kind = {"int": "INT", "float": "FP"}.get(self.type or "", "?")
        detail = f"{kind}{self.num_bits} {self.strategy or ''}"
        if self.group_size and self.group_size > 0:
            detail += f" G={self.group_size}"
        if self.block_structure:
            detail += f" block={self.block_structure}"
        return detail.strip()


@dataclass
class QuantSpec:
    """A normalized quantization config: method, weight schemes, and the ignore list."""

    method: str  # compressed-tensors | fp8 | awq | gptq | bitsandbytes | modelopt | unknown
    source: str  # where it was found, e.g. "config.json:quantization_config"
    raw: dict[str, Any]
    ignore: list[str] = field(default_factory=list)
    ignore_field: str = "ignore"
    schemes: list[WeightScheme] = field(default_factory=list)
    format: str | None = None
    version: str | None = None
    # FP8: block size; None means per-tensor/channel.
    weight_block_size: list[int] | None = None
    problems: list[str] = field(default_factory=list)
    # Checks that could not run (a method whose weight format weightcheck does not model): warnings.
    unchecked: list[str] = field(default_factory=list)
    kv_cache: bool = False

    @property
    def targets(self) -> list[str]:
        return [t for s in self.schemes if s.quantizes_weights for t in s.targets]

    def bits(self) -> int | None:
        for s in self.schemes:
            if s.quantizes_weights:
                return s.num_bits
        return None


def find_quant_config(config: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The quantization config and its location, in vLLM's order of preference."""
    if isinstance(config.get("quantization_config"), dict):
        return config["quantization_config"], "config.json:quantization_config"
    for sub in ("text_config", "llm_config", "language_config"):
        inner = config.get(sub)
        if isinstance(inner, dict) and isinstance(inner.get("quantization_config"), dict):
            return inner["quantization_config"], f"config.json:{sub}.quantization_config"
    if isinstance(config.get("compression_config"), dict):
        return config["compression_config"], "config.json:compression_config"
    return None, ""


# quant_method values a consumer accepts. transformers 5.17: the keys of
# `transformers.quantizers.auto.AUTO_QUANTIZATION_CONFIG_MAPPING` (bitsandbytes_4bit/_8bit are spelled
# `bitsandbytes` in configs). SGLang 0.5.23: `sglang.srt.layers.quantization.QUANTIZATION_METHODS`. Both
# lists are cross-checked against the installed packages in tests (main suite and the SGLang group).
TRANSFORMERS_METHODS = frozenset({
    "gguf", "awq", "bitsandbytes", "eetq", "gptq", "aqlm", "quanto", "quark", "fouroversix", "fp_quant", "hqq",
    "compressed-tensors", "fbgemm_fp8", "higgs", "torchao", "bitnet", "vptq", "spqr", "fp8", "nvfp4", "mxfp8",
    "auto-round", "mxfp4", "metal", "sinq", "gemma",
})  # fmt: skip
SGLANG_METHODS = frozenset({  # BASE_QUANTIZATION_METHODS plus the per-platform additions (mxfp4, gptq, mlx)
    "fp8", "mxfp8", "minimax_m3_nvfp4", "blockwise_int8", "modelopt", "modelopt_fp8", "modelopt_fp4",
    "nvfp4_online", "modelopt_mixed", "w8a8_int8", "w8a8_fp8", "awq", "awq_marlin", "bitsandbytes", "gguf",
    "gptq_marlin", "moe_wna16", "compressed-tensors", "w4afp8", "petit_nvfp4", "quark", "quark_mxfp4",
    "auto-round", "auto-round-int8", "modelslim", "quark_int4fp8_moe", "humming", "mxfp_w4a8", "mxfp4", "gptq",
    "mlx_q4", "mlx_q8",
})  # fmt: skip
KNOWN_METHODS = TRANSFORMERS_METHODS | SGLANG_METHODS
# Spellings of the FP8 element format: `e4m3` (transformers' writer), the torch dtype names
# (`float8_e4m3fn`, as several FP8 releases spell it) and the fnuz variants. No consumer validates `fmt`
# (transformers' FineGrainedFP8Config and SGLang's Fp8Config never read it), so an odd one is a warning.
FP8_FMTS = frozenset({
    "e4m3", "e4m3fn", "e4m3fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "fp8_e4m3", "e5m2", "e5m2fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "fp8_e5m2",
})  # fmt: skip
# Methods whose ignore list is `modules_to_not_convert` as transformers reads it (substring of the
# module name) and whose weight format is one scheme over every Linear.
_MODULES_TO_NOT_CONVERT = {
    "mxfp4": (4, "float", "group", 32), "nvfp4": (4, "float", "tensor_group", 16), "mxfp8": (8, "float", "group", 32),
    "fbgemm_fp8": (8, "float", "channel", None), "eetq": (8, "int", "channel", None),
    "auto-round": (4, "int", "group", 128),
}  # fmt: skip


def parse_quant_spec(config: dict[str, Any], hf_quant_config: dict[str, Any] | None = None) -> QuantSpec | None:
    raw, source = find_quant_config(config)
    if raw is None and isinstance(hf_quant_config, dict) and isinstance(hf_quant_config.get("quantization"), dict):
        raw, source = hf_quant_config["quantization"], "hf_quant_config.json:quantization"
        return _modelopt(raw, source, field_name="exclude_modules")
    if raw is None:
        return None
    method = str(raw.get("quant_method", "")).lower()
    if method in ("compressed-tensors", "compressed_tensors") or ("config_groups" in raw and not method):
        return _compressed_tensors(raw, source)
    if not method and (raw.get("load_in_4bit") or raw.get("load_in_8bit")):
        method = "bitsandbytes"  # transformers' AutoQuantizationConfig: bnb configs may omit quant_method
    if method == "fp8":
        return _hf_fp8(raw, source)
    if method in ("modelopt", "modelopt_fp8", "modelopt_fp4", "modelopt_mixed"):
        spec = _modelopt(raw, source, field_name="ignore" if "ignore" in raw else "exclude_modules")
        # No quant_algo: the method name says the format. A quant_algo weightcheck does not model (MIXED_PRECISION,
        # whose per-layer formats come from `quantized_layers`) gets no guessed scheme: WC339 says so.
        if not spec.schemes and method != "modelopt_mixed" and not raw.get("quant_algo"):
            fp4 = method == "modelopt_fp4"
            spec.schemes.append(WeightScheme(method, ["Linear"], 4 if fp4 else 8, "float",
                                             "tensor_group" if fp4 else "tensor", 16 if fp4 else None))  # fmt: skip
        return spec
    if method in ("awq", "gptq", "bitsandbytes", "awq_marlin", "gptq_marlin"):
        return _simple(raw, source, method.removesuffix("_marlin"))
    if method in _MODULES_TO_NOT_CONVERT:
        return _one_scheme(raw, source, method)
    spec = QuantSpec(method=method or "unknown", source=source, raw=raw)
    spec.ignore_field = next((f for f in IGNORE_FIELDS if f in raw), "modules_to_not_convert")
    spec.ignore = _str_list(raw.get(spec.ignore_field), spec, spec.ignore_field)
    if method in KNOWN_METHODS:
        who = " and ".join(n for n, m in (("transformers", TRANSFORMERS_METHODS), ("SGLang", SGLANG_METHODS))
                           if method in m)  # fmt: skip
        spec.unchecked.append(f"quant_method {method!r} ({who} load it) has no weight-format model in weightcheck")
    else:
        spec.unchecked.append(f"unknown quant_method {raw.get('quant_method')!r} (neither transformers nor SGLang "
                              "registers it)")  # fmt: skip
    return spec


IGNORE_FIELDS = ("ignore", "modules_to_not_convert", "ignored_layers", "exclude_modules", "llm_int8_skip_modules")


def _one_scheme(raw: dict[str, Any], source: str, method: str) -> QuantSpec:
    """Methods with one weight format over every Linear and an ignore list read as `modules_to_not_convert`
    (mxfp4 as gpt-oss ships it: `{"quant_method": "mxfp4", "modules_to_not_convert": [...]}`)."""
    spec = QuantSpec(method=method, source=source, raw=raw)
    spec.ignore_field = next((f for f in IGNORE_FIELDS if f in raw), "modules_to_not_convert")
    spec.ignore = _str_list(raw.get(spec.ignore_field), spec, spec.ignore_field)
    bits, typ, strategy, group = _MODULES_TO_NOT_CONVERT[method]
    if isinstance(raw.get("bits"), int):
        bits = raw["bits"]
    if isinstance(raw.get("group_size"), int):
        group = raw["group_size"]
    spec.schemes.append(WeightScheme(method, ["Linear"], bits, typ, strategy, group))
    return spec


def _str_list(value: Any, spec: QuantSpec, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    spec.problems.append(f"{what} must be a list of strings, got {type(value).__name__}")
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _compressed_tensors(raw: dict[str, Any], source: str) -> QuantSpec:
    spec = QuantSpec(method="compressed-tensors", source=source, raw=raw)
    spec.ignore = _str_list(raw.get("ignore"), spec, "ignore")
    spec.format = raw.get("format") if isinstance(raw.get("format"), str) else None
    spec.version = raw.get("version") if isinstance(raw.get("version"), str) else None
    spec.kv_cache = isinstance(raw.get("kv_cache_scheme"), dict)
    groups = raw.get("config_groups")
    if not isinstance(groups, dict):
        return spec
    for name, group in groups.items():
        if isinstance(group, list):  # preset: {"W4A16": ["Linear"]}
            spec.schemes.append(_preset_scheme(name, group))
            continue
        if not isinstance(group, dict):
            continue
        weights = group.get("weights") if isinstance(group.get("weights"), dict) else None
        scheme = WeightScheme(
            name=name,
            targets=_targets(group.get("targets")),
            format=group.get("format") if isinstance(group.get("format"), str) else None,
            has_input_activations=isinstance(group.get("input_activations"), dict),
        )
        if weights:
            scheme.num_bits = weights.get("num_bits", 8) if isinstance(weights.get("num_bits", 8), int) else None
            scheme.type = weights.get("type", "int") if isinstance(weights.get("type", "int"), str) else None
            scheme.symmetric = bool(weights.get("symmetric", True))
            scheme.group_size = weights.get("group_size") if isinstance(weights.get("group_size"), int) else None
            strategy = weights.get("strategy")
            scheme.strategy = strategy if isinstance(strategy, str) and strategy else _infer_strategy(scheme.group_size)
            block = weights.get("block_structure")
            if isinstance(block, str) and "x" in block:
                block = [int(x) for x in block.split("x") if is_index(x)]
            ints = isinstance(block, list) and all(isinstance(b, int) and not isinstance(b, bool) for b in block)
            scheme.block_structure = block if ints else None
            scheme.actorder = weights.get("actorder")
        spec.schemes.append(scheme)
    return spec


def _targets(value: Any) -> list[str]:
    """`targets` as a list of strings whatever the file holds (`"Linear"`, `["Linear"]`, or a hostile `5`)."""
    if isinstance(value, str):
        return [value]
    return [t for t in value if isinstance(t, str)] if isinstance(value, list) else []


def _infer_strategy(group_size: int | None) -> str:
    if group_size is None:
        return "tensor"
    return "channel" if group_size == -1 else "group"


_PRESET_WEIGHTS: dict[str, tuple[int, str, str, int | None, list[int] | None, bool]] = {
    "W4A16": (4, "int", "group", 128, None, True),
    "W4A16_ASYM": (4, "int", "group", 128, None, False),
    "W8A16": (8, "int", "channel", None, None, True),
    "W8A8": (8, "int", "channel", None, None, True),
    "W4AFP8": (4, "int", "group", 128, None, True),
    "FP8": (8, "float", "tensor", None, None, True),
    "FP8_DYNAMIC": (8, "float", "channel", None, None, True),
    "FP8_BLOCK": (8, "float", "block", None, [128, 128], True),
    "NVFP4A16": (4, "float", "tensor_group", 16, None, True),
    "NVFP4": (4, "float", "tensor_group", 16, None, True),
    "MXFP4A16": (4, "float", "group", 32, None, True),
    "MXFP4": (4, "float", "group", 32, None, True),
    "MXFP8A16": (8, "float", "group", 32, None, True),
    "MXFP8": (8, "float", "group", 32, None, True),
}


def _preset_scheme(name: str, targets: list[Any]) -> WeightScheme:
    scheme = WeightScheme(name=name, targets=[t for t in targets if isinstance(t, str)])
    preset = _PRESET_WEIGHTS.get(name.upper())
    if preset:
        bits, typ, strategy, group, block, sym = preset
        scheme.num_bits, scheme.type, scheme.strategy = bits, typ, strategy
        scheme.group_size, scheme.block_structure, scheme.symmetric = group, block, sym
    return scheme


def _hf_fp8(raw: dict[str, Any], source: str) -> QuantSpec:
    spec = QuantSpec(method="fp8", source=source, raw=raw)
    # vLLM and SGLang read `ignored_layers` first, then `modules_to_not_convert`.
    if raw.get("ignored_layers") is not None:
        spec.ignore_field = "ignored_layers"
    else:
        spec.ignore_field = "modules_to_not_convert"
    spec.ignore = _str_list(raw.get(spec.ignore_field), spec, spec.ignore_field)
    block = raw.get("weight_block_size")
    if block is not None:
        if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
            spec.weight_block_size = block
        else:
            spec.problems.append(f"weight_block_size must be two positive integers, got {block!r}")
    fmt = raw.get("fmt")
    if fmt is not None and str(fmt).lower() not in FP8_FMTS:
        spec.unchecked.append(f"fmt {fmt!r} is not an FP8 element format weightcheck knows (e4m3, float8_e4m3fn, "
                              "e5m2...); no consumer validates it")  # fmt: skip
    scale_fmt = raw.get("scale_fmt")
    if scale_fmt is not None and scale_fmt not in ("float", "ue8m0"):
        spec.problems.append(f"scale_fmt {scale_fmt!r} is not 'float' or 'ue8m0' (transformers rejects it)")
    act = raw.get("activation_scheme", "dynamic")
    if not isinstance(act, str) or act.lower() not in ("dynamic", "static"):
        spec.problems.append(f"activation_scheme {act!r} is not dynamic or static")
    spec.schemes.append(
        WeightScheme(
            name="fp8",
            targets=["Linear"],
            num_bits=8,
            type="float",
            strategy="block" if spec.weight_block_size else "tensor",
            block_structure=spec.weight_block_size,
        )
    )
    return spec


def _modelopt(raw: dict[str, Any], source: str, field_name: str) -> QuantSpec:
    spec = QuantSpec(method="modelopt", source=source, raw=raw, ignore_field=field_name)
    spec.ignore = _str_list(raw.get(field_name), spec, field_name)
    algo = str(raw.get("quant_algo", "")).upper()
    if algo == "NVFP4":
        group = raw.get("group_size", 16)
        spec.schemes.append(WeightScheme("nvfp4", ["Linear"], 4, "float", "tensor_group", group))
    elif algo.startswith("FP8"):
        spec.schemes.append(WeightScheme("fp8", ["Linear"], 8, "float", "tensor"))
    elif algo:
        spec.unchecked.append(f"quant_algo {algo!r} has no weight-format model in weightcheck")
    return spec


def _simple(raw: dict[str, Any], source: str, method: str) -> QuantSpec:
    spec = QuantSpec(method=method, source=source, raw=raw)
    if method == "bitsandbytes":
        spec.ignore_field = "llm_int8_skip_modules"
        bits = 4 if raw.get("load_in_4bit") else 8
    elif method == "gptq":
        spec.ignore_field = "modules_to_not_convert"
        bits = raw.get("bits", 4)
    else:
        spec.ignore_field = "modules_to_not_convert"
        bits = raw.get("bits", raw.get("w_bit", 4))
    spec.ignore = _str_list(raw.get(spec.ignore_field), spec, spec.ignore_field)
    group = raw.get("group_size", raw.get("q_group_size"))
    spec.schemes.append(WeightScheme(method, ["Linear"], bits if isinstance(bits, int) else None, "int",
                                     "group" if isinstance(group, int) and group > 0 else "channel",
                                     group if isinstance(group, int) else None))  # fmt: skip
    return spec


# ---- compressed-tensors validation ---------------------------------------------------------------


def validate_ct_mirror(raw: dict[str, Any]) -> list[str]:
    """Pure-Python mirror of compressed-tensors' pydantic validation (QuantizationConfig, Scheme, Args).

    Returns human-readable problems; empty means "compressed-tensors would accept this".
    """
    problems: list[str] = []
    groups = raw.get("config_groups")
    if not isinstance(groups, dict):
        return ["config_groups is required and must be an object"]
    status = raw.get("quantization_status")
    if status is not None and status not in CT_STATUSES:
        problems.append(f"quantization_status {status!r} is not one of {sorted(CT_STATUSES)}")
    ignore = raw.get("ignore")
    if ignore is not None and not (isinstance(ignore, list) and all(isinstance(i, str) for i in ignore)):
        problems.append("ignore must be a list of strings")
    kv = raw.get("kv_cache_scheme")
    if kv is not None:
        problems += [f"kv_cache_scheme: {p}" for p in _validate_args(kv)]
    for name, group in groups.items():
        where = f"config_groups.{name}"
        if isinstance(group, list):
            if name.upper() not in CT_PRESETS:
                problems.append(f"{where}: {name!r} is not a compressed-tensors preset scheme")
            continue
        if not isinstance(group, dict):
            problems.append(f"{where} must be an object or a preset's target list")
            continue
        extra = set(group) - _SCHEME_KEYS
        if extra:
            problems.append(f"{where}: unknown keys {sorted(extra)} (QuantizationScheme forbids extras)")
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            problems.append(f"{where}.targets is required and must be a list of strings")
        fmt = group.get("format")
        if fmt is not None and (fmt not in CT_FORMATS or fmt == "mixed-precision"):
            problems.append(f"{where}.format {fmt!r} is not a valid per-group format")
        for part in ("weights", "input_activations", "output_activations"):
            args = group.get(part)
            if args is not None:
                problems += [f"{where}.{part}: {p}" for p in _validate_args(args, activations=part != "weights")]
    return problems


def _validate_args(args: Any, activations: bool = False) -> list[str]:
    if not isinstance(args, dict):
        return ["must be an object"]
    out: list[str] = []
    extra = set(args) - _ARGS_KEYS
    if extra:
        out.append(f"unknown keys {sorted(extra)} (QuantizationArgs forbids extras)")
    bits = args.get("num_bits", 8)
    if not isinstance(bits, int) or isinstance(bits, bool) or bits <= 0:
        out.append(f"num_bits {bits!r} must be a positive integer")
    typ = args.get("type", "int")
    if typ not in ("int", "float"):
        out.append(f"type {typ!r} must be int or float")
    strategy = args.get("strategy")
    if strategy is not None and strategy not in CT_STRATEGIES:
        out.append(f"strategy {strategy!r} is not one of {sorted(CT_STRATEGIES)}")
    group = args.get("group_size")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
        out.append(f"group_size {group!r} must be an integer")
        group = None
    block = args.get("block_structure")
    dynamic = args.get("dynamic", False)
    actorder = args.get("actorder")
    if strategy is None:
        if group is not None and group > 0:
            strategy = "group"
        elif group == -1:
            strategy = "channel"
        elif block is not None:
            strategy = "block"
        else:
            strategy = "tensor"
    if strategy in ("group", "tensor_group") and (group is None or group <= 0):
        out.append(f"strategy {strategy} needs a positive group_size")
    if group is not None and group > 0 and strategy not in ("group", "tensor_group"):
        out.append(f"group_size {group} needs strategy group or tensor_group, not {strategy}")
    if (strategy == "block") != (block is not None):
        out.append("strategy block and block_structure must be given together")
    if block is not None and not (
        (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block))
        or (isinstance(block, str) and len(block.split("x")) == 2 and all(is_index(x) for x in block.split("x")))
    ):
        out.append(f"block_structure {block!r} must be [rows, cols]")
    if actorder in ("group", "weight", "dynamic", "static", True) and strategy != "group" and actorder != "weight":
        out.append(f"actorder {actorder!r} needs strategy group")
    if actorder not in (None, False, True, "group", "weight", "dynamic", "static"):
        out.append(f"actorder {actorder!r} is not a valid activation ordering")
    if dynamic not in (True, False, "local"):
        out.append(f"dynamic {dynamic!r} must be true, false or 'local'")
    if dynamic == "local" and strategy != "tensor_group":
        out.append("dynamic 'local' needs strategy tensor_group")
    if dynamic is True and strategy not in ("token", "tensor", "tensor_group", "group"):
        out.append(f"dynamic quantization does not support strategy {strategy}")
    if dynamic is False and strategy == "token":
        out.append("static token quantization is not supported")
    return out


VALIDATORS = ("mirror", "compressed-tensors")
# Mirror findings about a name it does not know (a format, strategy, status or preset that a newer
# compressed-tensors may have added): the mirror cannot decide those, the installed package can.
_UNDECIDED = ("is not one of", "is not a valid per-group format", "is not a compressed-tensors preset")


def validate_ct(raw: dict[str, Any], validator: str = "mirror") -> list[str]:
    """Problems compressed-tensors would raise on this config. The mirror answers by default (importing
    compressed-tensors costs seconds: it imports torch and transformers); the package itself is asked when
    `validator == "compressed-tensors"` or when the mirror only objects to names it does not know. Without
    the package installed, the mirror's answer stands."""
    problems = validate_ct_mirror(raw)
    undecided = any(marker in p for p in problems for marker in _UNDECIDED)
    if validator == "compressed-tensors" or undecided:
        real = validate_with_compressed_tensors(raw)
        if real is not None:
            return real
    return problems


def validate_with_compressed_tensors(raw: dict[str, Any]) -> list[str] | None:
    """Validate with compressed-tensors' own QuantizationConfig; None when the package is not installed."""
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        return None
    try:
        QuantizationConfig.model_validate(raw)
    except Exception as exc:  # pydantic ValidationError, KeyError for unknown presets, ...
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return [" / ".join(lines[:4])[:400] or type(exc).__name__]
    return []


def packed_width(in_features: int, bits: int, version: str | None) -> int:
    """int32 columns of a packed weight. CT >= 0.18 packs densely; before, ceil(in / (32 // bits))."""
    dense = True
    if version:
        parts = version.split(".")
        try:
            dense = (int(parts[0]), int(parts[1])) >= (0, 18)
        except (ValueError, IndexError):
            dense = True
    return math.ceil(in_features * bits / 32) if dense else math.ceil(in_features / (32 // bits))
