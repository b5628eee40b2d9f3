"""The stream against the reference: missing (WC722), unexpected (WC723), mismatches classified (WC727 other
data / dtype / shape / bytes / values / transposed; WC728 zeros; WC730 within rounding; WC721 not comparable;
WC746 written into by the engine before the tap digested it: not compared)."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Mapping

from weightcheck.collapse import summarize
from weightcheck.digest import TensorDigest
from weightcheck.rules.verify import (
    SYNC_REFERENCE_INVALID,
    SYNC_TENSOR_MISMATCH,
    SYNC_TENSOR_MISSING,
    SYNC_TENSOR_NONFINITE,
    SYNC_TENSOR_UNEXPECTED,
    SYNC_TENSOR_WRITTEN_BEFORE_DIGEST,
    SYNC_TENSOR_ZEROS,
    SYNC_WITHIN_TOLERANCE,
)
from weightcheck.tap.records import ENGINE_WROTE_INTO_SENT, SyncRecord, TensorEntry
from weightcheck.verifying.checks.context import SyncContext
from weightcheck.verifying.checks.shifts import find_shifts, report_shifts

_TRANSPOSED_TEXT = "sent transposed: it equals the reference transposed (square, so its shape could not show it)"


def check_against_reference(
    ctx: SyncContext,
    effective: Mapping[str, tuple[TensorDigest | None, TensorEntry]],
    occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]],
) -> None:
    assert ctx.ref is not None
    ref = ctx.ref
    sent = {name for name in effective if not ctx.skipped(name)}
    expected = {name for name in ref.digests if not ctx.skipped(name)}
    shifts = find_shifts(ctx, occurrences)
    shifted_sent = {p.sent for p in shifts}
    shifted_true = {p.true for p in shifts}
    report_shifts(ctx, shifts)

    missing = sorted(expected - sent)
    explained = [n for n in missing if n in shifted_true]
    unexplained = [n for n in missing if n not in shifted_true]
    raised = [(record, call) for record in ctx.view.records for call in record.calls if call.error]
    if unexplained and raised:
        # The tap sees only what the engine consumed: after a call raised, the rest of its request was sent
        # and never consumed, which is not "never sent".
        record, call = raised[0]
        where = f"load_weights call {call.call} raised on {record.rank_label()} (WC739)"
        if ref.kind == "manifest":
            text = f"sent by the trainer (its manifest lists them) but never consumed by the engine: {where}"
        else:
            text = f"never received by the engine: {where}; sent after the tensor it raised on, or never sent"
        ctx.add(
            SYNC_TENSOR_MISSING,
            f"{summarize(unexplained)} {text}",
            tensor=summarize(unexplained, limit=1),
            count=len(unexplained),
            details={"names": unexplained, "after_engine_error": True},
        )
    elif unexplained:
        ctx.add(
            SYNC_TENSOR_MISSING,
            f"{summarize(unexplained)} never sent in this sync",
            tensor=summarize(unexplained, limit=1),
            count=len(unexplained),
            details={"names": unexplained},
        )
    if explained:
        ctx.add(
            SYNC_TENSOR_MISSING,
            f"{summarize(explained)} never sent under their own names: their data arrived under shifted names "
            "(see WC725/WC726)",
            tensor=summarize(explained, limit=1),
            count=len(explained),
            details={"names": explained, "explained_by_shift": True},
        )
    extra = sorted(n for n in sent - set(ref.digests) if n not in shifted_sent)
    if extra:
        ctx.add(
            SYNC_TENSOR_UNEXPECTED,
            f"{summarize(extra)} sent but not in the reference",
            tensor=summarize(extra, limit=1),
            count=len(extra),
            details={"names": extra},
        )
    mismatched: dict[str, list[str]] = defaultdict(list)
    messages: dict[str, str] = {}
    incomparable: dict[tuple[str, str], list[str]] = defaultdict(list)
    written_into: list[str] = []
    for name in sorted(sent & set(ref.digests)):
        digest, entry = effective[name]
        if digest is None and entry.error == ENGINE_WROTE_INTO_SENT:
            written_into.append(name)  # what arrived is unknown: not compared (WC746), never "bytes differ"
            continue
        want = ctx.ref_for(digest).digests.get(name, ref.digests[name])
        if digest == want or name in shifted_sent or (entry.error and entry.dtype is None):
            continue  # equal, explained by a shift, or not a tensor at all (reported by the content checks)
        if (
            digest is not None
            and not digest.comparable(want)
            and (digest.dtype, digest.shape)
            == (
                want.dtype,
                want.shape,
            )
        ):
            incomparable[(digest.algorithm, want.algorithm)].append(name)
            continue  # nothing is known about these bytes: not a mismatch
        klass, message = _classify(ctx, name, digest, want, entry)
        mismatched[klass].append(name)
        messages.setdefault(klass, message)
    if written_into:
        ctx.add(
            SYNC_TENSOR_WRITTEN_BEFORE_DIGEST,
            f"{summarize(written_into)}: written into by the engine before the tap digested "
            f"{'it' if len(written_into) == 1 else 'them'}; not compared in this sync (digested on arrival "
            "from the next sync on)",
            tensor=summarize(written_into, limit=1),
            count=len(written_into),
            details={"names": written_into},
        )
    for (mine, theirs), names in incomparable.items():
        ctx.add(
            SYNC_REFERENCE_INVALID,
            f"{summarize(names)} not compared: the records hash with {mine}, the reference manifest with "
            f"{theirs}, and a manifest holds no data to re-hash; record and write manifests with one algorithm "
            f"(WEIGHTCHECK_DIGEST={theirs} in the engine, or ManifestWriter(algorithm={mine!r}) in the trainer)",
            tensor=summarize(names, limit=1),
            count=len(names),
            details={"names": names, "records_digest": mine, "reference_digest": theirs},
        )
    for klass, names in mismatched.items():
        code = {
            "zeros": SYNC_TENSOR_ZEROS,
            "within-rounding": SYNC_WITHIN_TOLERANCE,
            "nonfinite": SYNC_TENSOR_NONFINITE,
        }.get(klass, SYNC_TENSOR_MISMATCH)
        if klass == "nonfinite":
            continue  # WC729 already reported from the tap's counts
        message = messages[klass] if len(names) == 1 else f"{summarize(names)}: {messages[klass]}"
        ctx.add(
            code,
            message,
            tensor=summarize(names, limit=1),
            count=len(names),
            details={"names": names, "class": klass},
        )


def _classify(
    ctx: SyncContext, name: str, digest: TensorDigest | None, want: TensorDigest, entry: TensorEntry
) -> tuple[str, str]:
    assert ctx.ref is not None
    if digest is None:
        return "undigested", f"{name} could not be digested by the tap ({entry.error})"
    if entry.nonfinite:
        return "nonfinite", f"{name} holds {entry.nonfinite} NaN/Inf values"
    if entry.zeros:
        return "zeros", "all zeros, the reference is not"
    others = [n for n in ctx.ref_for(digest).names_with(digest) if n != name]
    if others:
        return f"data-of:{others[0]}", f"{name} carries the data of {others[0]}"
    if digest.shape != want.shape:
        return "shape", f"shape {list(digest.shape)}, reference {list(want.shape)}"
    values = _compare_values(ctx, name, entry)
    if values is not None:
        return values
    if digest.dtype != want.dtype:
        return "dtype", f"sent as {digest.dtype}, reference {want.dtype} (bytes cannot match)"
    if _transposed_reference(ctx, name, digest):
        return "transposed", _TRANSPOSED_TEXT
    return "bytes", f"bytes differ from the reference ({digest.algorithm})"


def _transposed_reference(ctx: SyncContext, name: str, digest: TensorDigest) -> bool:
    """A square matrix sent transposed keeps its shape and dtype, so only its bytes differ: with the
    checkpoint's data at hand, its transposed digest says whether that is what happened."""
    store = ctx.ref.store if ctx.ref is not None else None
    if store is None or len(digest.shape) != 2 or digest.shape[0] != digest.shape[1] or digest.shape[0] < 2:
        return False
    try:
        from weightcheck.digest import digest_tensor

        transposed = digest_tensor(store.get(name).t().contiguous(), digest.algorithm)
    except Exception:  # unreadable or undigestable: "bytes differ" stays the answer
        return False
    finally:
        with contextlib.suppress(Exception):
            store.release(name)
    return transposed == digest


