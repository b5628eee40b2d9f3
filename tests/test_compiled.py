"""Compiled ignore lists evaluated over name templates give exactly what every consumer's own matcher
gives on every (name, entry) pair — including entries built to defeat the template shortcuts."""

from __future__ import annotations

import random

import pytest

from weightcheck.names import expand_template, group_by_template, name_template
from weightcheck.quant.compiled import CompiledIgnore, digit_uniform
from weightcheck.quant.matchers import CONSUMERS


def module_names(layers: int = 23, experts: int = 12) -> list[str]:
    names = ["lm_head", "model.embed_tokens", "model.norm", "model.visual.blocks.0.attn.qkv",
             "model.language_model.layers.3.mlp.gate", "language_model.model.layers.11.self_attn.q_proj",
             "model.layers.1", "model.layers.07.mlp.gate", "mtp.layers.0.eh_proj",
             "model.layers.2.mlp.experts"]  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}"
        names += [f"{p}.self_attn.{x}_proj" for x in "qkvo"]
        names += [f"{p}.input_layernorm", f"{p}.post_attention_layernorm", f"{p}.mlp.gate",
                  f"{p}.mlp.shared_expert_gate", f"{p}.mlp.gate_up_proj", f"{p}.self_attn.fused_qkv_a_proj_with_mqa",
                  f"{p}.mlp.fc1", f"{p}.conv2d.h12"]  # fmt: skip
        names += [f"{p}.mlp.experts.{e}.{x}_proj" for e in range(experts) for x in ("gate", "up", "down")]
        names += [f"{p}.mlp.experts.{e}.w{w}" for e in range(experts) for w in (1, 2, 13)]
    return names


ENTRIES = [
    "lm_head", "model.layers.3.mlp.gate", "model.layers.13.mlp.gate", "layers.1", "1.mlp", "s.1", "3",
    "model.layers.1.self_attn.q_proj", "mlp.gate", "gate", "re:.*mlp\\.gate$", "re:.*mlp.gate", "re:model.layers.1.*",
    "re:model\\.layers\\.\\d\\.mlp.*", "re:.*experts\\.(1|7)\\..*", "re:(\\d)\\.mlp\\.experts\\.\\1\\..*",
    "re:.*layers\\.[0-2]\\..*", "re:.*experts\\.\\d{2}\\.", "re:[", "model.layers.2.mlp.experts",
    "model.layers.4.mlp.experts.5.down_proj", "layers.5.mlp.experts.1", "experts.1", "model.layers.10.",
    "MODEL.LAYERS.2.MLP.GATE", "*mlp.gate*", "*.experts.1?.*", "model.layers.[12].mlp.gate",
    "model.layers.1.mlp.gate", "kv_a_proj_with_mqa", "model.layers.4.self_attn.q_a_proj",
    "language_model.layers.11.self_attn.q_proj", "model.layers.11.self_attn.q_proj", "layers.3.mlp.gate",
    "model.layers.0.mlp.experts.0.gate", "model.layers.07", "layers.07.mlp.gate", "7.mlp.gate", "experts.1.up",
    "model.layers.1.mlp.experts.1", "model.layers.1?.mlp", "model.layers.\\d+.mlp.gate", "model.visual.blocks.0",
    "", ".", "model.", "re:", "model.layers.5.self_attn.q_proj.", "model\\.layers\\.5\\.input_layernorm",
    "model.layers.٣.mlp.gate", "re:.*layers\\.\\N{DIGIT ONE}\\..*", "model.layers.1.mlp.experts.1.gate_proj",
    "model.layers.12.mlp.experts.11.up_proj",
    "fc1", "mlp.fc1", "1.mlp.fc1", "experts.2.w2", "2.w2", "w1", "w13", "3.w13", "conv2d.h1", "d.h12", "h12",
    "experts.1.w1", "2.conv2d.h12",
    # `.` over an id's digits (transformers reads the entry as a regex): one entry reaches one- and two-digit ids
    "model.layers.1..mlp.gate", "model.layers...mlp.gate", "model.layers....mlp.gate", "model.layers.2..self_attn",
    "model.layers.1.mlp.experts...up_proj", "model.layers.1.mlp.experts.1..down_proj",
    # ModelOpt exclude globs, one per layer as nvidia's NVFP4 releases write them
    "model.layers.1*", "model.layers.1.self_attn*", "model.layers.12.mlp.shared_expert*", "*.mlp.gate*",
    "model.layers.*.mlp.experts.1*", "*self_attn*", "model.layers.2*.q_proj", "*", "**", "mtp*", "experts.1*",
]  # fmt: skip


@pytest.mark.parametrize("consumer", CONSUMERS, ids=lambda c: c.key)
def test_compiled_equals_every_pair(consumer) -> None:
    names = module_names()
    if consumer.level == "param":
        names = [f"{n}.weight" for n in names] + [f"{n}.weight_packed" for n in names[:50]]
    rng = random.Random(11)
    lists = [ENTRIES, [e for e in ENTRIES if not e.startswith("re:")], rng.sample(ENTRIES, 12)]
    for entries in lists:
        got = CompiledIgnore(consumer, entries).matches(names)
        for name in names:
            want = [e for e in dict.fromkeys(entries) if consumer.match(name, e)]
            assert got.get(name, []) == want, (consumer.key, name)


def test_generated_entries_per_layer_and_expert() -> None:
    """Long literal lists of the shape llm-compressor and published FP8 configs write."""
    names = module_names(layers=31, experts=16)
    entries = [f"model.layers.{i}.{m}" for i in range(31) for m in ("input_layernorm", "mlp.gate")]
    entries += [f"model.layers.{i}.mlp.experts.{e}.down_proj" for i in (0, 3, 30) for e in (0, 9, 15)]
    for consumer in CONSUMERS:
        if consumer.level == "param":
            continue
        got = CompiledIgnore(consumer, entries).matches(names)
        for name in names:
            assert got.get(name, []) == [e for e in entries if consumer.match(name, e)], (consumer.key, name)


def test_templates_round_trip_and_group_ids() -> None:
    names = module_names()
    groups = group_by_template(names)
    assert sum(len(v) for v in groups.values()) == len(names)
    for parts, members in groups.items():
        for name, values in members:
            assert expand_template(parts, values) == name
            assert name_template(name) == (parts, values)
    assert name_template("model.layers.3.mlp.experts.7.down_proj") == (
        ("model.layers.", ".mlp.experts.", ".down_proj"),
        ("3", "7"),
    )
    assert len(groups[("model.layers.", ".mlp.experts.", ".down_proj")]) == 23 * 12


def test_digit_uniform() -> None:
    assert digit_uniform(".*mlp\\.gate$") and digit_uniform("\\d+\\.")
    assert not digit_uniform("layers.1") and not digit_uniform("(a)\\1") and not digit_uniform("(?P=x)")
    assert not digit_uniform("\\N{DIGIT ONE}") and not digit_uniform("٣")
