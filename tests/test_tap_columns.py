"""Schema 1.2's `tensors` line (issue #22): a big bucket of small tensors is kept and written as columns
(`weightcheck.tap.columns`) instead of one `tensor` line per tensor. The same sync written in both forms must
read back as the same entries and give `verify` the same verdicts, word for word; records of schema 1.0/1.1
(only `tensor` lines) must read as before; a damaged `tensors` line is a record error, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from torch import nn

from weightcheck import tap
from weightcheck.cli import cli
from weightcheck.tap.columns import EntryTable, TensorColumns, tensor_body
from weightcheck.tap.records import RECORD_SCHEMA_VERSION, RecordError, read_record

COUNT = 700  # above the drain size that is described at once and kept as columns (256)


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    param.data.copy_(loaded_weight)


class Norms(nn.Module):
    """Many small BF16 parameters, written by the default loader (SGLang's `load_weights` for unstacked names);
    names it does not hold are dropped, as SGLang drops them."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ParameterList(
            nn.Parameter(torch.zeros(8, dtype=torch.bfloat16), requires_grad=False) for _ in range(COUNT)
        )

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in params:
                getattr(params[name], "weight_loader", default_loader)(params[name], tensor)


def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    tensors = {f"norms.{i}": torch.randn(8, generator=generator).to(torch.bfloat16) for i in range(COUNT)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))  # the real writer: verify hashes it in the records' algorithm
    return path, tensors


def defective(tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """A sync with one of each defect the tensor lines carry: bytes changed, a NaN, all zeros, a name the engine
    drops, and a parameter never sent."""
    stream = [(name, tensor.clone()) for name, tensor in tensors.items() if name != "norms.9"]
    stream[1][1][0] += 1
    stream[2][1][3] = float("nan")
    stream[3][1].zero_()
    stream.append(("model.not.in.engine", torch.ones(8, dtype=torch.bfloat16)))
    return stream


@pytest.fixture
def tapped() -> Iterator[None]:
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    tap.install(Norms)
    yield
    tap.uninstall(Norms)
    tap.configure(None)
    tap.set_engine_hooks(tap.EngineHooks())


def record_syncs(root: Path, tensors: dict[str, torch.Tensor], *, columnar: bool) -> None:
    # The synchronous-digest mode never buckets: one `tensor` line per tensor, the reference form.
    tap.configure(root, synchronous_digest=not columnar)
    engine = Norms()
    engine.load_weights(iter(tensors.items()))  # sync 0: clean
    engine.load_weights(iter(defective(tensors)))  # sync 1: every defect above
    engine.load_weights(list(tensors.items()))  # sync 2: clean again, the loaders put back in bulk
    tap.configure(None)


def kinds(root: Path) -> list[str]:
    lines = [json.loads(line) for path in sorted(root.glob("sync-*/*.jsonl")) for line in path.read_text().splitlines()]
    return [line["t"] for line in lines]


def verify_json(root: Path, ckpt: Path) -> tuple[int, dict[str, Any]]:
    done = CliRunner().invoke(cli, ["verify", str(root), "--against", str(ckpt), "--format", "json"])
    # Paths name the records folder, and a note says how long verify took; everything else must be the same.
    text = re.sub(r"verified in [0-9.]+s", "verified in Ns", done.output.replace(str(root), "RECORDS"))
    return done.exit_code, json.loads(text)


def test_a_sync_written_as_columns_verifies_as_the_same_sync_written_line_by_line(tapped: None, tmp_path: Path) -> None:
    ckpt, tensors = checkpoint(tmp_path)
    record_syncs(tmp_path / "columns", tensors, columnar=True)
    record_syncs(tmp_path / "lines", tensors, columnar=False)
    assert "tensors" in kinds(tmp_path / "columns") and "tensor" not in kinds(tmp_path / "columns")
    assert "tensors" not in kinds(tmp_path / "lines") and "tensor" in kinds(tmp_path / "lines")

    for seq in range(3):
        (columns,) = (tmp_path / "columns" / f"sync-{seq:05d}").glob("*.jsonl")
        (lines,) = (tmp_path / "lines" / f"sync-{seq:05d}").glob("*.jsonl")
        assert read_record(columns).header["schema_version"] == RECORD_SCHEMA_VERSION == "1.2"
        as_columns, as_lines = read_record(columns), read_record(lines)
        assert [dataclasses.asdict(t) for t in as_columns.tensors] == [dataclasses.asdict(t) for t in as_lines.tensors]
        assert as_columns.params == as_lines.params
        assert len(as_columns.tensors) == COUNT  # (sync 1 leaves one name out and sends one the engine drops)

    code_columns, out_columns = verify_json(tmp_path / "columns", ckpt)
    code_lines, out_lines = verify_json(tmp_path / "lines", ckpt)
    assert (code_columns, out_columns) == (code_lines, out_lines)
    assert code_columns == 1
    codes = {finding["code"] for finding in out_columns["findings"]}
    # Bytes changed, NaN, all zeros, dropped by the engine, never sent: each judged from the columns.
    assert len(codes) >= 4, codes
    assert all("sync 1" in json.dumps(f) or "sync-00001" in json.dumps(f) for f in out_columns["findings"]), codes


def test_a_schema_1_1_record_reads_and_verifies_as_before(tapped: None, tmp_path: Path) -> None:
    """Records written before columns (schema 1.1: `tensor` lines only) give the same verdicts."""
    ckpt, tensors = checkpoint(tmp_path)
    record_syncs(tmp_path / "lines", tensors, columnar=False)
    before = verify_json(tmp_path / "lines", ckpt)
    for path in (tmp_path / "lines").glob("sync-*/*.jsonl"):
        text = path.read_text()
        assert text.count('"schema_version":"1.2"') == 1
        path.write_text(text.replace('"schema_version":"1.2"', '"schema_version":"1.1"'))
    assert verify_json(tmp_path / "lines", ckpt) == before


def _columns_record(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    record_syncs(tmp_path / "columns", tensors, columnar=True)
    (path,) = (tmp_path / "columns" / "sync-00000").glob("*.jsonl")
    return path


def _edit_tensors_line(path: Path, edit: Any) -> None:
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith('{"t":"tensors"'))
    doc = json.loads(lines[index])
    edit(doc)  # in place
    lines[index] = json.dumps(doc)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda doc: doc["name"].pop(), "must be a list of"),  # one column shorter than the others
        (lambda doc: doc.update(zeros="no"), "must be a list of"),  # a per-tensor field given once
        (lambda doc: doc["xxh3_128"].__setitem__(5, "f" * 31), "hex digits"),
        (lambda doc: doc["seq"].__setitem__(4, doc["seq"][3]), "after seq"),  # a seq repeated
        (lambda doc: doc["shape"].__setitem__(0, "8"), "shape"),
        (lambda doc: doc.update(seq=[]), "non-empty"),
        (lambda doc: doc.pop("name"), "without a name"),
    ],
    ids=["short-column", "scalar-field", "bad-digest", "seq-repeated", "bad-shape", "no-seq", "no-names"],
)
def test_a_damaged_tensors_line_is_a_record_error(tapped: None, tmp_path: Path, edit: Any, message: str) -> None:
    _, tensors = checkpoint(tmp_path)
    path = _columns_record(tmp_path, tensors)
    read_record(path)  # intact
    _edit_tensors_line(path, edit)
    with pytest.raises(RecordError, match=message):
        read_record(path)


