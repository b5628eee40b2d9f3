"""WC1xx: files and shards — readable, complete, where they should be."""

from __future__ import annotations

from collections import defaultdict

from weightcheck.checkpoint import INDEX_NAME, KNOWN_UNINDEXED, SHARD_RE, SINGLE_NAME, Checkpoint
from weightcheck.collapse import format_ranges, summarize
from weightcheck.findings import Severity
from weightcheck.rules import LintContext, rule
from weightcheck.safetensors_header import LAYOUT_KINDS, TRUNCATION_KINDS
from weightcheck.structure import EXPERT_COUNT_KEYS, LAYER_COUNT_KEYS, MAX_PLAUSIBLE, MTP_COUNT_KEYS

# Files that legitimately sit next to HF shards without being indexed (Mistral's consolidated format).
# `__metadata__["format"]` values transformers accepts.
ACCEPTED_FORMATS = {"pt", "tf", "flax", "mlx"}


def _problems(ctx: LintContext, kinds: frozenset[str] | None, exclude: frozenset[str] = frozenset()):
    for name, report in sorted(ctx.ckpt.shards.items()):
        for problem in report.problems:
            if (kinds is None or problem.kind in kinds) and problem.kind not in exclude:
                yield name, report, problem


@rule(
    "WC101",
    "shard-truncated",
    Severity.ERROR,
    summary="A safetensors file is shorter (or longer) than its header says.",
    bad="""
        model-00003-of-00004.safetensors: header describes 1073741832 bytes but the file has 536870912
        (a partial download; safetensors raises MetadataIncompleteBuffer on load)
    """,
    good="8 + header length + the last tensor's end offset equals the file size for every shard.",
)
def shard_truncated(ctx: LintContext) -> None:
    """The file length is checked against the header without reading tensor data: `8 + N + max(end)`
    must equal the file size. Truncated and partially downloaded shards are the most common cause of
    `SafetensorError: MetadataIncompleteBuffer` (lyogavin/airllm#137); a shard with trailing bytes is rejected by
    the same check in the safetensors library."""
    for name, _, problem in _problems(ctx, TRUNCATION_KINDS):
        ctx.report(f"{problem.kind}: {problem.detail}", file=name)


@rule(
    "WC102",
    "shard-header-corrupt",
    Severity.ERROR,
    summary="A safetensors header cannot be parsed: absurd length, not UTF-8, not JSON, bad entries.",
    bad="""
        model-00001-of-00002.safetensors: HeaderTooLarge: header length 18446744073709551615 exceeds 100000000
        model-00002-of-00002.safetensors: InvalidHeaderDeserialization: unknown dtype 'F12'
    """,
    good="Every header is a UTF-8 JSON object whose entries have a known dtype, a shape and two offsets.",
)
def shard_header_corrupt(ctx: LintContext) -> None:
    """The 8-byte little-endian header length must be sane (< 100 MB, inside the file), the header must be
    UTF-8 JSON starting with `{`, keys must be unique, `__metadata__` must map strings to strings, and every
    entry needs a known dtype, a non-negative integer shape and two integer offsets. Any violation makes the
    safetensors library refuse the whole file. Such files are never read further."""
    handled = TRUNCATION_KINDS | LAYOUT_KINDS | {"NotRegularFile"}
    for name, _, problem in _problems(ctx, None, exclude=handled):
        where = f" (tensor {problem.tensor!r})" if problem.tensor else ""
        ctx.report(f"{problem.kind}: {problem.detail}{where}", file=name, tensor=problem.tensor)


