"""The tap's cheap path gives the records the former path gave: the one-pass digest + statistics, the batched
small tensors, the batched fingerprints, loaders wrapped once per sync; and `WEIGHTCHECK_PROFILE=1` writes
where the time went, which `verify` prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from weightcheck import tap  # noqa: E402
from weightcheck.tap.coverage import fingerprint, fingerprints  # noqa: E402
from weightcheck.tap.digesting import (  # noqa: E402
    SMALL_TENSOR_BYTES,
    describe_batch,
    describe_one_pass,
    describe_tensor,
)
from weightcheck.tap.records import profile_notes, read_record  # noqa: E402

_SPECIALS = [0.0, 1.0, float("nan"), float("inf"), -float("inf"), -2.0, -0.0, 3.5, 65504.0, 1e-8]
_DTYPES = [
    "float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "complex64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
    "int64", "uint64", "bool",
]  # fmt: skip


def _cases() -> list[Any]:
    values = torch.tensor(_SPECIALS)
    picks = [list(range(len(_SPECIALS))), [0, 1, 5], [0], [6], [0, 0], [4], [2], [3, 0], []]
    cases = []
    for name in _DTYPES:
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        for pick in picks:
            try:
                cases.append(values[pick].to(dtype))
            except (RuntimeError, TypeError):
                continue
        cases.append(torch.zeros(3, 5, dtype=dtype))
        cases.append(torch.ones(3, 5).to(dtype).t())  # not contiguous
        if name in ("float32", "bfloat16", "float16", "int8"):
            big = torch.zeros(600_000, dtype=torch.float32)
            big[-1] = -float("nan")  # in the last slice of a multi-slice pass, with its sign bit set
            cases.append(big.to(dtype))
        if name in ("float32", "bfloat16", "float16", "float64"):
            # The OR shortcut: slices of small values skip the maxima; a slice with a finite value >= 2 pays
            # for them and must still say "finite"; a NaN/Inf among small values sets the top exponent bit.
            small = torch.full((600_001,), 0.01)
            large_finite = small.clone()
            large_finite[5] = 3.0
            large_finite[-3] = -65504.0
            cases.append(large_finite.to(dtype))
            for bad in (float("inf"), -float("inf"), -float("nan")):
                for where in (2, 600_000):
                    planted = small.clone()
                    planted[where] = bad
                    cases.append(planted.to(dtype))
            tiny_negative = torch.full((7,), -1e-3)  # every sign bit set, no exponent top bit: finite
            cases.append(tiny_negative.to(dtype))
    return cases


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_one_pass_and_batch_equal_the_former_description(algorithm: str) -> None:
    pytest.importorskip("xxhash")
    cases = _cases()
    reference = [describe_tensor(t, algorithm) for t in cases]
    assert [describe_one_pass(t, algorithm) for t in cases] == reference
    assert describe_batch(cases, algorithm) == reference
    # NaN and Inf are found whatever the sign and wherever they sit; the exact count is the former one.
    nan_at_end = next(
        r for t, r in zip(cases, reference, strict=True) if t.dtype == torch.bfloat16 and t.numel() > 1000
    )
    assert nan_at_end["nonfinite"] == 1 and nan_at_end["zeros"] is False


def test_batched_fingerprints_equal_the_single_ones() -> None:
    tensors = [
        torch.randn(5, 12),
        torch.randn(3),
        torch.randn(2, 3, 4).to(torch.bfloat16),
        torch.randn(4, 6).t(),
        torch.tensor(3.0),
        torch.zeros(0, 3),
        torch.randn(7, 20)[2:5],
        torch.arange(30).reshape(5, 6),
        torch.randn(3, 1),
    ]
    got = fingerprints(list(enumerate(tensors)))
    assert {i: fingerprint(t) for i, t in enumerate(tensors) if fingerprint(t) is not None} == got


def _loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded)


class _Small(nn.Module):
    def __init__(self, count: int, size: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(size), requires_grad=False) for _ in range(count))

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in params:
                params[name].weight_loader(params[name], tensor)


@pytest.fixture
def small_engine(tmp_path: Path) -> Any:
    tap.set_engine_hooks(tap.EngineHooks())
    engine = _Small(3000, 4)
    for param in engine.parameters():
        param.weight_loader = _loader
    tap.install(_Small)
    yield engine, tmp_path / "records"
    tap.configure(None)
    tap.uninstall(_Small)


def test_many_small_tensors_and_one_big_are_recorded_like_before(small_engine: Any) -> None:
    engine, records = small_engine
    tap.configure(records)
    stream = [(name, torch.randn(4)) for name, _ in engine.named_parameters()]
    stream[7] = (stream[7][0], torch.full((4,), float("nan")))
    stream.append(("not.in.engine", torch.zeros(SMALL_TENSOR_BYTES)))  # big: a digest thread; dropped
    for _ in range(2):  # the second sync puts the cached wrappers back
        engine.load_weights(iter(stream))
        record = read_record(tap.last_record_path())
        assert len(record.tensors) == len(stream)
        by_seq = {entry.seq: entry for entry in record.tensors}
        for seq, (name, tensor) in enumerate(stream):
            entry = by_seq[seq]
            expected = describe_tensor(tensor, record.header["digest"])
            assert (entry.name, entry.hexdigest, entry.zeros, entry.nonfinite) == (
                name,
                expected[record.header["digest"]],
                expected["zeros"],
                expected["nonfinite"],
            )
        assert by_seq[7].nonfinite == 4
        assert by_seq[len(stream) - 1].wrote == [] and by_seq[len(stream) - 1].zeros is True
        assert all(p.writes == 1 for p in record.params.values())
        # The engine's loaders are its own again after the sync.
        assert all(param.weight_loader is _loader for param in engine.parameters())


class _Stage(_Small):
    """Consumes the whole stream, writes nothing of it, then writes its first tensor from a copy (a late write
    from a loader's thread pool, after thousands of other stages' tensors went by)."""

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        first: tuple[str, torch.Tensor] | None = None
        for name, tensor in weights:
            if first is None:
                first = (name, tensor.clone())
        assert first is not None
        params[first[0]].weight_loader(params[first[0]], first[1])


def test_pipeline_stage_skipping_most_of_the_stream_still_attributes_late_writes(tmp_path: Path) -> None:
    tap.set_engine_hooks(tap.EngineHooks())
    engine = _Stage(1, 4)
    for param in engine.parameters():
        param.weight_loader = _loader
    tap.install(_Stage)
    try:
        tap.configure(tmp_path / "records")
        name = next(n for n, _ in engine.named_parameters())
        engine.load_weights(iter([(name, torch.randn(4))] + [(f"other.{i}", torch.randn(4)) for i in range(3000)]))
        record = read_record(tap.last_record_path())
    finally:
        tap.configure(None)
        tap.uninstall(_Stage)
    assert record.tensors[0].wrote == [name]
    assert all(entry.wrote == [] for entry in record.tensors[1:])


def test_profile_switch_writes_stages_and_verify_prints_them(
    small_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, records = small_engine
    monkeypatch.setenv("WEIGHTCHECK_DIR", str(records))
    monkeypatch.setenv("WEIGHTCHECK_PROFILE", "1")
    tap.configure_from_env()
    engine.load_weights([(name, torch.randn(4)) for name, _ in engine.named_parameters()])
    path = tap.last_record_path()
    end = json.loads(path.read_text().splitlines()[-1])
    stages = end["profile"]["seconds"]
    assert set(stages) == {"bookkeeping", "digest", "stats", "wait", "serialization", "state"}
    assert stages["bookkeeping"] > 0 and stages["digest"] > 0 and end["profile"]["tensors"] == 3000
    record = read_record(path)
    assert record.profile is not None and record.profile["bytes"] == 3000 * 16
    (note,) = profile_notes([record])
    assert note.startswith("tap profile, sync 0 (1 record(s), 3000 tensors") and "bookkeeping" in note

    from weightcheck.verifying import verify

    result = verify(records)
    assert any(n.startswith("tap profile, sync 0") for n in result.notes)
    # Off by default: no profile in the record, nothing printed.
    tap.configure(records)
    engine.load_weights([(name, torch.randn(4)) for name, _ in engine.named_parameters()])
    assert read_record(tap.last_record_path()).profile is None


def test_a_malformed_profile_is_ignored(tmp_path: Path, small_engine: Any) -> None:
    engine, records = small_engine
    tap.configure(records, profile=True)
    engine.load_weights([(name, torch.randn(4)) for name, _ in engine.named_parameters()][:3])
    path = tap.last_record_path()
    lines = path.read_text().splitlines()
    end = json.loads(lines[-1])
    end["profile"] = {"seconds": "lots"}
    path.write_text("\n".join([*lines[:-1], json.dumps(end)]) + "\n")
    assert read_record(path).profile is None


def test_a_parameter_replaced_between_the_calls_of_a_sync_is_still_tracked(small_engine: Any) -> None:
    """Loaders are wrapped once per sync; a parameter the engine re-creates between two update requests (a
    `process_weights_after_loading`) is wrapped at the next call, and the engine gets its own loaders back."""
    engine, records = small_engine
    tap.configure(records)
    names = [name for name, _ in engine.named_parameters()]
    with tap.sync():
        engine.load_weights([(names[0], torch.randn(4))])
        fresh = nn.Parameter(torch.empty(4), requires_grad=False)
        fresh.weight_loader = _loader
        engine.weights[1] = fresh
        engine.load_weights([(names[1], torch.randn(4))])
    record = read_record(tap.last_record_path())
    assert [entry.wrote for entry in record.tensors] == [[names[0]], [names[1]]]
    assert record.params[names[1]].writes == 1 and record.params[names[1]].tracked
    assert fresh.weight_loader is _loader and all(p.weight_loader is _loader for p in engine.parameters())
