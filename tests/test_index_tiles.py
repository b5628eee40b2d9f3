"""`_index_tiles_shards` (weightcheck/rules/index.py) answers "weight_map is exactly the readable shards'
{tensor: shard}" without building that dict; when it says yes, the dict (`_located`) must equal weight_map
with no name held twice, and every damaged index must make it say no (the rules then take the dict path)."""

from __future__ import annotations

import pytest
from conftest import copy_into_another_shard, read_index, shards, write_index

from weightcheck.checkpoint import load_checkpoint
from weightcheck.rules import LintContext
from weightcheck.rules.index import _index_is_shards, _index_tiles_shards, _located


def _verdicts(path) -> tuple[bool, bool, bool]:
    ctx = LintContext(ckpt=load_checkpoint(path), options={})
    located, held = _located(ctx)
    exact = bool(ctx.ckpt.weight_map) and located == ctx.ckpt.weight_map
    tiles = _index_tiles_shards(ctx)
    if tiles:  # what the callers rely on
        assert exact and len(located) == held
    assert _index_is_shards(ctx) == exact
    return tiles, exact, len(located) == held


def test_clean_checkpoint_tiles(make_ckpt) -> None:
    assert _verdicts(make_ckpt("llama")) == (True, True, True)


def test_name_held_twice_does_not_tile(make_ckpt) -> None:
    path = make_ckpt("llama")
    copy_into_another_shard(path)
    tiles, _, distinct = _verdicts(path)
    assert not tiles and not distinct


def test_name_held_twice_indexed_at_the_later_shard(make_ckpt) -> None:
    # `_located` keeps the later shard, so weight_map pointing there equals it: the dict path says "exact"
    # while the counts disagree (the shortcut must say no and leave the verdict to the dict).
    path = make_ckpt("llama")
    index, name, other, _copy = copy_into_another_shard(path)
    later = max(index["weight_map"][name], other.name)
    index["weight_map"][name] = later
    write_index(path, index)
    tiles, _, distinct = _verdicts(path)
    assert not tiles and not distinct


@pytest.mark.parametrize("damage", ["ghost", "unindexed", "wrong_shard"])
def test_damaged_index_does_not_tile(make_ckpt, damage: str) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    weight_map = index["weight_map"]
    # a name whose shard holds others (a shard losing its only entry is simply no longer indexed)
    name = next(n for n in sorted(weight_map) if list(weight_map.values()).count(weight_map[n]) > 1)
    if damage == "ghost":
        weight_map["model.layers.0.mlp.ghost.weight"] = weight_map[name]
    elif damage == "unindexed":
        del weight_map[name]
    else:
        weight_map[name] = next(s.name for s in shards(path) if s.name != weight_map[name])
    write_index(path, index)
    tiles, exact, _ = _verdicts(path)
    assert not tiles and not exact
