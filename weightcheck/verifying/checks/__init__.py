"""The checks of one sync of one engine, one module per family; `run_checks` runs them in order on a
`SyncContext` (records, reference, options, finding sink).

A draft (MTP/NextN) runner is not the stream's owner: only its ranks, calls and parameter coverage are
checked; the stream (drops, content, reference) is judged on the target's records.
"""

from __future__ import annotations

from weightcheck.verifying.checks.against import check_against_reference
from weightcheck.verifying.checks.content import check_content
from weightcheck.verifying.checks.context import SyncContext, SyncView
from weightcheck.verifying.checks.engine import check_dropped, check_params, check_quantization_casts, check_split_pairs
from weightcheck.verifying.checks.ranks import check_calls, check_ranks
from weightcheck.verifying.checks.stream import check_disagreement, check_duplicates, streams
from weightcheck.verifying.state import check_sync_state

__all__ = ["SyncContext", "SyncView", "run_checks"]


def run_checks(ctx: SyncContext) -> None:
    check_ranks(ctx)
    check_calls(ctx)
    if not ctx.stream_owner:
        check_params(ctx)
        return
    bypassed = False
    if ctx.history is not None:
        bypassed = check_sync_state(
            ctx.view.seq,
            ctx.view.engine,
            ctx.view.records,
            ctx.history,
            ctx.add,
            reference_kind=ctx.ref.kind if ctx.ref is not None else None,
            skipped=ctx.skipped,
        )
    effective, occurrences = streams(ctx)
    check_disagreement(ctx, occurrences)
    check_duplicates(ctx, occurrences)
    split = check_split_pairs(ctx)
    check_dropped(ctx, occurrences, split)
    check_params(ctx)
    check_quantization_casts(ctx)
    check_content(ctx, effective)
    if ctx.ref is not None and not bypassed:
        check_against_reference(ctx, effective, occurrences)
