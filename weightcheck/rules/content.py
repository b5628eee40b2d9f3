"""WC6xx: checks that read tensor data (`lint --content`). (diff's WC7xx codes: weightcheck.rules.diff.)

The WC6xx rules share one streaming pass (`content_scan`): every readable tensor is viewed through its
shard's memory mapping, reduced once with a min/max (NaN propagates through it, ±Inf shows in the
extremes, all-zero and constant tensors have min == max), optionally hashed for a manifest, and its pages
are given back before the next tensor. Rules then read the scan's summaries; only a tensor already found
bad is read again (to count its NaNs, zeros...).

torch is imported inside the scan only: lint without `--content` never imports it.
"""

from __future__ import annotations

from pathlib import Path

from weightcheck.collapse import format_ranges, summarize
from weightcheck.findings import Finding, Location, Severity
from weightcheck.lazyregex import LazyRegex
from weightcheck.names import adapter_factor, split_expert_module
from weightcheck.rules import LintContext, rule

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

    from weightcheck.scan import TensorScan

CONTENT_NEEDS = ("tensors", "data")
# Tensors that may legitimately be zero or constant: zero points, shapes, indices, biases, norms.
_MAY_BE_CONSTANT = LazyRegex(r"(zero_point|weight_shape|g_idx|_shape|bias|norm\.weight|layernorm\.weight)$")
_PACKED = LazyRegex(r"_packed$")
_EMBEDDING = LazyRegex(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embeddings)\.weight$")


def _digest_algorithms(ctx: LintContext) -> list[str]:
    """Algorithms to hash with: sha256 for `--hash` (a published manifest should be cryptographic), and
    whatever the `--against-manifest` file uses (an xxh3_128 trainer manifest is checked with xxh3_128)."""
    wanted: list[str] = []
    if ctx.options.get("hash_out"):
        wanted.append("sha256")
    path = ctx.options.get("against_manifest")
    if path:
        import contextlib

        from weightcheck.digest import ManifestError, manifest_algorithms, read_manifest

        with contextlib.suppress(ManifestError):  # WC607 reports an unreadable manifest
            wanted.extend(sorted(manifest_algorithms(read_manifest(path))))
    return list(dict.fromkeys(wanted))


def content_scan(ctx: LintContext) -> list[TensorScan]:
    """One pass over every readable tensor (memoized for all WC6xx rules)."""
    return ctx.memo("content_scan", lambda: _scan(ctx))


def _store(ctx: LintContext) -> Any:
    from weightcheck.tensors import TensorStore

    return ctx.memo("tensor_store", lambda: TensorStore(ctx.ckpt))


def _scan(ctx: LintContext) -> list[TensorScan]:
    # The scan engine loads with the first --content rule, not with the registry every lint imports.
    from weightcheck.scan import TensorScan, ray_scan_tensors, scan_progress, scan_tensors

    store = _store(ctx)
    algorithms = _digest_algorithms(ctx)
    names = store.names()
    total = sum(store.info(n).nbytes for n in names)
    if ctx.options.get("ray") is not None:
        from weightcheck.distributed import session

        # Ray is the backend the scan runs on: the scan engine knows chunks and tasks, not lint's options.
        root = Path(ctx.options.get("local_path") or ctx.ckpt.root)
        with session(ctx.options.get("ray")) as ray:
            progress = scan_progress(ctx.options.get("progress"), total)
            out, note = ray_scan_tensors(ray, store, names, algorithms, root, progress)
        if note:
            ctx.cache.setdefault("notes", []).append(note)
    else:
        progress = scan_progress(ctx.options.get("progress"), total)
        advance = progress.advance if progress is not None else None
        try:
            out = scan_tensors(store, names, algorithms, advance)
        finally:
            if progress is not None:
                progress.close()
    # bitsandbytes 4-bit stores its codes as `<m>.weight`, viewed as the storage dtype (bf16 or f32 for
    # FSDP-QLoRA): bytes, not values. Their digests stand; their value statistics mean nothing (a byte pair
    # reads as NaN), so no value rule sees them.
    codes = {n[: -len(".absmax")] for n in ctx.ckpt.tensor_names() if n.endswith(".weight.absmax")}
    for scan in out:
        if scan.name in codes:
            scan.value_range = None
    known = ctx.ckpt.all_tensors()
    unreadable = store.unreadable()
    # The shard each unreadable tensor lives in, named by WC608 so the user knows what to mend.
    home = {n: s for s in sorted(ctx.ckpt.shards, reverse=True) for n in ctx.ckpt.shards[s].tensors if n in unreadable}
    home.update({n: s for n, s in ctx.ckpt.weight_map.items() if n in unreadable})
    for name, reason in sorted(unreadable.items()):
        info = known.get(name)
        shard = home.get(name, "")
        out.append(TensorScan(name, shard, info.dtype if info else "", info.shape if info else (), error=reason))
    return out


