"""The fused posmix128 kernel compiled for a real GPU (not Triton's interpreter): bit for bit the CPU reference
on every recorded dtype, on sizes of one block to many, on views, and through the tap's own entry points.

Skipped where no CUDA device is present (CI has none); run on a GPU with
`python -m pytest -q tests/test_fused_digest_cuda.py` (the README's GPU figures came with a run of it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("triton")

from test_fused_digest import (  # noqa: E402  (the interpreter tests' inputs, shared)
    _dtypes,
    _launch_classes,
    _random,
    _stored,
)

from weightcheck.devdigest import posmix128_bytes, posmix128_tensor  # noqa: E402
from weightcheck.fuseddigest import ENV_FUSED, _kernel, _launcher, posmix128_fused  # noqa: E402
from weightcheck.tritonlaunch import ENV_DIRECT  # noqa: E402


@pytest.fixture(autouse=True)
def compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(ENV_FUSED, raising=False)
    monkeypatch.delenv(ENV_DIRECT, raising=False)
    _kernel.cache_clear()
    _launcher.cache_clear()


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
@pytest.mark.parametrize("shape", [(1,), (3,), (7, 5), (2, 3, 67), (4099,), (3, 1 << 20)], ids=str)
def test_fused_on_the_gpu_equals_the_cpu_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    host = _random(dtype, shape, seed=sum(shape) + len(str(dtype)))
    reference = posmix128_tensor(host)  # eager torch kernels on the CPU
    device = host.cuda()
    assert posmix128_fused(device) == reference
    assert posmix128_fused(device, block_words=64) == reference  # many programs, atomics in any order
    assert posmix128_tensor(device) == reference  # the dispatch the tap uses: fused on CUDA
    if host.numel() <= 1 << 16:
        assert reference == posmix128_bytes(_stored(host))


def test_the_eager_gpu_path_agrees_when_the_fused_kernel_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    host = _random(torch.bfloat16, (257, 129), seed=5)
    fused = posmix128_tensor(host.cuda())
    monkeypatch.setenv(ENV_FUSED, "0")
    assert posmix128_tensor(host.cuda()) == fused == posmix128_tensor(host)


def test_views_on_the_gpu() -> None:
    host = _random(torch.bfloat16, (64, 48), seed=1)
    device = host.cuda()
    assert posmix128_fused(device.t()) == posmix128_tensor(host.t()) != posmix128_fused(device)
    assert posmix128_fused(device[3:40:2]) == posmix128_tensor(host[3:40:2])
    flat = _random(torch.uint8, (4099,), seed=2)
    assert posmix128_fused(flat.cuda()[1:]) == posmix128_bytes(bytes(flat[1:].numpy()))  # off a word boundary
    one = _random(torch.float32, (1 << 20,), seed=3)
    changed = one.clone()
    changed.view(torch.int32)[-1] ^= 1
    assert posmix128_fused(one.cuda()) != posmix128_fused(changed.cuda())


def test_the_tap_records_the_same_digest_on_the_gpu_as_on_the_host() -> None:
    from weightcheck.tap.digesting import describe_tensor

    for dtype in (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8):
        host = _random(dtype, (33, 65), seed=7)
        on_gpu, on_host = describe_tensor(host.cuda(), "posmix128"), describe_tensor(host, "posmix128")
        assert on_gpu["posmix128"] == on_host["posmix128"] is not None
        assert (on_gpu["dtype"], on_gpu["shape"]) == (on_host["dtype"], on_host["shape"])


def test_the_device_batch_on_the_gpu_records_what_describe_tensor_records_on_the_host() -> None:
    from weightcheck.tap.devicebatch import TAKEN, DeviceBatch
    from weightcheck.tap.digesting import describe_tensor

    batch = DeviceBatch()
    batch.hold = False  # each launched on arrival (the held path: test_held_tensors_on_the_gpu_...)
    cases: list[tuple[dict, torch.Tensor]] = []
    for name in TAKEN:
        host = _random(getattr(torch, name), (129, 33), seed=len(name))
        if host.is_floating_point():
            host[0, 0], host[1, 1] = float("nan"), float("inf")
        for tensor in (host, host.t(), torch.zeros(5, dtype=host.dtype), host[:0], host.reshape(-1)[:7]):
            entry: dict = {}
            assert DeviceBatch.takes(tensor.cuda())
            batch.add(entry, tensor.cuda())
            cases.append((entry, tensor))
    from weightcheck.tap.devicebatch import fused_spec

    fused = [item[3] for item in batch.pending]  # True: the fused digest-and-statistics kernel ran (no fallback)
    assert fused == [fused_spec(t.dtype) is not None and t.numel() > 0 for _, t in cases]
    batch.collect("posmix128")
    for entry, tensor in cases:
        want = describe_tensor(tensor, "posmix128")
        got = {k: entry[k] for k in ("dtype", "posmix128", "zeros", "nonfinite")}
        assert got == {k: want[k] for k in got} and list(entry["shape"]) == want["shape"], (tensor.dtype, tensor.shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8], ids=str)
def test_the_fixed_grid_on_the_gpu_with_few_and_many_steps(dtype: torch.dtype) -> None:
    """One program striding over every block, a few, and the default grid: lanes and counts equal the CPU
    reference on a tensor of many blocks, with NaN/Inf and zeros far apart."""
    from weightcheck.fuseddigest import fused_lanes_and_stats
    from weightcheck.posmix import _byte_view, finalize
    from weightcheck.tap.devicebatch import fused_spec

    host = _random(dtype, (3, 1 << 20), seed=13)
    if dtype.is_floating_point:
        host = host.float().nan_to_num(0.0, 1.0, -1.0).clamp(-1, 1).to(dtype)
        host[0, 5], host[1, 77777], host[2, -1] = float("nan"), float("inf"), float("-inf")
    host[1, 1000:50000] = 0
    reference = posmix128_tensor(host)
    set_words = int((_byte_view(host).view(torch.int32) != 0).sum())
    nonfinite = int((~torch.isfinite(host)).sum()) if dtype.is_floating_point else 0
    data = _byte_view(host.cuda())
    for block, programs in ((1024, 1), (64, 7), (1024, None), (4096, None), (256, 1000)):
        a, b, got_set, got_bad = fused_lanes_and_stats(data, *fused_spec(dtype), block, programs).tolist()
        assert (finalize(a, b, data.numel()), got_set, got_bad) == (reference, set_words, nonfinite), (block, programs)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tensor_on_another_gpu_than_the_current_one() -> None:
    from weightcheck.tap.devicebatch import DeviceBatch
    from weightcheck.tap.digesting import describe_tensor

    host = _random(torch.bfloat16, (129, 65), seed=11)
    with torch.cuda.device(0):
        other = host.to("cuda:1")
        assert posmix128_fused(other) == posmix128_tensor(host)
        batch, entry = DeviceBatch(), {}
        batch.hold = False
        batch.add(entry, other)
        assert batch.pending[0][3] is True
        batch.collect("posmix128")
    assert entry["posmix128"] == describe_tensor(host, "posmix128")["posmix128"]


def test_direct_launches_of_the_compiled_kernel_equal_triton_own_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """After Triton's first launch for a key, `weightcheck.tritonlaunch` runs the compiled kernel itself: on
    sizes that change Triton's specialization (16-multiples, 1, odd counts) and on addresses off 16 bytes, in an
    order that revisits each key, every digest equals the one Triton's own launch gives and the CPU reference."""
    host = _random(torch.uint8, ((1 << 16) + 64,), seed=11)
    device = host.cuda()
    cuts = [(0, 4), (0, 64), (0, 4096), (4, 4100), (8, 4104), (0, 4097), (1, 4099), (16, 1 << 16), (0, 6)]
    expected = [posmix128_bytes(bytes(host[a:b].numpy())) for a, b in cuts]
    monkeypatch.setenv(ENV_DIRECT, "0")
    _launcher.cache_clear()
    assert [posmix128_fused(device[a:b]) for a, b in cuts] == expected
    assert _launcher().direct_launches == 0
    monkeypatch.delenv(ENV_DIRECT)
    _launcher.cache_clear()
    for _round in range(3):
        assert [posmix128_fused(device[a:b]) for a, b in cuts] == expected
    assert _launcher().enabled, "Triton's version or this environment left direct launches off"
    assert _launcher().direct_launches >= 2 * len(cuts)
    from weightcheck.fuseddigest import fused_lanes_and_stats
    from weightcheck.tap.devicebatch import fused_spec

    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int32):  # each (width, pattern): its own key
        values = _random(dtype, (3, 4099), seed=7).cuda()
        data = values.reshape(-1).view(torch.uint8)
        first, second = (fused_lanes_and_stats(data, *fused_spec(dtype)).tolist() for _ in range(2))
        assert first == second


