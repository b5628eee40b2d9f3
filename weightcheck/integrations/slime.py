"""slime: the manifest from `convert_to_hf` inside the update-weight classes, the check after `update_weights()`.

Written against THUDM/slime `slime/backends/megatron_utils/update_weight/update_weight_from_tensor.py` and
`update_weight_from_distributed.py` (not installable here; tested with a stand-in of the same signatures).
Both `UpdateWeightFromTensor` and `UpdateWeightFromDistributed` build every HF tensor they send with their
module's `convert_to_hf(args, model_name, name, param, quantization_config)` (Megatron → HF names, TP/EP
gathered, online quantization applied) on the ranks that send, and `update_weights()` increments
`self.weight_version` first and returns once the engines have the weights.

    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.slime import instrument

    actor.weight_updater = instrument(actor.weight_updater, SyncMonitor.from_env())

With `monitor=None` the updater is returned untouched. Ranks that convert nothing write no part. Delta
transfer (`--update-weight-mode delta`) sends deltas of the tensors `convert_to_hf` returns: the parts then
describe full tensors the engines never received whole, so leave the check off there.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from weightcheck.integrations import SyncMonitor

__all__ = ["instrument"]


def instrument(updater: Any, monitor: SyncMonitor | None) -> Any:
    """Wrap one `UpdateWeightFrom*` instance and its module's `convert_to_hf`; return the updater."""
    if monitor is None:
        return updater
    module = sys.modules[type(updater).__module__]
    convert_to_hf = module.convert_to_hf
    state = {"syncing": False}

    @functools.wraps(convert_to_hf)
    def observed_convert_to_hf(*args: Any, **kwargs: Any) -> Any:
        converted = convert_to_hf(*args, **kwargs)
        if state["syncing"]:
            if not monitor.active:  # the first tensor of this rank: update_weights() already bumped the version
                monitor.begin(updater.weight_version)
            for name, tensor in converted:
                monitor.add(name, tensor)
        return converted

    update_weights = updater.update_weights

    @functools.wraps(update_weights)
    def observed_update_weights(*args: Any, **kwargs: Any) -> Any:
        state["syncing"] = True
        try:
            out = update_weights(*args, **kwargs)
        finally:
            state["syncing"] = False
        monitor.end(write_empty=False)
        monitor.set_version(updater.weight_version)
        monitor.after_sync()
        return out

    module.convert_to_hf = observed_convert_to_hf
    updater.update_weights = observed_update_weights
    return updater
