"""Checking the sync a training loop just pushed: wait for its rank records, verify it, add the engines' own
checkers' verdicts. `WeightSyncError` is what a wrong sync raises; its report text is rendered by the
caller that raises it (`weightcheck.integrations.sync_check.check_weight_update_equal`), since rendering
belongs to the reporters, above this package."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from weightcheck.findings import EXIT_FINDINGS, Result, Severity
from weightcheck.rules.verify import SYNC_RANKS_INCOMPLETE
from weightcheck.verifying.options import TrainerLayout
from weightcheck.verifying.reference import Reference
from weightcheck.verifying.run import verify
from weightcheck.verifying.sink import FindingSink
from weightcheck.verifying.waiting import count_records


class WeightSyncError(RuntimeError):
    """Raised by `check_weight_update_equal` when a sync is wrong; `.result` holds the findings, `.report`
    the rendered text."""

    def __init__(self, result: Result, report: str) -> None:
        super().__init__(report)
        self.result = result
        self.report = report


def check_pushed_sync(
    records: str | os.PathLike[str],
    against: str | os.PathLike[str] | Reference | None,
    *,
    weight_version: str | None = None,
    expected_records: int | None = None,
    timeout_s: float = 30.0,
    trainer: TrainerLayout | None = None,
    skip: Iterable[str] = (),
    ignore: Iterable[str] = (),
    engine_checkers: Sequence[Any] = (),
) -> Result:
    """The `Result` of `check_weight_update_equal` (same arguments), without raising: the sync selected by
    `weight_version` (else the latest) after waiting up to `timeout_s` for `expected_records` rank records,
    with WC734 when fewer came and each engine checker's `compare_findings()` added."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        count = count_records(Path(records), weight_version)
        if expected_records is None or count >= expected_records or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    result = verify(
        records,
        against,
        weight_version=weight_version,
        sync=None if weight_version is not None else "latest",
        trainer=trainer,
        skip=skip,
        ignore=ignore,
    )
    if expected_records is not None and count < expected_records:
        result.notes.append(f"only {count} of {expected_records} expected rank records arrived within {timeout_s}s")
        findings = FindingSink([SYNC_RANKS_INCOMPLETE.code], [])
        findings.add(
            SYNC_RANKS_INCOMPLETE,
            f"only {count} of {expected_records} rank records for this sync arrived within {timeout_s:g}s",
            file=str(records),
            severity=Severity.ERROR,
        )
        result.findings.extend(findings.items)
    for checker in engine_checkers:
        result.findings.extend(checker.compare_findings())
    return result


def sync_failed(result: Result, fail_on: Severity = Severity.ERROR) -> bool:
    """A checked push fails when nothing was checked or a finding reaches `fail_on`."""
    return result.nothing_checked or result.exit_code(fail_on) == EXIT_FINDINGS
