"""The tap's bucket (issue #22): a small CPU tensor only goes into a per-call bucket as it passes, and the writes
of the tensor just received are only logged; entries, digests, coverage and filing are made when the bucket is
drained. The record must say exactly what the one-tensor-at-a-time path says (the synchronous-digest mode
never buckets: it is the reference here), whatever the loaders do between drains."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from weightcheck import tap
from weightcheck.tap import core
from weightcheck.tap.records import read_record

H = 4


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    param.data.copy_(loaded_weight)


class Stacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3 * H, H), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id: str) -> None:
        index = "qkv".index(loaded_shard_id)
        param.data[index * H : (index + 1) * H].copy_(loaded_weight)


class Experts(nn.Module):
    """Two local experts of four (EP rank 1 of 2): experts 0 and 1 are skipped, off rank."""

    def __init__(self) -> None:
        super().__init__()
        self.num_local_experts = 2
        self.w2_weight = nn.Parameter(torch.zeros(2, H, H), requires_grad=False)
        self.w2_weight.weight_loader = self.weight_loader

    def _map_global_expert_id_to_local_expert_id(self, expert_id: int) -> int:
        return expert_id - 2 if expert_id >= 2 else -1

    def weight_loader(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, weight_name: str, shard_id: str, expert_id: int
    ) -> None:
        local = self._map_global_expert_id_to_local_expert_id(expert_id)
        if local >= 0:
            param.data[local].copy_(loaded_weight)


class Mixed(nn.Module):
    """Every kind of write the bucket must reproduce: stacked shards (one written late), experts (local and off
    rank), plain writes, one tensor written into two parameters (tied), an FP8 parameter written from BF16 (a
    cast), a big tensor between small ones (not bucketed), writes of earlier tensors at the end (found by
    address), a write from a worker thread, and names the engine drops."""

    def __init__(self, small: int) -> None:
        super().__init__()
        self.qkv = Stacked()
        self.experts = Experts()
        self.norms = nn.ParameterList(nn.Parameter(torch.zeros(H), requires_grad=False) for _ in range(small))
        self.embed = nn.Parameter(torch.zeros(H, H), requires_grad=False)
        self.head = nn.Parameter(torch.zeros(H, H), requires_grad=False)
        self.fp8 = nn.Parameter(torch.zeros(H, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.big = nn.Parameter(torch.zeros(300, 300), requires_grad=False)  # 360 KB: above the small-tensor size
        self.late = nn.ParameterList(nn.Parameter(torch.zeros(H), requires_grad=False) for _ in range(3))
        self.threaded = nn.Parameter(torch.zeros(H), requires_grad=False)

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())

        def write(param_name: str, tensor: torch.Tensor) -> None:
            param = params[param_name]
            getattr(param, "weight_loader", default_loader)(param, tensor)

        late: list[tuple[str, torch.Tensor]] = []
        with ThreadPoolExecutor(1) as pool:
            for name, tensor in weights:
                if name.startswith("late.") or name == "qkv.v":
                    late.append((name, tensor))
                elif name.startswith("qkv."):
                    param = params["qkv.weight"]
                    param.weight_loader(param, tensor, name.split(".")[1])
                elif name.startswith("experts."):
                    param = params["experts.w2_weight"]
                    param.weight_loader(param, tensor, name, shard_id="w2", expert_id=int(name.split(".")[1]))
                elif name == "embed":
                    write("embed", tensor)
                    write("head", tensor)  # tied: the same incoming tensor written twice
                elif name == "threaded":
                    pool.submit(write, "threaded", tensor).result()
                elif name in params:
                    write(name, tensor)
            late.sort(key=lambda item: item[0] != "qkv.v")  # the stacked one first: the first to drain
            for name, tensor in late:  # after the stream: none of them is the tensor just received
                if name == "qkv.v":  # a stacked write, late
                    param = params["qkv.weight"]
                    param.weight_loader(param, tensor, "v")
                else:
                    write(name, tensor)


def mixed_stream(small: int, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    out: list[tuple[str, torch.Tensor]] = [(f"qkv.{shard}", randn(H, H)) for shard in "qk"]
    out += [(f"experts.{expert}", randn(H, H)) for expert in range(4)]
    out += [("embed", randn(H, H)), ("fp8", randn(H).to(torch.bfloat16)), ("late.0", randn(H))]
    out += [(f"norms.{i}", randn(H)) for i in range(small // 2)]
    out += [("big", randn(300, 300)), ("dropped.by.engine", randn(H)), ("late.1", randn(H)), ("threaded", randn(H))]
    out += [(f"norms.{i}", randn(H)) for i in range(small // 2, small)]
    out += [("qkv.v", randn(H, H)), ("late.2", randn(H))]  # both still in the bucket when written
    out[12] = (out[12][0], torch.zeros(H))
    out[13] = (out[13][0], torch.full((H,), float("nan")))
    return out


def record_of(root: Path, seq: int) -> tap.SyncRecord:
    (path,) = (root / f"sync-{seq:05d}").glob("*.jsonl")
    return read_record(path)


def comparable(record: tap.SyncRecord) -> tuple[Any, ...]:
    calls = [(c.call, c.names, c.error, c.unattributed_writes) for c in record.calls]
    return (
        calls,
        [dataclasses.asdict(t) for t in record.tensors],
        {n: dataclasses.asdict(p) for n, p in record.params.items()},
    )


@pytest.fixture
def tapped() -> Iterator[None]:
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(Mixed)
    yield
    tap.uninstall(Mixed)
    tap.configure(None)
    tap.set_engine_hooks(tap.EngineHooks())


def run(root: Path, small: int, *, bucketed: bool, syncs: int = 2, as_list: bool = False) -> list[tuple[Any, ...]]:
    tap.configure(root, digest_threads=2, synchronous_digest=not bucketed)
    engine = Mixed(small)
    stream = mixed_stream(small)
    for _ in range(syncs):  # the second sync installs the loaders in bulk
        engine.load_weights(stream if as_list else iter(stream))
    tap.configure(None)
    return [comparable(record_of(root, seq)) for seq in range(syncs)]


@pytest.mark.parametrize("small", [10, 300, 5000], ids=["one-drain", "window-overflow", "bucket-overflow"])
@pytest.mark.parametrize("as_list", [False, True], ids=["iterator", "list"])
def test_bucketed_records_are_the_one_at_a_time_records(
    tapped: None, tmp_path: Path, small: int, as_list: bool
) -> None:
    bucketed = run(tmp_path / "bucketed", small, bucketed=True, as_list=as_list)
    reference = run(tmp_path / "reference", small, bucketed=False, as_list=as_list)
    assert bucketed == reference
    calls, tensors, params = bucketed[0]
    by_name = {t["name"]: t for t in tensors}
    assert [t["seq"] for t in tensors] == list(range(len(mixed_stream(small))))
    # What each kind of write must have left (the reference could be wrong the same way).
    assert by_name["qkv.k"]["wrote"] == ["qkv.weight:k"] and by_name["qkv.v"]["wrote"] == ["qkv.weight:v"]
    assert by_name["experts.0"]["offrank"] and not by_name["experts.0"]["wrote"]
    assert by_name["experts.3"]["wrote"] == ["experts.w2_weight:w2:3"]
    assert by_name["embed"]["wrote"] == ["embed", "head"]
    assert by_name["late.0"]["wrote"] == ["late.0"] and by_name["late.2"]["wrote"] == ["late.2"]
    assert by_name["threaded"]["wrote"] == ["threaded"] and by_name["big"]["wrote"] == ["big"]
    assert by_name["dropped.by.engine"]["wrote"] == []
    assert params["fp8"]["cast_from"] == ["BF16"]
    assert params["qkv.weight"]["shards_written"] == ["k", "q", "v"]
    assert params["experts.w2_weight"]["experts_written"] == [0, 1]
    assert all(p["writes"] >= 1 for p in params.values())
    assert calls[0][1] == len(tensors) and calls[0][3] == 0


def test_a_tensor_is_bucketed_only_on_the_cheap_path(
    tapped: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small CPU tensors of exactly `torch.Tensor` are bucketed; the big one and, with synchronous digests,
    every tensor go through `observe` (the reference path above)."""
    observed: list[str] = []
    original = core._Call.observe

    def counting(self: Any, name: Any, tensor: Any) -> None:
        observed.append(str(name))
        original(self, name, tensor)

    monkeypatch.setattr(core._Call, "observe", counting)
    run(tmp_path / "a", 10, bucketed=True, syncs=1)
    assert observed == ["big"]
    observed.clear()
    run(tmp_path / "b", 10, bucketed=False, syncs=1)
    assert len(observed) == len(mixed_stream(10))