@rule(
    "WC103",
    "shard-offsets-invalid",
    Severity.ERROR,
    summary="Tensor byte ranges overlap, leave gaps, or do not match dtype × shape.",
    bad="""
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}     # overlaps a
    """,
    good="Offsets, sorted, tile the data buffer exactly; each span equals numel × dtype size.",
)
def shard_offsets_invalid(ctx: LintContext) -> None:
    """The data buffer must be entirely indexed with no holes or overlaps, and each tensor's byte span must
    equal `prod(shape) * bits / 8` (whole bytes for sub-byte dtypes). Hand-edited headers, shape changes
    without data changes and hostile files fail here (safetensors: InvalidOffset, TensorInvalidInfo,
    MisalignedSlice, ValidationOverflow)."""
    for name, _, problem in _problems(ctx, LAYOUT_KINDS):
        ctx.report(f"{problem.kind}: {problem.detail}", file=name, tensor=problem.tensor)


@rule(
    "WC104",
    "file-refused",
    Severity.ERROR,
    summary="A checkpoint file is a FIFO/device/directory, or a symlink leaving the checkpoint directory.",
    bad="model-00001-of-00002.safetensors -> /etc/shadow   (symlink out of the checkpoint)",
    good="Shards are regular files inside the directory (Hugging Face cache blobs symlinks are accepted).",
    fix="Replace the file with the regular shard it should be, or remove it; a symlink must stay inside the "
    "checkpoint directory.",
    implies={"WC105": "subjects", "WC106": "subjects", "WC108": "subjects"},
    needs=("files",),  # a refused side file (hf_quant_config.json...) is a finding in config-only mode too
)
def file_refused(ctx: LintContext) -> None:
    """weightcheck never opens a file that resolves outside the checkpoint directory or that is not a regular
    file: opening a FIFO blocks, and following links out of the directory lets a checkpoint make the linter
    read arbitrary files. Symlinks from a Hugging Face cache snapshot into the same repository's `blobs/`
    directory are the normal cache layout and are followed. Index entries that escape are reported by
    WC206 instead."""
    indexed = set(ctx.ckpt.indexed_shards)
    for refusal in ctx.ckpt.refused:
        if refusal.kind == "missing" or (refusal.name in indexed and refusal.kind in ("escapes", "absolute")):
            continue
        ctx.report(f"refused to open: {refusal.reason}", file=refusal.name)
    for name, _, problem in _problems(ctx, frozenset({"NotRegularFile", "IoError"})):
        ctx.report(f"refused to open: {problem.detail}", file=name)


@rule(
    "WC105",
    "shard-not-indexed",
    Severity.ERROR,
    also=(Severity.WARNING, Severity.INFO),
    summary="A .safetensors file on disk is not referenced by the index.",
    bad="""
        model.safetensors.index.json names model-00001..00004, but model-00005-of-00005.safetensors
        (or a stray model.safetensors) also sits in the directory
    """,
    good="Every shard file is named by the index, or the directory holds a single model.safetensors.",
)
def shard_not_indexed(ctx: LintContext) -> None:
    """vLLM silently drops shards not named in the index and transformers never opens them, while loaders
    that glob files merge them (stale `model.safetensors` next to a fresh index, Blaizzy/mlx-vlm#1464). A file
    holding model tensors that no index entry references is an error; known side files
    (`consolidated*.safetensors`) are a warning, and an info beside `params.json`: Mistral's Hub repos ship their
    native layout next to the HF one on purpose. A PEFT adapter's `adapter_model.safetensors` saved into the model's
    folder is an error with or without an index (without one, vLLM and SGLang load every file in the folder)."""
    ckpt = ctx.ckpt
    indexed = set(ckpt.indexed_shards)
    adapters = set(ckpt.stray_adapter_files())
    for name in sorted(adapters - indexed):
        ctx.report(
            f"{name} is a PEFT adapter's weights (adapter_config.json beside it) in the model's folder: "
            + (
                f"not in {INDEX_NAME}, so the HF loaders skip it, but loaders that glob files read its "
                "base_model.model.* LoRA tensors"
                if ckpt.index is not None
                else "with no index, vLLM and SGLang load every *.safetensors here and meet its base_model.model.* "
                "LoRA tensors as model weights (an unknown-parameter error at load)"
            ),
            file=name,
            fix="move the adapter (adapter_model.safetensors, adapter_config.json) to its own folder",
        )
    if ckpt.index is None:
        return
    mistral = set(ckpt.mistral_native_copy())
    for name in ckpt.files_on_disk:
        if name in indexed or name in adapters:
            continue
        report = ckpt.shards.get(name)
        n = len(report.tensors) if report else 0
        if name in mistral:
            ctx.report(
                f"{name} ({n} tensors) is Mistral's native copy of the weights (params.json beside it), which vLLM "
                f"reads with --load-format mistral; the HF loaders follow {INDEX_NAME} and never open it",
                file=name,
                severity=Severity.INFO,
                fix="nothing to fix: both layouts are shipped on purpose (delete the copy to save disk space)",
            )
            continue
        known = name.startswith(KNOWN_UNINDEXED)
        what = "a single-file checkpoint left next to a sharded one" if name == SINGLE_NAME else "on disk"
        ctx.report(
            f"{name} is {what} but not referenced by {INDEX_NAME} ({n} tensors)",
            file=name,
            severity=Severity.WARNING if known else None,
        )


