"""The load_weights tap on small torch modules that load weights the way SGLang models do (parameters carry
their own `weight_loader`; stacked and expert parameters take shard/expert ids; unknown names are dropped
silently). No SGLang needed: tests/sglang/ runs the same tap inside real SGLang model classes."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from weightcheck import tap
from weightcheck.digest import digest_tensor
from weightcheck.tap.records import RecordError, read_record

H = 8


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    assert param.shape == loaded_weight.shape
    param.data.copy_(loaded_weight)


class QKVParallelLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3 * H, H), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id: str) -> None:
        index = "qkv".index(loaded_shard_id)
        param.data[index * H : (index + 1) * H].copy_(loaded_weight)


class FusedMoE(nn.Module):
    """Expert weights `[local experts, out, in]`; experts of other EP ranks are skipped silently."""

    def __init__(self, num_experts: int = 4, ep_rank: int = 0, ep_size: int = 1) -> None:
        super().__init__()
        self.num_local_experts = num_experts // ep_size
        self.ep_rank = ep_rank
        self.w13_weight = nn.Parameter(torch.zeros(self.num_local_experts, 2 * H, H), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.zeros(self.num_local_experts, H, H), requires_grad=False)
        for param in (self.w13_weight, self.w2_weight):
            param.weight_loader = self.weight_loader

    def _map_global_expert_id_to_local_expert_id(self, expert_id: int) -> int:
        local = expert_id - self.ep_rank * self.num_local_experts
        return local if 0 <= local < self.num_local_experts else -1

    def weight_loader(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, weight_name: str, shard_id: str, expert_id: int
    ) -> None:
        local = self._map_global_expert_id_to_local_expert_id(expert_id)
        if local == -1:
            return
        if shard_id == "w2":
            param.data[local].copy_(loaded_weight)
        else:
            half = 0 if shard_id == "w1" else 1
            param.data[local, half * H : (half + 1) * H].copy_(loaded_weight)


class ReadOnlyLoaderParameter(nn.Parameter):
    """Like SGLang's BasevLLMParameter: `weight_loader` is a read-only property over `_weight_loader`."""

    def __new__(cls, data: torch.Tensor, weight_loader: Any) -> ReadOnlyLoaderParameter:
        return super().__new__(cls, data, requires_grad=False)

    def __init__(self, data: torch.Tensor, weight_loader: Any) -> None:
        self._weight_loader = weight_loader

    @property
    def weight_loader(self) -> Any:
        return self._weight_loader


class Layer(nn.Module):
    def __init__(self, moe: bool, ep_rank: int, ep_size: int) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear()
        self.norm = nn.Parameter(torch.zeros(H), requires_grad=False)  # no weight_loader: default loader
        self.experts = FusedMoE(ep_rank=ep_rank, ep_size=ep_size) if moe else None
        self.scale = ReadOnlyLoaderParameter(torch.zeros(1), default_loader)


class Engine(nn.Module):
    """An SGLang-style model: stacked q/k/v, expert mapping, unknown names dropped without a word."""

    def __init__(self, layers: int = 2, moe: bool = False, ep_rank: int = 0, ep_size: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(moe, ep_rank, ep_size) for _ in range(layers))

    def load_weights(self, weights: Any, is_mtp: bool = False) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            for shard in "qkv":
                if f".{shard}_proj." in name:
                    target = name.replace(f"{shard}_proj", "qkv_proj")
                    if target in params:
                        params[target].weight_loader(params[target], tensor, shard)
                    break
            else:
                if ".experts." in name and ".experts.w" not in name:
                    prefix, rest = name.split(".experts.", 1)
                    expert, proj, _ = rest.split(".")
                    shard = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[proj]
                    target = f"{prefix}.experts.{'w2' if shard == 'w2' else 'w13'}_weight"
                    param = params[target]
                    param.weight_loader(param, tensor, name, shard_id=shard, expert_id=int(expert))
                elif name in params:
                    param = params[name]
                    getattr(param, "weight_loader", default_loader)(param, tensor)


