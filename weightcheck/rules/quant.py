"""WC3xx: quantization configs, ignore lists as each consumer reads them, quantized companions.

Why one ~1,130-line module: the WC3xx family, one decorated function per rule (about twenty), sharing the
quantization analysis helpers at the top; the analysis itself lives in `weightcheck.quant`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import add

from weightcheck.collapse import ids_pattern, summarize
from weightcheck.findings import Severity
from weightcheck.patterns import Pattern, config_env, layer_root, sglang_packed_names
from weightcheck.quant.analysis import (
    PARAM_SUFFIXES,
    QuantAnalysis,
    analyze_checkpoint,
    is_class_entry,
    regex_error,
    root_hints,
)
from weightcheck.quant.config import WeightScheme, packed_width, validate_ct
from weightcheck.quant.covering import covering_entries, ignore_entries
from weightcheck.quant.inventory import ModuleInfo
from weightcheck.quant.matchers import Consumer, fused_group_of, get_consumer, overreach
from weightcheck.rules import LintContext, name_templates, rule
from weightcheck.safetensors_header import DTYPE_BITS, TensorInfo

CONFIG_FILE = "config.json"


def analysis_of(ctx: LintContext) -> QuantAnalysis:
    def compute() -> QuantAnalysis:
        qa = analyze_checkpoint(ctx.ckpt, ctx.options.get("pattern"))
        qa.deployed = ctx.options.get("consumers")
        return qa

    return ctx.memo("quant", compute)


def pattern_known_names(ctx: LintContext) -> set[str]:
    """Full names (module + param, optional ones too) of every stored module the pattern expects, built
    once: WC411 and WC405 both ask."""

    def compute() -> set[str]:
        inventory = analysis_of(ctx).inventory
        out: set[str] = set()
        if inventory is None:
            return out
        # modules grouped by their expected params (a handful of distinct tuples), then one C-level pass of
        # string concatenation per (group, param) instead of one f-string per (module, param)
        by_params: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for module in inventory.modules.values():
            exp = module.expected
            if exp is not None:
                by_params[(*exp.params, *exp.optional_params)].append(module.name)
        for params, names in by_params.items():
            for p in params:
                out.update(map(add, names, repeat("." + p)))
        return out

    return ctx.memo("pattern-known-names", compute)


def _quantized(ctx: LintContext) -> QuantAnalysis | None:
    qa = analysis_of(ctx)
    return qa if qa.spec is not None else None


def _labels(consumers: list[Consumer]) -> str:
    return ", ".join(dict.fromkeys(c.label for c in consumers))


@rule(
    "WC301",
    "quant-config-invalid",
    Severity.ERROR,
    summary="The quantization config is rejected by its consumer's own validator.",
    bad='"config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "pytorch_dtype": "fp4"}}}',
    good='"config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group", '
    '"group_size": 128}}}',
    needs=("config",),
)
def quant_config_invalid(ctx: LintContext) -> None:
    """compressed-tensors configs are validated with weightcheck's mirror of the package's pydantic models
    (QuantizationScheme and QuantizationArgs forbid unknown keys; group strategies need a positive
    group_size; block needs block_structure...), cross-checked against the package in weightcheck's tests;
    `--validate-with compressed-tensors` (or a name the mirror does not know) asks the installed package. HF FP8,
    ModelOpt, AWQ/GPTQ/bitsandbytes configs get structural checks (block size, fmt, list types)."""
    qa = analysis_of(ctx)
    spec = qa.spec
    if spec is None:
        return
    problems = list(spec.problems)
    if spec.method == "compressed-tensors":
        problems += validate_ct(spec.raw, ctx.options.get("validate_with") or "mirror")
    for problem in problems:
        ctx.report(f"{spec.source}: {problem}", file=CONFIG_FILE)


@rule(
    "WC302",
    "ignore-entry-unmatched",
    Severity.WARNING,
    summary="An ignore entry matches no module (as compressed-tensors, vLLM and SGLang read it).",
    bad='"ignore": ["re:visual.*"]      (start-anchored: never matches model.visual.blocks.0...)',
    good='"ignore": ["re:.*visual.*"]',
    needs=("config",),
)
def ignore_entry_unmatched(ctx: LintContext) -> None:
    """Entries are module names or `re:` regexes applied with `re.match` (anchored at the start). An entry
    that matches nothing is usually a typo, a missing `.*`, a VLM prefix mismatch (`model.language_model.`
    vs `language_model.model.`) or a parameter name (see WC304). The finding names the consumers that do
    match something, if any."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or not qa.spec.ignore:
        return
    # A tied head has no lm_head module (it is the embedding); llm-compressor still writes its default
    # `ignore: ["lm_head"]`, which is harmless. A config.json that leaves the flag out has its class's
    # default (Gemma-2/3: tied), as the pattern's expansion reads it.
    tie = ctx.ckpt.text_config().get("tie_word_embeddings")
    if not isinstance(tie, bool) and qa.pattern is not None:
        tie = config_env(qa.pattern, ctx.ckpt.text_config()).get("tie_word_embeddings")
    tied = tie is True and "lm_head" not in qa.inventory.modules
    unlisted = _unlisted_prefixes(qa) if qa.inventory.from_config_only else ()
    # A borrowed pattern (a wrapper's text_config's) knows only the language model: an entry that is not a
    # plain name under its root may name the wrapper's own modules (vision tower, projector), not checked.
    outside_lm = _outside_language_model(ctx, qa)
    inert: tuple[set[str], set[str]] | None = None  # made on the first entry that reaches the question
    skipped: list[str] = []
    for entry in qa.spec.ignore:
        if is_class_entry(entry) or regex_error(entry) or _looks_like_param(qa, entry):
            continue
        if tied and any(c.match("lm_head", entry) for c in qa.module_consumers()):
            continue
        if _names_own_module(qa, entry):
            continue
        matched_by = [c for c in qa.consumers if entry in qa.entries_hit(c)]
        if any(c.key in _PRIMARY_READERS for c in matched_by):
            continue
        if (unlisted and _under(entry, unlisted, qa)) or (outside_lm is not None and outside_lm(entry)):
            skipped.append(entry)
            continue
        inert = inert or _inert_params(qa)
        if _names_inert_param(entry, inert):
            continue
        hint = ""
        if entry.startswith("re:") and not entry[3:].startswith((".*", "^.*", "(")):
            hint = f" (re: is anchored at the start; did you mean re:.*{entry[3:]}?)"
        also = f"; only {_labels(matched_by)} matches it" if matched_by else ""
        ctx.report(
            f"ignore entry {entry!r} matches no module{hint}{also}",
            file=CONFIG_FILE,
            tensor=entry,
            details={"entry": entry, "matched_by": [c.key for c in matched_by]},
        )
    if skipped and outside_lm is not None:
        ctx.cache.setdefault("notes", []).append(
            f"{len(skipped)} ignore entries are not plain names under the language model's root and may name "
            f"modules of model_type {qa.pattern.borrowed_by!r} that its borrowed pattern does not list (vision "
            "tower, projector); they were not checked"
        )
    elif skipped:
        ctx.cache.setdefault("notes", []).append(
            f"config-only mode: {len(skipped)} ignore entries name modules under {', '.join(unlisted)}, which the "
            f"architecture pattern does not list (vision tower, projector, MTP layers); they were not checked"
        )


def _outside_language_model(ctx: LintContext, qa: QuantAnalysis) -> Callable[[str], bool] | None:
    """For a borrowed pattern: a test of whether an ignore entry may lie outside the language model (anything
    but a plain name under its root or one of the pattern's own module names); None for other patterns."""
    pattern = qa.pattern
    if pattern is None or pattern.borrowed_by is None or qa.inventory is None:
        return None
    root = language_model_root(ctx) + "."
    modules = qa.inventory.modules
    return lambda entry: not (entry.startswith(root) or entry in modules)


