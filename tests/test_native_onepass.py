"""The compiled one-pass loop (weightcheck._onepass, built by setup.py) gives exactly what the numpy loop gives:
python-xxhash's xxh3_128 digest bit for bit, the OR of the bytes as 64-bit little-endian words, and NaN/Inf
presence, for every length around XXH3's block and stripe boundaries, unaligned buffers, and every dtype the
tap's one pass handles.

Where the module was not built (no C compiler) or cannot run (no AVX2) these tests skip, unless
WEIGHTCHECK_REQUIRE_NATIVE=1 (CI sets it: the build must have happened there, on a CPU with AVX2)."""

from __future__ import annotations

import os
from typing import Any

import pytest

np = pytest.importorskip("numpy")
xxhash = pytest.importorskip("xxhash")
torch = pytest.importorskip("torch")

from weightcheck import native  # noqa: E402
from weightcheck.native import ENV_NATIVE  # noqa: E402
from weightcheck.tap import digesting  # noqa: E402

try:
    from weightcheck import _onepass  # type: ignore[attr-defined]
except ImportError:  # not built here
    _onepass = None
    if os.environ.get("WEIGHTCHECK_REQUIRE_NATIVE") == "1":
        raise
RUNS = _onepass is not None and _onepass.level() == "avx2-fused"
if os.environ.get("WEIGHTCHECK_REQUIRE_NATIVE") == "1":
    assert RUNS, "weightcheck._onepass was built but has no fused loop on this CPU"

pytestmark = pytest.mark.skipif(not RUNS, reason="weightcheck._onepass not built (no C compiler) or no AVX2")
# XXH3: <= 16, <= 128 and <= 240 bytes take short paths; longer inputs go through 1 KiB blocks of 16 stripes
# of 64 bytes, then a last partial block and an overlapping last stripe.
LENGTHS = sorted(
    {*range(0, 300), *(k * 1024 + d for k in (1, 2, 3, 17) for d in (-65, -64, -63, -1, 0, 1, 63, 64, 65)),
     4095, 4096, 4097, 65_543, (1 << 20) + 17, 3_000_001}
)  # fmt: skip


def _reference_or(data: bytes) -> int:
    whole = len(data) - len(data) % 8
    words = np.frombuffer(data[:whole], dtype="<u8")
    return (int(np.bitwise_or.reduce(words)) if len(words) else 0) | int.from_bytes(data[whole:], "little")


