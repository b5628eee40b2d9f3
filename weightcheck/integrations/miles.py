"""miles: the manifest at `WeightTransferProtocol.send_bucket`, the check after the engines resumed.

Written against radixark/miles `miles/backends/training_utils/weight_update/protocol.py` (not installable
here; tested with a stand-in of the same signatures): every transport (CUDA IPC, broadcast, disk delta, P2P)
is a `WeightTransferProtocol` driven as `begin_sync(weight_version, iter_buckets) -> bool`, then
`send_bucket(bucket)` on sender ranks, `after_base_weights()`, `finalize(weight_version)`, and
`after_engines_resumed()` once the engines applied every bucket. `send_bucket` is the one place that sees
every HF-named tensor of every transport.

    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.miles import instrument

    protocol = instrument(get_weight_transfer_protocol(args), SyncMonitor.from_env())

With `monitor=None` (not enabled) the protocol is returned untouched. Ranks whose `is_sender` is False write
no part. Transports whose buckets are not full tensors (disk delta) are digested as sent, so their parts
describe the deltas, not the weights: do not enable the check for them.
"""

from __future__ import annotations

from typing import Any

from weightcheck.integrations import SyncMonitor

__all__ = ["instrument"]


def instrument(protocol: Any, monitor: SyncMonitor | None) -> Any:
    """Wrap one `WeightTransferProtocol` instance (its methods, not its class) and return it."""
    if monitor is None:
        return protocol
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
