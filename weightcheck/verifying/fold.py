"""One defect, one finding: a draft model's or engine's parameter that received nothing (WC732) because its
tensor was never sent (WC722) becomes that WC722's related finding."""

from __future__ import annotations

from weightcheck.findings import Finding
from weightcheck.rules.verify import ENGINE_PARAM_NEVER_WRITTEN, SYNC_TENSOR_MISSING
from weightcheck.verifying import _names


def _explains(missing: str, param: str) -> bool:
    """A tensor never sent (WC722) explains an engine parameter that received nothing (WC732): the same name
    or the same module leaf (a draft model's `model.eh_proj.weight` from `model.layers.3.eh_proj.weight`), or
    a fused parameter of the same layer (`qkv_proj.weight` from `q_proj.weight`, experts' `w13_weight`)."""
    if missing == param:
        return True
    m_layer, p_layer = _names.layer_id(missing), _names.layer_id(param)
    if m_layer is not None and p_layer is not None and m_layer != p_layer:
        return False
    if missing.split(".")[-2:] == param.split(".")[-2:]:
        return True

    # Same layer, same kind of leaf (`weight` and `w13_weight`; `weight_scale` and `w2_weight_scale`): the
    # engine fuses what the trainer sends split.
    def kind(name: str) -> str:
        return name.rsplit(".", 1)[-1].rsplit("_", 1)[-1]

    return m_layer is not None and m_layer == p_layer and kind(missing) == kind(param)


def fold_never_written(items: list[Finding], start: int) -> None:
    """One defect, one finding: the parameters a sync left unwritten (WC732) because their tensors were never
    sent (WC722) are that WC722's follow-on (`related`, shown with -v and in JSON), not a second error."""
    sync = items[start:]
    missing = [f for f in sync if f.code == SYNC_TENSOR_MISSING.code]
    if not missing:
        return
    folded: list[Finding] = []
    for never in (f for f in sync if f.code == ENGINE_PARAM_NEVER_WRITTEN.code):
        params = [p for p in never.details.get("params", []) if isinstance(p, str)]
        for root in missing:
            names = [n for n in root.details.get("names", []) if isinstance(n, str)]
            if params and all(any(_explains(n, p) for n in names) for p in params):
                root.related.append(never)
                root.severity = max(root.severity, never.severity)
                folded.append(never)
                break
    if folded:
        items[start:] = [f for f in sync if not any(f is x for x in folded)]
