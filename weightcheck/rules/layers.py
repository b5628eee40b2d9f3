"""WC4xx (pattern-free part): every layer and expert present, peers alike, no doubled prefixes, tie flag.

These rules need no architecture knowledge: they use config.json counts and compare layers with their
peers. Pattern-driven expected-key rules (WC41x) build on the same structure.
"""

from __future__ import annotations

from collections import defaultdict

from weightcheck.collapse import ids_pattern, summarize
from weightcheck.findings import Severity
from weightcheck.lazyregex import LazyRegex
from weightcheck.names import PEFT_PREFIX, last_segments_fixed
from weightcheck.rules import LintContext, name_templates, rule
from weightcheck.structure import LAYER_COUNT_KEYS, MAX_PLAUSIBLE, LayerStructure, analyze, majority


def structure_of(ctx: LintContext) -> LayerStructure:
    return ctx.memo(
        "structure", lambda: analyze(ctx.ckpt.tensor_names(), ctx.ckpt.text_config(), name_templates(ctx))
    )


def _layer_names(s: LayerStructure, layers: list[int], suffixes: list[str]) -> list[str]:
    return [f"{s.prefix}.{layer}.{suffix}" for layer in layers for suffix in suffixes]


@rule(
    "WC401",
    "decoder-layer-missing",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="A decoder layer 0..num_hidden_layers-1 has no tensors at all.",
    bad="config.json num_hidden_layers = 48; the index has model.layers.0..46 (47 missing)",
    good="Every layer id below num_hidden_layers has tensors.",
)
def decoder_layer_missing(ctx: LintContext) -> None:
    """A layer dropped by a converter (PP stage not gathered, a shard never written) leaves the engine's
    layer uninitialized, and nothing raises (NVIDIA-NeMo/Megatron-Bridge#4188, areal-project/AReaL#1403,
    NVIDIA/Megatron-LM#1304). Layer ids come from tensor names under
    the language model's layer container (`model.layers`, `model.language_model.layers`, ...). With no
    architecture pattern, layers 0..n-1 stored beside a second stack of as many layers (HRM's
    `H_module`/`L_module`), or matching another count key of the config (LongCat-Flash's `num_layers`, with
    `num_hidden_layers` twice that), say the config's count may not be this stack's: a warning."""
    s = structure_of(ctx)
    if s.num_hidden_layers is None or s.prefix is None:
        return
    missing = sorted(set(range(s.num_hidden_layers)) - s.ids)
    if missing:
        # Without a pattern, a second stack of as many layers (HRM's H_module and L_module, whose config counts
        # the unrolled cycles) says the config's count may not be this stack's.
        parallel = sorted(p for p, count in s.other_prefixes.items() if count == len(s.ids) and not p.startswith("mtp"))
        # ... and another count key of the config that the stored layers 0..n-1 match (LongCat-Flash: `num_layers`
        # physical layers of two sublayers each, `num_hidden_layers` twice that, as transformers writes it).
        cfg = ctx.ckpt.text_config()
        stored = len(s.ids) if s.ids == set(range(len(s.ids))) else None
        other_key = next((k for k in LAYER_COUNT_KEYS[1:] if stored and cfg.get(k) == stored), None)
        why = ""
        if parallel:
            why = f"{parallel[0]} holds as many layers as {s.prefix}"
        elif other_key:
            why = f"config.json's {other_key} ({stored}) matches the stored layers"
        unsure = bool(why) and not _pattern_known(ctx)
        ctx.report(
            f"{len(missing)} of {s.num_hidden_layers} decoder layers have no tensors: "
            f"{s.prefix}.{ids_pattern(missing)}"
            + (
                f"; {why}, and no architecture pattern says whether num_hidden_layers counts this stack (check the "
                "model class)"
                if unsure
                else ""
            ),
            tensor=f"{s.prefix}.{ids_pattern(missing)}.*",
            count=len(missing),
            severity=Severity.WARNING if unsure else None,
            details={"missing_layers": missing},
        )


