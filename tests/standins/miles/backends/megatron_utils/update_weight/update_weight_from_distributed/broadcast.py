"""miles `update_weight/update_weight_from_distributed/broadcast.py`: `UpdateWeightFromDistributed`, whose
`_update_weight_implementation(converted_named_tensors, pbar)` broadcasts one bucket to the engines."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from megatron.core import mpu

from .mixin import DistBucketedWeightUpdateMixin


class UpdateWeightFromDistributed(DistBucketedWeightUpdateMixin):
    def __init__(self, args: Any, model: Any, weights_getter: Any, *, model_name: str, quantization_config: Any):
        self.args = args
        self.model = model
        self.model_name = model_name
        self.quantization_config = quantization_config
        self.weight_version = 0

    def connect_rollout_engines(self, rollout_engines: Any, rollout_engine_lock: Any = None, **_: Any) -> None:
        self.rollout_engines = rollout_engines
        self._group_name = f"miles-pp_{mpu.get_pipeline_model_parallel_rank()}"

    @property
    def _is_source(self) -> bool:
        return mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and mpu.get_tensor_model_parallel_rank() == 0

    def _update_weight_implementation(self, converted_named_tensors: list, pbar: Any = None) -> None:
        from wire import send

        send(converted_named_tensors, self.weight_version)
        if dist.get_rank() == 0:
            for engine in self.rollout_engines:
                engine.update_weights(self.weight_version)
        converted_named_tensors.clear()
