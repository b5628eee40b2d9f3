"""Engine-side checks, no reference needed: fused pairs split across calls (WC736), names written into no
parameter (WC731), parameters never or partly written (WC732, WC733), dtype casts across quantization (WC745)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from weightcheck.collapse import format_ranges, summarize
from weightcheck.findings import Severity
from weightcheck.rules.verify import (
    ENGINE_DROPPED_TENSOR,
    ENGINE_PARAM_CAST_ACROSS_QUANTIZATION,
    ENGINE_PARAM_NEVER_WRITTEN,
    ENGINE_PARAM_PARTIALLY_WRITTEN,
    SYNC_FUSED_PAIR_SPLIT,
)
from weightcheck.structure import QUANT_COMPANIONS
from weightcheck.tap.records import CallEntry, SyncRecord, TensorEntry
from weightcheck.verifying import _names
from weightcheck.verifying.checks.context import SyncContext, param_key, rank_list, untracked_keys
from weightcheck.verifying.state import rank_key

_FUSED_PAIRS = (("q_a_proj", "kv_a_proj_with_mqa"),)
_COMPANION_SUFFIXES = tuple(f".{c}" for c in QUANT_COMPANIONS)


def check_split_pairs(ctx: SyncContext) -> set[str]:
    split_names: set[str] = set()
    for record in ctx.view.records:
        calls_of: dict[str, set[int]] = defaultdict(set)
        wrote: dict[str, bool] = defaultdict(bool)
        for entry in record.tensors:
            calls_of[entry.name].add(entry.call)
            wrote[entry.name] |= bool(entry.wrote)
        for name in list(calls_of):
            for first, second in _FUSED_PAIRS:
                if f".{first}." not in name:
                    continue
                partner = name.replace(f".{first}.", f".{second}.")
                if partner not in calls_of or calls_of[name] & calls_of[partner]:
                    continue
                if wrote[name] or wrote[partner] or name in split_names:
                    continue
                split_names.update((name, partner))
                ctx.add(
                    SYNC_FUSED_PAIR_SPLIT,
                    f"{name} (call {format_ranges(calls_of[name])}) and {partner} (call "
                    f"{format_ranges(calls_of[partner])}) arrived in different load_weights calls; the engine "
                    "fuses them only within one call, so neither was written",
                    tensor=name,
                    details={"pair": [name, partner], "record": record.path.name},
                )
    return split_names


def check_dropped(
    ctx: SyncContext, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]], split: set[str]
) -> None:
    records = ctx.view.records
    pp_size = int(records[0].rank.get("pp_size", 1) or 1)
    pp_present = {int(r.rank.get("pp_rank", 0) or 0) for r in records}
    all_stages = all(p in pp_present for p in range(pp_size))  # stops at the first absent stage
    ranges = [r for r in ctx.rank_ranges() if r is not None]
    num_layers = ctx.num_layers()
    calls: dict[tuple[int, int], CallEntry] = {(id(r), c.call): c for r in records for c in r.calls}
    no_call = CallEntry(call=-1, names=0)
    dropped: dict[str, list[str]] = defaultdict(list)  # reason → names
    uncertain: list[str] = []
    unobserved: list[str] = []  # may have gone into a parameter whose writes the tap could not observe
    untracked = {id(r): untracked_keys(r) for r in records}
    # The tensor each raising call was handing to a loader when it raised: its last consumed tensor.
    last_of_call: dict[tuple[int, int], int] = {}
    for record in records:
        for entry in record.tensors:
            key = (id(record), entry.call)
            last_of_call[key] = max(last_of_call.get(key, entry.seq), entry.seq)
    for name, items in occurrences.items():
        if name in split or ctx.skipped(name):
            continue
        if name in ctx.written_elsewhere or any(entry.wrote or entry.offrank for _, entry in items):
            continue
        if any(param_key(name) in untracked[id(record)] for record, _ in items):
            continue  # its parameter's coverage is unknown (`tracked: false`): unknown, never "dropped"
        if name.endswith(_COMPANION_SUFFIXES) and _companion_landed(name, occurrences):
            continue
        if any(entry.error and entry.dtype is None for _, entry in items):
            continue  # not a tensor: reported by the content checks
        layer = _names.layer_id(name)
        beyond = layer is not None and num_layers is not None and layer >= num_layers
        # Without every stage's record, the stage that owns this name may be one without records.
        owned_by_missing = layer is None or not any(start <= layer < end for start, end in ranges)
        if not beyond and not all_stages and owned_by_missing:
            continue
        call_of = [calls.get((id(record), entry.call), no_call) for record, entry in items]
        warned = [msg for call in call_of for msg in call.engine_warnings if name in msg]
        untraced = any(call.unattributed_writes for call in call_of)
        raised = [
            (call, last_of_call.get((id(record), entry.call)) == entry.seq)
            for (record, entry), call in zip(items, call_of, strict=True)
            if call.error
        ]
        if raised and not beyond:
            # Sent, and the engine raised (WC739): not a name the engine has no parameter for.
            call, on_it = next(((c, last) for c, last in raised if last), raised[0])
            error = str(call.error)[:160]
            what = "the engine raised while loading it" if on_it else "sent in a call that raised before it was written"
            dropped[f"{what} (load_weights call {call.call}: {error}; see WC739)"].append(name)
            continue
        if beyond:
            reason = f"layer id beyond the model's {num_layers} layers"
        elif _names.is_fused_expert(name):
            reason = "transformers-5 fused expert names; send per-expert checkpoint names"
        elif name.endswith(_COMPANION_SUFFIXES):
            reason = "quantized tensor for a parameter the engine holds unquantized"
        else:
            reason = "no parameter of the engine takes this name"
        reason += "; the engine logged a warning" if warned else "; silently, without a log line"
        if untraced and not beyond:
            uncertain.append(name)
        elif (
            not beyond
            and not warned
            and reason.startswith("no parameter")
            and any(untracked[id(record)] for record, _ in items)
        ):
            # Some parameters of this rank are untracked and the engine may rename names on the way in:
            # the name cannot be called dropped with certainty.
            unobserved.append(name)
        else:
            dropped[reason].append(name)
    for reason, names in dropped.items():
        ctx.add(
            ENGINE_DROPPED_TENSOR,
            f"{summarize(names)} sent but written into no parameter on any rank ({reason})",
            tensor=summarize(names, limit=1),
            count=len(names),
            details={"names": sorted(names), "reason": reason},
        )
    if uncertain:
        ctx.add(
            ENGINE_DROPPED_TENSOR,
            f"{summarize(uncertain)} sent but no write could be traced to them (the call also made writes the "
            "tap could not attribute: they may have been written through a derived tensor)",
            tensor=summarize(uncertain, limit=1),
            count=len(uncertain),
            severity=Severity.WARNING,
            details={"names": sorted(uncertain), "reason": "untraced"},
        )

    if unobserved:
        ctx.add(
            ENGINE_DROPPED_TENSOR,
            f"{summarize(unobserved)} sent and no write traced to them, but this engine has parameters whose "
            "writes the tap cannot observe (`tracked: false`, no loader attribute and no default loader "
            "given: see `set_engine_hooks(EngineHooks(default_loader=...))`); unknown, not known dropped",
            tensor=summarize(unobserved, limit=1),
            count=len(unobserved),
            severity=Severity.INFO,
            details={"names": sorted(unobserved), "reason": "untracked-params"},
        )


def _companion_landed(name: str, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> bool:
    """A companion `X.weight_scale_inv` whose `X.weight` went into parameter `P.weight`, on a rank that holds
    `P.weight_scale_inv` and wrote it in this sync: it landed there even when the tap could not trace the
    write by value (DeepSeek's loader concatenates the q_a/kv_a scales, tiny tensors whose values repeat
    across layers, and may write them from its thread pool long after they arrived)."""
    base, _, companion = name.rpartition(".")
    for record, entry in occurrences.get(f"{base}.weight", ()):
        for label in entry.wrote:
            param = label.split(":")[0]
            target = record.params.get(param[: -len("weight")] + companion) if param.endswith("weight") else None
            if target is not None and target.writes > 0:
                return True
    return False


def check_params(ctx: SyncContext) -> None:
    never: dict[tuple[str, ...], list[SyncRecord]] = defaultdict(list)
    partial: list[tuple[SyncRecord, str, str]] = []
    for record in ctx.view.records:
        expected = ctx.baseline.get(rank_key(record))
        names: list[str] = []
        for name, param in record.params.items():
            if not param.tracked or ctx.skipped(name):
                continue
            if param.writes == 0:
                if param.optional:  # e.g. KV-cache scales an FP8 checkpoint need not carry
                    continue
                if expected is None or name in expected:
                    names.append(name)
                continue
            if param.shards_expected and set(param.shards_expected) - set(param.shards_written):
                lacking = sorted(set(param.shards_expected) - set(param.shards_written))
                partial.append((record, name, f"shard {', '.join(lacking)} never written"))
            if param.experts_local and param.experts_written is not None:
                lacking_experts = set(range(param.experts_local)) - set(param.experts_written)
                if lacking_experts:
                    partial.append((record, name, f"local experts {format_ranges(lacking_experts)} never written"))
        if names:
            never[tuple(sorted(names))].append(record)
    for names, records in never.items():
        ctx.add(
            ENGINE_PARAM_NEVER_WRITTEN,
            f"{summarize(names)} received no data on {rank_list(records)} (still holds what it held before)",
            tensor=summarize(names, limit=1),
            count=len(names),
            details={"params": list(names), "ranks": [r.rank for r in records]},
        )
    per_record: dict[tuple[str, int], tuple[SyncRecord, list[str]]] = {}
    for record, name, what in partial:
        per_record.setdefault((what, id(record)), (record, []))[1].append(name)
    grouped: dict[tuple[str, tuple[str, ...]], list[SyncRecord]] = defaultdict(list)
    for (what, _), (record, names) in per_record.items():
        grouped[(what, tuple(sorted(names)))].append(record)
    for (what, names), records in grouped.items():
        ctx.add(
            ENGINE_PARAM_PARTIALLY_WRITTEN,
            f"{summarize(names)}: {what} on {rank_list(records)}",
            tensor=summarize(names, limit=1),
            count=len(names),
            details={"params": list(names), "missing": what},
        )


def check_quantization_casts(ctx: SyncContext) -> None:
    """WC745: a loader copied FP8 codes into a float parameter, or a float tensor into an FP8 parameter."""
    casts: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # (from, to, param) → incoming names
    for record in ctx.view.records:
        for name, param in record.params.items():
            if not param.cast_from or ctx.skipped(name):
                continue
            senders = {e.name for e in record.tensors if any(w.split(":")[0] == name for w in e.wrote)}
            for dtype in param.cast_from:
                casts[(dtype, param.dtype or "?", name)] |= senders
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, target, name in casts:
        grouped[(source, target)].append(name)
    for (source, target), params in grouped.items():
        names = sorted({n for p in params for n in casts[(source, target, p)]})
        if source.startswith("F8_"):
            why = "FP8 codes that lose their scale: the engine holds this module unquantized (quant_config=None)"
        else:
            why = "rounded to FP8 with no scale: the trainer did not quantize a module the engine serves quantized"
        ctx.add(
            ENGINE_PARAM_CAST_ACROSS_QUANTIZATION,
            f"{summarize(params)}: {source} tensor copied into the {target} parameter, {why}"
            + (f" (sent as {summarize(names)})" if names else ""),
            tensor=summarize(params, limit=1),
            count=len(params),
            details={"params": sorted(params), "names": names, "from": source, "to": target},
        )
