"""slime `update_weight/hf_weight_iterator_base.py`."""

from __future__ import annotations

from typing import Any


class HfWeightIteratorBase:
    @staticmethod
    def create(args: Any, model: Any, **kwargs: Any) -> Any:
        from .hf_weight_iterator_direct import HfWeightIteratorDirect

        return HfWeightIteratorDirect(args, model, **kwargs)

    def __init__(self, args: Any, model: Any, model_name: str, quantization_config: Any, transform_ue8m0: bool = True):
        self.args = args
        self.model = model
        self.model_name = model_name
        self.quantization_config = quantization_config
        self.transform_ue8m0 = transform_ue8m0
