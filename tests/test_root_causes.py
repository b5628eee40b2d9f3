"""One defect, one finding: follow-on findings are attached to their root cause as `related`.

Each cascade below used to produce several top-level findings for one planted defect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_index, write_index
from helpers import by_code, rewrite_shard, run

from weightcheck.findings import Finding, Location, Severity
from weightcheck.triage import attach_related


def top_codes(result) -> list[str]:
    return sorted(f.code for f in result.findings)


def related_codes(finding: Finding) -> set[str]:
    return {r.code for r in finding.related}


def test_key_dropped_from_shard_is_one_wc202(make_ckpt) -> None:
    path = make_ckpt("llama")
    name = "model.layers.1.mlp.down_proj.weight"
    rewrite_shard(path / read_index(path)["weight_map"][name], drop={name})
    result = run(path)
    assert top_codes(result) == ["WC202"]
    (root,) = result.findings
    assert related_codes(root) == {"WC402", "WC410", "WC205"}
    assert root.fix and root.severity == Severity.ERROR


def test_wrong_total_size_next_to_an_unrelated_ghost_stays_separate(make_ckpt) -> None:
    """total_size off by one byte is not explained by a ghost entry of unknown size: two defects, two roots."""
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(index["weight_map"].values()))
    index["metadata"]["total_size"] += 1
    write_index(path, index)
    assert {"WC202", "WC205"} <= set(top_codes(run(path)))


def test_malformed_index_is_one_wc207(make_ckpt) -> None:
    path = make_ckpt("llama")
    (path / "model.safetensors.index.json").write_text("{not json")
    result = run(path)
    assert top_codes(result) == ["WC207"]
    (root,) = result.findings
    assert related_codes(root) == {"WC105"} and len(root.related) >= 3


def test_fifo_shard_is_one_wc104(make_ckpt) -> None:
    path = make_ckpt("llama")
    total = len(list(path.glob("model-*.safetensors")))
    os.mkfifo(path / f"model-{total + 1:05d}-of-{total + 1:05d}.safetensors")
    result = run(path)
    assert top_codes(result) == ["WC104"]
    assert related_codes(result.findings[0]) == {"WC105", "WC106"}


def test_missing_shard_is_one_wc201(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    victim = index["weight_map"]["model.layers.2.self_attn.q_proj.weight"]
    (path / victim).unlink()
    result = run(path)
    assert top_codes(result) == ["WC201"], [(f.code, f.message) for f in result.findings]


def test_independent_defects_are_not_merged(make_ckpt) -> None:
    """A FIFO and a ghost entry are two defects: two roots."""
    path = make_ckpt("llama")
    os.mkfifo(path / "pipe.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    rewrite_shard(path / read_index(path)["weight_map"][name], drop={name})
    result = run(path)
    assert top_codes(result) == ["WC104", "WC202"]
    assert related_codes(by_code(result, "WC104")[0]) == {"WC105"}


def test_shifted_layers_against_manifest_are_one_diagnosis(make_ckpt, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = make_ckpt("llama")
    manifest = tmp_path / "m.json"
    run(path, options={"content": True, "hash_out": str(manifest)})
    weight_map = read_index(path)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(path / shard), framework="pt") as fh:
            tensors.update({k: (shard, fh.get_tensor(k)) for k in fh.keys()})
    # layers 1 and 2 receive the data of layers 2 and 3 (a pipeline offset applied twice)
    for shard in sorted(set(weight_map.values())):
        out = {}
        for k, (s, t) in tensors.items():
            if s != shard:
                continue
            parts = k.split(".")
            if parts[:2] == ["model", "layers"] and parts[2] in ("1", "2"):
                t = tensors[".".join([*parts[:2], str(int(parts[2]) + 1), *parts[3:]])][1]
            out[k] = t.contiguous()
        save_file(out, str(path / shard), metadata={"format": "pt"})
    result = run(path, options={"content": True, "against_manifest": str(manifest)})
    (root,) = by_code(result, "WC606")
    assert root.details["shift"] == 1 and root.details["index"] == "layer"
    assert "layers 1..2 hold the manifest's data of layers 2..3" in root.message
    assert len(root.related) == root.count == 14
    assert top_codes(result) == ["WC606"]


def test_a_single_changed_tensor_is_not_a_shift(make_ckpt, tmp_path: Path) -> None:
    import torch
    from quant_fixtures import edit_tensors

    path = make_ckpt("llama")
    manifest = tmp_path / "m.json"
    run(path, options={"content": True, "hash_out": str(manifest)})
    name = "model.layers.0.mlp.up_proj.weight"
    edit_tensors(path, lambda t: t.__setitem__(name, torch.zeros_like(t[name])))
    (finding,) = by_code(run(path, options={"content": True, "against_manifest": str(manifest)}), "WC606")
    assert finding.message.startswith("bytes differ") and not finding.related


def test_attach_related_is_general_and_keeps_orphans() -> None:
    """The post-pass reads only rules' `implies`: a follow-on whose names the root does not cover stays."""
    root = Finding("WC104", "file-refused", Severity.ERROR, "refused", Location(file="a.safetensors"))
    covered = Finding("WC105", "shard-not-indexed", Severity.ERROR, "x", Location(file="a.safetensors"))
    other = Finding("WC105", "shard-not-indexed", Severity.ERROR, "y", Location(file="b.safetensors"))
    top = attach_related([root, covered, other])
    assert top == [root, other] and root.related == [covered]


def test_related_shown_with_verbose_and_in_json(make_ckpt) -> None:
    path = make_ckpt("llama")
    (path / "model.safetensors.index.json").write_text("{not json")

    def wc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)

    plain = wc("lint", str(path)).stdout
    assert "WC105" in plain and "-v shows them" in plain and "weightcheck rules WC207" in plain
    assert "related WC105" not in plain
    assert "related WC105 shard-not-indexed" in wc("lint", str(path), "-v").stdout
    doc = json.loads(wc("lint", str(path), "--format", "json").stdout)
    (finding,) = doc["findings"]
    assert finding["code"] == "WC207" and finding["fix"] and len(finding["fingerprint"]) == 16
    assert {r["code"] for r in finding["related"]} == {"WC105"}


@pytest.mark.parametrize("code", ["WC101", "WC202", "WC309", "WC606", "WC725"])
def test_every_rule_has_a_fix_text(code: str) -> None:
    from weightcheck.rules import all_rules

    # every rule has its own fix text, not the generic fallback
    assert [r.code for r in all_rules().values() if "good example" in r.fix_text()] == []
    assert "Fix:" in all_rules()[code].explain()
