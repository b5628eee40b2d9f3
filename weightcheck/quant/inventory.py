"""The module inventory the quantization rules reason about.

From a checkpoint: tensor names (and header dtypes/shapes) grouped into modules, with quantization
companions recognised. From a config alone: the modules the architecture pattern implies. Each module
carries a kind (linear, router, embedding, norm...) from the pattern, or from a name heuristic when no
pattern applies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, ItemsView, Iterator, Mapping, Sequence, ValuesView
from itertools import repeat

from weightcheck.lightclass import dataclass, field
from weightcheck.names import split_layer
from weightcheck.patterns import ExpectedModule, ExpectedRun, Pattern, expand, expand_runs
from weightcheck.safetensors_header import TensorInfo
from weightcheck.structure import QUANT_COMPANIONS, split_tail

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

# Companions whose presence means "this module is stored quantized". bitsandbytes 4-bit stores its packed
# codes as a uint8 `weight` with blobs under it (`weight.absmax`, `weight.quant_map`,
# `weight.quant_state.bitsandbytes__nf4`; `split_param` keeps them as `weight.<blob>`): absmax is always there.
QUANTIZED_MARKERS = frozenset(
    {"weight_packed", "weight_scale", "weight_scale_inv", "weight_zero_point", "weight_global_scale",
     "weight_scale_2", "qweight", "qzeros", "scales", "SCB", "weight.absmax"}
)  # fmt: skip
LOW_PRECISION_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I8", "F4"})
_ROUTER_LEAVES = {"gate", "router"}
# Kinds the name heuristic gives that a quantized module under Linear-only targets cannot have (a router is a
# Linear, and stays one: the engines build it unquantized).
_NAMED_NON_LINEAR = frozenset({"embedding", "norm", "other"})
_MOE_PARENTS = {"mlp", "block_sparse_moe", "moe", "feed_forward", "mixer"}


@dataclass(slots=True)
class ModuleInfo:
    """One module of the inventory: its kind, stored params, expectation, layer and expert ids."""

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


class Inventory:
    """The modules; `params`: the sorted full parameter names (what the online quantizers see). It may be given
    as a function that makes them: config-only lint of a module-level ignore list never asks for them (~19k
    names for Qwen3-30B-A3B), so from_config leaves them unmade until asked."""

    def __init__(
        self,
        modules: Mapping[str, ModuleInfo],
        params: list[str] | Callable[[], list[str]],
        from_config_only: bool,
        pattern: Pattern | None,
        notes: list[str] | None = None,
        expected: list[ExpectedModule] | Callable[[], list[ExpectedModule]] | None = None,
        runs: list[ExpectedRun] | None = None,
        run_names: list[Sequence[str]] | None = None,
    ) -> None:
        # runs: from_config's expectation one name template at a time (`patterns.expand_runs`), each module
        # name once (run_names: each run's names()); None when the modules come from stored tensors.
        self.runs, self.run_names = runs, run_names
        self.modules, self._params = modules, params
        self.from_config_only, self.pattern = from_config_only, pattern
        self.notes: list[str] = notes if notes is not None else []
        self._expected = expected if expected is not None else []

    @property
    def expected(self) -> list[ExpectedModule]:
        """The pattern's modules (`expand`), made on first use when given as a function."""
        if callable(self._expected):
            self._expected = self._expected()
        return self._expected

    @property
    def params(self) -> list[str]:
        if callable(self._params):
            self._params = self._params()
        return self._params

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


