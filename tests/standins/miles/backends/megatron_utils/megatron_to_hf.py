"""miles `megatron_to_hf/__init__.py`: `convert_to_hf(args, model_name, name, param, quantization_config)`
turns one Megatron parameter into its HF `(name, tensor)` list. The stand-in model's names are HF names
under `module.module.decoder.`."""

from __future__ import annotations

from typing import Any


def convert_to_hf(args: Any, model_name: str, name: str, param: Any, quantization_config: Any = None, **_: Any) -> list:
    return [(name.removeprefix("module.module.decoder."), param)]