def _is_weight_matrix(scan: TensorScan) -> bool:
    from weightcheck.scan import SCALE_NAME

    return (
        len(scan.shape) >= 2
        and scan.value_range is not None
        and not SCALE_NAME.search(scan.name)
        and not _MAY_BE_CONSTANT.search(scan.name)
    )


@rule(
    "WC601",
    "tensor-nan-inf",
    Severity.ERROR,
    summary="A tensor holds NaN or Inf values.",
    bad="model.layers.3.mlp.down_proj.weight: 12 NaN values (an overflow during conversion)",
    good="every stored value is finite",
    needs=CONTENT_NEEDS,
)
def tensor_nan_inf(ctx: LintContext) -> None:
    """A single NaN in a weight poisons every activation downstream; Inf does the same after the first
    multiply. Checkpoints get them from fp16 overflow during conversion, a division by a zero scale, or a
    reset buffer that was never written. Checked on every float tensor, scales included (an E8M0 scale of
    0xFF is NaN)."""
    for scan in content_scan(ctx):
        found = scan.value_range
        if found is None or not (found.has_nan or found.has_inf):
            continue
        nans, infs = scan.counts.get("nan", 0), scan.counts.get("inf", 0)
        ctx.report(
            f"{nans} NaN and {infs} Inf values",
            file=scan.shard,
            tensor=scan.name,
            details={"nan": nans, "inf": infs},
        )


@rule(
    "WC602",
    "weight-all-zero",
    Severity.ERROR,
    also=(Severity.WARNING,),
    summary="A weight matrix is all zeros.",
    bad="model.layers.0.mlp.gate.weight: every element is 0 (router never loaded)",
    good="weight matrices hold trained (non-zero) values; zero biases and zero points are fine",
    needs=CONTENT_NEEDS,
)
def weight_all_zero(ctx: LintContext) -> None:
    """A weight matrix of zeros is a tensor that was allocated and never filled: an export that wrote
    the buffer before the copy, a shard written from the wrong rank, a zeroed router (vllm-omni#5573).
    Only matrices are checked (2-D and up); biases, zero points, and 1-D norms may legitimately be
    zero. In a PEFT adapter, factors PEFT initialises to zeros (LoRA `lora_B`, Embedding `lora_embedding_A`,
    AdaLoRA `lora_E`, LoHa's and LoKr's second factors) are all zeros until training updates them: when every
    factor of that kind is zero, one warning that the adapter adds nothing yet; when only some are, an error
    (those modules lost their update), a warning when all of them are experts (an expert that was never routed
    a token keeps its initialisation)."""
    names = [s for s in content_scan(ctx) if _is_weight_matrix(s) and s.value_range and s.value_range.all_zero]
    adapter = ctx.ckpt.peft_adapter() is not None
    at_init: dict[str, list[str]] = {}  # adapter leaf -> all-zero tensors
    for scan in names:
        if _PACKED.search(scan.name):
            continue  # zero words are codes at the minimum, not zero weights: WC604 reports them
        factor = adapter_factor(scan.name) if adapter else None
        if factor is not None:
            at_init.setdefault(factor[1], []).append(scan.name)
            continue
        ctx.report(f"all {_numel(scan.shape)} elements are zero", file=scan.shard, tensor=scan.name)
    if at_init:
        _adapter_zeros(ctx, at_init)