def _compare_values(ctx: SyncContext, name: str, entry: TensorEntry) -> tuple[str, str] | None:
    """With kept tensors and a checkpoint reference: numeric comparison through weightcheck.compare."""
    if ctx.ref is None or ctx.ref.store is None or entry.tensor_key is None or entry.tensors_path is None:
        return None
    try:
        from weightcheck.compare.classify import classify
        from weightcheck.compare.engine import TRANSPOSED, compare_pair
        from weightcheck.compare.operands import PlainOperand
        from weightcheck.compare.policy import PolicyRule
        from weightcheck.tensors import TensorStore

        with TensorStore.open(entry.tensors_path) as sent_store:
            a = PlainOperand(ctx.ref.store, name)
            b = PlainOperand(sent_store, entry.tensor_key, name=name)
            # One ULP of each side's format: a faithful rounding of the reference passes, nothing else.
            rule = PolicyRule(pattern="", tier="ulp")
            verdict = compare_pair(a, b, rule)
            klass = None if verdict.passed else classify(a, b, verdict, rule).klass
            a.release()
            b.release()
    except Exception:  # unreadable kept tensors: fall back to the digest-only classification
        return None
    if verdict.passed:
        return "within-rounding", f"differs only within rounding ({verdict.message})"
    if klass == TRANSPOSED:  # diff's classifier, on the kept tensor
        return "transposed", _TRANSPOSED_TEXT
    return "values", f"values differ: {verdict.message}"
