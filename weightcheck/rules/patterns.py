"""WC41x / WC5xx: expected keys and shapes from the architecture pattern (patterns/*.toml)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import repeat
from operator import add, getitem, itemgetter

from weightcheck.collapse import summarize
from weightcheck.findings import Severity
from weightcheck.names import Template
from weightcheck.patterns import Pattern, _count, config_env
from weightcheck.quant.matchers import FUSED_SHARDS
from weightcheck.rules import LintContext, name_templates, rule
from weightcheck.rules.quant import analysis_of, language_model_root, pattern_known_names
from weightcheck.structure import normalize_param


def _normalized(ctx: LintContext) -> dict[str, str]:
    """Every tensor name → its companion-folded form (`q_proj.weight_packed` → `q_proj.weight`), once."""
    return ctx.memo("normalized-names", lambda: _fold_names(name_templates(ctx)))


def _fold_names(groups: dict[Template, list[tuple[str, tuple[str, ...]]]]) -> dict[str, str]:
    """normalize_param of every name, decided once per template where the template fixes the answer."""
    out: dict[str, str] = {}
    for names, folded in _folds(groups):
        out.update(zip(names, folded, strict=True))
    return out


def _folds(groups: dict[Template, list[tuple[str, tuple[str, ...]]]]) -> Iterator[tuple[list[str], Iterable[str]]]:
    """Per template: its names, and their normalize_param forms in the same order.

    normalize_param reads a name's last segment (the leaf) and what precedes it, and looks for `.weight.`.
    Ids are digit runs, and a template's last literal part starts after its last id: when that part holds
    the leaf's dot and no literal part holds `.weight.`, every name of the template has the same leaf and
    the same verdict, so folding is one cut-and-append of the leaf, the same for all (computed on one name).
    """
    for parts, members in groups.items():
        names = list(map(itemgetter(0), members))
        last = parts[-1]
        if len(parts) == 1 or "." not in last or any(".weight." in part for part in parts):
            yield names, map(normalize_param, names)
            continue
        leaf = last.rpartition(".")[2]
        first = names[0]
        stem = first[: len(first) - len(leaf)]
        folded = normalize_param(first)
        if not folded.startswith(stem):  # not a leaf rewrite: name by name (never seen; kept exact)
            yield names, map(normalize_param, names)
            continue
        new_leaf = folded[len(stem) :]
        if new_leaf == leaf:
            yield names, names
        else:
            # n[:-cut] + new_leaf for every name, in C-level passes (leaf is not empty: it differs from new_leaf)
            stems = map(getitem, names, repeat(slice(None, -len(leaf))))
            yield names, map(add, stems, repeat(new_leaf))


def _present(ctx: LintContext) -> set[str]:
    """The companion-folded names as a set, once (WC410 and WC411 both ask): the values of `_normalized`,
    built without that dict (WC411 needs it only when some folded name is not the pattern's)."""

    def compute() -> set[str]:
        if "normalized-names" in ctx.cache:
            return set(ctx.cache["normalized-names"].values())
        out: set[str] = set()
        for _, folded in _folds(name_templates(ctx)):
            out.update(folded)
        return out

    return ctx.memo("normalized-name-set", compute)


def _pattern(ctx: LintContext) -> Pattern | None:
    qa = analysis_of(ctx)
    return qa.pattern if qa.inventory is not None and not qa.inventory.from_config_only else None


# A stacked experts parameter (transformers 5's `mlp.experts.gate_up_proj`, one leading dim per expert) and the
# per-expert parameters that hold the same weights when the experts are stored one module each.
# (`gate_up_proj` -> each expert's `gate_proj.weight` and `up_proj.weight`, as FUSED_SHARDS splits it.)
_UNFUSED_EXPERT_PARAMS = {
    f"{stacked}{suffix}": tuple(f"{shard}.{leaf}" for shard in FUSED_SHARDS.get(stacked, (stacked,)))
    for stacked in ("gate_up_proj", "down_proj")
    for suffix, leaf in (("", "weight"), ("_bias", "bias"))
}


def _unfused_experts(ctx: LintContext, pattern: Pattern) -> dict[str, tuple[str, ...]]:
    """`<experts module>.<stacked param>` -> the per-expert names that hold the same weights, for the
    pattern's stacked expert modules (kind `experts`): `...experts.gate_up_proj` ->
    (`...experts.0.gate_proj.weight`, `...experts.0.up_proj.weight`, ... for every expert). Qwen3-VL-MoE,
    Llama-4 and gpt-oss ship their experts stacked, and transformers 5 builds them so, but llm-compressor
    unfuses them to quantize each expert's Linears and saves them one module each (as vLLM's loaders for those
    models also read); either layout holds the weights the pattern requires."""

    def compute() -> dict[str, tuple[str, ...]]:
        text = ctx.ckpt.text_config()
        stacked = [exp for exp in analysis_of(ctx).expected(text) if exp.spec.kind == "experts"]
        n = _count(pattern.experts, config_env(pattern, text), "experts") if stacked else 0
        out: dict[str, tuple[str, ...]] = {}
        for exp in stacked if n else ():
            for param in (*exp.params, *exp.optional_params):
                leaves = _UNFUSED_EXPERT_PARAMS.get(param)
                if leaves:
                    out[f"{exp.name}.{param}"] = tuple(f"{exp.name}.{e}.{leaf}" for e in range(n) for leaf in leaves)
        return out

    return ctx.memo("unfused-experts", compute)


@rule(
    "WC410",
    "expected-key-missing",
    Severity.ERROR,
    also=(Severity.WARNING, Severity.INFO),
    summary="A weight the architecture pattern and config.json require is not stored.",
    bad="qwen3_moe, num_experts = 4: model.layers.2.mlp.gate.weight absent",
    good="every module of the pattern present, quantized or not",
)
def expected_key_missing(ctx: LintContext) -> None:
    """The family is detected from config.json (`model_type`, `architectures`; `--pattern` overrides).
    Its pattern lists the modules of every dense, MoE and MTP layer and the global ones (embeddings, final
    norm, lm_head unless tied); expert modules are expanded to the config's expert count. Quantized
    modules satisfy `weight` through their companions. Pattern-free peer checks (WC402) still run for
    unknown families."""
    qa = analysis_of(ctx)
    pattern = _pattern(ctx)
    if pattern is None or qa.inventory is None:
        return
    present = _present(ctx)
    groups: dict[str, list[str]] = defaultdict(list)
    mtp_missing: list[str] = []
    text = ctx.ckpt.text_config()
    # MTP layers are numbered after the decoder layers (`[mtp_layer]` adds to the per-layer modules)
    n_layers = _count(pattern.num_layers, config_env(pattern, text), "layers")
    expected = qa.expected(text)
    # The usual verdict is "nothing missing": one set difference over the required names decides it, and
    # the walk below (which groups what is missing) runs only when something is.
    # Module names grouped by their required params (a handful of distinct tuples), then one C-level pass of
    # string concatenation per (group, param) fed to issuperset, instead of an f-string per (module, param).
    by_params: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for exp in expected:
        if not exp.spec.optional:
            by_params[exp.params].append(exp.name)
    if all(present.issuperset(map(add, names, repeat("." + p))) for params, names in by_params.items() for p in params):
        expected = []
    unfused = _unfused_experts(ctx, pattern) if expected else {}
    for exp in expected:
        if exp.spec.optional:
            continue
        for param in exp.params:
            name = f"{exp.name}.{param}"
            if name in present:
                continue
            missing = [name]
            per_expert = unfused.get(name)
            if per_expert:  # stacked experts stored one module each: those are what must all be there
                lacking = [n for n in per_expert if n not in present]
                if len(lacking) < len(per_expert):
                    missing = lacking
            if missing:
                is_mtp = pattern.mtp_layers and exp.layer is not None and exp.layer >= n_layers
                (mtp_missing if is_mtp else groups[exp.spec.kind]).extend(missing)
    # A pattern outside the configs it was validated on (and no transformers to build the real list) cannot
    # vouch that the weight must exist: a warning, never an error (fit_to_config says why in a note).
    severity = Severity.WARNING if pattern.unvalidated else Severity.ERROR
    unvalidated = " (config outside what the pattern was validated on)" if pattern.unvalidated else ""
    for kind, names in sorted(groups.items()):
        ctx.report(
            f"{len(names)} {kind} weight(s) required by pattern {pattern.name!r} are missing{unvalidated}: "
            f"{summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
            severity=severity,
            details={"pattern": pattern.name, "missing": sorted(names)[:500], "tensors": sorted(names)[:1000]},
        )
    if mtp_missing:
        # MTP/NextN layers the config declares (`num_nextn_predict_layers`) are not built by transformers, so
        # every save_pretrained fine-tune lacks them: fine for serving, only a NextN/MTP draft needs them.
        ctx.report(
            f"{len(mtp_missing)} MTP/NextN weight(s) the config declares are not stored (transformers' "
            f"save_pretrained never writes them; speculative decoding with a NextN draft would need them): "
            f"{summarize(mtp_missing)}",
            tensor=summarize(mtp_missing, limit=3),
            count=len(mtp_missing),
            severity=Severity.INFO,  # raise it with --fail-on info where a NextN draft is deployed
            details={"pattern": pattern.name, "missing": sorted(mtp_missing)[:500], "mtp": True},
        )


@rule(
    "WC411",
    "unexpected-key",
    Severity.WARNING,
    summary="A stored tensor that the architecture pattern does not know (engines skip it silently).",
    bad="qwen3: model.layers.0.self_attn.rotary_emb.inv_freq, model.layers.0.mlp.gate_up_proj.weight",
    good="only the pattern's modules (plus quantization companions)",
)
def unexpected_key(ctx: LintContext) -> None:
    """SGLang's Qwen3-MoE and GLM4-MoE loaders skip unknown names without a message, so a renamed or
    mis-fused tensor is simply never loaded. Names under the pattern's `allowed_prefixes` (vision towers)
    are not itemized."""
    qa = analysis_of(ctx)
    pattern = _pattern(ctx)
    if pattern is None or qa.inventory is None:
        return
    known = pattern_known_names(ctx)
    if _present(ctx) <= known:  # every folded name is known (the usual case): one C-level set comparison
        return
    unfused = _unfused_experts(ctx, pattern)
    if unfused:  # the per-expert layout of the pattern's stacked experts is known too
        known = known.union(*unfused.values())
    allowed = tuple(pattern.allowed_prefixes)
    odd = [
        n
        for n, norm in _normalized(ctx).items()
        if norm not in known and not (allowed and n.startswith(allowed))
        and not n.endswith((".k_scale", ".v_scale"))  # KV-cache scales sit on the attention module
    ]  # fmt: skip
    copy = set(ctx.ckpt.mistral_native_copy()) if odd else set()
    if copy:
        # tensors only Mistral's native copy holds (its own names): no HF loader opens that file (WC105 names it)
        held = {n for s, r in ctx.ckpt.shards.items() if s not in copy for n in r.tensors}
        odd = [n for n in odd if n in held]
    if odd and pattern.borrowed_by is not None:
        # A wrapper's checkpoint (its text_config's pattern borrowed): what lies outside the language model's
        # root is the wrapper's own (vision tower, projector), which the pattern does not know.
        root = language_model_root(ctx) + "."
        odd = [n for n in odd if n.startswith(root)]
    if odd:
        ctx.report(
            f"{len(odd)} tensor(s) not in pattern {pattern.name!r}: {summarize(odd)}",
            tensor=summarize(odd, limit=3),
            count=len(odd),
        )


@rule(
    "WC501",
    "weight-shape-mismatch",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="An unquantized weight's shape differs from what config.json implies.",
    bad="hidden_size 4096, num_attention_heads 32: q_proj.weight [4096, 2048]",
    good="q_proj.weight [num_attention_heads * head_dim, hidden_size] = [4096, 4096]",
)
def weight_shape_mismatch(ctx: LintContext) -> None:
    """Shapes come from the pattern's expressions over the config (hidden size, heads, head_dim,
    intermediate sizes, expert counts, vocab). A mismatch means the config and the weights describe
    different models (a wrong config shipped, a TP shard saved un-gathered), which engines reject at load
    or, for padded dimensions, load silently wrong. Quantized weights are checked by WC314."""
    qa = analysis_of(ctx)
    pattern = _pattern(ctx)
    if pattern is None or qa.inventory is None:
        return
    severity = Severity.WARNING if pattern.unvalidated else Severity.ERROR
    groups: dict[tuple[tuple[int, ...], tuple[int, ...], str], list[str]] = defaultdict(list)
    for module in qa.inventory.modules.values():
        exp = module.expected
        weight = module.params.get("weight")
        if exp is None or exp.shape is None or weight is None or module.quantized:
            continue
        if tuple(weight.shape) != exp.shape:
            suffix = exp.spec.name
            groups[(tuple(weight.shape), exp.shape, suffix)].append(f"{module.name}.weight")
    for (got, want, _), names in sorted(groups.items()):
        ctx.report(
            f"{len(names)} weight(s) have shape {list(got)}, config implies {list(want)}"
            f"{' (config outside what the pattern was validated on)' if pattern.unvalidated else ''}: "
            f"{summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
            severity=severity,
        )
