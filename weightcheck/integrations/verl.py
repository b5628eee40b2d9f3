"""verl: the manifest from the weights generator of the rollout's `update_weights`, the check after it.

verl (`verl/workers/rollout/base.py`, `BaseRollout`) pushes every sync through
`await rollout.update_weights(weights, global_steps=..., **kwargs)`: `weights` is the trainer's generator of
HF-named tensors (for Megatron, mbridge's `Bridge.export_weights`, which gathers every PP stage and EP rank,
so each rank's generator yields the whole model). The SGLang `ServerAdapter`
(`verl/workers/rollout/sglang_rollout/sglang_rollout.py`) buckets it into `update_weights_from_tensor`
requests. The adapter passes the generator through unchanged, digesting each tensor, then writes the part
and checks.

    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.verl import instrument

    rollout = instrument(rollout, SyncMonitor.from_env(pp_rank=0, pp_size=1, ep_rank=0, ep_size=1))

verl sends no `weight_version` to SGLang, so the parts are filed under `global_steps` and the check takes
the engines' latest sync. With `monitor=None` the rollout is returned untouched. Enable it on one rank per
replica (e.g. the one whose rollout is the server's TP leader): every rank yields the same stream.
Delta flushes (`wire_format="delta_flush"`) are passed through unobserved.
"""

from __future__ import annotations

import functools
from typing import Any

from weightcheck.integrations import SyncMonitor

__all__ = ["instrument"]


def instrument(rollout: Any, monitor: SyncMonitor | None) -> Any:
    """Wrap one rollout instance's `update_weights` (a coroutine function) and return the rollout."""
    if monitor is None:
        return rollout
    monitor.match_version = False
    update_weights = rollout.update_weights

    @functools.wraps(update_weights)
    async def observed_update_weights(weights: Any, global_steps: int | None = None, **kwargs: Any) -> Any:
        if kwargs.get("wire_format", "named_tensors") != "named_tensors":
            return await update_weights(weights, global_steps=global_steps, **kwargs)
        monitor.begin(global_steps, step=global_steps)
        out = await update_weights(monitor.observe(weights), global_steps=global_steps, **kwargs)
        monitor.end()
        monitor.after_sync()
        return out

    rollout.update_weights = observed_update_weights
    return rollout
