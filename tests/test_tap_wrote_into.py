"""An engine that writes into the tensor it is handed (WC746): SGLang 0.5.23's Gemma adds 1 to each norm weight
before loading it (`GemmaForCausalLM.load_weights`, `models/gemma.py`: `if "norm.weight" in name: loaded_weight
+= 1.0`). The tap digests the stream's small CPU tensors after the engine has seen them (the bucket), and big
ones on digest threads, so it must never record the loader's bytes as what arrived: that read as "bytes
differ" (WC727) on a clean sync. The tensor's version counter says the engine wrote into it: the entry says so,
verify reports it as not compared (WC746, a warning), and the tap digests that name on arrival from then on.

The checkpoint is a tiny Gemma written by transformers `save_pretrained`; the engine loads it the way SGLang's
Gemma does (tests/sglang/test_sglang_verify.py runs SGLang's own class)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from weightcheck import tap
from weightcheck.findings import Result, Severity
from weightcheck.tap import core, digesting
from weightcheck.tap.records import ENGINE_WROTE_INTO_SENT
from weightcheck.verifying import verify


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """SGLang's `default_weight_loader`: a copy."""
    assert param.size() == loaded_weight.size()
    param.data.copy_(loaded_weight)


class GemmaLike(nn.Module):
    """Parameters named and shaped as the checkpoint's; `load_weights` as SGLang 0.5.23's Gemma (the stacked
    q/k/v and gate/up mappings left out: the checkpoint's names are loaded as they are)."""

    def __init__(self, stream: list[tuple[str, torch.Tensor]], writes_into_norms: bool = True) -> None:
        super().__init__()
        self.params = nn.ParameterDict(
            {name.replace(".", "__"): nn.Parameter(torch.zeros_like(t), requires_grad=False) for name, t in stream}
        )
        self.writes_into_norms = writes_into_norms

    def load_weights(self, weights: Any) -> None:
        params = {name.replace("__", "."): p for name, p in self.params.items()}
        for name, loaded_weight in weights:
            if self.writes_into_norms and "norm.weight" in name:
                loaded_weight += 1.0  # GemmaRMSNorm computes with (1 + w): SGLang stores w + 1
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, loaded_weight)


@pytest.fixture
def gemma(tmp_path: Path) -> Iterator[tuple[Path, Path, list[tuple[str, torch.Tensor]]]]:
    from safetensors import safe_open
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(5)
    # The MLP weights (64 x 2048 F32, 512 KiB) are above the tap's small-tensor size: they go one at a time and
    # drain the bucket of norms before them, so some norms are digested before the engine's write.
    config = GemmaConfig(hidden_size=64, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64)  # fmt: skip
    ckpt = tmp_path / "gemma"
    GemmaForCausalLM(config).save_pretrained(ckpt)
    stream: list[tuple[str, torch.Tensor]] = []
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as fh:
        for name in fh.keys():
            stream.append((name, fh.get_tensor(name)))
    records = tmp_path / "records"
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_weight_loader))
    tap.install(GemmaLike)
    try:
        yield records, ckpt, stream
    finally:
        tap.configure(None)
        tap.uninstall(GemmaLike)
        tap.set_engine_hooks(tap.EngineHooks())


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh engine process: no name learned yet."""
    monkeypatch.setattr(digesting, "_WROTE_INTO", set())


def norms(stream: list[tuple[str, torch.Tensor]]) -> list[str]:
    return sorted(name for name, _ in stream if "norm.weight" in name)


def sync(model: GemmaLike, stream: list[tuple[str, torch.Tensor]], version: str) -> None:
    """One sync: the trainer's tensors (fresh copies, as a receive makes them) through one load_weights call."""
    with tap.sync(version):
        model.load_weights((name, tensor.clone()) for name, tensor in stream)


def by_code(result: Result) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for finding in result.findings:
        out.setdefault(finding.code, []).append(finding)
    return out


def test_norms_the_engine_writes_into_are_not_compared_then_digested_on_arrival(gemma: Any) -> None:
    records, ckpt, stream = gemma
    tap.configure(records)
    model = GemmaLike(stream)
    for step in range(3):
        sync(model, stream, f"step-{step}")
    first = verify(records, ckpt, sync=0)
    assert set(by_code(first)) == {"WC746"}, [(f.code, f.message) for f in first.findings]
    (finding,) = first.findings
    assert finding.severity == Severity.WARNING and finding.details["names"] == norms(stream)
    assert "not compared" in finding.message
    record = tap.read_record(next((records / "sync-00000").glob("*.jsonl")))
    entries = {e.name: e for e in record.tensors}
    assert all(entries[n].error == ENGINE_WROTE_INTO_SENT and entries[n].hexdigest is None for n in norms(stream))
    assert all(e.hexdigest for n, e in entries.items() if n not in norms(stream))
    for later in (1, 2):  # the norms were digested as they arrived, before the engine's write
        result = verify(records, ckpt, sync=later)
        assert result.findings == [], [(f.code, f.message) for f in result.findings]
        assert result.checked["tensors"] == len(stream)


