"""Layer-id maps: megatron-core itself is the oracle for pipeline offsets and per-stage layer counts; SGLang's
and vLLM's partitions, EP offsets, name mapping, shift inference and the `layout` command are pinned by the
worked examples of megatron-core's pipeline offsets."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from weightcheck.layout import (
    MegatronPipeline,
    OffsetBug,
    ep_global_expert,
    ep_owner,
    ep_rank_experts,
    infer_pp_offset_bug,
    local_to_global_layer,
    megatron_local_name_to_global,
    mtp_hf_layer,
    parse_pipeline_layout,
    range_owner,
    sglang_pp_indices,
    sglang_pp_ranges,
    stage_feeds,
    suggest_uneven_split,
    vllm_pp_indices,
    vllm_pp_ranges,
)

# ----------------------------------------------------------------------------------------------------------------
# megatron-core as the oracle
# ----------------------------------------------------------------------------------------------------------------

NUM_LAYERS = (4, 8, 16, 24, 28, 30, 32, 61, 62, 94)
PP_SIZES = (1, 2, 4, 8)
VP_SIZES = (None, 2, 4)
UNEVEN = (None, 1, 2, 3, 4, 6, 8, 12)
ACCOUNT = ((False, False), (True, False), (False, True), (True, True))

# (layout, pp_size, explicit vp_size, mtp_num_layers); the invalid ones must be refused by both sides.
LAYOUTS: list[tuple[str, int, int | None, int | None]] = [
    ("Etttt|tttttttt|tttttttt|ttttttttL", 4, None, None),
    ("Ett|tt|tt|ttL", 2, None, None),
    ("Ett|tt|tt|ttL", 2, 2, None),
    ("Ett|tt|tt|ttL", 2, 4, None),  # vp conflicts with the layout
    ("Ett|tt|tt|ttL", 4, None, None),
    ("Ettt|(tt|)*29,m|L", 8, None, 1),
    ("Ettt|(tt|)*29,m|L", 16, None, 1),
    ("Ettt|(tt|)*29,m|L", 4, None, 1),
    ("Ettt|(tt|)*29,m|L", 2, None, 1),
    ("Ettt|(tt|)*29,m|L", 8, None, None),  # megatron: mtp_num_layers None but the layout has MTP
    ("Ettt|(tt|)*29,m|L", 8, None, 2),  # count mismatch
    ("Et*3|t*4|t*4|t*4L", 4, None, None),
    ("E|(tttt|)*7,L", 3, None, None),
    ("E|(tttt|)*7,L", 9, None, None),
    ("E,t*7|t*8|t*8|t*5,L", 4, None, None),
    ("E(tt|)*4,tt|tt|ttL", 2, None, None),
    ("tttt|ttttL", 2, None, None),  # no embedding first
    ("Ett|ttLL", 2, None, None),  # two losses
    ("EEtt|ttL", 2, None, None),  # two embeddings
    ("Ett|tmt|L|", 2, None, 1),  # decoder after MTP
    ("Ettm|tt|tt|ttL", 2, None, 1),  # MTP not in the rank's last virtual stage
    ("Ettx|ttL", 2, None, None),  # unknown symbol
    ("Ett|tt|ttL", 2, None, None),  # 3 stages over pp 2
    ("Ett|ttL", 1, None, None),  # 2 virtual stages with pp 1: chunks overlap
    ("EttttL", 1, None, None),
]


@pytest.fixture(scope="module")
def mcore() -> Iterator[dict[str, Any]]:
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TE / Apex "not installed" warnings
        import torch
        from megatron.core import parallel_state
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    yield {
        "torch": torch,
        "ps": parallel_state,
        "Layout": PipelineParallelLayerLayout,
        "count": get_num_layers_to_build,
        "Config": TransformerConfig,
        "offset": get_transformer_layer_offset,
    }
    parallel_state.set_pipeline_model_parallel_rank(None)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


def oracle(mc: dict[str, Any], **kw: Any) -> dict[tuple[int, int], tuple[int, int]] | str:
    """megatron-core's `{(pp_rank, vp_stage): (offset, count)}`, or why it refuses the configuration."""
    ps = mc["ps"]
    pp = kw["pp_size"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation chatter from TransformerConfig
            cfg = mc["Config"](
                num_layers=kw["num_layers"],
                hidden_size=64,
                num_attention_heads=4,
                use_cpu_initialization=True,
                pipeline_dtype=mc["torch"].float32,
                pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=kw.get("vp_size"),
                num_layers_in_first_pipeline_stage=kw.get("first_stage_layers"),
                num_layers_in_last_pipeline_stage=kw.get("last_stage_layers"),
                pipeline_model_parallel_layout=kw.get("layout"),
                account_for_embedding_in_pipeline_split=kw.get("account_for_embedding", False),
                account_for_loss_in_pipeline_split=kw.get("account_for_loss", False),
                mtp_num_layers=kw.get("mtp_num_layers"),
            )
    except (ValueError, AssertionError, NotImplementedError) as exc:
        return f"config: {exc}"
    vp = cfg.virtual_pipeline_model_parallel_size
    # The layout path reads pp rank and VPP world size from parallel_state, not from its arguments.
    ps.set_virtual_pipeline_model_parallel_world_size(vp)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    try:
        for rank in range(pp):
            ps.set_pipeline_model_parallel_rank(rank)
            for v in range(vp or 1):
                stage = v if vp is not None else None
                count = mc["count"](cfg, vp_stage=stage, pp_rank=rank)
                out[(rank, v)] = (mc["offset"](cfg, vp_stage=stage, pp_rank=rank), count)
    except (AssertionError, ZeroDivisionError) as exc:  # ZeroDivisionError: VPP, first+last, no middle stage
        return f"build: {type(exc).__name__}: {exc}"
    finally:
        ps.set_pipeline_model_parallel_rank(None)
        ps.set_virtual_pipeline_model_parallel_world_size(None)
    return out


def partitions_model(stages: dict[tuple[int, int], tuple[int, int]], num_layers: int) -> bool:
    """Whether megatron-core's own map puts every layer on exactly one stage."""
    ids = [layer for off, n in stages.values() for layer in range(off, off + max(n, 0))]
    return all(n >= 0 for _, n in stages.values()) and sorted(ids) == list(range(num_layers))


def check(mc: dict[str, Any], stats: dict[str, int], **kw: Any) -> str | None:
    """Compare one configuration with megatron-core; return a mismatch description or None."""
    expected = oracle(mc, **kw)
    try:
        ours = MegatronPipeline(**kw)
    except ValueError as exc:
        if isinstance(expected, str):
            stats["refused"] += 1
            return None
        if not partitions_model(expected, kw["num_layers"]):
            stats["megatron_builds_wrong"] += 1  # accepted by megatron-core, but overlapping/missing layers
            return None
        return f"{kw}: we refuse ({exc}) but megatron-core builds {expected}"
    if isinstance(expected, str):
        return f"{kw}: megatron-core refuses ({expected[:120]}) but we accept"
    if not partitions_model(expected, kw["num_layers"]):
        return f"{kw}: megatron-core builds overlapping/missing layers {expected} but we accept"
    got = {key: (ours.offset(*key), ours.num_layers_to_build(*key)) for key in ours.stage_keys()}
    if got != expected:
        return f"{kw}: ours {got} != megatron-core {expected}"
    # The stage map agrees with the offsets (and vp_stage=None works without VPP).
    layers = ours.stage_layers()
    for (rank, v), (off, n) in expected.items():
        stage = v if ours.vp_size and ours.vp_size > 1 else None
        assert layers[(rank, v)] == list(range(off, off + n))
        assert ours.offset(rank, stage) == off
        assert ours.num_layers_to_build(rank, stage) == n
    stats["matched"] += 1
    stats["stages"] += len(expected)
    return None


@pytest.mark.parametrize("num_layers", NUM_LAYERS)
def test_offsets_and_counts_match_megatron_core(mcore: dict[str, Any], num_layers: int) -> None:
    stats = {"matched": 0, "refused": 0, "megatron_builds_wrong": 0, "stages": 0}
    problems: list[str] = []
    for pp in PP_SIZES:
        for vp in VP_SIZES:
            for first in UNEVEN:
                for last in UNEVEN:
                    kw = dict(num_layers=num_layers, pp_size=pp, vp_size=vp)
                    kw.update(first_stage_layers=first, last_stage_layers=last)
                    problems.append(check(mcore, stats, **kw) or "")
            for emb, loss in ACCOUNT:
                kw = dict(num_layers=num_layers, pp_size=pp, vp_size=vp)
                kw.update(account_for_embedding=emb, account_for_loss=loss)
                problems.append(check(mcore, stats, **kw) or "")
            # Uneven + accounted: refused by both.
            kw = dict(num_layers=num_layers, pp_size=pp, vp_size=vp, first_stage_layers=2)
            problems.append(check(mcore, stats, account_for_embedding=True, **kw) or "")
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems[:20])
    # The grid must really exercise both sides: accepted configs (with VPP and uneven ones) and refusals.
    assert stats["matched"] >= 10 and stats["refused"] >= 10, stats