@rule(
    "WC402",
    "layer-keys-differ",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="A layer's set of weights differs from its peers (a projection, norm or router missing).",
    bad="model.layers.{3,7}.self_attn.k_proj.weight missing while 46 peer layers have it",
    good="All dense layers share one key set, all MoE layers share one key set.",
)
def layer_keys_differ(ctx: LintContext) -> None:
    """Layers are compared with peers of the same kind (dense, MoE, MTP). The most common key set of each
    kind is the reference; a layer lacking some of its keys, or carrying a few extra, is reported with the
    names. Expert indices are folded (`experts.*`) and quantization companions are folded onto `weight`, so
    quantization differences are left to the WC3xx rules. Layers whose key sets differ wholesale (hybrid
    attention/linear-attention stacks) are treated as another kind, not as broken. With no architecture
    pattern, keys lacking only in a run of layers at the start or end of the stack are a warning: classes build
    those differently (ModernBERT's layer 0, DeepSeek-V4's hash-routed layers)."""
    s = structure_of(ctx)
    if s.prefix is None or len(s.signatures) < 2:
        return
    known = _pattern_known(ctx)
    kinds: dict[str, list[int]] = defaultdict(list)
    for layer in s.signatures:
        kind = "mtp" if s.is_mtp(layer) else ("moe" if s.is_moe(layer) else "dense")
        kinds[kind].append(layer)
    for kind, layers in kinds.items():
        if len(layers) < 2:
            continue
        ref = majority(s.signatures[layer] for layer in layers)
        assert ref is not None
        peers = sum(1 for layer in layers if s.signatures[layer] == ref)
        missing_groups: dict[frozenset[str], list[int]] = defaultdict(list)
        extra_groups: dict[frozenset[str], list[int]] = defaultdict(list)
        for layer in layers:
            sig = s.signatures[layer]
            if sig == ref:
                continue
            missing, extra = ref - sig, sig - ref
            # A wholesale difference is another layer type, not a broken layer.
            if len(missing) + len(extra) > max(2, len(ref) // 3) and missing and extra:
                continue
            if missing:
                missing_groups[frozenset(missing)].append(layer)
            if extra and peers > 1:
                extra_groups[frozenset(extra)].append(layer)
        for keys, ids in sorted(missing_groups.items(), key=lambda kv: min(kv[1])):
            names = _layer_names(s, ids, sorted(keys))
            at_edge = not known and _edge_run(ids, sorted(layers))
            ctx.report(
                f"{kind} layers {ids_pattern(ids)} lack {len(keys)} key(s) that their {peers} peer "
                f"layers have: {summarize(names)}" + (f"; {_EDGE_NOTE}" if at_edge else ""),
                tensor=summarize(names, limit=3),
                count=len(names),
                severity=Severity.WARNING if at_edge else None,
                details={"layers": ids, "missing": sorted(keys), "tensors": names[:1000]},
            )
        for keys, ids in sorted(extra_groups.items(), key=lambda kv: min(kv[1])):
            names = _layer_names(s, ids, sorted(keys))
            ctx.report(
                f"{kind} layers {ids_pattern(ids)} carry {len(keys)} key(s) that their {peers} peer "
                f"layers do not: {summarize(names)}",
                tensor=summarize(names, limit=3),
                count=len(names),
                severity=Severity.WARNING,
                details={"layers": ids, "extra": sorted(keys)},
            )


_EDGE_NOTE = (
    "the first or last layers of the stack, and no architecture pattern says whether this model builds them "
    "differently (ModernBERT's layer 0 has no attention norm; DeepSeek-V4's hash-routed first layers hold a "
    "routing table): check the model class"
)


def _edge_run(ids: list[int], layers: list[int]) -> bool:
    """The layers form one run at the start or the end of their kind's stack (`layers`, sorted)."""
    run, count = sorted(ids), len(ids)
    return count < len(layers) and run in (layers[:count], layers[-count:])


def _pattern_known(ctx: LintContext) -> bool:
    """An architecture pattern (generated, hand-written or borrowed) describes this checkpoint's model."""
    from weightcheck.rules.quant import analysis_of

    return analysis_of(ctx).pattern is not None


@rule(
    "WC403",
    "experts-incomplete",
    Severity.ERROR,
    summary="A MoE layer does not hold every expert 0..E-1, or an expert lacks weights its siblings have.",
    bad="model.layers.5.mlp.experts.{96..127}.* missing (config n_routed_experts = 128)",
    good="Every MoE layer stores experts 0..E-1, each with the same projections.",
)
def experts_incomplete(ctx: LintContext) -> None:
    """The expert count comes from the config (`n_routed_experts`, `num_experts`, `num_local_experts`,
    `moe_num_experts`). An EP rank whose experts were never gathered, or gathered under local ids, leaves
    holes or duplicates (areal-project/AReaL#1595, THUDM/slime#2280). Experts above the count are reported too:
    engines skip them
    silently. Fused 3-D expert tensors (no per-expert index) are not counted here."""
    s = structure_of(ctx)
    if s.prefix is None or not s.experts:
        return
    missing_by: dict[tuple[str, tuple[int, ...]], dict[int, list[int]]] = defaultdict(dict)
    beyond_by: dict[str, dict[int, list[int]]] = defaultdict(dict)
    partial: dict[tuple[str, frozenset[str]], list[str]] = defaultdict(list)
    for layer, heads in sorted(s.experts.items()):
        for head, experts in heads.items():
            # Without a config count, the highest id seen decides (capped: ids come from untrusted names).
            expected = s.num_experts if s.num_experts is not None else min(max(experts) + 1, MAX_PLAUSIBLE["experts"])
            ids = set(experts)
            missing = sorted(set(range(expected)) - ids)
            beyond = sorted(i for i in ids if i >= expected)
            if missing:
                missing_by[(head, tuple(missing))][layer] = missing
            if beyond:
                beyond_by[head][layer] = beyond
            ref = majority(experts.values())
            assert ref is not None
            for e, sig in experts.items():
                lack = ref - sig
                if lack:
                    for suffix in lack:
                        partial[(head, frozenset({suffix}))].append(f"{s.prefix}.{layer}.{head}.{e}.{suffix}")
    for (head, missing_ids), layers in sorted(missing_by.items()):
        ids = sorted(layers)
        total = s.num_experts
        ctx.report(
            f"MoE layers {ids_pattern(ids)} lack experts {ids_pattern(missing_ids)}"
            + (f" (config declares {total})" if total is not None else ""),
            tensor=f"{s.prefix}.{ids_pattern(ids)}.{head}.{ids_pattern(missing_ids)}.*",
            count=sum(len(v) for v in layers.values()),
        )
    for head, layers in sorted(beyond_by.items()):
        ids = sorted(layers)
        all_beyond = sorted({e for v in layers.values() for e in v})
        ctx.report(
            f"MoE layers {ids_pattern(ids)} hold experts {ids_pattern(all_beyond)} beyond the "
            f"config's {s.num_experts} experts (engines skip them silently)",
            tensor=f"{s.prefix}.{ids_pattern(ids)}.{head}.{ids_pattern(all_beyond)}.*",
            count=sum(len(v) for v in layers.values()),
        )
    for (_, _), names in sorted(partial.items()):
        ctx.report(
            f"{len(names)} expert weights missing while sibling experts have them: {summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
        )


@rule(
    "WC404",
    "mtp-layer-missing",
    Severity.WARNING,
    summary="config.json declares MTP / next-n layers that the checkpoint does not store.",
    bad="num_nextn_predict_layers = 1, num_hidden_layers = 61, but no model.layers.61.*",
    good="model.layers.61.{eh_proj,enorm,hnorm,shared_head...} present (DeepSeek-V3 layout)",
)
def mtp_layer_missing(ctx: LintContext) -> None:
    """DeepSeek-V3, GLM-4.x MoE and MiMo number MTP layers after the decoder layers
    (`model.layers.{num_hidden_layers + i}`); Qwen3-Next/Qwen3.5 use a separate `mtp.*` module. Exports
    with MTP disabled drop them, which breaks speculative decoding (and in several bridges broke the
    surrounding shards, NVIDIA-NeMo/Megatron-Bridge#4188, areal-project/AReaL#1403). A warning: serving without MTP
    still works."""
    s = structure_of(ctx)
    if s.prefix is None or s.num_hidden_layers is None or s.num_mtp_layers <= 0:
        return
    n = s.num_hidden_layers
    expected = set(range(n, n + s.num_mtp_layers))
    if s.mtp_prefix is not None:
        if len(s.mtp_ids) < s.num_mtp_layers:
            ctx.report(
                f"config declares {s.num_mtp_layers} MTP layers; {s.mtp_prefix} holds {len(s.mtp_ids)}",
                tensor=f"{s.mtp_prefix}.*",
            )
        return
    missing = sorted(expected - s.ids)
    if missing and not any(name.startswith("mtp.") for name in ctx.ckpt.tensor_names()):
        ctx.report(
            f"config declares {s.num_mtp_layers} MTP layer(s) at {s.prefix}.{ids_pattern(missing)} but none are stored",
            tensor=f"{s.prefix}.{ids_pattern(missing)}.*",
            count=len(missing),
        )


# A non-numeric dotted component immediately repeated: `language_model.language_model`, `model.model`.
_REPEATED_SEGMENT = LazyRegex(r"(?:^|\.)([^.\d][^.]*)\.\1(?=\.|$)")


# A repeat at the start of the name, or of a wrapper's own name anywhere (`model.language_model.language_model`).
_ROOT_REPEAT = LazyRegex(
    r"^([^.\d][^.]*)\.\1\.|(?:^|\.)(model|language_model|text_model|transformer|decoder|backbone)\.\2\."
)


@rule(
    "WC405",
    "repeated-path-segment",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="A tensor name repeats a path segment (`language_model.language_model.`, `model.model.`).",
    bad="language_model.language_model.layers.0.mlp.experts.w2_weight_packed",
    good="model.language_model.layers.0.mlp.experts.0.down_proj.weight_packed",
)
def repeated_path_segment(ctx: LintContext) -> None:
    """Writers that prepend a prefix to names that already carry it produce doubled segments; the engine
    then finds no parameter of that name (vllm-project/llm-compressor#2568: KeyError at load). With no
    architecture pattern, a repeat below the root that is not a wrapper's name (`model`, `language_model`, ...)
    may be the class's own (CPM-Ant's `ffn.ffn`): a warning."""
    # Check each distinct prefix/tail once (a few thousand strings even on DeepSeek-V3), then expand.
    s = structure_of(ctx)
    bad_parts = {p for p in s.distinct_parts if _REPEATED_SEGMENT.search(p)}
    doubled = [n for n in s.unsplit if _REPEATED_SEGMENT.search(n)]
    if bad_parts:
        for layer_names in s.layer_tensors.values():
            doubled.extend(n for n in layer_names if any(part in n for part in bad_parts))
        for prefix, count in s.other_prefixes.items():
            if prefix in bad_parts and count:
                doubled.extend(n for n in ctx.ckpt.tensor_names() if n.startswith(prefix + "."))
    doubled = sorted(set(doubled) - _architecture_names(ctx))
    if doubled and (ctx.ckpt.peft_adapter() is not None or ctx.ckpt.stray_adapter_files()):
        # PEFT's own wrapper path (`base_model.model.` + the base model's `model.layers...`): judged without it
        # (an adapter file in a model's folder is WC105's)
        cut = len(PEFT_PREFIX)
        doubled = [n for n in doubled if not n.startswith(PEFT_PREFIX) or _REPEATED_SEGMENT.search(n[cut:])]
    if not doubled:
        return
    if _pattern_known(ctx):
        at_root, inner = doubled, []
    else:
        # No pattern to tell a class's own names from a doubled prefix: a repeat at the root, or of a wrapper's
        # name, is the writer's bug; one deeper down may be the class's (CPM-Ant's `ffn.ffn`, GIT's
        # `visual_projection.visual_projection`).
        at_root = [n for n in doubled if _ROOT_REPEAT.search(n)]
        inner = [n for n in doubled if not _ROOT_REPEAT.search(n)]
    if at_root:
        ctx.report(
            f"{len(at_root)} tensor names repeat a path segment: {summarize(at_root)}",
            tensor=summarize(at_root, limit=3),
            count=len(at_root),
        )
    if inner:
        ctx.report(
            f"{len(inner)} tensor names repeat a path segment below the root: {summarize(inner)}; no "
            "architecture pattern says whether the model class names them so (check the class)",
            tensor=summarize(inner, limit=3),
            count=len(inner),
            severity=Severity.WARNING,
        )


def _architecture_names(ctx: LintContext) -> set[str]:
    """Stored names the model class itself defines (its pattern, or the class's own names for a config
    outside the pattern's coverage): a repeated segment there is the architecture, not a writer's doubled
    prefix. LFM2's short-conv block is `conv` holding an `nn.Conv1d` also named `conv`, so every real LFM2
    checkpoint stores `model.layers.N.conv.conv.weight` (transformers' Lfm2ShortConv)."""
    from weightcheck.rules.quant import pattern_known_names

    return pattern_known_names(ctx)


@rule(
    "WC406",
    "layer-beyond-config",
    Severity.WARNING,
    summary="Tensors for layer ids at or above num_hidden_layers (+ MTP layers) that no engine will load.",
    bad="num_hidden_layers = 47, no MTP declared, but model.layers.47.* stored",
    good="Layer ids stay below num_hidden_layers + num_nextn_predict_layers.",
)
def layer_beyond_config(ctx: LintContext) -> None:
    """Engines skip layers above the configured count silently (SGLang GLM4-MoE, DeepSeek). Such tensors are
    either an MTP layer the config does not declare (set `num_nextn_predict_layers`) or a converter
    numbering bug (NVIDIA-NeMo/Megatron-Bridge#4188)."""
    s = structure_of(ctx)
    if s.prefix is None or s.num_hidden_layers is None:
        return
    limit = s.num_hidden_layers + s.num_mtp_layers
    beyond = sorted(i for i in s.ids if i >= limit)
    if beyond:
        ctx.report(
            f"layers {ids_pattern(beyond)} are at or beyond num_hidden_layers ({s.num_hidden_layers})"
            f" + MTP layers ({s.num_mtp_layers})",
            tensor=f"{s.prefix}.{ids_pattern(beyond)}.*",
            count=len(beyond),
        )


_LM_HEAD_RE = LazyRegex(r"(^|\.)\w+\.weight(_packed)?$")


def _head_leaves(ctx: LintContext) -> frozenset[str]:
    """Leaf names of the output head (`weightcheck.rules.quant.head_leaves`)."""
    from weightcheck.rules.quant import analysis_of, head_leaves

    return head_leaves(analysis_of(ctx).pattern)


def _task_class(ctx: LintContext) -> bool:
    """config.json names a task-head or base class (a reward model's `*ForSequenceClassification`, an embedding
    model's `Qwen3Model`): no LM head to tie or store (`weightcheck.patterns.for_architecture`)."""
    from weightcheck.rules.quant import analysis_of

    pattern = analysis_of(ctx).pattern
    return pattern is not None and pattern.task_class is not None


def _head_by_shape(ctx: LintContext) -> list[str]:
    """Without a pattern the head's name is unknown (BERT `cls.predictions.decoder`, RoBERTa `lm_head.decoder`,
    RWKV and DeepSeek-V4 `head`, Whisper `proj_out`, BioGPT `output_projection`, GIT `output`): the 2-D tensors
    outside the layers shaped `[vocab_size, n]`, when there are two: the input embedding and the head (whose
    width may differ: RemBERT's `output_embedding_size`)."""
    vocab = ctx.ckpt.text_config().get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        return []
    found = []
    for name, info in ctx.ckpt.all_tensors().items():
        shape = info.shape if info is not None else None
        if shape and len(shape) == 2 and shape[0] == vocab and not _NUMBERED.search(name):
            found.append(name)
    return sorted(found) if len(found) >= 2 else []


_NUMBERED = LazyRegex(r"\.\d+\.")


@rule(
    "WC407",
    "tied-embedding-mismatch",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="tie_word_embeddings disagrees with the presence of lm_head.weight.",
    bad='"tie_word_embeddings": false and no lm_head.weight anywhere (head left uninitialized)',
    good='"tie_word_embeddings": false with lm_head.weight stored; or true without it',
)
def tied_embedding_mismatch(ctx: LintContext) -> None:
    """`tie_word_embeddings: false` without any `lm_head.weight` leaves the output head uninitialized
    (GradientHQ/parallax#444, QwenLM/Qwen3-VL-Embedding#89: error). `true` while the checkpoint also stores
    `lm_head.weight` is a warning: several
    engines skip the stored head or raise KeyError (vllm-project/vllm#6758, sgl-project/sglang#2935). Checked only
    when the flag is explicit. With no architecture pattern, a head stored under the class's own name (BERT's
    `cls.predictions.decoder`, RWKV's `head`) is found by its `[vocab_size, n]` shape beside the embedding's."""
    cfg = ctx.ckpt.text_config()
    tie = cfg.get("tie_word_embeddings")
    if not isinstance(tie, bool) or _task_class(ctx):
        return
    leaves = _head_leaves(ctx)

    def is_head(n: str) -> bool:
        return bool(_LM_HEAD_RE.search(n)) and n.rsplit(".", 2)[-2] in leaves

    heads: list[str] = []
    for parts, members in name_templates(ctx).items():
        if last_segments_fixed(parts, 2):  # `<leaf>.weight` is the template's own end: one answer for all
            if is_head(members[0][0]):
                heads.extend(n for n, _ in members)
        else:
            heads.extend(n for n, _ in members if is_head(n))
    heads.sort()
    if not tie and not heads and not _pattern_known(ctx) and _head_by_shape(ctx):
        return  # stored under the class's own name (BERT's cls.predictions.decoder, RWKV's head, ...)
    if not tie and not heads:
        head = min(leaves - {"lm_head"}, default="lm_head")  # the pattern's own name for it first
        ctx.report(f"tie_word_embeddings is false but no {head}.weight is stored", tensor=f"{head}.weight")
    elif tie and heads:
        ctx.report(
            f"tie_word_embeddings is true but {', '.join(heads)} is stored as well "
            "(engines that tie skip it or fail with KeyError)",
            tensor=heads[0],
            severity=Severity.WARNING,
        )
