"""The fused (one Triton kernel per tensor) posmix128 equals the reference bit for bit, on every recorded dtype.

Runs the kernel under Triton's interpreter (`TRITON_INTERPRET=1`) on CPU: the same kernel source a GPU
compiles, with numpy's wrapping uint64 arithmetic. Skipped where Triton is not installed (a test dependency,
not one of the CPU install; `scripts/test.sh` makes a missing one a failure); the eager torch path and the
stored-bytes path are compared in tests/test_devdigest.py either way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Triton reads TRITON_INTERPRET when triton.language is first imported, and in the main pytest process
# torch or transformers may import Triton before this file is collected: then tl.sum & co. are not the
# interpreter's. So this file runs in a pytest process of its own (marker `triton`, deselected from the main
# run; scripts/test.sh runs it with TRITON_INTERPRET=1 set from the start).
pytestmark = pytest.mark.triton
os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
if os.environ.get("WEIGHTCHECK_REQUIRE_TRITON"):
    import triton  # noqa: F401  (scripts/test.sh sets this: in CI a missing Triton fails, it never skips)
else:
    pytest.importorskip("triton")

from test_tap_devicebatch import tapped, tapped_on_device  # noqa: E402, F401  (fixtures)

from weightcheck.devdigest import posmix128_bytes, posmix128_tensor  # noqa: E402
from weightcheck.fuseddigest import _kernel, posmix128_fused  # noqa: E402
from weightcheck.tensors import safetensors_dtype  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _kernel.cache_clear()  # jit decides interpreter or compiler when the kernel is built


def _stored(tensor: torch.Tensor) -> bytes:
    """The bytes safetensors writes for the tensor (C order, little-endian)."""
    from safetensors.torch import save

    blob = save({"t": tensor.contiguous()})
    header = int.from_bytes(blob[:8], "little")
    return blob[8 + header :]


def _dtypes() -> list[torch.dtype]:
    names = ["bool", "uint8", "int8", "int16", "uint16", "float16", "bfloat16", "int32", "uint32", "float32",
             "complex64", "float64", "int64", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
             "float8_e4m3fnuz", "float8_e5m2fnuz"]  # fmt: skip
    return [getattr(torch, n) for n in names if hasattr(torch, n) and safetensors_dtype(getattr(torch, n))]


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    size = 1
    for d in shape:
        size *= d
    width = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size * width,), dtype=torch.uint8, generator=generator)
    if dtype == torch.bool:
        return (raw % 2).to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
@pytest.mark.parametrize("shape", [(0,), (1,), (3,), (7, 5), (2, 3, 67)], ids=str)
def test_fused_equals_reference_on_every_dtype(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tensor = _random(dtype, shape, seed=sum(shape) + len(str(dtype)))
    reference = posmix128_tensor(tensor)
    assert posmix128_fused(tensor) == reference == posmix128_bytes(_stored(tensor))
    # Several programs with a masked last block: the atomic lane sums in any order give the same digest.
    assert posmix128_fused(tensor, block_words=64) == reference


def test_fused_is_position_sensitive_and_takes_views() -> None:
    tensor = _random(torch.bfloat16, (64, 48), seed=1)
    assert posmix128_fused(tensor) != posmix128_fused(tensor.flip(0).contiguous())
    assert posmix128_fused(tensor.t()) == posmix128_tensor(tensor.t()) != posmix128_fused(tensor)
    flat = _random(torch.uint8, (4099,), seed=2)
    misaligned = flat[1:]  # a byte view that starts off a 4-byte boundary
    assert posmix128_fused(misaligned) == posmix128_bytes(bytes(misaligned.numpy()))
    one = _random(torch.float32, (1000,), seed=3)
    changed = one.clone()
    changed.view(torch.int32)[999] ^= 1  # the last word's lowest bit
    assert posmix128_fused(one) != posmix128_fused(changed)


def test_float4_packed_dtype() -> None:
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch has no float4_e2m1fn_x2")
    tensor = _random(torch.uint8, (5, 9), seed=4).view(torch.float4_e2m1fn_x2)
    assert posmix128_fused(tensor) == posmix128_tensor(tensor) == posmix128_bytes(_stored(tensor.view(torch.uint8)))


# ---- the tap's kernel: the digest and the statistics in one pass (weightcheck.tap.devicebatch) -------------


def _special_values() -> list[tuple[str, torch.Tensor]]:
    from test_tap_devicebatch import special_tensors

    return special_tensors()


@pytest.mark.parametrize(("label", "tensor"), _special_values(), ids=[label for label, _ in _special_values()])
def test_the_tap_kernel_gives_the_digest_and_the_statistics(label: str, tensor: torch.Tensor) -> None:
    from weightcheck.fuseddigest import fused_lanes_and_stats
    from weightcheck.posmix import _byte_view, finalize
    from weightcheck.tap.devicebatch import TAKEN, DeviceBatch, fused_spec
    from weightcheck.tap.digesting import describe_tensor

    name = str(tensor.dtype).removeprefix("torch.")
    spec = fused_spec(tensor.dtype) if name in TAKEN else None
    if spec is None or tensor.numel() == 0:
        pytest.skip("not the fused kernel's (float64 and empty tensors take the eager reductions)")
    data = _byte_view(tensor)
    for block in (64, 1024):  # one program, and many with a masked last block
        a, b, set_words, nonfinite = fused_lanes_and_stats(data, *spec, block_words=block).tolist()
        assert finalize(a, b, data.numel()) == posmix128_tensor(tensor)
        assert (set_words == 0) == (not bool(data.any()))
        want = int((~torch.isfinite(tensor)).sum()) if tensor.is_floating_point() else 0
        assert nonfinite == want
    want_entry = describe_tensor(tensor, "posmix128")
    held = tensor.is_contiguous() and not (tensor.nbytes | tensor.data_ptr()) & 3
    for hold in (False, True):  # launched on arrival; held and launched with others (whole words only)
        entry: dict = {}
        batch = DeviceBatch()
        batch.hold = hold
        batch.add(entry, tensor)  # under the interpreter the batch takes the fused kernel on CPU too
        if hold and held:
            assert not batch.pending and batch.waiting()
        else:
            assert batch.pending[0][3] is True  # it did: the 4th value counts NaN/Inf
        batch.collect("posmix128")
        assert batch.many_launches == (1 if hold and held else 0)
        assert {k: entry[k] for k in ("dtype", "posmix128", "zeros", "nonfinite")} == {
            k: want_entry[k] for k in ("dtype", "posmix128", "zeros", "nonfinite")
        }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("programs", [1, 2, 3, 7, 40])
def test_a_fixed_grid_striding_over_many_blocks(dtype: torch.dtype, programs: int) -> None:
    """Each program takes several steps (1,500 words in blocks of 64: 24 blocks over 1 to 40 programs, the last
    block masked): its lanes' sums, the advancing keys and the counts equal the reference, with NaN/Inf and a
    zero run placed in late steps of different programs."""
    from weightcheck.fuseddigest import fused_lanes_and_stats
    from weightcheck.posmix import _byte_view, finalize
    from weightcheck.tap.devicebatch import fused_spec

    tensor = _random(dtype, (1500 * 4 // torch.empty((), dtype=dtype).element_size(),), seed=programs)
    if dtype.is_floating_point:
        tensor = tensor.float().nan_to_num(0.0, 1.0, -1.0).clamp(-1, 1).to(dtype)
        tensor[-3], tensor[700], tensor[1001] = float("nan"), float("inf"), float("-inf")
    data = _byte_view(tensor)
    a, b, set_words, nonfinite = fused_lanes_and_stats(
        data, *fused_spec(dtype), block_words=64, programs=programs
    ).tolist()
    assert finalize(a, b, data.numel()) == posmix128_tensor(tensor)
    assert set_words == int((data.view(torch.int32) != 0).sum())
    assert nonfinite == (int((~torch.isfinite(tensor)).sum()) if dtype.is_floating_point else 0)


def test_the_device_batch_hands_each_tensor_its_own_zeroed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors past one block of rows (a block of 7 here) each get a fresh row: every entry is its own tensor's
    digest and statistics, not a sum with another's."""
    from weightcheck.tap import devicebatch
    from weightcheck.tap.digesting import describe_tensor

    monkeypatch.setattr(devicebatch, "SLAB_ROWS", 7)
    tensors = [_random(dtype, (5 + i, 3), seed=i) for i, dtype in enumerate([torch.bfloat16, torch.int32] * 9)]
    tensors[4][0, 0] = float("nan")
    batch = devicebatch.DeviceBatch()
    batch.hold = False  # each launched on arrival, into its own row
    entries: list[dict] = [{} for _ in tensors]
    for entry, tensor in zip(entries, tensors, strict=True):
        batch.add(entry, tensor)
    assert all(item[3] for item in batch.pending)  # every one through the fused kernel
    rows = {item[5].data_ptr() for item in batch.pending}
    assert len(rows) == len(tensors)
    batch.collect("posmix128")
    for entry, tensor in zip(entries, tensors, strict=True):
        want = describe_tensor(tensor, "posmix128")
        assert {k: entry[k] for k in ("posmix128", "zeros", "nonfinite")} == {
            k: want[k] for k in ("posmix128", "zeros", "nonfinite")
        }


