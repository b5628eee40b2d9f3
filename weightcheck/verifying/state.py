"""Engine-state checks of `weightcheck verify` (WC740–WC744): they read the per-rank digests of every
parameter and buffer the tap takes after each sync (`WEIGHTCHECK_STATE=1`, `weightcheck.tap.state`) and do
not depend on the transport.

* WC742: a buffer differs from its state after the startup load (released and not restored);
* WC740: with the startup checkpoint as the reference, a parameter differs from its startup state;
* WC743: a parameter written whole by one incoming tensor does not hold that tensor's bytes;
* WC741: replicated tensors differ across the TP/EP ranks of one stage, or DP engines differ rank by rank;
* WC744: nothing reached load_weights (a bypassing transport); how much of the state changed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from weightcheck.collapse import summarize
from weightcheck.rules.verify import (
    ENGINE_BUFFER_CHANGED,
    ENGINE_PARAM_NOT_AS_RECEIVED,
    ENGINE_REPLICAS_DISAGREE,
    ENGINE_STATE_DIVERGED,
    SYNC_BYPASSED_LOAD_WEIGHTS,
)
from weightcheck.tap.records import StateEntry, SyncRecord

RankKey = tuple[int, int, int]
Add = Callable[..., None]


def rank_key(record: SyncRecord) -> RankKey:
    rank = record.rank
    return (int(rank.get("pp_rank", 0) or 0), int(rank.get("tp_rank", 0) or 0), int(rank.get("ep_rank", 0) or 0))


def _same(a: StateEntry, b: StateEntry) -> bool | None:
    """Equal, different, or None when the two cannot be compared (other algorithm, undigested)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.hexdigest is None or b.hexdigest is None or a.algorithm != b.algorithm:
        return None
    return a.hexdigest == b.hexdigest


def _changed(now: Mapping[str, StateEntry], before: Mapping[str, StateEntry], kind: str) -> list[str]:
    out = []
    for name, entry in now.items():
        if entry.kind != kind:
            continue
        old = before.get(name)
        if old is not None and _same(entry, old) is False:
            out.append(name)
    return sorted(out)


def _describe(entry: StateEntry) -> str:
    if entry.zeros:
        return "all zeros"
    if entry.nonfinite:
        return f"{entry.nonfinite} NaN/Inf"
    return "other bytes"


class StateHistory:
    """Every recorded engine state, per (engine, rank), in sync order (logical syncs: merged records)."""

    def __init__(self, groups: Mapping[tuple[int, str], Sequence[SyncRecord]]) -> None:
        self._by_rank: dict[tuple[str, RankKey], list[tuple[int, SyncRecord]]] = defaultdict(list)
        for (seq, engine), records in groups.items():
            for record in records:
                if record.states:
                    self._by_rank[(engine, rank_key(record))].append((seq, record))
        for items in self._by_rank.values():
            items.sort(key=lambda item: item[0])

    def startup(self, engine: str, key: RankKey, before: int) -> tuple[int, SyncRecord] | None:
        items = [item for item in self._by_rank.get((engine, key), []) if item[0] < before]
        return items[0] if items else None

    def previous(self, engine: str, key: RankKey, before: int) -> tuple[int, SyncRecord] | None:
        items = [item for item in self._by_rank.get((engine, key), []) if item[0] < before]
        return items[-1] if items else None


def check_sync_state(
    seq: int,
    engine: str,
    records: Sequence[SyncRecord],
    history: StateHistory,
    add: Add,
    *,
    reference_kind: str | None,
    skipped: Callable[[str], bool],
) -> bool:
    """The state checks of one sync of one engine. Returns True when nothing reached load_weights on any rank
    that recorded a state (the stream checks then have nothing to judge)."""
    with_state = [r for r in records if r.states]
    if not with_state:
        return False
    for record in with_state:
        key = rank_key(record)
        states = {n: s for n, s in record.states.items() if not skipped(n)}
        startup = history.startup(engine, key, seq)
        if startup is not None:
            first_seq, first = startup
            buffers = _changed(states, first.states, "buffer")
            if buffers:
                how = _describe(states[buffers[0]])
                add(
                    ENGINE_BUFFER_CHANGED,
                    f"{summarize(buffers)} on {record.rank_label()}: buffers differ from their state after sync "
                    f"{first_seq} ({how} now); released during memory release and not restored, or overwritten",
                    tensor=summarize(buffers, limit=1),
                    count=len(buffers),
                    details={"names": buffers, "since_sync": first_seq, "rank": record.rank},
                )
            gone = sorted(n for n, s in first.states.items() if s.kind == "buffer" and n not in record.states)
            if gone:
                add(
                    ENGINE_BUFFER_CHANGED,
                    f"{summarize(gone)} on {record.rank_label()}: buffers present after sync {first_seq} are gone",
                    tensor=summarize(gone, limit=1),
                    count=len(gone),
                    details={"names": gone, "since_sync": first_seq, "rank": record.rank, "gone": True},
                )
            if reference_kind == "checkpoint":
                params = _changed(states, first.states, "param")
                if params:
                    add(
                        ENGINE_STATE_DIVERGED,
                        f"{summarize(params)} on {record.rank_label()}: parameters differ from their state after "
                        f"the startup load (sync {first_seq}) though the reference is the startup checkpoint",
                        tensor=summarize(params, limit=1),
                        count=len(params),
                        details={"params": params, "since_sync": first_seq, "rank": record.rank},
                    )
        _check_as_received(record, states, add)
    _check_tp_replicas(with_state, add, skipped)
    bypassed = all(not r.tensors for r in with_state)
    if bypassed:
        changed: set[str] = set()
        compared = False
        for record in with_state:
            before = history.previous(engine, rank_key(record), seq)
            if before is not None:
                compared = True
                changed.update(_changed(record.states, before[1].states, "param"))
        what = (
            f"{len(changed)} parameters changed since the previous recorded state"
            if compared
            else "no earlier state to compare with"
        )
        add(
            SYNC_BYPASSED_LOAD_WEIGHTS,
            f"nothing reached load_weights on any rank ({what}); a transport that bypasses load_weights "
            "(direct, custom loader, RDMA): only the engine-state checks judged this sync",
            details={"changed": sorted(changed)[:200], "changed_count": len(changed)},
        )
    return bypassed