def test_a_write_from_another_thread_while_tensors_wait_in_the_bucket(tapped: None, tmp_path: Path) -> None:
    """A loader thread writing an earlier tensor drains the bucket the stream is still filling: found by its
    address, and no tensor the stream adds meanwhile is lost."""
    tap.configure(tmp_path, digest_threads=2)

    class Racing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ParameterList(nn.Parameter(torch.zeros(H), requires_grad=False) for _ in range(400))

        def load_weights(self, weights: Any) -> None:
            params = dict(self.named_parameters())
            seen: list[tuple[str, torch.Tensor]] = []
            with ThreadPoolExecutor(2) as pool:
                for name, tensor in weights:
                    seen.append((name, tensor))
                    if len(seen) >= 2:  # the one before, written by a worker while the stream goes on
                        old_name, old = seen[-2]
                        param = params[old_name]
                        pool.submit(getattr(param, "weight_loader", default_loader), param, old)
                last_name, last = seen[-1]
                param = params[last_name]
                getattr(param, "weight_loader", default_loader)(param, last)

    tap.install(Racing)
    try:
        stream = [(f"norms.{i}", torch.full((H,), float(i))) for i in range(400)]
        Racing().load_weights(iter(stream))
    finally:
        tap.uninstall(Racing)
    record = record_of(tmp_path, 0)
    assert [t.name for t in record.tensors] == [name for name, _ in stream]
    assert all(t.wrote == [t.name] for t in record.tensors), [t for t in record.tensors if t.wrote != [t.name]]
    assert all(p.writes == 1 for p in record.params.values())