def test_grid_covers_uneven_vpp_and_accounting(mcore: dict[str, Any]) -> None:
    """Spot-check that the interesting branches are among the accepted configurations."""
    stats = {"matched": 0, "refused": 0, "megatron_builds_wrong": 0, "stages": 0}
    accepted = [
        dict(num_layers=28, pp_size=4, vp_size=2, first_stage_layers=2, last_stage_layers=6),
        dict(num_layers=14, pp_size=4, vp_size=2, last_stage_layers=2),  # NVIDIA/Megatron-LM#1584 branch
        dict(num_layers=30, pp_size=4, vp_size=None, first_stage_layers=6, last_stage_layers=8),
        dict(num_layers=62, pp_size=8, vp_size=None, first_stage_layers=6),
        dict(num_layers=61, pp_size=8, vp_size=None, first_stage_layers=6, last_stage_layers=7),
        dict(num_layers=7, pp_size=2, vp_size=2, account_for_embedding=True),
        dict(num_layers=6, pp_size=2, vp_size=2, account_for_embedding=True, account_for_loss=True),
        dict(num_layers=30, pp_size=4, account_for_embedding=True, account_for_loss=True),
        dict(num_layers=8, pp_size=2, vp_size=1),
    ]
    for kw in accepted:
        assert check(mcore, stats, **kw) is None
    assert stats["matched"] == len(accepted), stats


