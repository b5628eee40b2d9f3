"""The tap's cheap per-tensor path (issue #22): small incoming tensors are filed into the coverage index in
batches, the common write takes a short path, and the cyclic GC is paused only inside the tap's own loops.
These check that the shortcuts change nothing a record says, and leave the engine's GC as they found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from weightcheck import tap
from weightcheck.digest import digest_tensor
from weightcheck.tap.records import read_record

COUNT = 300  # more than the filing queue (64) and the recent window (64): every path is taken


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    param.data.copy_(loaded_weight)


class ManySmall(nn.Module):
    """Many small parameters written by the default loader, as SGLang's `load_weights` does for unstacked names.
    `late=True` reads the whole stream first and writes afterwards (a loader that collects, then writes): then
    no write is of the tensor just received, and every one is attributed through the filed address ranges."""

    def __init__(self, late: bool = False) -> None:
        super().__init__()
        self.late = late
        self.weights = nn.ParameterList(
            nn.Parameter(torch.zeros(16, dtype=torch.bfloat16), requires_grad=False) for _ in range(COUNT)
        )

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        items = list(weights) if self.late else weights
        for name, tensor in items:
            if name in params:  # an unknown name is dropped silently, as SGLang does
                param = params[name]
                getattr(param, "weight_loader", default_loader)(param, tensor)


def small_stream(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = [(f"weights.{i}", torch.randn(16, generator=generator).to(torch.bfloat16)) for i in range(COUNT)]
    out[7] = (out[7][0], torch.zeros(16, dtype=torch.bfloat16))
    out[9] = (out[9][0], torch.full((16,), float("nan"), dtype=torch.bfloat16))
    out.insert(150, ("not.a.parameter", torch.ones(16, dtype=torch.bfloat16)))
    return out


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "records"
    tap.configure(root, digest_threads=2)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(ManySmall)
    yield root
    tap.uninstall(ManySmall)
    tap.configure(None)
    tap.set_engine_hooks(tap.EngineHooks())


def only_record(root: Path, seq: int) -> tap.SyncRecord:
    (path,) = (root / f"sync-{seq:05d}").glob("*.jsonl")
    return read_record(path)


@pytest.mark.parametrize("late", [False, True], ids=["write-as-received", "write-after-reading-all"])
def test_every_small_tensor_is_recorded_and_attributed(records: Path, late: bool) -> None:
    engine = ManySmall(late=late)
    stream = small_stream()
    for seq in range(2):  # the second sync puts the cached wrappers back (the inlined path)
        engine.load_weights(iter(stream))
        record = only_record(records, seq)
        assert [t.name for t in record.tensors] == [name for name, _ in stream]
        for entry, (name, tensor) in zip(record.tensors, stream, strict=True):
            assert entry.hexdigest == digest_tensor(tensor, entry.algorithm).hexdigest
            assert entry.shape == (16,)
            assert entry.wrote == ([] if name == "not.a.parameter" else [name]), (seq, name)
        by_name = {t.name: t for t in record.tensors}
        assert by_name["weights.7"].zeros is True and by_name["weights.8"].zeros is False
        assert by_name["weights.9"].nonfinite == 16 and by_name["weights.8"].nonfinite == 0
        assert all(p.tracked and p.writes == 1 for p in record.params.values())
        assert len(record.params) == COUNT
        assert not any(c.unattributed_writes for c in record.calls)
    for _, param in engine.named_parameters():  # the engine's loaders are back (none: the default loader)
        assert "weight_loader" not in param.__dict__


def test_a_parameter_never_written_is_recorded_as_such(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()[:-1]))  # the last parameter is not sent
    record = only_record(records, 0)
    writes = {p.name: p.writes for p in record.params.values()}
    assert writes[f"weights.{COUNT - 1}"] == 0
    assert sum(1 for w in writes.values() if w == 1) == COUNT - 1


@pytest.mark.parametrize("enabled", [True, False], ids=["gc-on", "gc-off"])
def test_the_engines_garbage_collector_is_left_as_it_was(records: Path, enabled: bool) -> None:
    engine = ManySmall(late=True)  # the late writes file the queue from inside a loader call
    was = gc.isenabled()
    try:
        if enabled:
            gc.enable()
        else:
            gc.disable()
        engine.load_weights(iter(small_stream()))
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()
    assert only_record(records, 0).tensors


def test_entries_stay_out_of_the_collectors_way(records: Path) -> None:
    """The per-tensor entries hold only atomic values and tuples, so the collector stops tracking them: a sync
    of tens of thousands of tensors would otherwise make every collection the engine triggers traverse them."""
    from weightcheck.tap import core

    kept: dict[str, Any] = {}
    original = core._write_record

    def capture(current: Any, config: Any, **kwargs: Any) -> Any:
        kept["entries"] = list(current.entries.values())
        kept["blocks"] = list(current.entries.blocks)  # a big drain's entries, as columns (schema 1.2)
        return original(current, config, **kwargs)

    core._write_record = capture  # type: ignore[assignment]
    try:
        ManySmall().load_weights(iter(small_stream()))
    finally:
        core._write_record = original  # type: ignore[assignment]
    entries, blocks = kept["entries"], kept["blocks"]
    assert len(entries) + sum(map(len, blocks)) == COUNT + 1
    gc.collect()
    assert not any(gc.is_tracked(entry) for entry in entries)
    # A block is a few lists for hundreds of tensors; what it holds per tensor (tuples, strings) is untracked.
    assert len(blocks) <= 2
    assert not any(gc.is_tracked(value) for block in blocks for value in (*block.shapes, *block.wrote))


# ---- loaders put back in bulk at a sync whose model did not change (weightcheck.tap.wrapplan) ----------------


def _params_seen(record: tap.SyncRecord) -> dict[str, tuple[Any, ...]]:
    return {
        p.name: (p.dtype, p.shape, p.tracked, p.writes, p.shards_expected, p.shards_written, p.optional)
        for p in record.params.values()
    }


def test_a_bulk_installed_sync_records_what_a_full_install_records(records: Path) -> None:
    engine = ManySmall()
    engine.weights[3].weight_loader = default_loader  # one loader of its own: restored, not removed
    stream = small_stream()
    for _ in range(3):  # sync 0 installs one by one, syncs 1 and 2 in bulk
        engine.load_weights(iter(stream))
    first, *later = (only_record(records, seq) for seq in range(3))
    for record in later:
        assert _params_seen(record) == _params_seen(first)
        assert [(t.name, t.wrote) for t in record.tensors] == [(t.name, t.wrote) for t in first.tensors]
    assert engine.weights[3].__dict__["weight_loader"] is default_loader
    assert all("weight_loader" not in p.__dict__ for i, p in enumerate(engine.weights) if i != 3)


def test_a_parameter_replaced_between_syncs_is_wrapped_afresh(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()))
    engine.weights[5] = nn.Parameter(torch.zeros(16, dtype=torch.bfloat16), requires_grad=False)
    engine.load_weights(iter(small_stream()))
    record = only_record(records, 1)
    assert record.params["weights.5"].tracked and record.params["weights.5"].writes == 1
    assert next(t for t in record.tensors if t.name == "weights.5").wrote == ["weights.5"]


def test_a_parameter_replaced_between_two_calls_of_a_sync_is_wrapped(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()))  # sync 0: the plan
    stream = small_stream()
    with tap.sync():
        engine.load_weights(iter(stream[:100]))
        engine.weights[250] = nn.Parameter(torch.zeros(16, dtype=torch.bfloat16), requires_grad=False)
        engine.load_weights(iter(stream[100:]))
    record = only_record(records, 1)
    assert all(p.tracked and p.writes == 1 for p in record.params.values())
    assert next(t for t in record.tensors if t.name == "weights.250").wrote == ["weights.250"]


def test_a_loader_set_between_syncs_is_the_one_wrapped_and_restored(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()))
    called: list[str] = []

    def own_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        called.append("own")
        param.data.copy_(loaded_weight)

    engine.weights[4].weight_loader = own_loader
    engine.load_weights(iter(small_stream()))
    assert called == ["own"]
    assert only_record(records, 1).params["weights.4"].writes == 1
    assert engine.weights[4].__dict__["weight_loader"] is own_loader


def test_a_shape_changed_in_place_between_syncs_is_recorded(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()))
    engine.weights[6].data = torch.zeros(1, 16, dtype=torch.bfloat16)  # (the copy broadcasts)
    engine.weights[8].data = torch.zeros(16, dtype=torch.float32)
    engine.load_weights(iter(small_stream()))
    record = only_record(records, 1)
    assert record.params["weights.6"].shape == (1, 16)
    assert record.params["weights.8"].dtype == "F32"


def test_a_parameter_marked_optional_between_syncs_is_recorded_optional(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()))
    engine.weights[2]._skip_weight_check = True
    engine.load_weights(iter(small_stream()))
    assert only_record(records, 1).params["weights.2"].optional is True
    assert only_record(records, 0).params["weights.2"].optional is False


def test_a_module_added_between_syncs_is_wrapped(records: Path) -> None:
    engine = ManySmall()
    engine.load_weights(iter(small_stream()))
    engine.extra = nn.Linear(2, 2, bias=False)
    engine.extra.weight.requires_grad_(False)
    stream = [*small_stream(), ("extra.weight", torch.ones(2, 2))]
    engine.load_weights(iter(stream))
    record = only_record(records, 1)
    assert record.params["extra.weight"].tracked and record.params["extra.weight"].writes == 1
    assert record.tensors[-1].wrote == ["extra.weight"]


# ---- the record's tensor and param lines in one orjson call (records.encode_lines) ---------------------------


@pytest.mark.parametrize(
    "name",
    ["plain", 'a},{"t":"tensor', 'q"uote', "back\\slash\\", '\\"},{"t":"', "ünï\u2028code", "tab\tnew\nline", ""],
)
def test_lines_encoded_together_are_the_bytes_of_lines_encoded_one_by_one(name: str) -> None:
    from weightcheck.tap.records import encode_bytes, encode_lines

    docs: list[dict[str, Any]] = [
        {"t": "tensor", "seq": i, "name": name * i, "wrote": (name, f"{name}:q"), "shape": (i, 2), "zeros": None}
        for i in range(5)
    ]
    assert encode_lines(docs) == b"".join(map(encode_bytes, docs))
    assert b"".join(map(encode_bytes, docs)).count(b"\n") == len(docs)


class _Odd(str):
    pass


@pytest.mark.parametrize(
    "odd",
    [
        {"seq": 1, "t": "tensor"},  # "t" not first: no boundary to cut at
        {"t": "tensor", "name": _Odd("subclass")},  # a str subclass (orjson writes it as a str)
        {"t": "tensor", "seq": 1 << 70},  # an integer orjson refuses
        {"t": "tensor", "nested": [{"t": "x"}, {"t": "y"}]},  # a boundary-like sequence inside a line
    ],
    ids=["t-not-first", "str-subclass", "huge-int", "nested-objects"],
)
def test_lines_that_cannot_be_cut_safely_are_encoded_one_by_one(odd: dict[str, Any]) -> None:
    from weightcheck.tap.records import encode_bytes, encode_lines

    for docs in ([{"t": "tensor", "seq": 0}, odd, {"t": "param", "name": "w"}], [odd, {"t": "param", "name": "w"}]):
        assert encode_lines(docs) == b"".join(map(encode_bytes, docs))


def test_param_lines_built_inline_are_the_as_line_lines() -> None:
    from weightcheck.tap.coverage import ParamCoverage, param_lines

    params = {
        "b.plain": ParamCoverage("BF16", (4, 2), True, writes=1),
        "a.stacked": ParamCoverage("BF16", (6, 2), True, 3, ["k", "q", "v"], {"v", "k", "q"}),
        "c.experts": ParamCoverage("BF16", (8, 2), True, 2, ["w1", "w3"], {"w3", "w1"}, 4, {3, 0}),
        "d.cast": ParamCoverage("F8_E4M3", (2,), True, 1, cast_from={"BF16"}),
        "e.optional": ParamCoverage("F32", (), False, optional=True),
    }
    for _ in range(2):  # the second time through the cached name order
        lines = param_lines(params)
        assert lines == [params[name].as_line(name) for name in sorted(params)]
    params["0.new"] = ParamCoverage("F32", (1,), True)
    assert [line["name"] for line in param_lines(params)] == sorted(params)


def test_an_engine_that_replaces_a_parameter_every_sync_stops_paying_for_plans(
    records: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from weightcheck.tap import coverage

    made: list[int] = []
    original = coverage.ModelWrapping._make_plan

    def counting(self: Any) -> None:
        made.append(1)
        original(self)

    monkeypatch.setattr(coverage.ModelWrapping, "_make_plan", counting)
    engine = ManySmall()
    for _ in range(9):
        engine.weights[5] = nn.Parameter(torch.zeros(16, dtype=torch.bfloat16), requires_grad=False)
        engine.load_weights(iter(small_stream()))
    assert len(made) == 4  # full installs 1, 2, 4 and 8 (each wrapped the replaced parameter afresh)
    for seq in range(9):  # and every sync recorded in full
        record = only_record(records, seq)
        assert all(p.tracked and p.writes == 1 for p in record.params.values())
    made.clear()
    for _ in range(3):  # left alone again: one plan, then bulk installs
        engine.load_weights(iter(small_stream()))
    assert len(made) == 1


class _PropertyParameter(nn.Parameter):
    """SGLang's `BasevLLMParameter` pattern: `weight_loader` is a read-only property over `_weight_loader`."""

    @property
    def weight_loader(self) -> Any:
        return self._weight_loader


def test_read_only_loader_properties_are_wrapped_and_restored_in_bulk(records: Path) -> None:
    from weightcheck.tap import coverage

    engine = ManySmall()
    for i in (0, 10):
        param = _PropertyParameter(torch.zeros(16, dtype=torch.bfloat16), requires_grad=False)
        param._weight_loader = default_loader
        engine.weights[i] = param
    for seq in range(3):  # 0: full install; 1 and 2: bulk
        engine.load_weights(iter(small_stream()))
        record = only_record(records, seq)
        assert record.params["weights.0"].tracked and record.params["weights.0"].writes == 1
        assert record.params["weights.10"].writes == 1
        assert engine.weights[0].__dict__["_weight_loader"] is default_loader
        assert coverage._wrapper_cache(engine).full_installs == (1 if seq == 0 else 0)  # bulk from sync 1 on
