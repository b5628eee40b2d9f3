"""Two megatron-core ranks (gloo, PP = 2 or EP = 2) driving the slime, miles and verl stand-ins with the
adapters' documented lines, into a tapped engine hosted by rank 0. Used by tests/test_integrations_trainer.py.

Every scenario makes three syncs with the weights changed in between (sync 1 is checked against the
checkpoint, syncs 2 and 3 against the manifest parts the adapters wrote) and plants its defect, if any, at
sync 3 only. Rank 0 writes what its monitor concluded, and what it logged, to `<scenario>/result.json`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import traceback
import zlib
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

H = 8  # the engine's hidden size (tests/test_tap.py)
NUM_LAYERS = 4
NUM_EXPERTS = 4


def hf_names() -> list[str]:
    names = []
    for layer in range(NUM_LAYERS):
        names += [f"layers.{layer}.{s}_proj.weight" for s in "qkv"] + [f"layers.{layer}.norm", f"layers.{layer}.scale"]
        for expert in range(NUM_EXPERTS):
            names += [f"layers.{layer}.experts.{expert}.{p}_proj.weight" for p in ("gate", "up", "down")]
    return names


def value(hf_name: str, step: int) -> Any:
    """The trainer's weight `hf_name` after `step` training steps (step 0: the checkpoint)."""
    import torch

    shape = (1,) if hf_name.endswith(".scale") else (H,) if hf_name.endswith(".norm") else (H, H)
    generator = torch.Generator().manual_seed(zlib.crc32(hf_name.encode()))
    return torch.randn(shape, generator=generator) + 0.01 * step


def write_checkpoint(path: Path) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({n: value(n, 0).contiguous() for n in hf_names()}, str(path / "model.safetensors"))
    return path


def _model(config: Any) -> Any:
    """One rank's model chunk: megatron-style local ids (layers of its stage, experts of its EP rank)."""
    import torch
    from megatron.core import mpu
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    from torch import nn

    pp_size = mpu.get_pipeline_model_parallel_world_size()
    ep_size = mpu.get_expert_model_parallel_world_size()
    offset = get_transformer_layer_offset(config)
    local_experts = NUM_EXPERTS // ep_size
    expert_offset = mpu.get_expert_model_parallel_rank() * local_experts

    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (nn.Linear(H, H, bias=False) for _ in range(3))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(H, H, bias=False) for _ in range(3))
            self.norm = nn.Parameter(torch.zeros(H))
            self.scale = nn.Parameter(torch.zeros(1))
            self.experts = nn.ModuleList(Expert() for _ in range(local_experts))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config
            self.decoder = nn.Module()
            self.decoder.layers = nn.ModuleList(Layer() for _ in range(NUM_LAYERS // pp_size))

        def train_to(self, step: int) -> None:
            import re

            with torch.no_grad():
                for name, param in self.decoder.named_parameters():
                    name = re.sub(r"layers\.(\d+)\.", lambda m: f"layers.{int(m.group(1)) + offset}.", name, count=1)
                    name = re.sub(
                        r"experts\.(\d+)\.", lambda m: f"experts.{int(m.group(1)) + expert_offset}.", name, count=1
                    )
                    param.copy_(value(name, step))

    return GPT()


def _bridge_export(model: list[Any]) -> Any:
    """mbridge's `export_weights` as verl drives it: every rank yields every stage's and EP rank's tensors
    (gathered), HF-named, in rank order. Its local→global map is slime's stand-in one (same defects)."""
    import torch.distributed as dist
    from megatron.core import mpu
    from slime.backends.megatron_utils.megatron_to_hf import convert_to_hf
    from slime.backends.megatron_utils.update_weight.common import named_params_and_buffers

    local = [(n, p.data) for n, p in named_params_and_buffers(None, model)]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mpu.get_expert_model_parallel_rank(), local))
    for ep_rank, rank_items in gathered:
        for name, tensor in rank_items:
            if ep_rank == 0 or ".experts." in name:  # dense tensors once per stage, experts from every EP rank
                yield from convert_to_hf(None, "stand-in", name, tensor)


def _updater(framework: str, path: str, args: Any, model: list[Any]) -> Any:
    weights = lambda: {n: p.data for n, p in named_params_and_buffers(args, model)}  # noqa: E731
    from slime.backends.megatron_utils.update_weight.common import named_params_and_buffers

    if framework == "slime" and path in ("tensor", "unseen"):
        from slime.backends.megatron_utils.update_weight.update_weight_from_tensor import UpdateWeightFromTensor as C
    elif framework == "slime":
        from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import (
            UpdateWeightFromDistributed as C,
        )
    elif path == "tensor":
        from miles.backends.megatron_utils.update_weight.update_weight_from_tensor import UpdateWeightFromTensor as C
    else:
        from miles.backends.megatron_utils.update_weight.update_weight_from_distributed.broadcast import (
            UpdateWeightFromDistributed as C,
        )
    if path == "unseen":  # a release whose send method the adapter does not know
        base = C

        class C(base):  # type: ignore[no-redef]
            _send_chunk = base._send_hf_params
            _send_hf_params = None

            def update_weights(self) -> None:
                self._send_hf_params = self._send_chunk
                try:
                    base.update_weights(self)
                finally:
                    self._send_hf_params = None

    return C(args, model, weights, model_name="stand-in", quantization_config=None)


