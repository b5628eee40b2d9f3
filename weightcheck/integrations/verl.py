"""verl: the manifest from the weights generator of the rollout's `update_weights`, the check after it.

Written against volcengine/verl at b178a3cd (not installable beside SGLang 0.5.23; tested with a stand-in
of the same signature). verl (`verl/workers/rollout/base.py`, `BaseRollout`) pushes every sync through
`await rollout.update_weights(weights, **kwargs)` on every trainer rank: `weights` is a generator of
HF-named tensors (for Megatron, mbridge's `Bridge.export_weights`, which gathers every PP stage and EP rank,
so each rank's generator yields the whole model). The SGLang `ServerAdapter`
(`verl/workers/rollout/sglang_rollout/sglang_rollout.py`) buckets it into `update_weights_from_tensor`
requests. On the checker rank (rank 0 by default) the adapter passes the generator through unchanged,
digesting each tensor; it then writes the part (the whole model, naming no sending rank) and checks.
Other ranks pass their generator through untouched.

    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.verl import instrument

    rollout = instrument(rollout, SyncMonitor.from_env())

verl sends no `weight_version` to SGLang, so the parts are filed under the count of syncs (or
`global_steps` when the caller passes it) and the check takes the engines' latest sync. Layer and expert
counts come from the rollout's `model_config.hf_config`. With `monitor=None` the rollout is returned
untouched. Delta flushes (`wire_format="delta_flush"`) and LoRA base pushes (`base_sync_done=False`) are
passed through unobserved.
"""

from __future__ import annotations

import functools
from typing import Any

from weightcheck.integrations import SyncMonitor

__all__ = ["instrument"]

SOURCE_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"

_EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")


def instrument(rollout: Any, monitor: SyncMonitor | None) -> Any:
    """Wrap one rollout instance's `update_weights` (a coroutine function) and return the rollout."""
    if monitor is None:
        return rollout
    # The generator is the whole model (gathered over PP and EP): one part, naming no sending rank; the
    # trainer's sizes (megatron-core's parallel state in this process) still name a shifted stage.
    monitor.whole_model = True
    monitor.match_version = False
    _learn_counts(rollout, monitor)
    update_weights = rollout.update_weights
    syncs = {"n": 0}

    @functools.wraps(update_weights)
    async def observed_update_weights(weights: Any, *args: Any, **kwargs: Any) -> Any:
        unobserved = kwargs.get("wire_format", "named_tensors") != "named_tensors" or (
            kwargs.get("base_sync_done", True) is False
        )
        if unobserved:
            return await update_weights(weights, *args, **kwargs)
        syncs["n"] += 1
        steps = kwargs.get("global_steps")
        version = steps if steps is not None else syncs["n"]
        if monitor.checker:
            monitor.begin(version, step=steps)
            weights = monitor.observe(weights)
        else:
            monitor.set_version(version)
        out = await update_weights(weights, *args, **kwargs)
        monitor.end()
        monitor.after_sync()
        return out

    rollout.update_weights = observed_update_weights
    return rollout


def _learn_counts(rollout: Any, monitor: SyncMonitor) -> None:
    hf_config = getattr(getattr(rollout, "model_config", None), "hf_config", None)
    config = getattr(hf_config, "text_config", None) or hf_config
    if config is None:
        return
    layers = getattr(config, "num_hidden_layers", None)
    if monitor.num_layers is None and isinstance(layers, int) and not isinstance(layers, bool):
        monitor.num_layers = layers
    for key in _EXPERT_COUNT_KEYS:
        experts = getattr(config, key, None)
        if monitor.num_experts is None and isinstance(experts, int) and not isinstance(experts, bool) and experts:
            monitor.num_experts = experts
            break
