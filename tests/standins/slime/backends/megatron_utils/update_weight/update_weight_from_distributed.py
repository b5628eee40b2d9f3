"""slime `update_weight/update_weight_from_distributed.py`: the source rank (DP = TP = 0) of each pipeline
stage converts its stage (experts gathered over EP first) and broadcasts each bucket through
`self._update_bucket_weights_from_distributed`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import mpu

from ..megatron_to_hf import convert_to_hf
from .common import named_params_and_buffers


class UpdateWeightFromDistributed:
    def __init__(self, args: Any, model: Any, weights_getter: Any, *, model_name: str, quantization_config: Any):
        self.args = args
        self.model = model
        self.model_name = model_name
        self.quantization_config = quantization_config
        self.weight_version = 0

    def connect_rollout_engines(self, rollout_engines: Any, rollout_engine_lock: Any = None, **_: Any) -> None:
        self.rollout_engines = rollout_engines
        self._is_pp_src_rank = (
            mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and mpu.get_tensor_model_parallel_rank() == 0
        )
        self._group_name = f"slime-pp_{mpu.get_pipeline_model_parallel_rank()}"

    @torch.no_grad()
    def update_weights(self) -> None:
        self.weight_version += 1
        if dist.get_rank() == 0:
            for engine in self.rollout_engines:
                engine.pause_generation()
                engine.flush_cache()
        dist.barrier()
        self._send_weights(None)
        if dist.get_rank() == 0:
            for engine in self.rollout_engines:
                engine.continue_generation()
        dist.barrier()

    def _send_weights(self, pbar: Any) -> None:
        for chunk_iter in (self._iter_non_expert_chunks(), self._iter_expert_chunks()):
            for hf_chunk in chunk_iter:
                self._update_bucket_weights_from_distributed(hf_chunk, pbar=pbar)
            dist.barrier()

    def _iter_non_expert_chunks(self) -> Iterator[list]:
        buffer: list = []
        for name, param in named_params_and_buffers(self.args, self.model):
            if ".experts." in name or not self._is_pp_src_rank:
                continue
            buffer.extend(convert_to_hf(self.args, self.model_name, name, param.data, self.quantization_config))
            if len(buffer) >= 7:
                yield buffer
                buffer = []
        if buffer:
            yield buffer

    def _iter_expert_chunks(self) -> Iterator[list]:
        batch = [(n, p.data) for n, p in named_params_and_buffers(self.args, self.model) if ".experts." in n]
        if batch:
            hf_chunk = self._ep_gather_and_convert(batch)
            if hf_chunk:
                yield hf_chunk

    def _ep_gather_and_convert(self, named_tensors: list) -> list:
        all_named: list[Any] = [None] * mpu.get_expert_model_parallel_world_size()
        dist.all_gather_object(all_named, named_tensors, group=mpu.get_expert_model_parallel_group())
        named_tensors.clear()
        if not self._is_pp_src_rank:
            return []
        converted: list = []
        for name, param in [
            item for rank_items in all_named for item in rank_items
        ]:  # EP rank by EP rank, as slime's all_gather lists them
            converted += convert_to_hf(self.args, self.model_name, name, param, self.quantization_config)
        return converted

    def _update_bucket_weights_from_distributed(
        self, converted_named_tensors: list, pbar: Any = None, load_format: Any = None
    ) -> None:
        from wire import send

        send(converted_named_tensors, self.weight_version)
        if dist.get_rank() == 0:
            for engine in self.rollout_engines:
                engine.update_weights(self.weight_version)
        converted_named_tensors.clear()  # as slime does after the broadcast
