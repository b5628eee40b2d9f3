"""The compiled per-name loops of header-only lint (weightcheck._lintfast, built by setup.py) give exactly what
their Python twins give: the same HeaderReport (tensors in order, TensorInfo values, where the data ends, the
problems and their messages) for well-formed and malformed safetensors headers, and the same template groups
(same order, same members) for any tensor names.

Where the module was not built (no C compiler) these tests skip, unless WEIGHTCHECK_REQUIRE_NATIVE=1 (CI sets
it: the build must have happened there)."""

from __future__ import annotations

import io
import json
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightcheck import native
from weightcheck.names import expand_template, group_by_template
from weightcheck.safetensors_header import DTYPE_BITS, HeaderReport, TensorInfo, parse_header, read_header

try:
    from weightcheck import _lintfast  # type: ignore[attr-defined]
except ImportError:  # not built here
    _lintfast = None
    if os.environ.get("WEIGHTCHECK_REQUIRE_NATIVE") == "1":
        raise

pytestmark = pytest.mark.skipif(_lintfast is None, reason="weightcheck._lintfast not built (no C compiler)")


@contextmanager
def loops(module: Any) -> Iterator[None]:
    """`module` as `weightcheck.native.lintfast()` for the duration: None selects the Python twins (what
    WEIGHTCHECK_NATIVE=0 or a build without a compiler runs), `_lintfast` the compiled loops."""
    saved = list(native._lintfast)
    native._lintfast[:] = [module]
    try:
        yield
    finally:
        native._lintfast[:] = saved


def both(fn: Callable[[], Any]) -> tuple[Any, Any]:
    with loops(None):
        slow = fn()
    with loops(_lintfast):
        fast = fn()
    return slow, fast


# ---- header entries -----------------------------------------------------------------------------------


def _file(header: bytes | str, data: bytes = b"", pad_to: int | None = None) -> tuple[io.BytesIO, int]:
    raw = header.encode() if isinstance(header, str) else header
    blob = len(raw).to_bytes(8, "little") + raw + data
    if pad_to is not None:
        blob += b"\0" * max(0, pad_to - len(blob))
    return io.BytesIO(blob), len(blob)


def _summary(report: HeaderReport) -> tuple[Any, ...]:
    tensors = [(name, type(info), tuple(info)) for name, info in report.tensors.items()]
    for info in report.tensors.values():  # the shape is a tuple of exact ints, as the Python path makes it
        assert type(info.shape) is tuple and all(type(d) is int for d in info.shape)
    problems = [(p.kind, p.detail, p.tensor) for p in report.problems]
    return tensors, report.data_end, report.names_known, problems, report.metadata


def _same_report(header: str | bytes, data_len: int | None = None) -> tuple[Any, ...]:
    def run() -> tuple[Any, ...]:
        fh, size = _file(header)
        size = size if data_len is None else size + data_len
        return _summary(parse_header(fh, size, "x.safetensors"))

    slow, fast = both(run)
    assert fast == slow
    return fast


def test_real_writer_headers_are_read_alike(tmp_path: Path) -> None:
    """Headers written by safetensors' own writer: every dtype it writes here, scalars, empty tensors."""
    np = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {
        f"model.layers.{i}.mlp.experts.{e}.down_proj.weight": rng.standard_normal((3, 5)).astype(dt)
        for i in range(3)
        for e, dt in enumerate(["float32", "float16", "int8", "uint8", "int64", "bool", "float64", "int32"])
    }
    tensors["scalar"] = np.array(3.0, dtype="float32")
    tensors["empty"] = np.zeros((0, 7), dtype="float16")
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    slow, fast = both(lambda: _summary(read_header(path)))
    assert fast == slow
    assert len(fast[0]) == len(tensors) and fast[1] is not None and not fast[3]


def test_malformed_entries_give_the_same_problems() -> None:
    ok = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    cases: list[object] = [
        [1, 2],
        "text",
        None,
        7,
        {"dtype": "F32", "shape": [2]},
        {"shape": [2], "data_offsets": [0, 8]},
        {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]},
        {"dtype": 5, "shape": [2], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": {"a": 1}, "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": "ab", "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]},
        {"dtype": "F32", "shape": [2], "data_offsets": [8]},
        {"dtype": "F32", "shape": [2], "data_offsets": "ab"},
        {"dtype": "F32", "shape": [2], "data_offsets": {"a": 0, "b": 8}},
        {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]},
        {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0, 9]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0, 2**64]},
        {"dtype": "F32", "shape": [2**64], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [2**62], "data_offsets": [0, 8]},
        {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "extra": {"nested": [1]}},
    ]
    for case in cases:
        doc = {"a": ok, "b": case, "c": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
        _same_report(json.dumps(doc), 16)


def test_zero_sized_dimension_beside_oversized_ones() -> None:
    """`[0, 2**70]` holds no bytes: the Python fast path takes it (the product is 0); C defers it to Python,
    which must give the same TensorInfo."""
    for shape in ([0, 2**70], [2**40, 2**40, 0], [0, 2**64 - 1]):
        text = json.dumps({"z": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}})
        _same_report(text, 0)


def test_offsets_that_do_not_tile_in_header_order() -> None:
    doc = {
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "c": {"dtype": "U8", "shape": [0], "data_offsets": [16, 16]},
    }
    tensors, end, *_ = _same_report(json.dumps(doc), 16)
    assert end == 16 and [t[0] for t in tensors] == ["b", "a", "c"]
    gap = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}  # fmt: skip
    assert _same_report(json.dumps(gap), 20)[3]  # InvalidOffset, named alike


