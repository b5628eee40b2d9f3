"""The fast paths of header-only lint (issue #20) give what the plain per-name code gives.

Each shortcut below decides something once for many names (a template, a run, a class of experts) or with
a C-level scan instead of a Python loop; each test compares it with the straightforward computation on
inputs chosen so that the shortcut's assumption fails for some of them and the exact path must take over.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from weightcheck import safe_io
from weightcheck.checkpoint import load_checkpoint
from weightcheck.names import group_by_template
from weightcheck.rules.patterns import _fold_names
from weightcheck.safetensors_header import read_header
from weightcheck.structure import _expert_suffixes, analyze, normalize_param, split_tail

# Names of several writers: companions (FP8 block, CT packed, GPTQ), bitsandbytes blobs under `.weight.`,
# MXFP4 stacked experts, GPT-2 `h.N`, Megatron-style experts, ids too long to be ids, a trailing dot.
NAMES = [
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.norm.weight",
    *(f"model.layers.{i}.self_attn.q_proj.{p}" for i in range(3) for p in ("weight", "weight_scale_inv")),
    *(f"model.layers.{i}.mlp.experts.{e}.down_proj.{p}" for i in range(2) for e in range(4)
      for p in ("weight_packed", "weight_scale", "weight_shape")),
    "model.layers.1.mlp.experts.3.up_proj.weight",
    "model.layers.0.mlp.experts.gate_up_proj_blocks",
    "model.layers.0.mlp.experts.gate_up_proj_scales",
    "model.layers.0.mlp.experts.down_proj",
    "model.layers.2.mlp.down_proj.weight.absmax",
    "model.layers.2.mlp.down_proj.weight.quant_map",
    "model.layers.1.self_attn.o_proj.qweight",
    "model.layers.1.self_attn.o_proj.scales",
    "transformer.h.4.attn.c_attn.weight",
    "transformer.h.4.attn.c_attn.weight_scale",
    "model.layers.3.weight",
    "model.layers.3.weight_scale",
    "model.layers.12345678901234.mlp.gate.weight",
    "model.layers.1.mlp.experts.12345678901234.w1.weight_scale",
    "model.layers.2.mlp.experts.7.w2.",
    "decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight",
]  # fmt: skip


def test_companion_folding_per_template_equals_normalize_param() -> None:
    folded = _fold_names(group_by_template(NAMES))
    assert folded == {n: normalize_param(n) for n in NAMES}
    experts = "model.layers.0.mlp.experts.1.down_proj"
    assert folded[f"{experts}.weight_scale"] == f"{experts}.weight"
    assert folded["model.layers.2.mlp.down_proj.weight.absmax"] == "model.layers.2.mlp.down_proj.weight"


def test_key_tokens_equal_the_regex_count() -> None:
    texts: list[bytes | str] = [
        b'{"a":1,"b":{"c":2}}',
        b'{\n  "a": 1,\n  "b": "x"\n}',  # json.dumps(indent=2): whitespace after quotes, none before colons
        b'{"a" :1}',
        b'{"a"\t\n:1,"b":"c:d"}',
        b'{"url":"http://x","k":1}',  # a colon inside a string value: not every colon follows a quote
        '{"a"\x1c:1}',
        '{"a"\u3000:1,"b":2}',
        '{"a:b":1}',
    ]
    for text in texts:
        pattern = safe_io._KEY_TOKEN_BYTES if isinstance(text, bytes) else safe_io._KEY_TOKEN
        assert safe_io.key_tokens(text) == sum(1 for _ in pattern.finditer(text)), text


def _rewrite_header(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = edit(json.loads(raw[8 : 8 + n]))
    text = json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def test_offsets_out_of_header_order_are_still_accepted(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(3, np.float32), "b": np.ones(5, np.float16), "c": np.zeros(0, np.float32)}, str(path))
    _rewrite_header(path, lambda h: dict(reversed(list(h.items()))))  # the layout no longer in header order
    report = read_header(path)
    assert report.ok and report.names_known, report.problems
    with safe_open(str(path), framework="numpy") as fh:  # the library reads it too
        assert sorted(fh.keys()) == sorted(report.tensors)
    assert report.data_end == 3 * 4 + 5 * 2


def test_a_gap_is_still_named_whatever_the_header_order(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(3, np.float32), "b": np.ones(5, np.float16)}, str(path))

    def gap(h: dict) -> dict:
        first = min((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        begin, end = h[first]["data_offsets"]
        h[first]["data_offsets"] = [begin + 2, end + 2]  # overlaps the next tensor and leaves a gap before it
        return h

    _rewrite_header(path, gap)
    report = read_header(path)
    assert [p.kind for p in report.problems] == ["InvalidOffset"]


def test_all_tensors_first_shard_wins_and_keeps_first_seen_order(tmp_path: Path) -> None:
    save_file({"x.weight": np.ones(2, np.float32), "y.weight": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"y.weight": np.ones(4, np.float32), "z.weight": np.ones(2, np.float32)}, str(tmp_path / "b.safetensors"))
    ckpt = load_checkpoint(tmp_path)
    listed = ckpt.all_tensors()
    assert list(listed) == ["x.weight", "y.weight", "z.weight"]
    assert listed["y.weight"].shape == (2,)  # a.safetensors (first sorted) wins
    assert ckpt.sorted_names() == sorted(ckpt.tensor_names())


def test_expert_classes_equal_per_expert_sets() -> None:
    entries = [("w1.weight", {0, 1, 2, 3}), ("w2.weight", {0, 1, 3}), ("w3.weight", {1, 2}), ("w2.weight", {2})]
    naive: dict[int, set[str]] = defaultdict(set)
    for suffix, ids in entries:
        for e in ids:
            naive[e].add(suffix)
    got = _expert_suffixes(entries)
    assert got == {e: frozenset(naive[e]) for e in sorted(naive)}
    assert list(got) == [0, 1, 2, 3]


def test_layer_structure_equals_a_name_by_name_reading() -> None:
    names = [n for n in NAMES if n.startswith("model.layers.")]
    s = analyze(names, {"num_hidden_layers": 4})
    assert s.prefix == "model.layers"
    for layer, layer_names in s.layer_tensors.items():
        sig: set[str] = set()
        experts: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        for name in layer_names:
            head, expert, suffix = split_tail(name[len("model.layers.") :].partition(".")[2])
            if head is None:
                sig.add(suffix)
            else:
                experts[head][expert].add(suffix)
                sig.add(f"{head}.*.{suffix}")
        assert s.signatures[layer] == frozenset(sig), layer
        want = {h: {e: frozenset(v[e]) for e in sorted(v)} for h, v in experts.items()}
        assert s.experts.get(layer, {}) == want, layer
