"""Layer and expert ids in tensor names, as `weightcheck verify` reads them: the only place in the verify
package that parses a name (one small private module, to be replaced by the project's one name model).

A layer id follows `layers` or GPT-2's `h`: `transformer.h.3.attn...` is layer 3 as `model.layers.3...` is
(diff's classifier knew `h`, verify did not, so a GPT-2-style stage that forgot its offset was not seen as a
shift). `blocks`/`block`, which diff also reads, are left out here: vision towers name their blocks
`visual.blocks.N`, and verify compares layer ids with the text model's layer count (drops "beyond the
model's layers", the count guessed from the names when the config has none). An expert id follows
`experts`. Ids are bounded (`structure.parse_index`): a digit run too long to be an index is no id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from weightcheck.structure import parse_index

_LAYER = re.compile(r"(^|\.)(layers|h)\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
# transformers 5 stacks a layer's experts into one tensor per projection (no expert id in the name).
_FUSED_EXPERT = re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)(_bias|_scale)?$")


def layer_id(name: str) -> int | None:
    match = _LAYER.search(name)
    return parse_index(match.group(3)) if match else None


def expert_id(name: str) -> int | None:
    match = _EXPERT.search(name)
    return parse_index(match.group(1)) if match else None


def is_fused_expert(name: str) -> bool:
    """A transformers-5 fused expert tensor (`mlp.experts.gate_up_proj`), which engines take per expert."""
    return _FUSED_EXPERT.search(name) is not None


def template(name: str) -> str:
    """The name with its layer id as `{L}` and its expert id as `{E}` (the first of each)."""
    name = _LAYER.sub(lambda m: f"{m.group(1)}{m.group(2)}.{{L}}.", name, count=1)
    return _EXPERT.sub(".experts.{E}.", name, count=1)


def with_layer(name: str, layer: int) -> str:
    return _LAYER.sub(lambda m: f"{m.group(1)}{m.group(2)}.{layer}.", name, count=1)


def with_expert(name: str, expert: int) -> str:
    return _EXPERT.sub(f".experts.{expert}.", name, count=1)


def infer_counts(names: Iterable[str]) -> tuple[int | None, int | None]:
    """(layers, experts) as one more than the highest id seen; None when no name carries one."""
    layers: set[int] = set()
    experts: set[int] = set()
    for name in names:
        layer, expert = layer_id(name), expert_id(name)
        if layer is not None:
            layers.add(layer)
        if expert is not None:
            experts.add(expert)
    return (max(layers) + 1 if layers else None), (max(experts) + 1 if experts else None)
