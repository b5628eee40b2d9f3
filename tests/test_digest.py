"""Digest algorithms (`weightcheck.digest`): sha256 and xxh3_128 over the bytes as safetensors stores them,
never equal across algorithms, and the manifest's per-entry algorithm key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weightcheck.digest import (
    HEX_LENGTH,
    ManifestError,
    TensorDigest,
    compare_digests,
    digest_bytes,
    digest_stored,
    digest_tensor,
    live_algorithm,
    read_manifest,
    write_manifest,
)
from weightcheck.tensors import TensorStore

TENSORS = {
    "bf16": (torch.randn(33, 17, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16),
    "f32_transposed": torch.randn(8, 5, generator=torch.Generator().manual_seed(1)).t(),  # non-contiguous
    "i32": torch.arange(-7, 50, dtype=torch.int32),
    "f16_scalar": torch.tensor(1.5, dtype=torch.float16),
    "empty": torch.empty(0, 4),
}


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_in_memory_digest_equals_the_saved_tensors_digest(tmp_path: Path, algorithm: str) -> None:
    path = tmp_path / "t.safetensors"
    save_file({name: t.contiguous() for name, t in TENSORS.items()}, str(path))
    with TensorStore.open(path) as store:
        for name, tensor in TENSORS.items():
            stored = digest_stored(store, name, algorithm)
            assert digest_tensor(tensor, algorithm) == stored, name
            assert stored.algorithm == algorithm and len(stored.hexdigest) == HEX_LENGTH[algorithm]
            store.release(name)


def test_xxh3_tells_one_flipped_bit() -> None:
    tensor = torch.zeros(1000, dtype=torch.float32)
    flipped = tensor.clone()
    flipped[999] = -0.0  # only the sign bit of the last element
    assert digest_tensor(tensor, "xxh3_128") != digest_tensor(flipped, "xxh3_128")


def test_digests_of_different_algorithms_are_never_equal() -> None:
    tensor = TENSORS["bf16"]
    sha, xxh = digest_tensor(tensor, "sha256"), digest_tensor(tensor, "xxh3_128")
    assert sha != xxh and not sha.comparable(xxh)
    # Even with the same hex text: the algorithm is part of the digest.
    assert TensorDigest("F32", (2,), "a" * 32, "xxh3_128") != TensorDigest("F32", (2,), "a" * 32, "sha256")
    assert len({sha, xxh}) == 2  # usable as distinct dict keys (the verifier indexes digests)
    why = sha.difference(xxh)
    assert why is not None and "not comparable" in why and "differ" not in why
    result = compare_digests({"w": sha}, {"w": xxh})
    assert result.changed == {} and result.incomparable == {"w": "sha256 vs xxh3_128"} and not result.ok
    # A real dtype difference is still a change, whatever the algorithms.
    other = digest_tensor(tensor.float(), "xxh3_128")
    assert compare_digests({"w": sha}, {"w": other}).changed == {"w": "dtype BF16 → F32"}


def test_sha256_property_is_only_for_sha256_digests() -> None:
    tensor = TENSORS["i32"]
    assert digest_tensor(tensor, "sha256").sha256 == digest_tensor(tensor).hexdigest  # sha256 is the default
    assert digest_tensor(tensor, "xxh3_128").sha256 is None


def test_unknown_algorithm_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        digest_bytes(b"abcd", "U8", (4,), "md5")
    with pytest.raises(ValueError, match="md5"):
        live_algorithm("md5")


def test_live_algorithm_default_override_and_fallback(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    assert live_algorithm(environ={}) == "xxh3_128"  # xxhash is a test dependency
    assert live_algorithm(environ={"WEIGHTCHECK_DIGEST": "sha256"}) == "sha256"
    assert live_algorithm(environ={"WEIGHTCHECK_DIGEST": " XXH3_128 "}) == "xxh3_128"
    assert live_algorithm("sha256", environ={"WEIGHTCHECK_DIGEST": "xxh3_128"}) == "sha256"  # argument wins
    assert live_algorithm(environ={"WEIGHTCHECK_DIGEST": "bogus"}) == "xxh3_128"  # a typo must not stop an engine
    monkeypatch.setitem(sys.modules, "xxhash", None)  # makes `import xxhash` raise ImportError
    with caplog.at_level("WARNING", logger="weightcheck.digest"):
        assert live_algorithm(environ={}) == "sha256"
        assert live_algorithm("xxh3_128") == "sha256"


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_manifest_round_trip_keys_the_digest_by_algorithm(tmp_path: Path, algorithm: str) -> None:
    digests = {name: digest_tensor(t, algorithm) for name, t in TENSORS.items()}
    path = tmp_path / "m.json"
    write_manifest(path, digests)
    entry = json.loads(path.read_text())["tensors"]["bf16"]
    assert set(entry) == {"dtype", "shape", algorithm}
    assert read_manifest(path) == digests


def test_a_manifest_from_before_the_algorithm_choice_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    sha = "0123456789abcdef" * 4
    tensors = {"w": {"dtype": "F32", "shape": [2], "sha256": sha}}
    doc = {"schema_version": "1.0", "kind": "weightcheck-manifest", "tensors": tensors}
    path.write_text(json.dumps(doc))
    assert read_manifest(path) == {"w": TensorDigest("F32", (2,), sha, "sha256")}


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({"xxh3_128": "0" * 64}, "xxh3_128 must be 32 lowercase hex"),  # a sha256-long digest under xxh3's key
        ({"sha256": "0" * 32}, "sha256 must be 64 lowercase hex"),
        ({"xxh3_128": "Z" * 32}, "32 lowercase hex"),
        ({"sha256": "0" * 64, "xxh3_128": "0" * 32}, "exactly one digest"),
        ({}, "found none"),
    ],
)
def test_manifest_digest_validation(tmp_path: Path, entry: dict, error: str) -> None:
    path = tmp_path / "m.json"
    tensors = {"w": {"dtype": "F32", "shape": [2], **entry}}
    path.write_text(json.dumps({"schema_version": "1.0", "kind": "weightcheck-manifest", "tensors": tensors}))
    with pytest.raises(ManifestError, match=error):
        read_manifest(path)
