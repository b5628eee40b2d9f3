"""Harness for the real-SGLang test group: SGLang model classes built on CPU, the tap installed through
SGLang's own plugin loader, HF checkpoints written by transformers as the reference.

Stubs, and why (nothing else is faked):

* `vllm._custom_ops.rotary_embedding`: off CUDA, SGLang's `RotaryEmbedding.__init__` imports it (the CPU
  path needs the Xeon build of sgl-kernel). It is used only by the forward pass, which these tests never run.
* The process group is a real single-process gloo group (`sglang.test.layer_ut_utils.init_single_process_dist`),
  not a stub; the two-process PP test spawns real gloo ranks and only disables pynccl/custom all-reduce,
  which need a CUDA device.

Run: `pytest -m sglang tests/sglang` in an environment with sglang installed (scripts/test-sglang.sh).

This is not a `conftest.py`: pytest imports every conftest as the module `conftest`, and the last one
imported owns that name, so a second conftest would break the root tests' `from conftest import ...`.
Test modules import the fixtures from here instead.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["checkpoints", "harness", "plugin_tap", "records_dir", "sglang_dist"]

# The four classes the issue names, and Gemma; the plugin taps them up front (WEIGHTCHECK_SGLANG_TARGETS).
TARGETS = {
    "qwen2": ("sglang.srt.models.qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("sglang.srt.models.qwen3", "Qwen3ForCausalLM"),
    "qwen3_moe": ("sglang.srt.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "deepseek_v3": ("sglang.srt.models.deepseek_v2", "DeepseekV3ForCausalLM"),
    # Its loader adds 1 to each norm weight it is handed (WC746).
    "gemma": ("sglang.srt.models.gemma", "GemmaForCausalLM"),
}


def install_cpu_stubs() -> None:
    if "vllm._custom_ops" in sys.modules:
        return
    vllm = types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")

    def rotary_embedding(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("CPU test stub: rotary_embedding is forward-only and must not be called")

    ops.rotary_embedding = rotary_embedding  # type: ignore[attr-defined]
    vllm._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules["vllm"] = vllm
    sys.modules["vllm._custom_ops"] = ops


def tiny_config(kind: str, **overrides: Any) -> Any:
    """Tiny transformers configs (the classes `AutoConfig` returns), shared by SGLang and the checkpoint."""
    from factories import tiny_qwen3_moe_config
    from transformers import DeepseekV3Config, GemmaConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if kind == "qwen2":
        return Qwen2Config(**{**common, **overrides})
    if kind == "qwen3":
        return Qwen3Config(head_dim=16, **{**common, **overrides})
    if kind == "gemma":  # SGLang's Gemma ties the head to the embedding, as Gemma checkpoints do
        return GemmaConfig(head_dim=16, **{**common, "tie_word_embeddings": True, **overrides})
    if kind == "qwen3_moe":
        return tiny_qwen3_moe_config(decoder_sparse_step=1, **{**common, **overrides})
    if kind == "deepseek_v3":
        values = dict(
            common,
            num_hidden_layers=3,
            num_key_value_heads=4,
            moe_intermediate_size=32,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            # In every real DeepSeek-V3 config.json, not defaults of transformers 5.19's DeepseekV3Config;
            # SGLang reads them directly.
            moe_layer_freq=1,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            num_nextn_predict_layers=0,
        )
        return DeepseekV3Config(**{**values, **overrides})
    raise KeyError(kind)


@pytest.fixture(scope="session")
def sglang_dist() -> None:
    """One real world-size-1 gloo group for the whole session (SGLang's init is once per process)."""
    install_cpu_stubs()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    from sglang.test.layer_ut_utils import init_single_process_dist

    # A free port, not a fixed one: another SGLang test run on the same host must not collide.
    init_single_process_dist(master_port=free_port(), backend="gloo")


@pytest.fixture(scope="session")
def plugin_tap(sglang_dist: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install the tap the way production does: SGLang's `load_plugins()` finds the `weightcheck` entry point."""
    root = tmp_path_factory.mktemp("weightcheck-dir")
    os.environ["WEIGHTCHECK_DIR"] = str(root)
    os.environ["WEIGHTCHECK_SGLANG_TARGETS"] = ",".join(f"{m}.{c}" for m, c in TARGETS.values())
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return root


@pytest.fixture
def records_dir(plugin_tap: Path, tmp_path: Path) -> Iterator[Path]:
    """A fresh records directory per test (the plugin's configuration, redirected)."""
    from weightcheck import tap

    base = tap.current_config()
    assert base is not None, "the weightcheck plugin did not configure the tap"
    target = tmp_path / "records"
    tap.configure(tap.TapConfig(directory=target, keep_tensors=base.keep_tensors, digest_threads=base.digest_threads))
    yield target
    tap.configure(base)


def build_model(kind: str, config: Any) -> Any:
    import importlib

    module, name = TARGETS[kind]
    return getattr(importlib.import_module(module), name)(config)


def fill_pattern(model: Any, seed: int = 1234) -> None:
    """What SGLang's checker `reset_tensors` does: overwrite every parameter with uniform [0, 1) values, so
    whatever a sync does not write keeps a pattern no checkpoint tensor has."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in model.named_parameters():
            param.copy_(torch.rand(param.shape, generator=generator, dtype=torch.float32).to(param.dtype))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`checkpoints(kind, **config_overrides)` → a safetensors checkpoint written by transformers
    `save_pretrained` (per-expert checkpoint names), cached per configuration."""
    cache: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}

    def get(kind: str, **overrides: Any) -> Path:
        key = (kind, tuple(sorted(overrides.items())))
        if key not in cache:
            import torch
            from transformers import AutoModelForCausalLM

            torch.manual_seed(len(cache) + 7)
            model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides))
            path = tmp_path_factory.mktemp(f"ckpt-{kind}") / kind
            model.save_pretrained(path)
            cache[key] = path
        return cache[key]

    return get


