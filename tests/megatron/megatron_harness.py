"""A real Megatron trainer on CPU for the weight-sync tests: megatron-core models in separate gloo processes
(PP = 2 or EP = 2), exported to HF names by mbridge (the bridge verl and slime use), streamed to the parent
process where a real SGLang model class loads them with the tap on.

What is real: megatron-core 0.16.1's `GPTModel` built by mbridge's own model provider (`LLMBridge._model_provider`)
with megatron-core's parallel state over gloo; the weights are loaded from an HF checkpoint by
`Bridge.load_weights` and exported by `Bridge.export_weights` (PP: every stage's names and tensors
broadcast by `broadcast_from_megatron_pp`, layer ids from `layer.layer_number - 1`).

What is adapted to run without a GPU or Transformer Engine, and why (nothing else is faked):

* `LLMBridge._get_transformer_layer_spec` asks megatron-core for the Transformer Engine layer spec
  (`use_transformer_engine=True`, mbridge 0.15.1 `core/llm_bridge.py`), which raises `NameError: TENorm`
  without TE. `CpuBridge` asks for megatron-core's local spec instead, and renames the three local-spec
  parameter names mbridge's mapping tables do not know into the TE names they do know:
  `input_layernorm.weight` → `self_attention.linear_qkv.layer_norm_weight`, dense `pre_mlp_layernorm.weight`
  → `mlp.linear_fc1.layer_norm_weight`, SequentialMLP `experts.local_experts.{i}.linear_fc{1,2}.weight` →
  TEGroupedMLP `experts.linear_fc{1,2}.weight{i}`. The renaming sits in `_weight_name_mapping_mcore_local_to_global`:
  mbridge's own map runs on a view of the model that shows TE names, so mbridge still computes every layer
  and expert id.
* Config overrides for a CPU build: `use_cpu_initialization` (else `torch.cuda.current_device()`),
  `persist_layer_norm=False` (asserted by megatron's torch norm), the `allgather` MoE dispatcher (the
  `alltoall` one creates a `torch.cuda.Stream`) with `variable_seq_lengths=False` (required by it), and
  `moe_grouped_gemm=False` (megatron's GroupedMLP needs the CUDA `grouped_gemm` package): experts are a
  SequentialMLP. The forward pass is never run.
* `hf_config.rope_theta`: mbridge reads it; transformers 5 moved it into `rope_parameters`.
* `torch.cuda.current_device` returns "cpu" in the trainer processes: `broadcast_from_megatron_pp` allocates
  the receive buffer of non-owning stages on it.
* `flash_mla` is made unimportable in the trainer processes: SGLang's CPU install ships it built for CUDA, and
  importing it raises OSError, which megatron-core's optional import (`except ImportError`) lets through.

Megatron-Bridge (NVIDIA's `megatron-bridge` 0.3.1) was tried first and cannot be used here: importing
`megatron.bridge` imports `transformer_engine.pytorch` unconditionally (`megatron/bridge/peft/lora_layers.py`),
and its wheel requires `transformer-engine[core_cu13,pytorch]`, `mamba-ssm`, `causal-conv1d` and
`transformers<5`.

This is not a conftest.py (see tests/sglang/sglang_harness.py for why).
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# ---- the HF side -----------------------------------------------------------------------------------------


def hf_config(kind: str) -> Any:
    """Tiny transformers configs: Qwen3 with 4 layers (2 per PP stage), Qwen3-MoE with 4 experts (2 per EP rank)."""
    from factories import tiny_qwen3_moe_config
    from transformers import Qwen3Config

    common: dict[str, Any] = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if kind == "qwen3":
        return Qwen3Config(num_hidden_layers=4, **common)
    if kind == "qwen3_moe":
        return tiny_qwen3_moe_config(decoder_sparse_step=1, **common)
    raise KeyError(kind)


# The quantization_config of the INT4 serving checkpoint in the router scenario. The router entry is written
# as a module pattern (`re:.*mlp.gate$`, how llm-compressor and compressed-tensors match module names); an
# online quantizer that matches it against *parameter* names (`...mlp.gate.weight`) with `re.match` misses it.
INT4_QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
        }
    },
    # Everything but the router stays BF16 in this tiny BF16 engine (a real INT4 engine quantizes the experts).
    "ignore": ["lm_head", "model.embed_tokens", "re:.*self_attn.*", "re:.*experts.*", "re:.*mlp.gate$"],
}


def write_checkpoint(kind: str, path: Path, seed: int = 7) -> Path:
    """The step-0 reference: transformers `save_pretrained` of a BF16 model (what the trainer loads)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind)).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def int4_router_quantizer(config_json: Path) -> Any:
    """An online INT4 quantizer of the trainer's export that reads its ignore list from the serving
    checkpoint's `config.json`, following slime's `quantize_params_compressed_tensors`
    (`slime/backends/megatron_utils/megatron_to_hf/processors/quantizer_compressed_tensors.py`): an entry
    ignores a name when `re.match`es it (`re:` entries), equals it, or is a prefix of it; everything else that
    ends in `.weight` and is 2-D is packed to `weight_packed` / `weight_scale` / `weight_shape`. Packing uses
    compressed-tensors' own `pack_to_int32`."""
    import json

    import torch

    try:
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    except ImportError:  # compressed-tensors < 0.13
        from compressed_tensors.compressors.quantized_compressors.pack_quantized import pack_to_int32

    config = json.loads(Path(config_json).read_text())["quantization_config"]
    weights = config["config_groups"]["group_0"]["weights"]
    group = weights["group_size"]
    ignore = config.get("ignore", [])

    def ignored(name: str) -> bool:
        return any((r.startswith("re:") and re.match(r[3:], name)) or r == name or name.startswith(r) for r in ignore)

    def quantize(stream: Any) -> Iterator[tuple[str, Any]]:
        for name, tensor in stream:
            if ignored(name) or not name.endswith(".weight") or tensor.dim() < 2:
                yield name, tensor
                continue
            rows, cols = tensor.shape
            grouped = tensor.float().reshape(rows, cols // group, group)
            scale = (grouped.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-5)
            q = (grouped / scale).round().clamp(-8, 7).to(torch.int8).reshape(rows, cols)
            base = name[: -len("weight")]
            yield f"{base}weight_packed", pack_to_int32(q, 4)
            yield f"{base}weight_scale", scale.squeeze(-1).to(tensor.dtype)
            yield f"{base}weight_shape", torch.tensor([rows, cols], dtype=torch.int32)

    return quantize


def serving_config(checkpoint: Path, folder: Path) -> Path:
    """The INT4 serving checkpoint's config.json: the trainer's config plus `INT4_QUANTIZATION_CONFIG`."""
    import json

    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"] = INT4_QUANTIZATION_CONFIG
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


# ---- the Megatron side (imported in the trainer processes only) ------------------------------------------

_LOCAL_TO_TE = [
    (re.compile(r"\.input_layernorm\.weight$"), ".self_attention.linear_qkv.layer_norm_weight"),
    (re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$"), r".mlp.experts.\2.weight\1"),
]


class _TeNamedView:
    """What mbridge's local→global map reads of a model (`decoder.layers`, `state_dict().keys()`), with the
    local-spec parameter names shown as the TE names mbridge's code matches."""

    def __init__(self, model: Any, te_names: dict[str, str]) -> None:
        if hasattr(model, "decoder"):
            self.decoder = model.decoder
        self._keys = list(te_names.values())

    def state_dict(self) -> dict[str, None]:
        return dict.fromkeys(self._keys)


def cpu_bridge(config: Any) -> Any:
    """mbridge's registered bridge for `config.model_type`, on megatron-core's local (non-TE) layer spec."""
    from mbridge.core.bridge import _MODEL_REGISTRY
    from mbridge.core.util import unwrap_model
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    base = _MODEL_REGISTRY[config.model_type]

    class CpuBridge(base):  # type: ignore[misc, valid-type]
        def _get_transformer_layer_spec(self, vp_stage: int | None = None) -> Any:
            return get_gpt_decoder_block_spec(
                self.config, use_transformer_engine=False, normalization="RMSNorm", vp_stage=vp_stage
            )

        def _weight_name_mapping_mcore_local_to_global(self, model: Any, consider_ep: bool = True) -> dict[str, str]:
            # mbridge's own map (layer offsets from `layer.layer_number - 1`, expert offsets on
            # `.mlp.experts.linear_fc*.weight{i}` names) run on a view of the model that shows TE names.
            model = unwrap_model(model)
            te_names = {k: self._te_name(k) for k in model.state_dict() if "_extra_state" not in k}
            mapping = super()._weight_name_mapping_mcore_local_to_global(_TeNamedView(model, te_names), consider_ep)
            return {local: mapping[te] for local, te in te_names.items()}

        def _te_name(self, name: str) -> str:
            for pattern, replacement in _LOCAL_TO_TE:
                name = pattern.sub(replacement, name)
            if not self.config.num_moe_experts:
                name = re.sub(r"\.pre_mlp_layernorm\.weight$", ".mlp.linear_fc1.layer_norm_weight", name)
            return name

    if not hasattr(config, "rope_theta"):
        config.rope_theta = config.rope_parameters["rope_theta"]
    import torch

    bridge = CpuBridge(config, dtype=torch.bfloat16)
    bridge.set_extra_args(
        use_cpu_initialization=True,
        persist_layer_norm=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        moe_token_dispatcher_type="allgather",
        variable_seq_lengths=False,
        moe_grouped_gemm=False,
    )
    return bridge


# The defects, each a patch of the exporter where such a bug lives.


@contextlib.contextmanager
def pp_offset_dropped_on_last_stage(bridge: Any) -> Iterator[None]:
    """The last pipeline stage names its layers with local ids: the bridge's local→global map takes the
    layer's index in the stage instead of `layer.layer_number - 1` (the bug of huggingface/transformers#24381,
    NVIDIA-NeMo/RL#3259)."""
    klass = type(bridge)
    original = klass._weight_name_mapping_mcore_local_to_global

    def patched(self: Any, model: Any, consider_ep: bool = True) -> dict[str, str]:
        mapping = original(self, model, consider_ep)
        if self.mpu.pp_rank != self.mpu.pp_size - 1:
            return mapping
        out = {}
        for local, name in mapping.items():
            match = re.search(r"decoder\.layers\.(\d+)\.", local)
            out[local] = re.sub(r"layers\.\d+\.", f"layers.{match.group(1)}.", name, count=1) if match else name
        return out

    klass._weight_name_mapping_mcore_local_to_global = patched
    try:
        yield
    finally:
        klass._weight_name_mapping_mcore_local_to_global = original


@contextlib.contextmanager
def ep_offset_dropped_on_rank(bridge: Any, ep_rank: int) -> Iterator[None]:
    """One EP rank names its experts with local ids: mbridge's local→global map is asked without its EP
    offset (`consider_ep=False`) there (the bug of areal-project/AReaL#1595)."""
    klass = type(bridge)
    original = klass._weight_name_mapping_mcore_local_to_global

    def patched(self: Any, model: Any, consider_ep: bool = True) -> dict[str, str]:
        return original(self, model, consider_ep and self.mpu.ep_rank != ep_rank)

    klass._weight_name_mapping_mcore_local_to_global = patched
    try:
        yield
    finally:
        klass._weight_name_mapping_mcore_local_to_global = original


def export_rank_local(bridge: Any, model: Any) -> Iterator[tuple[str, Any]]:
    """EP-local export: this rank's own experts (global ids from mbridge's `consider_ep=True` map), and the
    replicated non-expert weights from EP rank 0 only; names and tensors by mbridge's `_weight_to_hf_format`.
    (`Bridge.export_weights` all-gathers the experts of every EP rank instead; slime's EP-local sends and
    miles' EP-local broadcast send each rank's own.)"""
    mapping = bridge._weight_name_mapping_mcore_local_to_global(model)
    for name, param in model.named_parameters():
        if ".mlp.experts." not in name and bridge.mpu.ep_rank != 0:
            continue
        names, tensors = bridge._weight_to_hf_format(mapping[name], param.detach())
        yield from zip(names, tensors, strict=True)


class _Ownership:
    """Which PP stage owns the tensor `Bridge.export_weights` is yielding: the one that entered
    `broadcast_from_megatron_pp` with the tensor (every other stage enters with None)."""

    def __init__(self) -> None:
        self.owned = False

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        import mbridge.core.bridge as bridge_module

        original = bridge_module.broadcast_from_megatron_pp

        def observed(tensor: Any) -> Any:
            self.owned = tensor is not None
            return original(tensor)

        bridge_module.broadcast_from_megatron_pp = observed
        try:
            yield
        finally:
            bridge_module.broadcast_from_megatron_pp = original


def trainer_worker(
    rank: int, world: int, port: int, parallel: str, kind: str, checkpoint: str, commands: Any, replies: Any
) -> None:
    """One Megatron rank (PP = world or EP = world) serving sync commands until told to stop.

    A command: {"version", "step", "manifests" (root or None), "defects" (names), "perturb" (bool),
    "serving_config" (an INT4 serving config.json: quantize the export online with it, or None)}. Each rank
    exports, writes its manifest part of what it owns / sends, and replies with the (name, tensor) list it
    sends to the engine (PP: stage 0 sends the gathered stream; EP: every rank sends its own)."""
    try:
        import sys

        # SGLang's CPU install ships flash_mla built for CUDA: importing it raises OSError, which megatron-core's
        # optional import (`except ImportError`) does not catch. None in sys.modules makes it an ImportError.
        sys.modules["flash_mla"] = None  # type: ignore[assignment]
        import torch

        torch.cuda.current_device = lambda: "cpu"  # mbridge allocates broadcast buffers there
        os.environ["HF_HUB_OFFLINE"] = "1"
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        from megatron.core import parallel_state

        if parallel == "pp":
            parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
        else:
            parallel_state.initialize_model_parallel(expert_model_parallel_size=world)
        config = hf_config(kind)
        bridge = cpu_bridge(config)
        model = bridge._model_provider([])(
            pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage()
        ).to(torch.bfloat16)
        bridge.load_weights([model], checkpoint)
        ownership = _Ownership()
        replies.put({"rank": rank, "ready": True})
        while True:
            command = commands.get()
            if command is None:
                break
            replies.put(_run_sync(rank, bridge, model, config, parallel, ownership, command))
        torch.distributed.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which fails the test with it
        replies.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}"})


def _run_sync(
    rank: int, bridge: Any, model: Any, config: Any, parallel: str, ownership: _Ownership, command: dict
) -> dict[str, Any]:
    import torch

    from weightcheck.manifest import ManifestWriter, manifest_part_path

    if command.get("perturb"):  # a training step: every rank changes its own parameters
        generator = torch.Generator().manual_seed(1000 * command["step"] + rank)
        with torch.no_grad():
            for _, param in model.named_parameters():
                param.add_((torch.randn(param.shape, generator=generator) * 0.02).to(param.dtype))
    defects = set(command.get("defects", ()))
    with contextlib.ExitStack() as stack:
        if "pp_offset" in defects:
            stack.enter_context(pp_offset_dropped_on_last_stage(bridge))
        if "ep_offset" in defects:
            stack.enter_context(ep_offset_dropped_on_rank(bridge, ep_rank=1))
        mpu = bridge.mpu
        writer = None
        if command.get("manifests"):
            writer = ManifestWriter(
                manifest_part_path(command["manifests"], command["version"], pp_rank=mpu.pp_rank, ep_rank=mpu.ep_rank),
                weight_version=command["version"],
                step=command["step"],
                pp_rank=mpu.pp_rank,
                pp_size=mpu.pp_size,
                ep_rank=mpu.ep_rank,
                ep_size=mpu.ep_size,
                num_layers=config.num_hidden_layers,
                num_experts=getattr(config, "num_experts", None),
            )
        sent: list[tuple[str, Any]] = []
        quantize = int4_router_quantizer(command["serving_config"]) if command.get("serving_config") else None
        if parallel == "pp":
            stack.enter_context(ownership.watching())
            for name, tensor in bridge.export_weights([model]):
                items = list(quantize([(name, tensor)])) if quantize else [(name, tensor)]
                for item_name, item in items:
                    if writer is not None and ownership.owned:
                        writer.add(item_name, item)
                    if mpu.pp_rank == 0:  # the gathered stream goes to the engine from stage 0
                        sent.append((item_name, item.detach().clone()))
        else:
            stream = export_rank_local(bridge, model)
            for name, tensor in quantize(stream) if quantize else stream:
                if writer is not None:
                    writer.add(name, tensor)
                sent.append((name, tensor.detach().clone()))
        if writer is not None:
            writer.write()
    return {"rank": rank, "sent": sent}


class Trainer:
    """The parent's handle on a group of trainer processes (kept for a whole test module)."""

    def __init__(self, parallel: str, kind: str, checkpoint: Path, world: int = 2) -> None:
        import torch.multiprocessing as mp
        from sglang_harness import free_port  # type: ignore[import-not-found]

        context = mp.get_context("spawn")
        self.parallel = parallel
        self.commands = [context.Queue() for _ in range(world)]
        self.replies = context.Queue()
        port = free_port()
        self.processes = [
            context.Process(
                target=trainer_worker,
                args=(rank, world, port, parallel, kind, str(checkpoint), self.commands[rank], self.replies),
                daemon=True,
            )
            for rank in range(world)
        ]
        for process in self.processes:
            process.start()
        self._collect(ready=True)

    def _collect(self, ready: bool = False) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for _ in self.processes:
            reply = self.replies.get(timeout=400)
            if "error" in reply:
                self.close()
                raise RuntimeError(f"trainer rank {reply['rank']} failed:\n{reply['error']}")
            out[reply["rank"]] = reply
        return out

    def sync(
        self,
        version: str,
        step: int,
        *,
        manifests: Path | None = None,
        defects: tuple[str, ...] = (),
        perturb: bool = False,
        serving_config: Path | None = None,
    ) -> list[list[tuple[str, Any]]]:
        """One weight sync: every rank exports; returns the buckets sent to the engine, rank by rank."""
        command = {
            "version": version,
            "step": step,
            "manifests": str(manifests) if manifests else None,
            "defects": defects,
            "perturb": perturb,
            "serving_config": str(serving_config) if serving_config else None,
        }
        for queue in self.commands:
            queue.put(command)
        replies = self._collect()
        return [replies[rank]["sent"] for rank in sorted(replies) if replies[rank]["sent"]]

    def close(self) -> None:
        for queue in self.commands:
            with contextlib.suppress(Exception):
                queue.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