# ---- describe_batch's one-dtype batch (the common bucket): maps instead of a loop per tensor ------------------

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.uint8, torch.bool]
_DTYPES += [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_a_batch_of_one_dtype_is_described_as_one_tensor_at_a_time(dtype: torch.dtype, algorithm: str) -> None:
    from weightcheck.tap.digesting import describe_batch, describe_tensor

    pytest.importorskip("xxhash")
    generator = torch.Generator().manual_seed(3)
    values = [torch.randn(n, generator=generator) * 3 for n in (1, 7, 64, 1000)]
    values += [torch.zeros(5), -torch.zeros(5), torch.full((3,), -1e-3), torch.full((4,), 65504.0)]
    if dtype.is_floating_point:
        for bad in (float("nan"), float("inf"), -float("inf")):
            planted = torch.randn(9, generator=generator)
            planted[4] = bad
            values.append(planted)
    cases = [value.to(dtype) for value in values]
    reference = [describe_tensor(t, algorithm) for t in cases]
    assert describe_batch(cases, algorithm) == reference
    # Into the tap's own entries (shape already set, a tuple): the same values, the entry's shape kept.
    entries = [{"t": "tensor", "dtype": None, "shape": tuple(t.shape), algorithm: None} for t in cases]
    describe_batch(cases, algorithm, into=entries)
    assert [{**e, "shape": list(e["shape"])} for e in entries] == [{"t": "tensor", **r} for r in reference]


class Uniform(nn.Module):
    """One dtype in, each tensor written once as it comes (the bucket's common case, credited in one pass); one
    parameter is FP8, so that the BF16 tensor written into it is a cast."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(torch.zeros(H, dtype=torch.float8_e4m3fn if i == 3 else torch.bfloat16), requires_grad=False)
            for i in range(count)
        )

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in params:
                param = params[name]
                getattr(param, "weight_loader", default_loader)(param, tensor)


def test_the_common_bucket_credits_each_write_and_a_cast(tmp_path: Path) -> None:
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(Uniform)
    try:
        out = []
        for bucketed in (True, False):
            root = tmp_path / str(bucketed)
            tap.configure(root, synchronous_digest=not bucketed)
            engine = Uniform(50)
            generator = torch.Generator().manual_seed(5)
            stream = [(f"weights.{i}", torch.randn(H, generator=generator).to(torch.bfloat16)) for i in range(50)]
            for _ in range(2):
                engine.load_weights(iter(stream))
            tap.configure(None)
            out.append([comparable(record_of(root, seq)) for seq in range(2)])
    finally:
        tap.uninstall(Uniform)
        tap.set_engine_hooks(tap.EngineHooks())
    assert out[0] == out[1]
    _, tensors, params = out[0][1]
    assert params["weights.3"]["cast_from"] == ["BF16"] and params["weights.4"]["cast_from"] == []
    assert all(p["writes"] == 1 for p in params.values())
    assert all(t["wrote"] == [t["name"]] for t in tensors)


def test_digests_stay_with_their_tensors_when_loader_threads_drain_the_bucket(tmp_path: Path) -> None:
    """Tensors that skip the bucket (a `torch.Tensor` subclass here) join the digest batch on the stream's thread
    while loader threads drain the bucket into the same batch: every digest must still be its own tensor's."""
    from weightcheck.digest import digest_tensor

    class Threaded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ParameterList(nn.Parameter(torch.zeros(H), requires_grad=False) for _ in range(2000))

        def load_weights(self, weights: Any) -> None:
            params = dict(self.named_parameters())
            with ThreadPoolExecutor(3) as pool:
                previous: tuple[str, torch.Tensor] | None = None
                for name, tensor in weights:
                    if previous is not None:  # written by a worker, the stream going on meanwhile
                        param = params[previous[0]]
                        pool.submit(getattr(param, "weight_loader", default_loader), param, previous[1])
                    previous = (name, tensor)
                assert previous is not None
                param = params[previous[0]]
                getattr(param, "weight_loader", default_loader)(param, previous[1])

    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(Threaded)
    tap.configure(tmp_path, digest_threads=2)
    try:
        generator = torch.Generator().manual_seed(7)
        stream = []
        for i in range(2000):
            value = torch.randn(H, generator=generator)
            stream.append((f"norms.{i}", nn.Parameter(value, requires_grad=False) if i % 3 == 0 else value))
        Threaded().load_weights(iter(stream))
    finally:
        tap.uninstall(Threaded)
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())
    record = record_of(tmp_path, 0)
    assert [t.name for t in record.tensors] == [name for name, _ in stream]
    for entry, (_, tensor) in zip(record.tensors, stream, strict=True):
        assert entry.hexdigest == digest_tensor(tensor.detach(), entry.algorithm).hexdigest, entry.name
        assert entry.wrote == [entry.name]
    assert record.calls[0].names == 2000


