"""`posmix128`, the on-device digest: the torch implementation (any device) and the numpy streaming hasher
(stored bytes) against a pure-Python reference written from the definition, for every dtype the tap records;
position sensitivity (transposes, swapped TP shards); the tap and verify with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from weightcheck import tap
from weightcheck.devdigest import PosmixHasher, posmix128_bytes, posmix128_tensor
from weightcheck.digest import POSMIX128, digest_stored, digest_tensor
from weightcheck.findings import Result, Severity
from weightcheck.verifying import verify

MASK = (1 << 64) - 1


def reference_posmix128(data: bytes) -> str:
    """The definition in weightcheck/devdigest.py, word by word with Python integers (no numpy, no torch)."""
    g, s, m1, m2 = 0x9E3779B97F4A7C15, 0x632BE59BD9B4E019, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

    def fmix(z: int) -> int:
        z ^= z >> 29
        z = (z * m2) & MASK
        return z ^ (z >> 32)

    padded = data + b"\0" * (-len(data) % 4)
    a = b = 0
    for i in range(len(padded) // 4):
        w = int.from_bytes(padded[4 * i : 4 * i + 4], "little")
        k = (i * g + s) & MASK
        k ^= k >> 31
        x = fmix(((w ^ k) * m1) & MASK)
        a = (a + x) & MASK
        b = (b + x * (k | 1)) & MASK
    a = fmix(a ^ len(data))
    b = fmix(b ^ a)
    return f"{a:016x}{b:016x}"


def stored_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=generator) * 3
        if values.numel() > 2:
            values.view(-1)[0] = float("nan")
            values.view(-1)[1] = -0.0
        return values.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0,), (1,), (3,), (7, 5), (33, 17), (2, 3, 129)])
def test_torch_and_numpy_equal_the_pure_python_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tensor = sample(dtype, shape)
    want = reference_posmix128(stored_bytes(tensor))
    assert posmix128_tensor(tensor) == want
    assert posmix128_tensor(tensor, chunk_words=5) == want  # chunk boundaries do not matter
    assert posmix128_bytes(stored_bytes(tensor)) == want
    assert digest_tensor(tensor, POSMIX128).hexdigest == want


def test_streaming_hasher_accepts_pieces_of_any_length() -> None:
    data = stored_bytes(sample(torch.bfloat16, (37, 11), seed=3))
    want = reference_posmix128(data)
    for piece in (1, 3, 5, 64):
        hasher = PosmixHasher()
        for start in range(0, len(data), piece):
            hasher.update(data[start : start + piece])
        assert hasher.hexdigest() == want


def test_non_contiguous_and_offset_views_digest_their_stored_bytes() -> None:
    base = sample(torch.float32, (16, 9), seed=5)
    for view in (base.t(), base[3:], base[:, 1:], base.view(torch.uint8)[1:]):
        assert posmix128_tensor(view) == reference_posmix128(stored_bytes(view.contiguous()))


def test_position_sensitive_transposes_and_swapped_shards() -> None:
    square = sample(torch.bfloat16, (64, 64), seed=7)
    shards = square.chunk(2, dim=0)
    digests = {
        posmix128_tensor(square),
        posmix128_tensor(square.t().contiguous()),
        posmix128_tensor(torch.cat([shards[1], shards[0]])),  # TP shards swapped
        posmix128_tensor(square.flip(1)),
        posmix128_tensor(torch.cat([square.reshape(-1)[1:], square.reshape(-1)[:1]])),  # rotated by one element
    }
    assert len(digests) == 5
    # Equal sums, different placement: the sum of the words alone would not tell these apart.
    assert posmix128_tensor(torch.tensor([1, 2], dtype=torch.int32)) != posmix128_tensor(
        torch.tensor([2, 1], dtype=torch.int32)
    )
    # Trailing zero bytes vs padding.
    assert posmix128_bytes(b"\1\2\3") != posmix128_bytes(b"\1\2\3\0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_equals_cpu(dtype: torch.dtype) -> None:
    tensor = sample(dtype, (257, 129), seed=11)
    assert posmix128_tensor(tensor.cuda()) == posmix128_tensor(tensor) == reference_posmix128(stored_bytes(tensor))


def test_tap_records_posmix128_and_verify_hashes_the_checkpoint_with_it(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from weightcheck.tensors import TensorStore

    tensors = {f"model.layers.{i}.mlp.down_proj.weight": torch.randn(16, 8).to(torch.bfloat16) for i in range(2)}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file(tensors, str(ckpt / "model.safetensors"))
    with TensorStore.open(ckpt) as store:
        for name, tensor in tensors.items():
            assert digest_stored(store, name, POSMIX128) == digest_tensor(tensor, POSMIX128)

    class Engine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.ParameterDict(
                {str(i): torch.nn.Parameter(torch.zeros(16, 8, dtype=torch.bfloat16)) for i in range(2)}
            )

        def load_weights(self, weights: object) -> None:
            for name, tensor in weights:  # type: ignore[attr-defined]
                self.w[name.split(".")[2]].data.copy_(tensor)

    records = tmp_path / "records"
    tap.configure(records, digest=POSMIX128)
    try:
        model = tap.wrap(Engine())
        with tap.sync("step-1"):
            model.load_weights(list(tensors.items()))
        swapped = {k: v for k, v in zip(tensors, reversed(list(tensors.values())), strict=True)}
        with tap.sync("step-2"):
            model.load_weights(list(swapped.items()))
    finally:
        tap.configure(None)
    (first,) = (records / "sync-00000").glob("*.jsonl")
    assert tap.read_record(first).header["digest"] == POSMIX128

    # This toy engine writes through no loader the tap can see: its coverage is unknown (an INFO note).
    def serious(result: Result) -> set[str]:
        return {f.code for f in result.findings if f.severity > Severity.INFO}

    assert serious(verify(records, ckpt, weight_version="step-1")) == set()
    shifted = verify(records, ckpt, weight_version="step-2")
    assert serious(shifted) == {"WC725"}  # layers swapped: their data is named
