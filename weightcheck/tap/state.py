"""Engine state after a sync: a digest of every parameter *and registered buffer* of the model, per rank.

The load_weights tap sees what arrives through `load_weights`. Transports that bypass it
(`load_format="direct"`, a custom weight loader, RDMA/P2P writes into engine memory) and engine-side
failures that are not loads at all (a buffer released by `release_memory_occupation` and not restored) are
invisible there. The engine's own state is not: digested after each sync and compared by `weightcheck
verify` across replicas that must agree (TP ranks for replicated tensors, DP engines for everything), with
the state after the startup disk load (where the weights should be unchanged), and with what the tap
recorded (a parameter written whole by one incoming tensor must hold its bytes).

Cost: one digest pass over the model's bytes per sync; with `posmix128` (`weightcheck.devdigest`) it runs
on the tensors' device and brings back two scalars per tensor. Off unless `WEIGHTCHECK_STATE=1` or
`configure(..., state=True)`.
"""

from __future__ import annotations

from typing import Any

# Module classes whose parameters are split across TP ranks (SGLang's parallel linear/embedding layers and
# the fused MoE, whose experts are split across TP or EP ranks). Everything else (norms, routers built as
# ReplicatedLinear or a plain parameter, rotary caches) is replicated and must agree across TP ranks.
_SHARDED_MARKERS = ("ParallelLinear", "ParallelEmbedding", "ParallelLMHead", "FusedMoE", "EPMoE", "DeepEPMoE")


def _is_sharded(module: Any) -> bool:
    names = [klass.__name__ for klass in type(module).__mro__]
    if any(marker in name for name in names for marker in _SHARDED_MARKERS):
        return True
    return hasattr(module, "_map_global_expert_id_to_local_expert_id")


def engine_state(model: Any, algorithm: str) -> list[dict[str, Any]]:
    """One `{"t": "state", ...}` line per parameter and buffer of `model` (the digest under `algorithm`)."""
    import torch

    from weightcheck.tap.devicebatch import DeviceBatch
    from weightcheck.tap.digesting import describe_tensor

    lines: list[dict[str, Any]] = []
    seen: set[int] = set()
    # GPU tensors under the on-device digest: queued on the device and collected with one copy (as the tap does
    # for incoming tensors), instead of a wait for the GPU per parameter.
    batch = DeviceBatch() if algorithm == "posmix128" else None
    for module_name, module in model.named_modules():
        sharded = _is_sharded(module)
        tensors = [("param", n, t) for n, t in module.named_parameters(recurse=False)]
        tensors += [("buffer", n, t) for n, t in module.named_buffers(recurse=False)]
        for kind, leaf, tensor in tensors:
            if not isinstance(tensor, torch.Tensor) or id(tensor) in seen:
                continue  # a tied weight is reported once, under its first name (as named_parameters does)
            seen.add(id(tensor))
            name = f"{module_name}.{leaf}" if module_name else leaf
            line: dict[str, Any] = {"t": "state", "name": name, "kind": kind, "sharded": sharded}
            lines.append(line)
            if batch is not None and batch.takes(tensor):
                try:
                    batch.add(line, tensor)
                    continue
                except Exception:  # described one at a time below, which records any error
                    pass
            try:
                described = describe_tensor(tensor, algorithm)
            except Exception as exc:  # an exotic tensor subclass: say so rather than fail the record
                described = {"dtype": str(tensor.dtype), "shape": list(tensor.shape), algorithm: None}
                described["error"] = f"cannot digest: {exc}"[:300]
            line.update(described)
    if batch is not None and batch.waiting():
        batch.collect(algorithm)
    return lines
