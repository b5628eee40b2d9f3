"""Layer and expert structure derived from tensor names and config.json — no architecture knowledge.

Used by the WC4xx coverage rules (and later by pattern-driven checks). Quantized companions are folded
onto their base parameter (`q_proj.weight_packed` → `q_proj.weight`) so that a layer quantized
differently from its peers is not mistaken for a layer missing weights; WC3xx rules judge quantization.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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

# Container names under which decoder blocks live (`model.layers.N`, GPT-2 `transformer.h.N`, ...).
_LAYER_RE = re.compile(r"^(?P<prefix>(?:[^.]+\.)*?(?:layers|h|blocks|layer))\.(?P<idx>\d+)\.(?P<rest>.+)$")
_EXPERT_RE = re.compile(r"^(?P<head>(?:.+\.)?experts)\.(?P<idx>\d+)\.(?P<rest>.+)$")
_NON_TEXT_HINTS = ("visual", "vision", "audio", "mm_projector", "image", "speech", "encoder")

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


_COMPANION_SET = frozenset(QUANT_COMPANIONS)
# Quantized stacked experts store `<param>_blocks` / `<param>_scales` for the 3-D `<param>` (MXFP4).
_STACK_COMPANIONS = ("_blocks", "_scales")

# A layer or expert id in a tensor name: ASCII digits, at most this many. A longer run (a 5,000-digit
# "layer" would hit Python's int-conversion limit) or a non-ASCII digit (`str.isdigit` accepts `²`, which
# `int` refuses) is not an id: the name is then treated like any other unsplit name.
MAX_ID_DIGITS = 12


def is_index(text: str) -> bool:
    """True for a name component that is a layer/expert id (`0`, `17`), bounded and ASCII."""
    return 0 < len(text) <= MAX_ID_DIGITS and text.isascii() and text.isdigit()


def parse_index(text: str) -> int | None:
    return int(text) if is_index(text) else None


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


def split_layer(name: str) -> tuple[str, int, str] | None:
    """`model.layers.3.mlp.gate.weight` → (`model.layers`, 3, `mlp.gate.weight`)."""
    i = name.find(".layers.")
    if i > 0:
        idx, _, tail = name[i + 8 :].partition(".")
        if is_index(idx) and tail:
            return name[: i + 7], int(idx), tail
    m = _LAYER_RE.match(name)
    if m and is_index(m["idx"]):
        return m["prefix"], int(m["idx"]), m["rest"]
    return None


def split_tail(tail: str) -> tuple[str | None, int, str]:
    """`mlp.experts.7.down_proj.weight_packed` → (`mlp.experts`, 7, `down_proj.weight`)."""
    em = _EXPERT_RE.match(tail) if "experts." in tail else None
    if em and is_index(em["idx"]):
        return em["head"], int(em["idx"]), normalize_param(em["rest"])
    return None, -1, normalize_param(tail)


# ---- name templates ---------------------------------------------------------------------------------
# `model.layers.3.mlp.experts.7.down_proj` is the template `model.layers.{i}.mlp.experts.{e}.down_proj` with
# the ids ("3", "7"). Names of one template differ only in those digit runs, so a question whose answer
# cannot depend on them (or only on their lengths) is answered once per template instead of once per name.

Template = tuple[str, ...]  # literal parts around the id slots: ("model.layers.", ".mlp.experts.", ".down_proj")


def _tail_template(tail: str) -> tuple[str, str, str] | None:
    """`mlp.experts.7.down_proj` → (`mlp.experts.`, `7`, `.down_proj`), as `split_tail` finds the expert id."""
    em = _EXPERT_RE.match(tail) if "experts." in tail else None
    if em is None:
        return None
    start = len(em["head"]) + 1
    end = start + len(em["idx"])
    value = tail[start:end]
    return (tail[:start], value, tail[end:]) if value.isascii() else None


def name_template(
    name: str, _tails: dict[str, tuple[str, str, str] | None] | None = None
) -> tuple[Template, tuple[str, ...]]:
    """(template parts, slot values as written) of a name; a name outside any layer is its own template.
    Slots are the layer id (as `split_layer` finds it) and the expert id (as `split_tail` does)."""
    split = split_layer(name)
    if split is None:
        return (name,), ()
    start = len(split[0]) + 1
    end = name.find(".", start)
    layer = name[start:end]
    if not (layer.isascii() and layer.isdigit()):
        return (name,), ()
    tail = split[2]
    if _tails is None:
        got = _tail_template(tail)
    else:
        got = _tails.get(tail, False)
        if got is False:
            got = _tails[tail] = _tail_template(tail)
    if got is None:
        return (name[:start], name[end:]), (layer,)
    return (name[:start], "." + got[0], got[2]), (layer, got[1])


def group_by_template(names: Iterable[str]) -> dict[Template, list[tuple[str, tuple[str, ...]]]]:
    """Names grouped by template, each with its slot values."""
    groups: dict[Template, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
    tails: dict[str, tuple[str, str, str] | None] = {}
    for name in names:
        # Inlined fast path of name_template for `<prefix>.layers.<i>.<tail>` (most names of a checkpoint).
        i = name.find(".layers.")
        if i > 0:
            idx, _, tail = name[i + 8 :].partition(".")
            if tail and idx.isascii() and idx.isdigit():
                got = tails.get(tail, False)
                if got is False:
                    got = tails[tail] = _tail_template(tail)
                if got is None:
                    groups[(name[: i + 8], "." + tail)].append((name, (idx,)))
                else:
                    groups[(name[: i + 8], "." + got[0], got[2])].append((name, (idx, got[1])))
                continue
        parts, values = name_template(name, tails)
        groups[parts].append((name, values))
    return groups


def expand_template(parts: Template, values: tuple[str, ...]) -> str:
    out = [parts[0]]
    for value, part in zip(values, parts[1:], strict=True):
        out += [value, part]
    return "".join(out)


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
