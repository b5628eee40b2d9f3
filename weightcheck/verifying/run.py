"""`verify()`: read the records, load the reference, group the records into syncs, run the checks on each sync
of each engine (each runner on its own records), and return a `Result`. Rendering is the caller's."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from weightcheck.digest import SHA256, ManifestError
from weightcheck.findings import Result
from weightcheck.rules.verify import SYNC_NOT_FOUND, SYNC_RECORD_INVALID, SYNC_REFERENCE_INVALID
from weightcheck.tap.records import (
    RecordError,
    SyncRecord,
    bound_record_files,
    read_record,
    record_algorithm,
    scan_records,
)
from weightcheck.verifying.checks import SyncContext, SyncView, run_checks
from weightcheck.verifying.fold import fold_never_written
from weightcheck.verifying.merge import baselines as rank_baselines
from weightcheck.verifying.merge import dedupe_ranks, logical_syncs, slot
from weightcheck.verifying.options import TrainerLayout
from weightcheck.verifying.reference import Reference, ReferenceError, load_reference
from weightcheck.verifying.sink import FindingSink
from weightcheck.verifying.state import StateHistory, check_dp_replicas, rank_key


def verify(
    records: str | os.PathLike[str],
    against: str | os.PathLike[str] | Reference | None = None,
    *,
    select: Iterable[str] = ("ALL",),
    ignore: Iterable[str] = (),
    weight_version: str | None = None,
    sync: int | str | None = None,
    trainer: TrainerLayout | None = None,
    skip: Iterable[str] = (),
    download: bool = False,
) -> Result:
    """Verify every recorded sync (or the one selected by `weight_version` / `sync`, an int or "latest")."""
    started = time.perf_counter()
    root = Path(records)
    result = Result(target=str(root), command="verify")
    findings = FindingSink(list(select) or ["ALL"], list(ignore))
    files, refused = scan_records(root)
    for refusal in refused:
        findings.add(
            SYNC_RECORD_INVALID, f"sync folder {refusal.name}: {refusal.reason}", file=str(root / refusal.name)
        )
    if not files and not refused:
        result.nothing_checked = True
        why = "no such file or directory" if not root.exists() else "no sync-*/ record files"
        result.notes.append(f"{root}: {why} (is WEIGHTCHECK_DIR set in the engine processes?)")
        return result
    if against is not None and not isinstance(against, Reference) and not Path(against).exists():
        # A typo'd reference checks nothing: exit 3, whatever --exit-zero says (never a green gate).
        result.nothing_checked = True
        result.notes.append(f"reference {against}: no such file or directory")
        return result
    # Memory budget: thousands of sync folders or rank files are not all loaded (newest first, the rest reported).
    files, left_out = bound_record_files(files)
    if left_out:
        findings.add(SYNC_RECORD_INVALID, left_out, file=str(root))
    loaded: list[SyncRecord] = []
    for paths in files.values():
        for path in paths:
            try:
                loaded.append(read_record(path))
            except RecordError as exc:
                findings.add(SYNC_RECORD_INVALID, f"{path.name}: {exc}", file=str(path))
    reference: Reference | None = None
    owns_reference = not isinstance(against, Reference)
    # A checkpoint is hashed with the algorithm(s) the records used, in one pass.
    algorithms = sorted({record_algorithm(r.header) for r in loaded}) or [SHA256]
    if isinstance(against, Reference):
        reference = against
    elif against is not None:
        try:
            reference = load_reference(against, algorithms, download=download)
        except (ReferenceError, ManifestError) as exc:
            findings.add(
                SYNC_REFERENCE_INVALID, f"reference unusable: {exc}; only engine-side checks ran", file=str(against)
            )
    if reference is not None:
        for code, message, file in reference.problems:
            findings.add(code, message, file=file or reference.label)
    elif against is None:
        result.notes.append("no --against reference: only engine-side checks (drops, coverage) ran")

    groups = logical_syncs(loaded)
    selected = sorted(groups)
    if weight_version is not None:
        selected = [k for k in selected if any(r.weight_version == weight_version for r in groups[k])]
    if sync is not None:
        seqs = sorted({seq for seq, _ in selected})
        want = seqs[-1] if sync == "latest" and seqs else sync
        selected = [k for k in selected if k[0] == want]
    if not selected and loaded:
        what = f"weight version {weight_version!r}" if weight_version is not None else f"sync {sync!r}"
        versions = sorted({r.weight_version or "?" for r in loaded})
        findings.add(
            SYNC_NOT_FOUND,
            f"no records for {what} (recorded versions: {', '.join(versions[:10])})",
            file=str(root),
        )
        # The sync or version asked for does not exist: nothing was checked (exit 3, even with --exit-zero).
        result.nothing_checked = True
        result.notes.append(f"no records for {what}: nothing was verified")
    baselines = rank_baselines(loaded)
    history = StateHistory(groups)
    layout = trainer or TrainerLayout()
    tensors = params = 0
    replicas: list[tuple[str | None, str, list[SyncRecord]]] = []
    several_engines = len({e for _, e in selected}) > 1  # once, not per sync: 10^4 syncs made it quadratic
    for seq, engine in selected:
        label = f"sync {seq}"
        view_records = groups[(seq, engine)]
        version = Counter(r.weight_version for r in view_records if r.weight_version).most_common(1)
        if version:
            label += f" ({version[0][0]})"
        if several_engines:
            label += f" [{engine}]"
        file = f"sync-{seq:05d}"
        view_records = dedupe_ranks(view_records, findings, label, file)
        by_runner: dict[str, list[SyncRecord]] = defaultdict(list)
        for record in view_records:
            by_runner[record.runner].append(record)
        # Each runner is judged on its own records. A draft (MTP/NextN) runner receives the target's whole stream
        # and keeps only its own layer by design: its unwritten names are not drops, its parameters' coverage is
        # checked; the stream against the reference is judged once, on the target, where a name the draft wrote
        # (the MTP layer, beyond the target's layers) is not a drop either.
        first_of_sync = len(findings.items)
        for runner in sorted(by_runner, key=lambda r: (r != "target", r)):
            records_of = by_runner[runner]
            target = runner == "target" or "target" not in by_runner
            elsewhere = {
                entry.name
                for other, recs in by_runner.items()
                if other != runner
                for record in recs
                for entry in record.tensors
                if entry.wrote or entry.offrank
            }
            view = SyncView(
                seq=seq, engine=engine, records=records_of, label=label if target else f"{label} [{runner}]"
            )
            baseline: dict[tuple[int, int, int], set[str]] = {}
            for record in records_of:
                first = baselines.get((engine, slot(record)))
                if first is not None and first[0] < seq:
                    baseline[rank_key(record)] = first[1]
            run_checks(
                SyncContext(
                    view,
                    reference if target else None,
                    findings,
                    layout,
                    list(skip),
                    baseline,
                    history if target else None,
                    written_elsewhere=elsewhere,
                    stream_owner=target,
                )
            )
            if target:
                replicas.append((view.weight_version, engine, records_of))
        # Over every runner of this sync: a draft model's unwritten parameter is the target stream's missing tensor.
        fold_never_written(findings.items, first_of_sync)
        tensors += sum(len(r.tensors) for r in view_records)
        params += sum(len(r.params) for r in view_records)
    check_dp_replicas(replicas, lambda code, message, **kw: findings.add(code, message, file=str(root), **kw))
    if owns_reference and reference is not None and reference.store is not None:
        reference.store.close()
    result.findings = findings.items
    # Every finding carries its rule's fix text from the sink: the Python API's findings say what to do, as the
    # CLI's do.
    result.checked = {
        "syncs": len({seq for seq, _ in selected}),
        "records": sum(len(groups[k]) for k in selected),
        "tensors": tensors,
        "params": params,
        "reference_tensors": len(reference.digests) if reference is not None else 0,
    }
    if not loaded:
        result.nothing_checked = not result.findings
    # WEIGHTCHECK_PROFILE=1 in the engine: where the tap's time went, per sync (information, not a finding).
    from weightcheck.tap.records import profile_notes

    result.notes.extend(profile_notes(record for key in selected for record in groups[key]))
    result.notes.append(f"verified in {time.perf_counter() - started:.2f}s")
    return result
