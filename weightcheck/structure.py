"""Layer and expert structure derived from tensor names and config.json — no architecture knowledge.

Used by the WC4xx coverage rules (and later by pattern-driven checks). Quantized companions are folded
onto their base parameter (`q_proj.weight_packed` → `q_proj.weight`) so that a layer quantized
differently from its peers is not mistaken for a layer missing weights; WC3xx rules judge quantization.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from weightcheck.names import is_index, parse_index, split_expert, split_layer

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
)

_NON_TEXT_HINTS = ("visual", "vision", "audio", "mm_projector", "image", "speech", "encoder")

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
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


def analyze(names: Iterable[str], text_config: dict[str, Any]) -> LayerStructure:
    """Group names by decoder layer under the most plausible language-model prefix."""
    by_prefix: dict[str, dict[int, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    unsplit: list[str] = []
    for name in names:
        # Inlined fast path of split_layer for the common `<prefix>.layers.<i>.<tail>` shape.
        i = name.find(".layers.")
        if i > 0:
            idx, _, tail = name[i + 8 :].partition(".")
            if is_index(idx) and tail:
                by_prefix[name[: i + 7]][int(idx)].append((name, tail))
                continue
        split = split_layer(name)
        if split is not None:
            by_prefix[split[0]][split[1]].append((name, split[2]))
        else:
            unsplit.append(name)

    num_layers = config_int(text_config, ("num_hidden_layers", "n_layer", "num_layers"), "layers")
    mtp = config_int(text_config, MTP_COUNT_KEYS, "mtp") or 0

    def score(prefix: str) -> tuple[int, int, int]:
        ids = by_prefix[prefix]
        text_like = 0 if any(h in prefix for h in _NON_TEXT_HINTS) or prefix.startswith("mtp") else 1
        fits = 1 if num_layers is not None and max(ids) < num_layers + mtp + 1 else 0
        return (text_like, fits, sum(len(v) for v in ids.values()))

    structure = LayerStructure(prefix=None, num_hidden_layers=num_layers, num_mtp_layers=mtp, unsplit=unsplit)
    structure.distinct_parts = set(by_prefix)
    for layers in by_prefix.values():
        for entries in layers.values():
            structure.distinct_parts.update(t for _, t in entries)
    structure.num_experts = config_int(text_config, EXPERT_COUNT_KEYS, "experts")
    if not by_prefix:
        return structure
    prefix = max(by_prefix, key=score)
    structure.prefix = prefix
    structure.other_prefixes = {p: len(v) for p, v in by_prefix.items() if p != prefix}
    for p in by_prefix:
        if p != prefix and p.split(".")[0] == "mtp":
            structure.mtp_prefix = p
            structure.mtp_ids = set(by_prefix[p])

    # Tails repeat across layers (`mlp.experts.17.down_proj.weight` in every MoE layer): parse each once.
    parsed: dict[str, tuple[str | None, int, str]] = {}
    for layer, entries in sorted(by_prefix[prefix].items()):
        structure.layer_tensors[layer] = [name for name, _ in entries]
        sig: set[str] = set()
        heads: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        for _, tail in entries:
            got = parsed.get(tail)
            if got is None:
                got = parsed[tail] = split_tail(tail)
            head, expert, suffix = got
            if head is None:
                sig.add(suffix)
            else:
                heads[head][expert].add(suffix)
                sig.add(f"{head}.*.{suffix}")
        structure.signatures[layer] = frozenset(sig)
        if heads:
            structure.experts[layer] = {
                head: {e: frozenset(s) for e, s in experts.items()} for head, experts in heads.items()
            }
    return structure


def majority(signatures: Iterable[frozenset[str]]) -> frozenset[str] | None:
    counts = Counter(signatures)
    if not counts:
        return None
    return max(counts.items(), key=lambda kv: (kv[1], len(kv[0])))[0]
