"""The tap's device batch (issue #22): GPU tensors digested and reduced on their device, collected with one copy
per call. Its entries must be exactly what `describe_tensor` records, and a tapped sync through it must record
exactly what the one-tensor-at-a-time path records. Run here on CPU tensors (the kernels are device-agnostic;
`takes` admits CUDA tensors only, so the tap-level test widens it); tests/test_fused_digest_cuda.py repeats the
entry comparison on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_tap_bucket import Mixed, comparable, mixed_stream, record_of, tapped  # noqa: F401  (its fixture)

from weightcheck import tap
from weightcheck.tap import core
from weightcheck.tap.devicebatch import TAKEN, DeviceBatch
from weightcheck.tap.digesting import describe_tensor


def special_tensors() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    out: list[tuple[str, torch.Tensor]] = []
    for name in TAKEN:
        dtype = getattr(torch, name)
        if dtype.is_floating_point:
            base = torch.randn(37, 5, generator=generator).to(dtype)
        elif dtype == torch.bool:
            base = torch.randint(0, 2, (37, 5), generator=generator).to(torch.bool)
        else:
            base = torch.randint(-100 if dtype.is_signed else 0, 100, (37, 5), generator=generator).to(dtype)
        out += [(f"{name}", base), (f"{name}-t", base.t()), (f"{name}-slice", base[3:30:2, 1:]),
                (f"{name}-zeros", torch.zeros(7, 3, dtype=dtype)), (f"{name}-empty", torch.zeros(0, 4, dtype=dtype)),
                (f"{name}-odd-bytes", base.reshape(-1)[:7])]  # fmt: skip
        if dtype.is_floating_point:
            special = base.clone()
            special[0, 0], special[1, 1], special[2, 2] = float("nan"), float("inf"), float("-inf")
            out += [(f"{name}-nonfinite", special), (f"{name}-minus-zero", torch.full((4,), -0.0, dtype=dtype))]
    return out


def expected(tensor: torch.Tensor) -> dict[str, Any]:
    out = describe_tensor(tensor, "posmix128")
    out["shape"] = tuple(out["shape"])
    return out


@pytest.mark.parametrize(("label", "tensor"), special_tensors(), ids=[label for label, _ in special_tensors()])
def test_an_entry_is_what_describe_tensor_records(label: str, tensor: torch.Tensor) -> None:
    batch = DeviceBatch()
    entry: dict[str, Any] = {"name": label}
    batch.add(entry, tensor)
    batch.collect("posmix128")
    assert not batch.pending
    assert {k: entry[k] for k in ("dtype", "shape", "posmix128", "zeros", "nonfinite")} == expected(tensor)


def test_many_entries_are_collected_with_their_own_values() -> None:
    tensors = [t for _, t in special_tensors()]
    batch = DeviceBatch()
    entries: list[dict[str, Any]] = [{} for _ in tensors]
    for entry, tensor in zip(entries, tensors, strict=True):
        batch.add(entry, tensor)
    batch.collect("posmix128")
    for entry, tensor in zip(entries, tensors, strict=True):
        assert {k: entry[k] for k in ("dtype", "shape", "posmix128", "zeros", "nonfinite")} == expected(tensor)


def test_a_device_error_at_collection_is_recorded_per_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = DeviceBatch()
    entry: dict[str, Any] = {}
    batch.add(entry, torch.ones(4))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "cat", broken)
    batch.collect("posmix128")
    assert entry["posmix128"] is None and entry["zeros"] is None and entry["nonfinite"] is None
    assert entry["error"].startswith("cannot digest: CUDA error")


def test_only_dense_cuda_tensors_of_the_known_dtypes_are_taken() -> None:
    assert not DeviceBatch.takes(torch.ones(3))  # CPU: the bucket and the one-pass path
    assert not DeviceBatch.takes(torch.ones(3, device="meta"))
    assert "float8_e4m3fn" not in TAKEN and "complex64" not in TAKEN


def take_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """`DeviceBatch.takes` widened to CPU tensors of the taken dtypes (the kernels are device-agnostic)."""
    monkeypatch.setattr(DeviceBatch, "takes", staticmethod(lambda t: str(t.dtype).removeprefix("torch.") in TAKEN))


@pytest.fixture
def tapped_on_device(tapped: None, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811  (the fixture)
    """`Mixed` tapped (test_tap_bucket's fixture), every tensor through `observe`, and every tensor of a taken
    dtype through the device batch (on CPU)."""
    monkeypatch.setattr(core, "_SMALL_TENSOR_BYTES", -1)
    take_cpu_tensors(monkeypatch)


def run(root: Path, *, synchronous: bool) -> list[tuple[Any, ...]]:
    tap.configure(root, digest_threads=2, synchronous_digest=synchronous, digest="posmix128")
    engine = Mixed(40)
    stream = mixed_stream(40)
    for _ in range(2):
        engine.load_weights(iter(stream))
    tap.configure(None)
    return [comparable(record_of(root, seq)) for seq in range(2)]


def test_a_sync_through_the_device_batch_records_what_the_one_at_a_time_path_does(
    tapped_on_device: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    added: list[int] = []
    original = DeviceBatch.add

    def counting(self: DeviceBatch, entry: dict[str, Any], tensor: Any) -> None:
        added.append(1)
        original(self, entry, tensor)

    monkeypatch.setattr(DeviceBatch, "add", counting)
    batched = run(tmp_path / "batched", synchronous=False)
    assert len(added) == 2 * len(mixed_stream(40))  # every tensor of the stream took the device batch
    assert batched == run(tmp_path / "reference", synchronous=True)
    tensors = batched[0][1]
    assert all(t["hexdigest"] and t["algorithm"] == "posmix128" and not t["error"] for t in tensors)


def test_kernels_that_cannot_be_queued_fall_back_to_the_digest_threads(
    tapped_on_device: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: DeviceBatch, entry: dict[str, Any], tensor: Any) -> None:
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(DeviceBatch, "add", broken)
    assert run(tmp_path / "fallback", synchronous=False) == run(tmp_path / "reference", synchronous=True)


def test_the_engine_state_through_the_device_batch_is_the_one_at_a_time_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch import nn

    from weightcheck.tap.state import engine_state

    model = Mixed(12)
    with torch.no_grad():
        for index, param in enumerate(model.parameters()):
            param.copy_(torch.randn(param.shape).to(param.dtype)) if index % 3 else param.zero_()
    model.register_buffer("steps", torch.arange(5))
    model.extra = nn.Linear(3, 2).to(torch.bfloat16)
    model.extra.weight.data[0, 0] = float("nan")
    reference = engine_state(model, "posmix128")  # CPU tensors: `takes` refuses them, one at a time
    take_cpu_tensors(monkeypatch)
    batched = engine_state(model, "posmix128")
    normalize = [{**line, "shape": list(line["shape"])} for line in batched]
    assert normalize == reference
    assert [list(line) for line in batched] == [list(line) for line in reference]  # the same key order
    assert any(line["nonfinite"] for line in batched) and any(line["zeros"] for line in batched)
