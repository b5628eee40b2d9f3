"""Shared quantization analysis for the WC3xx rules and `weightcheck explain-ignore`.

Answers, per module and per consumer: is it targeted, is it ignored, is it stored quantized.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from weightcheck.checkpoint import Checkpoint
from weightcheck.patterns import ExpectedModule, Pattern, PatternError, expand, resolve_pattern
from weightcheck.quant import safe_regex
from weightcheck.quant.config import QuantSpec, parse_quant_spec
from weightcheck.quant.inventory import Inventory, ModuleInfo, from_checkpoint, from_config
from weightcheck.quant.matchers import Consumer, IgnoreIndex, _compiled, consumers_for, ct_match, fused_groups

_CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")
PARAM_SUFFIXES = (".weight", ".bias", "_scale", "_packed", ".qweight", ".qzeros", ".scales", "_shape", ".g_idx")


def is_class_entry(entry: str) -> bool:
    return not entry.startswith("re:") and bool(_CLASS_NAME.match(entry))


@dataclass
class QuantAnalysis:
    spec: QuantSpec | None
    pattern: Pattern | None
    inventory: Inventory | None
    pattern_error: str | None = None
    notes: list[str] = field(default_factory=list)
    _ignored: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    _indexes: dict[str, IgnoreIndex] = field(default_factory=dict)
    _fused: dict[str, list[str]] | None = None
    _expected: list[ExpectedModule] | None = None
    _hits: dict[str, set[str]] = field(default_factory=dict)

    @property
    def consumers(self) -> list[Consumer]:
        return consumers_for(self.spec.method) if self.spec else []

    def module_consumers(self) -> list[Consumer]:
        return [c for c in self.consumers if c.level == "module"]

    def ignoring_entries(self, consumer: Consumer, module: ModuleInfo) -> list[str]:
        """Entries of the ignore list that make `consumer` skip `module` (its weight, for param-level)."""
        assert self.spec is not None
        if not self.spec.ignore:
            return []
        key = (consumer.key, module.name)
        if key not in self._ignored:
            # Online quantizers see the parameter; everyone else the module.
            name = f"{module.name}.weight" if consumer.level == "param" else module.name
            self._ignored[key] = self.index(consumer).matching(name)
        return self._ignored[key]

    def expected(self, config: dict[str, Any]) -> list[ExpectedModule]:
        """The pattern's expansion against the config (computed once)."""
        if self._expected is None:
            assert self.pattern is not None
            if self.inventory is not None and self.inventory.expected:
                self._expected = self.inventory.expected
            else:
                self._expected, _ = expand(self.pattern, config)
        return self._expected

    def index(self, consumer: Consumer) -> IgnoreIndex:
        if consumer.key not in self._indexes:
            assert self.spec is not None
            self._indexes[consumer.key] = consumer.index(self.spec.ignore)
        return self._indexes[consumer.key]

    def entries_hit(self, consumer: Consumer) -> set[str]:
        """Ignore entries that match at least one module (or parameter, for parameter-level consumers)."""
        if consumer.key not in self._hits:
            assert self.inventory is not None
            names = self.inventory.params if consumer.level == "param" else self.inventory.modules
            index = self.index(consumer)
            hit: set[str] = set()
            for name in names:
                hit.update(index.matching(name))
            self._hits[consumer.key] = hit
        return self._hits[consumer.key]

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
                if module.kind == "linear" and not module.name.endswith("lm_head"):
                    return True
            elif is_class_entry(target):
                continue
            elif ct_match(module.name, target):
                return True
        return False


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
    if ckpt.has_weights:
        tensors: dict[str, Any] = dict.fromkeys(ckpt.tensor_names())
        tensors.update(ckpt.all_tensors())
        inventory = from_checkpoint(tensors, pattern, text)
    elif pattern is not None:
        inventory = from_config(pattern, text)
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
