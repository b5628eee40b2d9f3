"""The shared wrapper of slime's and miles' `UpdateWeightFrom*` classes: digest what each send method is
handed, write the part when `update_weights()` returns, then check.

Both frameworks build every HF tensor of a sync inside `update_weights()` (which bumps `self.weight_version`
first) and hand each bucket, as a list of `(name, tensor)`, to one instance method that sends it: the send
point. Wrapping the send point rather than a converter sees every tensor whatever module converted it
(slime's `HfWeightIteratorDirect` calls the `convert_to_hf` of its own module, which a wrapper of the updater
module's name never sees: no part was written and every later sync was called wrong).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Sequence
from typing import Any

from weightcheck.integrations import SyncMonitor

log = logging.getLogger("weightcheck.integrations")


def instrument_updater(
    updater: Any,
    monitor: SyncMonitor,
    send_points: Sequence[str],
    *,
    whole_model_points: Sequence[str] = (),
    framework: str,
) -> Any:
    """Wrap `updater`'s send methods (`send_points`: each rank sends its own share, e.g. one pipeline
    stage; `whole_model_points`: every rank sends the whole model, gathered over PP and EP) and its
    `update_weights`. Falls back to the updater module's `convert_to_hf` for releases without either."""
    monitor.learn(model=getattr(updater, "model", None), args=getattr(updater, "args", None))
    state = {"syncing": False}
    found = False

    def observe(named_tensors: Any, whole_model: bool) -> None:
        if not state["syncing"]:
            return
        if whole_model and not _whole_model_rank(updater, monitor):
            return  # every rank sends the same stream: one rank's part describes it
        if not monitor.active:  # the first tensor of this rank: update_weights() already bumped the version
            monitor.whole_model = whole_model
            monitor.begin(updater.weight_version)
        for name, tensor in named_tensors:
            monitor.add(name, tensor)

    for names, whole in ((send_points, False), (whole_model_points, True)):
        for attr in names:
            method = getattr(updater, attr, None)
            if not callable(method):
                continue
            found = True
            setattr(updater, attr, _observed_send(method, observe, whole))

    if not found:  # an older release: the module-level converter is the only place every tensor passes
        if _wrap_module_converter(updater, monitor, state):
            log.info("weightcheck: %s updater %s: no known send method; observing convert_to_hf", framework, updater)
        else:
            log.warning(
                "weightcheck: %s updater %s has neither a known send method nor a module convert_to_hf: its sends "
                "cannot be observed",
                framework,
                type(updater).__name__,
            )

    update_weights = updater.update_weights

    @functools.wraps(update_weights)
    def observed_update_weights(*args: Any, **kwargs: Any) -> Any:
        state["syncing"] = True
        try:
            out = update_weights(*args, **kwargs)
        finally:
            state["syncing"] = False
        # A gathered stream holds every stage's tensors under global ids, so `verify` relabels nothing in
        # its part (only a part made of exactly one stage's local ids is relabelled).
        monitor.end(write_empty=False)
        monitor.set_version(updater.weight_version)
        monitor.after_sync()
        return out

    updater.update_weights = observed_update_weights
    return updater


def _observed_send(method: Any, observe: Any, whole: bool) -> Any:
    @functools.wraps(method)
    def observed(named_tensors: Any, *args: Any, **kwargs: Any) -> Any:
        observe(named_tensors, whole)  # before sending: senders clear or reuse the list and its buffers
        return method(named_tensors, *args, **kwargs)

    return observed


def _whole_model_rank(updater: Any, monitor: SyncMonitor) -> bool:
    """Whether this rank digests a stream every rank sends whole: the checker rank, or every rank when
    experts are routed rank by rank (slime's `_expert_transfer_plan`: each rank then sends its own experts
    after the shared stream, so each writes its part)."""
    return monitor.checker or bool(getattr(updater, "_expert_transfer_plan", None))


def _wrap_module_converter(updater: Any, monitor: SyncMonitor, state: dict[str, bool]) -> bool:
    module = sys.modules[type(updater).__module__]
    convert_to_hf = getattr(module, "convert_to_hf", None)
    if convert_to_hf is None:
        return False

    @functools.wraps(convert_to_hf)
    def observed_convert_to_hf(*args: Any, **kwargs: Any) -> Any:
        converted = convert_to_hf(*args, **kwargs)
        if state["syncing"]:
            if not monitor.active:
                monitor.begin(updater.weight_version)
            for name, tensor in converted:
                monitor.add(name, tensor)
        return converted

    module.convert_to_hf = observed_convert_to_hf
    return True


__all__ = ["instrument_updater"]
