"""verl `workers/rollout/sglang_rollout/sglang_rollout.py`: `ServerAdapter.update_weights` buckets the
generator into `update_weights_from_tensor` requests to this rank's engine (here: the tapped model when
this rank hosts it; other ranks drain their generator, whose gathers are collective)."""

from __future__ import annotations

from typing import Any

from ..base import BaseRollout


class ServerAdapter(BaseRollout):
    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, engine: Any = None) -> None:
        super().__init__(config, model_config, device_mesh)
        self._engine = engine

    async def update_weights(self, weights: Any, **kwargs: Any) -> None:
        from weightcheck import tap

        bucket: list = []
        if self._engine is None:
            for _ in weights:
                pass
            return
        with tap.sync(None, source="session"):
            for item in weights:
                bucket.append(item)
                if len(bucket) == 7:
                    self._engine.load_weights(iter(bucket))
                    bucket = []
            if bucket:
                self._engine.load_weights(iter(bucket))
