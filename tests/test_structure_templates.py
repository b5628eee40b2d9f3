"""structure.analyze works on name templates; it must give what the per-name analysis gave.

`per_name_analyze` below is the analysis as it was before templates (weightcheck 964fc0f), kept here as the
oracle: the template version is compared with it on real architectures' names and on hostile ones (ids too
long to be ids, non-ASCII digits, several containers, loose layers)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import pytest

from weightcheck.names import is_index, split_layer
from weightcheck.structure import (
    _NON_TEXT_HINTS,
    EXPERT_COUNT_KEYS,
    MTP_COUNT_KEYS,
    LayerStructure,
    analyze,
    config_int,
    split_tail,
)


def per_name_analyze(names: Iterable[str], text_config: dict[str, Any]) -> LayerStructure:
    """structure.analyze as it was before it worked on templates: one name at a time."""
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


def _view(s: LayerStructure) -> dict[str, Any]:
    return {
        "prefix": s.prefix,
        "layers": {k: sorted(v) for k, v in s.layer_tensors.items()},
        "signatures": s.signatures,
        "experts": s.experts,
        "counts": (s.num_hidden_layers, s.num_mtp_layers, s.num_experts),
        "mtp": (s.mtp_prefix, s.mtp_ids),
        "other": s.other_prefixes,
        "unsplit": sorted(s.unsplit),
        "distinct": s.distinct_parts,
    }


def _deepseek(layers: int = 5, experts: int = 8) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(layers + 1):
        p = f"model.layers.{i}"
        names += [f"{p}.input_layernorm.weight", f"{p}.self_attn.q_a_proj.weight",
                  f"{p}.self_attn.q_a_proj.weight_scale_inv"]  # fmt: skip
        if i:
            names += [f"{p}.mlp.experts.{e}.{x}_proj.{w}" for e in range(experts) for x in ("gate", "up", "down")
                      for w in ("weight", "weight_scale_inv")]  # fmt: skip
            names += [f"{p}.mlp.gate.weight", f"{p}.mlp.shared_experts.down_proj.weight"]
    names += [f"model.layers.{layers}.eh_proj.weight"]
    return names


CASES = {
    "deepseek_v3 with MTP": (_deepseek(), {"num_hidden_layers": 5, "num_nextn_predict_layers": 1,
                                            "n_routed_experts": 8}),
    "gpt2": ([f"transformer.h.{i}.{m}" for i in range(4) for m in ("attn.c_attn.weight", "mlp.c_fc.bias")]
             + ["transformer.wte.weight"], {"n_layer": 4}),
    "vlm": ([f"model.language_model.layers.{i}.mlp.down_proj.weight" for i in range(3)]
            + [f"model.visual.blocks.{i}.attn.qkv.weight" for i in range(5)], {"num_hidden_layers": 3}),
    "glm mtp module": ([f"model.layers.{i}.mlp.experts.{e}.down_proj.weight_packed" for i in range(2)
                        for e in range(4)] + ["mtp.layers.0.enorm.weight", "mtp.layers.0.eh_proj.weight"],
                       {"num_hidden_layers": 2}),
    "hostile": (["model.layers.1234567890123.mlp.weight", "model.layers.1234567890123.h.2.x.weight",
                 "model.layers.0.mlp.experts.1234567890123.w1.weight", "model.layers.0.mlp.experts.3.w1.weight",
                 "model.layers.0.mlp.experts.\u00b23.w1.weight", "model.layers.\u00b2.h.1.w",
                 "layers.0.a.weight", "model.layers.0.model.layers.1.x", "a.blocks.2.experts.0.gate_up_proj",
                 "model.layers.0.mlp.experts.gate_up_proj_blocks", "model.model.layers.1.q.weight",
                 "x.layer.1.y", "model.layers.0.mlp.experts.0.down_proj.weight.absmax"],
                {"num_hidden_layers": 2}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_template_analysis_equals_per_name(case):
    names, cfg = CASES[case]
    assert _view(analyze(frozenset(names), cfg)) == _view(per_name_analyze(list(names), cfg))


def test_template_analysis_equals_per_name_on_random_damage():
    rng = random.Random(20)
    base = _deepseek(layers=6, experts=6)
    for _ in range(40):
        names = [n for n in base if rng.random() > 0.05]
        for _ in range(rng.randint(0, 4)):  # renumber or corrupt a few names
            i = rng.randrange(len(names))
            names[i] = names[i].replace(".3.", rng.choice([".33.", ".x.", ".007.", ".1234567890123."]), 1)
        cfg = {"num_hidden_layers": 6, "num_nextn_predict_layers": rng.choice([0, 1]), "n_routed_experts": 6}
        assert _view(analyze(set(names), cfg)) == _view(per_name_analyze(names, cfg))