def _check_as_received(record: SyncRecord, states: Mapping[str, StateEntry], add: Add) -> None:
    """A parameter written whole by exactly one incoming tensor holds that tensor's bytes."""
    wrote_by: dict[str, list[Any]] = defaultdict(list)
    for entry in record.tensors:
        for label in entry.wrote:
            wrote_by[label].append(entry)
    wrong: list[tuple[str, str]] = []
    for name, param in record.params.items():
        state = states.get(name)
        if state is None or state.hexdigest is None or param.shards_expected or param.experts_local is not None:
            continue
        entries = wrote_by.get(name, [])
        if param.writes != 1 or len(entries) != 1:
            continue
        entry = entries[0]
        if entry.hexdigest is None or entry.algorithm != state.algorithm:
            continue
        if entry.engine_wrote:
            continue  # the engine wrote into what it was handed before loading it (Gemma's norm + 1): by design
        if entry.dtype != state.dtype or entry.shape != state.shape:
            continue  # a TP narrow, padding or a cast: not byte-comparable
        if entry.hexdigest != state.hexdigest:
            wrong.append((name, entry.name))
    if wrong:
        names = [n for n, _ in wrong]
        add(
            ENGINE_PARAM_NOT_AS_RECEIVED,
            f"{summarize(names)} on {record.rank_label()}: after the sync the parameter does not hold the bytes of "
            f"the tensor the tap saw written into it (e.g. {wrong[0][1]}); overwritten outside load_weights, or "
            "the write did not land",
            tensor=summarize(names, limit=1),
            count=len(names),
            details={"params": names, "from": dict(wrong), "rank": record.rank},
        )


def _check_tp_replicas(records: Sequence[SyncRecord], add: Add, skipped: Callable[[str], bool]) -> None:
    """Replicated (not sharded) tensors agree across the TP/EP ranks of each pipeline stage."""
    by_stage: dict[int, list[SyncRecord]] = defaultdict(list)
    for record in records:
        by_stage[rank_key(record)[0]].append(record)
    for stage_records in by_stage.values():
        if len(stage_records) < 2:
            continue
        first = stage_records[0]
        differing: dict[str, str] = {}
        for other in stage_records[1:]:
            for name, state in first.states.items():
                if state.sharded or skipped(name) or name in differing:
                    continue
                theirs = other.states.get(name)
                if theirs is not None and not theirs.sharded and _same(state, theirs) is False:
                    differing[name] = other.rank_label()
        if differing:
            names = sorted(differing)
            add(
                ENGINE_REPLICAS_DISAGREE,
                f"{summarize(names)}: replicated tensors differ between {first.rank_label()} and {differing[names[0]]}",
                tensor=summarize(names, limit=1),
                count=len(names),
                details={"names": names, "ranks": [first.rank_label(), differing[names[0]]]},
            )


def check_dp_replicas(syncs: Sequence[tuple[str | None, str, Sequence[SyncRecord]]], add: Callable[..., None]) -> None:
    """Engines (DP replicas) that serve one weight version hold equal state, rank by rank.
    `syncs`: (weight_version, engine, records) of the selected syncs."""
    by_version: dict[str, list[tuple[str, Sequence[SyncRecord]]]] = defaultdict(list)
    for version, engine, records in syncs:
        if version is not None and any(r.states for r in records):
            by_version[version].append((engine, records))
    for version, engines in by_version.items():
        if len(engines) < 2:
            continue
        base_engine, base_records = engines[0]
        base = {rank_key(r): r for r in base_records if r.states}
        for engine, records in engines[1:]:
            differing: list[str] = []
            for record in records:
                mine = base.get(rank_key(record))
                if mine is None:
                    continue
                for name, state in record.states.items():
                    theirs = mine.states.get(name)
                    if theirs is not None and _same(state, theirs) is False:
                        differing.append(name)
            if differing:
                names = sorted(set(differing))
                add(
                    ENGINE_REPLICAS_DISAGREE,
                    f"weight version {version}: engines {base_engine} and {engine} hold different state for "
                    f"{summarize(names)}",
                    tensor=summarize(names, limit=1),
                    count=len(names),
                    details={"names": names, "engines": [base_engine, engine], "weight_version": version},
                )