def _adapter_zeros(ctx: LintContext, at_init: dict[str, list[str]]) -> None:
    held: dict[str, int] = {}
    for name in ctx.ckpt.tensor_names():
        factor = adapter_factor(name)
        if factor is not None and factor[1] in at_init:
            held[factor[1]] = held.get(factor[1], 0) + 1
    untrained = sorted(n for leaf, zeros in at_init.items() if len(zeros) == held[leaf] for n in zeros)
    lost = sorted(n for leaf, zeros in at_init.items() if len(zeros) < held[leaf] for n in zeros)
    if lost:
        experts = all(split_expert_module(adapter_factor(n)[0]) is not None for n in lost)  # type: ignore[index]
        ctx.report(
            f"{len(lost)} adapter factor(s) are still all zeros (their initialisation) while the others of their "
            f"kind were trained: those modules lost their update"
            f"{' (or, experts all, were never routed a token)' if experts else ''}: {summarize(lost)}",
            tensor=summarize(lost, limit=3),
            count=len(lost),
            severity=Severity.WARNING if experts else Severity.ERROR,
        )
    if untrained:
        ctx.report(
            f"every adapter factor PEFT initialises to zeros ({len(untrained)}) is still all zeros: the adapter adds "
            f"nothing to the base model; expected before its first training step, a lost update after one: "
            f"{summarize(untrained)}",
            tensor=summarize(untrained, limit=3),
            count=len(untrained),
            severity=Severity.WARNING,
        )


@rule(
    "WC603",
    "scale-not-positive",
    Severity.ERROR,
    summary="A quantization scale is zero or negative.",
    bad="model.layers.2.self_attn.q_proj.weight_scale: 3 zero values (those groups dequantize to 0)",
    good="every weight_scale / weight_scale_inv / input_scale element is > 0",
    needs=CONTENT_NEEDS,
)
def scale_not_positive(ctx: LintContext) -> None:
    """A zero scale dequantizes its whole group to zero (or to Inf/NaN for `weight_scale_inv`
    consumers that divide); a negative one flips the sign of every weight in the group. Real
    quantizers never produce either: observers take absolute maxima and clamp away from zero. E8M0
    exponent scales (stored as U8) are always positive except 0xFF, which encodes NaN."""
    from weightcheck.scan import SCALE_NAME

    for scan in content_scan(ctx):
        found = scan.value_range
        if found is None or not SCALE_NAME.search(scan.name) or found.has_nan:
            continue
        if scan.dtype == "U8":  # E8M0 exponents: only 0xFF is invalid (NaN)
            if found.maximum >= 255:
                count = scan.counts.get("255", 0)
                ctx.report(f"{count} E8M0 exponent(s) are 0xFF (NaN)", file=scan.shard, tensor=scan.name)
            continue
        if found.minimum > 0:
            continue
        zeros, negatives = scan.counts.get("zero", 0), scan.counts.get("negative", 0)
        ctx.report(
            f"{zeros} zero and {negatives} negative scale values",
            file=scan.shard,
            tensor=scan.name,
            details={"zero": zeros, "negative": negatives},
        )


