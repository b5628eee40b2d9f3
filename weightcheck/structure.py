"""Layer and expert structure derived from tensor names and config.json — no architecture knowledge.

Used by the WC4xx coverage rules (and later by pattern-driven checks). Quantized companions are folded
onto their base parameter (`q_proj.weight_packed` → `q_proj.weight`) so that a layer quantized
differently from its peers is not mistaken for a layer missing weights; WC3xx rules judge quantization.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from itertools import groupby
from operator import itemgetter

from weightcheck.lightclass import dataclass, field
from weightcheck.names import Template, group_by_template, is_index, parse_index, split_expert, split_layer

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

# Re-exported for weightcheck/verify.py (`parse_index`) until it imports weightcheck.names itself.
__all__ = ["parse_index"]

# Parameter names that are quantization companions of a module's `weight`.
QUANT_COMPANIONS = (
    "weight_packed",
    "weight_scale",
    "weight_scale_inv",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
    "weight_global_scale",
    "weight_scale_2",
    "input_scale",
    "input_global_scale",
    "input_zero_point",
    "output_scale",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
    "SCB",
    # bitsandbytes 8-bit: the row/col format tag saved beside SCB (bitsandbytes' `maybe_rearrange_weight` pops
    # it at load; transformers' 8-bit quantizer lists it with SCB and weight)
    "weight_format",
)

_NON_TEXT_HINTS = ("visual", "vision", "audio", "mm_projector", "image", "speech", "encoder")

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
# The decoder-layer count under the names configs give it: transformers' own attribute first, then the aliases
# of GPT-2 / GPT-J / BLOOM (`n_layer`), GPT-Neo / LongCat-Flash (`num_layers`) and MPT / DBRX (`n_layers`).
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


_COMPANION_SET = frozenset(QUANT_COMPANIONS)
# Quantized stacked experts store `<param>_blocks` / `<param>_scales` for the 3-D `<param>` (MXFP4).
_STACK_COMPANIONS = ("_blocks", "_scales")

def normalize_param(rest: str) -> str:
    """Fold quantization companions and `.weight.absmax`-style bitsandbytes blobs onto `.weight`."""
    if ".weight." in rest:  # bitsandbytes: q_proj.weight.absmax, q_proj.weight.quant_map, ...
        return rest.split(".weight.", 1)[0] + ".weight"
    head, dot, leaf = rest.rpartition(".")
    if head.endswith("experts") and leaf.endswith(_STACK_COMPANIONS):  # gpt-oss MXFP4: gate_up_proj_blocks
        return f"{head}.{leaf.rsplit('_', 1)[0]}"
    return head + ".weight" if dot and leaf in _COMPANION_SET else rest


# Counts beyond these are not a model but a hostile or corrupt config.json: treated as absent (WC107 says
# so) instead of allocating range(10**12). The largest real models have ~100 layers and ~400 experts.
MAX_PLAUSIBLE = {"layers": 10_000, "experts": 100_000, "mtp": 64}


def config_int(cfg: dict[str, Any], keys: Iterable[str], kind: str | None = None) -> int | None:
    limit = MAX_PLAUSIBLE.get(kind or "")
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0 or (limit is not None and value > limit):
                return None
            return value
    return None


@dataclass
class LayerStructure:
    prefix: str | None
    # layer id -> original tensor names
    layer_tensors: dict[int, list[str]] = field(default_factory=dict)
    # layer id -> normalized suffix set (expert ids replaced by `*`)
    signatures: dict[int, frozenset[str]] = field(default_factory=dict)
    # layer id -> expert-container head ("mlp.experts") -> expert id -> normalized suffixes
    experts: dict[int, dict[str, dict[int, frozenset[str]]]] = field(default_factory=dict)
    num_hidden_layers: int | None = None
    num_mtp_layers: int = 0
    num_experts: int | None = None
    # Separate MTP module prefix (`mtp.layers.`) when MTP is not numbered after the decoder layers.
    mtp_prefix: str | None = None
    mtp_ids: set[int] = field(default_factory=set)
    other_prefixes: dict[str, int] = field(default_factory=dict)
    # Names outside any layer container (embeddings, norms, lm_head, vision stems...).
    unsplit: list[str] = field(default_factory=list)
    # Every distinct (prefix, tail) seen, across all containers, for name-shape checks.
    distinct_parts: set[str] = field(default_factory=set)

    @property
    def ids(self) -> set[int]:
        return set(self.layer_tensors)

    def is_moe(self, layer: int) -> bool:
        return bool(self.experts.get(layer))

    def is_mtp(self, layer: int) -> bool:
        return self.num_hidden_layers is not None and layer >= self.num_hidden_layers


def split_tail(tail: str) -> tuple[str | None, int, str]:
    """`mlp.experts.7.down_proj.weight_packed` → (`mlp.experts`, 7, `down_proj.weight`)."""
    got = split_expert(tail)
    if got is not None:
        return got[0], int(got[1]), normalize_param(got[2])
    return None, -1, normalize_param(tail)


def analyze(
    names: Iterable[str],
    text_config: dict[str, Any],
    groups: dict[Template, list[tuple[str, tuple[str, ...]]]] | None = None,
) -> LayerStructure:
    """Group names by decoder layer under the most plausible language-model prefix.

    Works on name templates (weightcheck.names): a checkpoint of 90k names has a few hundred, and every
    question here (which layers, which tails, which experts) is answered per template and its id sets; only
    the per-layer name lists touch each name. `groups` is `group_by_template(names)` when the caller has it."""
    if groups is None:
        groups = group_by_template(names)
    # prefix -> layer -> [(template, members of that template in that layer)]
    by_prefix: dict[str, dict[int, list[tuple[Template, list[tuple[str, tuple[str, ...]]]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    # Names whose layer id is a digit run too long to be an id: split name by name, as split_layer does.
    loose: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    unsplit: list[str] = []
    # template (with an expert slot) -> the expert ids as written, over all its layers
    expert_values: dict[Template, set[str]] = {}
    for parts, members in groups.items():
        if len(parts) == 1:
            unsplit.append(parts[0])
            continue
        per_layer: dict[str, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
        # The members split by layer id in C-level passes: a checkpoint lists a layer's names together, so
        # runs are long (a layer seen in several runs gets them appended in order, as a loop would).
        layer_values = map(_first, map(_second, members))
        for value, run in groupby(zip(layer_values, members, strict=True), key=_first):
            per_layer[value] += map(_second, run)
        for value, chunk in per_layer.items():
            if is_index(value):
                by_prefix[parts[0][:-1]][int(value)].append((parts, chunk))
                continue
            for name, _ in chunk:
                split = split_layer(name)
                if split is None:
                    unsplit.append(name)
                else:
                    loose[split[0]][split[1]].append(name)

    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for prefix, layers in by_prefix.items():
        for layer, entries in layers.items():
            counts[prefix][layer] += sum(len(chunk) for _, chunk in entries)
    for prefix, layers in loose.items():
        for layer, layer_names in layers.items():
            counts[prefix][layer] += len(layer_names)

    num_layers = config_int(text_config, LAYER_COUNT_KEYS, "layers")
    mtp = config_int(text_config, MTP_COUNT_KEYS, "mtp") or 0

    def score(prefix: str) -> tuple[int, int, int]:
        ids = counts[prefix]
        text_like = 0 if any(h in prefix for h in _NON_TEXT_HINTS) or prefix.startswith("mtp") else 1
        fits = 1 if num_layers is not None and max(ids) < num_layers + mtp + 1 else 0
        return (text_like, fits, sum(ids.values()))

    structure = LayerStructure(prefix=None, num_hidden_layers=num_layers, num_mtp_layers=mtp, unsplit=unsplit)
    structure.distinct_parts = set(counts)
    # The expert ids as written, once per (layer, template): the per-layer loop below reads them again.
    chunk_values: dict[int, set[str]] = {}
    for layers in by_prefix.values():
        for entries in layers.values():
            for parts, chunk in entries:
                if len(parts) == 2:
                    structure.distinct_parts.add(parts[1][1:])
                else:
                    values = chunk_values[id(chunk)] = set(map(_second, map(_second, chunk)))
                    seen = expert_values.get(parts)
                    if seen is None:
                        expert_values[parts] = set(values)
                    else:
                        seen |= values
    for parts, values in expert_values.items():  # a distinct part per (template, expert id), not per name
        structure.distinct_parts.update(f"{parts[1][1:]}{v}{parts[2]}" for v in values)
    for prefix, layers in loose.items():
        for layer_names in layers.values():
            structure.distinct_parts.update(_tail_after(name, prefix) for name in layer_names)
    structure.num_experts = config_int(text_config, EXPERT_COUNT_KEYS, "experts")
    if not counts:
        return structure
    # max() keeps the first of equal scores: the prefixes in the order the names first showed them.
    prefix = max(counts, key=score)
    structure.prefix = prefix
    structure.other_prefixes = {p: len(v) for p, v in counts.items() if p != prefix}
    for p in counts:
        if p != prefix and p.split(".")[0] == "mtp":
            structure.mtp_prefix = p
            structure.mtp_ids = set(counts[p])

    # One suffix parse per template (and per distinct expert id), not per name.
    ids_of: dict[str, int | None] = {}  # expert id as written -> its value (None: not an id)
    for layer in sorted(counts[prefix]):
        layer_names: list[str] = []
        sig: set[str] = set()
        # head -> [(suffix, expert ids holding it)]: one entry per expert template of the layer
        heads: dict[str, list[tuple[str, set[int]]]] = defaultdict(list)
        for parts, chunk in by_prefix[prefix].get(layer, ()):
            layer_names += map(_name_of, chunk)
            if len(parts) == 2:
                sig.add(normalize_param(parts[1][1:]))
                continue
            head, suffix = parts[1][1:-1], normalize_param(parts[2][1:])
            values = chunk_values[id(chunk)]
            for value in values - ids_of.keys():
                ids_of[value] = int(value) if is_index(value) else None
            ids = set(map(ids_of.__getitem__, values))
            if None in ids:
                ids.discard(None)
                for value in values:
                    if ids_of[value] is None:  # not an id (too long): a plain suffix, as split_tail reads it
                        sig.add(normalize_param(f"{parts[1][1:]}{value}{parts[2]}"))
            if ids:
                heads[head].append((suffix, ids))
                sig.add(f"{head}.*.{suffix}")
        for name in loose[prefix].get(layer, ()) if prefix in loose else ():
            layer_names.append(name)
            head_, expert, suffix_ = split_tail(_tail_after(name, prefix))
            if head_ is None:
                sig.add(suffix_)
            else:
                heads[head_].append((suffix_, {expert}))
                sig.add(f"{head_}.*.{suffix_}")
        structure.layer_tensors[layer] = layer_names
        structure.signatures[layer] = frozenset(sig)
        if heads:
            structure.experts[layer] = {head: _expert_suffixes(entries) for head, entries in heads.items()}
    return structure


_name_of = _first = itemgetter(0)
_second = itemgetter(1)  # twice over a template's members: (name, (layer id, expert id)) -> expert id


def _expert_suffixes(entries: list[tuple[str, set[int]]]) -> dict[int, frozenset[str]]:
    """expert id -> the suffixes of the entries whose ids hold it, in id order. Experts are split into
    classes by which entries hold them (set operations per entry: one class when every expert is complete,
    a few more per gap), so the work grows with the entries and the classes, not with experts x entries."""
    classes: list[tuple[set[int], frozenset[str]]] = [(set().union(*(ids for _, ids in entries)), frozenset())]
    for suffix, ids in entries:
        split: list[tuple[set[int], frozenset[str]]] = []
        for members, suffixes in classes:
            inside = members & ids
            if not inside:
                split.append((members, suffixes))
                continue
            if len(inside) < len(members):
                split.append((members - inside, suffixes))
            split.append((inside, suffixes | {suffix}))
        classes = split
    out: dict[int, frozenset[str]] = {}
    for members, suffixes in classes:
        out.update(dict.fromkeys(members, suffixes))
    return {e: out[e] for e in sorted(out)}


def _tail_after(name: str, prefix: str) -> str:
    """`model.layers.3.mlp.gate.weight` after `model.layers` → `mlp.gate.weight`."""
    return name[len(prefix) + 1 :].partition(".")[2]


def majority(signatures: Iterable[frozenset[str]]) -> frozenset[str] | None:
    counts = Counter(signatures)
    if not counts:
        return None
    return max(counts.items(), key=lambda kv: (kv[1], len(kv[0])))[0]
