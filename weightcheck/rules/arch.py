"""Architecture knowledge rules: what could not be checked, and fused (3-D) expert tensors.

WC339: a quantization method whose weight format weightcheck does not model (the checks that could not run).
WC427: no architecture pattern: what was inferred from the checkpoint itself.
WC428: stacked expert tensors (`experts.gate_up_proj` [E, ...]) whose leading dim is not the config's E.
WC429: config-only lint with no architecture pattern: ignore entries could not be checked.
"""

from __future__ import annotations

from collections import defaultdict
from operator import itemgetter

from weightcheck.collapse import summarize
from weightcheck.findings import Severity
from weightcheck.names import stacked_expert_tail
from weightcheck.rules import LintContext, rule
from weightcheck.rules.quant import analysis_of
from weightcheck.structure import EXPERT_COUNT_KEYS, config_int

CONFIG_FILE = "config.json"
# Checks a quantization method needs a weight-format model for: named in WC339 so a CI gate knows what
# did not run.
_FORMAT_CHECKS = "WC307 (targeted modules stored quantized), WC313/WC314 (companions and their shapes)"


@rule(
    "WC339",
    "quant-method-unchecked",
    Severity.WARNING,
    summary="A quantization method (or option) whose weight format weightcheck does not model.",
    bad='"quantization_config": {"quant_method": "my_int3"}   (no consumer registers it)',
    good='"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [...]}',
    needs=("config",),
)
def quant_method_unchecked(ctx: LintContext) -> None:
    """Every `quant_method` that transformers 5.17 (`AUTO_QUANTIZATION_CONFIG_MAPPING`) or SGLang 0.5.23
    (`QUANTIZATION_METHODS`) accepts is loadable, so it is never an error here. For those weightcheck has
    no weight-format model of, and for names no consumer registers, the finding says which checks could
    not run; ignore-list checks still run wherever the method's ignore field is known."""
    qa = analysis_of(ctx)
    spec = qa.spec
    if spec is None:
        return
    for item in spec.unchecked:
        skipped = _FORMAT_CHECKS if not spec.schemes else "none of the ignore-list checks are affected"
        ctx.report(f"{spec.source}: {item}; checks that could not run: {skipped}", file=CONFIG_FILE)


@rule(
    "WC429",
    "ignore-list-unchecked",
    Severity.INFO,
    summary="Config-only lint of an architecture with no pattern: the ignore list could not be checked.",
    bad="config.json of model_type 'my_moe' + quantization_config.ignore, no weights, no pattern",
    good="a model_type weightcheck has a pattern for (see `patterns/`), or the weights themselves",
    needs=("config",),
)
def ignore_list_unchecked(ctx: LintContext) -> None:
    """Without tensors and without an architecture pattern there is no module list, so routers left out of
    the ignore list, partially ignored fused groups and over-reaching regexes cannot be found. A CI gate
    must not read that as green: this finding says so (raise it with `--fail-on info`)."""
    if not ctx.options.get("config_only"):
        return
    qa = analysis_of(ctx)
    if qa.spec is None or qa.inventory is not None:
        return
    text = ctx.ckpt.text_config()
    n = len(qa.spec.ignore)
    ctx.report(
        f"no architecture pattern for model_type {text.get('model_type')!r} and no weights: the {n} "
        f"{qa.spec.ignore_field} entries could not be matched to modules (routers, fused groups and regex "
        "reach are unchecked); lint the weights or pass --pattern",
        file=CONFIG_FILE,
        details={"model_type": text.get("model_type"), "entries": n},
    )


def tensor_ranks(ctx: LintContext) -> frozenset[int]:
    """The ranks (len of shape) of the stored tensors, in C-level passes over the headers' entries, once: a
    checkpoint with no 3-D tensor (every per-expert one) lets the stacked-expert checks skip the ~90k names."""
    return ctx.memo("tensor-ranks", lambda: frozenset(map(len, map(_shape_of, ctx.ckpt.all_tensors().values()))))


_shape_of = itemgetter(2)  # a TensorInfo's shape


