"""Layer and expert ids as `weightcheck verify` reads them, on top of the one name model (`weightcheck.names`).

Verify narrows the name model in one way: a layer id counts only under a text-model layer container,
`layers` or GPT-2's `h` (`transformer.h.3.attn...` is layer 3 as `model.layers.3...` is). `blocks`/`block`,
which the name model also reads, are left out here: vision towers name their blocks `visual.blocks.N`, and
verify compares layer ids with the text model's layer count (drops "beyond the model's layers", the count
guessed from the names when the config has none), so a vision block read as a layer would be a false
finding. An expert id is the name model's (`experts.N.` / `local_experts.N.`).
"""

from __future__ import annotations

from collections.abc import Iterable

from weightcheck import names

_TEXT_LAYER_CONTAINERS = frozenset({"layers", "h"})
# transformers 5 stacks a layer's experts into one tensor per projection (no expert id in the name).
_FUSED_EXPERT_TAILS = frozenset(
    f"experts.{proj}{suffix}" for proj in ("gate_up_proj", "down_proj") for suffix in ("", "_bias", "_scale")
)


def _split_layer(name: str) -> tuple[str, int, str] | None:
    got = names.split_layer(name)
    if got is None or got[0].rpartition(".")[2] not in _TEXT_LAYER_CONTAINERS:
        return None
    return got


def layer_id(name: str) -> int | None:
    got = _split_layer(name)
    return got[1] if got else None


def expert_id(name: str) -> int | None:
    return names.expert_id(name)


def is_fused_expert(name: str) -> bool:
    """A transformers-5 fused expert tensor (`mlp.experts.gate_up_proj`), which engines take per expert."""
    return ".mlp.experts." in name and names.stacked_expert_tail(name) in _FUSED_EXPERT_TAILS


def with_layer(name: str, layer: int | str) -> str:
    got = _split_layer(name)
    return name if got is None else f"{got[0]}.{layer}.{got[2]}"


def with_expert(name: str, expert: int | str) -> str:
    got = names.split_expert(name)
    return name if got is None else f"{got[0]}.{expert}.{got[2]}"


def template(name: str) -> str:
    """The name with its layer id as `{L}` and its expert id as `{E}` (the name model's slots)."""
    return with_expert(with_layer(name, names.LAYER_SLOT), names.EXPERT_SLOT)


def infer_counts(items: Iterable[str]) -> tuple[int | None, int | None]:
    """(layers, experts) as one more than the highest id seen; None when no name carries one."""
    layers: set[int] = set()
    experts: set[int] = set()
    for name in items:
        layer, expert = layer_id(name), expert_id(name)
        if layer is not None:
            layers.add(layer)
        if expert is not None:
            experts.add(expert)
    return (max(layers) + 1 if layers else None), (max(experts) + 1 if experts else None)