@rule(
    "WC106",
    "shard-numbering",
    Severity.WARNING,
    summary="`-NNNNN-of-MMMMM` shard names disagree with each other or with the files present.",
    bad="model-00001-of-00004, model-00002-of-00004, model-00004-of-00004 (00003 missing); or mixed totals",
    good="model-00001-of-00004 … model-00004-of-00004, every number present once, one total.",
)
def shard_numbering(ctx: LintContext) -> None:
    """Shard names carry their position and the total. A gap in the sequence or two different totals means
    a shard was lost or two exports were mixed (sgl-project/sglang#32279, NVIDIA-NeMo/Megatron-Bridge#4188,
    NVIDIA-NeMo/Megatron-Bridge#4513). Both 5- and 6-digit totals are
    accepted (DeepSeek-V3 uses `-of-000163`)."""
    names = set(ctx.ckpt.files_on_disk) | set(ctx.ckpt.indexed_shards)
    by_stem: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    width: dict[str, int] = {}
    for name in names:
        m = SHARD_RE.match(name)
        if m:
            by_stem[m["stem"]].append((int(m["index"]), int(m["total"]), name))
            width[m["stem"]] = len(m["total"])
    # Index-only mode: no shard is present by design; the index's own numbering is what is checked.
    on_disk = set(ctx.ckpt.indexed_shards if ctx.options.get("index_only") else ctx.ckpt.files_on_disk)
    for stem, items in sorted(by_stem.items()):
        totals = sorted({t for _, t, _ in items})
        if len(totals) > 1:
            # The odd ones out are the files with a minority total (a FIFO or stray copy next to a set).
            count_of = {t: sum(1 for _, tt, _ in items if tt == t) for t in totals}
            usual = max(totals, key=lambda t: (count_of[t], t))
            odd = sorted(n for _, t, n in items if t != usual)
            ctx.report(
                f"shards named {stem}-*-of-* disagree on the total: {totals}",
                file=f"{stem}-*",
                details={"files": odd},
                fix=f"Keep one export: remove or rename {', '.join(odd[:4])} (the set's total is {usual}).",
            )
            continue
        total = totals[0]
        present = {i for i, _, n in items if n in on_disk}
        w = width[stem]
        missing = sorted(set(range(1, total + 1)) - present)
        beyond = sorted(i for i in present if i < 1 or i > total)
        if missing:
            ctx.report(
                f"{len(present)} of {total} shards of {stem}-*-of-{total:0{width[stem]}d} present on disk; "
                f"missing numbers {format_ranges(missing)}",
                file=f"{stem}-*-of-{total:0{width[stem]}d}.safetensors",
                count=len(missing),
                details={"files": [f"{stem}-{i:0{w}d}-of-{total:0{w}d}.safetensors" for i in missing]},
            )
        if beyond:
            ctx.report(f"shard numbers {beyond} lie outside 1..{total}", file=f"{stem}-*")