def language_model_root(ctx: LintContext) -> str:
    """The language-model root the pattern's expansion picked (`layer_root`: from the tensor names, or,
    config-only, from the ignore list's plain entries), found once per run (WC302 and WC411 ask)."""

    def compute() -> str:
        qa = analysis_of(ctx)
        assert qa.pattern is not None and qa.inventory is not None
        if qa.inventory.from_config_only:
            return layer_root(qa.pattern, root_hints(qa.spec))
        return layer_root(qa.pattern, ctx.ckpt.tensor_names())

    return ctx.memo("language-model-root", compute)


# The readers whose view decides whether an entry matches anything: the producer and the engines that load the
# method as written. An entry matched only by a lenient reader (SGLang's substring era, vLLM AWQ's substring,
# parameter-level online quantizers) is still reported. ModelOpt lists are read only by engines' ModelOpt paths.
_PRIMARY_READERS = frozenset({"ct", "vllm", "sglang", "sglang-fp8", "vllm-fp8", "transformers", "vllm-modelopt",
                              "sglang-modelopt"})  # fmt: skip


def _names_own_module(qa: QuantAnalysis, entry: str) -> bool:
    """An entry that is itself a module's name and that a primary module-level reader matches against that
    name: it is in that reader's `entries_hit` (the module-level hits are exactly `Consumer.match` over the
    module names), answered without matching the whole list. A per-layer list (Qwen3's 145 entries, one
    `model.layers.N.mlp.gate` per layer) is nearly all such entries."""
    assert qa.inventory is not None
    return entry in qa.inventory.modules and any(
        c.key in _PRIMARY_READERS and c.level == "module" and c.match(entry, entry) for c in qa.consumers
    )


def head_leaves(pattern: Pattern | None) -> frozenset[str]:
    """Leaf names of the output head: `lm_head`, plus what the architecture pattern stores only when untied (its
    `when` reads tie_word_embeddings; GPT-NeoX saves its head as `embed_out`)."""
    leaves = {"lm_head"}
    for spec in pattern.globals if pattern is not None else ():
        if spec.when and "tie_word_embeddings" in spec.when and spec.kind == "linear":
            leaves.add(spec.name.rsplit(".", 1)[-1])
    return frozenset(leaves)


def _is_head(name: str) -> bool:
    return name == "lm_head" or name.endswith(".lm_head") or name.endswith("shared_head.head")


_HEAD_ENDINGS = ("lm_head", "shared_head.head")  # every name _is_head accepts ends with one of these


def _head_router_embedding_candidates(qa: QuantAnalysis) -> Iterable[ModuleInfo]:
    """The modules WC309 looks at, in inventory order: config-only, only the runs (`patterns.expand_runs`)
    whose kind or name can make them a router, an embedding or a head, not 18k expert Linears one by one.
    A run's names differ only in the digits that fill its `*`, and `_is_head` tests digit-free endings, so its
    first name answers for all of them."""
    assert qa.inventory is not None
    modules, runs, run_names = qa.inventory.modules, qa.inventory.runs, qa.inventory.run_names
    if runs is None or run_names is None:
        return modules.values()
    out: list[ModuleInfo] = []
    for run, names in zip(runs, run_names, strict=True):
        if run.spec.kind in ("router", "embedding") or _is_head(names[0]):
            out += [modules[n] for n in names]
    return out


def _unlisted_prefixes(qa: QuantAnalysis) -> tuple[str, ...]:
    """Config-only mode: namespaces the pattern does not enumerate although checkpoints carry them: a VLM's
    vision tower and projector (`allowed_prefixes`) and MTP layers (`mtp.`), which transformers drops at load
    (Qwen3-Next's config does not even declare them, yet its releases ship and ignore `mtp.*`)."""
    assert qa.inventory is not None
    prefixes = list(qa.pattern.allowed_prefixes) if qa.pattern is not None else []
    # One name per run answers for the run (the prefixes hold no digit; see _head_router_embedding_candidates).
    runs = qa.inventory.runs
    names = qa.inventory.modules if runs is None else [r.name.replace("*", "0") for r in runs]
    for mtp in ("mtp.", "model.mtp."):
        if not any(m.startswith(mtp) for m in names):
            prefixes.append(mtp)
    return tuple(dict.fromkeys(prefixes))  # each once (a pattern may allow `mtp.` itself)


def _under(entry: str, prefixes: tuple[str, ...], qa: QuantAnalysis) -> bool:
    """Whether `entry` can only mean modules below one of `prefixes` (plain, glob or `re:` form)."""
    for prefix in prefixes:
        stem = prefix.rstrip(".")
        if entry == stem or entry.startswith(prefix) or entry.startswith(stem + "*"):
            return True
        # A module right under the prefix, or in its numbered blocks (Nemotron-3's MTP: `mtp.layers.0...`).
        for probe in (f"{prefix}0.proj", f"{prefix}layers.0.proj"):
            if any(c.match(probe, entry) for c in qa.module_consumers()):
                return True
    return False


def _inert_params(qa: QuantAnalysis) -> tuple[set[str], set[str]]:
    """Parameters no quantizer touches (not a `.weight`: `linear_attn.A_log`, `dt_bias`, MiniMax's
    `e_score_correction_bias`), by full name and by leaf name (a leaf counts only if never a `.weight`)."""
    assert qa.inventory is not None
    full = {p for p in qa.inventory.params if not p.endswith(".weight")}
    leaves = {p.rsplit(".", 1)[-1] for p in full} - {"weight"}
    return full, leaves


def _names_inert_param(entry: str, inert: tuple[set[str], set[str]]) -> bool:
    """An entry naming only such parameters matches no module, harmlessly: nothing would quantize them."""
    full, leaves = inert
    return not entry.startswith("re:") and (entry in full or ("." not in entry and entry in leaves))


def _looks_like_param(qa: QuantAnalysis, entry: str) -> bool:
    if entry.startswith("re:"):
        return not qa.regex_matches(entry, "module") and bool(qa.regex_matches(entry, "param"))
    return entry.endswith(PARAM_SUFFIXES)


@rule(
    "WC303",
    "ignore-regex-invalid",
    Severity.ERROR,
    summary="An `re:` entry in the ignore list or targets does not compile.",
    bad='"ignore": ["re:.*mlp\\\\.gate(", "lm_head"]',
    good='"ignore": ["re:.*mlp\\\\.gate$", "lm_head"]',
    needs=("config",),
)
def ignore_regex_invalid(ctx: LintContext) -> None:
    """Every consumer compiles `re:` entries with Python's `re`; one that fails raises at load in some engines
    and silently matches nothing in others."""
    qa = _quantized(ctx)
    if qa is None:
        return
    for where, entries in (("ignore", qa.spec.ignore), ("targets", qa.spec.targets)):
        for entry in entries:
            err = regex_error(entry)
            if err:
                ctx.report(f"{where} entry {entry!r} is not a valid regex: {err}", file=CONFIG_FILE, tensor=entry)