@rule(
    "WC604",
    "constant-tensor",
    Severity.WARNING,
    summary="A weight matrix holds one value repeated.",
    bad="model.layers.5.self_attn.o_proj.weight_packed: every element is -2004318072 (all codes -8)",
    good="weight matrices vary; norms initialized to 1.0 and zero biases are not checked",
    needs=CONTENT_NEEDS,
)
def constant_tensor(ctx: LintContext) -> None:
    """A matrix filled with one value carries no information: typically a `torch.full`/`fill_`
    placeholder, an all-minimum packed tensor (every INT4 code -8 packs to one repeated word), or a
    broadcast that was saved instead of the real weight. All-zero matrices are WC602; vectors (norms,
    biases) are skipped because constant initial values are legitimate there. In a PEFT adapter, scaling
    vectors stored as `[n, 1]` matrices that PEFT starts at a constant (IA3's `ia3_l`, at 1) are one finding
    for all of them: an adapter that has not been trained yet."""
    adapter = ctx.ckpt.peft_adapter() is not None
    at_init: list[str] = []
    for scan in content_scan(ctx):
        found = scan.value_range
        if not _is_weight_matrix(scan) or found is None or not found.constant:
            continue
        if found.all_zero and not _PACKED.search(scan.name):
            continue  # WC602
        if _numel(scan.shape) < 2:
            continue
        if adapter and adapter_factor(scan.name) is not None and found.minimum == 1:
            at_init.append(scan.name)
            continue
        value = int(found.minimum) if found.minimum.is_integer() else found.minimum
        ctx.report(f"every element is {value}", file=scan.shard, tensor=scan.name, details={"value": found.minimum})
    if at_init:
        ctx.report(
            f"{len(at_init)} adapter factor(s) hold PEFT's initial value 1 in every element (IA3's scaling vectors "
            f"start so): the adapter changes nothing there yet: {summarize(sorted(at_init))}",
            tensor=summarize(sorted(at_init), limit=3),
            count=len(at_init),
            details={"value": 1.0},
        )


@rule(
    "WC605",
    "tied-weights-differ",
    Severity.ERROR,
    summary="tie_word_embeddings is true but the stored lm_head and embedding differ.",
    bad='"tie_word_embeddings": true, lm_head.weight stored and != model.embed_tokens.weight',
    good='"tie_word_embeddings": true with lm_head.weight absent, or stored and bit-identical',
    needs=CONTENT_NEEDS,
)
def tied_weights_differ(ctx: LintContext) -> None:
    """With tied embeddings the engine uses one matrix for both ends of the model. When a checkpoint
    stores both and they differ, which one wins depends on the loader (transformers ties after loading,
    some engines read lm_head.weight): the served model depends on the engine. Compared bit for bit."""
    import torch

    from weightcheck.tensors import TensorReadError

    tie = ctx.ckpt.text_config().get("tie_word_embeddings")
    if tie is not True:
        return
    store = _store(ctx)
    names = store.names()
    heads = [n for n in names if n == "lm_head.weight" or n.endswith(".lm_head.weight")]
    embeds = [n for n in names if _EMBEDDING.search(n)]
    if not heads or not embeds:
        return
    head, embed = heads[0], embeds[0]
    hi, ei = store.info(head), store.info(embed)
    if (hi.dtype, hi.shape) != (ei.dtype, ei.shape):
        ctx.report(
            f"{head} is {hi.dtype}{list(hi.shape)} but {embed} is {ei.dtype}{list(ei.shape)}",
            tensor=head,
        )
        return
    try:
        same = torch.equal(store.get_words(head), store.get_words(embed))
    except TensorReadError:
        return
    finally:
        store.release(head)
        store.release(embed)
    if not same:
        ctx.report(f"{head} differs from {embed} although tie_word_embeddings is true", tensor=head)