def test_a_wrong_norm_is_still_caught_once_its_name_is_digested_on_arrival(gemma: Any) -> None:
    records, ckpt, stream = gemma
    tap.configure(records)
    model = GemmaLike(stream)
    sync(model, stream, "step-0")
    victim = norms(stream)[0]
    bad = [(name, t + 0.5 if name == victim else t) for name, t in stream]  # (Gemma's norms start at 0)
    sync(model, bad, "step-1")
    result = verify(records, ckpt, sync=1)
    assert [(f.code, f.location.tensor) for f in result.findings if f.severity == Severity.ERROR] == [
        ("WC727", victim)
    ], [(f.code, f.message) for f in result.findings]


def test_an_engine_that_copies_what_it_is_handed_gets_no_wc746(gemma: Any) -> None:
    records, ckpt, stream = gemma
    tap.configure(records)
    sync(GemmaLike(stream, writes_into_norms=False), stream, "step-0")
    result = verify(records, ckpt)
    assert result.findings == [], [(f.code, f.message) for f in result.findings]


def test_the_synchronous_digest_compares_them_in_the_first_sync(gemma: Any) -> None:
    """WC746's fix text: WEIGHTCHECK_TAP_SYNC_DIGEST=1 digests every tensor as it arrives."""
    records, ckpt, stream = gemma
    tap.configure(records, synchronous_digest=True)
    sync(GemmaLike(stream), stream, "step-0")
    result = verify(records, ckpt)
    assert result.findings == [], [(f.code, f.message) for f in result.findings]


class _Later:
    """A digest pool whose jobs run when their result is asked for (at the call's end): as a busy pool would,
    after the engine has written into the tensor."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future[None], Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        future: Future[None] = Future()
        original = future.result

        def result(timeout: float | None = None) -> None:
            if not future.done():
                fn(*args)
                future.set_result(None)
            return original(timeout)

        future.result = result  # type: ignore[method-assign]
        return future


def test_a_big_tensor_a_digest_thread_reaches_after_the_engine_wrote_into_it(
    gemma: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor above the bucket's size goes to a digest thread; one that runs after the loader wrote into the
    tensor records it as not digested (WC746), never the loader's bytes."""
    from safetensors.torch import save_file

    records, _ckpt, _stream = gemma
    big = [("model.norm.weight", torch.randn(300, 300)), ("model.proj.weight", torch.randn(300, 300))]
    assert all(t.nbytes > digesting.SMALL_TENSOR_BYTES for _, t in big)
    ckpt = tmp_path / "big"
    ckpt.mkdir()
    save_file(dict(big), str(ckpt / "model.safetensors"))
    monkeypatch.setattr(core, "_digest_pool", lambda config: _Later())
    tap.configure(records, digest_threads=2)
    model = GemmaLike(big)
    sync(model, big, "step-0")
    sync(model, big, "step-1")
    first = verify(records, ckpt, sync=0)
    assert [(f.code, f.details["names"]) for f in first.findings] == [("WC746", ["model.norm.weight"])]
    second = verify(records, ckpt, sync=1)
    assert second.findings == [], [(f.code, f.message) for f in second.findings]


def test_tensors_made_under_inference_mode_have_no_version_and_are_digested(gemma: Any) -> None:
    """A tensor made under `torch.inference_mode` has no version counter (reading it raises): the tap records
    it as before, without the check (a write into one goes unseen: documented)."""
    records, ckpt, stream = gemma
    with torch.inference_mode():
        frozen = [(name, tensor.clone()) for name, tensor in stream]
    with pytest.raises(RuntimeError):
        _ = frozen[0][1]._version
    tap.configure(records)
    model = GemmaLike(stream, writes_into_norms=False)
    with tap.sync("step-0"):
        model.load_weights(iter(frozen))
    result = verify(records, ckpt)
    assert result.findings == [], [(f.code, f.message) for f in result.findings]
    assert result.checked["tensors"] == len(stream)