def _random_layout(rng: random.Random, num_layers: int, pp: int, vp: int) -> tuple[str, int]:
    """A layout string with decoders spread at random over pp*vp stages, written in the compressed forms."""
    n_stages = pp * vp
    cuts = sorted(rng.randint(0, num_layers) for _ in range(n_stages - 1))
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, num_layers], strict=True)]
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    mtp = 0
    if rng.random() < 0.4:  # valid or not: megatron-core decides
        mtp = rng.choice((1, 2))
        where = rng.choice((n_stages - 1, n_stages - 2, rng.randrange(n_stages)))
        stages[where] += "m" * mtp
    stages[-1] += "L"
    text = []
    for stage in stages:
        if len(stage) > 3 and rng.random() < 0.5:
            stage = stage.replace("t" * stage.count("t"), f"t*{stage.count('t')}", 1)
        text.append(stage)
    joined = "|".join(text)
    if rng.random() < 0.3:
        joined = joined.replace("|", ",|", 1)  # cosmetic commas
    return joined, mtp


def test_layouts_match_megatron_core(mcore: dict[str, Any]) -> None:
    stats = {"matched": 0, "refused": 0, "megatron_builds_wrong": 0, "stages": 0}
    cases = list(LAYOUTS)
    rng = random.Random(5)
    for _ in range(300):
        pp = rng.choice((1, 2, 4, 8))
        vp = rng.choice((1, 2, 4))
        layers = rng.choice(NUM_LAYERS)
        text, mtp = _random_layout(rng, layers, pp, vp)
        cases.append((text, pp, None, mtp or None))
    problems = []
    for text, pp, vp, mtp in cases:
        # Our parser unrolls exactly like megatron-core's.
        symbol = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
        try:
            theirs: list[str] | None = [
                "".join(symbol[t.name] for t in stage) for stage in mcore["Layout"].parse_str_to_list(text)
            ]
        except AssertionError:
            theirs = None
        if theirs is None:
            with pytest.raises(ValueError):
                parse_pipeline_layout(text)
            num_layers = 1
        else:
            assert parse_pipeline_layout(text) == theirs, text
            num_layers = max(1, "".join(theirs).count("t"))
        kw = dict(num_layers=num_layers, pp_size=pp, vp_size=vp, layout=text, mtp_num_layers=mtp)
        problems.append(check(mcore, stats, **kw) or "")
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems[:20])
    assert stats["matched"] >= 100 and stats["refused"] >= 20, stats