@rule(
    "WC606",
    "manifest-mismatch",
    Severity.ERROR,
    summary="A tensor's digest differs from the manifest given with --against-manifest.",
    bad="model.layers.7.mlp.up_proj.weight: bytes differ (sha256) from manifest.json",
    good="every tensor's dtype, shape and digest match the manifest; no tensor missing or extra",
    needs=CONTENT_NEEDS,
)
def manifest_mismatch(ctx: LintContext) -> None:
    """`lint --content --against-manifest FILE` re-hashes every tensor (its bytes as stored, with dtype and
    shape, with the algorithm each manifest entry names: sha256 from `--hash`, or xxh3_128 from a trainer
    manifest) and compares with the manifest: after a copy, an upload, or a conversion that should have been
    lossless. Bytes, not values: -0.0 vs 0.0 and NaN payloads count as differences."""
    from weightcheck.digest import ManifestError, compare_digests, read_manifest

    path = ctx.options.get("against_manifest")
    if not path:
        return
    try:
        expected = read_manifest(path)
    except ManifestError:
        return  # WC607 reports it
    scans = content_scan(ctx)
    # Each name compared in the algorithm its manifest entry uses (the scan hashed with all of them).
    actual = {
        s.name: s.digests[expected[s.name].algorithm if s.name in expected else next(iter(s.digests))]
        for s in scans
        if s.digests
    }
    unreadable = {s.name for s in scans if not s.digests}
    result = compare_digests(expected, actual)
    missing = [n for n in result.missing if n not in unreadable]
    if missing:
        ctx.report(
            f"{len(missing)} tensor(s) in the manifest are not in the checkpoint",
            tensor=summarize(missing),
            count=len(missing),
            details={"missing": missing[:100]},
        )
    if result.extra:
        ctx.report(
            f"{len(result.extra)} tensor(s) are not in the manifest",
            tensor=summarize(result.extra),
            count=len(result.extra),
            details={"extra": result.extra[:100]},
        )
    per_tensor = {
        name: Finding(
            code=ctx.current.code,  # type: ignore[union-attr]
            name=ctx.current.name,  # type: ignore[union-attr]
            severity=ctx.current.severity,  # type: ignore[union-attr]
            message=f"{why} from {path}",
            location=Location(tensor=name),
        )
        for name, why in sorted(result.changed.items())
    }
    for (kind, word, offset), pairs in _shifts(expected, actual, result.changed).items():
        names, held = [n for n, _ in pairs], [h for _, h in pairs]
        own = [int(a) for n, h in pairs for a, b in zip(n.split("."), h.split("."), strict=False) if a != b]
        theirs = [int(b) for n, h in pairs for a, b in zip(n.split("."), h.split("."), strict=False) if a != b]
        sign = f"+{offset}" if offset > 0 else str(offset)
        ctx.report(
            f"{kind}s {format_ranges(own)} hold the manifest's data of {kind}s {format_ranges(theirs)} "
            f"({word} ids shifted by {sign}, {len(names)} tensors)",
            tensor=summarize(names, limit=3),
            count=len(names),
            details={"shift": offset, "index": kind, "tensors": names, "holds": held},
            fix=f"the writer numbered these {kind}s {abs(offset)} too {'low' if offset > 0 else 'high'}: fix the "
            f"{kind} offset where the checkpoint was written (pipeline-stage or expert-parallel), then re-export",
            related=[per_tensor.pop(n) for n in names],
        )
    for finding in per_tensor.values():
        ctx.findings.append(finding)


def _shifts(expected: Any, actual: Any, changed: Any) -> dict[tuple[str, str, int], list[tuple[str, str]]]:
    """Changed tensors whose bytes are the manifest's tensor at another layer/expert index, grouped by that
    offset: the shift classifier `diff` uses (`compare.classify.ReferenceIndex.candidates`), on digests."""
    from collections import Counter

    from weightcheck.compare.classify import ReferenceIndex

    index = ReferenceIndex(list(expected), lambda _: None)
    options: dict[str, dict[tuple[str, str, int], str]] = {}
    for name in changed:
        got = actual.get(name)
        if got is None:
            continue
        hits = {(k, w, o): c for k, w, o, c in index.candidates(name) if k != "index" and expected[c] == got}
        if hits:
            options[name] = hits
    # Identical tensors (norms at init) equal several layers: each takes the offset most tensors share.
    votes = Counter(h for hits in options.values() for h in hits)
    groups: dict[tuple[str, str, int], list[tuple[str, str]]] = {}
    for name, hits in sorted(options.items()):
        best = max(hits, key=lambda h: (votes[h], -abs(h[2])))
        groups.setdefault(best, []).append((name, hits[best]))
    # A single coincidence is not a shift: a shift moves several tensors by one offset.
    return {k: v for k, v in groups.items() if len(v) >= 2}


