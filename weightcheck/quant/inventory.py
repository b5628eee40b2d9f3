"""The module inventory the quantization rules reason about.

From a checkpoint: tensor names (and header dtypes/shapes) grouped into modules, with quantization
companions recognised. From a config alone: the modules the architecture pattern implies. Each module
carries a kind (linear, router, embedding, norm...) from the pattern, or from a name heuristic when no
pattern applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weightcheck.names import split_layer
from weightcheck.patterns import ExpectedModule, Pattern, expand
from weightcheck.safetensors_header import TensorInfo
from weightcheck.structure import QUANT_COMPANIONS, split_tail

# Companions whose presence means "this module is stored quantized".
QUANTIZED_MARKERS = frozenset(
    {"weight_packed", "weight_scale", "weight_scale_inv", "weight_zero_point", "weight_global_scale",
     "weight_scale_2", "qweight", "qzeros", "scales", "SCB"}
)  # fmt: skip
LOW_PRECISION_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I8", "F4"})
_ROUTER_LEAVES = {"gate", "router"}
_MOE_PARENTS = {"mlp", "block_sparse_moe", "moe", "feed_forward", "mixer"}


@dataclass(slots=True)
class ModuleInfo:
    name: str
    kind: str
    params: dict[str, TensorInfo | None] = field(default_factory=dict)
    expected: ExpectedModule | None = None
    layer: int | None = None
    expert: int | None = None
    # True/False from the stored tensors; None when only a config is known. Set by `finalize()`.
    quantized: bool | None = None

    def finalize(self) -> None:
        if not self.params:
            self.quantized = None
            return
        weight = self.params.get("weight")
        # isdisjoint: no intersection set built (this runs once per module, 46k times on DeepSeek-V3)
        self.quantized = not QUANTIZED_MARKERS.isdisjoint(self.params) or (
            weight is not None and weight.dtype in LOW_PRECISION_DTYPES
        )

    @property
    def companions(self) -> list[str]:
        return sorted(p for p in self.params if p in QUANT_COMPANIONS)

    def weight_ndim(self) -> int | None:
        weight = self.params.get("weight")
        if weight is not None:
            return len(weight.shape)
        if "weight_packed" in self.params or "qweight" in self.params:
            return 2
        if self.expected is not None and self.expected.shape is not None:
            return len(self.expected.shape)
        return None


@dataclass
class Inventory:
    modules: dict[str, ModuleInfo]
    params: list[str]  # full parameter names (what the online quantizers see)
    from_config_only: bool
    pattern: Pattern | None
    notes: list[str] = field(default_factory=list)
    expected: list[ExpectedModule] = field(default_factory=list)

    def of_kind(self, *kinds: str) -> list[ModuleInfo]:
        return [m for m in self.modules.values() if m.kind in kinds]


def heuristic_kind(module: str, params: dict[str, TensorInfo | None]) -> str:
    """Kind of a module without a pattern, from its name and weight rank."""
    leaf = module.rsplit(".", 1)[-1]
    parent = module.rsplit(".", 2)[-2] if module.count(".") >= 1 else ""
    if leaf == "lm_head" or module.endswith(".lm_head"):
        return "linear"
    if "embed" in leaf or leaf in ("wte", "wpe", "word_embeddings", "tok_embeddings"):
        return "embedding"
    if "norm" in leaf or leaf.startswith("ln") or leaf in ("enorm", "hnorm"):
        return "norm"
    if (leaf in _ROUTER_LEAVES and parent in _MOE_PARENTS) or leaf == "shared_expert_gate":
        return "router"
    weight = params.get("weight")
    if "weight_packed" in params or "qweight" in params or (weight is not None and len(weight.shape) == 2):
        return "linear"
    return "other"


def _shape_kind(module: str, entry: ModuleInfo, config: dict[str, Any]) -> str:
    """No pattern: a 2-D `[num_experts, hidden]` weight is a router and `[vocab, hidden]` an embedding
    (unless it is the head), whatever their names (reported by WC427)."""
    from weightcheck.structure import EXPERT_COUNT_KEYS, config_int

    weight = entry.params.get("weight")
    if weight is None or len(weight.shape) != 2 or entry.kind in ("router", "embedding", "norm"):
        return entry.kind
    hidden, vocab = config.get("hidden_size"), config.get("vocab_size")
    experts = config_int(config, EXPERT_COUNT_KEYS, "experts")
    shape = tuple(weight.shape)
    if experts and isinstance(hidden, int) and shape == (experts, hidden) and experts != hidden:
        return "router"
    leaf = module.rsplit(".", 1)[-1]
    if isinstance(vocab, int) and shape == (vocab, hidden) and leaf not in ("lm_head", "embed_out", "output"):
        return "embedding"
    return entry.kind


def split_param(name: str) -> tuple[str, str]:
    """`a.b.weight_packed` → (`a.b`, `weight_packed`); bitsandbytes `a.weight.absmax` → (`a`, `weight.absmax`)."""
    if ".weight." in name:
        head, _, tail = name.partition(".weight.")
        return head, "weight." + tail
    module, _, param = name.rpartition(".")
    return module, param


def _positions(module: str) -> tuple[int | None, int | None]:
    """(layer id, expert id) of a module, parsed as the pattern-free layer analysis parses names."""
    split = split_layer(module)
    if split is None:
        return None, None
    head, expert, _ = split_tail(split[2])
    return split[1], (expert if head is not None else None)


def from_checkpoint(
    tensors: dict[str, TensorInfo | None], pattern: Pattern | None, config: dict[str, Any]
) -> Inventory:
    expected: dict[str, ExpectedModule] = {}
    notes: list[str] = []
    if pattern is not None:
        mods, notes = expand(pattern, config, tensors)
        expected = {m.name: m for m in mods}
    # Parameters grouped by module (the one loop per tensor name), then one ModuleInfo per module built
    # with every field at once (this runs 46k times on DeepSeek-V3: no attribute writes after creation).
    params_of: dict[str, dict[str, TensorInfo | None]] = {}
    get = params_of.get
    for name, info in tensors.items():
        # split_param, inlined
        if ".weight." in name:
            module, _, tail = name.partition(".weight.")
            param = "weight." + tail
        else:
            module, _, param = name.rpartition(".")
        params = get(module)
        if params is None:
            params = params_of[module] = {}
        params[param] = info
    modules: dict[str, ModuleInfo] = {}
    expected_get = expected.get
    markers_disjoint = QUANTIZED_MARKERS.isdisjoint
    for module, params in params_of.items():
        exp = expected_get(module)
        weight = params.get("weight")
        # ModuleInfo.finalize, inlined (params is never empty here)
        quantized = not markers_disjoint(params) or (weight is not None and weight.dtype in LOW_PRECISION_DTYPES)
        if exp is not None:
            entry = ModuleInfo(module, exp.spec.kind, params, exp, exp.layer, exp.expert, quantized)
        else:
            layer, expert = _positions(module)
            entry = ModuleInfo(module, heuristic_kind(module, params), params, None, layer, expert, quantized)
        if pattern is None:
            entry.kind = _shape_kind(module, entry, config)
        modules[module] = entry
    return Inventory(
        modules=modules, params=sorted(tensors), from_config_only=False, pattern=pattern, notes=notes,
        expected=list(expected.values()),
    )  # fmt: skip


def from_config(pattern: Pattern, config: dict[str, Any]) -> Inventory:
    """Config-only mode: the modules the pattern and the config's dimensions imply, no tensors."""
    mods, notes = expand(pattern, config)
    modules = {
        m.name: ModuleInfo(name=m.name, kind=m.spec.kind, expected=m, layer=m.layer, expert=m.expert) for m in mods
    }
    params = sorted(f"{m.name}.{p}" for m in mods for p in m.params)
    return Inventory(modules=modules, params=params, from_config_only=True, pattern=pattern, notes=notes,
                     expected=mods)  # fmt: skip