def _peft_type(adapter: dict[str, object]) -> str:
    """`LORA ` (with its space) when adapter_config.json names a type, else nothing."""
    peft_type = adapter.get("peft_type")
    return f"{peft_type[:20]} " if isinstance(peft_type, str) and peft_type else ""


@rule(
    "WC107",
    "config-invalid",
    Severity.ERROR,
    also=(Severity.WARNING, Severity.INFO),
    summary="config.json is missing, is not JSON, or lacks the fields loaders need.",
    bad='config.json: {"hidden_size": 64,   (truncated JSON) — or no config.json at all',
    good='config.json with "model_type", "architectures" and "num_hidden_layers".',
    needs=("config",),
)
def config_invalid(ctx: LintContext) -> None:
    """Engines build the model from config.json before reading a single weight; a missing or unparseable
    config fails at load (Mistral's native layout, `params.json` beside `consolidated*.safetensors`, is a warning:
    vLLM's Mistral format loads it), and a config without `num_hidden_layers` (or the aliases some classes use instead:
    `n_layer`, `num_layers`, `n_layers`) or `model_type` prevents weightcheck's own layer-coverage checks (they
    are then skipped, and this finding says so). A PEFT adapter (adapter_config.json, no config.json) is loaded
    on top of its base model, whose config.json lives there: an info that says which checks that skips."""
    cfg = ctx.ckpt.config
    if cfg is None or not cfg.exists:
        adapter = ctx.ckpt.peft_adapter()
        if adapter is not None:
            base = adapter.get("base_model_name_or_path")
            beside = "config.json here is its base model's" if ctx.ckpt.base_config is not None else "no config.json"
            ctx.report(
                f"{beside}: this is a PEFT {_peft_type(adapter)}adapter (adapter_config.json)"
                f"{f' for {str(base)[:200]}' if isinstance(base, str) and base else ''}, loaded on top of its base "
                + (
                    "model (SGLang --lora-paths, vLLM --lora-modules, PEFT from_pretrained)"
                    if adapter.get("peft_type") == "LORA"
                    else "model by PEFT's from_pretrained (SGLang and vLLM serve LoRA adapters only)"
                )
                + "; checks that need the base model's config.json (layer counts, shapes) are skipped",
                file="adapter_config.json",
                severity=Severity.INFO,
                fix="nothing to fix in the adapter; lint the base model's checkpoint for those checks",
            )
            from weightcheck.rules.adapter import adapter_config_problems

            for severity, message in adapter_config_problems(adapter):
                ctx.report(f"adapter_config.json: {message}", file="adapter_config.json", severity=severity,
                           fix="re-save the adapter with PEFT's save_pretrained, or correct the value")  # fmt: skip
            return
        if "params.json" in ctx.ckpt.other_files and any(f.startswith(KNOWN_UNINDEXED) for f in ctx.ckpt.files_on_disk):
            # Mistral's own layout: a valid checkpoint for vLLM's Mistral format, not for the HF loaders.
            ctx.report(
                "config.json is missing: this is Mistral's native layout (params.json, consolidated*.safetensors), "
                "which vLLM loads with --config-format mistral --load-format mistral; transformers and SGLang need "
                "the HF layout (config.json and HF tensor names). Checks that need config.json's counts are skipped",
                file="config.json",
                severity=Severity.WARNING,
            )
            return
        ctx.report("config.json is missing", file="config.json")
        return
    if cfg.error:
        refused = cfg.error.startswith("refused to open: ")
        fix = "replace config.json by a regular file inside the checkpoint folder (a copy of what it points at)"
        ctx.report(f"config.json: {cfg.error}", file="config.json", fix=fix if refused else "")
        return
    if not isinstance(cfg.data, dict):
        ctx.report("config.json is not a JSON object", file="config.json")
        return
    text = ctx.ckpt.text_config()
    lacking = [k for k in ("model_type",) if k not in text]
    if not any(key in text for key in LAYER_COUNT_KEYS):  # GPT-2's `n_layer` and the other aliases count too
        lacking.append("num_hidden_layers")
    if lacking:
        ctx.report(
            f"config.json lacks {', '.join(lacking)}; layer coverage checks are skipped",
            file="config.json",
            severity=Severity.WARNING,
        )
    nl = text.get("num_hidden_layers")
    if nl is not None and (not isinstance(nl, int) or isinstance(nl, bool) or nl < 0):
        ctx.report(f"num_hidden_layers is {str(nl)[:40]!r}, not a non-negative integer", file="config.json")
    for kind, keys in (("layers", LAYER_COUNT_KEYS), ("experts", EXPERT_COUNT_KEYS), ("mtp", MTP_COUNT_KEYS)):
        for key in keys:
            value = text.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_PLAUSIBLE[kind]:
                ctx.report(
                    f"{key} is {value}, beyond any real model (> {MAX_PLAUSIBLE[kind]}): treated as absent, "
                    "checks that need it are skipped",
                    file="config.json",
                )


