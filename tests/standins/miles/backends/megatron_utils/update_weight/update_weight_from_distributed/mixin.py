"""miles `update_weight/update_weight_from_distributed/mixin.py`: `update_weights()` bumps the version and
hands every converted bucket to the `update_bucket_weight_func` it is given, `self._update_weight_implementation`
(looked up on the instance at each sync); experts are gathered over EP before conversion."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core import mpu

from ...megatron_to_hf import convert_to_hf
from ..common import named_params_and_buffers


class DistBucketedWeightUpdateMixin:
    def _gather_and_update_non_expert_weights(self, update_bucket_weight_func: Any, pbar: Any = None) -> None:
        converted_named_tensors: list = []
        for name, param in named_params_and_buffers(self.args, self.model):
            if ".experts." in name or not self._is_source:
                continue
            converted_named_tensors += convert_to_hf(
                self.args, self.model_name, name, param.data, self.quantization_config
            )
            if len(converted_named_tensors) >= 7:
                update_bucket_weight_func(converted_named_tensors, pbar)
                converted_named_tensors = []
        if converted_named_tensors:
            update_bucket_weight_func(converted_named_tensors, pbar)

    def _gather_and_update_expert_weights(self, update_bucket_weight_func: Any, pbar: Any = None) -> None:
        named_tensors = [(n, p.data) for n, p in named_params_and_buffers(self.args, self.model) if ".experts." in n]
        if named_tensors:
            self._update_expert_bucket_weights(named_tensors, update_bucket_weight_func, pbar)

    def _update_expert_bucket_weights(self, named_tensors: list, update_bucket_weight_func: Any, pbar: Any) -> None:
        all_named: list[Any] = [None] * mpu.get_expert_model_parallel_world_size()
        dist.all_gather_object(all_named, named_tensors, group=mpu.get_expert_model_parallel_group())
        named_tensors.clear()
        if not self._is_source:
            return
        converted_hf_tensors: list = []
        for name, param in [item for rank_items in all_named for item in rank_items]:
            converted_hf_tensors += convert_to_hf(self.args, self.model_name, name, param, self.quantization_config)
        update_bucket_weight_func(converted_hf_tensors, pbar)

    def _pause_and_prepare_engines(self) -> None:
        if dist.get_rank() == 0:
            for engine in self.rollout_engines:
                engine.pause_generation(mode="retract")
                engine.flush_cache()

    def _finalize_and_resume_engines(self) -> None:
        if dist.get_rank() == 0:
            for engine in self.rollout_engines:
                engine.continue_generation()

    @torch.no_grad()
    def update_weights(self) -> None:
        self.weight_version += 1
        self._pause_and_prepare_engines()
        dist.barrier()
        self._gather_and_update_non_expert_weights(self._update_weight_implementation, None)
        dist.barrier()
        self._gather_and_update_expert_weights(self._update_weight_implementation, None)
        dist.barrier()
        self._finalize_and_resume_engines()
        dist.barrier()