# ---- param lines reused from an earlier sync where the parameter's coverage is the same ----------------------


def test_param_lines_are_reused_only_when_every_field_is_the_same() -> None:
    from weightcheck.tap.coverage import ParamCoverage, param_line_bytes, param_lines
    from weightcheck.tap.records import encode_bytes, encode_lines

    def fresh() -> dict[str, ParamCoverage]:
        return {
            "b.plain": ParamCoverage("BF16", (4, 2), True, writes=1),
            "a.stacked": ParamCoverage("BF16", (6, 2), True, 3, ["k", "q", "v"], {"v", "k", "q"}),
            "c.experts": ParamCoverage("BF16", (8, 2), True, 2, ["w1", "w3"], {"w3", "w1"}, 4, {3, 0}),
            "d.cast": ParamCoverage("F8_E4M3", (2,), True, 1, cast_from={"BF16"}),
            "e.optional": ParamCoverage("F32", (), False, optional=True),
        }

    changes = [
        lambda p: None,  # the same again: every line from the cache
        lambda p: setattr(p["b.plain"], "writes", 2),
        lambda p: setattr(p["a.stacked"], "shards_written", {"k", "q"}),
        lambda p: setattr(p["c.experts"], "experts_written", {0}),
        lambda p: setattr(p["c.experts"], "experts_local", 2),
        lambda p: setattr(p["d.cast"], "cast_from", frozenset()),
        lambda p: setattr(p["e.optional"], "optional", False),
        lambda p: setattr(p["e.optional"], "tracked", True),
        lambda p: setattr(p["b.plain"], "shape", (2, 4)),
        lambda p: setattr(p["b.plain"], "dtype", "F16"),
        lambda p: setattr(p["a.stacked"], "shards_expected", None),
        lambda p: p.update({"0.new": ParamCoverage("F32", (1,), True)}),
    ]
    for change in changes:  # each sync: fresh coverage objects, as the tap makes them
        params = fresh()
        change(params)
        assert param_line_bytes(params, encode_bytes) == encode_lines(param_lines(params))


