"""miles `update_weight/common.py`: `named_params_and_buffers(args, model)` names each local parameter
with its global layer id (megatron-core's `get_transformer_layer_offset`) and global expert id (EP rank ×
local experts). `DEFECTS` plants the offset bugs where they live."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from megatron.core import mpu
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

# "pp_offset": the last stage drops its layer offset; "ep_offset": EP rank 1 its expert offset
DEFECTS: set[str] = set()


def named_params_and_buffers(args: Any, model: Sequence[torch.nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
    pp_rank = mpu.get_pipeline_model_parallel_rank()
    ep_rank = mpu.get_expert_model_parallel_rank()
    for vp_stage, chunk in enumerate(model):
        config = chunk.config
        layer_offset = get_transformer_layer_offset(config, vp_stage=vp_stage if len(model) > 1 else None)
        local_experts = (config.num_moe_experts or 0) // mpu.get_expert_model_parallel_world_size()
        expert_offset = ep_rank * local_experts
        if "pp_offset" in DEFECTS and pp_rank == mpu.get_pipeline_model_parallel_world_size() - 1 and pp_rank:
            layer_offset = 0
        if "ep_offset" in DEFECTS and ep_rank == 1:
            expert_offset = 0
        for name, param in chunk.named_parameters():
            yield f"module.module.{_globalised(name, layer_offset, expert_offset)}", param


def _globalised(name: str, layer_offset: int, expert_offset: int) -> str:
    name = re.sub(r"layers\.(\d+)\.", lambda m: f"layers.{int(m.group(1)) + layer_offset}.", name, count=1)
    return re.sub(r"experts\.(\d+)\.", lambda m: f"experts.{int(m.group(1)) + expert_offset}.", name, count=1)
