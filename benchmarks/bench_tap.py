"""Tap overhead on a streamed ~1 GB model, and `weightcheck verify` time on that stream.

Builds a ~1 GB BF16 checkpoint (Llama-style names, written with safetensors' own writer) and an engine that
loads it the way SGLang models do: stacked `qkv_proj` / `gate_up_proj` parameters with their own
`weight_loader` (shard ids), norms through the default loader. With `--engine sglang` (needs sglang) the
engine is SGLang's own `Qwen2ForCausalLM`, built on CPU in BF16 with a single-process gloo group.

In one run, alternating, it times `load_weights` over the streamed checkpoint with the tap off and on
(digest-only: the tap's digest, xxh3_128 by default or `--digest sha256`, + zero/NaN statistics of every
tensor, engine coverage). The stream is what SGLang's
startup loader iterates (`safe_open(...).get_tensor(name)` shard by shard, page cache warm), so reading is
part of the load. Then it times `weightcheck verify` of the recorded sync against the checkpoint (which
hashes the whole checkpoint) and against a trainer manifest.

Side by side in the same run it also times the baseline that bounds any full digest on a CPU: the load
with tap off plus **one extra read pass** over the same bytes (numpy `any` over each tensor's byte view, at
memory speed), and reports the tap's added time as a multiple of that pass's added time, in wall time and in
process CPU time (all threads: on a shared machine the wall-time ratio also measures how busy the other
cores were, and its denominator is smaller than the load's run-to-run spread), from the medians and from the
least-disturbed rounds (minima), and the same for the other way of digesting in the same rounds (digest threads
beside the load, or each tensor on the loading thread as it passes: the tap's default on at most 2 cores).
Finally it times
the digests alone over the streamed tensors: xxh3_128 (host bytes) and `posmix128` (torch integer kernels
on the tensor's device, `weightcheck.devdigest`).

`--device cuda` (GPU branch, not run here: no GPU was lent to this work) moves the engine to the GPU and
streams each tensor to it (`.to("cuda")`, as a receive does), synchronizing before each timing; the tap's
added time is then reported as a share of `load_weights` (the issue's target: <= 5 % with posmix128).

    .venv/bin/python benchmarks/bench_tap.py [--gb 1.0] [--repeats 5] [--engine generic|sglang]
        [--digest xxh3_128|sha256|posmix128] [--threads N] [--device cpu|cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

HIDDEN = 2048
INTERMEDIATE = 5632
VOCAB = 32000
HEADS, KV_HEADS = 16, 16


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    param.data.copy_(loaded_weight)


class QKVParallelLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(3 * HIDDEN, HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id: str) -> None:
        index = "qkv".index(loaded_shard_id)
        param.data.narrow(0, index * HIDDEN, HIDDEN).copy_(loaded_weight)


class MergedColumnParallelLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.output_sizes = [INTERMEDIATE, INTERMEDIATE]
        self.weight = nn.Parameter(torch.empty(2 * INTERMEDIATE, HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id: int) -> None:
        param.data.narrow(0, loaded_shard_id * INTERMEDIATE, INTERMEDIATE).copy_(loaded_weight)


class Plain(nn.Module):
    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape, dtype=torch.bfloat16), requires_grad=False)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = QKVParallelLinear()
        self.self_attn.o_proj = Plain(HIDDEN, HIDDEN)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear()
        self.mlp.down_proj = Plain(HIDDEN, INTERMEDIATE)
        self.input_layernorm = Plain(HIDDEN)
        self.post_attention_layernorm = Plain(HIDDEN)


class GenericEngine(nn.Module):
    """SGLang's loading pattern (`stacked_params_mapping`, per-parameter `weight_loader`) without SGLang."""

    STACKED = (
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    )

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = Plain(VOCAB, HIDDEN)
        self.model.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.model.norm = Plain(HIDDEN)

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            for param_name, shard_name, shard_id in self.STACKED:
                if shard_name not in name:
                    continue
                target = name.replace(shard_name, param_name)
                param = params[target]
                param.weight_loader(param, tensor, shard_id)
                break
            else:
                if name in params:
                    param = params[name]
                    getattr(param, "weight_loader", default_loader)(param, tensor)


def layers_for(gigabytes: float) -> int:
    per_layer = 2 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN)
    return max(1, round((gigabytes * 1e9 - 2 * VOCAB * HIDDEN) / per_layer))