@rule(
    "WC428",
    "fused-experts-incomplete",
    Severity.ERROR,
    summary="A stacked expert tensor (3-D `experts.gate_up_proj`) holds more or fewer experts than the config.",
    bad="num_local_experts 32: model.layers.3.mlp.experts.down_proj [31, 2880, 2880]",
    good="every `experts.*` 3-D tensor (and its MXFP4 `_blocks`/`_scales`) has leading dim 32",
)
def fused_experts_incomplete(ctx: LintContext) -> None:
    """gpt-oss, Llama-4, GraniteMoE and transformers-5 writers store each layer's experts as one tensor
    whose leading dim is the expert id. An expert lost in gathering (an EP rank's slice never concatenated)
    leaves a shorter tensor, which no per-expert-name check can see; engines then fail at load or, when the
    loader narrows by the local expert range, silently run with the wrong experts."""
    total = config_int(ctx.ckpt.text_config(), EXPERT_COUNT_KEYS, "experts")
    if not total:
        return
    # Stacked expert modules: what the pattern says (kind `experts`, e.g. GraniteMoE's
    # `block_sparse_moe.input_linear`), else any `.experts.<param>` 3-D tensor.
    qa = analysis_of(ctx)
    if max(tensor_ranks(ctx), default=0) < 3:  # no 3-D tensor: the loop below would skip every name
        return
    stacked = set()
    if qa.inventory is not None:
        stacked = {m.name for m in qa.inventory.modules.values() if m.kind == "experts"}
    groups: dict[tuple[int, str], list[str]] = defaultdict(list)
    for name, info in ctx.ckpt.all_tensors().items():
        if len(info.shape) < 3:
            continue
        module, _, param = name.rpartition(".")
        if module in stacked:
            tail = f"{module.rsplit('.', 1)[-1]}.{param}"
        elif (stacked_tail := stacked_expert_tail(name)) is not None:
            tail = stacked_tail
        else:  # per-expert names are WC403's business
            continue
        if info.shape[0] != total:
            groups[(info.shape[0], tail)].append(name)
    for (got, tail), names in sorted(groups.items()):
        verb = "missing" if got < total else "extra"
        ctx.report(
            f"{len(names)} stacked expert tensor(s) `{tail}` hold {got} experts, config says {total} "
            f"({abs(total - got)} {verb}): {summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
            details={"expected": total, "found": got, "tensors": names[:200]},
        )


@rule(
    "WC427",
    "architecture-inferred",
    Severity.INFO,
    summary="No architecture pattern: what was inferred from the checkpoint itself instead.",
    bad="model_type 'my_moe' (no pattern): layers, experts, routers and embeddings inferred from names/shapes",
    good="a model_type with a pattern (see `patterns/`; `weightcheck lint --pattern FILE` for a new one)",
)
def architecture_inferred(ctx: LintContext) -> None:
    """Without a pattern, lint still checks what the checkpoint says about itself: decoder layers against
    their peers (WC401/WC402), experts as repeated sub-trees (WC403) or as the leading dim of 3-D tensors
    equal to the config's expert count (WC428), 2-D `[num_experts, hidden]` weights treated as routers and
    `[vocab, hidden]` as embeddings by the quantization rules. This finding lists those inferences, so a
    reader knows which expectations came from the checkpoint rather than from the architecture."""
    from weightcheck.rules.layers import structure_of

    qa = analysis_of(ctx)
    if qa.pattern is not None or qa.inventory is None or qa.inventory.from_config_only:
        return
    text = ctx.ckpt.text_config()
    s = structure_of(ctx)
    made: list[str] = []
    if s.prefix is not None:
        made.append(f"decoder layers: `{s.prefix}.N` ({len(s.ids)} found; config says {s.num_hidden_layers}), "
                    "each checked against its peers")  # fmt: skip
    moe_layers = [layer for layer in s.ids if s.is_moe(layer)]
    if moe_layers:
        made.append(f"experts: repeated sub-trees in {len(moe_layers)} layer(s) (config count {s.num_experts})")
    total = config_int(text, EXPERT_COUNT_KEYS, "experts")
    hidden = text.get("hidden_size") if isinstance(text.get("hidden_size"), int) else None
    vocab = text.get("vocab_size") if isinstance(text.get("vocab_size"), int) else None
    stacked = routers = embeds = 0
    for module in qa.inventory.modules.values():
        weight = module.params.get("weight")
        shapes = [tuple(p.shape) for p in module.params.values() if p is not None]
        if total and any(len(sh) == 3 and sh[0] == total for sh in shapes):
            stacked += 1
        if weight is not None and len(weight.shape) == 2:
            rows, cols = weight.shape
            if total and hidden and (rows, cols) == (total, hidden):
                routers += 1
            elif vocab and hidden and (rows, cols) == (vocab, hidden) and module.kind == "embedding" \
                    and "embed" not in module.name.rsplit(".", 1)[-1]:  # fmt: skip
                embeds += 1
    if stacked:
        made.append(f"{stacked} module(s) with 3-D tensors whose leading dim is the expert count {total}: "
                    "stacked experts")
    if routers:
        made.append(f"{routers} 2-D [num_experts={total}, hidden={hidden}] weight(s): routers")
    if embeds:
        made.append(f"{embeds} 2-D [vocab={vocab}, hidden={hidden}] weight(s) not named as embeddings: embeddings")
    if made:
        ctx.report(
            f"no architecture pattern for model_type {text.get('model_type')!r}; inferred from the checkpoint: "
            + "; ".join(made),
            details={"inferences": made},
        )
