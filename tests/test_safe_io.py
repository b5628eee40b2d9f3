"""The confinement layer (weightcheck/safe_io.py) and the linear-time regex evaluation
(weightcheck/quant/safe_regex.py), unit by unit."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

from weightcheck import safe_io
from weightcheck.quant import safe_regex


def test_confine_refuses_escapes_loops_and_absolute_names(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (tmp_path / "secret.json").write_text("{}")
    (root / "ok.json").write_text("{}")
    (root / "out.json").symlink_to(tmp_path / "secret.json")
    (root / "loop.json").symlink_to("loop.json")
    (root / "dangling.json").symlink_to("nowhere.json")
    (root / "inner.json").symlink_to("ok.json")
    assert safe_io.confine(root, "ok.json") == (root / "ok.json").resolve()
    assert safe_io.confine(root, "inner.json") == (root / "ok.json").resolve()
    kinds = {}
    for name in ["out.json", "loop.json", "dangling.json", "missing.json", "/etc/passwd", "../secret.json", ""]:
        with pytest.raises(safe_io.UnsafePath) as exc:
            safe_io.confine(root, name)
        kinds[name] = exc.value.kind
    assert kinds == {"out.json": "escapes", "loop.json": "loop", "dangling.json": "missing", "missing.json": "missing",
                     "/etc/passwd": "absolute", "../secret.json": "escapes", "": "escapes"}  # fmt: skip


def test_confine_follows_a_hugging_face_cache_snapshot_into_its_own_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--name"
    snap = repo / "snapshots" / "abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "1234").write_text("{}")
    (snap / "config.json").symlink_to("../../blobs/1234")
    (tmp_path / "other").write_text("{}")
    (snap / "evil.json").symlink_to(tmp_path / "other")
    assert safe_io.confine(snap, "config.json") == (repo / "blobs" / "1234").resolve()
    with pytest.raises(safe_io.UnsafePath, match="outside"):
        safe_io.confine(snap, "evil.json")


def test_open_regular_refuses_a_fifo_without_blocking_and_reads_are_bounded(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(safe_io.UnsafePath) as exc:
        safe_io.read_bytes(tmp_path / "pipe", 100)
    assert exc.value.kind == "not-regular"
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(safe_io.UnsafePath) as exc:
        safe_io.read_bytes(tmp_path / "big", 100)
    assert exc.value.kind == "too-large"
    assert safe_io.read_bytes(tmp_path / "big", 101) == b"x" * 101


@pytest.mark.parametrize("text", [b"[" * 100_000, b'{"a": ' + b"9" * 5000 + b"}", b"\xff", b"{"])
def test_parse_json_turns_hostile_text_into_a_refusal(text: bytes) -> None:
    with pytest.raises(safe_io.UnsafePath) as exc:
        safe_io.parse_json(text, "x.json")
    assert exc.value.kind == "invalid"


PAD = b" " * safe_io.SMALL_JSON_BYTES  # makes a text large: parsed by orjson first, not the stdlib


@pytest.mark.parametrize("pad", [b"", PAD], ids=["small: stdlib", "large: orjson"])
@pytest.mark.parametrize(
    "text", [b'{"a": "\\ud800"}', b'{"a": NaN}', b'{"a": 1e999}', b'{"a": 1, "a": 2}', b'{"a": [1, 2.5, "\xc3\xa9"]}']
)
def test_parse_json_gives_one_verdict_whichever_parser_reads_the_text(text: bytes, pad: bytes) -> None:
    """A config.json is parsed by the stdlib (importing orjson costs more than it saves on a small text), a large
    index by orjson: the result (a doc or the refusal) must not depend on which one read it."""
    import json

    def outcome(raw: bytes) -> object:
        try:
            return safe_io.parse_json(raw, "x.json")
        except safe_io.UnsafePath as exc:
            return exc.kind

    got = outcome(text + pad)
    assert repr(got) == repr(outcome(text))
    if b"ud800" in text:
        assert got == "invalid"  # a lone surrogate is refused by both paths
    elif got != "invalid":
        assert repr(got) == repr(json.loads(text))


PATTERNS = [r"model\.layers\.\d+\.mlp\.gate$", r".*mlp\.gate", r"(?i)LM_HEAD", r"[[:alpha:]]+", r"a{,3}b",
            r"\w+\.(\d)", r".*\bgate\b", r"model\.layers\.(?P<l>[0-9]+)\.", r"(?=model)model", r"lm_head\Z",
            r"(a)\1", r".*experts\.(1[0-9]|[2-9])\..*"]  # fmt: skip
NAMES = ["model.layers.0.mlp.gate", "model.layers.12.mlp.gate_proj", "lm_head", "LM_HEAD.weight", "aab", "b",
         "model.layers.3.mlp.experts.15.up_proj", "x\n", "model.layers.\u0663.mlp", "aa", "gate"]  # fmt: skip


@pytest.mark.parametrize("pattern", PATTERNS)
def test_safe_regex_keeps_python_re_semantics(pattern: str) -> None:
    compiled = safe_regex.compile_regex(pattern)
    assert compiled is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        py = re.compile(pattern)
    for name in NAMES:
        assert compiled.match(name) == (py.match(name) is not None), (pattern, name)
        assert compiled.fullmatch(name) == (py.fullmatch(name) is not None), (pattern, name)


def test_safe_regex_runs_catastrophic_patterns_in_linear_time_or_refuses_them() -> None:
    name = "model.layers.0.mlp.experts.7.gate_proj." + "a" * 5000
    assert safe_regex.match("(.+)+!", name) is False  # RE2: instant
    assert safe_regex.match("(x+x+)+y", "x" * 5000) is False
    assert safe_regex.compile_regex("(?=a)(.*)*x") is None
    assert "cannot be evaluated safely" in (safe_regex.refusal("(?=a)(.*)*x") or "")
    assert "does not compile" in (safe_regex.refusal("a{99999999999}") or "")
    assert "does not compile" in (safe_regex.refusal("(") or "")


def test_modelopt_glob_collapses_runs_of_stars() -> None:
    assert safe_regex.glob_to_regex("*" * 5000) == ".*"
    assert safe_regex.glob_to_regex("model.*.mlp**") == r"model\..*\.mlp.*"
    assert safe_regex.fullmatch(safe_regex.glob_to_regex("*a" * 300 + "x"), "a" * 5000) is False