def test_layout_decoder_count_mismatch_refused(mcore: dict[str, Any]) -> None:
    stats = {"matched": 0, "refused": 0, "megatron_builds_wrong": 0, "stages": 0}
    assert check(mcore, stats, num_layers=27, pp_size=4, layout="Etttt|tttttttt|tttttttt|ttttttttL") is None
    assert stats["refused"] == 1


# ----------------------------------------------------------------------------------------------------------------
# Worked examples of megatron-core's offsets, no megatron needed
# ----------------------------------------------------------------------------------------------------------------


def test_uneven_first_last_example() -> None:
    pipe = MegatronPipeline(28, 4, first_stage_layers=4, last_stage_layers=6)
    layers = pipe.stage_layers()
    assert layers == {
        (0, 0): list(range(0, 4)),
        (1, 0): list(range(4, 13)),
        (2, 0): list(range(13, 22)),
        (3, 0): list(range(22, 28)),
    }
    assert [pipe.offset(r) for r in range(4)] == [
        0,
        4,
        13,
        22,
    ]


def test_vpp_examples() -> None:
    assert MegatronPipeline(8, 2, vp_size=2).stage_layers() == {
        (0, 0): [0, 1], (0, 1): [4, 5], (1, 0): [2, 3], (1, 1): [6, 7]
    }  # fmt: skip
    assert MegatronPipeline(8, 2, vp_size=4).stage_layers() == {
        (0, 0): [0],
        (0, 1): [2],
        (0, 2): [4],
        (0, 3): [6],
        (1, 0): [1],
        (1, 1): [3],
        (1, 2): [5],
        (1, 3): [7],
    }
    # The uneven VPP numbers from the megatron-core oracle run.
    kw = dict(num_layers=28, pp_size=4, vp_size=2, first_stage_layers=2, last_stage_layers=6)
    pipe = MegatronPipeline(**kw)
    offsets = [pipe.offset(r, v) for r in range(4) for v in range(2)]
    assert offsets == [0, 14, 1, 15, 6, 20, 11, 25]


def test_layout_example_and_mtp_stage() -> None:
    pipe = MegatronPipeline(61, 8, layout="Ettt|(tt|)*29,m|L", mtp_num_layers=1)
    assert pipe.vp_size == 4 and pipe.mtp_num_layers == 1
    assert pipe.stage_layers()[(0, 0)] == [0, 1, 2] and pipe.stage_layers()[(7, 0)] == [15, 16]
    assert pipe.stage_layers()[(6, 3)] == [] and pipe.offset(6, 3) == 61
    assert pipe.mtp_stage() == (6, 3)  # stage 30 of the string: vp 30 // 8, pp 30 % 8
    assert parse_pipeline_layout("Ettt|(tt|)*2,m|L") == ["Ettt", "tt", "tt", "m", "L"]
    assert MegatronPipeline(28, 4, mtp_num_layers=1).mtp_stage() == (3, 0)
    assert MegatronPipeline(8, 2, vp_size=2, mtp_num_layers=1).mtp_stage() == (1, 1)
    assert MegatronPipeline(8, 2).mtp_stage() is None


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(num_layers=30, pp_size=4), "Megatron-LM#1304"),  # the silent 28-of-30 case
        (dict(num_layers=61, pp_size=8), "not divisible by pp_size 8"),
        (dict(num_layers=28, pp_size=4, vp_size=2, first_stage_layers=4, last_stage_layers=6), "divisible by vp"),
        (dict(num_layers=28, pp_size=4, first_stage_layers=4, last_stage_layers=5), "do not divide"),
        (dict(num_layers=28, pp_size=2, first_stage_layers=4, last_stage_layers=6), "middle pipeline stages"),
        (dict(num_layers=8, pp_size=4, first_stage_layers=6, last_stage_layers=6), "exceed"),
        (dict(num_layers=28, pp_size=4, first_stage_layers=0), "must be > 0"),
        (dict(num_layers=28, pp_size=4, first_stage_layers=4, account_for_loss=True), "cannot be combined"),
        (dict(num_layers=28, pp_size=4, layout="Ettttttt|tttttttt|tttttttt|ttttttttL"), "decoder layers"),
        (dict(num_layers=28, pp_size=4, account_for_embedding=True), "with the embedding/loss"),
        (dict(num_layers=8, pp_size=1, vp_size=2), "every virtual stage offset 0"),
        (dict(num_layers=16, pp_size=1, first_stage_layers=1, last_stage_layers=1), "no stage for layers 1..15"),
        (dict(num_layers=61, pp_size=8, layout="Ettt|(tt|)*29,m|L"), "mtp_num_layers is None"),
        (dict(num_layers=8, pp_size=2, vp_size=4, layout="Ett|tt|tt|ttL"), "conflicts"),
        (dict(num_layers=8, pp_size=2, layout="Ett|tt|t*99999999|ttL"), "expands beyond"),
        (dict(num_layers=0, pp_size=1), "num_layers"),
    ],
)
def test_invalid_configs_are_refused(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        MegatronPipeline(**kw)
    assert needle in str(info.value)


def test_rank_and_stage_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="pp_rank"):
        MegatronPipeline(28, 4).offset(4)
    with pytest.raises(ValueError, match="vp_stage is required"):
        MegatronPipeline(8, 2, vp_size=2).offset(0)
    with pytest.raises(ValueError, match="vp_stage 2 out of range"):
        MegatronPipeline(8, 2, vp_size=2).offset(0, 2)
    assert MegatronPipeline(28, 4).offset(1, 0) == 7