@rule(
    "WC304",
    "ignore-entry-is-parameter",
    Severity.WARNING,
    summary="An ignore entry names parameters (`...weight`, `\\..*` after a module) instead of modules.",
    bad='"ignore": ["model.embed_tokens.weight", "re:.*mlp\\\\.gate\\\\..*"]',
    good='"ignore": ["re:.*embed_tokens($|\\\\..*)", "re:.*mlp\\\\.gate($|\\\\..*)"]   (works for modules and params)',
    needs=("config",),
)
def ignore_entry_is_parameter(ctx: LintContext) -> None:
    """compressed-tensors, vLLM, SGLang and transformers match module names, so a parameter-style entry is
    ignored by all of them; only the slime/miles online quantizers, which match parameter names, honour it.
    The form `re:.*mlp\\.gate($|\\..*)` serves both readers."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None:
        return
    for entry in qa.spec.ignore:
        if regex_error(entry) or not _looks_like_param(qa, entry):
            continue
        forms = _module_forms(qa, entry)
        use = " + ".join(repr(f) for f in forms)
        ctx.report(
            f"ignore entry {entry!r} names parameters: engines matching modules ignore nothing with it "
            f"(only parameter-level online quantizers honour it); use {use}",
            file=CONFIG_FILE,
            tensor=entry,
            fix=f"replace {entry!r} by {use} in the ignore list (matched by module- and parameter-name readers)",
            details={"entry": entry, "replace_by": forms},
        )


def _module_forms(qa: QuantAnalysis, entry: str) -> list[str]:
    """The entries that name the modules whose parameters `entry` matches, for module- and parameter-name
    readers alike. Derived from what the entry matches, so the suggestion always differs from it (a
    `re:.*mlp.gate.weight$` entry has no `\\..*` tail to rewrite) and is checked to match those modules."""
    if entry.startswith("re:") and entry.endswith(r"\..*"):
        form = entry[: -len(r"\..*")] + r"($|\..*)"  # keep the user's own spelling when it converts as is
        assert qa.inventory is not None
        try:
            pattern = re.compile(form[3:])
        except re.error:  # `re:(a\..*)` loses its closing paren: derive the form instead
            pattern = None
        if pattern is not None and any(pattern.match(module) for module in qa.inventory.modules):
            return [form]
    if not entry.startswith("re:"):
        return [entry.rsplit(".", 1)[0]]
    modules = sorted({param.rsplit(".", 1)[0] for param in qa.regex_matches(entry, "param")})
    return [form for form in ignore_entries(modules) if form != entry] or [entry]


@rule(
    "WC305",
    "ignore-regex-overreach",
    Severity.WARNING,
    summary="A regex matches modules whose names merely extend the intended one (layers.1 → layers.10).",
    bad='"ignore": ["re:model.layers.1.*", "re:.*mlp.gate"]   (layers 10-19; every gate_proj)',
    good='"ignore": ["re:^model\\\\.layers\\\\.1\\\\..*", "re:.*mlp\\\\.gate$"]',
    needs=("config",),
)
def ignore_regex_overreach(ctx: LintContext) -> None:
    """`re:` is a prefix match and `.` is a wildcard: `re:model.layers.1.*` also ignores layers 10-19 and
    100-199 (llm-compressor's GLM-4.7 example left layers 10-29 unquantized), `re:.*mlp.gate` also ignores
    `mlp.gate_proj` and `gate_up_proj`. A match that ends inside a dotted name component is reported with
    example modules it captures."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None:
        return
    _plain_overreach(ctx, qa)
    for entry in qa.spec.ignore:
        if not entry.startswith("re:") or regex_error(entry):
            continue
        if _asks_for_extensions(entry[3:]):
            continue
        hits = sorted(m for m in qa.regex_matches(entry) if overreach(entry[3:], m))
        if hits:
            _report_overreach(ctx, qa, entry, hits, "")


def _asks_for_extensions(pattern: str) -> bool:
    r"""A word followed by an explicit `.*` (`.*embed.*`, `.*norm.*`: slime's default ignore rules) asks for every
    name that extends the word: `embed_tokens` is what it means. A number followed by `.*` does not
    (`model.layers.1.*` reaching layers 10-19), nor a word the pattern ends on (`.*mlp.gate` reaching
    `gate_proj`) or one followed by `\.*` (zero or more dots: a typo for `\..*`)."""
    if not pattern.endswith(".*") or pattern.endswith(r"\.*"):
        return False
    stem = pattern[:-2]
    return bool(stem) and (stem[-1].isalpha() or stem[-1] == "_")


def _report_overreach(ctx: LintContext, qa: QuantAnalysis, entry: str, hits: list[str], how_read: str) -> None:
    """One WC305 finding: `entry` reaches `hits`, modules whose names only extend the intended one."""
    assert qa.inventory is not None
    layers = sorted({qa.inventory.modules[m].layer for m in hits} - {None})
    where = f"layers {ids_pattern(layers)}: " if layers else ""
    ctx.report(
        f"ignore entry {entry!r} also captures {len(hits)} module(s) whose names only extend the intended "
        f"one{how_read} ({where}{summarize(hits, limit=3)})",
        file=CONFIG_FILE,
        tensor=entry,
        count=len(hits),
        details={"entry": entry, "examples": hits[:20]},
    )


# Readers for which a plain entry is a prefix or a substring of the module name, so that `model.layers.1` also
# reaches `model.layers.12`: transformers (`re.match(entry, name)`), vLLM ModelOpt and AWQ (substring).
_PREFIX_READERS = frozenset({"transformers", "vllm-modelopt", "vllm-awq"})
_NOT_PLAIN = set("*?[]()|^$+{}\\")


def _plain_overreach(ctx: LintContext, qa: QuantAnalysis) -> None:
    """WC305 for plain entries read as prefixes or substrings: a match that ends inside a dotted component."""
    assert qa.inventory is not None and qa.spec is not None
    readers = [c for c in qa.module_consumers() if c.key in _PREFIX_READERS]
    found: dict[str, tuple[set[str], set[str]]] = {}
    for consumer in readers:
        for module, entries in qa.hits(consumer).items():
            for entry in entries:
                if entry.startswith("re:") or _NOT_PLAIN & set(entry) or not entry[-1:].isalnum():
                    continue
                at = module.find(entry)
                while at >= 0:
                    end = at + len(entry)
                    if end < len(module) and module[end] != "." and (at == 0 or module[at - 1] == "."):
                        if entry not in (module.split(".")):  # a whole component elsewhere is the intent
                            mods, who = found.setdefault(entry, (set(), set()))
                            mods.add(module)
                            who.add(consumer.label)
                        break
                    at = module.find(entry, at + 1)
    for entry, (mods, who) in found.items():
        _report_overreach(ctx, qa, entry, sorted(mods), f", as {', '.join(sorted(who))} read it")


def _engine_view(qa: QuantAnalysis) -> list[Consumer]:
    """Consumers that build the model from the config (engines, not the producer)."""
    return [c for c in qa.module_consumers() if c.key != "ct"]


@rule(
    "WC306",
    "ignored-module-quantized",
    Severity.ERROR,
    summary="A module the ignore list covers is stored with quantized companions.",
    bad="ignore: [lm_head]; lm_head.weight_packed + lm_head.weight_scale stored",
    good="ignored modules keep a plain bf16 `weight`",
)
def ignored_module_quantized(ctx: LintContext) -> None:
    """Engines build ignored modules unquantized, so stored `weight_packed`/`weight_scale` have no target
    and are dropped (or raise KeyError): the module runs on uninitialized memory. Seen when `ignore=` was
    honoured at calibration but not at save (vllm-project/compressed-tensors#712)."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.inventory.from_config_only:
        return
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    engines = _engine_view(qa)
    if not qa.spec.ignore:
        return
    for module in qa.inventory.modules.values():
        if not module.quantized:
            continue
        by = [c for c in engines if qa.is_ignored(c, module)]
        if by:
            groups[tuple(c.label for c in by)].append(module.name)
    for labels, names in groups.items():
        ctx.report(
            f"{len(names)} module(s) ignored by {', '.join(dict.fromkeys(labels))} are stored quantized "
            f"(companions will be dropped, the module left uninitialized): {summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
        )


@rule(
    "WC307",
    "targeted-module-unquantized",
    Severity.ERROR,
    summary="A Linear module the config targets (and does not ignore) is stored unquantized.",
    bad='targets ["Linear"], ignore ["lm_head"]; model.layers.3.self_attn.o_proj.weight stored as BF16',
    good="every targeted, non-ignored Linear stores weight_packed/weight_scale (or FP8 weight + scale)",
)
def targeted_module_unquantized(ctx: LintContext) -> None:
    """Engines build targeted Linears quantized and expect `weight_packed`/`weight_scale`; a bf16 `weight`
    has no target and is skipped (Qwen3-MoE, GLM4-MoE silently) or warned about, leaving the quantized
    parameters uninitialized. Routers, lm_head and embeddings are judged by WC308-WC310. HF FP8 checkpoints
    without an ignore list (DeepSeek-V3 style) are exempt: there, presence of `weight_scale_inv` decides."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.inventory.from_config_only:
        return
    if qa.spec.method == "fp8" and not qa.spec.ignore:
        return
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    engines = _engine_view(qa)
    heads = head_leaves(qa.pattern)  # the engines build the head as their LM head, not a quantized Linear
    for module in qa.inventory.modules.values():
        if module.kind != "linear" or module.quantized is not False:
            continue
        if module.name.endswith("lm_head") or module.name.rsplit(".", 1)[-1] in heads:
            continue
        if module.weight_ndim() != 2 or not qa.targeted_by_ct(module):
            continue
        affected = [c for c in engines if not qa.is_ignored(c, module)]
        if module.expert is not None and qa.spec.method == "bitsandbytes":
            # bitsandbytes replaces the nn.Linear modules of the transformers class it loads; transformers >= 5
            # keeps routed experts as fused 3-D parameters (Qwen3MoeExperts.gate_up_proj), which it leaves
            # unquantized and saves per expert: transformers reads them back unquantized.
            affected = [c for c in affected if c.key != "transformers"]
        if affected:
            groups[tuple(c.label for c in affected)].append(module.name)
    for labels, names in groups.items():
        ctx.report(
            f"{len(names)} targeted Linear module(s) are stored unquantized; {', '.join(dict.fromkeys(labels))} "
            f"build them quantized and drop the bf16 weight: {summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
        )


NON_LINEAR = ("router", "embedding", "norm", "conv", "other")


@rule(
    "WC308",
    "non-linear-quantized",
    Severity.ERROR,
    summary="A router (mlp.gate), embedding or other non-Linear weight carries quantized companions.",
    bad="model.layers.{1..46}.mlp.gate.weight_packed, .weight_scale, .weight_shape   (router packed)",
    good="model.layers.{1..46}.mlp.gate.weight   BF16",
)
def non_linear_quantized(ctx: LintContext) -> None:
    """The engines build routers, embeddings and norms without a quantization method, so their
    `weight_packed`/`weight_scale` names have no target: SGLang skips them silently in `load_weights` and
    routes on an uninitialized or zero gate (garbage rollouts, no error: THUDM/slime#1642); vLLM raises or
    loads garbage (vllm-project/vllm-omni#5573). Usually an online or converter quantizer packing every 2-D
    `.weight` whose ignore list missed the router."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.inventory.from_config_only:
        return
    groups: dict[str, list[str]] = defaultdict(list)
    for module in qa.inventory.modules.values():
        if module.kind in NON_LINEAR and module.quantized:
            groups[module.kind].append(module.name)
    for kind, names in sorted(groups.items()):
        engines = "SGLang drops the companions silently (no such parameter), vLLM fails or loads garbage"
        ctx.report(
            f"{len(names)} {kind} module(s) stored quantized ({', '.join(_companions(qa, names[0]))}); "
            f"{engines}: {summarize(names)}",
            tensor=summarize(names, limit=3),
            count=len(names),
            details={"kind": kind, "modules": names[:200]},
        )


def _companions(qa: QuantAnalysis, module: str) -> list[str]:
    assert qa.inventory is not None
    return qa.inventory.modules[module].companions


@rule(
    "WC309",
    "non-linear-not-ignored",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="A router/embedding/lm_head that some consumer would quantize is not covered by the ignore list.",
    bad='"ignore": ["lm_head"]   on a MoE (router mlp.gate is a 2-D weight the online INT4 quantizer packs)',
    good='"ignore": ["lm_head", "re:.*embed_tokens($|\\\\..*)", "re:.*mlp\\\\.gate($|\\\\..*)"]',
    needs=("config",),
)
def non_linear_not_ignored(ctx: LintContext) -> None:
    """Who quantizes what is per consumer: the slime/miles online INT4 quantizer packs every 2-D `.weight`
    parameter the ignore list does not match (routers, embeddings, lm_head; miles' online NVFP4 packs experts
    only, so it is not counted here); vLLM builds the
    Qwen3-MoE router as a `GateLinear` with the quant config (a hand-written `quantized_by` yields to the
    engine sources: vLLM 0.33.0's Qwen2-MoE gate is built without it). Their quantized names then reach an
    engine that drops them (THUDM/slime#1642, #1479). Error when an engine is affected; warning when only
    online RL quantizers are."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None:
        return
    from weightcheck.patterns import ENGINE_SOURCES

    unquantized = {e: _engine_leaves(ctx, e) for e in ENGINE_SOURCES}
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)
    for module in _head_router_embedding_candidates(qa):
        # endswith over a tuple first (one C call), _is_head only on what it lets through: this loop sees
        # every module of a checkpoint (46k on DeepSeek-V3), almost none of them a head
        is_head = module.name.endswith(_HEAD_ENDINGS) and _is_head(module.name)
        if module.kind not in ("router", "embedding") and not is_head:
            continue
        if module.weight_ndim() not in (None, 2) or module.quantized:
            continue  # stored quantized is WC308/WC310's business
        if qa.inventory.from_config_only and module.expected is not None and module.expected.spec.optional:
            continue  # config-only: optional modules (MTP head copies) may not exist at all
        affected: list[Consumer] = []
        leaf = module.name.rsplit(".", 1)[-1]
        for consumer in qa.consumers:
            builds_quantized = consumer.quantizes_online or (
                module.expected is not None and consumer.key in module.expected.spec.quantized_by
                # the engine's own source says otherwise (vLLM 0.33.0's Qwen2-MoE gate is a GateLinear
                # without the quant config): a hand-written `quantized_by` does not outvote it
                and leaf not in unquantized.get(consumer.key.split("-")[0], {})
            )
            if builds_quantized and not qa.is_ignored(consumer, module):
                affected.append(consumer)
        if affected:
            groups[(module.kind if not is_head else "lm_head", tuple(c.key for c in affected))].append(module.name)
    for (kind, keys), names in sorted(groups.items()):
        consumers = [get_consumer(k) for k in keys]
        engine = any(not c.quantizes_online for c in consumers)
        assert qa.spec is not None
        add = covering_entries(names, keys)
        ctx.report(
            f"{len(names)} {kind} module(s) not covered by the ignore list would be quantized by "
            f"{_labels(consumers)}: {summarize(names)}",
            file=CONFIG_FILE,
            tensor=summarize(names, limit=3),
            count=len(names),
            severity=Severity.ERROR if engine else Severity.WARNING,
            details={
                "kind": kind,
                "consumers": list(keys),
                "modules": names[:200],
                "add_ignore": add,
                "ignore_source": qa.spec.source,
                "ignore_field": qa.spec.ignore_field,
            },
            fix=f"add {', '.join(json.dumps(e) for e in add)} to {qa.spec.source} {qa.spec.ignore_field!r} "
            f"(read that way by {_labels(consumers)}; `weightcheck lint --fix` adds it)",
        )


@rule(
    "WC310",
    "head-or-embedding-quantized",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="lm_head, an embedding or a classification head is stored quantized, or named as a target.",
    bad="lm_head.weight_packed stored   /   targets: ['Linear', 'lm_head']",
    good="lm_head.weight and model.embed_tokens.weight in bf16; lm_head in ignore",
)
def head_or_embedding_quantized(ctx: LintContext) -> None:
    """Quantized embeddings need per-model plumbing most engines lack (`KeyError: 'embed_tokens.weight_packed'`,
    vllm-project/vllm#45535); vLLM cannot load a packed lm_head from compressed-tensors
    (vllm-project/llm-compressor#1820) and SGLang quantizes lm_head only when a target names it (block
    FP8 raises NotImplementedError). A reward model's or classifier's head stored quantized is a warning: SGLang
    builds it as a plain `nn.Linear` (see `_task_head_quantized`)."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None:
        return
    named = [t for t in qa.spec.targets if "lm_head" in t or "embed" in t]
    if named:
        ctx.report(f"targets name {named}: lm_head/embedding quantization is engine-specific", file=CONFIG_FILE,
                   severity=Severity.WARNING)  # fmt: skip
    stored = [
        m.name
        for m in qa.inventory.modules.values()
        if m.quantized and (m.name.endswith("lm_head") or m.kind == "embedding")
    ]
    if stored:
        ctx.report(f"stored quantized: {summarize(stored)} (vLLM and SGLang cannot load these)",
                   tensor=summarize(stored, limit=3), count=len(stored))  # fmt: skip
    _task_head_quantized(ctx, qa)


def _task_head_quantized(ctx: LintContext, qa: QuantAnalysis) -> None:
    """A reward model's or classifier's head (`score`: what the reward is read from) stored quantized, as
    llm-compressor's usual `ignore: ["lm_head"]` leaves it. SGLang's classification classes build it as a plain
    `nn.Linear` (sgl-project/sglang 268a63f, `Qwen2ForSequenceClassification`: `self.score = nn.Linear(...)`,
    loaded by the causal LM's loader): the stored codes are copied in without their scale. A warning: the
    transformers loader and engines that build the head with the quant config read it."""
    pattern = qa.pattern
    if pattern is None or not pattern.task_heads or qa.inventory is None:
        return
    modules = qa.inventory.modules
    stored = [name for name in pattern.task_heads if name in modules and modules[name].quantized]
    if stored:
        ctx.report(
            f"the {pattern.task_class} head {', '.join(stored)} is stored quantized: SGLang builds a classification "
            "head as a plain nn.Linear and loads the stored codes without their scale",
            tensor=stored[0],
            severity=Severity.WARNING,
            fix=f"add {', '.join(stored)} to the quantization ignore list (beside lm_head) and re-quantize",
        )


@rule(
    "WC311",
    "fused-group-partially-ignored",
    Severity.ERROR,
    summary="Some but not all shards of a fused module (q/k/v → qkv_proj, gate/up → gate_up_proj) are ignored.",
    bad='"ignore": ["model.layers.0.self_attn.q_proj"]   (k_proj and v_proj still quantized)',
    good='"ignore": ["re:model\\\\.layers\\\\.0\\\\.self_attn\\\\.(q|k|v)_proj$"]   (all three, or none)',
    needs=("config",),
)
def fused_group_partially_ignored(ctx: LintContext) -> None:
    """vLLM and SGLang load q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj`; all shards must
    share one scheme. A partial ignore raises "Found a different quantization schemes" (compressed-tensors)
    or "Detected some but not all shards ... are quantized" (FP8) at startup. The usual cause is an
    over-reaching regex (`re:.*mlp.gate` also hits `gate_proj` but not `up_proj`)."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or not qa.spec.ignore:
        return  # with nothing ignored, no group can be partially ignored
    modules = qa.inventory.modules
    # One defect, one finding: engines that fail on the same modules are named together in one finding
    # (three SGLang/vLLM readers agreeing used to give three copies of it).
    engines_by_partial: dict[tuple[str, ...], list[str]] = {}
    for consumer in _engine_view(qa):
        # Only a group with an ignored shard can be partially ignored: start from the ignored modules.
        groups = dict(filter(None, (fused_group_of(m, modules) for m in qa.ignored_modules(consumer))))
        partial = sorted(
            fused for fused, shards in groups.items() if len({qa.is_ignored(consumer, modules[s]) for s in shards}) == 2
        )
        if partial:
            engines_by_partial.setdefault(tuple(partial), []).append(consumer.label)
    for partial_names, engines in engines_by_partial.items():
        ctx.report(
            f"{', '.join(engines)}: {len(partial_names)} fused module(s) have some shards ignored and others not "
            f"(startup ValueError): {summarize(partial_names)}",
            file=CONFIG_FILE,
            tensor=summarize(partial_names, limit=3),
            count=len(partial_names),
            details={"engines": engines, "modules": list(partial_names)},
        )


@rule(
    "WC312",
    "shard-ignore-needs-fused-name",
    Severity.ERROR,
    summary="q/k/v (or gate/up) ignored by shard name for an SGLang class without packed_modules_mapping.",
    bad='Qwen3ForCausalLM, "ignore": ["model.layers.0.self_attn.q_proj", "...k_proj", "...v_proj"]',
    good='"ignore": ["model.layers.0.self_attn.qkv_proj"]   or   "re:model\\\\.layers\\\\.0\\\\.self_attn\\\\..*"',
    needs=("config",),
)
def shard_ignore_needs_fused_name(ctx: LintContext) -> None:
    """SGLang's compressed-tensors path expands a fused module into its shards only when the model class
    declares `packed_modules_mapping` (Qwen3-MoE does; Qwen2, Qwen3, Llama and GLM4-MoE do not in 0.5.23).
    For those classes, ignoring q/k/v by shard name still builds `qkv_proj` quantized, and the bf16
    `q_proj.weight` has no parameter to go to: `KeyError: '...qkv_proj.weight'` (observed with sglang 0.5.23's
    Qwen3), or, in a `load_weights` that skips names it lacks, the layer left unloaded. Routed experts are not
    such modules: SGLang builds a layer's experts as one FusedMoE (`mlp.experts`), with no per-expert
    `gate_up_proj`."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.pattern is None or qa.spec.method != "compressed-tensors":
        return
    if not qa.spec.ignore:
        return
    if qa.pattern.engines.get("sglang_packed_modules_mapping", True):
        return
    sglang = get_consumer("sglang")
    hits: list[str] = []
    modules = qa.inventory.modules
    groups = dict(filter(None, (fused_group_of(m, modules) for m in qa.ignored_modules(sglang))))
    from weightcheck.patterns import engine_unquantized_leaves

    # a fused module SGLang builds without the quant config (0.5.23's OLMo `qkv_proj`) is unquantized whatever
    # the list says: its bf16 shards load
    unquantized = {a for t in _model_types(ctx) for a in engine_unquantized_leaves("sglang", t).values()}
    # ... and a fused name the class's packed_modules_mapping does list is expanded into its shards (0.5.23's
    # Qwen2.5-VL maps `gate_up_proj` only, not `qkv_proj`): the registry's record of the class, read per name.
    mapped = {leaf for t in _model_types(ctx) for leaf in sglang_packed_names(t)}
    for fused, shards in sorted(groups.items()):
        if fused.rsplit(".", 1)[-1] in unquantized | mapped:
            continue
        shard_modules = [modules[s] for s in shards]
        if any(m.expert is not None for m in shard_modules):  # a routed expert's: part of the FusedMoE
            continue
        if all(qa.is_ignored(sglang, m) for m in shard_modules) and not any(
            sglang.match(fused, e) for e in qa.spec.ignore
        ):
            hits.append(fused)
    if hits:
        cls = qa.pattern.engines.get("sglang_class", qa.pattern.name)
        lists = f"'s packed_modules_mapping lists only {', '.join(sorted(mapped))}" if mapped else (
            " has no packed_modules_mapping"
        )
        ctx.report(
            f"SGLang {cls}{lists}: {len(hits)} fused module(s) whose shards are ignored "
            f"by shard name are still built quantized (their bf16 shards have no parameter to load into: a "
            f"KeyError, or the layer left unloaded): {summarize(hits)}",
            file=CONFIG_FILE,
            tensor=summarize(hits, limit=3),
            count=len(hits),
        )


@rule(
    "WC313",
    "quant-companion-missing",
    Severity.ERROR,
    summary="A quantized module lacks a companion its format requires (scale, shape, zero point...).",
    bad="q_proj.weight_packed without q_proj.weight_scale; FP8 q_proj.weight without weight_scale(_inv)",
    good="q_proj.weight_packed + weight_scale + weight_shape (+ weight_zero_point when asymmetric)",
)
def quant_companion_missing(ctx: LintContext) -> None:
    """pack-quantized needs `weight_packed`, `weight_scale`, `weight_shape` (+ `weight_zero_point` for
    asymmetric schemes, `weight_g_idx` with group actorder); float-quantized FP8 needs `weight_scale` (CT) or
    `weight_scale_inv` (HF block FP8); NVFP4 needs `weight_global_scale`. A missing companion is a KeyError
    or silent garbage at load."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.inventory.from_config_only:
        return
    scheme = next((s for s in qa.spec.schemes if s.quantizes_weights), None)
    groups: dict[str, list[str]] = defaultdict(list)
    for module in qa.inventory.modules.values():
        if not module.quantized:
            continue
        params = module.params.keys()
        # Block FP8's usual module (weight + weight_scale_inv, no weight_packed) needs nothing more: the weight
        # branch below is satisfied by weight_scale_inv, and the scale-without-weight branch needs a
        # weight_scale and no weight. Three lookups instead of the walk (46k modules on DeepSeek-V3).
        if "weight_scale_inv" in params and "weight_packed" not in params and (
            "weight" in params or "weight_scale" not in params
        ):
            continue
        needed: list[str] = []
        if "weight_packed" in params:
            needed = ["weight_scale"]
            fmt = (scheme.format if scheme else None) or qa.spec.format or ""
            if "nvfp4" in fmt:
                needed.append("weight_global_scale")
            elif "mxfp4" not in fmt:
                needed.append("weight_shape")
                if scheme is not None and not scheme.symmetric:
                    needed.append("weight_zero_point")
                if scheme is not None and scheme.actorder in ("group", True):
                    needed.append("weight_g_idx")
        elif (
            "weight" in params
            and module.params["weight"] is not None
            and module.params["weight"].dtype.startswith("F8")
        ):
            if "weight_scale" not in params and "weight_scale_inv" not in params:  # no set built per module
                needed = ["weight_scale or weight_scale_inv"]
        elif "weight_scale" in params and "weight" not in params:
            needed = ["weight or weight_packed"]
        for need in needed:
            if not any(n in params for n in need.split(" or ")):
                groups[need].append(module.name)
    for need, names in sorted(groups.items()):
        ctx.report(f"{len(names)} quantized module(s) lack {need}: {summarize(names)}",
                   tensor=summarize(names, limit=3), count=len(names))  # fmt: skip


@rule(
    "WC314",
    "quant-companion-shape",
    Severity.ERROR,
    summary="Quantized companions disagree in shape (packed width vs scale groups, block-FP8 scale grid).",
    bad="weight_packed I32[256, 16] with weight_scale [256, 4] under group_size 128 (16 words = 128 inputs)",
    good="weight_packed I32[256, 32] (256 inputs) with weight_scale [256, 2] (2 groups of 128)",
)
def quant_companion_shape(ctx: LintContext) -> None:
    """The input width implied by `weight_packed` (32/bits values per int32 word; CT >= 0.18 packs densely)
    must agree with the scale's group count (`ceil(in / group_size)` columns), rows must match, and for
    block FP8 the scale grid must be `[ceil(out/b0), ceil(in/b1)]`. Where the architecture pattern gives
    the expected `[out, in]`, that is checked too. Header-only: `weight_shape` values are not read."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.inventory.from_config_only:
        return
    scheme = next((s for s in qa.spec.schemes if s.quantizes_weights), None)
    block = qa.spec.weight_block_size or (scheme.block_structure if scheme is not None else None)
    bad: dict[str, list[str]] = defaultdict(list)
    for module in qa.inventory.modules.values():
        if not module.quantized:
            continue  # no companion to compare, and the expected-shape test is for quantized weights only
        p = module.params
        if block and "weight_packed" not in p:
            # A block-FP8 module whose scale grid fits its weight and whose weight has the pattern's shape is
            # what _shape_problem passes; tested here without its per-call lookups (46k modules on DeepSeek-V3).
            weight, inv = p.get("weight"), p.get("weight_scale_inv", p.get("weight_scale"))
            if weight is not None and inv is not None:
                ws, expected = weight.shape, module.expected.shape if module.expected is not None else None
                if (
                    len(ws) == 2
                    and len(inv.shape) == 2  # before the grid is computed, in _shape_problem's order
                    and inv.shape == (-(-ws[0] // block[0]), -(-ws[1] // block[1]))
                    and (not expected or ws == tuple(expected))
                ):
                    continue
        msg = _shape_problem(qa, module, scheme)
        if msg:
            bad[msg].append(module.name)
    for msg, names in sorted(bad.items()):
        ctx.report(f"{msg}: {summarize(names)}", tensor=summarize(names, limit=3), count=len(names))


def _shape_problem(qa: QuantAnalysis, module: ModuleInfo, scheme: WeightScheme | None) -> str | None:
    p = module.params
    expected = module.expected.shape if module.expected is not None else None
    packed, scale = p.get("weight_packed"), p.get("weight_scale")
    if packed is not None and scale is not None and scheme is not None and scheme.num_bits:
        if len(packed.shape) != 2 or len(scale.shape) != 2:
            return None
        out, words = packed.shape
        if scale.shape[0] != out:
            return f"weight_scale rows {scale.shape[0]} != weight_packed rows {out}"
        if expected and len(expected) == 2:
            if out != expected[0]:
                return f"weight_packed rows {out} != expected out_features {expected[0]}"
            want = packed_width(expected[1], scheme.num_bits, qa.spec.version)
            if packed.dtype == "I32" and words != want:
                return f"weight_packed has {words} int32 columns, {want} expected for {expected[1]} inputs"
            if scheme.group_size and scheme.group_size > 0:
                groups = -(-expected[1] // scheme.group_size)
                if scale.shape[1] != groups:
                    return f"weight_scale has {scale.shape[1]} groups, {groups} expected (G={scheme.group_size})"
        elif scheme.group_size and scheme.group_size > 0 and packed.dtype == "I32":
            max_in = words * 32 // scheme.num_bits
            min_in = (words - 1) * 32 // scheme.num_bits + 1
            lo, hi = -(-min_in // scheme.group_size), -(-max_in // scheme.group_size)
            if not lo <= scale.shape[1] <= hi:
                return (
                    f"weight_scale groups {scale.shape[1]} inconsistent with {words} packed words "
                    f"(G={scheme.group_size})"
                )
        return None
    weight = p.get("weight")
    # HF block FP8 stores `weight_scale_inv`; compressed-tensors FP8_BLOCK stores `weight_scale`.
    inv = p.get("weight_scale_inv", p.get("weight_scale"))
    block = qa.spec.weight_block_size or (scheme.block_structure if scheme is not None else None)
    if weight is not None and inv is not None and block and len(weight.shape) == 2 and len(inv.shape) == 2:
        grid = (-(-weight.shape[0] // block[0]), -(-weight.shape[1] // block[1]))
        if tuple(inv.shape) != grid:
            return f"block scale {list(inv.shape)} is not the {list(grid)} grid of {block} blocks"
    if weight is not None and expected and "weight.absmax" in p and len(expected) == 2:
        return _bnb_4bit_problem(weight, expected)
    if weight is not None and expected and tuple(weight.shape) != tuple(expected) and module.quantized:
        return f"quantized weight shape {list(weight.shape)} != expected {list(expected)}"
    return None


def _bnb_4bit_problem(weight: TensorInfo, expected: tuple[int, ...]) -> str | None:
    """bitsandbytes 4-bit stores the codes of the `[out, in]` weight two per byte in a `[rows, 1]` column of its
    storage dtype (uint8, or bf16/f32 for FSDP-QLoRA): bitsandbytes' `quantize_4bit` packs `ceil(n / 2)` bytes
    (its default kernel) or makes `(n + 1) // (2 * itemsize)` rows (its CUDA kernel); either count passes."""
    n = expected[0] * expected[1]
    per_row = 2 * DTYPE_BITS.get(weight.dtype, 8) // 8
    rows = (n // per_row, -(-n // per_row))
    if len(weight.shape) == 2 and weight.shape[1] == 1 and weight.shape[0] in rows:
        return None
    return (
        f"bitsandbytes 4-bit weight {weight.dtype}{list(weight.shape)} does not hold the {n} codes of the expected "
        f"{list(expected)} ([{rows[1]}, 1] of {weight.dtype})"
    )


@rule(
    "WC315",
    "experts-mixed-schemes",
    Severity.ERROR,
    summary="Experts of one MoE layer are stored with different schemes (some quantized, some not).",
    bad="model.layers.3.mlp.experts.{0..126}.*.weight_packed, but experts.127.*.weight in bf16",
    good="all experts of a layer quantized, or all ignored",
)
def experts_mixed_schemes(ctx: LintContext) -> None:
    """vLLM (`get_moe_method`) and SGLang (`get_moe_scheme`) pick one scheme for a whole fused MoE layer by
    probing expert 0 only; experts stored differently are then loaded with the wrong method — bf16 experts
    skipped silently (garbage), or quantized ones dropped (vLLM's `get_moe_method` and SGLang's `get_moe_scheme`
    probe expert 0 only)."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.inventory.from_config_only:
        return
    per_layer: dict[int, dict[bool, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module in qa.inventory.modules.values():
        if module.expert is not None and module.layer is not None and module.quantized is not None:
            per_layer[module.layer][module.quantized].append(module.name)
    for layer, split in sorted(per_layer.items()):
        if len(split) == 2:
            minority = min(split.values(), key=len)
            state = "unquantized" if minority is split[False] else "quantized"
            ctx.report(
                f"layer {layer}: {len(minority)} expert module(s) are {state} while their siblings are not "
                f"(engines probe expert 0 for the whole layer): {summarize(minority)}",
                tensor=summarize(minority, limit=3),
                count=len(minority),
            )


@rule(
    "WC316",
    "ignore-lists-disagree",
    Severity.WARNING,
    summary="config.json's ignore list and hf_quant_config.json's exclude_modules differ.",
    bad='config.json "ignore": ["lm_head"]; hf_quant_config.json "exclude_modules": ["lm_head", "*mlp.gate"]',
    good="both files carry the same list",
    needs=("config",),
)
def ignore_lists_disagree(ctx: LintContext) -> None:
    """ModelOpt writes the exclusion list twice under two names; engines read one or the other (miles
    merges them), so a difference means different consumers skip different modules."""
    hf = ctx.ckpt.extra_json.get("hf_quant_config.json")
    if hf is None or not isinstance(hf.data, dict):
        return
    exclude = (hf.data.get("quantization") or {}).get("exclude_modules")
    qc = ctx.ckpt.config_data.get("quantization_config")
    if not isinstance(exclude, list) or not isinstance(qc, dict):
        return
    ignore = qc.get("ignore", qc.get("exclude_modules"))
    if not isinstance(ignore, list):
        return
    only_cfg, only_hf = sorted(set(ignore) - set(exclude)), sorted(set(exclude) - set(ignore))
    if only_cfg or only_hf:
        ctx.report(
            f"ignore lists differ: only in config.json {only_cfg[:6]}, only in hf_quant_config.json {only_hf[:6]}",
            file="hf_quant_config.json",
        )


@rule(
    "WC317",
    "packed-name-not-weight",
    Severity.ERROR,
    summary="A `*_packed` tensor whose base is not `weight` (fused 3-D experts quantized as a whole).",
    bad="model.layers.0.mlp.experts.gate_up_proj_packed",
    good="model.layers.0.mlp.experts.0.gate_proj.weight_packed",
)
def packed_name_not_weight(ctx: LintContext) -> None:
    """llm-compressor 0.12 quantized transformers-v5 fused 3-D expert tensors without linearizing them,
    writing `experts.gate_up_proj_packed`; no engine loads these names and vLLM served garbage
    (vllm-project/llm-compressor#2939, #1914)."""
    def is_odd(text: str) -> bool:
        return text.endswith("_packed") and not text.endswith(".weight_packed")

    odd: list[str] = []
    for parts, members in name_templates(ctx).items():
        # A template's last literal part (the whole name for a name without ids) decides for all its names
        # when it is at least as long as `.weight_packed`.
        if len(parts) == 1 or len(parts[-1]) >= len(".weight_packed"):
            if is_odd(parts[-1]):
                odd.extend(n for n, _ in members)
        else:
            odd.extend(n for n, _ in members if is_odd(n))
    odd.sort()
    if odd:
        ctx.report(f"{len(odd)} packed tensors are not `<module>.weight_packed`: {summarize(odd)}",
                   tensor=summarize(odd, limit=3), count=len(odd))  # fmt: skip


@rule(
    "WC318",
    "ignore-class-name",
    Severity.INFO,
    summary="An ignore entry is a class name, honoured by compressed-tensors only.",
    bad='"ignore": ["Qwen3MoeSparseMoeBlock"]',
    good='"ignore": ["re:.*mlp$"]   (module names, read by every consumer)',
    needs=("config",),
)
def ignore_class_name(ctx: LintContext) -> None:
    """compressed-tensors matches ignore entries against module class names too; vLLM and SGLang do not, so
    the engines will still quantize (or expect quantized) those modules."""
    qa = _quantized(ctx)
    if qa is None:
        return
    for entry in qa.spec.ignore:
        if is_class_entry(entry) and entry != "Linear":
            ctx.report(f"ignore entry {entry!r} is a class name: vLLM and SGLang ignore it", file=CONFIG_FILE,
                       tensor=entry)  # fmt: skip


def _engine_leaves(ctx: LintContext, engine: str) -> dict[str, str]:
    """`engine_unquantized_leaves` for the config's first model_type the engine has facts for."""
    from weightcheck.patterns import engine_unquantized_leaves

    for model_type in _model_types(ctx):
        found = engine_unquantized_leaves(engine, model_type)
        if found:
            return found
    return {}


def _model_types(ctx: LintContext) -> list[str]:
    """The config's model_type(s): the top level's, then its text config's (a VLM's language model)."""
    found = [ctx.ckpt.config_data.get("model_type"), ctx.ckpt.text_config().get("model_type")]
    return list(dict.fromkeys(t for t in found if isinstance(t, str)))


def _producer_targets(qa: QuantAnalysis, module: ModuleInfo, linear_leaves: dict[str, str]) -> str | None:
    """The target through which compressed-tensors (llm-compressor) quantizes `module`, else None. `Linear`
    matches every nn.Linear and subclass (it walks the MRO): the pattern's linear modules, and router-kind
    modules transformers builds as a Linear (generated/producer/transformers_linear.json). Other class
    targets are not modelled: no claim."""
    assert qa.spec is not None
    leaf = module.name.rsplit(".", 1)[-1]
    for target in qa.spec.targets:
        if target == "Linear":
            if module.kind == "linear" or (module.kind in ("router", "other") and leaf in linear_leaves):
                return target
        elif not is_class_entry(target) and get_consumer("ct").matches(module.name, [target]):
            return target
    return None


def _engine_attr_candidates(
    qa: QuantAnalysis, leaves: dict[str, dict[str, str]], renames: dict[str, list[str]]
) -> Iterable[ModuleInfo]:
    """The modules WC320 looks at, in inventory order. Config-only and without engine renames, a run
    (`patterns.expand_runs`) whose last component has no `*` shares its kind, its `lm_head` ending and its
    leaf, which alone decides `_engine_attr`: a run no engine builds unquantized by that leaf is skipped
    whole (DeepSeek-V3: 46k expert modules never made)."""
    assert qa.inventory is not None
    modules, runs, run_names = qa.inventory.modules, qa.inventory.runs, qa.inventory.run_names
    if runs is None or run_names is None or any(renames.values()):
        return modules.values()
    out: list[ModuleInfo] = []
    for run, names in zip(runs, run_names, strict=True):
        leaf = run.name.rsplit(".", 1)[-1]
        if "*" not in leaf and (
            run.spec.kind in ("embedding", "norm", "experts")
            or run.name.endswith("lm_head")
            or not any(leaf in by_leaf for by_leaf in leaves.values())
        ):
            continue
        out += [modules[n] for n in names]
    return out


def _engine_attr(name: str, unquantized: dict[str, str], renames: list[str]) -> str | None:
    """The engine attribute (built unquantized) that module `name` loads into, or None: by the name's last
    component, or by it after the engine's own `load_weights` rewrites (SGLang's Hunyuan drops `wg.`, so
    `mlp.gate.wg` loads into its unquantized `mlp.gate`)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in unquantized:
        return unquantized[leaf]
    if not renames:
        return None
    # only the leaf matters: the rewrites are applied to the name's last components (a rename that reaches
    # further up, `mtp -> model`, leaves the leaf as it is)
    full = "." + ".".join(name.rsplit(".", 3)[-3:]) + "."
    for rename in renames:
        old, _, new = rename.partition(" -> ")
        if old and old in full:
            full = full.replace(old, new)
    renamed = full.rstrip(".").rsplit(".", 1)[-1]
    return unquantized.get(renamed) if renamed != leaf else None


@rule(
    "WC320",
    "engine-unquantized-targeted",
    Severity.ERROR,
    summary="The producer's targets quantize a module an engine builds without the quant config (no ignore entry).",
    bad='Qwen3-Next, targets ["Linear"], "ignore": ["lm_head", "re:.*mlp.gate$"]   (mlp.shared_expert_gate '
    "is an nn.Linear: llm-compressor packs it; SGLang and vLLM build it with quant_config=None)",
    good='"ignore": ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]',
    needs=("config",),
)
def engine_unquantized_targeted(ctx: LintContext) -> None:
    """SGLang and vLLM build some modules with `quant_config=None` whatever the checkpoint says: routers
    (Llama-4's `feed_forward.router`, gpt-oss's `mlp.router`), shared-expert gates (Qwen2-MoE, Qwen3-Next,
    Qwen3.5-MoE `mlp.shared_expert_gate`), and per engine others (SGLang 0.5.23's OLMo attention). For
    those modules the ignore list means nothing to the engine, but it is what stops the producer: a
    compressed-tensors config whose `Linear` target covers such a module (it is an `nn.Linear` subclass in
    transformers) and whose ignore list leaves it out describes a checkpoint that stores it as
    `weight_packed`/`weight_scale`, which the engine has no parameter for (SGLang raises KeyError or skips the
    names and routes on an uninitialized gate; vLLM raises KeyError or loads garbage). Facts per architecture are
    read from the engines' model sources (patterns/generated/sglang/ and vllm/, `unquantized`), for generated and
    hand-written architectures alike. Config-only: the error stands on the targets and ignore list; with tensors,
    on a module of kind `linear` actually stored quantized (stored routers are WC308's)."""
    qa = _quantized(ctx)
    if qa is None or qa.inventory is None or qa.spec is None or qa.spec.method != "compressed-tensors":
        return
    from weightcheck.patterns import (
        ENGINE_SOURCES,
        engine_source_facts,
        engine_unquantized_leaves,
        producer_linear_leaves,
    )

    deployed = qa.deployed
    engines = [e for e in ENGINE_SOURCES
               if deployed is None or any(d == e or d.split("-")[0] == e for d in deployed)]  # fmt: skip
    types = _model_types(ctx)
    leaves: dict[str, dict[str, str]] = {}
    renames: dict[str, list[str]] = {}
    linear_leaves: dict[str, str] = {}
    for engine in engines:
        model_type = next((t for t in types if engine_unquantized_leaves(engine, t)), None)
        if model_type is not None:
            leaves[engine] = engine_unquantized_leaves(engine, model_type)
            rewrites = engine_source_facts(engine, model_type).get("load_weights") or {}
            renames[engine] = [r for r in rewrites.get("renames") or [] if isinstance(r, str)]
            linear_leaves = linear_leaves or producer_linear_leaves(model_type)
    if not leaves:
        return
    ct = get_consumer("ct")
    class_entries = {e for e in qa.spec.ignore if is_class_entry(e)}
    attr_of: dict[str, dict[str, str]] = {}
    groups: dict[tuple[str, tuple[str, ...], str], list[str]] = defaultdict(list)
    for module in _engine_attr_candidates(qa, leaves, renames):
        if module.kind in ("embedding", "norm", "experts") or module.name.endswith("lm_head"):
            continue
        # one lookup per name tail (all _engine_attr reads): Qwen3-Next-sized configs have ~75k expert modules
        template = module.name.rsplit(".", 3)[-3:]
        template = ".".join(template)
        if template not in attr_of:
            attr_of[template] = {e: a for e in leaves if (a := _engine_attr(module.name, leaves[e], renames[e]))}
        engine_attr = attr_of[template]
        hit = tuple(engine_attr)
        if not hit:
            continue
        if qa.inventory.from_config_only:
            if module.expected is not None and module.expected.spec.optional:
                continue  # may not exist at all (MTP copies, switched-off sub-modules)
            target = _producer_targets(qa, module, linear_leaves)
            # the producer's own matching, on the few modules that get here (no index of every name needed)
            if target is None or ct.matches(module.name, qa.spec.ignore):
                continue
            if class_entries:  # llm-compressor also skips modules by class name (`"Llama4Router"`)
                cls = linear_leaves.get(module.name.rsplit(".", 1)[-1])
                if cls is None or set(cls.split(" | ")) & class_entries:
                    continue  # its class is not known here: no claim; or the list names it

        elif not module.quantized or module.kind in NON_LINEAR:
            continue  # stored unquantized: loadable; a stored quantized router is WC308's finding
        else:
            target = "stored quantized"
        # one finding per engine attribute: SGLang's OLMo `qkv_proj` covers q_proj, k_proj and v_proj
        attrs = tuple(f"{'SGLang' if e == 'sglang' else 'vLLM'} (`{engine_attr[e]}`)" for e in hit)
        groups[(" and ".join(attrs), hit, target)].append(module.name)
    for (where, hit, target), names in sorted(groups.items()):
        how = (f"the producer's target {target!r} quantizes them and the ignore list does not cover them"
               if target != "stored quantized" else "they are stored quantized")  # fmt: skip
        add = covering_entries(names, ["ct"])
        ctx.report(
            f"{len(names)} module(s) built unquantized (quant_config=None) by {where}, but {how}: the engine has "
            f"no parameter for their quantized weights: {summarize(names)}",
            file=CONFIG_FILE,
            tensor=summarize(names, limit=3),
            count=len(names),
            details={
                "engines": list(hit),
                "modules": names[:200],
                "target": target,
                # `lint --fix` adds these only where the config is all there is: stored packed weights need
                # re-quantizing, and an ignore entry alone would make them WC306's contradiction
                "add_ignore": add if target != "stored quantized" else [],
                "ignore_source": qa.spec.source,
                "ignore_field": qa.spec.ignore_field,
            },
            fix=f"add {', '.join(json.dumps(e) for e in add)} to {qa.spec.source} {qa.spec.ignore_field!r} and "
            "re-run the quantizer, so the module is stored unquantized as the engines build it",
        )
