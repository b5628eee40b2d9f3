"""miles `update_weight/update_weight_from_tensor.py`: `update_weights()` bumps the version, iterates
`HfWeightIteratorDirect` chunks and hands each to `self._send_base_params` (colocated engine via IPC)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

# slime imports convert_to_hf here too (for routed expert batches); the chunks are converted by the
# iterator module's own import, which a wrapper of this module's name never sees.
from ..megatron_to_hf import convert_to_hf  # noqa: F401
from .hf_weight_iterator_base import HfWeightIteratorBase


class UpdateWeightFromTensor:
    def __init__(self, args: Any, model: Any, weights_getter: Any, *, model_name: str, quantization_config: Any):
        self.args = args
        self.model = model
        self.weights_getter = weights_getter
        self.rank = dist.get_rank()
        self.model_name = model_name
        self.quantization_config = quantization_config
        self.weight_version = 0
        self._hf_weight_iterator = HfWeightIteratorBase.create(
            args=args, model=model, model_name=model_name, quantization_config=quantization_config
        )
        self._expert_transfer_plan: list = []

    def connect_rollout_engines(self, rollout_engines: Any, rollout_engine_lock: Any = None, **_: Any) -> None:
        self.rollout_engines = rollout_engines
        self._ipc_engine = rollout_engines[0] if rollout_engines else None

    @torch.no_grad()
    def update_weights(self) -> None:
        self.weight_version += 1
        if self.rank == 0:
            for engine in self.rollout_engines:
                engine.pause_generation()
                engine.flush_cache()
        dist.barrier()
        megatron_local_weights = self.weights_getter()
        for hf_named_tensors in self._hf_weight_iterator.get_hf_weight_chunks(megatron_local_weights):
            self._send_base_params(hf_named_tensors)
        dist.barrier()
        if self.rank == 0:
            for engine in self.rollout_engines:
                engine.continue_generation()
        dist.barrier()

    def _send_base_params(self, hf_named_tensors: list) -> tuple[list, Any]:
        from wire import send

        if self._ipc_engine is not None:  # the gather source of the engine's IPC group (one TP rank here)
            send(hf_named_tensors, self.weight_version)
            self._ipc_engine.update_weights(self.weight_version)
        return [], None