def test_a_profiled_sync_counts_the_drains_as_bookkeeping(
    tapped: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`WEIGHTCHECK_PROFILE`: the bookkeeping the hook defers to the drains is counted when they run (less the
    digest time they add, which is its own stage), and the tensor count includes the bucketed tensors."""
    seen: list[float] = []
    original = core._Call._drain_timer

    def timer(self: Any, token: Any) -> Any:
        before = self.profile.seconds["bookkeeping"]
        out = original(self, token)
        if token is not None:
            seen.append(self.profile.seconds["bookkeeping"] - before)
        return out

    monkeypatch.setattr(core._Call, "_drain_timer", timer)
    tap.configure(tmp_path, profile=True)
    stream = mixed_stream(5000)
    Mixed(5000).load_weights(iter(stream))
    tap.configure(None)
    record = record_of(tmp_path, 0)
    assert record.profile is not None and record.profile["tensors"] == len(stream)
    assert len(seen) >= 2 and all(added >= 0 for added in seen) and sum(seen) > 0  # at "big" and at the end
    assert record.profile["seconds"]["bookkeeping"] >= sum(seen)


def test_a_bulk_installed_sync_records_only_its_own_writes(tapped: None, tmp_path: Path) -> None:
    """From the second sync on, the bulk install files the last sync's coverages again, reset: nothing a sync
    wrote (writes, shards, experts, a cast) may show in a later sync that did not write it."""
    tap.configure(tmp_path, digest_threads=2)
    engine = Mixed(10)
    stream = mixed_stream(10)
    kept = {"norms.0", "norms.1", "embed"}
    partial = [(name, tensor) for name, tensor in stream if name in kept]
    for weights in (stream, stream, partial, partial, stream):  # 0: full install; 1-4: in bulk
        engine.load_weights(iter(weights))
    tap.configure(None)
    full, full_bulk, first_partial, second_partial, full_again = (record_of(tmp_path, seq) for seq in range(5))
    assert comparable(full_bulk)[2] == comparable(full)[2] == comparable(full_again)[2]
    assert comparable(first_partial)[2] == comparable(second_partial)[2]
    params = first_partial.params
    assert {name for name, p in params.items() if p.writes} == {"norms.0", "norms.1", "embed", "head"}
    assert params["qkv.weight"].shards_written == [] and params["experts.w2_weight"].experts_written == []
    assert params["fp8"].cast_from == [] and full.params["fp8"].cast_from == ["BF16"]
    assert full.params["qkv.weight"].shards_written == ["k", "q", "v"]
