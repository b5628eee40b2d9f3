"""verl `workers/rollout/base.py`: `BaseRollout.update_weights(weights, **kwargs)` (async), `weights` a
generator of HF-named tensors."""

from __future__ import annotations

from typing import Any


class BaseRollout:
    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None) -> None:
        self.config = config
        self.model_config = model_config
        self.device_mesh = device_mesh

    async def update_weights(self, weights: Any, **kwargs: Any) -> None:
        raise NotImplementedError