def test_a_tensors_line_in_a_schema_1_1_record_is_refused(tapped: None, tmp_path: Path) -> None:
    _, tensors = checkpoint(tmp_path)
    path = _columns_record(tmp_path, tensors)
    path.write_text(path.read_text().replace('"schema_version":"1.2"', '"schema_version":"1.1"'))
    with pytest.raises(RecordError, match="unknown line type 'tensors'"):
        read_record(path)


def test_a_tensors_line_duplicated_is_caught_by_order_and_count(tapped: None, tmp_path: Path) -> None:
    _, tensors = checkpoint(tmp_path)
    path = _columns_record(tmp_path, tensors)
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith('{"t":"tensors"'))
    path.write_text("\n".join([*lines[: index + 1], lines[index], *lines[index + 1 :]]) + "\n")
    with pytest.raises(RecordError, match="after seq"):
        read_record(path)


# ---- the writer's choice between columns and lines (weightcheck.tap.columns.tensor_body) --------------------


def _block(seqs: list[int], call: int = 0) -> TensorColumns:
    return TensorColumns(
        call=call,
        seqs=seqs,
        names=[f"w.{s}" for s in seqs],
        dtype="BF16",
        shapes=[(2, s + 1) for s in seqs],
        algorithm="xxh3_128",
        hexes=[f"{s:032x}" for s in seqs],
        zeros=[s % 2 == 0 for s in seqs],
        nonfinite=[0 if s % 3 else None for s in seqs],
        wrote=[(f"w.{s}",) for s in seqs],
    )


def _row(seq: int) -> dict[str, Any]:
    return {"t": "tensor", "seq": seq, "call": 1, "name": f"r.{seq}", "wrote": (), "dtype": "F32", "shape": (1,)}


def _body_tensors(tmp_path: Path, table: EntryTable) -> tuple[list[str], list[dict[str, Any]]]:
    """The body `tensor_body` writes, read back through `read_record` (a minimal valid record around it)."""
    body, count = tensor_body(table)
    header = {
        "t": "header",
        "kind": "weightcheck-sync-record",
        "schema_version": RECORD_SCHEMA_VERSION,
        "sync": {"seq": 0},
        "digest": "xxh3_128",
    }
    end = {"t": "end", "calls": 0, "tensors": count, "params": 0}
    folder = tmp_path / "sync-00000"
    folder.mkdir(exist_ok=True)
    path = folder / "r.jsonl"
    path.write_bytes(json.dumps(header).encode() + b"\n" + body + json.dumps(end).encode() + b"\n")
    line_kinds = [json.loads(line)["t"] for line in body.splitlines()]
    return line_kinds, [dataclasses.asdict(t) for t in read_record(path).tensors]