def write_checkpoint(folder: Path, layers: int) -> int:
    """Random BF16 tensors with Llama/Qwen2 checkpoint names, in ~400 MB shards. Returns bytes written."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN)}
    shard, total, index = 0, 0, {}

    def flush() -> None:
        nonlocal shard, tensors
        if tensors:
            name = f"model-{shard:05d}.safetensors"
            save_file(tensors, str(folder / name), metadata={"format": "pt"})
            index.update(dict.fromkeys(tensors, name))
            shard += 1
            tensors = {}

    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{prefix}.self_attn.{proj}.weight"] = rand(HIDDEN, HIDDEN)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.mlp.up_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.mlp.down_proj.weight"] = rand(HIDDEN, INTERMEDIATE)
        tensors[f"{prefix}.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        if sum(t.numel() * 2 for t in tensors.values()) > 400e6:
            total += sum(t.numel() * 2 for t in tensors.values())
            flush()
    tensors["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    total += sum(t.numel() * 2 for t in tensors.values())
    flush()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index})
    )
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "hidden_size": HIDDEN,
                "intermediate_size": INTERMEDIATE,
                "num_hidden_layers": layers,
                "num_attention_heads": HEADS,
                "num_key_value_heads": KV_HEADS,
                "vocab_size": VOCAB,
                "tie_word_embeddings": True,
                "torch_dtype": "bfloat16",
            }
        )
    )
    return total


def sglang_engine(layers: int) -> nn.Module:
    """SGLang's Qwen2ForCausalLM in BF16 on CPU (stubs as in tests/sglang/sglang_harness.py)."""
    import types

    vllm, ops = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = lambda *a, **k: None  # type: ignore[attr-defined]  # forward-only kernel
    vllm._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules.setdefault("vllm", vllm)
    sys.modules.setdefault("vllm._custom_ops", ops)
    from sglang.test.layer_ut_utils import init_single_process_dist

    init_single_process_dist(master_port=29655, backend="gloo")
    from sglang.srt.models.qwen2 import Qwen2ForCausalLM
    from transformers import Qwen2Config

    config = Qwen2Config(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)


class SmallEngine(nn.Module):
    """Many small parameters (norms, biases, scales: what makes a DeepSeek-V3-size sync ~90,000 tensors), each
    written by the default loader, as SGLang's `load_weights` does for an unstacked name."""

    def __init__(self, count: int, elements: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(elements, dtype=torch.bfloat16), requires_grad=False) for _ in range(count)
        )

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            param = params[name]
            getattr(param, "weight_loader", default_loader)(param, tensor)


def small_tensor_overhead(
    records: Path, count: int, elements: int, repeats: int, steady_syncs: int = 5
) -> dict[str, float]:
    """Per-tensor cost of the tap on a stream of `count` small BF16 tensors, against the untapped load_weights
    in the same run, at the first sync of an engine and in the steady state.

    Each of `repeats` rounds builds a fresh engine and times: an untapped load, then with the tap configured
    once (as a run sets `WEIGHTCHECK_DIR` once) the first sync (every loader wrapped one by one) and
    `steady_syncs` more syncs (sync 2..N: the loaders put back in bulk), then an untapped load again.
    Reported: medians over the rounds (the steady state: the median of each round's steady syncs), in
    process CPU time (all threads: on a shared machine the stable figure) and wall time. The parameters are
    written by the default loader, which the tap knows (`EngineHooks.default_loader`, as SGLang's is), so
    every parameter is tracked."""
    from weightcheck import tap

    generator = torch.Generator().manual_seed(1)
    names = [name for name, _ in SmallEngine(count, 0).named_parameters()]
    stream = [(name, torch.randn(elements, generator=generator).to(torch.bfloat16)) for name in names]
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(SmallEngine)

    def once(engine: SmallEngine) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        engine.load_weights(iter(stream))
        return time.process_time() - cpu, time.perf_counter() - wall

    off: list[tuple[float, float]] = []
    first: list[tuple[float, float]] = []
    steady: list[tuple[float, float]] = []
    try:
        for _ in range(max(1, repeats)):
            shutil.rmtree(records, ignore_errors=True)
            engine = SmallEngine(count, elements)
            tap.configure(None)
            off.append(once(engine))
            tap.configure(records)
            first.append(once(engine))
            syncs = [once(engine) for _ in range(max(1, steady_syncs))]
            steady.append((statistics.median(c for c, _ in syncs), statistics.median(w for _, w in syncs)))
            tap.configure(None)
            off.append(once(engine))
    finally:
        tap.configure(None)
        tap.uninstall(SmallEngine)
        tap.set_engine_hooks(tap.EngineHooks())
        shutil.rmtree(records, ignore_errors=True)

    def per_tensor(values: list[tuple[float, float]], which: int) -> float:
        return statistics.median(v[which] for v in values) / count * 1e6

    out: dict[str, float] = {"tensors": count, "elements": elements, "rounds": repeats, "steady_syncs": steady_syncs}
    for clock, which in (("cpu", 0), ("wall", 1)):
        untapped = per_tensor(off, which)
        out[f"off_{clock}_us_per_tensor"] = untapped
        out[f"first_{clock}_us_per_tensor"] = per_tensor(first, which)
        out[f"steady_{clock}_us_per_tensor"] = per_tensor(steady, which)
        out[f"added_first_{clock}_us_per_tensor"] = per_tensor(first, which) - untapped
        out[f"added_{clock}_us_per_tensor"] = per_tensor(steady, which) - untapped  # the target's figure
    return out


