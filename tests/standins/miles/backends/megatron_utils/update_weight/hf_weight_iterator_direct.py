"""miles `update_weight/hf_weight_iterator_direct.py`: every rank gets every parameter (broadcast over PP
and EP, here one gloo all_gather_object) and converts it with the `convert_to_hf` of THIS module."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..megatron_to_hf import convert_to_hf
from .hf_weight_iterator_base import HfWeightIteratorBase


class HfWeightIteratorDirect(HfWeightIteratorBase):
    def get_hf_weight_chunks(self, megatron_local_weights: Any, param_info_buckets: Any = None, **_: Any) -> Any:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, list(megatron_local_weights.items()))
        full: dict[str, Any] = {}
        for rank_items in gathered:  # the lowest source rank of a name wins, as in _get_megatron_local_param_infos
            for name, tensor in rank_items:
                full.setdefault(name, tensor)
        names = sorted(full)
        for start in range(0, len(names), 7):  # buckets of --update-weight-buffer-size
            yield self._convert_to_hf_named_tensors(
                [full[n] for n in names[start : start + 7]], names[start : start + 7]
            )

    def _convert_to_hf_named_tensors(self, megatron_full_params: Any, param_infos: Any) -> list:
        hf_named_tensors: list = []
        for name, param in zip(param_infos, megatron_full_params, strict=False):
            hf_named_tensors.extend(
                convert_to_hf(
                    self.args,
                    self.model_name,
                    name,
                    param,
                    self.quantization_config,
                    transform_ue8m0=self.transform_ue8m0,
                )
            )
        return hf_named_tensors
