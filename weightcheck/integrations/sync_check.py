"""`check_weight_update_equal`: the call a training loop makes right after a push. It sits with the
trainer-side helpers because it renders the text report (the reporters sit above `weightcheck.verifying`)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from typing import Any

from weightcheck.findings import Result, Severity
from weightcheck.reporters import render
from weightcheck.verifying.options import TrainerLayout
from weightcheck.verifying.reference import Reference
from weightcheck.verifying.sync import WeightSyncError, check_pushed_sync, sync_failed


def check_weight_update_equal(
    records: str | os.PathLike[str],
    against: str | os.PathLike[str] | Reference | None,
    *,
    weight_version: str | None = None,
    expected_records: int | None = None,
    timeout_s: float = 30.0,
    fail_on: Severity = Severity.ERROR,
    trainer: TrainerLayout | None = None,
    skip: Iterable[str] = (),
    ignore: Iterable[str] = (),
    engine_checkers: Sequence[Any] = (),
) -> Result:
    """Verify the sync just pushed; raise `WeightSyncError` (with the text report) when it is wrong.

    Call right after the framework's `update_weights()`. `weight_version` selects the sync (else the
    latest); `expected_records` (engine ranks × engines) makes it wait up to `timeout_s` for every rank's
    record to land. `engine_checkers` (from `weightcheck.integrations.weights_checker`) are asked to run
    SGLang's own `/weights_checker compare`, and their failures are added to the report.
    """
    result = check_pushed_sync(
        records,
        against,
        weight_version=weight_version,
        expected_records=expected_records,
        timeout_s=timeout_s,
        trainer=trainer,
        skip=skip,
        ignore=ignore,
        engine_checkers=engine_checkers,
    )
    if sync_failed(result, fail_on):
        buffer = io.StringIO()
        render(result, "text", buffer, color=False, verbose=True)
        raise WeightSyncError(result, f"weight sync check failed for {records}:\n{buffer.getvalue()}")
    return result