def test_suggest_uneven_split() -> None:
    assert suggest_uneven_split(61, 8) == (6, 7)
    assert suggest_uneven_split(30, 4) == (7, 7)
    assert suggest_uneven_split(61, 8, 2) is None  # odd layer count cannot split into even chunks
    assert suggest_uneven_split(8, 1) is None
    first, last = suggest_uneven_split(94, 8, 2) or (0, 0)
    MegatronPipeline(94, 8, 2, first_stage_layers=first, last_stage_layers=last)


def test_local_to_global_and_owner() -> None:
    kw = dict(num_layers=28, pp_size=4, first_stage_layers=4, last_stage_layers=6)
    assert local_to_global_layer(0, pp_rank=2, **kw) == 13
    assert local_to_global_layer(8, pp_rank=1, **kw) == 12
    with pytest.raises(ValueError, match="builds 9 layers"):
        local_to_global_layer(9, pp_rank=1, **kw)
    assert MegatronPipeline(**kw).owner(17) == (2, 0)
    assert MegatronPipeline(8 * 4, 2, vp_size=2).owner(17) == (0, 1)  # 32 layers: chunk stride 16
    with pytest.raises(ValueError, match="not a decoder layer"):
        MegatronPipeline(**kw).owner(28)
    assert mtp_hf_layer(0, 47) == 47 and mtp_hf_layer(1, 61) == 62


# ----------------------------------------------------------------------------------------------------------------
# SGLang / vLLM partitions (§6)
# ----------------------------------------------------------------------------------------------------------------


def _counts(ranges: list[tuple[int, int]]) -> list[int]:
    return [end - start for start, end in ranges]


@pytest.mark.parametrize(
    ("layers", "pp", "sglang", "vllm"),
    [
        (61, 4, [15, 15, 15, 16], [15, 15, 16, 15]),
        (30, 4, [7, 7, 8, 8], [7, 8, 8, 7]),
        (28, 4, [7, 7, 7, 7], [7, 7, 7, 7]),
        (61, 2, [30, 31], [31, 30]),
        (5, 3, [1, 2, 2], [2, 2, 1]),
        (2, 4, [0, 0, 1, 1], [0, 1, 1, 0]),
    ],
)
def test_engine_default_partitions(layers: int, pp: int, sglang: list[int], vllm: list[int]) -> None:
    assert _counts(sglang_pp_ranges(layers, pp)) == sglang
    assert _counts(vllm_pp_ranges(layers, pp)) == vllm
    for ranges in (sglang_pp_ranges(layers, pp), vllm_pp_ranges(layers, pp)):
        assert ranges[0][0] == 0 and ranges[-1][1] == layers
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_sglang_61_over_4_ranges_and_owner() -> None:
    assert sglang_pp_ranges(61, 4) == [(0, 15), (15, 30), (30, 45), (45, 61)]
    assert sglang_pp_indices(61, 3, 4) == (45, 61)
    assert range_owner(17, sglang_pp_ranges(61, 4)) == 1 and range_owner(45, vllm_pp_ranges(61, 4)) == 2
    assert range_owner(61, sglang_pp_ranges(61, 4)) is None  # no SGLang stage holds layer 61 of 61