def _vocab_rows(entry: ModuleInfo, config: dict[str, Any]) -> bool:
    """The module's weight has `vocab_size` rows: an embedding table, or a head (left to WC310 as one)."""
    weight = entry.params.get("weight")
    vocab = config.get("vocab_size")
    return weight is not None and bool(weight.shape) and isinstance(vocab, int) and weight.shape[0] == vocab


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
    tensors: dict[str, TensorInfo | None], pattern: Pattern | None, config: dict[str, Any], linear_only: bool = False
) -> Inventory:
    """The checkpoint's modules. `linear_only`: the quantization config targets only the Linear class, so a module
    stored quantized was an `nn.Linear` whatever its name says (without a pattern, ELECTRA's `embeddings_project`,
    Fuyu's `vision_embed_tokens` and RemBERT's `embedding_hidden_mapping_in` are Linears, not embeddings)."""
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
            # A module no pattern expects, named like an embedding or a norm but quantized as a Linear: a Linear.
            if linear_only and quantized and entry.kind in _NAMED_NON_LINEAR and not _vocab_rows(entry, config):
                entry.kind = "linear"
        modules[module] = entry
    # The sorted parameter names only matter to an ignore list's parameter-level matching: made when first
    # asked (a checkpoint whose config has no ignore list never sorts its 92k names).
    names = list(tensors)
    return Inventory(
        modules=modules, params=lambda: sorted(names), from_config_only=False, pattern=pattern, notes=notes,
        expected=list(expected.values()),
    )  # fmt: skip


def from_config(pattern: Pattern, config: dict[str, Any], root_hints: Sequence[str] = ()) -> Inventory:
    """Config-only mode: the modules the pattern and the config's dimensions imply, no tensors. `root_hints`
    (the ignore list's plain entries) pick the language-model root a pattern's aliases allow."""
    runs, notes = expand_runs(pattern, config, root_hints=root_hints)
    names = [run.names() for run in runs]
    modules = RunModules(runs)

    def expected() -> list[ExpectedModule]:
        return [m for run in runs for m in run.modules()]

    def params() -> list[str]:
        return sorted(f"{m.name}.{p}" for m in expected() for p in m.params)

    return Inventory(modules=modules, params=params, from_config_only=True, pattern=pattern, notes=notes,
                     expected=expected, runs=runs if modules.all_distinct() else None, run_names=names)  # fmt: skip