@rule(
    "WC607",
    "manifest-invalid",
    Severity.ERROR,
    summary="The manifest given with --against-manifest cannot be read, or --hash cannot write one.",
    bad="--against-manifest m.json where m.json is truncated JSON or not a weightcheck manifest",
    good='a manifest written by `lint --content --hash`: {"kind": "weightcheck-manifest", ...}',
    needs=CONTENT_NEEDS,
)
def manifest_invalid(ctx: LintContext) -> None:
    """A manifest that cannot be parsed must fail the run: silently skipping the comparison would report
    a verified checkpoint that was never verified. Also reported when the `--hash` output cannot be
    written."""
    from weightcheck.digest import ManifestError, read_manifest, write_manifest

    path = ctx.options.get("against_manifest")
    if path:
        try:
            read_manifest(path)
        except ManifestError as exc:
            ctx.report(str(exc), file=str(path))
    out = ctx.options.get("hash_out")
    if out:
        digests = {s.name: s.digest for s in content_scan(ctx) if s.digest is not None}
        try:
            write_manifest(out, digests)
        except ManifestError as exc:
            ctx.report(str(exc), file=str(out))


@rule(
    "WC608",
    "content-not-checked",
    Severity.WARNING,
    summary="Some tensors' data could not be read, so their content was not checked.",
    bad="model-00003-of-00004.safetensors is truncated: its 310 tensors were not content-checked",
    good="every tensor's bytes were read",
    needs=CONTENT_NEEDS,
)
def content_not_checked(ctx: LintContext) -> None:
    """`lint --content` must say what it did not look at: tensors in a shard that is missing, truncated
    or malformed (the WC1xx/WC2xx findings say why) have no bytes to check, and F4/F6 tensors are hashed
    but not range-checked."""
    from weightcheck.scan import NO_RANGE_DTYPES

    by_reason: dict[str, list[str]] = {}
    shards_of: dict[str, set[str]] = {}
    packed: set[str] = set()
    for scan in content_scan(ctx):
        if scan.error:
            by_reason.setdefault(scan.error, []).append(scan.name)
            if scan.shard:
                shards_of.setdefault(scan.error, set()).add(scan.shard)
        elif scan.dtype in NO_RANGE_DTYPES:
            reason = f"{scan.dtype} values are packed: not range-checked"
            by_reason.setdefault(reason, []).append(scan.name)
            packed.add(reason)
    for reason, names in sorted(by_reason.items()):
        # The fix must name what to act on: the unreadable shards (the default text says "the listed
        # shards", and a finding that listed none could not be acted on); packed dtypes need no repair.
        files = sorted(shards_of.get(reason, ()))
        if reason in packed:
            fix = (
                "nothing to repair: packed FP4/FP6 values are hashed (--hash, --against-manifest) but not "
                "range-checked; checking them needs dequantization (weightcheck diff)"
            )
        else:
            fix = f"make {', '.join(files[:6])} readable (see the WC1xx/WC2xx findings on it), then run --content again"
        ctx.report(
            f"{len(names)} tensor(s) not content-checked: {reason}" + (f" in {', '.join(files[:6])}" if files else ""),
            tensor=summarize(names),
            count=len(names),
            details={"shards": files} if files else None,
            fix=fix,
        )


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total
