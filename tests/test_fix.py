"""`weightcheck lint --fix`: mechanical repairs of the JSON files, on real llm-compressor output."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from conftest import read_index, write_index
from helpers import rewrite_shard
from quantized import quant_config, set_ignore


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)


def findings(path: Path, *extra: str) -> list[dict]:
    proc = wc("lint", str(path), "--format", "json", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)["findings"]


def digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def test_fix_repairs_total_size_and_router_in_w4a16_ignore_list(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    set_ignore(path, ["lm_head"])  # the router (mlp.gate) lost from llm-compressor's list
    index = read_index(path)
    index["metadata"]["total_size"] += 4096
    write_index(path, index)
    before = {f["code"]: f for f in findings(path)}
    assert {"WC205", "WC309"} <= set(before)
    assert "mlp\\\\.gate" in before["WC309"]["fix"] or "embed_tokens" in before["WC309"]["fix"]
    shards = {n: d for n, d in digests(path).items() if n.endswith(".safetensors")}

    preview = wc("lint", str(path), "--fix", "--diff")
    assert preview.returncode == 1, preview.stderr
    assert '-    "total_size"' in preview.stdout and "mlp\\\\.gate($|" in preview.stdout
    assert read_index(path)["metadata"]["total_size"] == index["metadata"]["total_size"]  # --diff wrote nothing

    fixed = wc("lint", str(path), "--fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "fixed: model.safetensors.index.json: metadata.total_size" in fixed.stdout
    assert "re:.*mlp\\.gate($|\\..*)" in quant_config(path)["ignore"]
    assert quant_config(path)["ignore"][0] == "lm_head"  # existing entries kept, in order
    again = wc("lint", str(path))
    assert again.returncode == 0 and "clean" in again.stdout, again.stdout
    assert findings(path) == []
    # tensor data untouched; no temp files left behind
    assert {n: d for n, d in digests(path).items() if n.endswith(".safetensors")} == shards
    assert not [p for p in path.iterdir() if p.name.startswith(".")]


def test_fix_adds_missing_and_repoints_misplaced_index_entries(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"].pop("model.norm.weight")
    moved = "model.layers.0.mlp.up_proj.weight"
    real = index["weight_map"][moved]
    index["weight_map"][moved] = next(s for s in sorted(set(index["weight_map"].values())) if s != real)
    write_index(path, index)
    assert {f["code"] for f in findings(path)} >= {"WC202", "WC203"}
    assert wc("lint", str(path), "--fix").returncode == 0
    wm = read_index(path)["weight_map"]
    assert wm[moved] == real and "model.norm.weight" in wm
    assert findings(path) == []


def test_fix_leaves_lost_tensors_alone(make_ckpt) -> None:
    """A tensor lost from its shard is not mechanical: total_size is the honest record, and stays."""
    path = make_ckpt("llama")
    name = "model.layers.1.mlp.down_proj.weight"
    rewrite_shard(path / read_index(path)["weight_map"][name], drop={name})
    before = (path / "model.safetensors.index.json").read_bytes()
    proc = wc("lint", str(path), "--fix")
    assert proc.returncode == 1 and "WC202" in proc.stdout
    assert (path / "model.safetensors.index.json").read_bytes() == before


def test_fix_refuses_a_symlinked_index(make_ckpt, tmp_path: Path) -> None:
    # An index symlinked to a file inside the checkpoint is read, but --fix never writes through a link.
    path = make_ckpt("llama")
    index = read_index(path)
    index["metadata"]["total_size"] += 1
    inside = path / "shared-index.json"
    inside.write_text(json.dumps(index, indent=2))
    (path / "model.safetensors.index.json").unlink()
    (path / "model.safetensors.index.json").symlink_to(inside.name)
    before = inside.read_bytes()
    proc = wc("lint", str(path), "--fix", "--format", "json")
    codes = {f["code"] for f in json.loads(proc.stdout)["findings"]}
    assert "WC110" in codes and proc.returncode == 1
    assert inside.read_bytes() == before and (path / "model.safetensors.index.json").is_symlink()


def test_fix_never_writes_an_index_linked_outside(make_ckpt, tmp_path: Path) -> None:
    # An index that leaves the checkpoint is not even read (the confinement layer refuses it): nothing to fix.
    path = make_ckpt("llama")
    index = read_index(path)
    index["metadata"]["total_size"] += 1
    outside = tmp_path / "shared-index.json"
    outside.write_text(json.dumps(index, indent=2))
    (path / "model.safetensors.index.json").unlink()
    (path / "model.safetensors.index.json").symlink_to(outside)
    before = outside.read_bytes()
    proc = wc("lint", str(path), "--fix", "--format", "json")
    codes = {f["code"] for f in json.loads(proc.stdout)["findings"]}
    assert "WC207" in codes and proc.returncode == 1
    assert outside.read_bytes() == before and (path / "model.safetensors.index.json").is_symlink()


def test_lint_without_fix_never_writes_and_diff_alone_previews(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    index["metadata"]["total_size"] += 1
    write_index(path, index)
    before = digests(path)
    assert "WC205" in wc("lint", str(path)).stdout
    preview = wc("lint", str(path), "--diff")  # ruff's --diff: what --fix would change (issue #19)
    assert preview.returncode == 1 and '"total_size"' in preview.stdout
    assert digests(path) == before


def test_rules_explain_shows_fix() -> None:
    out = wc("rules", "WC205").stdout
    assert "Fix:" in out and "--fix" in out


def test_fix_on_a_shipped_sample_config(tmp_path: Path) -> None:
    """Config-only: the GLM-4.5-Air W4A16 sample whose ignore list lacks routers and embeddings."""
    import shutil

    sample = Path(__file__).parent.parent / "sample_configs" / "glm-4.5-air-w4a16-router-not-ignored"
    path = Path(shutil.copytree(sample, tmp_path / "glm"))
    # (a 46-layer, 128-expert config lints in seconds: one --fix run, which lints again after writing)
    proc = wc("lint", str(path), "--fix")
    assert proc.returncode == 0 and "fixed: config.json" in proc.stdout and "clean" in proc.stdout, proc.stdout
    assert quant_config(path)["ignore"] == ["lm_head", "re:.*embed_tokens($|\\..*)", "re:.*mlp\\.gate($|\\..*)"]