def test_the_device_batch_launched_with_raw_addresses_records_what_the_view_making_path_records() -> None:
    """`DeviceBatch.add` launches the fused kernel with the tensor's address once its key is compiled
    (`fused_stats_at`): on every taken dtype, sizes that change Triton's specialization, addresses off 16 bytes
    (a slice), zeros, NaN/Inf and non-contiguous tensors (the view-making path), over three rounds that revisit
    each key, the entries equal those of the view-making path and the CPU reference, and the raw launches ran."""
    from weightcheck.fuseddigest import _launcher
    from weightcheck.tap.devicebatch import TAKEN, DeviceBatch, fused_spec
    from weightcheck.tap.digesting import describe_tensor

    cases: list[torch.Tensor] = []
    for name in TAKEN:
        host = _random(getattr(torch, name), (257, 64), seed=len(name) + 3)
        if host.is_floating_point():
            host[3, 5], host[100, 1] = float("nan"), float("-inf")
        cases += [host, host[1:], host[:, 1:], host.reshape(-1)[4:4100], host.reshape(-1)[:1], torch.zeros_like(host)]
    keys = ("dtype", "shape", "posmix128", "zeros", "nonfinite")
    want = [{k: describe_tensor(t, "posmix128")[k] for k in keys} for t in cases]
    on_gpu = [t.cuda() for t in cases]
    fused = sum(
        1
        for t in on_gpu
        if fused_spec(t.dtype) is not None and t.is_contiguous() and t.nbytes and not (t.nbytes | t.data_ptr()) & 3
    )
    launches_before = _launcher().direct_launches
    for raw in (False, True, True, True):
        batch = DeviceBatch()
        batch.hold = False  # the raw launch is the path of a tensor launched on arrival
        batch.raw_launches = raw
        entries: list[dict] = [{} for _ in on_gpu]
        for entry, tensor in zip(entries, on_gpu, strict=True):
            batch.add(entry, tensor)
        batch.collect("posmix128")
        got = [{k: (list(e[k]) if k == "shape" else e[k]) for k in keys} for e in entries]
        assert got == want, raw
        # The first round compiled every key; from then on each eligible tensor is launched raw.
        assert batch.raw_added == (fused if raw else 0)
    assert _launcher().enabled, "Triton's version or this environment left direct launches off"
    assert _launcher().direct_launches - launches_before >= 3 * fused


