"""The index rules answer a clean checkpoint with one {tensor: shard} dict compared with weight_map
(weightcheck/rules/index.py `_located`); a tensor held by two shards must still take the per-entry walks:
WC204 names it and WC205 counts its bytes once, as the Rust-written shards and total_size say."""

from __future__ import annotations

from conftest import copy_into_another_shard, write_index
from helpers import by_code, run


def test_tensor_held_twice_counts_once_in_total_size(make_ckpt) -> None:
    path = make_ckpt("llama")
    index, name, _other, copy = copy_into_another_shard(path)  # safetensors' own writer: a second, unindexed copy

    result = run(path)
    [dup] = by_code(result, "WC204")
    assert name in dup.message
    # total_size (the writer's, unchanged) is right: the copy's bytes are not counted twice.
    assert not by_code(result, "WC205")

    index["metadata"]["total_size"] += copy.numel() * copy.element_size()  # the copy counted as well
    write_index(path, index)
    [finding] = by_code(run(path), "WC205")
    assert f"{index['metadata']['total_size']}" in finding.message
