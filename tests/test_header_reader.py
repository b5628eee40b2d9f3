"""The header-only reader against the safetensors library: same tensors, same verdicts on corrupt files."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from weightcheck.safetensors_header import DTYPE_BITS, read_header


@pytest.fixture
def good_file(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    save_file(
        {
            "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b.bias": np.ones(5, dtype=np.float16),
            "c.scalar": np.array(3, dtype=np.int64),
            "d.empty": np.zeros((0, 4), dtype=np.float32),
            "e.bytes": np.arange(7, dtype=np.uint8),
        },
        str(path),
        metadata={"format": "pt"},
    )
    return path


def split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(header: dict | bytes, data: bytes) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body)) + body + data


def library_verdict(path: Path) -> tuple[bool, str]:
    try:
        with safe_open(str(path), framework="numpy") as fh:
            for key in fh.keys():
                fh.get_slice(key).get_shape()
        return True, ""
    except (SafetensorError, OSError, ValueError) as exc:
        return False, str(exc)


def test_reads_same_tensors_as_library(good_file: Path) -> None:
    report = read_header(good_file)
    assert report.ok, report.problems
    with safe_open(str(good_file), framework="numpy") as fh:
        assert set(fh.keys()) == set(report.tensors)
        for key in fh.keys():
            assert tuple(fh.get_slice(key).get_shape()) == report.tensors[key].shape
        assert fh.metadata() == report.metadata
    assert report.tensors["a.weight"].dtype == "F32"
    assert report.tensors["c.scalar"].shape == ()
    # Header-only: nothing beyond 8 + header length was read.
    assert report.bytes_read == 8 + report.header_size < good_file.stat().st_size


def _mutate_entry(key: str, field: str, value) -> Callable[[dict, bytes], bytes]:
    def apply(header: dict, data: bytes) -> bytes:
        header[key][field] = value
        return join(header, data)

    return apply


CORRUPTIONS: dict[str, tuple[Callable[[dict, bytes], bytes], str]] = {
    "empty-file": (lambda h, d: b"", "HeaderTooSmall"),
    "seven-bytes": (lambda h, d: b"\x01" * 7, "HeaderTooSmall"),
    "absurd-length": (lambda h, d: struct.pack("<Q", 2**64 - 1) + b"{}", "HeaderTooLarge"),
    "length-past-eof": (lambda h, d: struct.pack("<Q", 10_000) + b"{}" + d[:10], "InvalidHeaderLength"),
    "not-utf8": (lambda h, d: join(b"{\xff\xfe}", b""), "InvalidHeader"),
    "not-json": (lambda h, d: join(b"{this is not json", d), "InvalidHeaderDeserialization"),
    "not-object-start": (lambda h, d: join(b'["a"]', d), "InvalidHeaderStart"),
    "truncated-data": (lambda h, d: join(h, d[:-3]), "MetadataIncompleteBuffer"),
    "trailing-bytes": (lambda h, d: join(h, d + b"\0" * 8), "MetadataIncompleteBuffer"),
    "unknown-dtype": (_mutate_entry("a.weight", "dtype", "F12"), "InvalidHeaderDeserialization"),
    "negative-shape": (_mutate_entry("a.weight", "shape", [-3, 4]), "InvalidHeaderDeserialization"),
    "float-shape": (_mutate_entry("a.weight", "shape", [3.0, 4]), "InvalidHeaderDeserialization"),
    "overflow-shape": (_mutate_entry("a.weight", "shape", [2**40, 2**40]), "ValidationOverflow"),
    # the library's running u64 product overflows before the zero that would make the tensor empty
    "overflow-then-zero-shape": (_mutate_entry("d.empty", "shape", [2**40, 2**40, 0]), "ValidationOverflow"),
    "overflow-then-zero-shape-2": (_mutate_entry("d.empty", "shape", [2**33, 2**33, 0]), "ValidationOverflow"),
    "shape-size-mismatch": (_mutate_entry("a.weight", "shape", [4, 4]), "TensorInvalidInfo"),
    "overlap": (_mutate_entry("b.bias", "data_offsets", [0, 10]), "InvalidOffset"),
    "missing-field": (lambda h, d: join({**h, "a.weight": {"dtype": "F32", "shape": [3, 4]}}, d), "Invalid"),
    "metadata-not-string": (
        lambda h, d: join({**h, "__metadata__": {"format": 1}}, d),
        "InvalidHeaderDeserialization",
    ),
}

# Cases where weightcheck is deliberately stricter than the library (which keeps the last duplicate).
STRICTER = {
    "duplicate-key": (
        lambda h, d: join(
            json.dumps(h)[:-1].encode() + b', "a.weight": ' + json.dumps(h["a.weight"]).encode() + b"}", d
        ),
        "InvalidHeaderDeserialization",
    ),
}
CORRUPTIONS_DEEP = {
    "deep-nesting": (lambda h, d: join(b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b""), "Invalid"),
}


CORRUPTIONS.update(CORRUPTIONS_DEEP)


@pytest.mark.parametrize("case", sorted(STRICTER))
def test_stricter_than_library(good_file: Path, tmp_path: Path, case: str) -> None:
    header, data = split(good_file)
    make, expected_kind = STRICTER[case]
    bad = tmp_path / f"{case}.safetensors"
    bad.write_bytes(make(header, data))
    assert library_verdict(bad)[0] is True  # documents the library's leniency
    assert read_header(bad).problems[0].kind == expected_kind


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_same_verdict_as_library_on_corrupt_files(good_file: Path, tmp_path: Path, case: str) -> None:
    header, data = split(good_file)
    make, expected_kind = CORRUPTIONS[case]
    bad = tmp_path / f"{case}.safetensors"
    bad.write_bytes(make(header, data))

    report = read_header(bad)  # must not raise
    lib_ok, _ = library_verdict(bad)
    assert not report.ok, f"reader accepted {case}"
    assert not lib_ok, f"library accepted {case}; our reader rejects it: {report.problems}"
    assert report.problems[0].kind.startswith(expected_kind), report.problems


def test_extra_entry_fields_accepted_like_library(good_file: Path, tmp_path: Path) -> None:
    header, data = split(good_file)
    header["a.weight"]["extra"] = 1
    path = tmp_path / "extra.safetensors"
    path.write_bytes(join(header, data))
    assert library_verdict(path)[0] is True
    assert read_header(path).ok


def test_gap_between_tensors_rejected_like_library(good_file: Path, tmp_path: Path) -> None:
    header, data = split(good_file)
    # Shift the last tensor (by offset) by 4 bytes: a hole in the buffer, file length adjusted.
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [begin + 4, end + 4]
    bad = tmp_path / "gap.safetensors"
    bad.write_bytes(join(header, data[:begin] + b"\0" * 4 + data[begin:]))
    report = read_header(bad)
    assert [p.kind for p in report.problems] == ["InvalidOffset"]
    assert report.problems[0].tensor == last
    assert library_verdict(bad)[0] is False


def test_sub_byte_dtype_sizes(tmp_path: Path) -> None:
    header = {"x": {"dtype": "F4", "shape": [3, 4], "data_offsets": [0, 6]}}
    ok = tmp_path / "f4.safetensors"
    ok.write_bytes(join(header, b"\0" * 6))
    assert read_header(ok).ok
    header["x"]["shape"] = [3]
    header["x"]["data_offsets"] = [0, 1]
    bad = tmp_path / "f4-odd.safetensors"
    bad.write_bytes(join(header, b"\0"))
    assert read_header(bad).problems[0].kind == "MisalignedSlice"


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    report = read_header(fifo)
    assert [p.kind for p in report.problems] == ["NotRegularFile"]


def test_missing_file_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    report = read_header(tmp_path / "nope.safetensors")
    assert report.problems[0].kind == "IoError"


@pytest.mark.parametrize("shape", [[0, 2**64 - 1], [2**62, 0], [0, 4], [7, 0, 2**60]])
def test_empty_tensors_with_large_dimensions_accepted_like_library(good_file: Path, tmp_path: Path, shape) -> None:
    """A zero dimension reached before any overflow keeps the running product at 0: the library opens it."""
    header, data = split(good_file)
    header["d.empty"]["shape"] = shape
    path = tmp_path / "empty.safetensors"
    path.write_bytes(join(header, data))
    assert library_verdict(path)[0] is True
    report = read_header(path)
    assert report.ok, report.problems
    assert report.tensors["d.empty"].shape == tuple(shape)


_FUZZ_DTYPES = ["F32", "F16", "BF16", "U8", "I8", "BOOL", "F64", "I64", "F4", "F6_E2M3", "F8_E4M3", "F8_E8M0",
                "C64", "U16", "F12", "f32", ""]  # fmt: skip
_FUZZ_DIMS = [0, 1, 2, 3, 5, 8, 2**31, 2**32, 2**33, 2**40, 2**62, 2**63, 2**64 - 1]
_NUDGE = st.sampled_from([0] * 12 + [1, -1])  # an offset or a file size off by a byte, now and then


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_fuzzed_headers_get_the_library_verdict(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """Random small headers (valid and invalid dtypes, shapes with huge and zero dimensions, offsets that tile,
    leave gaps, overlap or miss by a byte, files short or long by a byte): weightcheck's reader accepts exactly
    the files safetensors opens. (Duplicate keys, where weightcheck is deliberately stricter, are not made.)"""
    draw = data.draw
    header: dict[str, Any] = {}
    pos = 0
    for i in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(_FUZZ_DTYPES))
        shape = draw(st.lists(st.sampled_from(_FUZZ_DIMS), max_size=4))
        if shape and draw(st.integers(0, 3)) == 0:  # an empty tensor, its zero after or before huge dimensions
            shape.insert(draw(st.integers(0, len(shape))), 0)
        if draw(st.integers(0, 9)) == 0:
            shape = [d if k else -d - 1 for k, d in enumerate(shape)]  # a negative first dimension
        numel = math.prod(shape) if shape else 1
        bits = DTYPE_BITS.get(dtype, 8)
        size = numel * bits // 8 if numel * bits < 2**20 else 4  # a huge tensor: its bytes cannot match anyway
        begin = pos + draw(_NUDGE) if pos else abs(draw(_NUDGE))
        end = begin + size + draw(_NUDGE)
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        pos = max(pos, end, 0)
    if draw(st.booleans()):
        header = dict(reversed(list(header.items())))  # offsets out of header order
    body = b"\0" * max(0, pos + draw(_NUDGE))
    path = tmp_path_factory.mktemp("fuzz") / "x.safetensors"
    path.write_bytes(join(header, body))
    lib_ok, why = library_verdict(path)
    report = read_header(path)
    assert report.ok == lib_ok, (header, len(body), why, report.problems)