def _held_gpu_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(host, GPU) pairs of the same values, every taken dtype: one block to many (3 x 2^20 elements), one word,
    a view 4 bytes off a 16-byte address (made on the GPU too, so the address stays off), zeros, NaN/Inf."""
    from weightcheck.tap.devicebatch import TAKEN

    cases: list[tuple[torch.Tensor, torch.Tensor]] = []
    for index, name in enumerate(TAKEN):
        host = _random(getattr(torch, name), (3, 1 << 20), seed=index + 21)
        if host.is_floating_point():
            host = host.float().nan_to_num(0.0, 1.0, -1.0).to(host.dtype)
            host[0, 5], host[1, 77777], host[2, -1] = float("nan"), float("inf"), float("-inf")
        host[1, 1000:50000] = 0
        flat, on_gpu = host.reshape(-1), host.cuda().reshape(-1)
        word = 4 // host.element_size() or 1
        for cut in (slice(None), slice(0, 129 * 33 * word), slice(word, word * 4100), slice(0, word)):
            cases.append((flat[cut], on_gpu[cut]))
        zeros = torch.zeros(64 * word, dtype=host.dtype)
        cases.append((zeros, zeros.cuda()))
    return cases


def _fields(entry: dict) -> dict:
    return {k: entry[k] for k in ("dtype", "posmix128", "zeros", "nonfinite")}


def test_held_tensors_on_the_gpu_equal_the_cpu_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The held path (opt-in): tensors held and launched together by the many-tensor kernel (here one launch per
    dtype class and alignment: the hold's limits raised), compiled for the GPU: every entry equals
    `describe_tensor` of the host copy; then 300 small tensors in one launch (one program per tensor)."""
    from weightcheck.tap import devicebatch
    from weightcheck.tap.devicebatch import DeviceBatch
    from weightcheck.tap.digesting import describe_tensor

    monkeypatch.setattr(devicebatch, "HOLD_BYTES", 1 << 40)
    monkeypatch.setattr(devicebatch, "HOLD_TENSORS", 1 << 20)
    monkeypatch.setenv(devicebatch.ENV_HOLD, "1")  # opt-in

    small = [_random(torch.bfloat16, (7 + i % 50, 4), seed=i) for i in range(300)]
    for cases in (_held_gpu_cases(), [(t, t.cuda()) for t in small]):
        batch = DeviceBatch()
        assert batch.hold
        entries: list[dict] = [{} for _ in cases]
        for entry, (_host, tensor) in zip(entries, cases, strict=True):
            assert DeviceBatch.takes(tensor)
            batch.add(entry, tensor)
        batch.collect("posmix128")
        assert batch.many_launches == len(_launch_classes([gpu for _, gpu in cases]))
        for entry, (host, _gpu) in zip(entries, cases, strict=True):
            want = describe_tensor(host, "posmix128")
            assert _fields(entry) == {k: want[k] for k in _fields(entry)}, (host.dtype, host.shape)