@pytest.mark.parametrize("as_list", [False, True], ids=["iterator", "list"])
def test_with_the_engine_state_a_norm_the_engine_transformed_is_not_called_overwritten(
    gemma: Any, as_list: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `WEIGHTCHECK_STATE=1`, WC743 compares a parameter written whole by one tensor with that tensor's
    digest. Gemma's norm parameter holds what arrived + 1 by design: the entry says the engine wrote into the
    tensor (`engine_wrote`), and WC743 leaves it alone, from an iterator (names digested on arrival from the
    second sync) or from a list (the caller holds it: its version read again when the call ends). Batches of 2
    tensors: a list's small tensors are then digested as the tap records the list, before the engine runs (a
    real stream fills the 4,096-tensor batches the same way)."""
    records, ckpt, stream = gemma
    monkeypatch.setattr(core, "_BATCH_TENSORS", 2)
    tap.configure(records, state=True)
    model = GemmaLike(stream)
    for step in range(3):
        with tap.sync(f"step-{step}"):
            sent = [(name, tensor.clone()) for name, tensor in stream]
            model.load_weights(sent if as_list else iter(sent))
    codes = [{f.code for f in verify(records, ckpt, sync=step).findings} for step in range(3)]
    assert codes == [set() if as_list else {"WC746"}, set(), set()], codes
    record = tap.read_record(next((records / "sync-00002").glob("*.jsonl")))
    flagged = sorted(e.name for e in record.tensors if e.engine_wrote)
    assert flagged == norms(stream)
    assert all(e.hexdigest for e in record.tensors)  # digested before the engine's write


def test_a_parameter_overwritten_after_the_load_is_still_reported(gemma: Any) -> None:
    """The mark covers only the tensor the engine wrote into: another parameter overwritten after the load
    (outside load_weights) is still WC743; a marked norm overwritten so is WC740 (its state after the startup
    load differs), not WC743, which cannot tell that write from the engine's own +1."""
    records, ckpt, stream = gemma
    tap.configure(records, state=True)
    model = GemmaLike(stream)
    sync(model, stream, "step-0")
    proj = next(name for name, _ in stream if name.endswith("mlp.down_proj.weight")).replace(".", "__")
    with tap.sync("step-1"):
        model.load_weights((name, tensor.clone()) for name, tensor in stream)
        with torch.no_grad():
            model.params["model__norm__weight"].mul_(3)
            model.params[proj].mul_(3)
    result = verify(records, ckpt, sync=1)
    found = {f.code: f.details["params"] for f in result.findings}
    assert found["WC743"] == [f"params.{proj}"], found
    assert "params.model__norm__weight" in found["WC740"] and f"params.{proj}" in found["WC740"]


def test_the_synchronous_digest_with_the_engine_state_marks_what_the_engine_wrote_into(gemma: Any) -> None:
    """`WEIGHTCHECK_TAP_SYNC_DIGEST=1` (WC746's fix text) with `WEIGHTCHECK_STATE=1`: every tensor is digested
    as it arrives; the one before is read again when the next comes, so the norms are marked and WC743 leaves
    them alone from the first sync on."""
    records, ckpt, stream = gemma
    tap.configure(records, synchronous_digest=True, state=True)
    model = GemmaLike(stream)
    for step in range(2):
        sync(model, stream, f"step-{step}")
    for step in range(2):
        result = verify(records, ckpt, sync=step)
        assert result.findings == [], [(f.code, f.message) for f in result.findings]
    record = tap.read_record(next((records / "sync-00000").glob("*.jsonl")))
    assert sorted(e.name for e in record.tensors if e.engine_wrote) == norms(stream)


def test_a_streamed_tensor_is_not_kept_alive_for_the_whole_call(gemma: Any) -> None:
    """The check holds one tensor (the previous), not the stream: of 400 streamed norms the engine drops after
    loading, at most the coverage's recent tensors (a window of 64 for matching late writes, and up to 64 not yet
    filed into it) and the check's one are alive when the stream ends, in the synchronous-digest mode too."""
    import weakref

    from weightcheck.tap import coverage

    records, _ckpt, _stream = gemma
    stream = [(f"model.layers.{i}.input_layernorm.weight", torch.randn(64)) for i in range(400)]
    tap.configure(records, synchronous_digest=True)
    model = GemmaLike(stream)
    refs: list[Any] = []
    alive_at_end: list[int] = []

    def sent() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in stream:
            copy = tensor.clone()
            refs.append(weakref.ref(copy))
            yield name, copy
        alive_at_end.append(sum(ref() is not None for ref in refs))

    with tap.sync("step-0"):
        model.load_weights(sent())
    assert alive_at_end and alive_at_end[0] <= 2 * coverage._RECENT_FOR_VALUE_MATCH + 2, alive_at_end