def run_scenario(rank: int, folder: Path, framework: str, path: str, defect: str | None, model: list[Any]) -> None:
    import torch.distributed as dist
    from miles.backends.megatron_utils.update_weight import common as miles_common
    from slime.backends.megatron_utils.update_weight import common as slime_common
    from test_tap import Engine

    from weightcheck import tap

    records = folder / "records"
    os.environ.update(
        WEIGHTCHECK_SYNC_CHECK="1",
        WEIGHTCHECK_DIR=str(records),
        WEIGHTCHECK_REFERENCE=str(folder.parent / "checkpoint"),
        STANDIN_WIRE=str(folder / "wire"),
    )
    engine = None
    if rank == 0:
        records.mkdir(parents=True, exist_ok=True)
        tap.configure(records, engine="engine-0")
        engine = Engine(NUM_LAYERS, moe=True)
        tap.wrap(engine)
    dist.barrier()
    logs: list[tuple[str, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logs.append((record.levelname, record.getMessage()))

    handler = Keep(logging.INFO)
    logging.getLogger("weightcheck.integrations").addHandler(handler)
    logging.getLogger("weightcheck.integrations").setLevel(logging.INFO)
    from wire import RolloutEngine

    try:
        if framework == "verl":
            from verl.workers.rollout.sglang_rollout.sglang_rollout import ServerAdapter

            hf_config = SimpleNamespace(num_hidden_layers=NUM_LAYERS, num_experts=NUM_EXPERTS)
            rollout = ServerAdapter(None, SimpleNamespace(hf_config=hf_config), engine=engine)
            # user lines (verl)
            from weightcheck.integrations import SyncMonitor
            from weightcheck.integrations.verl import instrument

            monitor = SyncMonitor.from_env()
            rollout = instrument(rollout, monitor)
            # end of user lines
        else:
            updater = _updater(framework, path, Namespace(update_weight_buffer_size=1 << 20), model)
            updater.connect_rollout_engines([RolloutEngine(engine)] if engine is not None else [])
            # user lines (slime, miles)
            from weightcheck.integrations import SyncMonitor
            from weightcheck.integrations.miles import instrument as miles_instrument
            from weightcheck.integrations.slime import instrument as slime_instrument

            monitor = SyncMonitor.from_env()
            updater = (slime_instrument if framework == "slime" else miles_instrument)(updater, monitor)
            # end of user lines
        for step in (0, 1, 2):
            model[0].train_to(step)
            planted = {defect} if defect and step == 2 else set()
            slime_common.DEFECTS.clear()
            slime_common.DEFECTS.update(planted)
            miles_common.DEFECTS.clear()
            miles_common.DEFECTS.update(planted)
            if framework == "verl":
                asyncio.run(rollout.update_weights(_bridge_export(model), peft_config=None, base_sync_done=True))
            else:
                updater.update_weights()
    finally:
        logging.getLogger("weightcheck.integrations").removeHandler(handler)
        if rank == 0:
            tap.configure(None)
    if rank != 0:  # one rank checks: the others report nothing
        (folder / f"result-rank{rank}.json").write_text(json.dumps({"results": len(monitor.results), "logs": logs}))
    if rank == 0:
        out = {
            "results": [
                [version, [[f.code, f.message] for f in result.findings]] for version, result in monitor.results
            ],
            "logs": logs,
            "parts": sorted(str(p.relative_to(records)) for p in (records / "manifests").rglob("*.json"))
            if (records / "manifests").exists()
            else [],
        }
        (folder / "result.json").write_text(json.dumps(out, indent=1))
    dist.barrier()


def worker(rank: int, world: int, port: int, parallel: str, root: str, scenarios: list, errors: Any) -> None:
    try:
        here = Path(__file__).resolve().parent
        sys.path[:0] = [str(here), str(here.parent)]
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu
        from megatron.core.transformer import TransformerConfig

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        if parallel == "pp":
            mpu.initialize_model_parallel(pipeline_model_parallel_size=world)
        else:
            mpu.initialize_model_parallel(expert_model_parallel_size=world)
        config = TransformerConfig(
            num_layers=NUM_LAYERS,
            hidden_size=H,
            num_attention_heads=1,
            num_moe_experts=NUM_EXPERTS,
            pipeline_model_parallel_size=mpu.get_pipeline_model_parallel_world_size(),
            expert_model_parallel_size=mpu.get_expert_model_parallel_world_size(),
            pipeline_dtype=torch.float32,
            use_cpu_initialization=True,
        )
        model = [_model(config)]
        for framework, path, defect in scenarios:
            folder = Path(root) / parallel / f"{framework}-{path}-{defect or 'clean'}"
            run_scenario(rank, folder, framework, path, defect, model)
        dist.destroy_process_group()
    except BaseException as exc:
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}")
        raise


def run_all(root: Path, parallel: str, scenarios: list) -> None:
    """Both ranks in spawned processes; raises with a rank's traceback when one fails."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    errors = context.Queue()
    processes = [
        context.Process(target=worker, args=(rank, 2, port, parallel, str(root), scenarios, errors)) for rank in (0, 1)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=600)
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    for process in processes:
        if process.is_alive():
            process.kill()
            problems.append("a trainer rank did not finish in 600 s")
    if problems or any(p.exitcode for p in processes):
        raise RuntimeError("\n".join(problems) or f"exit codes {[p.exitcode for p in processes]}")
