"""Shared quantization analysis for the WC3xx rules and `weightcheck explain-ignore`.

Answers, per module and per consumer: is it targeted, is it ignored, is it stored quantized.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Container, Iterable

from weightcheck.checkpoint import Checkpoint
from weightcheck.lazyregex import LazyRegex
from weightcheck.lightclass import dataclass, field
from weightcheck.patterns import (
    ExpectedModule,
    Pattern,
    PatternError,
    base_layout,
    expand,
    fit_to_config,
    resolve_pattern,
)
from weightcheck.quant import safe_regex
from weightcheck.quant.compiled import CompiledIgnore, NameSet
from weightcheck.quant.config import QuantSpec, parse_quant_spec
from weightcheck.quant.inventory import Inventory, ModuleInfo, from_checkpoint, from_config
from weightcheck.quant.matchers import Consumer, _compiled, consumers_for, ct_match, fused_groups, get_consumer

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

_CLASS_NAME = LazyRegex(r"^[A-Z][A-Za-z0-9_]*$")
PARAM_SUFFIXES = (".weight", ".bias", "_scale", "_packed", ".qweight", ".qzeros", ".scales", "_shape", ".g_idx")


def is_class_entry(entry: str) -> bool:
    return not entry.startswith("re:") and bool(_CLASS_NAME.match(entry))


@dataclass
class QuantAnalysis:
    """The quantization view of one checkpoint, shared by the WC3xx rules (computed once per lint)."""

    spec: QuantSpec | None
    pattern: Pattern | None
    inventory: Inventory | None
    pattern_error: str | None = None
    notes: list[str] = field(default_factory=list)
    _fused: dict[str, list[str]] | None = None
    _expected: list[ExpectedModule] | None = None
    _hits: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    _regex: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    _names: dict[str, NameSet] = field(default_factory=dict)
    _entries_hit: dict[str, set[str]] = field(default_factory=dict)
    deployed: list[str] | None = None  # `consumers = [...]`: only these consumers' views are checked

    @property
    def consumers(self) -> list[Consumer]:
        if not self.spec:
            return []
        found = consumers_for(self.spec.method, self.deployed)
        if self.deployed is None and not self._integer_weights():
            # slime's and miles' online compressed-tensors quantizer packs INT weights only (pack_layer with the
            # first group's group_size, `quantizer_compressed_tensors.py`); for an FP8 or FP4 config it is not a
            # consumer anyone deploys (their FP8 path reads `quant_method: fp8`): unless named in `consumers`.
            found = [c for c in found if c.key != "slime-int4"]
        return found

    def _integer_weights(self) -> bool:
        """The config's weight schemes are integer (W4A16, W8A16...), or it names none (kept, as before)."""
        assert self.spec is not None
        schemes = [s for s in self.spec.schemes if s.quantizes_weights]
        return not schemes or any(s.type in (None, "int") for s in schemes)

    def module_consumers(self) -> list[Consumer]:
        return [c for c in self.consumers if c.level == "module"]

    def ignoring_entries(self, consumer: Consumer, module: ModuleInfo) -> list[str]:
        """Entries of the ignore list that make `consumer` skip `module` (its weight, for param-level)."""
        assert self.spec is not None
        if not self.spec.ignore:
            return []
        # Online quantizers see the parameter; everyone else the module.
        name = f"{module.name}.weight" if consumer.level == "param" else module.name
        return self.hits(consumer).get(name, [])

    def expected(self, config: dict[str, Any]) -> list[ExpectedModule]:
        """The pattern's expansion against the config (computed once)."""
        if self._expected is None:
            assert self.pattern is not None
            if self.inventory is not None and self.inventory.expected:
                self._expected = self.inventory.expected
            else:
                self._expected, _ = expand(self.pattern, config)
        return self._expected

    def hits(self, consumer: Consumer) -> dict[str, list[str]]:
        """name -> covering entries, for every module (parameter, for parameter-level consumers) some entry
        covers. Computed once per consumer over name templates (`weightcheck.quant.compiled`)."""
        if consumer.key not in self._hits:
            assert self.spec is not None and self.inventory is not None
            if not self.spec.ignore:
                # No entry covers anything (what `matches` returns for an empty list), and the names need not
                # be grouped: DeepSeek-V3's block-FP8 config has no ignore list, and its 46k module names
                # cost ~60 ms to group.
                self._hits[consumer.key] = {}
                return self._hits[consumer.key]
            self._hits[consumer.key] = CompiledIgnore(consumer, self.spec.ignore).matches(self.name_set(consumer.level))
        return self._hits[consumer.key]

    def name_set(self, level: str) -> NameSet:
        """Module names (level "module") or the parameter names online quantizers see ("param": every
        stored parameter and every module's `.weight`), grouped by template once."""
        if level not in self._names:
            assert self.inventory is not None
            names: Iterable[str] = self.inventory.modules
            if level == "param" and self._param_runs_apply():
                # config-only: every module's parameters and its `.weight` (the set below), one run per (run,
                # parameter), grouped without parsing ~2 names per module. The set's order was the hash
                # seed's, so no finding depends on the order of the groups.
                assert self.inventory.runs is not None and self.inventory.run_names is not None
                runs, run_names = [], []
                for run in self.inventory.runs:
                    for param in dict.fromkeys((*run.params, "weight")):
                        runs.append(run._replace(name=f"{run.name}.{param}"))
                        run_names.append(run.names(f".{param}"))  # made when read
                self._names[level] = NameSet.from_runs(runs, run_names)
                return self._names[level]
            if level == "param":
                names = {*self.inventory.params, *(f"{m}.weight" for m in self.inventory.modules)}
            elif self.inventory.runs is not None:  # config-only: grouped from the pattern's runs, unparsed
                self._names[level] = NameSet.from_runs(self.inventory.runs, self.inventory.run_names)
                return self._names[level]
            self._names[level] = NameSet(names)
        return self._names[level]

    def _param_runs_apply(self) -> bool:
        """Config-only with each module name once and dot-free parameter names: then `module.param` names
        are distinct, and a name is a parameter exactly when its last component is one of its module's."""
        assert self.inventory is not None
        runs = self.inventory.runs
        return runs is not None and self.inventory.run_names is not None and not any(
            "." in p for run in runs for p in run.params
        )

    def _is_param(self, name: str) -> bool:
        """`name in inventory.params` for config-only inventories (`_param_runs_apply`), without making them."""
        assert self.inventory is not None
        module, _, param = name.rpartition(".")
        if module not in self.inventory.modules:
            return False
        expected = self.inventory.modules[module].expected
        return expected is not None and param in expected.params

    def ignored_modules(self, consumer: Consumer) -> list[str]:
        """Module names a module-level consumer skips."""
        assert self.inventory is not None
        return [n for n in self.hits(consumer) if n in self.inventory.modules]

    def entries_hit(self, consumer: Consumer) -> set[str]:
        """Ignore entries that match at least one module (or parameter, for parameter-level consumers)."""
        assert self.inventory is not None
        if consumer.key not in self._entries_hit:
            hits = self.hits(consumer)
            if not hits:  # nothing to filter (and no set of 92k parameter names to build for it)
                self._entries_hit[consumer.key] = set()
                return self._entries_hit[consumer.key]
            names: Container[str] = self.inventory.modules
            if consumer.level == "param" and self._param_runs_apply():
                self._entries_hit[consumer.key] = {e for name, found in hits.items() if self._is_param(name)
                                                   for e in found}  # fmt: skip
                return self._entries_hit[consumer.key]
            if consumer.level == "param":
                names = set(self.inventory.params)
            self._entries_hit[consumer.key] = {e for name, found in hits.items() if name in names for e in found}
        return self._entries_hit[consumer.key]

    def regex_matches(self, entry: str, level: str = "module") -> list[str]:
        """Module (or parameter) names an `re:` entry matches with `re.match`, as every consumer applies it."""
        assert self.spec is not None and self.inventory is not None
        key = f"re:{level}"
        if key not in self._regex:
            entries = [e for e in self.spec.ignore if e.startswith("re:")]
            names = self.name_set(level) if level == "module" else NameSet(self.inventory.params)
            inverse: dict[str, list[str]] = defaultdict(list)
            for name, found in CompiledIgnore(get_consumer("ct"), entries).matches(names).items():
                for e in found:
                    inverse[e].append(name)
            self._regex[key] = inverse
        return self._regex[key].get(entry, [])

    def fused(self) -> dict[str, list[str]]:
        if self._fused is None:
            assert self.inventory is not None
            self._fused = fused_groups(self.inventory.modules)
        return self._fused

    def is_ignored(self, consumer: Consumer, module: ModuleInfo) -> bool:
        return bool(self.ignoring_entries(consumer, module))

    def targeted_by_ct(self, module: ModuleInfo) -> bool:
        """compressed-tensors/engine targeting: a `Linear` target covers Linear modules except lm_head and
        routers (engines build lm_head as an embedding-like head and routers outside the quant config
        unless a target names them); name/regex targets match by name."""
        assert self.spec is not None
        for target in self.spec.targets:
            if target == "Linear":
                if module.kind == "linear" and not module.name.endswith("lm_head") and not self._mha_out_proj(module):
                    return True
            elif is_class_entry(target):
                continue
            elif ct_match(module.name, target):
                return True
        return False

    def _mha_out_proj(self, module: ModuleInfo) -> bool:
        """Under bitsandbytes, the `out_proj` of a `torch.nn.MultiheadAttention` (its parent stores
        `in_proj_weight`; SigLIP's pooling head in Gemma 3's vision tower): a `NonDynamicallyQuantizableLinear`,
        which transformers' bitsandbytes replacement skips (it converts `type(module) is nn.Linear` only).
        compressed-tensors matches a `Linear` target along the class's MRO, so llm-compressor does quantize it."""
        parent, _, leaf = module.name.rpartition(".")
        if leaf != "out_proj" or self.inventory is None or self.spec is None or self.spec.method != "bitsandbytes":
            return False
        owner = self.inventory.modules.get(parent)
        return owner is not None and "in_proj_weight" in owner.params


