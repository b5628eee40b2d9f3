"""The stream of one sync: every occurrence of each name on every rank, the effective (last) entry,
ranks that received different bytes (WC735) and names sent twice (WC724)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

from weightcheck.collapse import summarize
from weightcheck.digest import TensorDigest
from weightcheck.findings import Severity
from weightcheck.rules.verify import SYNC_RANKS_DISAGREE, SYNC_TENSOR_DUPLICATED
from weightcheck.tap.records import SyncRecord, TensorEntry
from weightcheck.verifying.checks.context import SyncContext, digest_of


def streams(
    ctx: SyncContext,
) -> tuple[dict[str, tuple[TensorDigest | None, TensorEntry]], dict[str, list[tuple[SyncRecord, TensorEntry]]]]:
    """Per name: the effective (last) entry agreed by ranks, and every occurrence on every rank."""
    occurrences: dict[str, list[tuple[SyncRecord, TensorEntry]]] = defaultdict(list)
    for record in ctx.view.records:
        for entry in sorted(record.tensors, key=lambda e: e.seq):
            occurrences[entry.name].append((record, entry))
    effective: dict[str, tuple[TensorDigest | None, TensorEntry]] = {}
    for name, items in occurrences.items():
        last_per_rank: dict[int, TensorEntry] = {}
        for record, entry in items:
            last_per_rank[id(record)] = entry
        entry = next(iter(last_per_rank.values()))
        effective[name] = (digest_of(entry), entry)
    return effective, occurrences


def check_disagreement(ctx: SyncContext, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> None:
    differing: list[str] = []
    for name, items in occurrences.items():
        last: dict[int, tuple[SyncRecord, TensorDigest | None]] = {}
        for record, entry in items:
            last[id(record)] = (record, digest_of(entry))
        # Ranks that hashed with different algorithms cannot be told apart by their digests: compare each
        # algorithm's group on its own (and dtype/shape across all of them).
        digests = {d for _, d in last.values() if d is not None}
        by_algorithm = Counter(d.algorithm for d in digests)
        forms = {(d.dtype, d.shape) for d in digests}
        if any(n > 1 for n in by_algorithm.values()) or len(forms) > 1:
            differing.append(name)
    if differing:
        ctx.add(
            SYNC_RANKS_DISAGREE,
            f"ranks received different bytes for {summarize(differing)}",
            tensor=summarize(differing, limit=1),
            count=len(differing),
            details={"names": sorted(differing)},
        )


def check_duplicates(ctx: SyncContext, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> None:
    conflicting: list[str] = []
    identical: list[str] = []
    for name, items in occurrences.items():
        per_rank: dict[int, list[TensorEntry]] = defaultdict(list)
        for record, entry in items:
            per_rank[id(record)].append(entry)
        worst = max(per_rank.values(), key=len)
        if len(worst) < 2:
            continue
        digests = {digest_of(e) for e in worst}
        (conflicting if len(digests) > 1 else identical).append(name)
    if conflicting:
        ctx.add(
            SYNC_TENSOR_DUPLICATED,
            f"{summarize(conflicting)} sent more than once with different contents (the engine keeps the last "
            "copy); two trainer ranks sent the same names",
            tensor=summarize(conflicting, limit=1),
            count=len(conflicting),
            details={"names": sorted(conflicting), "identical": False},
        )
    if identical:
        ctx.add(
            SYNC_TENSOR_DUPLICATED,
            f"{summarize(identical)} sent more than once with identical contents",
            tensor=summarize(identical, limit=1),
            count=len(identical),
            severity=Severity.WARNING,
            details={"names": sorted(identical), "identical": True},
        )
