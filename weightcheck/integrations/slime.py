"""slime: the manifest from the tensors each `UpdateWeightFrom*` sends, the check after `update_weights()`.

Written against THUDM/slime at 624b824a (`slime/backends/megatron_utils/update_weight/`; not installable
here, tested with stand-ins of the same module layout). `update_weights()` bumps `self.weight_version`
first and returns once the engines have the weights; every HF tensor it sends passes through one instance
method, the send point the adapter wraps:

* `UpdateWeightFromTensor._send_hf_params(hf_named_tensors)`: the chunks of `HfWeightIteratorDirect`
  (`hf_weight_iterator_direct.py`, which converts with the `convert_to_hf` of its own module) and the
  routed expert batches. Every rank gathers and converts the whole model (PP and EP broadcast, TP
  all-gather), so one rank's part describes the stream: the checker rank writes it (every rank when experts
  are routed rank by rank).
* `UpdateWeightFromDistributed._update_bucket_weights_from_distributed(converted_named_tensors, ...)`: the
  source rank of each pipeline stage broadcasts its stage (experts gathered over EP), so each writes the
  part of its stage.

    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.slime import instrument

    actor.weight_updater = instrument(actor.weight_updater, SyncMonitor.from_env())

Layer and expert counts come from the updater's model (megatron-core config) or its `args`; ranks from
megatron-core's parallel state; rank 0 checks after a barrier. With `monitor=None` the updater is returned
untouched. Older releases without these methods are observed through their module's `convert_to_hf`.
Delta transfer (`--update-weight-mode delta`) sends deltas: leave the check off there.
"""

from __future__ import annotations

from typing import Any

from weightcheck.integrations import SyncMonitor
from weightcheck.integrations._updater import instrument_updater

__all__ = ["instrument"]

SOURCE_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"


def instrument(updater: Any, monitor: SyncMonitor | None) -> Any:
    """Wrap one `UpdateWeightFrom*` instance's send method and `update_weights`; return the updater."""
    if monitor is None:
        return updater
    return instrument_updater(
        updater,
        monitor,
        send_points=("_update_bucket_weights_from_distributed",),
        whole_model_points=("_send_hf_params",),
        framework="slime",
    )