def digest_throughputs(
    tensors: list[torch.Tensor], algorithm: str, repeats: int, device: torch.device
) -> dict[str, float]:
    """GB/s over the streamed tensors of: the device's copy (`clone`, the baseline: one read and one write of
    every byte), the tap's one-pass digest + statistics, the former two passes (digest, then the statistics),
    posmix128 on the torch kernels, and the fused posmix128 kernel (Triton; CUDA only)."""
    from weightcheck.devdigest import posmix128_tensor
    from weightcheck.digest import digest_tensor
    from weightcheck.fuseddigest import posmix128_fused, triton_available
    from weightcheck.tap.digesting import describe_one_pass, tensor_stats

    size = sum(t.nbytes for t in tensors)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def rate(work: Any, whole: bool = False) -> float:
        times = []
        for _ in range(max(1, repeats)):
            synchronize()
            started = time.perf_counter()
            if whole:  # one call over every tensor
                work(tensors)
            else:
                for tensor in tensors:
                    work(tensor)
            synchronize()
            times.append(time.perf_counter() - started)
        return size / statistics.median(times) / 1e9

    def measured(work: Any, whole: bool = False) -> float | str:
        try:
            return rate(work, whole)
        except Exception as exc:  # a kernel that does not build here is a figure too, not the end of the run
            return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

    out: dict[str, Any] = {"copy (clone)": rate(lambda t: t.clone())}
    if device.type == "cpu":
        out["one read pass (numpy any)"] = rate(lambda t: t.reshape(-1).view(torch.uint8).numpy().any())
        out[f"tap one pass: {algorithm} + stats"] = rate(lambda t: describe_one_pass(t, algorithm))
        out[f"former: {algorithm}, then stats"] = rate(lambda t: (digest_tensor(t, algorithm), tensor_stats(t)))
    out["posmix128, torch kernels"] = measured(posmix128_tensor)
    if device.type == "cuda" and triton_available():
        out["posmix128, fused Triton kernel"] = measured(posmix128_fused)
        from weightcheck.fuseddigest import fused_lanes
        from weightcheck.posmix import _byte_view

        for block in (1024, 2048, 4096):  # the lanes only, one wait per pass: what the tap's device batch does
            out[f"posmix128 fused lanes, no per-tensor wait, BLOCK={block} words"] = measured(
                lambda t, block=block: fused_lanes(_byte_view(t), block)
            )
        from weightcheck.tap.devicebatch import DeviceBatch

        def held(all_tensors: list[torch.Tensor]) -> None:
            batch = DeviceBatch()
            batch.hold = True
            for tensor in all_tensors:
                batch.add({}, tensor)
            batch.flush()  # the many-tensor launch(es); `rate` waits for the device

        out["posmix128 + stats, the tap's held path (one launch per hold)"] = measured(held, whole=True)
    return out


