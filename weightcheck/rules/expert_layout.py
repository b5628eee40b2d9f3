"""WC432: routed experts stored in a layout the declared engine does not read.

transformers 5 holds most MoEs' experts fused in memory (3-D `mlp.experts.gate_up_proj` / `down_proj`) and
converts them back to per-expert names on `save_pretrained`; gpt-oss, Llama-4, Qwen3-VL-MoE and GraniteMoE
stay fused on disk. An exporter that writes the in-memory state dict, or a converter that splits what the
engine wants fused, produces a checkpoint whose every tensor is present and well-formed, yet SGLang's
`load_weights` skips the experts (they keep their random init) or raises. What each SGLang class reads is
generated data (`routed_experts` in patterns/generated/sglang/<model_type>.json), found by running the
class's own `load_weights` on each layout, not by reading its source.
"""

from __future__ import annotations

from weightcheck.collapse import summarize
from weightcheck.findings import Severity
from weightcheck.names import is_stacked_expert, layer_tail
from weightcheck.rules import LintContext, rule, templates_of
from weightcheck.rules.arch import tensor_ranks
from weightcheck.rules.quant import analysis_of
from weightcheck.structure import EXPERT_COUNT_KEYS, config_int

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any


def _tail(name: str, prefix: str) -> str | None:
    """`model.layers.3.mlp.experts.7.down_proj.weight` under `model.layers` → `mlp.experts.*.down_proj.weight`."""
    return layer_tail(name, prefix)


def _labels(shape: tuple[int, ...], experts: int, hidden: int | None) -> list[str] | None:
    """Which dims are the expert count and the hidden size; None when ambiguous (a size repeats)."""
    if hidden is None or experts == hidden or list(shape).count(hidden) != 1 or list(shape).count(experts) != 1:
        return None
    return ["experts" if d == experts else "hidden" if d == hidden else "*" for d in shape]


def _deployed_sglang(consumers: list[str] | None) -> bool | None:
    """True: SGLang declared; False: consumers declared without it; None: nothing declared."""
    if consumers is None:
        return None
    return any(c.split("-")[0] == "sglang" for c in consumers)