def test_duplicate_keys_metadata_and_surrogates_alike() -> None:
    _same_report('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": '
                 '{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', 1)  # fmt: skip
    _same_report('{"__metadata__": {"format": "pt"}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', 1)
    _same_report('{"\\ud800": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', 1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzzed_headers_give_the_same_report(data: st.DataObject) -> None:
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    dtypes = [*DTYPE_BITS, "F33", "bf16"]
    doc: dict[str, Any] = {}
    pos = 0
    for i in range(rng.randint(0, 12)):
        dtype = rng.choice(dtypes)
        shape: list[Any] = [rng.choice([0, 1, 2, 3, 7, 16]) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.1:
            shape.append(rng.choice([-1, True, 2**64, 1.5, "2"]))
        numel = 1
        for d in shape:
            numel *= d if type(d) is int else 1
        nbytes = numel * DTYPE_BITS.get(dtype, 8) // 8
        begin = pos if rng.random() < 0.9 else rng.randint(0, pos + 4)
        end = begin + nbytes + (rng.choice([-1, 1]) if rng.random() < 0.05 else 0)
        entry: Any = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        if rng.random() < 0.05:
            entry = rng.choice([[begin, end], None, "x", {"dtype": dtype}])
        name = rng.choice(["w", "model.layers.1.a", "é", "x" * 40]) + str(i)
        doc[name] = entry
        pos = max(pos, end)
    _same_report(json.dumps(doc), pos)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        _lintfast.tensor_entries([], {}, TensorInfo, lambda n, e: None)
    with pytest.raises(TypeError):
        _lintfast.tensor_entries({}, {}, dict, lambda n, e: None)  # not a tuple subclass
    with pytest.raises(ZeroDivisionError):  # an error in the Python path comes out as raised
        _lintfast.tensor_entries({"a": 1}, {}, TensorInfo, lambda n, e: 1 / 0)


# ---- template groups ----------------------------------------------------------------------------------

# Real names (transformers' on-disk names of several architectures, Megatron-core's, SGLang's fused MoE) and
# the fast path's edge cases: `.layers.` at the start, twice, without an id or tail, non-ASCII digits.
NAMES = [
    "model.layers.3.self_attn.q_proj.weight",
    "transformer.h.11.attn.c_attn.weight",
    "transformer.blocks.7.ffn.experts.mlp.w1",
    "language_model.model.layers.5.mlp.down_proj.weight",
    "model.language_model.layers.2.mlp.experts.gate_up_proj",
    "model.layers.3.mlp.experts.255.down_proj.weight_scale_inv",
    "model.layers.61.eh_proj.weight",
    "model.mtp.layers.0.enorm.weight",
    "model.layers.0.block_sparse_moe.experts.7.w2.weight",
    "decoder.layers.4.mlp.experts.local_experts.3.linear_fc1.weight",
    "model.layers.1.mlp.experts.w13_weight",
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.layers.x.y",
    ".layers.3.a",
    "a.layers.3",
    "a.layers.3.",
    "a.layers..b",
    "a.layers.3.b.layers.4.c",
    "model.layers.٣.a",
    "model.layers.03.a",
    "model.layers.0.a",
    "model.layers.00.a",
    "model.layers.1023.a",
    "model.layers.1024.a",
    "model.layers.10000.a",
    "model.layers.3.mlp.experts.٣.w1.weight",
    "model.layers.99999999999999999999.a",
    "model.layers.3.mlp.experts.99999999999999999999.w1.weight",
    "ü.layers.3.ß",
    "model.layers.3.𝟘",
    "",
]


def _grouped(names: list[str]) -> list[tuple[tuple[str, ...], list[tuple[str, tuple[str, ...]]]]]:
    return list(group_by_template(names).items())


def test_template_groups_alike_on_real_and_edge_names() -> None:
    names = NAMES + [n.replace("3", "4") for n in NAMES] + NAMES
    slow, fast = both(lambda: _grouped(names))
    assert fast == slow
    # each member is its template with its ids put back (a digit run too long to be a layer id is still a
    # slot here, by design: names.group_by_template; structure.analyze splits those name by name)
    for parts, members in fast:
        for name, values in members:
            assert expand_template(parts, values) == name


def test_template_groups_of_a_moe_checkpoint_alike() -> None:
    names = [f"model.layers.{i}.mlp.experts.{e}.{p}_proj.{leaf}" for i in range(4) for e in range(16)
             for p in ("gate", "up", "down") for leaf in ("weight", "weight_scale_inv")]  # fmt: skip
    names += [f"model.layers.{i}.self_attn.o_proj.weight" for i in range(4)] + ["model.norm.weight"]
    random.Random(3).shuffle(names)
    slow, fast = both(lambda: _grouped(names))
    assert fast == slow and len(fast) == 8


PIECES = st.sampled_from(
    [".layers.", "layers.", "model", "mtp", ".", "3", "12", "0", "٣", "²", "experts.", "mlp.", "weight", "h.", "x"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(PIECES, min_size=1, max_size=8).map("".join), min_size=1, max_size=30))
def test_fuzzed_names_group_alike(names: list[str]) -> None:
    slow, fast = both(lambda: _grouped(names))
    assert fast == slow


def test_group_names_generators_and_errors() -> None:
    """Any iterable of names (a dict's keys, a generator); an error raised by a callback comes out."""
    names = ["model.layers.1.a", "b"]
    slow, fast = both(lambda: list(group_by_template(iter(names)).items()))
    assert fast == slow

    def boom(*_: object) -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        _lintfast.group_names(["model.layers.1.a"], boom, lambda n: None)
    with pytest.raises(KeyError):
        _lintfast.group_names(["b"], lambda h, t: ([], None), boom)
    with pytest.raises(TypeError):
        _lintfast.group_names(["model.layers.1.a"], lambda h, t: None, lambda n: None)
    with pytest.raises(TypeError):
        _lintfast.group_names(5, lambda h, t: ([], None), lambda n: None)