def added_ratio(series: list[float], baseline: dict[str, list[float]], pick: Any) -> float:
    """(pick(series) - pick(off)) / (pick(read) - pick(off)): the added time as a multiple of one read pass's."""
    off = pick(baseline["off"])
    return (pick(series) - off) / max(pick(baseline["read"]) - off, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="checkpoint size in GB (default 1.0)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--byte-rounds",
        type=int,
        default=None,
        help="alternating rounds of the byte-overhead loads (default 3 × --repeats: the ratio's denominator, one "
        "read pass, is smaller than a shared machine's run-to-run spread of the load)",
    )
    parser.add_argument("--engine", choices=("generic", "sglang"), default="generic")
    parser.add_argument(
        "--threads", type=int, default=None, help="digest threads (default: the tap's, 0 on at most 2 cores)"
    )
    parser.add_argument(
        "--digest", choices=("xxh3_128", "sha256", "posmix128"), default=None, help="default: the tap's default"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the engine lives")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep", type=Path, default=None, help="use/keep the checkpoint in this folder")
    parser.add_argument("--small", type=int, default=20000, help="small tensors in the per-tensor stream")
    parser.add_argument(
        "--small-only", action="store_true", help="only the per-tensor stream (first sync and steady state)"
    )
    parser.add_argument("--no-small", action="store_true", help="skip the per-tensor stream (CPU-only work)")
    parser.add_argument(
        "--state", action="store_true",
        help="also time the tap with the engine-state digest (WEIGHTCHECK_STATE=1), alternated with the others",
    )  # fmt: skip
    parser.add_argument(
        "--no-verify", action="store_true", help="skip timing verify and the trainer manifest (they hash on CPU)"
    )
    args = parser.parse_args()
    if args.small_only:
        small = small_tensor_overhead(Path(tempfile.mkdtemp(prefix="bench-tap-small-")), args.small, 64, args.repeats)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        print(json.dumps({**small, "load_average": load}, indent=1))
        if args.json:
            args.json.write_text(json.dumps({"small_tensor_stream": small, "load_average": load}, indent=1))
        return 0

    from weightcheck import tap
    from weightcheck.digest import live_algorithm
    from weightcheck.manifest import write_manifest
    from weightcheck.tensors import TensorStore
    from weightcheck.verifying import verify

    work = Path(tempfile.mkdtemp(prefix="bench-tap-"))
    ckpt = args.keep or work / "ckpt"
    layers = layers_for(args.gb)
    if not (ckpt / "model.safetensors.index.json").exists():
        ckpt.mkdir(parents=True, exist_ok=True)
        write_checkpoint(ckpt, layers)
    else:
        layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    size = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    engine = sglang_engine(layers) if args.engine == "sglang" else GenericEngine(layers)
    device = torch.device(args.device)
    engine.to(device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    klass = type(engine)
    if args.engine == "sglang":
        from weightcheck.tap.sglang_plugin import _sglang_default_loader

        loader = _sglang_default_loader()
    else:
        loader = default_loader
    tap.set_engine_hooks(tap.EngineHooks(default_loader=loader))
    tap.install(klass)
    records = work / "records"

    from safetensors import safe_open

    shards = sorted(ckpt.glob("*.safetensors"))

    def checkpoint_stream(read_pass: bool = False) -> Any:
        # SGLang's safetensors_weights_iterator: one shard at a time, each tensor copied out of the mapping.
        for shard in shards:
            with safe_open(str(shard), framework="pt") as fh:
                for name in fh.keys():
                    tensor = fh.get_tensor(name)
                    if device.type != "cpu":
                        tensor = tensor.to(device)
                    if read_pass:  # the baseline: one extra pass reading every byte, at memory speed
                        raw = tensor.reshape(-1).view(torch.uint8)
                        if device.type == "cpu":
                            raw.numpy().any()
                        else:
                            raw.any()
                    yield name, tensor

    for shard in shards:  # warm the page cache outside the timed region
        shard.read_bytes()

    algorithm = live_algorithm(args.digest)

    from weightcheck.tap.core import default_digest_threads

    threads = args.threads if args.threads is not None else default_digest_threads()
    # The other way of digesting, side by side: digest threads beside the load, or each tensor on the loading
    # thread as it passes (0 threads: the default on at most 2 cores).
    other_threads = 2 if threads == 0 else 0
    cpu_seconds: dict[str, list[float]] = {
        "off": [], "read": [], "on": [], "other": [], "state": [], "numpy": [], "held": []
    }  # fmt: skip
    from weightcheck import native
    from weightcheck.tap import digesting
    from weightcheck.tap.devicebatch import ENV_HOLD

    # The compiled fused pass (weightcheck._onepass) against the numpy loop it replaces, in the same rounds.
    native_level = digesting.native_level()
    native_module = list(native._onepass)

    def load_once(
        enabled: bool,
        read_pass: bool = False,
        other: bool = False,
        state: bool = False,
        numpy_loop: bool = False,
        held: bool = False,
    ) -> float:
        native._onepass[:] = [None] if numpy_loop else native_module
        # held: GPU tensors held and launched together (WEIGHTCHECK_DEVICE_HOLD=1, opt-in), same rounds.
        if held:
            os.environ[ENV_HOLD] = "1"
        else:
            os.environ.pop(ENV_HOLD, None)
        if enabled:
            tap.configure(records, digest_threads=other_threads if other else threads, digest=algorithm, state=state)
        else:
            tap.configure(None)
        synchronize()
        started, cpu_started = time.perf_counter(), time.process_time()
        engine.load_weights(checkpoint_stream(read_pass))
        synchronize()
        # Process CPU time (all threads, the digest threads included) as well as wall time: on a shared machine
        # the wall-time ratio says how busy the other cores were; the CPU-time ratio, how much work was added.
        key = (
            ("state" if state else "other" if other else "numpy" if numpy_loop else "held" if held else "on")
            if enabled
            else ("read" if read_pass else "off")
        )
        cpu_seconds[key].append(time.process_time() - cpu_started)
        return time.perf_counter() - started

    cpu = os.cpu_count() or 1
    torch.set_num_threads(min(torch.get_num_threads(), cpu))
    load_once(False)  # warm-up: first touch of the parameters' pages
    cpu_seconds["off"].clear()
    off: list[float] = []
    on: list[float] = []
    read: list[float] = []
    with_state: list[float] = []
    on_other: list[float] = []
    on_numpy: list[float] = []
    on_held: list[float] = []
    # On a GPU the digest threads and the numpy loop take no part (the device batch digests every tensor): the
    # rounds time the tap with tensors launched on arrival (the default) and held for one launch (opt-in).
    on_gpu = device.type == "cuda"
    rounds = args.byte_rounds or 3 * args.repeats
    for _ in range(rounds):
        shutil.rmtree(records, ignore_errors=True)
        off.append(load_once(False))
        read.append(load_once(False, read_pass=True))
        if args.state:  # the record of this sync is replaced by the next one's: verify reads the plain tap's
            shutil.rmtree(records, ignore_errors=True)
            with_state.append(load_once(True, state=True))
        if on_gpu:
            shutil.rmtree(records, ignore_errors=True)
            on_held.append(load_once(True, held=True))
        else:
            shutil.rmtree(records, ignore_errors=True)
            on_other.append(load_once(True, other=True))
        if native_level is not None and not on_gpu:
            shutil.rmtree(records, ignore_errors=True)
            on_numpy.append(load_once(True, numpy_loop=True))
        shutil.rmtree(records, ignore_errors=True)
        on.append(load_once(True))  # last: verify reads this record
    tap.configure(None)
    tap.uninstall(klass)
    # Its own folder: it removes it when done, and verify below reads the last tapped load's record.
    small = None if args.no_small else small_tensor_overhead(work / "records-small", args.small, 64, args.repeats)

    # The digests alone over the streamed tensors (on the engine's device), against the device's copy.
    tensors = [t for _, t in checkpoint_stream()]
    throughputs = digest_throughputs(tensors, algorithm, min(3, args.repeats), device)
    del tensors

    # SGLang's Qwen2 has q/k/v biases this Llama-style checkpoint lacks (verify reports them as never written).
    skip = ["*.qkv_proj.bias"] if args.engine == "sglang" else []
    verify_ckpt = verify_manifest = manifest_s = None
    verify_errors: list[str] = []
    checked_tensors = None
    if not args.no_verify:
        started = time.perf_counter()
        result = verify(records, ckpt, skip=skip)
        verify_ckpt = time.perf_counter() - started
        # Reported, not asserted, so that the timings still print: a digest taken on the device that differs
        # from the checkpoint's on the host shows here as errors.
        verify_errors = [f.message for f in result.findings if f.severity.label == "error"]
        checked_tensors = result.checked.get("tensors")
        assert checked_tensors and not result.nothing_checked, "verify checked nothing: the records are missing"
        manifest = work / "manifest.json"
        with TensorStore.open(ckpt) as store:
            started = time.perf_counter()
            write_manifest(manifest, store.iter_tensors(), algorithm=algorithm)
            manifest_s = time.perf_counter() - started
        started = time.perf_counter()
        result = verify(records, manifest, skip=skip)
        verify_manifest = time.perf_counter() - started
        verify_errors += [f.message for f in result.findings if f.severity.label == "error"]

    median_off, median_on, median_read = statistics.median(off), statistics.median(on), statistics.median(read)
    figures = {
        "engine": klass.__name__,
        "checkpoint_bytes": size,
        "tensors": checked_tensors,
        "cpu_cores": cpu,
        "torch_threads": torch.get_num_threads(),
        "digest_threads": threads,
        "digest": algorithm,
        "repeats": args.repeats,
        "byte_rounds": rounds,
        "load_off_s": off,
        "load_on_s": on,
        "load_off_median_s": median_off,
        "load_on_median_s": median_on,
        "tap_overhead_pct": 100 * (median_on - median_off) / median_off,
        # Each round's tapped load against that round's untapped one, then the median: less sensitive to drift.
        "tap_overhead_paired_pct": 100 * statistics.median((a - b) / b for a, b in zip(on, off, strict=True)),
        "load_on_held_s": on_held,
        "tap_held_overhead_pct": (100 * (statistics.median(on_held) - median_off) / median_off if on_held else None),
        "tap_held_overhead_paired_pct": (
            100 * statistics.median((a - b) / b for a, b in zip(on_held, off, strict=True)) if on_held else None
        ),
        "load_on_state_s": with_state,
        "tap_with_state_overhead_pct": (
            100 * (statistics.median(with_state) - median_off) / median_off if with_state else None
        ),
        "device": str(device),
        "load_read_pass_s": read,
        "load_read_pass_median_s": median_read,
        "read_pass_added_s": median_read - median_off,
        "tap_added_vs_read_pass": (median_on - median_off) / max(median_read - median_off, 1e-9),
        "cpu_s": cpu_seconds,
        "tap_added_vs_read_pass_cpu": added_ratio(cpu_seconds["on"], cpu_seconds, statistics.median),
        # The least-disturbed rounds (each series' minimum): on a shared machine the others' load only adds time.
        "tap_added_vs_read_pass_min": added_ratio(on, {"off": off, "read": read}, min),
        "tap_added_vs_read_pass_cpu_min": added_ratio(cpu_seconds["on"], cpu_seconds, min),
        "other_digest_threads": other_threads,
        "load_other_s": on_other,
        "other_added_vs_read_pass": (
            added_ratio(on_other, {"off": off, "read": read}, statistics.median) if on_other else None
        ),
        "other_added_vs_read_pass_cpu": (
            added_ratio(cpu_seconds["other"], cpu_seconds, statistics.median) if on_other else None
        ),
        "native_level": native_level,
        "load_numpy_loop_s": on_numpy,
        "numpy_loop_added_vs_read_pass": (
            added_ratio(on_numpy, {"off": off, "read": read}, statistics.median) if on_numpy else None
        ),
        "numpy_loop_added_vs_read_pass_cpu": (
            added_ratio(cpu_seconds["numpy"], cpu_seconds, statistics.median) if on_numpy else None
        ),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "digest_gb_per_s": throughputs,
        "small_tensor_stream": small,
        "fused_kernel": "measured" if any("fused" in k for k in throughputs) else "not run: needs CUDA and Triton",
        "verify_errors": verify_errors,
        "verify_against_checkpoint_s": verify_ckpt,
        "verify_against_manifest_s": verify_manifest,
        "trainer_manifest_write_s": manifest_s,
    }
    print(f"engine {figures['engine']}, {size / 1e9:.2f} GB, {figures['tensors']} tensors, {cpu} cores, {device}")
    way = f"{threads} digest threads" if threads else "digested on the loading thread (0 digest threads)"
    print(f"digest {algorithm}, {way}, load average {figures['load_average']}")
    print()
    print("| measurement | value | target |")
    print("|---|---|---|")
    if small is None:
        print("| per-tensor overhead | not run (--no-small) | ≤ 8 µs |")
    else:
        print(
            f"| per-tensor overhead, steady state (syncs 2..N), {small['tensors']} tensors of {small['elements']} "
            f"BF16 (CPU time, all threads) | +{small['added_cpu_us_per_tensor']:.1f} µs/tensor "
            f"(untapped {small['off_cpu_us_per_tensor']:.1f}) | ≤ 8 µs |"
        )
        print(
            "| per-tensor overhead, first sync of an engine (CPU time) | "
            f"+{small['added_first_cpu_us_per_tensor']:.1f} µs/tensor | |"
        )
        print(
            f"| per-tensor overhead, steady state / first sync (wall) | +{small['added_wall_us_per_tensor']:.1f} / "
            f"+{small['added_first_wall_us_per_tensor']:.1f} µs/tensor "
            f"(untapped {small['off_wall_us_per_tensor']:.1f}) | |"
        )
    print(
        f"| byte overhead: tap's added time ÷ one extra read pass's added time ({size / 1e9:.2f} GB) "
        f"| {figures['tap_added_vs_read_pass']:.2f}× | ≤ 1.15× |"
    )
    print(
        "| the same in CPU time (all threads: the work added, whatever the other cores were doing) "
        f"| {figures['tap_added_vs_read_pass_cpu']:.2f}× | |"
    )
    print(
        "| the same, least-disturbed rounds (each series' minimum), wall / CPU "
        f"| {figures['tap_added_vs_read_pass_min']:.2f}× / {figures['tap_added_vs_read_pass_cpu_min']:.2f}× | |"
    )
    if on_numpy:
        print(
            f"| the numpy loop instead of the compiled pass ({native_level}), same rounds, wall / CPU "
            f"| {figures['numpy_loop_added_vs_read_pass']:.2f}× "
            f"/ {figures['numpy_loop_added_vs_read_pass_cpu']:.2f}× | |"
        )
    elif not on_gpu:
        print("| compiled one pass | not built (weightcheck._onepass missing or WEIGHTCHECK_NATIVE=0): numpy loop | |")
    if on_other:
        other_way = f"{other_threads} digest threads" if other_threads else "on the loading thread"
        print(
            f"| the other way, {other_way} (same rounds), wall / CPU "
            f"| {figures['other_added_vs_read_pass']:.2f}× / {figures['other_added_vs_read_pass_cpu']:.2f}× | |"
        )
    for name, gbps in throughputs.items():
        print(f"| {name} on {device} | {gbps:.2f} GB/s | |" if isinstance(gbps, float) else f"| {name} | {gbps} | |")
    if device.type != "cuda":
        print("| posmix128, fused Triton kernel | needs a GPU (on CPU only Triton's interpreter runs it) | |")
    print()
    print("| measurement | seconds |")
    print("|---|---|")
    print(f"| load_weights, tap off (median of {rounds}) | {median_off:.3f} |")
    print(f"| load_weights, tap on, digest-only (median of {rounds}) | {median_on:.3f} |")
    print(f"| tap overhead | {figures['tap_overhead_pct']:+.1f} % |")
    print(f"| tap overhead, median of the rounds' pairs | {figures['tap_overhead_paired_pct']:+.1f} % |")
    if on_held:
        print(f"| load_weights, tap on, GPU tensors held and launched together (median of {rounds}) | "
              f"{statistics.median(on_held):.3f} |")  # fmt: skip
        print(f"| that tap's overhead, medians / median of pairs | {figures['tap_held_overhead_pct']:+.1f} % / "
              f"{figures['tap_held_overhead_paired_pct']:+.1f} % |")  # fmt: skip
    if with_state:
        state_median = statistics.median(with_state)
        print(f"| load_weights, tap on + engine state (median of {rounds}) | {state_median:.3f} |")
        print(f"| tap + engine-state overhead | {figures['tap_with_state_overhead_pct']:+.1f} % |")
    print(f"| load_weights + one extra read pass, tap off (median of {rounds}) | {median_read:.3f} |")
    if verify_ckpt is not None:
        print(f"| verify: errors against the checkpoint and the manifest | {len(verify_errors)} |")
        print(f"| verify against the checkpoint (hashes it) | {verify_ckpt:.3f} |")
        print(f"| verify against a trainer manifest | {verify_manifest:.3f} |")
        print(f"| trainer-side manifest of the stream | {manifest_s:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if verify_errors:
        print("verify errors:", *verify_errors[:5], sep="\n  ")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        shutil.rmtree(records, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