@rule(
    "WC432",
    "expert-layout-unread",
    Severity.ERROR,
    summary="Routed experts are stored in a layout (per-expert or fused 3-D, and its orientation) that the "
    "declared engine's `load_weights` does not read.",
    bad="Mixtral written from transformers 5's in-memory state dict: model.layers.0.mlp.experts.gate_up_proj "
    "[8, 28672, 4096], served by SGLang (reads block_sparse_moe.experts.N.w1/w2/w3 only)",
    good="the same model written by save_pretrained: model.layers.0.block_sparse_moe.experts.0.w1.weight ...",
    also=(Severity.INFO,),
    # Applied in tests/test_fix_texts_all.py: a model *loaded from* the fused files is saved back fused
    # (transformers only reverses the conversion it applied on load), so the text names from_config.
    fix="write the checkpoint with the layout the engine reads: transformers `save_pretrained` writes the "
    "per-expert names most engines read for a model built from its config (`from_config` then "
    "`load_state_dict` of these tensors); one loaded with `from_pretrained` from these fused files is saved "
    "back fused. For a fused stack refused for its orientation, transpose its last two dims",
)
def expert_layout_unread(ctx: LintContext) -> None:
    """Judged against the engine's generated facts for the checkpoint's architecture: the layouts SGLang
    0.5.23's class was seen to read completely, and those it skipped or refused. A checkpoint whose routed
    expert tensors match a refused layout and no read one is reported. With `consumers` declared and
    SGLang among them, this is an error; declared without SGLang, it is not checked; with no consumers
    declared it is info (the checkpoint may be meant for transformers, which reads both of its own
    layouts): declare `consumers = ["sglang"]` to gate on it. Names that match no layout the facts know
    are left alone (nothing is known about them)."""
    deployed = _deployed_sglang(ctx.options.get("consumers"))
    if deployed is False:
        return
    qa = analysis_of(ctx)
    pattern = qa.pattern
    if pattern is None or not pattern.model_types:
        return
    known = next((k for t in pattern.model_types if (k := _facts(t)) is not None), None)
    if known is None:
        return
    sglang_class, facts = known
    layouts = [lay for lay in facts["layouts"] if isinstance(lay, dict) and isinstance(lay.get("names"), list)]
    text = ctx.ckpt.text_config()
    experts = config_int(text, EXPERT_COUNT_KEYS, "experts")
    hidden = text.get("hidden_size") if isinstance(text.get("hidden_size"), int) else None
    every = {n for lay in layouts for n in lay["names"]}
    # tail -> its checkpoint names, as the template member lists that hold them (expanded only to report)
    found: dict[str, list[list[tuple[str, tuple[str, ...]]]]] = {}
    dims: dict[str, list[str] | None] = {}
    tensors = ctx.ckpt.all_tensors()
    head = pattern.layer_prefix + "."
    # Whether any tensor is 3-D, in C-level passes over the headers' entries: when none is (every per-expert
    # checkpoint), no template member is a stack, and the ~90k expert members are not looked at one by one.
    any_3d = 3 in tensor_ranks(ctx)

    def take(tail: str | None, members: list[tuple[str, tuple[str, ...]]]) -> None:
        if tail is None:
            return
        per_expert = tail in every or "experts.*." in tail
        if not per_expert and not is_stacked_expert(tail):
            return
        stacks = [m for m in members if len(tensors[m[0]].shape) == 3] if any_3d else []
        if per_expert or stacks:
            found.setdefault(tail, []).append(members if per_expert else stacks)
        if stacks and experts:
            dims.setdefault(tail, _labels(tuple(tensors[stacks[0][0]].shape), experts, hidden))

    for parts, members in templates_of(ctx).items():
        if parts[0] == head:  # names of a template directly under the layer container share one tail
            take(_tail(members[0][0], pattern.layer_prefix), members)
        else:  # a template split elsewhere (or none): each name on its own
            for member in members:
                take(_tail(member[0], pattern.layer_prefix), [member])
    if not found:
        return

    def fits(lay: dict[str, Any]) -> bool:
        if not set(found) <= set(lay["names"]):
            return False
        want = lay.get("dims") or {}
        return all(dims.get(t) is None or t not in want or dims[t] == want[t] for t in found)

    if any(fits(lay) and lay.get("read") == "all" for lay in layouts):
        return
    readable = [lay for lay in layouts if lay.get("read") == "all"]
    refused = next((lay for lay in layouts if fits(lay) and lay.get("read") != "all"), None)
    style = {"per_expert" if "experts.*." in t else "fused" for t in found}
    if refused is None and len(style) == 1 and readable and not any(lay["style"] in style for lay in readable):
        # names no probe fed, in a style the class reads in no form (per-expert names for gpt-oss)
        refused = {"source": "style", "style": next(iter(style)), "names": sorted(found)}
    if refused is None:
        return  # a mix the facts do not know: WC403/WC428 judge completeness, not this rule
    how = (f"its load_weights raises {refused['error']}" if refused.get("error")
           else "its load_weights has no mapping for them" if refused["source"] == "style"
           else "its load_weights skips them")  # fmt: skip
    if refused["source"].endswith("_transposed") or any(lay["names"] == refused["names"] for lay in readable):
        what = "in this orientation (the names are read, the last two dims are swapped)"
    else:
        what = f"({refused['style'].replace('_', '-')} layout)"
    def shown(lay: dict[str, Any]) -> str:
        dims_of = lay.get("dims") or {}
        return ", ".join(f"`{n}`" + (f" [{', '.join(dims_of[n])}]" if n in dims_of else "") for n in lay["names"])

    reads = ("; it reads " + " or ".join(shown(lay) for lay in readable[:2])
             if readable else "; it read none of the layouts tried: its routed experts stay uninitialised")
    names = sorted(n for lists in found.values() for members in lists for n, _ in members)
    severity = Severity.ERROR if deployed else Severity.INFO
    ctx.report(
        f"SGLang's {sglang_class} does not read routed experts stored as "
        + ", ".join(f"`{t}`" for t in sorted(found)) + f" {what}: {how}{reads}"
        + ("" if deployed else " (info: no consumers declared; declare consumers = [\"sglang\"] to gate on it)"),
        tensor=summarize(names, limit=3),
        count=len(names),
        severity=severity,
        details={"engine_class": sglang_class, "stored": sorted(found), "refused_layout": refused["source"],
                 "readable": [lay["names"] for lay in readable], "tensors": names[:200]},
    )


def _facts(model_type: str) -> tuple[str, dict[str, Any]] | None:
    from weightcheck.patterns import sglang_routed_experts

    return sglang_routed_experts(model_type)