def test_digest_and_or_equal_the_references_at_every_boundary() -> None:
    rng = np.random.default_rng(7)
    for n in LENGTHS:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        if n % 3 == 0:
            data[: n // 2] = 0  # long zero runs: the OR must still see the other half
        raw = data.tobytes()
        digest, ored, present = _onepass.onepass(data, 1, 0, 0)
        assert digest == xxhash.xxh3_128_hexdigest(raw), n
        assert ored == _reference_or(raw), n
        assert present is False


def test_unaligned_and_all_zero_buffers() -> None:
    rng = np.random.default_rng(3)
    backing = rng.integers(0, 256, 200_003, dtype=np.uint8)
    for offset in range(1, 8):
        view = backing[offset : offset + 150_001]
        assert _onepass.onepass(view, 1, 0, 0)[0] == xxhash.xxh3_128_hexdigest(view.tobytes())
    for n in (0, 1, 241, 1024, 100_000):
        zeros = np.zeros(n, dtype=np.uint8)
        assert _onepass.onepass(zeros, 1, 0, 0)[:2] == (xxhash.xxh3_128_hexdigest(bytes(n)), 0)


def _planted(dtype: Any, n: int, where: int, value: float) -> Any:
    t = torch.full((n,), 0.01, dtype=torch.float32)
    t[where] = value
    return t.to(dtype)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32", "float64"])
def test_nan_inf_presence_wherever_it_sits(dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    _, itemsize, pattern = digesting.fast_dtype(dtype)  # type: ignore[misc]
    top = digesting._top(itemsize, pattern)
    n = 70_001  # blocks, then a partial block: the tail region has its own scan
    for where in (0, 1, 511, 512, 8191, n - 600, n - 2, n - 1):
        for bad, expected in ((float("nan"), True), (-float("inf"), True), (float("inf"), True),
                              (3.0, False), (-65504.0, False)):  # fmt: skip
            data = _planted(dtype, n, where, bad).view(torch.uint8).numpy()
            got = _onepass.onepass(data, itemsize, top, pattern)
            assert got[0] == xxhash.xxh3_128_hexdigest(data.tobytes())
            assert got[2] is expected, (dtype_name, where, bad)
    small = _planted(dtype, 50, 49, float("nan")).view(torch.uint8).numpy()  # the short-input path
    assert _onepass.onepass(small, itemsize, top, pattern)[2] is True


def test_describe_one_pass_equals_the_numpy_loop_on_every_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole record (digest, zeros, nonfinite) through `describe_one_pass`, compiled against numpy."""
    from test_tap_onepass import _cases  # (tests/ is on the path: pytest's rootdir conftest)

    cases = [c for c in _cases() if c.numel()]
    cases += [torch.randn(300_000).to(torch.bfloat16), torch.zeros(5000, dtype=torch.bfloat16)]
    negative_zero = torch.zeros(5000, dtype=torch.float32)
    negative_zero[17] = -0.0  # a set sign bit: not all bytes zero
    cases.append(negative_zero)
    monkeypatch.setattr(native, "_onepass", [None])
    reference = [digesting.describe_one_pass(t, "xxh3_128") for t in cases]
    monkeypatch.setattr(native, "_onepass", [_onepass])
    assert [digesting.describe_one_pass(t, "xxh3_128") for t in cases] == reference


def test_the_switch_and_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _onepass.level() == "avx2-fused"
    monkeypatch.setattr(native, "_onepass", [])
    monkeypatch.setenv(ENV_NATIVE, "0")
    assert digesting.native_level() is None
    monkeypatch.setattr(native, "_onepass", [])
    monkeypatch.delenv(ENV_NATIVE)
    assert digesting.native_level() == _onepass.level()
    with pytest.raises(ValueError):
        _onepass.onepass(b"abc", 3, 0, 0)
    with pytest.raises(TypeError):
        _onepass.onepass("text", 1, 0, 0)
    with pytest.raises((BufferError, ValueError)):  # not contiguous: refused, never read past
        _onepass.onepass(np.zeros((4, 4), dtype=np.uint8)[:, ::2], 1, 0, 0)


def test_random_tensors_agree_with_the_numpy_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded random lengths, dtypes, offsets into a larger tensor and planted specials: the compiled record is
    the numpy loop's, every time."""
    rng = np.random.default_rng(2026)
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int32,
              torch.float8_e4m3fn, torch.bool]  # fmt: skip
    specials = [float("nan"), float("inf"), -float("inf"), 2.5, -7.0, 0.0, -0.0, 1e30]
    cases = []
    for _ in range(300):
        n = int(rng.integers(1, 40_000))
        base = torch.from_numpy(rng.standard_normal(n + 8).astype(np.float32) * float(rng.choice([0.01, 1.0, 0.0])))
        for _ in range(int(rng.integers(0, 3))):
            base[int(rng.integers(0, n + 8))] = float(rng.choice(specials))
        start = int(rng.integers(0, 8))
        dtype = dtypes[int(rng.integers(0, len(dtypes)))]
        cases.append(base.to(dtype)[start : start + n])  # a view at an offset: its own bytes only
    monkeypatch.setattr(native, "_onepass", [None])
    reference = [digesting.describe_one_pass(t, "xxh3_128") for t in cases]
    monkeypatch.setattr(native, "_onepass", [_onepass])
    assert [digesting.describe_one_pass(t, "xxh3_128") for t in cases] == reference


def test_parallel_calls_give_each_its_own_answer() -> None:
    """The GIL is released inside: digest threads calling at once each get their own buffer's result."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(11)
    buffers = [rng.integers(0, 256, int(rng.integers(1000, 3_000_000)), dtype=np.uint8) for _ in range(24)]
    expected = [xxhash.xxh3_128_hexdigest(b.tobytes()) for b in buffers]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda b: _onepass.onepass(b, 1, 0, 0)[0], buffers))
    assert got == expected
