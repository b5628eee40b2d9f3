"""The tap's byte path: the one-pass digest + statistics equals the reference description whatever the slice
boundaries and the bytes short of a 64-bit word, and with no digest threads (the default on a machine of at
most 2 cores) each large tensor is digested on the loading thread as it passes, with the same record."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xxhash")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from weightcheck import tap  # noqa: E402
from weightcheck.tap import core, digesting  # noqa: E402
from weightcheck.tap.digesting import SMALL_TENSOR_BYTES, describe_one_pass, describe_tensor  # noqa: E402
from weightcheck.tap.records import read_record  # noqa: E402

_FLOATS = ["float32", "float16", "bfloat16", "float64"]
_OTHERS = ["int8", "uint8", "int16", "int32", "int64", "bool", "float8_e4m3fn"]
_PLANTS = [0.0, -0.0, 1.0, 2.0, -2.0, 3.5, -65504.0, float("inf"), -float("inf"), float("nan"), -float("nan")]


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(_FLOATS + _OTHERS),
    numel=st.integers(min_value=1, max_value=97),
    base=st.sampled_from([0.0, 0.01, -1e-3, 1.0]),
    plants=st.lists(st.tuples(st.integers(min_value=0, max_value=96), st.sampled_from(_PLANTS)), max_size=3),
    slice_bytes=st.sampled_from([8, 16, 24, 64, 1 << 20]),
)
def test_one_pass_equals_the_reference_at_every_slice_boundary_and_tail(
    dtype: str, numel: int, base: float, plants: list[tuple[int, float]], slice_bytes: int
) -> None:
    # Slices of a few words put the planted values on every side of a slice boundary, in the last slice and in
    # the bytes short of a word (an odd number of 1- and 2-byte elements); the reference reads the values.
    values = torch.full((numel,), base)
    for where, value in plants:
        values[where % numel] = value
    tensor = values.to(getattr(torch, dtype))
    kept = digesting._PASS_SLICE_BYTES
    digesting._PASS_SLICE_BYTES = slice_bytes
    try:
        got = describe_one_pass(tensor, "xxh3_128")
    finally:
        digesting._PASS_SLICE_BYTES = kept
    assert got == describe_tensor(tensor, "xxh3_128")


def test_a_nonfinite_value_in_the_tail_word_alone_is_counted() -> None:
    # 5 BF16 values: one full word and a 2-byte tail; the tail holds the only NaN (a miss here would be "finite").
    tensor = torch.tensor([0.01, 0.01, 0.01, 0.01, float("nan")]).to(torch.bfloat16)
    got = describe_one_pass(tensor, "xxh3_128")
    assert (got["zeros"], got["nonfinite"]) == (False, 1)
    assert got == describe_tensor(tensor, "xxh3_128")


def test_default_digest_threads_follow_the_cores_the_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert core.default_digest_threads() == 0
    assert tap.configure(Path("unused"), digest="xxh3_128").digest_threads == 0  # type: ignore[union-attr]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)), raising=False)
    assert core.default_digest_threads() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert core.default_digest_threads() == 4
    assert tap.configure(Path("unused"), digest_threads=0).digest_threads == 0  # type: ignore[union-attr]
    assert tap.configure(Path("unused"), digest_threads=2).digest_threads == 2  # type: ignore[union-attr]
    env = {"WEIGHTCHECK_DIR": "unused", "WEIGHTCHECK_DIGEST_THREADS": "0"}
    assert core.config_from_env(env).digest_threads == 0  # type: ignore[union-attr]
    assert core.config_from_env({"WEIGHTCHECK_DIR": "unused"}).digest_threads == 4  # type: ignore[union-attr]
    tap.configure(None)


def _loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded)


_BIG = SMALL_TENSOR_BYTES // 4 + 1  # float32 elements: one more than the small-tensor batch takes


class _Engine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.ParameterList(nn.Parameter(torch.empty(_BIG), requires_grad=False) for _ in range(3))
        self.small = nn.ParameterList(nn.Parameter(torch.empty(4), requires_grad=False) for _ in range(3))

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            _loader(params[name], tensor)


def _reused_buffer_stream() -> Any:
    """A sender that refills one buffer for every large tensor (what `synchronous_digest` was for): only a digest
    taken as each tensor passes sees each content."""
    buffer = torch.empty(_BIG)
    for index in range(3):
        buffer.fill_(index + 0.5)
        if index == 1:
            buffer[-1] = float("inf")
        yield f"big.{index}", buffer
        yield f"small.{index}", torch.full((4,), float(index))
    buffer.zero_()


def _expected() -> dict[str, tuple[Any, ...]]:
    out = {}
    for index in range(3):
        big = torch.full((_BIG,), index + 0.5)
        if index == 1:
            big[-1] = float("inf")
        for name, tensor in ((f"big.{index}", big), (f"small.{index}", torch.full((4,), float(index)))):
            ref = describe_tensor(tensor, "xxh3_128")
            out[name] = (ref["xxh3_128"], ref["zeros"], ref["nonfinite"])
    return out


def test_without_digest_threads_each_large_tensor_is_digested_as_it_passes(tmp_path: Path) -> None:
    tap.set_engine_hooks(tap.EngineHooks(default_loader=_loader))
    tap.install(_Engine)
    try:
        tap.configure(tmp_path / "records", digest_threads=0, digest="xxh3_128")
        _Engine().load_weights(_reused_buffer_stream())
        record = read_record(tap.last_record_path())
        got = {entry.name: (entry.hexdigest, entry.zeros, entry.nonfinite) for entry in record.tensors}
        assert got == _expected()
    finally:
        tap.configure(None)
        tap.uninstall(_Engine)
        tap.set_engine_hooks(tap.EngineHooks())


def test_with_and_without_digest_threads_the_records_agree(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    stream = [(f"big.{i}", torch.randn(_BIG, generator=generator)) for i in range(3)]
    stream += [(f"small.{i}", torch.randn(4, generator=generator)) for i in range(3)]
    stream[1][1][7] = float("nan")
    tap.set_engine_hooks(tap.EngineHooks(default_loader=_loader))
    tap.install(_Engine)
    lines = []
    try:
        for threads in (0, 2):
            tap.configure(tmp_path / f"records-{threads}", digest_threads=threads, digest="xxh3_128")
            _Engine().load_weights(iter(stream))
            record = read_record(tap.last_record_path())
            lines.append([(e.seq, e.name, e.hexdigest, e.zeros, e.nonfinite, e.shape) for e in record.tensors])
    finally:
        tap.configure(None)
        tap.uninstall(_Engine)
        tap.set_engine_hooks(tap.EngineHooks())
    assert lines[0] == lines[1]
    assert [line[4] for line in lines[0]][:2] == [0, 1]
