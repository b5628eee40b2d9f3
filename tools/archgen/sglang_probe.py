"""Which routed-expert checkpoint names SGLang's model class really reads, found by running its `load_weights`.

Reading the sources cannot answer this: a class may inherit a `load_weights` that has no expert mapping at
all (SGLang 0.5.23's `Llama4ForCausalLM` inherits Llama's), rename fused names in a helper
(`granitemoe_split_expert_weights`) or accept both layouts (Qwen3-VL-MoE). So, per MoE architecture, in the
SGLang environment:

1. a tiny transformers model of the architecture (tools.archgen.tiny, variant B) gives two candidate
   layouts of its routed experts: what `save_pretrained` writes (transformers 5 converts most MoEs back to
   per-expert names on save) and its in-memory state dict (transformers 5's fused 3-D
   `experts.gate_up_proj` / `experts.down_proj`, what an exporter that skips the conversion writes);
2. SGLang's registered class for the architecture is built on CPU (single-process gloo group, quant_config
   None) and its `load_weights` is run once per layout, every other tensor as `save_pretrained` wrote it.
   While it runs, `FusedMoE.make_expert_params_mapping*` are wrapped to record the checkpoint names the
   class asks for; when those are per-expert names that neither transformers layout has, a third layout is
   fed: per-expert tensors under exactly those names, cut from SGLang's own `w13`/`w2` parameter shapes;
3. a layout is read when `load_weights` returns and every routed-expert parameter (`experts.w13_*`,
   `experts.w2_*`) was written (each is filled with NaN before the load).

Only a forward-free CPU build is needed. Off CUDA, SGLang's `RotaryEmbedding.__init__` imports
`vllm._custom_ops.rotary_embedding`; a module whose function raises is inserted (the forward pass, its
only user, never runs here).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from weightcheck.names import engine_fused_expert, in_experts, layer_tail, split_layer

_MAPPERS = ("make_expert_params_mapping", "make_expert_params_mapping_fused",
            "make_expert_params_mapping_fused_mxfp4")  # fmt: skip


def _install_cpu_stubs() -> None:
    if "vllm._custom_ops" in sys.modules:
        return
    vllm, ops = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")

    def rotary_embedding(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("weightcheck probe stub: rotary_embedding is forward-only")

    ops.rotary_embedding = rotary_embedding  # type: ignore[attr-defined]
    vllm._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules.setdefault("vllm", vllm)
    sys.modules["vllm._custom_ops"] = ops


# Keys every published config.json of the family carries and SGLang's class reads directly, which the
# transformers config class does not define (so a config built from the class lacks them).
ENGINE_CONFIG_KEYS: dict[str, dict[str, Any]] = {
    # DeepSeek-V2/V3 releases: moe_layer_freq 1; V2 routes greedy softmax, V3 noaux_tc sigmoid.
    "deepseek_v2": {"moe_layer_freq": 1, "topk_method": "greedy", "scoring_func": "softmax"},
    "deepseek_v3": {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    # MiniMax-M2's config.json: sigmoid scoring with a routing bias.
    "minimax_m2": {"scoring_func": "sigmoid", "use_routing_bias": True},
    # Qwen3-Next / Qwen3.5 releases: one full-attention layer in four (transformers 5 says it as layer_types).
    "qwen3_next": {"full_attention_interval": 4},
    "qwen3_5_moe": {"full_attention_interval": 4},
    # GLM-4.7-Flash: the dense first layers as a count (transformers 5: mlp_layer_types).
    "glm4_moe_lite": {"first_k_dense_replace": lambda c: list(getattr(c, "mlp_layer_types", [])).index("sparse")},
    # Hunyuan-A13B: the experts' width as its own key (transformers' class reuses intermediate_size).
    "hunyuan_v1_moe": {"moe_intermediate_size": lambda c: c.intermediate_size},
}

_DIST_READY = False


def _init_dist() -> None:
    global _DIST_READY
    if _DIST_READY:
        return
    import socket

    _install_cpu_stubs()
    with socket.socket() as sock:  # a free loopback port: another run on the host must not collide
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    from sglang.test.layer_ut_utils import init_single_process_dist

    init_single_process_dist(master_port=port, backend="gloo")
    _DIST_READY = True


@contextlib.contextmanager
def _recording_mappers(calls: list[dict[str, Any]]) -> Any:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    saved = {m: FusedMoE.__dict__[m] for m in _MAPPERS if m in FusedMoE.__dict__}

    def wrap(name: str, original: Any) -> Any:
        def recorder(cls: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append({"function": name, **{k: v for k, v in kwargs.items() if k != "num_experts"}})
            return original.__func__(cls, *args, **kwargs)

        return classmethod(recorder)

    try:
        for name, original in saved.items():
            setattr(FusedMoE, name, wrap(name, original))
        yield
    finally:
        for name, original in saved.items():
            setattr(FusedMoE, name, original)


def _tail(name: str, layer_prefix: str) -> str | None:
    """`model.layers.3.mlp.experts.7.w1.weight` → `mlp.experts.*.w1.weight` (None outside the layers)."""
    return layer_tail(name, layer_prefix)


def _is_routed(name: str, shape: tuple[int, ...], n_experts: int) -> bool:
    return in_experts(name) or (len(shape) == 3 and shape[0] == n_experts)


def _style(tails: list[str]) -> str:
    return "per_expert" if all("experts.*." in t for t in tails) else "fused"


def _load(cls: Any, config: Any, stream: list[tuple[str, Any]]) -> tuple[str, str | None, list[dict[str, Any]]]:
    """Build the class, fill its expert parameters with NaN, run load_weights: (read, error, mapper calls)."""
    import torch

    calls: list[dict[str, Any]] = []
    model = cls(config=config, quant_config=None)
    params = {n: p for n, p in model.named_parameters() if engine_fused_expert(n)}
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    error = None
    with _recording_mappers(calls):
        try:
            model.load_weights(iter(stream))
        except Exception as exc:  # the engine refusing a layout is an outcome, not a probe failure
            error = type(exc).__name__
    written = [not torch.isnan(p).any().item() for p in params.values()]
    read = "all" if written and all(written) else "none" if not any(written) else "partial"
    # An error after every expert was written (a post-load step wanting non-expert weights) is not a refusal.
    return read, (error if read != "all" else None), calls


def _synth_per_expert(cls: Any, config: Any, calls: list[dict[str, Any]], layer_prefix: str) -> dict[str, Any]:
    """Per-expert tensors under the names the engine's own mapping asks for, shaped from its w13/w2 params."""
    import torch

    per = next((c for c in calls if c["function"] == "make_expert_params_mapping"), None)
    if per is None:
        return {}
    gate, up, down = per.get("ckpt_gate_proj_name"), per.get("ckpt_up_proj_name"), per.get("ckpt_down_proj_name")
    model = cls(config=config, quant_config=None)
    out: dict[str, Any] = {}
    for pname, p in model.named_parameters():
        split = split_layer(pname)
        which = engine_fused_expert(pname)
        if split is None or which is None or p.dim() != 3 or not split[2].endswith(f"experts.w{which}_weight"):
            continue
        base = f"{layer_prefix}.{split[1]}.{split[2][: -len(f'.w{which}_weight')]}"
        for e in range(p.shape[0]):
            if which == "13":
                halves = (gate, up) if up else (gate,)
                rows = p.shape[1] // len(halves)
                for nm in halves:
                    out[f"{base}.{e}.{nm}.weight"] = torch.randn(rows, p.shape[2])
            else:
                out[f"{base}.{e}.{down}.weight"] = torch.randn(p.shape[1], p.shape[2])
    return out