@rule(
    "WC108",
    "shard-metadata-format",
    Severity.WARNING,
    summary="A shard's `__metadata__.format` is not one transformers accepts (pt, tf, flax, mlx).",
    bad='"__metadata__": {"format": "torch"}',
    good='"__metadata__": {"format": "pt"}',
)
def shard_metadata_format(ctx: LintContext) -> None:
    """transformers refuses a shard whose metadata is present but whose `format` is not one of
    `pt, tf, flax, mlx` (`OSError ... does not contain the valid metadata`). Missing metadata is accepted."""
    bad: dict[str, list[str]] = defaultdict(list)
    for name, report in sorted(ctx.ckpt.shards.items()):
        meta = report.metadata
        if meta is None:
            continue
        fmt = meta.get("format")
        if fmt is None or fmt not in ACCEPTED_FORMATS:
            bad[repr(fmt)].append(name)
    for fmt, files in bad.items():
        ctx.report(
            f"__metadata__ format {fmt} is not accepted by transformers in {len(files)} shard(s)",
            file=summarize(files, limit=3),
            count=len(files),
        )


def pickles_found(ckpt: Checkpoint) -> str:
    """`; found pickle weights ... (never opened: ...)` for a message about a target without safetensors weights
    (WC109, and lint's "nothing to check" note); "" when the root holds none."""
    pickles = ckpt.pickle_weights()
    return f"; found pickle weights {', '.join(pickles[:4])} (never opened: unpickling runs code)" if pickles else ""


@rule(
    "WC109",
    "no-weights",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="The target holds no safetensors weights and no index.",
    bad="weightcheck lint ./ckpt   (directory with only tokenizer files, or a typo'd path)",
    good="weightcheck lint ./ckpt   (directory with model.safetensors or an index and its shards)",
    needs=("config",),
)
def no_weights(ctx: LintContext) -> None:
    """A target with nothing to check must never pass green. When the directory holds a config but no
    weights, lint runs in config-only mode. `.bin`/`.pt` pickles are reported but never opened (unpickling
    runs code): with a config beside them this finding is a warning that no weight checks could run, and the run
    exits 3 naming them (the config-level checks ran; the weights it was pointed at were not checked)."""
    ckpt = ctx.ckpt
    if ckpt.has_weights:
        return
    extra = pickles_found(ckpt)
    if ctx.options.get("config_only") and not extra:
        return  # config-only lint is a mode, not a defect; the run's notes say which checks could not run
    ctx.report(
        "no .safetensors weights or index found: only config-level checks ran" + extra,
        file=ckpt.label,
        severity=Severity.WARNING if extra else None,
    )