def test_explicit_partitions() -> None:
    assert sglang_pp_ranges(61, 4, "16,15,15,15") == [(0, 16), (16, 31), (31, 46), (46, 61)]
    assert vllm_pp_indices(61, 1, 4, "16,15,15,15") == (16, 31)
    for fn in (sglang_pp_indices, vllm_pp_indices):
        with pytest.raises(ValueError, match="has 3 entries"):
            fn(61, 0, 4, "16,15,30")
        with pytest.raises(ValueError, match="sums to 60"):
            fn(61, 0, 4, "15,15,15,15")
        with pytest.raises(ValueError, match="Invalid partition string"):
            fn(61, 0, 4, "16,15,x,15")
        with pytest.raises(ValueError, match="pp_rank"):
            fn(61, 4, 4)
    # SGLang 0.5.23 ignores the partition for a singleton (draft) group; vLLM does not.
    assert sglang_pp_indices(61, 0, 1, "16,15,15,15") == (0, 61)
    with pytest.raises(ValueError):
        vllm_pp_indices(61, 0, 1, "16,15,15,15")


def test_megatron_stages_feed_sglang_stages() -> None:
    pipe = MegatronPipeline(28, 4, first_stage_layers=4, last_stage_layers=6)
    feeds = stage_feeds(pipe.stage_layers(), sglang_pp_ranges(28, 2))
    assert feeds == {(0, 0): [0], (1, 0): [0], (2, 0): [0, 1], (3, 0): [1]}
    assert pipe.owner(17) == (2, 0)
    assert range_owner(17, sglang_pp_ranges(28, 2)) == 1


@pytest.mark.sglang
def test_sglang_partition_matches_real_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    utils = pytest.importorskip("sglang.srt.distributed.utils")
    for partition in (None, "16,15,15,15", "1,60", "61"):
        for pp in (1, 2, 4, 8):
            for layers in (2, 28, 30, 61, 94):
                if partition is None:
                    monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION", raising=False)
                else:
                    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", partition)
                for rank in range(pp):
                    try:
                        want: tuple[int, int] | None = utils.get_pp_indices(layers, rank, pp)
                    except ValueError:
                        want = None
                    if want is None:
                        with pytest.raises(ValueError):
                            sglang_pp_indices(layers, rank, pp, partition)
                    else:
                        assert sglang_pp_indices(layers, rank, pp, partition) == want


# ----------------------------------------------------------------------------------------------------------------
# Experts (§7), names, shift inference
# ----------------------------------------------------------------------------------------------------------------


def test_ep_offsets() -> None:
    assert ep_global_expert(0, 0, 256, 8) == 0
    assert ep_global_expert(3, 2, 256, 8) == 67
    assert ep_global_expert(31, 7, 256, 8) == 255
    assert list(ep_rank_experts(1, 128, 4)) == list(range(32, 64))
    assert ep_owner(67, 256, 8) == (2, 3)
    with pytest.raises(ValueError, match="out of range"):
        ep_global_expert(32, 0, 256, 8)
    with pytest.raises(ValueError, match="do not divide"):
        ep_global_expert(0, 0, 10, 4)
    with pytest.raises(ValueError, match="ep_rank"):
        ep_global_expert(0, 8, 256, 8)
    # AReaL#1595: naming local ids as global gives 0..31 on every rank; the right answer differs from rank 1 on.
    assert {ep_global_expert(k, r, 128, 4) for r in range(4) for k in range(32)} == set(range(128))


