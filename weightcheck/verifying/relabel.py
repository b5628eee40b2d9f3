"""Trainer manifest parts whose layer/expert ids lack their rank's offset (a pipeline stage or EP rank that
forgot it): their names mapped to the global names they stand for, so the merged manifest is the trainer's
true state and the engine stream is compared with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightcheck.digest import TensorDigest
from weightcheck.verifying import _names


def part_relabelling(
    digests: Mapping[str, TensorDigest],
    part: Mapping[str, Any],
    trainer: Mapping[str, Any],
    num_layers: int | None,
    num_experts: int | None,
) -> dict[str, str]:
    """Names of a part that carry local ids (offset forgotten) → their global names."""
    from weightcheck.layout import MegatronPipeline, ep_rank_experts, infer_pp_offset_bug

    rename: dict[str, str] = {}
    pp_rank, pp_size = part.get("pp_rank"), trainer.get("pp_size")
    vp_size = trainer.get("vp_size")
    if pp_rank is not None and pp_size and pp_size > 1 and num_layers and vp_size and vp_size > 1:
        rename.update(_vpp_part_relabelling(digests, pp_rank, trainer, num_layers))
    elif pp_rank and pp_size and pp_size > 1 and num_layers and not vp_size:
        try:
            pipe = MegatronPipeline(
                num_layers,
                pp_size,
                first_stage_layers=trainer.get("first_stage_layers"),
                last_stage_layers=trainer.get("last_stage_layers"),
                layout=trainer.get("layout"),
            )
            observed = {lid for name in digests if (lid := _names.layer_id(name)) is not None}
            bug = infer_pp_offset_bug(observed, pipe.stage_layers(), stage=(pp_rank, 0))
        except ValueError:
            bug = None
        if bug is not None:
            for name in digests:
                lid = _names.layer_id(name)
                if lid is not None:
                    rename[name] = _names.with_layer(name, lid + bug.shift)
    ep_rank, ep_size = part.get("ep_rank"), trainer.get("ep_size")
    if ep_rank and ep_size and ep_size > 1 and num_experts and num_experts % ep_size == 0:
        own = ep_rank_experts(ep_rank, num_experts, ep_size)
        observed = {eid for name in digests if (eid := _names.expert_id(name)) is not None}
        if observed and observed == set(range(len(own))):
            for name in digests:
                base = rename.get(name, name)
                eid = _names.expert_id(base)
                if eid is not None:
                    rename[name] = _names.with_expert(base, eid + own.start)
    return rename


def _own_layers(part: Mapping[str, Any], trainer: Mapping[str, Any], num_layers: int) -> set[int] | None:
    """Global layer ids the part's pipeline rank builds (every virtual stage), None when not known."""
    from weightcheck.layout import MegatronPipeline

    pp_rank, pp_size = part.get("pp_rank"), trainer.get("pp_size")
    if pp_rank is None or not pp_size or pp_size <= 1:
        return None
    try:
        pipe = MegatronPipeline(
            num_layers,
            pp_size,
            trainer.get("vp_size"),
            trainer.get("first_stage_layers"),
            trainer.get("last_stage_layers"),
            trainer.get("layout"),
        )
        return {lid for key, ids in pipe.stage_layers().items() if key[0] == pp_rank for lid in ids}
    except ValueError:
        return None


def _vpp_part_relabelling(
    digests: Mapping[str, TensorDigest], pp_rank: int, trainer: Mapping[str, Any], num_layers: int
) -> dict[str, str]:
    """A part of a rank that builds several virtual stages: ids outside the rank's layers, while exactly
    one of its virtual stages sent nothing of its own, are that stage's ids without its offset."""
    from weightcheck.layout import MegatronPipeline, infer_pp_offset_bug

    try:
        pipe = MegatronPipeline(
            num_layers,
            trainer["pp_size"],
            trainer.get("vp_size"),
            trainer.get("first_stage_layers"),
            trainer.get("last_stage_layers"),
            trainer.get("layout"),
        )
        stages = {key: ids for key, ids in pipe.stage_layers().items() if key[0] == pp_rank}
    except ValueError:
        return {}
    observed = {lid for name in digests if (lid := _names.layer_id(name)) is not None}
    own = {lid for ids in stages.values() for lid in ids}
    extra = observed - own
    silent = [key for key, ids in stages.items() if ids and not set(ids) & observed]
    if not extra or len(silent) != 1:
        return {}
    bug = infer_pp_offset_bug(extra, pipe.stage_layers(), stage=silent[0])
    if bug is None:
        return {}
    return {
        name: _names.with_layer(name, lid + bug.shift)
        for name in digests
        if (lid := _names.layer_id(name)) is not None and lid in extra
    }


def _constant_shift(sent: set[int], missing: set[int]) -> int | None:
    if not sent or len(sent) != len(missing):
        return None
    a, b = sorted(sent), sorted(missing)
    shift = b[0] - a[0]
    return shift if shift and all(x + shift == y for x, y in zip(a, b, strict=True)) else None


def duplicate_relabelling(
    part: Any,
    trainer: Mapping[str, Any],
    num_layers: int | None,
    num_experts: int | None,
    rename: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, TensorDigest]]:
    """Names one part sent twice, when shifting their ids by one constant lands exactly on the ids the part
    should hold and lacks: (later digest's name → true name, name → earlier digest). A stream gathered from
    every rank (or a rank's virtual stages in order) sends rank 0's tensors first, so the later copy is the
    one whose sender forgot its offset."""
    first: dict[str, TensorDigest] = {}
    counts: dict[str, int] = {}
    for name, digest in part.duplicates:
        counts[name] = counts.get(name, 0) + 1
        first.setdefault(name, digest)
    twice = {name for name, n in counts.items() if n == 1 and name in part.digests and name not in rename}
    if not twice:
        return {}, {}
    names = set(part.digests)
    out: dict[str, str] = {}
    if num_layers:
        own = _own_layers(part.trainer, trainer, num_layers)
        expected = own if own is not None else set(range(num_layers))
        present = {lid for name in names if (lid := _names.layer_id(name)) is not None}
        sent = {lid for name in twice if (lid := _names.layer_id(name)) is not None}
        shift = _constant_shift(sent, expected - present)
        if shift is not None:
            for name in twice:
                lid = _names.layer_id(name)
                if lid is not None and _names.with_layer(name, lid + shift) not in names:
                    out[name] = _names.with_layer(name, lid + shift)
    if num_experts and not out:
        present_e = {eid for name in names if (eid := _names.expert_id(name)) is not None}
        sent_e = {eid for name in twice if (eid := _names.expert_id(name)) is not None}
        shift = _constant_shift(sent_e, set(range(num_experts)) - present_e)
        if shift is not None:
            for name in twice:
                eid = _names.expert_id(name)
                if eid is not None and _names.with_expert(name, eid + shift) not in names:
                    out[name] = _names.with_expert(name, eid + shift)
    return out, {name: first[name] for name in out}
