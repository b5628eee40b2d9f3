"""Missing rank records (WC734) and load_weights calls that raised or never ended (WC739)."""

from __future__ import annotations

from weightcheck.rules.verify import SYNC_LOAD_FAILED, SYNC_RANKS_INCOMPLETE
from weightcheck.verifying.checks.context import SyncContext

# More missing ranks than this are not listed one by one (rank sizes come from untrusted records).
_MAX_MISSING_RANKS = 4096


def check_ranks(ctx: SyncContext) -> None:
    records = ctx.view.records
    sizes = records[0].rank
    tp_size = int(sizes.get("tp_size", 1) or 1)
    pp_size = int(sizes.get("pp_size", 1) or 1)
    present = {(int(r.rank.get("pp_rank", 0) or 0), int(r.rank.get("tp_rank", 0) or 0)) for r in records}
    if tp_size * pp_size > len(records) + _MAX_MISSING_RANKS:
        # Sizes no set of records could back (each record is one rank): say so, allocate nothing.
        ctx.add(
            SYNC_RANKS_INCOMPLETE,
            f"engine {ctx.view.engine} claims tp_size {tp_size} x pp_size {pp_size} ranks but only "
            f"{len(records)} records exist: rank coverage not checked",
            details={"missing_ranks": []},
        )
        return
    expected = {(p, t) for p in range(pp_size) for t in range(tp_size)}
    missing = sorted(expected - present)
    if missing:
        labels = ", ".join(f"pp_rank {p} tp_rank {t}" for p, t in missing[:8])
        more = f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""
        ctx.add(
            SYNC_RANKS_INCOMPLETE,
            f"no records from {labels}{more} of engine {ctx.view.engine} (tp_size {tp_size}, pp_size "
            f"{pp_size}): names owned by those ranks are not checked for drops",
            details={"missing_ranks": [list(m) for m in missing]},
        )


def check_calls(ctx: SyncContext) -> None:
    for record in ctx.view.records:
        if record.header["sync"].get("incomplete"):
            ctx.add(
                SYNC_LOAD_FAILED,
                f"the sync never ended on {record.rank_label()} (record flushed at shutdown): a partial update",
                details={"record": record.path.name},
            )
        for call in record.calls:
            if call.error:
                ctx.add(
                    SYNC_LOAD_FAILED,
                    f"load_weights call {call.call} raised on {record.rank_label()}: {call.error}; the engine "
                    "holds a partial update",
                    details={"call": call.call, "record": record.path.name},
                )