def test_name_mapping() -> None:
    kw: dict[str, Any] = dict(num_layers=28, pp_size=4, first_stage_layers=4, last_stage_layers=6)
    grouped = "module.module.decoder.layers.2.mlp.experts.linear_fc1.weight5"
    assert (
        megatron_local_name_to_global(grouped, pp_rank=1, ep_rank=1, ep_size=4, num_experts=64, **kw)
        == "module.module.decoder.layers.6.mlp.experts.linear_fc1.weight21"
    )
    sequential = "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight"
    assert (
        megatron_local_name_to_global(sequential, pp_rank=3, ep_rank=2, ep_size=4, num_experts=64, **kw)
        == "decoder.layers.22.mlp.experts.local_experts.35.linear_fc2.weight"
    )
    # MTP: no pipeline offset, expert offset still applies.
    mtp = "module.module.mtp.layers.0.transformer_layer.mlp.experts.linear_fc2.weight3"
    assert (
        megatron_local_name_to_global(mtp, pp_rank=3, ep_rank=1, ep_size=2, num_experts=16, **kw)
        == "module.module.mtp.layers.0.transformer_layer.mlp.experts.linear_fc2.weight11"
    )
    # Shared experts and non-layer names pass through.
    assert (
        megatron_local_name_to_global("decoder.layers.1.mlp.shared_experts.linear_fc1.weight", pp_rank=2, **kw)
        == "decoder.layers.14.mlp.shared_experts.linear_fc1.weight"
    )
    assert megatron_local_name_to_global("embedding.word_embeddings.weight", pp_rank=0, **kw) == (
        "embedding.word_embeddings.weight"
    )
    assert megatron_local_name_to_global("decoder.final_layernorm.weight", pp_rank=3, **kw) == (
        "decoder.final_layernorm.weight"
    )
    # VPP: the chunk matters.
    assert (
        megatron_local_name_to_global(
            "decoder.layers.1.mlp.linear_fc2.weight", num_layers=8, pp_size=2, pp_rank=1, vp_size=2, vp_stage=1
        )
        == "decoder.layers.7.mlp.linear_fc2.weight"
    )
    with pytest.raises(ValueError, match="builds 4 layers"):
        megatron_local_name_to_global("decoder.layers.4.mlp.linear_fc2.weight", pp_rank=0, **kw)
    with pytest.raises(ValueError, match="num_experts is required"):
        megatron_local_name_to_global(grouped, pp_rank=1, ep_rank=1, ep_size=4, **kw)
    with pytest.raises(ValueError, match="local expert 16 out of range"):
        megatron_local_name_to_global(
            "decoder.layers.0.mlp.experts.linear_fc1.weight16", pp_rank=1, ep_size=4, num_experts=64, **kw
        )


def test_infer_forgotten_offset() -> None:
    stages = MegatronPipeline(28, 4).stage_layers()
    # Stage 3 sent local indices: 0..6 where 21..27 were due.
    assert infer_pp_offset_bug(range(7), stages, stage=(3, 0)) == OffsetBug((3, 0), 21, True)
    assert infer_pp_offset_bug(range(21, 28), stages, stage=(3, 0)) is None  # correct
    assert infer_pp_offset_bug([3, 9], stages, stage=(3, 0)) is None  # not a shift
    # Sender unknown: ids equal to a real stage's ids are taken as correct.
    assert infer_pp_offset_bug(range(7, 14), stages) is None
    # Unequal stages identify the sender by size.
    uneven = MegatronPipeline(28, 4, first_stage_layers=4, last_stage_layers=6).stage_layers()
    assert infer_pp_offset_bug(range(6), uneven) == OffsetBug((3, 0), 22, True)
    bug = infer_pp_offset_bug(range(9), uneven)
    assert bug == OffsetBug((1, 0), 4, True, ambiguous_with=((2, 0),))
    # A wrong (not missing) offset: stage 2 shifted by the first stage's size only.
    assert infer_pp_offset_bug(range(4, 13), uneven, stage=(2, 0)) == OffsetBug((2, 0), 9, False)
    # SGLang ranges work too.
    ranges = {rank: range(s, e) for rank, (s, e) in enumerate(sglang_pp_ranges(61, 4))}
    assert infer_pp_offset_bug(range(16), ranges) == OffsetBug(3, 45, True)
    assert infer_pp_offset_bug([], ranges) is None
    with pytest.raises(ValueError, match="unknown stage"):
        infer_pp_offset_bug(range(3), ranges, stage=9)