def probe(model_type: str, layer_prefix: str, sglang_class: str) -> dict[str, Any]:
    """Routed-expert layouts of one MoE architecture and whether SGLang's class reads each."""
    import torch
    from safetensors import safe_open
    from sglang.srt.models.registry import ModelRegistry

    from tools.archgen.tiny import EXPERT_KEYS, build

    _init_dist()
    hf = build(model_type, "B")  # B: no two of hidden size, expert count and (2x) intermediate sizes coincide
    config = hf.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_experts = next(int(v) for k in EXPERT_KEYS if isinstance(v := getattr(text, k, None), int) and v > 0)
    memory = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        saved: dict[str, Any] = {}
        for file in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as fh:
                for key in fh.keys():
                    saved[key] = fh.get_tensor(key)
        # The config as SGLang reads a checkpoint's config.json (its own config classes where it has them,
        # e.g. Qwen3-Next's `layers_block_type`), not transformers' object.
        from sglang.srt.utils.hf_transformers.config import get_config

        config = get_config(tmp, trust_remote_code=False)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for cfg in {id(c): c for c in (config, getattr(config, "text_config", None), text) if c is not None}.values():
        cfg.dtype = torch.float32  # SGLang's ModelConfig hands classes a torch dtype, not the JSON string
    for key, value in ENGINE_CONFIG_KEYS.get(model_type, {}).items():
        if not hasattr(text, key):
            setattr(text, key, value(text) if callable(value) else value)
    cls = ModelRegistry.resolve_model_cls([sglang_class])[0]

    def routed(tensors: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in tensors.items() if _is_routed(k, tuple(v.shape), n_experts)
                and _tail(k, layer_prefix) is not None}  # fmt: skip

    saved_experts, memory_experts = routed(saved), routed(memory)
    rest: list[tuple[str, Any]] = []  # only expert tensors are fed: what is judged is the experts' load
    candidates: list[tuple[str, dict[str, Any]]] = [("save_pretrained", saved_experts)]
    if set(memory_experts) != set(saved_experts):
        candidates.append(("transformers_in_memory", memory_experts))
    layouts: list[dict[str, Any]] = []
    mappings: list[dict[str, Any]] = []
    dims = {n_experts: "experts", int(text.hidden_size): "hidden"}
    for source, experts in candidates:
        read, error, calls = _load(cls, config, rest + sorted(experts.items()))
        mappings += [c for c in calls if c not in mappings]
        layouts.append(_layout(source, experts, layer_prefix, read, error, dims))
    for source, experts in list(candidates):
        # A fused layout refused by the engine may be read in the other orientation of its last two dims
        # (SGLang transposes Qwen3-VL-MoE's fused experts on load; transformers 5 saves them untransposed).
        done = next(lay for lay in layouts if lay["source"] == source)
        shape_refused = done.get("error") in ("RuntimeError", "AssertionError")  # names known, shape not
        if done["style"] == "fused" and shape_refused and any(v.dim() == 3 for v in experts.values()):
            flipped = {k: (v.transpose(-1, -2).contiguous() if v.dim() == 3 else v) for k, v in experts.items()}
            read, error, _ = _load(cls, config, rest + sorted(flipped.items()))
            layouts.append(_layout(f"{source}_transposed", flipped, layer_prefix, read, error, dims))
    synthetic = _synth_per_expert(cls, config, mappings, layer_prefix)
    if synthetic and not any(set(synthetic) <= set(e) for _, e in candidates):
        read, error, _ = _load(cls, config, rest + sorted(synthetic.items()))
        layouts.append(_layout("engine_mapping", synthetic, layer_prefix, read, error, dims))
    return {"layouts": layouts, "mappings": mappings}


def _layout(source: str, experts: dict[str, Any], layer_prefix: str, read: str, error: str | None,
            dims: dict[int, str]) -> dict[str, Any]:  # fmt: skip
    tails = sorted({t for k in experts if (t := _tail(k, layer_prefix)) is not None})
    out: dict[str, Any] = {"source": source, "style": _style(tails), "names": tails, "read": read}
    # Which dims of each stacked tensor are the expert count and the hidden size (the rest `*`): what lint
    # compares to tell an orientation the engine reads from one it does not.
    shapes: dict[str, list[str]] = {}
    for k, v in sorted(experts.items()):
        t = _tail(k, layer_prefix)
        if t is not None and v.dim() == 3 and t not in shapes:
            shapes[t] = [dims.get(int(d), "*") for d in v.shape]
    if shapes:
        out["dims"] = shapes
    if error:
        out["error"] = error
    return out
