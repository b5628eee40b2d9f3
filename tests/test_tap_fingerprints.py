"""Late writes from a loader's thread pool are traced back to their incoming tensors by fingerprint (the
tensors themselves are not kept): whole tensors, two-part concatenations along any dimension, and nothing
when the evidence is ambiguous."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from weightcheck.tap.coverage import CallCoverage, ParamCoverage, fingerprint, match_fingerprints  # noqa: E402


def test_fingerprint_reads_both_ends_without_copying_strided_tensors() -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    fp = fingerprint(t.t())  # non-contiguous view
    assert fp is not None and fp.shape == (6, 4)
    assert fp.head == (0.0, 6.0, 12.0, 18.0) and fp.tail == (5.0, 11.0, 17.0, 23.0)
    assert fingerprint(torch.empty(0)) is None
    assert fingerprint(torch.tensor(3.5)) is not None


@pytest.mark.parametrize("dim", [0, 1])
def test_concatenation_is_matched_to_its_two_parts(dim: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(12, 16, generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(12, 16, generator=gen, dtype=torch.bfloat16)
    other = torch.randn(12, 16, generator=gen, dtype=torch.bfloat16)
    candidates = {1: fingerprint(q), 2: fingerprint(other), 3: fingerprint(kv)}
    fused = torch.cat([q, kv], dim=dim)
    assert sorted(match_fingerprints(fingerprint(fused), candidates)) == [1, 3]
    assert match_fingerprints(fingerprint(q), candidates) == [1]
    # The parts swapped: the first part must hold the head, the last part the tail.
    assert sorted(match_fingerprints(fingerprint(torch.cat([kv, q], dim=dim)), candidates)) == [1, 3]
    assert match_fingerprints(fingerprint(torch.cat([q, q], dim=dim)), {1: fingerprint(q)}) == []


def test_ambiguous_or_unrelated_writes_are_not_credited() -> None:
    zeros = torch.zeros(4, 8)
    assert match_fingerprints(fingerprint(zeros), {1: fingerprint(zeros), 2: fingerprint(zeros.clone())}) == []
    assert match_fingerprints(fingerprint(torch.ones(4, 8)), {1: fingerprint(zeros)}) == []


def test_a_write_long_after_its_sources_left_the_window_is_attributed() -> None:
    """What DeepSeek's thread-pool loader does: q_a and kv_a arrive, the fused write runs after 200 more
    incoming tensors; the pair is credited, nothing else."""
    gen = torch.Generator().manual_seed(1)
    entries: dict[int, dict] = {}
    params = {"fused": ParamCoverage(dtype="F32", shape=(24, 16), tracked=True)}
    call = CallCoverage(entries, params, default_loader=None)
    q, kv = torch.randn(12, 16, generator=gen), torch.randn(12, 16, generator=gen)
    stream = [q, kv] + [torch.randn(8, generator=gen) for _ in range(200)]
    for seq, tensor in enumerate(stream):
        entries[seq] = {}
        call.note_incoming(seq, tensor)
    call.record_write("fused", torch.cat([q, kv]), None, None, None, False)
    assert list(entries[0]["wrote"]) == ["fused"] and list(entries[1]["wrote"]) == ["fused"]
    assert not any("wrote" in entries[s] for s in range(2, len(stream)))
    assert call.unattributed_writes == 0