def _expected(table: EntryTable) -> list[dict[str, Any]]:
    rows = [*table.values(), *(row for block in table.blocks for row in block.rows())]
    return sorted(rows, key=lambda row: row["seq"])


def test_blocks_between_lines_are_written_in_seq_order(tmp_path: Path) -> None:
    table = EntryTable()
    table.update({s: _row(s) for s in (0, 1, 7, 12)})
    table.add_columns(_block([8, 9, 10, 11]))
    table.add_columns(_block([2, 3, 5, 6]))  # seqs need not be contiguous (another runner's call took 4)
    line_kinds, read = _body_tensors(tmp_path, table)
    assert line_kinds == ["tensor", "tensor", "tensors", "tensor", "tensors", "tensor"]
    assert [t["seq"] for t in read] == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12]
    assert [t["name"] for t in read] == [row["name"] for row in _expected(table)]
    assert read[3]["shape"] == (2, 4) and read[3]["nonfinite"] is None and read[3]["wrote"] == ["w.3"]
    assert table.get(5)["wrote"] == ("w.5",) and table.get(10)["wrote"] == ("w.10",)
    # A line whose seq falls inside a block's range: everything as lines, still in seq order.
    table[4] = _row(4)
    line_kinds, read = _body_tensors(tmp_path, table)
    assert set(line_kinds) == {"tensor"} and [t["seq"] for t in read] == list(range(13))


def test_interleaved_blocks_and_fields_set_late_are_written_as_lines(tmp_path: Path) -> None:
    table = EntryTable()
    table.add_columns(_block([0, 2, 4]))
    table.add_columns(_block([1, 3, 5], call=1))  # two loader threads: the ranges interleave
    line_kinds, read = _body_tensors(tmp_path, table)
    assert set(line_kinds) == {"tensor"} and [t["seq"] for t in read] == list(range(6))

    table = EntryTable()
    table.add_columns(_block([0, 1, 2]))
    table.add_columns(_block([3, 4, 5]))
    entry = table.get(4)
    entry["wrote"] = (*entry.get("wrote"), "w.extra")  # a late write: kept in the columns
    table.get(1)["offrank"] = True  # any other field: that block as lines
    line_kinds, read = _body_tensors(tmp_path, table)
    assert line_kinds == ["tensor", "tensor", "tensor", "tensors"]
    assert read[1]["offrank"] is True and read[4]["wrote"] == ["w.4", "w.extra"]
    assert table.get(99) is None and table.get(99, "absent") == "absent"


# ---- the columns' digests: one `cat` for 1-D batches, the flatten otherwise (weightcheck.tap.digesting) -------


@pytest.mark.parametrize("layout", ["1-d", "n-d", "1-d-strided-views", "mixed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32], ids=str)
def test_a_batch_described_as_columns_is_each_tensor_described_alone(layout: str, dtype: torch.dtype) -> None:
    from weightcheck.tap.digesting import describe_bucket, describe_columns, describe_tensor

    pytest.importorskip("xxhash")
    generator = torch.Generator().manual_seed(5)
    base = [(torch.randn(n, generator=generator) * 50).to(dtype) for n in (1, 3, 64, 65, 300)]
    cases = {
        "1-d": base,
        "n-d": [t.reshape(1, -1) if i % 2 else t.reshape(-1, 1) for i, t in enumerate(base)],
        # Views into one storage with a stride: the digest is of the elements in order, not of the storage.
        "1-d-strided-views": [(torch.randn(2 * n, generator=generator) * 50).to(dtype)[::2] for n in (2, 7, 64)],
        "mixed": [*base[:2], torch.randn(4, 4, generator=generator).to(dtype).t(), base[3]],
    }[layout]
    columns = describe_columns(cases, "xxh3_128")
    assert columns is not None
    name, hexes, zeros, nonfinite = columns
    alone = [describe_tensor(t, "xxh3_128") for t in cases]
    assert [(name, *values) for values in zip(hexes, zeros, nonfinite, strict=True)] == [
        (d["dtype"], d["xxh3_128"], d["zeros"], d["nonfinite"]) for d in alone
    ]
    # The tap's bucket: the same columns, and each tensor's shape as a plain tuple (from the element counts
    # when the batch is all 1-D).
    bucket = describe_bucket(cases, "xxh3_128")
    assert bucket is not None and bucket[:4] == columns
    assert bucket[4] == [tuple(t.shape) for t in cases] and all(type(shape) is tuple for shape in bucket[4])
