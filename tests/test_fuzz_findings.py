"""Regression tests for what the fuzzing suite's issue-#19 families found (tests/fuzzing.py: json-keys,
unencodable-names, counts, record-counts, record-lines): each input below was accepted silently, crashed,
or cost memory in proportion to a count. Each must now be a finding, within the memory budget of
docs/security.md (run_case asserts the peak RSS of every case, see tests/fuzz_child.py).

Artefacts come from the real writers (transformers save_pretrained, weightcheck.tap, write_manifest) via
the fuzzing corpus; only the hostile edit is made by hand.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fuzzing import RSS_BUDGET, Case, _copy_sync, _splice_key, build_corpus, new_case, read_shard, run_case, write_shard

from weightcheck import safe_io
from weightcheck.safetensors_header import MAX_NAME_CHARS, read_header
from weightcheck.tap import records as records_mod
from weightcheck.tap.records import RecordError, read_record
from weightcheck.verifying import verify


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("fuzz-corpus") / "corpus")


def findings(out: str) -> list[tuple[str, str]]:
    return [(f["code"], f["message"]) for f in json.loads(out)["findings"]]


def run(corpus: Path, tmp_path: Path, parts: tuple[str, ...], setup: Callable[[Case], None], argv: list[str]) -> str:
    """The CLI on the edited copy, under the fuzz harness's instruments: no violation (traceback, memory over
    the budget, reads outside, writes), exit 1, and the JSON report returned."""
    case = new_case(corpus, tmp_path / "case", "regression", parts)
    setup(case)
    case.argv = [*argv, "--format", "json"]
    outcome = run_case(case)
    assert outcome.violations == [], (outcome.violations, outcome.stderr[-2000:])
    assert outcome.rc == 1, (outcome.rc, outcome.stdout[-2000:], outcome.stderr[-2000:])
    assert 0 < outcome.peak_rss <= RSS_BUDGET
    return outcome.stdout


def first_shard(case: Case, tree: str = "ckpt") -> Path:
    return sorted((case.root / tree).glob("*.safetensors"))[0]


# ---- duplicate keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["metadata", "metadata-field", "entry-field"])
def test_header_with_a_duplicated_key_is_wc102(corpus: Path, tmp_path: Path, where: str) -> None:
    def setup(case: Case) -> None:
        shard = first_shard(case)
        header, data = read_shard(shard)
        header.setdefault("__metadata__", {"format": "pt"})
        text = json.dumps(header)
        if where == "metadata":  # the reported case: __metadata__ twice
            text = _splice_key(text, "__metadata__", json.dumps({"format": "pt"}))
        elif where == "metadata-field":
            meta = json.dumps(header["__metadata__"])
            text = text.replace(meta, _splice_key(meta, "format", '"pt"'), 1)
        else:
            name = next(k for k in header if k != "__metadata__")
            entry = json.dumps(header[name])
            text = text.replace(entry, _splice_key(entry, "dtype", json.dumps(header[name]["dtype"])), 1)
        write_shard(shard, text, data)

    out = run(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])
    assert any(code == "WC102" and "duplicate key" in msg for code, msg in findings(out)), findings(out)


def test_header_key_count_check_keeps_the_fast_path_on_real_shards(corpus: Path) -> None:
    # Good fixture for the duplicate check: every real shard parses clean (no false duplicate).
    for shard in sorted((corpus / "ckpt").glob("*.safetensors")) + sorted((corpus / "moe").glob("*.safetensors")):
        assert read_header(shard).problems == [], shard


@pytest.mark.parametrize("where", ["top", "weight_map"])
def test_index_with_a_duplicated_key_is_wc207(corpus: Path, tmp_path: Path, where: str) -> None:
    def setup(case: Case) -> None:
        index = case.root / "ckpt" / "model.safetensors.index.json"
        doc = json.loads(index.read_text())
        if where == "top":
            text = _splice_key(json.dumps(doc), "weight_map", json.dumps({}))
        else:
            name, shard = next(iter(doc["weight_map"].items()))
            wm = json.dumps(doc["weight_map"])
            text = json.dumps(doc).replace(wm, _splice_key(wm, name, json.dumps(shard)))
        index.write_text(text)

    out = run(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])
    assert any(code == "WC207" and "appears twice" in msg for code, msg in findings(out)), findings(out)


# ---- names that cannot be encoded ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "code"), [("header", "WC102"), ("index", "WC207"), ("record", "WC720"), ("manifest", "WC721")]
)
def test_lone_surrogate_name_is_a_finding_not_an_encode_error(
    corpus: Path, tmp_path: Path, where: str, code: str
) -> None:
    def setup(case: Case) -> None:
        if where == "header":
            shard = first_shard(case)
            header, data = read_shard(shard)
            victim = next(k for k in header if k != "__metadata__")
            write_shard(shard, json.dumps(header).replace(json.dumps(victim), '"\\ud800"', 1), data)
            return
        if where == "index":
            path = case.root / "ckpt" / "model.safetensors.index.json"
            victim = next(iter(json.loads(path.read_text())["weight_map"]))
        elif where == "record":
            path = next((case.root / "records").rglob("*.jsonl"))
            victim = "model.embed_tokens.weight"
        else:
            path = case.root / "manifest" / "part-0.json"
            victim = next(iter(json.loads(path.read_text())["tensors"]))
        path.write_text(path.read_text().replace(json.dumps(victim), '"x\\udc80y"', 1))

    argv = {"header": ["lint", "ckpt"], "index": ["lint", "ckpt"], "record": ["verify", "records"],
            "manifest": ["verify", "records", "--against", "manifest"]}[where]  # fmt: skip
    out = run(corpus, tmp_path, ("ckpt", "records", "manifest"), setup, argv)
    assert any(c == code and "surrogate" in msg for c, msg in findings(out)), findings(out)


# ---- counts and lengths --------------------------------------------------------------------------------------


def test_index_over_the_entry_cap_is_refused_before_parsing(corpus: Path, tmp_path: Path) -> None:
    count = safe_io.MAX_INDEX_ENTRIES + 100

    def setup(case: Case) -> None:
        index = case.root / "ckpt" / "model.safetensors.index.json"
        doc = json.loads(index.read_text())
        shard = next(iter(doc["weight_map"].values()))
        doc["weight_map"].update({f"model.layers.{i}.mlp.experts.{i}.up_proj.weight": shard for i in range(count)})
        index.write_text(json.dumps(doc))

    out = run(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])
    assert any(code == "WC207" and "more than" in msg for code, msg in findings(out)), findings(out)


def test_index_key_cap_counts_spaced_keys_too() -> None:
    # `"k" : v` must count like `"k": v`, or spacing would slip a huge index past the cap.
    with pytest.raises(safe_io.UnsafePath, match="more than"):
        safe_io.parse_json(b'{"a" :1, "b"\n:2, "c":3}', "x.json", max_keys=2)
    assert safe_io.parse_json(b'{"a" :1, "b"\n:2}', "x.json", max_keys=2) == {"a": 1, "b": 2}


def test_very_long_tensor_name_is_wc102(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        shard = first_shard(case)
        header, data = read_shard(shard)
        victim = next(k for k in header if k != "__metadata__")
        long_name = "model.layers.0." + "a" * 1_000_000 + ".weight"
        header[long_name] = header.pop(victim)
        write_shard(shard, json.dumps(header), data)
        index = case.root / "ckpt" / "model.safetensors.index.json"
        doc = json.loads(index.read_text())
        doc["weight_map"][long_name] = doc["weight_map"].pop(victim)
        index.write_text(json.dumps(doc))

    out = run(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])
    assert any(code == "WC102" and "NameTooLong" in msg for code, msg in findings(out)), findings(out)


def test_longest_allowed_tensor_name_is_read(corpus: Path, tmp_path: Path) -> None:
    shard = tmp_path / "x.safetensors"
    header, data = read_shard(first_shard(Case(root=corpus, family="")))
    victim = next(k for k in header if k != "__metadata__")
    header["m." + "a" * (MAX_NAME_CHARS - 2)] = header.pop(victim)
    write_shard(shard, json.dumps(header), data)
    assert read_header(shard).problems == []


# ---- records: many sync folders or rank files ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync-dirs", "rank-files"])
def test_records_over_the_file_cap_are_reported_not_all_loaded(
    corpus: Path, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In process with a small cap (the cap's value is not what is tested; that the rest is reported is).
    monkeypatch.setattr(records_mod, "MAX_RECORD_FILES", 3)
    records = tmp_path / "records"
    shutil.copytree(corpus / "records", records)
    sync0 = records / "sync-00000"
    if kind == "sync-dirs":
        for i in range(1, 6):
            _copy_sync(sync0, records / f"sync-{i:05d}", seq=i)
    else:
        record = next(sync0.glob("*.jsonl"))
        for i in range(1, 6):
            os.link(record, sync0 / f"tp0-pp0-ep0.host{i}.{i}.jsonl")
    result = verify(records)
    (left,) = [f for f in result.findings if f.code == "WC720"]
    assert "3 record files" in left.message and "not read" in left.message
    if kind == "sync-dirs":
        assert "(sync 0 to 2)" in left.message  # the newest syncs were read, the oldest reported


def test_records_under_the_file_cap_are_all_read(corpus: Path, tmp_path: Path) -> None:
    records = tmp_path / "records"
    shutil.copytree(corpus / "records", records)
    for i in range(1, 4):
        _copy_sync(records / "sync-00000", records / f"sync-{i:05d}", seq=i)
    assert verify(records).findings == []


# ---- records: duplicated, swapped or moved lines ---------------------------------------------------------------


def _edit_lines(path: Path, edit: Callable[[list[str]], None]) -> None:
    lines = path.read_text().splitlines()
    edit(lines)
    path.write_text("\n".join(lines) + "\n")


def _indexes(lines: list[str], kind: str) -> list[int]:
    return [i for i, line in enumerate(lines) if json.loads(line)["t"] == kind]


def _dup(kind: str) -> Callable[[list[str]], None]:
    def edit(lines: list[str]) -> None:
        i = _indexes(lines, kind)[1 if kind != "call" else 0]
        lines.insert(i, lines[i])

    return edit


def _swap(kind: str) -> Callable[[list[str]], None]:
    def edit(lines: list[str]) -> None:
        i, j = _indexes(lines, kind)[2:4]
        lines[i], lines[j] = lines[j], lines[i]

    return edit


def _move_param_among_tensors(lines: list[str]) -> None:
    line = lines.pop(_indexes(lines, "param")[0])
    lines.insert(_indexes(lines, "tensor")[3], line)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_dup("tensor"), "seq"),
        (_dup("param"), "appears twice"),
        (_dup("call"), "call"),
        (_swap("tensor"), "seq"),
        (_swap("param"), "name order"),
        (_move_param_among_tensors, "a line moved"),
    ],
    ids=["dup-tensor", "dup-param", "dup-call", "swap-tensor", "swap-param", "move-param"],
)
def test_record_with_a_duplicated_swapped_or_moved_line_is_wc720(
    corpus: Path, tmp_path: Path, edit: Callable[[list[str]], None], says: str
) -> None:
    def setup(case: Case) -> None:
        _edit_lines(next((case.root / "records").rglob("*.jsonl")), edit)

    out = run(corpus, tmp_path, ("records", "ckpt"), setup, ["verify", "records", "--against", "ckpt"])
    assert any(code == "WC720" and says in msg for code, msg in findings(out)), findings(out)


def test_tap_writes_schema_1_1_order(corpus: Path) -> None:
    record = read_record(next((corpus / "records").rglob("*.jsonl")))
    assert record.header["schema_version"] == "1.2"  # 1.1's order; 1.2 only adds the columnar `tensors` line
    assert list(record.params) == sorted(record.params)
    assert [t.seq for t in record.tensors] == sorted(t.seq for t in record.tensors)


def test_schema_1_0_record_keeps_its_param_order_unchecked(corpus: Path, tmp_path: Path) -> None:
    # Records written before 1.1 put params in engine order: still read, a duplicate still refused.
    path = tmp_path / "sync-00000" / "r.jsonl"
    path.parent.mkdir()
    lines = next((corpus / "records").rglob("*.jsonl")).read_text().splitlines()
    lines[0] = lines[0].replace('"schema_version":"1.2"', '"schema_version":"1.0"').replace(
        '"tensors_file":"', '"tensors_file":null,"x":"'
    )
    _swap("param")(lines)
    path.write_text("\n".join(lines) + "\n")
    assert len(read_record(path).params) == len(_indexes(lines, "param"))
    _dup("param")(lines)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match="appears twice"):
        read_record(path)


@pytest.mark.parametrize("fmt", ["json", "text", "sarif", "github"])
def test_file_name_that_is_not_utf8_is_reported_not_a_crash(corpus: Path, tmp_path: Path, fmt: str) -> None:
    # os.listdir returns such a name with lone surrogates; every report writer must still write it.
    def setup(case: Case) -> None:
        shard = first_shard(case)
        os.rename(os.fsencode(shard), os.fsencode(shard.parent) + b"/\xff" + os.fsencode(shard.name))

    case = new_case(corpus, tmp_path / "case", "regression", ("ckpt",))
    setup(case)
    case.argv = ["lint", "ckpt", "--format", fmt]
    outcome = run_case(case)
    # The harness judges stdout as a JSON report; text, github and SARIF are other shapes.
    violations = [v for v in outcome.violations if fmt == "json" or not v.startswith("stdout is")]
    assert violations == [], (violations, outcome.stderr[-2000:])
    assert outcome.rc == 1
    if fmt in ("json", "sarif"):
        assert "\\udcff" in outcome.stdout and json.loads(outcome.stdout)
    if fmt == "json":
        assert {"WC105", "WC201"} <= {code for code, _ in findings(outcome.stdout)}


def test_shards_past_the_checkpoint_tensor_cap_are_reported_not_parsed(
    corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In process with a small cap (real checkpoints sit far below 2^19; that the rest is reported is tested).
    import weightcheck
    from weightcheck import checkpoint

    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_TENSORS", 10)
    ckpt = checkpoint.load_checkpoint(corpus / "ckpt")
    skipped = [n for n, r in ckpt.shards.items() if any(p.kind == "TooManyTensors" for p in r.problems)]
    read = [n for n, r in ckpt.shards.items() if r.names_known]
    assert skipped and read and sum(len(ckpt.shards[n].tensors) for n in read) <= 10 + max(
        len(ckpt.shards[n].tensors) for n in read
    )
    result = weightcheck.lint(corpus / "ckpt")
    assert any(f.code == "WC102" and "TooManyTensors" in f.message for f in result.findings)
    monkeypatch.undo()
    assert weightcheck.lint(corpus / "ckpt").findings == []  # the good fixture: the same checkpoint, clean
