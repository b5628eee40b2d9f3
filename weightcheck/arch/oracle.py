"""What transformers' own model class writes for a config: tensor names and shapes, no weights.

The model is built from the config on the meta device (no memory for weights, ~50 ms for a tiny model) and
its state dict is put through the same steps `save_pretrained` applies before writing (transformers 5.17,
`PreTrainedModel.save_pretrained`): `_keys_to_ignore_on_save` dropped, tied weights removed
(`remove_tied_weights_from_state_dict`), then `revert_weight_conversion`, the key renames and tensor
conversions (expert splits, transposes) that give the on-disk names. Checked against real
`save_pretrained` output in tests/test_arch_oracle.py.

Used by the tests (the conformance oracle) and by lint for a config outside what a generated pattern was
validated on (`weightcheck.patterns.fit_to_config`), only when transformers is installed. Needs torch.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

# A config.json is untrusted: bound what the meta build may be asked to construct (a meta model still
# allocates one Python object per module). DeepSeek-V3's 61 layers x 256 experts is the largest real case.
MAX_LAYERS = 512
MAX_EXPERT_MODULES = 200_000
# Config keys the meta build must not see: it builds the unquantized model (quantization companions are
# folded onto `weight` by lint's rules) and never the auto-map's remote code.
_DROP = ("quantization_config", "auto_map", "compression_config")


class OracleError(RuntimeError):
    """The model class could not be built for this config (named in a lint note)."""


def _decode_floats(value: Any) -> Any:
    """transformers writes non-finite floats as `{"__float__": "Infinity"}` (Mamba's `time_step_limit`) and
    reads them back when it loads config.json itself; a dict handed to `from_dict` must be decoded first."""
    if isinstance(value, dict):
        if set(value) == {"__float__"} and value["__float__"] in ("Infinity", "-Infinity", "NaN"):
            return float(value["__float__"].lower().replace("infinity", "inf"))
        return {k: _decode_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_floats(v) for v in value]
    return value


def _build_config(config: dict[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise OracleError(f"transformers has no config class for model_type {model_type!r}")
    data = {k: _decode_floats(copy.deepcopy(v)) for k, v in config.items() if k not in _DROP}
    for sub in ("text_config", "llm_config", "language_config"):
        if isinstance(data.get(sub), dict):
            for k in _DROP:
                data[sub].pop(k, None)
    return CONFIG_MAPPING[model_type].from_dict(data)


def _check_size(cfg: Any) -> None:
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers = getattr(text, "num_hidden_layers", None)
    if layers is None and isinstance(getattr(text, "layers_block_type", None), list):
        layers = len(text.layers_block_type)
    experts = 0
    for key in ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"):
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            experts = max(experts, value)
    if not isinstance(layers, int) or not 0 < layers <= MAX_LAYERS or (layers * max(experts, 1)) > MAX_EXPERT_MODULES:
        raise OracleError(f"config too large for a meta build ({layers} layers x {experts} experts)")


def model_class(config: Any) -> Any:
    """The auto class transformers uses for this config: causal LM, else image-text-to-text."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    if config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    raise KeyError(config.model_type)


def meta_model(config: dict[str, Any] | Any, class_name: str | None = None) -> Any:
    """The auto model class (causal LM, else image-text-to-text, as the generator uses) on the meta device; or,
    given `class_name`, that transformers class (a task-head or base class the pattern was fitted to: the caller
    names only classes weightcheck's task-head table was built from)."""
    import torch

    logging.getLogger("transformers").setLevel(logging.ERROR)
    cfg = _build_config(config) if isinstance(config, dict) else config
    _check_size(cfg)
    if class_name is not None:
        import transformers

        cls = getattr(transformers, class_name, None)
        if cls is None:
            raise OracleError(f"transformers has no class {class_name!r}")
        with torch.device("meta"):
            return cls(cfg)
    auto = model_class(cfg)
    with torch.device("meta"):
        return auto.from_config(cfg)


def saved_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} as `save_pretrained` would write the model (meta tensors: no data touched)."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or []:
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, model)
    state = revert_weight_conversion(model, state)
    return {name: tuple(int(d) for d in t.shape) for name, t in state.items()}


def module_kinds(model: Any, names: list[str]) -> dict[str, str]:
    """On-disk module name -> coarse kind from the instantiated class (linear, embedding, norm, conv, other),
    for modules the pattern does not name."""
    import torch

    modules = dict(model.named_modules())
    out: dict[str, str] = {}
    for name in names:
        module = name.rsplit(".", 1)[0]
        owner = modules.get(module)
        cls = type(owner).__name__ if owner is not None else ""
        if isinstance(owner, torch.nn.Linear):
            out[module] = "linear"
        elif isinstance(owner, torch.nn.Embedding):
            out[module] = "embedding"
        elif "Norm" in cls:
            out[module] = "norm"
        elif "Conv" in cls:
            out[module] = "conv"
        else:
            out[module] = "other"
    return out


def expected_tensors(
    config: dict[str, Any], class_name: str | None = None
) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """(names -> shapes, module -> kind) for a config.json dict (`class_name`: see `meta_model`). Raises
    OracleError when it cannot be built."""
    try:
        model = meta_model(config, class_name)
        shapes = saved_shapes(model)
    except OracleError:
        raise
    except Exception as exc:  # a config the class rejects, or a class that needs a device: named in the note
        raise OracleError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    return shapes, module_kinds(model, list(shapes))


def full_config_dict(config: Any) -> dict[str, Any]:
    """The config as save_pretrained's config.json would hold it with every key written (no diff)."""
    import json

    return json.loads(config.to_json_string(use_diff=False))


def build_config(config: dict[str, Any]) -> Any:
    """A transformers config object from a config.json dict (quantization config dropped)."""
    return _build_config(config)