def root_hints(spec: QuantSpec | None) -> list[str]:
    """The ignore list's plain entries: module names as the checkpoint spells them, which pick the root of a
    pattern with aliases when there are no tensor names (a borrowed one: `language_model.model.layers.1.mlp.gate`)."""
    return [e for e in spec.ignore if isinstance(e, str) and not e.startswith("re:")] if spec else []


# The class names a compressed-tensors target may give for `torch.nn.Linear` (its `targets` match a module's class
# name or, with `re:`, its name).
LINEAR_CLASS_TARGETS = frozenset({"Linear", "nn.Linear", "torch.nn.Linear"})


def _linear_only(spec: QuantSpec | None) -> bool:
    """Every weight-quantizing target is the Linear class: only `nn.Linear` modules were quantized."""
    targets = spec.targets if spec is not None else []
    return bool(targets) and all(t in LINEAR_CLASS_TARGETS for t in targets)


def analyze_checkpoint(ckpt: Checkpoint, pattern_choice: str | None = None) -> QuantAnalysis:
    config = ckpt.config_data
    text = ckpt.text_config()
    hf_quant = ckpt.extra_json.get("hf_quant_config.json")
    spec = parse_quant_spec(config, hf_quant.data if hf_quant and isinstance(hf_quant.data, dict) else None)
    pattern: Pattern | None = None
    error: str | None = None
    try:
        pattern = resolve_pattern(pattern_choice, config)
    except PatternError as exc:
        error = str(exc)
    inventory: Inventory | None
    notes: list[str] = []
    if pattern is not None:  # a config outside what the pattern was validated on: see fit_to_config
        pattern, fit_notes = fit_to_config(pattern, config, text)
        notes.extend(fit_notes)
    if pattern is not None and ckpt.has_weights:  # a base model's names under a causal-LM config (after the fit:
        pattern, layout_note = base_layout(pattern, config, ckpt.tensor_names())  # the class's names move too)
        notes.extend([layout_note] if layout_note else [])
    if ckpt.has_weights:
        # sorted: tensor_names() is a frozenset, and module order reaches findings' messages and details
        # (WC308's companions, `modules` lists), which must not depend on the interpreter's hash seed
        tensors: dict[str, Any] = dict.fromkeys(ckpt.sorted_names())
        tensors.update(ckpt.all_tensors())
        inventory = from_checkpoint(tensors, pattern, text, linear_only=_linear_only(spec))
    elif pattern is not None:
        inventory = from_config(pattern, text, root_hints(spec))
        notes.append(
            f"config-only: module list derived from pattern {pattern.name!r} and the config's dimensions; "
            "checks of stored tensors (companions, shapes, quantized-vs-ignored) could not run"
        )
    else:
        inventory = None
        if spec is not None:
            notes.append("config-only and no architecture pattern: ignore entries cannot be matched to modules")
    if pattern is None and error is None and (config or text):
        notes.append(f"no architecture pattern for model_type {text.get('model_type')!r}: pattern-free checks only")
    if inventory is not None:
        notes.extend(inventory.notes)
    return QuantAnalysis(spec=spec, pattern=pattern, inventory=inventory, pattern_error=error, notes=notes)


def regex_error(entry: str) -> str | None:
    if not entry.startswith("re:"):
        return None
    try:
        re.compile(entry[3:])
    except re.error as exc:
        return str(exc)
    except (OverflowError, RecursionError, ValueError, MemoryError) as exc:  # `a{99999999999}`: OverflowError
        return f"does not compile: {type(exc).__name__}: {str(exc)[:120]}"
    return None if _compiled(entry[3:]) is not None else safe_regex.refusal(entry[3:]) or "does not compile"
