"""What the tap saw in the tensors themselves: NaN/Inf (WC729), entries that are not tensors (WC727)."""

from __future__ import annotations

from collections.abc import Mapping

from weightcheck.collapse import summarize
from weightcheck.digest import TensorDigest
from weightcheck.rules.verify import SYNC_TENSOR_MISMATCH, SYNC_TENSOR_NONFINITE
from weightcheck.tap.records import TensorEntry
from weightcheck.verifying.checks.context import SyncContext


def check_content(ctx: SyncContext, effective: Mapping[str, tuple[TensorDigest | None, TensorEntry]]) -> None:
    nonfinite = [name for name, (_, e) in effective.items() if e.nonfinite and not ctx.skipped(name)]
    if nonfinite:
        ctx.add(
            SYNC_TENSOR_NONFINITE,
            f"{summarize(nonfinite)} hold NaN/Inf values",
            tensor=summarize(nonfinite, limit=1),
            count=len(nonfinite),
            details={"names": sorted(nonfinite), "counts": {n: effective[n][1].nonfinite for n in nonfinite}},
        )
    broken = [name for name, (_, e) in effective.items() if e.error and e.dtype is None]
    if broken:
        ctx.add(
            SYNC_TENSOR_MISMATCH,
            f"{summarize(broken)} are not tensors ({effective[broken[0]][1].error})",
            tensor=summarize(broken, limit=1),
            count=len(broken),
            details={"names": sorted(broken), "class": "not-a-tensor"},
        )
