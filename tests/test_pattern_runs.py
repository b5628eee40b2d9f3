"""The pattern's expectation one name template at a time (`patterns.expand_runs`) is exactly `expand`, and the
name set config-only lint groups from the runs (`NameSet.from_runs`, no per-name parsing) is exactly the one
`group_by_template` makes from the expanded names: same groups, same order, same members and ids. Checked on
every shipped pattern (hand-written over generated, and generated alone) against published configs of its
model type. Also: pattern detection reads only each hand-written file's `[family]` table, which must say
what the whole file says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

import weightcheck.patterns as patterns
from weightcheck.quant.analysis import QuantAnalysis
from weightcheck.quant.compiled import NameSet
from weightcheck.quant.inventory import from_config

DATA = json.loads((Path(__file__).parent / "data" / "oracle_configs.json").read_text())
SAMPLE = Path(__file__).resolve().parent.parent / "sample_configs" / "qwen3-30b-a3b-fp8-block" / "config.json"


def _text(config: dict) -> dict:
    return config.get("text_config") if isinstance(config.get("text_config"), dict) else config


def _cases() -> list[tuple[str, dict]]:
    cases = [("qwen3-30b-a3b-fp8 sample", json.loads(SAMPLE.read_text()))]
    cases += [(f"{e['model_type']}-{i}", e["config"]) for i, e in enumerate(DATA)]
    return cases


def _groups(names: NameSet) -> list[tuple[object, ...]]:
    """Each group's template, members and id-length classes (in their order: it orders the findings)."""
    return [(g.parts, g.members, list(g.classes.items()), g.class_shapes, g.abstract) for g in names.groups]


@pytest.mark.parametrize(("label", "config"), _cases(), ids=[c[0] for c in _cases()])
def test_runs_are_expand_and_group_like_the_names(label: str, config: dict) -> None:
    pattern = patterns.detect_pattern(config)
    if pattern is None:
        pytest.skip(f"{label}: no pattern")
    text = _text(config)
    mods, notes = patterns.expand(pattern, text)
    runs, run_notes = patterns.expand_runs(pattern, text)
    assert [m for r in runs for m in r.modules()] == mods
    assert [n for r in runs for n in r.names()] == [m.name for m in mods]
    assert run_notes == notes
    # a lookup finds a module without making every name (RunModules splits the name at its digit runs): the
    # same module as the eager dict, for every name and for near misses; and the runs' distinctness is exact
    lookups = from_config(pattern, text).modules
    probes = [*{m.name for m in mods}, *(p for r in runs for p in _near_misses(r.names()[-1]))]
    eager_last = {m.name: m for m in mods}
    for name in probes:
        assert (name in lookups) == (name in eager_last), name
        if name in eager_last:
            got, want = lookups[name], eager_last[name]
            assert (got.name, got.kind, got.expected, got.layer, got.expert) == (
                want.name, want.spec.kind, want, want.layer, want.expert
            ), name
    assert lookups.all_distinct() == (len({m.name for m in mods}) == len(mods))
    assert lookups._where_all is None or not lookups._splittable  # no name was made for the lookups
    inventory = from_config(pattern, text)
    # the modules made on lookup are the ones made eagerly before
    eager = {m.name: (m.name, m.spec.kind, m, m.layer, m.expert) for m in mods}
    assert list(inventory.modules) == list(eager)
    looked_up = inventory.modules[next(reversed(eager))] if eager else None  # made before the rest: kept
    assert [v.name for v in inventory.modules.values()] == list(eager)
    assert looked_up is None or any(v is looked_up for v in inventory.modules.values())
    assert {k: (v.name, v.kind, v.expected, v.layer, v.expert) for k, v in inventory.modules.items()} == eager
    assert inventory.expected == mods
    if inventory.runs is None:  # a name twice: grouped from the names instead
        assert len(inventory.modules) < len(mods)
        return
    assert _groups(NameSet.from_runs(inventory.runs)) == _groups(NameSet(inventory.modules))
    # the parameter names stay what they were, made when first asked
    assert inventory.params == sorted(f"{m.name}.{p}" for m in mods for p in m.params)
    # the parameter-level name set from the runs holds the names the set of them did, grouped alike (that
    # set's order was the hash seed's), and a name is a parameter exactly when it is in `params`
    qa = QuantAnalysis(spec=None, pattern=pattern, inventory=inventory)
    if qa._param_runs_apply():
        by_set = NameSet({*inventory.params, *(f"{m}.weight" for m in inventory.modules)})
        assert _unordered(qa.name_set("param")) == _unordered(by_set)
        params = set(inventory.params)
        probes = [*params, *(f"{m}.weight" for m in inventory.modules), *(f"{m}.qweight" for m in inventory.modules),
                  "lm_head", "weight", "model.nope.weight"]  # fmt: skip
        assert [n for n in probes if qa._is_param(n)] == [n for n in probes if n in params]


def _near_misses(name: str) -> list[str]:
    """Names one digit run away from `name`: a leading zero, one past, a digit glued on, the run dropped."""
    import re

    out = []
    for m in re.finditer(r"\d+", name):
        head, digits, tail = name[: m.start()], m.group(), name[m.end() :]
        out += [f"{head}0{digits}{tail}", f"{head}{int(digits) + 1000}{tail}", f"{head}{digits}7{tail}", head + tail]
    return [*out, name + ".x", "x" + name, name[:-1]]


def _unordered(names: NameSet) -> list[tuple[object, ...]]:
    return sorted((g.parts, sorted(g.members), g.abstract) for g in names.groups)


def test_from_runs_falls_back_where_the_id_is_no_template_slot() -> None:
    """An expert entry whose id ends the name (`mlp.experts.*`: no `experts.N.` with something after it) is
    one template per expert, as `group_by_template` has it; a run of one expert is its own name."""
    spec = patterns.ModuleSpec(name="mlp.experts.*", kind="linear")
    glued = patterns.ModuleSpec(name="mlp.experts.w*.weight", kind="linear")
    runs = [
        patterns.ExpectedRun("model.layers.3.mlp.experts.*", spec, 3, None, range(12), None, ("weight",), ()),
        patterns.ExpectedRun("model.layers.3.mlp.experts.w*.weight", glued, 3, None, range(3), None, ("weight",), ()),
        patterns.ExpectedRun("model.layers.4.mlp.experts.*.down", spec, 4, None, range(1), None, ("weight",), ()),
        patterns.ExpectedRun("model.layers.5.mlp.experts.*.down", spec, 5, None, range(8, 120), None, ("weight",), ()),
    ]
    names = [n for r in runs for n in r.names()]
    assert _groups(NameSet.from_runs(runs)) == _groups(NameSet(names))


def test_family_heads_say_what_the_whole_files_say() -> None:
    """`builtin_families` reads each shipped TOML only up to its second table: `[family]` must come first and
    the head must give the name, model_types and architectures of the whole file."""
    heads = patterns.builtin_families()
    full = patterns.builtin_patterns()
    assert list(heads) == list(full)
    for name, head in heads.items():
        doc = tomllib.loads(Path(head.path).read_text(encoding="utf-8"))
        assert next(iter(doc)) == "family", f"{head.path}: [family] is not the first table"
        assert head.model_types == tuple(full[name].model_types)
        assert head.architectures == tuple(full[name].architectures)