def checkpoint_stream(path: Path) -> list[tuple[str, Any]]:
    """Every tensor of a checkpoint, in file order, as the trainer would send it (the exact stored bytes)."""
    from safetensors import safe_open

    out: list[tuple[str, Any]] = []
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as fh:
            for key in fh.keys():
                out.append((key, fh.get_tensor(key)))
    return out


class Harness:
    """The helpers above, as one fixture."""

    targets = TARGETS
    tiny_config = staticmethod(tiny_config)
    build_model = staticmethod(build_model)
    fill_pattern = staticmethod(fill_pattern)
    checkpoint_stream = staticmethod(checkpoint_stream)


@pytest.fixture(scope="session")
def harness() -> type[Harness]:
    return Harness


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _init_layout(rank: int, world: int, port: int, tp: int, pp: int, ep: int) -> None:
    """SGLang's own parallel-state initialisation for one rank of a (tp, pp, ep) layout on gloo."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.test.test_utils import publish_build_topology

    init_distributed_environment(
        world_size=world,
        rank=rank,
        local_rank=rank,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    original = parallel_state.init_model_parallel_group

    def without_cuda_communicators(*args: Any, **kwargs: Any) -> Any:
        # PyNcclCommunicator and the custom all-reduce need a CUDA device; gloo needs neither.
        return original(*args, **{**kwargs, "use_pynccl": False, "use_custom_allreduce": False})

    parallel_state.init_model_parallel_group = without_cuda_communicators
    publish_build_topology(world_rank=rank, tp_size=tp, pp_size=pp, ep_size=ep)
    initialize_model_parallel(backend="gloo")


def layout_worker(
    rank: int, world: int, port: int, layout: dict[str, Any], scenarios: list[dict[str, Any]], queue: Any
) -> None:
    """One engine rank of a (tp, pp, ep) layout in its own process: SGLang's parallel state on gloo, the tap
    installed by `load_plugins()`, then every scenario in turn (one model build, one records folder each), so
    that one process tree serves several tests. A scenario: `records`, `checkpoint`, `kind`, `config`, and
    `send`: what this rank receives per sync, by name (see `scenario_stream`)."""
    try:
        install_cpu_stubs()
        os.environ["WEIGHTCHECK_DIR"] = scenarios[0]["records"]
        os.environ["WEIGHTCHECK_SGLANG_TARGETS"] = ",".join(f"{m}.{c}" for m, c in TARGETS.values())
        _init_layout(rank, world, port, layout["tp"], layout["pp"], layout["ep"])
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from weightcheck import tap

        base = tap.current_config()
        assert base is not None, "the weightcheck plugin did not configure the tap"
        out: dict[str, Any] = {"rank": rank, "records": []}
        for scenario in scenarios:
            tap.configure(tap.TapConfig(directory=Path(scenario["records"]), digest=base.digest, state=True))
            model = build_model(scenario["kind"], tiny_config(scenario["kind"], **scenario.get("config", {})))
            fill_pattern(model)
            stream = checkpoint_stream(Path(scenario["checkpoint"]))
            for version, send in scenario["syncs"]:
                with tap.sync(version, source="session"):
                    model.load_weights(iter(scenario_stream(stream, send, rank, layout)))
                out["records"].append(str(tap.last_record_path()))
        queue.put(out)
    except BaseException as exc:  # reported to the parent, which fails the test with it
        import traceback

        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"})


def scenario_stream(stream: list[tuple[str, Any]], send: str, rank: int, layout: dict[str, Any]) -> list[Any]:
    """What one engine rank receives.

    * `all`: the full stream (every TP/EP rank receives the gathered tensors, as SGLang's update paths do);
    * `ep-local`: non-expert tensors plus only the routed experts this EP rank owns (slime #2220, miles #3175);
    * `ep-local-missing-expert-3`: the same, but expert 3 is never sent to its owner;
    * `rank1-corrupt-norm`: TP rank 1's own payload carries a different `model.norm.weight`;
    * `drop-layer-2-on-stage-1`: a PP stage never receives layer 2.
    """
    import re

    expert = re.compile(r"\.experts\.(\d+)\.")
    if send == "all":
        return list(stream)
    if send.startswith("ep-local"):
        ep_size = layout["ep"]
        per_rank = 4 // ep_size
        own = range(rank * per_rank, (rank + 1) * per_rank)
        out = []
        for name, tensor in stream:
            match = expert.search(name)
            if match is None or int(match.group(1)) in own:
                if send.endswith("missing-expert-3") and match is not None and int(match.group(1)) == 3:
                    continue
                out.append((name, tensor))
        return out
    if send == "rank1-corrupt-norm":
        return [(n, t * 2 if rank == 1 and n == "model.norm.weight" else t) for n, t in stream]
    if send == "drop-layer-2-on-stage-1":
        return [(n, t) for n, t in stream if not (rank == 1 and ".layers.2." in n)]
    raise KeyError(send)


def run_layout(layout: dict[str, Any], scenarios: list[dict[str, Any]], timeout: float = 420) -> list[dict[str, Any]]:
    """Launch `tp * pp` engine ranks (spawned processes, real gloo group) running `scenarios`."""
    import multiprocessing

    world = layout["tp"] * layout["pp"]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    workers = [
        context.Process(target=layout_worker, args=(rank, world, port, layout, scenarios, queue))
        for rank in range(world)
    ]
    for worker in workers:
        worker.start()
    try:
        replies = [queue.get(timeout=timeout) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    errors = [r["error"] for r in replies if "error" in r]
    assert not errors, errors[0]
    return replies
