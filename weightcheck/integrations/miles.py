"""miles: the manifest from the tensors each `UpdateWeightFrom*` sends, the check after `update_weights()`.

Written against radixark/miles at 31f1ca96 (`miles/backends/megatron_utils/update_weight/`; not installable
here, tested with stand-ins of the same module layout). As in slime, `update_weights()` bumps
`self.weight_version` first and every HF tensor passes through one instance method:

* `UpdateWeightFromTensor._send_base_params(hf_named_tensors)`: colocated engines; every rank gathers and
  converts the whole model, so the checker rank writes the part.
* `UpdateWeightFromDistributed._update_weight_implementation(converted_named_tensors, pbar)` (broadcast) and
  `UpdateWeightP2P._update_weight_implementation(...)`: the source rank of each pipeline stage sends its
  stage, and writes its part.

    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.miles import instrument

    actor.weight_updater = instrument(actor.weight_updater, SyncMonitor.from_env())

An object with the earlier `WeightTransferProtocol` shape (`begin_sync` → `send_bucket`* →
`after_base_weights` → `finalize` → `after_engines_resumed`) is instrumented at `send_bucket`. With
`monitor=None` the object is returned untouched. LoRA adapter pushes (`_send_lora_params`) and disk deltas
are not observed: they are not the model's weights.
"""

from __future__ import annotations

from typing import Any

from weightcheck.integrations import SyncMonitor
from weightcheck.integrations._updater import instrument_updater

__all__ = ["instrument"]

SOURCE_COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"


def instrument(updater: Any, monitor: SyncMonitor | None) -> Any:
    """Wrap one `UpdateWeightFrom*` instance (or a protocol object) and return it."""
    if monitor is None:
        return updater
    if callable(getattr(updater, "send_bucket", None)) and callable(getattr(updater, "begin_sync", None)):
        return _instrument_protocol(updater, monitor)
    return instrument_updater(
        updater,
        monitor,
        send_points=("_update_weight_implementation",),
        whole_model_points=("_send_base_params",),
        framework="miles",
    )


def _instrument_protocol(protocol: Any, monitor: SyncMonitor) -> Any:
    """The `WeightTransferProtocol` shape: wrap its methods (not its class)."""
    begin_sync = protocol.begin_sync
    send_bucket = protocol.send_bucket
    finalize = protocol.finalize
    after_engines_resumed = protocol.after_engines_resumed

    def observed_begin_sync(weight_version: Any, iter_buckets: Any) -> bool:
        go = begin_sync(weight_version, iter_buckets)
        if go:
            monitor.begin(weight_version)
        return go

    def observed_send_bucket(bucket: list[tuple[str, Any]]) -> None:
        for name, tensor in bucket:
            monitor.add(name, tensor)
        return send_bucket(bucket)

    def observed_finalize(weight_version: Any) -> None:
        out = finalize(weight_version)
        if monitor.active:
            monitor.end(write_empty=getattr(protocol, "is_sender", True) is not False)
        return out

    def observed_after_engines_resumed() -> None:
        out = after_engines_resumed()
        monitor.after_sync()
        return out

    protocol.begin_sync = observed_begin_sync
    protocol.send_bucket = observed_send_bucket
    protocol.finalize = observed_finalize
    protocol.after_engines_resumed = observed_after_engines_resumed
    return protocol
