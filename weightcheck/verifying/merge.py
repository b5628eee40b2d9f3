"""Records grouped into syncs: one rank's consecutive implicit syncs of one weight version merged into one,
one record per rank slot (the newest), and each rank's baseline (what its earliest sync wrote)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from weightcheck.findings import Severity
from weightcheck.rules.verify import SYNC_RANKS_INCOMPLETE
from weightcheck.tap.records import CallEntry, SyncRecord, TensorEntry
from weightcheck.verifying.sink import FindingSink
from weightcheck.verifying.state import rank_key


def slot(record: SyncRecord) -> tuple[str, int, int, int]:
    """Runner and rank: a draft (MTP/NextN) runner's record in the same process is a slot of its own."""
    return (record.runner, *rank_key(record))


def baselines(records: Sequence[SyncRecord]) -> dict[tuple[str, tuple[str, int, int, int]], tuple[int, set[str]]]:
    """Per (engine, rank): the params written in its earliest recorded sync."""
    out: dict[tuple[str, tuple[int, int, int]], tuple[int, set[str]]] = {}
    for record in records:
        key = (record.engine, slot(record))
        written = {name for name, p in record.params.items() if p.writes > 0 or not p.tracked}
        if key not in out or record.seq < out[key][0]:
            out[key] = (record.seq, written)
    return out


def _merge_records(records: Sequence[SyncRecord]) -> SyncRecord:
    """One rank's consecutive implicit syncs of one weight version (SGLang without the session API makes every
    bucket its own request; a custom engine calls `load_weights` once per bucket) as one sync: calls and
    tensors renumbered in order, coverage summed."""
    ordered = sorted(records, key=lambda r: r.seq)
    if len(ordered) == 1:
        return ordered[0]
    import copy

    first = ordered[0]
    header = copy.deepcopy(first.header)
    header["sync"]["merged_seqs"] = [r.seq for r in ordered]
    header["sync"]["incomplete"] = any(r.header["sync"].get("incomplete") for r in ordered)
    calls: list[CallEntry] = []
    tensors: list[TensorEntry] = []
    params: dict[str, Any] = {}
    for record in ordered:
        call_offset, seq_offset = len(calls), len(tensors)
        for call in record.calls:
            calls.append(copy.copy(call))
            calls[-1].call += call_offset
        for entry in sorted(record.tensors, key=lambda e: e.seq):
            moved = copy.copy(entry)
            moved.call += call_offset
            moved.seq += seq_offset
            tensors.append(moved)
        for name, param in record.params.items():
            merged = params.get(name)
            if merged is None:
                params[name] = copy.deepcopy(param)
                continue
            merged.writes += param.writes
            merged.tracked = merged.tracked or param.tracked
            merged.shards_written = sorted(set(merged.shards_written) | set(param.shards_written))
            if param.experts_written is not None:
                merged.experts_written = sorted(set(merged.experts_written or []) | set(param.experts_written))
            merged.cast_from = sorted(set(merged.cast_from) | set(param.cast_from))
            merged.optional = merged.optional and param.optional
    if ordered[-1].states:  # the state after the last bucket
        header["state_digest"] = ordered[-1].header.get("state_digest")
    return SyncRecord(
        path=first.path, header=header, calls=calls, tensors=tensors, params=params, states=ordered[-1].states
    )


def _mergeable(record: SyncRecord) -> bool:
    """Syncs opened implicitly (one update request, or one bare `load_weights` call) rather than by a session
    or `tap.sync`: several of them carrying one weight version are one push."""
    source = str(record.header["sync"].get("source") or "")
    return (source.startswith("request") or source == "call") and record.weight_version is not None


def logical_syncs(records: Sequence[SyncRecord]) -> dict[tuple[int, str], list[SyncRecord]]:
    """Group records into syncs per engine: by seq, except that a run of consecutive implicit syncs (update
    requests without a session, bare `load_weights` calls) of one rank carrying one weight version is one
    sync (merged per rank): a push made of many buckets is checked as a whole. A sync of another kind or
    version in between ends the run."""
    per_rank: dict[tuple[str, tuple[str, int, int, int]], list[SyncRecord]] = defaultdict(list)
    for record in records:
        per_rank[(record.engine, slot(record))].append(record)
    groups: dict[tuple[int, str], list[SyncRecord]] = defaultdict(list)
    for (engine, _), rank_records in per_rank.items():
        runs: list[list[SyncRecord]] = []
        for record in sorted(rank_records, key=lambda r: r.seq):
            if not _mergeable(record):
                groups[(record.seq, engine)].append(record)
                runs.append([])  # ends the current run
                continue
            if not runs or not runs[-1] or runs[-1][-1].weight_version != record.weight_version:
                runs.append([])
            runs[-1].append(record)
        for run in runs:
            if run:
                merged = _merge_records(run)
                groups[(merged.seq, engine)].append(merged)
    return groups


def dedupe_ranks(records: list[SyncRecord], findings: FindingSink, label: str, file: str) -> list[SyncRecord]:
    by_rank: dict[tuple[str, int, int, int], SyncRecord] = {}
    dropped: list[SyncRecord] = []
    for record in sorted(records, key=lambda r: r.header["sync"].get("started") or 0):
        key = slot(record)
        if key in by_rank:
            dropped.append(by_rank[key])
        by_rank[key] = record
    if dropped:
        findings.add(
            SYNC_RANKS_INCOMPLETE,
            f"{label}: several records for the same rank ({', '.join(r.path.name for r in dropped)} are older); "
            "the newest is checked (an engine restarted into the same directory?)",
            file=file,
            severity=Severity.WARNING,
        )
    return sorted(by_rank.values(), key=slot)