def test_the_grid_never_gives_a_program_more_steps_than_its_counters_hold() -> None:
    from weightcheck.fuseddigest import INTERPRETER_PROGRAMS, MAX_STEPS, grid_programs

    cpu = torch.device("cpu")
    assert grid_programs(cpu, 1) == 1
    assert grid_programs(cpu, 2) == min(2, INTERPRETER_PROGRAMS)
    assert grid_programs(cpu, 10**6) == INTERPRETER_PROGRAMS
    assert grid_programs(cpu, 10**6, programs=7) == 7
    for n_blocks in (MAX_STEPS * 5 + 1, 10**12):
        programs = grid_programs(cpu, n_blocks, programs=1)
        assert -(-n_blocks // programs) <= MAX_STEPS


def _entries_of(batch_tensors: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch, **caps: int) -> tuple[Any, list]:
    """A batch that holds unless WEIGHTCHECK_DEVICE_HOLD says otherwise (holding is opt-in), given the tensors."""
    from weightcheck.tap import devicebatch

    for name, value in caps.items():
        monkeypatch.setattr(devicebatch, name, value)
    monkeypatch.setenv(devicebatch.ENV_HOLD, os.environ.get(devicebatch.ENV_HOLD, "1"))
    batch = devicebatch.DeviceBatch()
    entries: list[dict] = [{} for _ in batch_tensors]
    for entry, tensor in zip(entries, batch_tensors, strict=True):
        batch.add(entry, tensor)
    return batch, entries


def _held_cases() -> list[torch.Tensor]:
    """Every taken dtype, of sizes from one word to several blocks, with zeros and NaN/Inf, in an order that
    mixes the kernel's (width, pattern) classes."""
    from weightcheck.tap.devicebatch import TAKEN

    cases: list[torch.Tensor] = []
    for size in (4, 64, 1000, 5000):
        for index, name in enumerate(TAKEN):
            tensor = _random(getattr(torch, name), (size,), seed=size + index)
            if tensor.is_floating_point():
                tensor = tensor.float().nan_to_num(0.0, 1.0, -1.0).to(tensor.dtype)
                if size == 1000:
                    tensor[3], tensor[-1] = float("nan"), float("-inf")
            cases.append(torch.zeros_like(tensor) if size == 64 and index % 2 else tensor)
    return cases


def _launch_classes(tensors: list[torch.Tensor]) -> set[tuple[Any, bool]]:
    """The launches a hold of these tensors makes: one per dtype class, split by whether every address is on 16
    bytes and every word count a multiple of 16."""
    from weightcheck.tap.devicebatch import fused_spec

    return {
        (fused_spec(t.dtype), not (t.data_ptr() & 15 or t.nbytes & 63))
        for t in tensors
        if fused_spec(t.dtype) is not None and t.is_contiguous() and t.nbytes and not (t.nbytes | t.data_ptr()) & 3
    }


def test_the_many_tensor_kernel_aligned_or_not_and_on_any_grid() -> None:
    """`fused_stats_many` over tensors of 16 words to many blocks, told they are aligned or not, with one program
    per tensor or several: each row is the one-tensor kernel's result."""
    from weightcheck.fuseddigest import fused_lanes_and_stats, fused_stats_many

    tensors = [_random(torch.bfloat16, (n,), seed=n) for n in (32, 4096, 70_000, 32 * 1000)]
    tensors[2][7] = float("nan")
    table = torch.tensor([[t.data_ptr(), t.nbytes >> 2] for t in tensors], dtype=torch.int64)
    want = [fused_lanes_and_stats(t.view(torch.uint8), 2, 0x7F80).tolist() for t in tensors]
    for aligned in (False, True):
        for programs in (None, 1, 5):
            out = torch.zeros((len(tensors), 4), dtype=torch.int64)
            fused_stats_many(table, out, 70_000 // 2, 2, 0x7F80, block_words=1024, aligned=aligned, programs=programs)
            assert out.tolist() == want, (aligned, programs)


def _digest_fields(entry: dict) -> dict:
    return {k: entry[k] for k in ("dtype", "posmix128", "zeros", "nonfinite")}


def _described(tensor: torch.Tensor) -> dict:
    from weightcheck.tap.digesting import describe_tensor

    return _digest_fields(describe_tensor(tensor, "posmix128"))


def test_held_tensors_are_launched_together_and_each_gets_its_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held until the call ends, every tensor of a (width, pattern) class goes in one launch of the many-tensor
    kernel; each entry equals `describe_tensor`'s, float64 (no fused spec) queued on arrival."""
    from weightcheck.tap.devicebatch import ENV_HOLD, DeviceBatch, fused_spec

    monkeypatch.delenv(ENV_HOLD, raising=False)
    assert not DeviceBatch().hold  # opt-in
    cases = _held_cases()
    batch, entries = _entries_of(cases, monkeypatch)
    assert batch.hold
    assert len(batch.pending) == sum(fused_spec(t.dtype) is None for t in cases)  # the rest held
    batch.collect("posmix128")
    assert batch.many_launches == len(_launch_classes(cases)) and not batch.waiting()
    assert [_digest_fields(e) for e in entries] == [_described(t) for t in cases]


@pytest.mark.parametrize(
    "caps",
    [
        {"HOLD_TENSORS": 3},
        {"HOLD_BYTES": 5000},
        {"HOLD_TENSORS": 3, "SLAB_ROWS": 5},  # launches' rows across blocks
        {"HOLD_TENSORS": 9, "SLAB_ROWS": 2},  # a launch with more rows than a block
    ],
    ids=str,
)
def test_the_held_tensors_are_launched_when_the_hold_is_full(caps: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _held_cases()
    batch, entries = _entries_of(cases, monkeypatch, **caps)
    assert batch.many_launches >= 3  # launched during the call, not only at its end
    batch.collect("posmix128")
    assert [_digest_fields(e) for e in entries] == [_described(t) for t in cases]


def test_a_tensor_written_into_while_held_is_recorded_as_not_digested(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that writes into the tensor it was handed (through it or a view of it) or gives it new storage
    before the call ends: the entry says it could not be digested, never the bytes the engine wrote; the
    neighbours' entries are unchanged. WEIGHTCHECK_DEVICE_HOLD=0 digests on arrival, before the write."""
    from weightcheck.tap.devicebatch import ENV_HOLD
    from weightcheck.tap.records import ENGINE_WROTE_INTO_SENT

    def sent() -> list[torch.Tensor]:
        return [_random(torch.bfloat16, (64, 8), seed=seed) for seed in range(4)]

    def engine_writes(tensors: list[torch.Tensor]) -> None:
        tensors[0].mul_(2)  # in place
        tensors[1][:, 0].zero_()  # through a view
        tensors[2].set_(torch.ones(64, 8, dtype=torch.bfloat16))  # new storage

    from weightcheck.tap import devicebatch, digesting

    monkeypatch.setattr(digesting, "_WROTE_INTO", set())
    originals = sent()
    want = [_described(t) for t in originals]
    tensors = sent()
    batch, entries = _entries_of(tensors, monkeypatch)
    engine_writes(tensors)
    batch.collect("posmix128")
    for entry in entries[:3]:
        assert entry["error"] == ENGINE_WROTE_INTO_SENT
        assert (entry["posmix128"], entry["zeros"], entry["nonfinite"]) == (None, None, None)
    assert _digest_fields(entries[3]) == want[3] and "error" not in entries[3]
    # The next sync: the names written into are launched on arrival (before the engine's write), the others held.
    entries = [{"name": f"w{index}"} for index in range(4)]
    for round_ in range(2):
        tensors = sent()
        batch = devicebatch.DeviceBatch()
        for entry, tensor in zip(entries, tensors, strict=True):
            entry.pop("error", None)
            batch.add(entry, tensor)
        engine_writes(tensors)
        batch.collect("posmix128")
        if round_ == 0:
            assert [e.get("error") for e in entries] == [ENGINE_WROTE_INTO_SENT] * 3 + [None]
        else:
            assert [_digest_fields(e) for e in entries] == want and batch.many_launches == 1
    monkeypatch.setenv(ENV_HOLD, "0")
    tensors = sent()
    batch, entries = _entries_of(tensors, monkeypatch)
    assert not batch.hold
    engine_writes(tensors)
    batch.collect("posmix128")
    assert [_digest_fields(e) for e in entries] == want  # what arrived, digested before the engine wrote


def test_tensors_made_under_inference_mode_are_held_and_digested(monkeypatch: pytest.MonkeyPatch) -> None:
    with torch.inference_mode():
        tensors = [_random(torch.float16, (33, 4), seed=seed).clone() for seed in range(3)]
    batch, entries = _entries_of(tensors, monkeypatch)
    assert batch.waiting() and not batch.pending
    batch.collect("posmix128")
    assert [_digest_fields(e) for e in entries] == [_described(t) for t in tensors]


def test_a_launch_that_fails_sends_its_tensors_the_one_at_a_time_way(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightcheck import devdigest
    from weightcheck.tap import devicebatch

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(devicebatch, "fused_stats_many", broken)
    monkeypatch.setattr(devdigest, "_fused_failed", False)
    cases = _held_cases()[:12]
    batch, entries = _entries_of(cases, monkeypatch)
    batch.collect("posmix128")
    assert batch.many_launches == 0
    assert [_digest_fields(e) for e in entries] == [_described(t) for t in cases]
    monkeypatch.setattr(devdigest, "_fused_failed", False)  # the failure turned the fused kernels off


@pytest.mark.usefixtures("tapped_on_device")
def test_a_tapped_sync_with_held_tensors_records_what_the_one_at_a_time_path_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tap's calls through the device batch with the fused kernels (the interpreter) and tensors held:
    the records equal the synchronous one-at-a-time path's, and the many-tensor kernel ran."""
    from test_tap_devicebatch import run

    from weightcheck.tap.devicebatch import ENV_HOLD, DeviceBatch

    monkeypatch.setenv(ENV_HOLD, "1")
    launches: list[int] = []
    original = DeviceBatch.collect

    def counting(self: DeviceBatch, algorithm: str) -> None:
        original(self, algorithm)
        launches.append(self.many_launches)

    monkeypatch.setattr(DeviceBatch, "collect", counting)
    held = run(tmp_path / "held", synchronous=False)
    assert sum(launches) >= 2  # a launch per call at least
    assert held == run(tmp_path / "reference", synchronous=True)
    assert all(t["hexdigest"] and not t["error"] for t in held[0][1])


def test_the_many_tensor_kernel_refuses_more_tensors_than_the_grid_holds() -> None:
    from weightcheck.fuseddigest import MAX_TENSORS_PER_LAUNCH, fused_stats_many
    from weightcheck.tap.devicebatch import HOLD_TENSORS

    assert HOLD_TENSORS <= MAX_TENSORS_PER_LAUNCH
    table = torch.zeros((MAX_TENSORS_PER_LAUNCH + 1, 2), dtype=torch.int64)
    with pytest.raises(ValueError, match="at most 65535"):
        fused_stats_many(table, torch.zeros((MAX_TENSORS_PER_LAUNCH + 1, 4), dtype=torch.int64), 1, 2, 0x7F80)