def test_layout_module_is_pure() -> None:
    code = "import sys, weightcheck.layout; print(any(m in sys.modules for m in ('torch', 'megatron')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


# ----------------------------------------------------------------------------------------------------------------
# The `layout` command
# ----------------------------------------------------------------------------------------------------------------


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PP_LAYER_PARTITION"}
    return subprocess.run(
        [sys.executable, "-m", "weightcheck", "layout", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_cli_text_table() -> None:
    proc = wc("--num-layers", "28", "--pp", "4", "--first-stage-layers", "4", "--last-stage-layers", "6")
    proc2 = wc("--num-layers", "28", "--pp", "4", "--first-stage-layers", "4", "--last-stage-layers", "6",
               "--sglang-pp", "2", "--mtp", "1", "--ep", "4", "--num-experts", "64")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "4..12" in proc.stdout and "22..27" in proc.stdout and "SGLang" not in proc.stdout
    assert proc2.returncode == 0, proc2.stderr
    out = proc2.stdout
    assert "mtp.layers.0" in out and "28" in out
    row = next(line for line in out.splitlines() if "13..21" in line)
    assert row.split()[-1] == "0,1"  # Megatron rank 2 feeds both SGLang stages
    assert "48..63" in out  # EP rank 3
    assert "\x1b[" not in out  # no colour codes when stdout is not a terminal


def test_cli_json_document() -> None:
    proc = wc("--num-layers", "61", "--pp", "8", "--layout", "Ettt|(tt|)*29,m|L", "--mtp", "1",
              "--sglang-partition", "16,15,15,15", "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == "1.0" and doc["command"] == "layout"
    assert set(doc) == {"schema_version", "tool", "command", "megatron", "sglang", "ep", "notes"}
    meg = doc["megatron"]
    assert meg["config"]["vp_size"] == 4 and meg["config"]["mtp_num_layers"] == 1
    assert len(meg["stages"]) == 32
    first = meg["stages"][0]
    assert first == {
        "pp_rank": 0,
        "vp_stage": 0,
        "offset": 0,
        "num_layers": 3,
        "layers": [0, 1, 2],
        "ranges": "0..2",
        "sglang_pp_ranks": [0],
    }
    assert meg["mtp"] == [{"index": 0, "megatron_prefix": "mtp.layers.0", "hf_layer": 61, "pp_rank": 6, "vp_stage": 3}]
    sg = doc["sglang"]
    assert sg["pp_size"] == 4 and sg["partition_applied"] is True
    assert [(s["start"], s["end"]) for s in sg["stages"]] == [(0, 16), (16, 31), (31, 46), (46, 61)]
    assert doc["ep"] is None and doc["notes"] == []


def test_cli_json_ep_and_ignored_partition() -> None:
    proc = wc("--num-layers", "8", "--sglang-pp", "1", "--sglang-partition", "4,4", "--ep", "2",
              "--num-experts", "8", "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["sglang"]["partition_applied"] is False and doc["notes"]
    assert doc["ep"]["ranks"][1] == {"ep_rank": 1, "start": 4, "end": 8, "experts": "4..7"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--num-layers", "30", "--pp", "4"), "Megatron-LM#1304"),
        (("--num-layers", "61", "--pp", "8"), "--first-stage-layers 6 --last-stage-layers 7"),
        (("--num-layers", "8", "--pp", "2", "--layout", "Ett|ttx|L"), "invalid layer symbol"),
        (("--num-layers", "61", "--sglang-pp", "4", "--sglang-partition", "16,15,15"), "has 3 entries"),
        (("--num-layers", "8", "--ep", "2"), "--ep needs --num-experts"),
        (("--num-layers", "61", "--pp", "8", "--layout", "Ettt|(tt|)*29,m|L"), "pass --mtp 1"),
        (("--num-layers", "8", "--ep", "3", "--num-experts", "8"), "do not divide"),
        (
            (
                "--num-layers",
                "0",
            ),
            "--num-layers",
        ),
    ],
)
def test_cli_usage_errors_exit_2(args: tuple[str, ...], needle: str) -> None:
    proc = wc(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr
    assert "internal error" not in proc.stderr