def test_held_tensors_on_the_gpu_launched_when_the_hold_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightcheck.tap import devicebatch
    from weightcheck.tap.digesting import describe_tensor

    monkeypatch.setattr(devicebatch, "HOLD_TENSORS", 4)
    monkeypatch.setenv(devicebatch.ENV_HOLD, "1")
    cases = _held_gpu_cases()[:15]
    batch = devicebatch.DeviceBatch()
    entries: list[dict] = [{} for _ in cases]
    for entry, (_host, tensor) in zip(entries, cases, strict=True):
        batch.add(entry, tensor)
    assert batch.many_launches >= 3
    batch.collect("posmix128")
    for entry, (host, _gpu) in zip(entries, cases, strict=True):
        want = describe_tensor(host, "posmix128")
        assert _fields(entry) == {k: want[k] for k in _fields(entry)}


def test_a_gpu_tensor_written_into_while_held_is_not_digested(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightcheck.tap.devicebatch import ENV_HOLD, DeviceBatch
    from weightcheck.tap.digesting import describe_tensor
    from weightcheck.tap.records import ENGINE_WROTE_INTO_SENT

    monkeypatch.setenv(ENV_HOLD, "1")
    host = [_random(torch.bfloat16, (256, 64), seed=seed) for seed in range(3)]
    on_gpu = [t.cuda() for t in host]
    batch = DeviceBatch()
    entries: list[dict] = [{} for _ in host]
    for entry, tensor in zip(entries, on_gpu, strict=True):
        batch.add(entry, tensor)
    on_gpu[0].mul_(2)
    on_gpu[1][:, 0].zero_()
    batch.collect("posmix128")
    assert entries[0]["error"] == entries[1]["error"] == ENGINE_WROTE_INTO_SENT
    assert entries[0]["posmix128"] is None and entries[1]["posmix128"] is None
    assert entries[2]["posmix128"] == describe_tensor(host[2], "posmix128")["posmix128"]


def test_the_many_tensor_kernel_on_the_gpu_aligned_or_not_and_on_any_grid() -> None:
    """Compiled for the GPU, where the alignment hint changes the loads: the many-tensor kernel told the tensors
    are aligned, or not, on the default grid, one program per tensor, or several, equals the CPU reference."""
    from weightcheck.fuseddigest import fused_stats_many
    from weightcheck.posmix import _byte_view, finalize

    host = [_random(torch.bfloat16, (n,), seed=n) for n in (32, 4096, 70_000, 32 * 1000, 3 << 20)]
    host[2][7], host[4][-1] = float("nan"), float("inf")
    want = [
        (posmix128_tensor(t), int((_byte_view(t).view(torch.int32) != 0).sum()), int((~torch.isfinite(t)).sum()))
        for t in host
    ]
    on_gpu = [t.cuda() for t in host]
    table = torch.tensor([[t.data_ptr(), t.nbytes >> 2] for t in on_gpu], dtype=torch.int64).cuda()
    most = max(t.nbytes >> 2 for t in host)
    for aligned in (False, True):
        for programs in (None, 1, 7, 64):
            out = torch.zeros((len(host), 4), dtype=torch.int64, device="cuda")
            fused_stats_many(table, out, most, 2, 0x7F80, aligned=aligned, programs=programs)
            got = [(finalize(a, b, t.nbytes), s, bad) for (a, b, s, bad), t in zip(out.tolist(), host, strict=True)]
            assert got == want, (aligned, programs)
