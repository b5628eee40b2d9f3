"""Conformance: does a pattern predict, for a config, what transformers' model class writes? The generator
(tools.archgen.generate) fits patterns with it and the tests check shipped patterns with it. It sits above
both `patterns` (whose `expand` it runs, the path lint uses) and the model-class oracle (weightcheck.arch.
oracle, which `patterns` itself calls for configs outside a pattern's coverage), so neither imports the other
back."""

from __future__ import annotations

from typing import Any


def conformance(pattern: Any, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """What the pattern predicts for `config` (through `expand`, the path lint uses) against what the model
    class writes (`shapes`): each missing required weight, unexpected tensor and shape mismatch, as text.
    Empty: the pattern is right for this config. Names under the pattern's allowed prefixes (vision
    towers, MTP) are not itemized by lint and not compared here."""
    from weightcheck.checkpoint import text_config_of
    from weightcheck.patterns import expand

    text = text_config_of(config)
    mods, _ = expand(pattern, text, list(shapes))
    allowed = tuple(pattern.allowed_prefixes)
    stored = {n: s for n, s in shapes.items() if not (allowed and n.startswith(allowed))}
    problems: list[str] = []
    known: set[str] = set()
    for m in mods:
        for p in (*m.params, *m.optional_params):
            known.add(f"{m.name}.{p}")
        if not m.spec.optional:
            problems += [f"missing {m.name}.{p}" for p in m.params if f"{m.name}.{p}" not in stored]
        got = stored.get(f"{m.name}.weight")
        if m.shape is not None and got is not None and tuple(got) != tuple(m.shape):
            problems.append(f"shape {m.name}.weight: pattern {list(m.shape)}, model {list(got)}")
    problems += [f"unexpected {n}" for n in sorted(stored) if n not in known]
    return problems