def stream(layers: int = 2, moe: bool = False, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out: list[tuple[str, torch.Tensor]] = []
    for layer in range(layers):
        for shard in "qkv":
            out.append((f"layers.{layer}.{shard}_proj.weight", torch.randn(H, H, generator=generator)))
        out.append((f"layers.{layer}.norm", torch.randn(H, generator=generator)))
        out.append((f"layers.{layer}.scale", torch.randn(1, generator=generator)))
        if moe:
            for expert in range(4):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    name = f"layers.{layer}.experts.{expert}.{proj}.weight"
                    out.append((name, torch.randn(H, H, generator=generator)))
    return out


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "records"
    tap.configure(root, digest_threads=2)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(Engine)
    yield root
    tap.uninstall(Engine)
    tap.configure(None)
    tap.set_engine_hooks(tap.EngineHooks())


def only_record(root: Path, seq: int = 0) -> tap.SyncRecord:
    (path,) = (root / f"sync-{seq:05d}").glob("*.jsonl")
    return read_record(path)


# ---- switching on and off ------------------------------------------------------------------------------


def test_off_by_default_is_a_plain_call(tmp_path: Path) -> None:
    tap.configure(None)
    tap.install(Engine)
    try:
        model = Engine()
        model.load_weights(stream())
        assert not list(tmp_path.iterdir())
        # With the tap off the parameters keep their own loaders (nothing was wrapped).
        assert model.layers[0].qkv_proj.weight.weight_loader == model.layers[0].qkv_proj.weight_loader
        assert "weight_loader" not in model.layers[0].norm.__dict__
    finally:
        tap.uninstall(Engine)
    assert "load_weights" not in {k for k, v in vars(Engine).items() if getattr(v, "__weightcheck_tap__", False)}


def test_config_from_env() -> None:
    assert tap.config_from_env({}) is None
    config = tap.config_from_env({"WEIGHTCHECK_DIR": "/x", "WEIGHTCHECK_TAP_TENSORS": "1", "WEIGHTCHECK_STRICT": "yes"})
    assert config is not None and config.directory == Path("/x") and config.keep_tensors and config.strict
    assert not config.synchronous_digest


def test_plugin_register_is_free_without_weightcheck_dir() -> None:
    """The SGLang entry point must import nothing (no torch, no sglang) and patch nothing when off."""
    code = (
        "import sys, os; os.environ.pop('WEIGHTCHECK_DIR', None);"
        "from weightcheck.tap.sglang_plugin import register; register();"
        "bad = [m for m in ('torch', 'sglang') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_plugin_register_without_sglang_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from weightcheck.tap import sglang_plugin

    monkeypatch.setenv("WEIGHTCHECK_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "sglang", None)  # an import of sglang raises ImportError
    try:
        sglang_plugin.register()  # falls back to class patching, which cannot find SGLang: logged, not raised
    finally:
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())


# ---- records --------------------------------------------------------------------------------------------


def test_record_lists_every_tensor_with_its_digest_and_the_engine_coverage(records: Path) -> None:
    model = Engine()
    sent = stream()
    sent.append(("layers.0.mlp.gate.weight_packed", torch.zeros(2, 2, dtype=torch.int32)))  # unknown name
    with tap.sync("step-3"):
        model.load_weights(iter(sent))
    record = only_record(records)
    assert record.weight_version == "step-3" and record.header["sync"]["source"] == "manual"
    assert [e.name for e in record.tensors] == [n for n, _ in sent]
    assert record.header["digest"] == "xxh3_128"  # the default when xxhash is installed (a test dependency)
    for entry, (_, tensor) in zip(record.tensors, sent, strict=True):
        assert entry.algorithm == "xxh3_128" and len(entry.hexdigest or "") == 32
        assert entry.hexdigest == digest_tensor(tensor, "xxh3_128").hexdigest
        assert entry.dtype == ("I32" if tensor.dtype == torch.int32 else "F32")
    by_name = {e.name: e for e in record.tensors}
    assert by_name["layers.0.k_proj.weight"].wrote == ["layers.0.qkv_proj.weight:k"]
    assert by_name["layers.1.norm"].wrote == ["layers.1.norm"]
    assert by_name["layers.0.scale"].wrote == ["layers.0.scale"]  # read-only `weight_loader` property
    assert by_name["layers.0.mlp.gate.weight_packed"].wrote == []  # dropped by the engine
    assert by_name["layers.0.mlp.gate.weight_packed"].zeros is True
    qkv = record.params["layers.0.qkv_proj.weight"]
    assert qkv.tracked and qkv.writes == 3 and qkv.shards_expected == ["k", "q", "v"] == qkv.shards_written
    assert all(p.writes > 0 for p in record.params.values())
    assert record.calls[0].names == len(sent) and record.calls[0].error is None


def test_loaders_are_restored_after_the_call(records: Path) -> None:
    model = Engine()
    qkv = model.layers[0].qkv_proj
    model.load_weights(stream())
    assert qkv.weight.weight_loader == qkv.weight_loader
    assert "weight_loader" not in model.layers[0].norm.__dict__
    assert model.layers[0].scale.weight_loader is default_loader


def test_one_shot_generator_stays_lazy_and_list_is_passed_unchanged(records: Path) -> None:
    seen: list[Any] = []

    class Probe(Engine):
        def load_weights(self, weights: Any, is_mtp: bool = False) -> None:
            seen.append(weights)
            super().load_weights(weights)

    tap.install(Probe)
    try:
        consumed: list[str] = []

        def generate() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in stream():
                consumed.append(name)
                yield name, tensor

        Probe().load_weights(generate())
        assert not isinstance(seen[0], list) and len(consumed) == len(stream())
        items = stream()
        Probe().load_weights(items)
        assert seen[1] is items
    finally:
        tap.uninstall(Probe)


def test_nan_and_zero_statistics(records: Path) -> None:
    sent = stream()
    sent[0] = (sent[0][0], torch.full((H, H), float("nan")))
    sent[1] = (sent[1][0], torch.zeros(H, H))
    Engine().load_weights(sent)
    entries = only_record(records).tensors
    assert entries[0].nonfinite == H * H and entries[0].zeros is False
    assert entries[1].zeros is True and entries[1].nonfinite == 0


def test_calls_inside_a_sync_share_one_record_and_bare_calls_get_their_own(records: Path) -> None:
    model = Engine()
    sent = stream()
    with tap.sync("v1"):
        model.load_weights(sent[:5])
        model.load_weights(sent[5:])
    model.load_weights(sent)
    first, second = only_record(records, 0), only_record(records, 1)
    assert [c.call for c in first.calls] == [0, 1] and {e.call for e in first.tensors} == {0, 1}
    assert second.header["sync"]["source"] == "call" and len(second.calls) == 1


def test_expert_coverage_and_offrank_experts(records: Path) -> None:
    model = Engine(moe=True, ep_rank=1, ep_size=2)  # holds experts 2..3
    model.load_weights(stream(moe=True))
    record = only_record(records)
    w13 = record.params["layers.0.experts.w13_weight"]
    assert w13.experts_local == 2 and w13.experts_written == [0, 1]
    assert w13.shards_expected == ["w1", "w3"] == w13.shards_written
    by_name = {e.name: e for e in record.tensors}
    assert (
        by_name["layers.0.experts.0.gate_proj.weight"].offrank
        and not by_name["layers.0.experts.0.gate_proj.weight"].wrote
    )
    assert by_name["layers.0.experts.3.down_proj.weight"].wrote == ["layers.0.experts.w2_weight:w2:3"]


class FusedPairEngine(nn.Module):
    """DeepSeek-style: `q_a` and `kv_a` are cached per call and written concatenated, from a thread pool."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = nn.Parameter(torch.zeros(3 * H, H), requires_grad=False)
        self.other = nn.Parameter(torch.zeros(H, H), requires_grad=False)

    def load_weights(self, weights: Any) -> None:
        cache: dict[str, torch.Tensor] = {}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = []
            for name, tensor in weights:
                if name in ("q_a", "kv_a"):
                    cache[name] = tensor
                    if len(cache) == 2:
                        fused = torch.cat([cache["q_a"], cache["kv_a"]])
                        futures.append(
                            pool.submit(getattr(self.fused, "weight_loader", default_loader), self.fused, fused)
                        )
                elif name == "other":
                    futures.append(pool.submit(default_loader_of(self.other), self.other, tensor.narrow(0, 0, H)))
            for future in futures:
                future.result()


def default_loader_of(param: torch.Tensor) -> Any:
    return getattr(param, "weight_loader", default_loader)


def test_writes_from_worker_threads_and_concatenated_pairs_are_attributed(records: Path) -> None:
    tap.install(FusedPairEngine)
    try:
        model = FusedPairEngine()
        sent = [("q_a", torch.randn(H, H)), ("kv_a", torch.randn(2 * H, H)), ("other", torch.randn(2 * H, H))]
        with tap.sync():
            model.load_weights(sent)
            model.load_weights(sent[:1])  # q_a alone in a call: the engine never fuses it
        record = only_record(records)
    finally:
        tap.uninstall(FusedPairEngine)
    first = [e for e in record.tensors if e.call == 0]
    assert {e.name: e.wrote for e in first} == {"q_a": ["fused"], "kv_a": ["fused"], "other": ["other"]}
    assert [e.wrote for e in record.tensors if e.call == 1] == [[]]
    assert record.calls[0].unattributed_writes == 0


def test_default_loader_identity_checks_leave_loaderless_params_untracked(records: Path, tmp_path: Path) -> None:
    """A model module that compares loaders with `is` against the default must not see a wrapper."""
    identity_check = "assert loader is default" + "_weight_loader"  # split: this module must not match itself
    source = (
        "import torch\nfrom torch import nn\n"
        "def default_weight_loader(param, w):\n    param.data.copy_(w)\n"
        "class Strict(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.norm = nn.Parameter(torch.zeros(4), requires_grad=False)\n"
        "    def load_weights(self, weights):\n"
        "        for name, w in weights:\n"
        "            loader = getattr(self.norm, 'weight_loader', default_weight_loader)\n"
        f"            {identity_check}\n"
        "            loader(self.norm, w)\n"
    )
    (tmp_path / "strict_engine.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        import strict_engine

        tap.install(strict_engine.Strict)
        strict_engine.Strict().load_weights([("norm", torch.ones(4))])
        record = only_record(records)
        assert record.params["norm"].tracked is False
        assert record.tensors[0].wrote == []  # unknown, not "dropped": verify skips untracked coverage
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("strict_engine", None)


def test_load_error_is_recorded_and_raised_unchanged(records: Path) -> None:
    model = Engine()
    qkv = model.layers[0].qkv_proj
    with pytest.raises(AssertionError):
        model.load_weights([("layers.0.norm", torch.zeros(3))])  # wrong shape: the default loader asserts
    assert qkv.weight.weight_loader == qkv.weight_loader
    record = only_record(records)
    assert record.calls[0].error is not None and record.calls[0].error.startswith("AssertionError")


def test_tap_failure_is_logged_not_raised_unless_strict(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    tap.install(Engine)
    try:
        tap.configure(blocker / "records")  # cannot be created: writing the record fails
        model = Engine()
        with caplog.at_level(logging.WARNING, logger="weightcheck.tap"):
            model.load_weights(stream())
        assert torch.equal(model.layers[1].norm, dict(stream())["layers.1.norm"])  # the load itself happened
        assert any("weightcheck tap" in r.getMessage() for r in caplog.records)
        tap.configure(blocker / "records", strict=True)
        with pytest.raises(OSError):
            Engine().load_weights(stream())
    finally:
        tap.uninstall(Engine)
        tap.configure(None)


def test_keep_tensors_writes_them_next_to_the_record(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tap.configure(tmp_path, keep_tensors=True)
    tap.install(Engine)
    try:
        sent = stream()
        Engine().load_weights(sent)
    finally:
        tap.uninstall(Engine)
        tap.configure(None)
    record = only_record(tmp_path)
    kept = load_file(str(record.path.parent / record.header["tensors_file"]))
    for entry, (_, tensor) in zip(record.tensors, sent, strict=True):
        assert torch.equal(kept[entry.tensor_key], tensor)


def test_nested_tapped_calls_record_once(records: Path) -> None:
    class Outer(Engine):
        def load_weights(self, weights: Any, is_mtp: bool = False) -> None:
            Engine.load_weights(self, weights)  # also tapped: must not record twice

    tap.install(Outer)
    try:
        Outer().load_weights(stream())
    finally:
        tap.uninstall(Outer)
    record = only_record(records)
    assert len(record.calls) == 1 and len(record.tensors) == len(stream())


def test_refused_request_writes_no_sync(records: Path) -> None:
    with tap.request_scope("v9"):
        pass  # the engine refused before loading anything
    assert not records.exists() or not list(records.iterdir())
    with tap.request_scope("v9"):
        Engine().load_weights(stream())
    assert only_record(records, 0).weight_version == "v9"


def test_session_hooks_open_and_close_one_sync_per_session(records: Path) -> None:
    from weightcheck.tap import sglang_plugin

    class Reply:
        success = True

    class Manager:
        def begin(self) -> Reply:
            return Reply()

        def end(self) -> Reply:
            return Reply()

        def update(self, request: Any) -> Reply:
            Engine().load_weights(stream())
            return Reply()

    class Request:
        weight_version = "step-11"

    manager = Manager()
    sglang_plugin._session_begin(Manager.begin, manager)
    sglang_plugin._request_hook("update_weights_from_tensor")(Manager.update, manager, Request())
    sglang_plugin._request_hook("update_weights_from_tensor")(Manager.update, manager, Request())
    sglang_plugin._session_end(Manager.end, manager)
    record = only_record(records)
    assert record.weight_version == "step-11" and len(record.calls) == 2
    assert record.header["sync"]["source"] == "session"


def test_class_patch_repoints_the_flashrl_marker() -> None:
    class Marked(Engine):
        def load_weights(self, weights: Any, is_mtp: bool = False) -> None:
            super().load_weights(weights)

        load_weights._supports_quantized_rl_reload = load_weights  # type: ignore[attr-defined]

    tap.install(Marked)
    try:
        assert Marked.load_weights._supports_quantized_rl_reload is Marked.load_weights
    finally:
        tap.uninstall(Marked)
    assert not getattr(Marked.load_weights, "__weightcheck_tap__", False)


def test_concurrent_engines_in_threads_do_not_mix_calls(records: Path) -> None:
    """Two loads on different threads inside one sync: each call keeps its own entries."""
    barrier = threading.Barrier(2)

    def load(seed: int) -> None:
        barrier.wait()
        Engine().load_weights(stream(seed=seed))

    with tap.sync():
        threads = [threading.Thread(target=load, args=(seed,)) for seed in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    record = only_record(records)
    assert len(record.tensors) == 2 * len(stream())
    assert all(e.wrote for e in record.tensors)


# ---- reading records back -------------------------------------------------------------------------


@pytest.fixture
def good_record(records: Path) -> Path:
    Engine().load_weights(stream())
    return only_record(records).path


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda lines: lines[:-1], "truncated"),
        (lambda lines: [lines[0], "{not json", *lines[1:]], "not valid JSON"),
        (lambda lines: [lines[0].replace("weightcheck-sync-record", "other"), *lines[1:]], "not a weightcheck"),
        (lambda lines: [re.sub(r'"schema_version":"[^"]*"', '"schema_version":"2.0"', lines[0]), *lines[1:]],
         "schema_version"),
        (lambda lines: [lines[0], *lines[2:]], "the file holds"),
        (lambda lines: [lines[0], lines[2].replace('"xxh3_128":"', '"xxh3_128":"zz'), *lines[3:]], "xxh3_128"),
        # a sha256-long digest in an xxh3_128 record: the length is checked per algorithm
        (lambda lines: [lines[0], re.sub(r'"xxh3_128":"(\w+)"', r'"xxh3_128":"\1\1"', lines[2]), *lines[3:]], "32"),
        (lambda lines: [lines[0], lines[2].replace('"xxh3_128":', '"sha256":'), *lines[3:]], "header says"),
        (lambda lines: [lines[0].replace('"digest":"xxh3_128"', '"digest":"md5"'), *lines[1:]], "algorithm"),
        (lambda lines: lines[1:], "first line"),
        (lambda lines: [*lines, "{}"], "after the 'end'"),
        (lambda lines: [], "empty"),
    ],
)
def test_damaged_records_raise_record_error(good_record: Path, damage: Any, why: str) -> None:
    lines = good_record.read_text().splitlines()
    good_record.write_text("\n".join(damage(lines)) + "\n")
    with pytest.raises(RecordError, match=why):
        read_record(good_record)


def test_records_are_written_atomically(records: Path) -> None:
    Engine().load_weights(stream())
    folder = records / "sync-00000"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temp file left behind
    header = json.loads(next(iter(folder.glob("*.jsonl"))).read_text().splitlines()[0])
    assert header["pid"] == os.getpid() and header["model"]["class"] == "Engine"


@pytest.mark.parametrize(
    ("tensor", "zeros", "nonfinite"),
    [
        (torch.zeros(4, 4, dtype=torch.bfloat16), True, 0),
        (torch.tensor([0.0, -0.0]), False, 0),  # bytes, not values: -0.0 has its sign bit set
        (torch.tensor([1.0, float("inf"), float("nan")], dtype=torch.float16), False, 2),
        (torch.tensor([[1.0, float("-inf")], [2.0, 3.0]], dtype=torch.bfloat16).t(), False, 1),  # non-contiguous
        (torch.zeros(3, dtype=torch.int32), True, 0),
        (torch.tensor([7], dtype=torch.int64), False, 0),
        (torch.empty(0), None, 0),
    ],
)
def test_tensor_stats(tensor: torch.Tensor, zeros: bool | None, nonfinite: int | None) -> None:
    from weightcheck.tap.digesting import describe_tensor, tensor_stats

    assert tensor_stats(tensor) == (zeros, nonfinite)
    described = describe_tensor(tensor)
    assert described["sha256"] == digest_tensor(tensor).sha256 and described["zeros"] == zeros


def test_tensor_stats_on_float8_never_raise() -> None:
    from weightcheck.tap.digesting import describe_tensor

    described = describe_tensor(torch.zeros(4).to(torch.float8_e4m3fn))
    assert described["dtype"] == "F8_E4M3" and described["zeros"] is True
    assert described["nonfinite"] in (0, None)


def test_sync_left_open_at_exit_is_written_as_incomplete(tmp_path: Path) -> None:
    code = (
        "import torch, sys; sys.path.insert(0, 'tests');"
        "from weightcheck import tap; from test_tap import Engine, default_loader, stream;"
        f"tap.configure({str(tmp_path)!r}); tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader));"
        "tap.install(Engine); tap.begin_sync(source='session'); Engine().load_weights(stream())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    record = only_record(tmp_path)
    assert record.header["sync"]["incomplete"] is True and len(record.tensors) == len(stream())
    from weightcheck.verifying import verify

    assert [f.code for f in verify(tmp_path).findings] == ["WC739"]
