"""Shifted layers (WC725) and experts (WC726): sent names whose bytes are the reference's under another
layer or expert id, with the trainer stage or EP rank that sent them when it can be inferred."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weightcheck.collapse import format_ranges, summarize
from weightcheck.digest import TensorDigest
from weightcheck.rules.verify import SYNC_EXPERT_SHIFTED, SYNC_LAYER_SHIFTED
from weightcheck.tap.records import SyncRecord, TensorEntry
from weightcheck.verifying import _names
from weightcheck.verifying.checks.context import SyncContext, digest_of


@dataclass
class ShiftPair:
    sent: str
    true: str
    kind: str  # "layer" | "expert"
    delta: int  # true id − sent id


def find_shifts(ctx: SyncContext, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> list[ShiftPair]:
    assert ctx.ref is not None
    ref = ctx.ref
    candidates: list[tuple[str, list[ShiftPair]]] = []
    seen: set[tuple[str, TensorDigest]] = set()
    for name, items in occurrences.items():
        for _, entry in items:
            digest = digest_of(entry)
            if digest is None or (name, digest) in seen:
                continue
            ref = ctx.ref_for(digest)
            if ref.digests.get(name) == digest:
                continue
            seen.add((name, digest))
            options: list[ShiftPair] = []
            template, layer, expert = _names.template(name), _names.layer_id(name), _names.expert_id(name)
            for other in ref.names_with(digest):
                if other == name or _names.template(other) != template:
                    continue
                other_layer, other_expert = _names.layer_id(other), _names.expert_id(other)
                # An id beyond the bounded digit count parses as None: never a shift partner.
                layer_shift = layer is not None and other_layer is not None and other_layer != layer
                expert_shift = expert is not None and other_expert is not None and other_expert != expert
                if layer_shift and other_expert == expert:
                    options.append(ShiftPair(name, other, "layer", other_layer - layer))  # type: ignore[operator]
                elif expert_shift and other_layer == layer:
                    options.append(ShiftPair(name, other, "expert", other_expert - expert))  # type: ignore[operator]
            if options:
                candidates.append((name, options))
    # Identical tensors (norms at init) match several layers: keep, per tensor, the shift most tensors share.
    votes = Counter((p.kind, p.delta) for _, options in candidates for p in options)
    chosen: list[ShiftPair] = []
    for _, options in candidates:
        chosen.append(max(options, key=lambda p: (votes[(p.kind, p.delta)], -abs(p.delta))))
    return chosen


def report_shifts(ctx: SyncContext, shifts: Sequence[ShiftPair]) -> None:
    groups: dict[tuple[str, int], list[ShiftPair]] = defaultdict(list)
    for pair in shifts:
        groups[(pair.kind, pair.delta)].append(pair)
    for (kind, delta), pairs in sorted(groups.items()):
        if kind == "layer":
            _report_layer_shift(ctx, delta, pairs)
        else:
            _report_expert_shift(ctx, delta, pairs)


def _shift_text(delta: int) -> str:
    return f"shifted by −{delta}" if delta > 0 else f"shifted by +{-delta}"


def _report_layer_shift(ctx: SyncContext, delta: int, pairs: Sequence[ShiftPair]) -> None:
    sent_ids = sorted({_names.layer_id(p.sent) for p in pairs if _names.layer_id(p.sent) is not None})  # type: ignore[type-var]
    true_ids = sorted({_names.layer_id(p.true) for p in pairs if _names.layer_id(p.true) is not None})  # type: ignore[type-var]
    stage, how, bug = _sending_stage(ctx, sent_ids, true_ids, [p.true for p in pairs])
    sent_names = sorted({p.sent for p in pairs})
    where = f" from {stage}" if stage else ""
    text = f"layers {format_ranges(sent_ids)}{where} {_shift_text(delta)}: they hold the data of layers "
    text += f"{format_ranges(true_ids)}"
    if stage and bug is not None and bug.forgot_offset:
        text += f"; {stage} sent its local layer ids without its offset {delta}"
    elif stage:
        text += f"; {stage} applied a wrong layer offset"
    text += f" ({how})"
    details: dict[str, Any] = {
        "shift": -delta,
        "sent_layers": sent_ids,
        "true_layers": true_ids,
        "stage": stage,
        "stage_inferred_from": how,
        "forgot_offset": bool(bug.forgot_offset) if bug is not None else None,
        "names": sent_names,
    }
    ctx.add(SYNC_LAYER_SHIFTED, text, tensor=summarize(sent_names, limit=1), count=len(sent_names), details=details)


def _sending_stage(
    ctx: SyncContext, sent_ids: list[int], true_ids: list[int], true_names: Sequence[str]
) -> tuple[str | None, str, Any]:
    """(stage label, how it was inferred, OffsetBug or None)."""
    from weightcheck.layout import MegatronPipeline, infer_pp_offset_bug

    assert ctx.ref is not None
    origins = {ctx.ref.origin[n] for n in true_names if n in ctx.ref.origin}
    num_layers = ctx.ref.num_layers
    trainer = ctx.trainer
    pipe: MegatronPipeline | None = None
    how = "from the trainer layout"
    assumed = 0  # stages of an assumed even split (no layout known)
    if num_layers:
        try:
            if trainer.pp_size:
                pipe = MegatronPipeline(
                    num_layers,
                    trainer.pp_size,
                    trainer.vp_size,
                    trainer.first_stage_layers,
                    trainer.last_stage_layers,
                    trainer.layout,
                )
            elif sent_ids == list(range(len(true_ids))) and num_layers % len(true_ids) == 0 and len(true_ids) > 0:
                assumed = num_layers // len(true_ids)
                pipe = MegatronPipeline(num_layers, assumed)
                how = f"assuming an even split over {num_layers // len(true_ids)} stages; pass --trainer-pp to be exact"
        except ValueError:
            pipe = None
    if pipe is not None:
        try:
            owners = {pipe.owner(t) for t in true_ids}
        except ValueError:
            owners = set()
        if len(owners) == 1:
            key = owners.pop()
            bug = infer_pp_offset_bug(sent_ids, pipe.stage_layers(), stage=key)
            label = f"pp_rank {key[0]}" + (f" vp_stage {key[1]}" if pipe.num_vp_stages > 1 else "")
            if assumed > 3 and any(assumed % vp == 0 for vp in range(2, assumed // 2 + 1)) and not origins:
                # As many stages could be fewer ranks with virtual stages (pp 2 × vp 2 for 4): naming
                # `pp_rank 3` could name a rank the run does not have, so name the stage by its layers.
                label = f"the stage holding layers {format_ranges(true_ids)}"
                how = (
                    f"{label} is pp_rank {key[0]} of an even split into {assumed} stages, or a virtual stage of "
                    "fewer ranks; pass --trainer-pp and --trainer-vp to name it"
                )
            if len(origins) == 1:
                how = f"the manifest part of {next(iter(origins))}"
            return label, how, bug
    if len(origins) == 1:
        return next(iter(origins)), "from the trainer manifest", None
    return None, "the sending stage could not be inferred; pass --trainer-pp", None


def _report_expert_shift(ctx: SyncContext, delta: int, pairs: Sequence[ShiftPair]) -> None:
    from weightcheck.layout import ep_owner

    assert ctx.ref is not None
    sent_ids = sorted({e for p in pairs if (e := _names.expert_id(p.sent)) is not None})
    true_ids = sorted({e for p in pairs if (e := _names.expert_id(p.true)) is not None})
    layers = sorted({lid for p in pairs if (lid := _names.layer_id(p.sent)) is not None})
    num_experts = ctx.ref.num_experts
    ep_size = ctx.trainer.ep_size
    how = "from the trainer layout"
    local_ids = bool(true_ids) and sent_ids == list(range(len(true_ids)))
    if not ep_size and num_experts and local_ids and num_experts % len(true_ids) == 0:
        ep_size = num_experts // len(true_ids)
        how = f"assuming {ep_size} EP ranks of {len(true_ids)} experts; pass --trainer-ep to be exact"
    rank_label = None
    if ep_size and num_experts:
        try:
            owners = {ep_owner(t, num_experts, ep_size)[0] for t in true_ids}
        except ValueError:
            owners = set()
        if len(owners) == 1:
            rank_label = f"ep_rank {owners.pop()}"
    origins = {ctx.ref.origin[p.true] for p in pairs if p.true in ctx.ref.origin}
    if rank_label is None and len(origins) == 1:
        rank_label, how = next(iter(origins)), "from the trainer manifest"
    sent_names = sorted({p.sent for p in pairs})
    where = f" from {rank_label}" if rank_label else ""
    text = (
        f"experts {format_ranges(sent_ids)}{where} {_shift_text(delta)} (layers {format_ranges(layers)}): "
        f"they hold the data of experts {format_ranges(true_ids)}"
    )
    if rank_label and sent_ids == list(range(len(true_ids))):
        text += f"; {rank_label} sent its local expert ids without its offset {delta}"
    if rank_label:
        text += f" ({how})"
    details = {
        "shift": -delta,
        "sent_experts": sent_ids,
        "true_experts": true_ids,
        "layers": layers,
        "ep_rank": rank_label,
        "names": sent_names,
    }
    ctx.add(SYNC_EXPERT_SHIFTED, text, tensor=summarize(sent_names, limit=1), count=len(sent_names), details=details)