class RunModules(Mapping[str, ModuleInfo]):
    """Config-only modules, made from the pattern's runs when first looked up: the rules on the config path ask
    for a few routers, norms and heads, or whether a name exists; Qwen3-30B-A3B implies ~19k modules, 18k of
    them expert Linears. Same keys, order and values as `{m.name: ModuleInfo(...) for m in expand(...)}` (a
    name made twice keeps its first place and its last module); each module is made once.

    A lookup needs no name of an expert run: a name is split at each of its digit runs into (before, after),
    which is the `*`'s (before, after) of the expert runs that can make it (`_by_split`). Only walking every
    module makes them all (`_where`, once)."""

    def __init__(self, runs: list[ExpectedRun]) -> None:
        self._runs = runs
        self._single: dict[str, tuple[int, ExpectedRun, int | None]] = {}  # the last run wins, as in a dict
        self._by_split: dict[tuple[str, str], list[tuple[int, ExpectedRun]]] = {}
        self._splittable = True  # False: a lookup makes every name (see _split_ok)
        for index, run in enumerate(runs):
            if run.experts is None:
                self._single[run.name] = (index, run, run.expert)
                continue
            pieces = run.name.split("*")
            if not _split_ok(pieces, run.experts):
                self._splittable = False
            self._by_split.setdefault((pieces[0], pieces[-1]), []).append((index, run))
        self._where_all: dict[str, tuple[ExpectedRun, int | None]] | None = None
        self._made: dict[str, ModuleInfo] = {}

    @property
    def _where(self) -> dict[str, tuple[ExpectedRun, int | None]]:
        """Every name -> (run, expert id), in order (a name made twice: its first place, its last run)."""
        if self._where_all is None:
            where: dict[str, tuple[ExpectedRun, int | None]] = {}
            for run in self._runs:
                if run.experts is None:
                    where[run.name] = (run, run.expert)
                else:
                    where.update(zip(run.names(), zip(repeat(run, len(run.experts)), run.experts, strict=True),
                                     strict=True))  # fmt: skip
            self._where_all = where
        return self._where_all

    def _locate(self, name: str) -> tuple[ExpectedRun, int | None] | None:
        """(run, expert id) that makes `name` (the last such run), without making the other names."""
        if self._where_all is not None or not self._splittable:
            return self._where.get(name)
        best = self._single.get(name)
        expert = self._locate_expert(name)
        if expert is not None and (best is None or expert[0] > best[0]):
            best = expert
        return None if best is None else (best[1], best[2])

    def _locate_expert(self, name: str) -> tuple[int, ExpectedRun, int] | None:
        """(index, run, expert id) of the last expert run that makes `name`."""
        best: tuple[int, ExpectedRun, int] | None = None
        for match in _DIGIT_RUN.finditer(name):
            candidates = self._by_split.get((name[: match.start()], name[match.end() :]))
            if not candidates:
                continue
            digits = match.group()
            if len(digits) > 1 and digits[0] == "0":  # no id is written with a leading zero
                continue
            expert = int(digits)
            for index, run in candidates:
                if expert in run.experts and (best is None or index > best[0]):  # type: ignore[operator]
                    best = (index, run, expert)
        return best

    def _count_distinct(self) -> bool:
        return len(self._where) == sum(1 if r.experts is None else len(r.experts) for r in self._runs)

    def all_distinct(self) -> bool:
        """Whether no name is made twice (then `len(self)` is the runs' total), mostly without making them.

        Expert runs can only make a common name when their names have the same shape (digit runs as `#`);
        with the `*` at the same digit run of that shape, only when their (before, after) pieces are the same
        and their ids overlap. Anything else is counted name by name (exact, and rare)."""
        if self._where_all is not None or not self._splittable:
            return self._count_distinct()
        if len(self._single) != sum(1 for r in self._runs if r.experts is None):
            return False  # a single run's name twice
        if any(self._locate_expert(name) is not None for name in self._single):
            return False  # an expert run makes a single run's name
        shapes: dict[str, int] = {}  # shape -> the digit run that holds the `*`
        for (before, after), members in self._by_split.items():
            shape = f"{_DIGIT_RUN.sub('#', before)}#{_DIGIT_RUN.sub('#', after)}"
            slot = len(_DIGIT_RUN.findall(before))
            if shapes.setdefault(shape, slot) != slot:
                return self._count_distinct()
            if len(members) > 1:
                seen: set[int] = set()
                for _, run in members:
                    ids = set(run.experts)  # type: ignore[arg-type]
                    if seen & ids:
                        return False
                    seen |= ids
        return True

    def __getitem__(self, name: str) -> ModuleInfo:
        got = self._made.get(name)
        if got is None:
            located = self._locate(name)
            if located is None:
                raise KeyError(name)
            run, expert = located
            exp = ExpectedModule(name, run.spec, run.layer, expert, run.shape, run.params, run.optional_params)
            got = self._made[name] = ModuleInfo(name=name, kind=run.spec.kind, expected=exp, layer=run.layer,
                                                expert=expert)  # fmt: skip
        return got

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._made or self._locate(name) is not None)

    def values(self) -> ValuesView[ModuleInfo]:  # type: ignore[override]
        return self._every().values()

    def items(self) -> ItemsView[str, ModuleInfo]:  # type: ignore[override]
        return self._every().items()

    def _every(self) -> dict[str, ModuleInfo]:
        """Every module, in order, made in one pass (a rule that walks them all, such as WC320 on a
        compressed-tensors list, should not pay a lookup per module); those already made are kept."""
        if len(self._made) != len(self._where):
            made, make = self._made, ExpectedModule._make
            self._made = {
                name: made.get(name)
                or ModuleInfo(name=name, kind=run.spec.kind, layer=run.layer, expert=expert,
                              expected=make((name, run.spec, run.layer, expert, *run[5:])))
                for name, (run, expert) in self._where.items()
            }  # fmt: skip
        return self._made

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


_DIGIT_RUN = re.compile(r"\d+")


def _split_ok(pieces: list[str], experts: range) -> bool:
    """Whether an expert run's names split back at their id: one `*`, the id a whole run of ASCII digits (no
    digit on either side of the `*`, no negative id)."""
    if len(pieces) != 2 or (experts.start < 0 if len(experts) else False) or experts.step <= 0:
        return False
    before, after = pieces
    return not (before[-1:].isdigit() or after[:1].isdigit()) and before.isascii() and after.isascii()
