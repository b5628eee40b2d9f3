"""WC1xx/WC2xx/WC4xx on real transformers-written checkpoints, each rule on a bad and a good fixture."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from conftest import read_index, shards, write_index
from helpers import by_code, codes, rewrite_shard, run

from weightcheck.findings import Severity

INTEGRITY = ["WC1", "WC2", "WC4"]


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe", "qwen3_tied", "qwen2_moe", "qwen2_5_vl"])
def test_real_checkpoints_pass_every_rule(make_ckpt, kind: str) -> None:
    result = run(make_ckpt(kind))
    assert result.findings == [], [f"{f.code}: {f.message}" for f in result.findings]
    assert not any("no architecture pattern" in n for n in result.notes)  # each family has a pattern


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe", "qwen3_tied"])
def test_real_checkpoints_are_clean(make_ckpt, kind: str) -> None:
    path = make_ckpt(kind)
    result = run(path, select=INTEGRITY)
    assert result.findings == [], [f.message for f in result.findings]
    assert result.checked["tensors"] > 10
    assert result.exit_code() == 0
    if kind != "qwen3_tied":
        assert len(shards(path)) >= 3  # genuinely sharded by save_pretrained


def test_wc101_truncated_shard(make_ckpt) -> None:
    path = make_ckpt("llama")
    victim = shards(path)[1]
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 100)
    result = run(path)
    [finding] = by_code(result, "WC101")
    assert finding.location.file == victim.name
    assert "MetadataIncompleteBuffer" in finding.message
    # The shard's names are still known, so no ghost-entry cascade.
    assert "WC202" not in codes(result)
    assert result.exit_code() == 1


def test_wc102_corrupt_header_and_no_cascade(make_ckpt) -> None:
    path = make_ckpt("llama")
    victim = shards(path)[0]
    raw = victim.read_bytes()
    victim.write_bytes(struct.pack("<Q", 2**63) + raw[8:])
    result = run(path)
    [finding] = by_code(result, "WC102")
    assert "HeaderTooLarge" in finding.message
    # Layers of the unreadable shard are still claimed by the index: not reported as missing.
    assert "WC401" not in codes(result)


def test_wc102_non_json_header(make_ckpt) -> None:
    path = make_ckpt("llama")
    victim = shards(path)[0]
    raw = victim.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    victim.write_bytes(raw[:8] + b"{" + b"\xff" * (n - 1) + raw[8 + n :])
    [finding] = by_code(run(path), "WC102")
    assert "UTF-8" in finding.message


def test_wc103_offsets(make_ckpt) -> None:
    path = make_ckpt("llama")
    victim = shards(path)[0]
    raw = victim.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    key = next(k for k in header if k != "__metadata__")
    header[key]["shape"] = [header[key]["shape"][0] * 2, *header[key]["shape"][1:]]
    body = json.dumps(header).encode().ljust(n)
    victim.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    [finding] = by_code(run(path), "WC103")
    assert finding.location.tensor == key
    assert "TensorInvalidInfo" in finding.message


def test_wc104_symlink_out_of_checkpoint_and_fifo(make_ckpt, tmp_path: Path) -> None:
    path = make_ckpt("llama")
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes(b"not yours")
    (path / "extra.safetensors").symlink_to(outside)
    os.mkfifo(path / "pipe.safetensors")
    result = run(path)
    refused = {f.location.file: f.message for f in by_code(result, "WC104")}
    assert set(refused) == {"extra.safetensors", "pipe.safetensors"}
    assert "outside the checkpoint" in refused["extra.safetensors"]


def test_plain_shard_shortcut_takes_only_regular_files_named_plainly(tmp_path: Path) -> None:
    """read_headers' one-lstat shortcut answers only for a regular, non-symlink file named without a separator;
    everything else (a symlink even inside the folder, a directory, a FIFO, a path, `..`, NUL, a missing name)
    goes to resolve_inside, which decides and words the refusal (the WC104 tests above)."""
    from weightcheck.checkpoint import _plain_file_in

    root = tmp_path.resolve()
    (root / "a.safetensors").write_bytes(b"x")
    (root / "link.safetensors").symlink_to(root / "a.safetensors")
    (root / "dir.safetensors").mkdir()
    os.mkfifo(root / "pipe.safetensors")
    assert _plain_file_in(root, "a.safetensors") == root / "a.safetensors"
    for name in ("link.safetensors", "dir.safetensors", "pipe.safetensors", "dir.safetensors/../a.safetensors",
                 "..", ".", "", "a\x00b", "missing.safetensors", "x" * 5000):  # fmt: skip
        assert _plain_file_in(root, name) is None, name


def test_wc104_hf_cache_blob_symlinks_are_followed(make_ckpt, tmp_path: Path) -> None:
    src = make_ckpt("llama")
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    blobs = repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(src.iterdir())):
        blob = blobs / f"blob{i}"
        blob.write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    result = run(snap, select=INTEGRITY)
    assert result.findings == [], [f.message for f in result.findings]


def test_wc105_unindexed_shard_and_stray_single_file(make_ckpt) -> None:
    path = make_ckpt("llama")
    stray = shards(path)[0].read_bytes()
    (path / "model.safetensors").write_bytes(stray)
    (path / "consolidated.safetensors").write_bytes(stray)
    findings = {f.location.file: f for f in by_code(run(path), "WC105")}
    assert findings["model.safetensors"].severity.label == "error"
    assert "single-file checkpoint" in findings["model.safetensors"].message
    assert findings["consolidated.safetensors"].severity.label == "warning"


# Mistral's native tensor names for a Llama-layout model, as vLLM maps them back to HF names
# (`mistral_mapping` in vllm/model_executor/models/llama.py).
MISTRAL_NAMES = (("model.", ""), ("embed_tokens", "tok_embeddings"), ("self_attn.q_proj", "attention.wq"),
                 ("self_attn.k_proj", "attention.wk"), ("self_attn.v_proj", "attention.wv"),
                 ("self_attn.o_proj", "attention.wo"), ("mlp.gate_proj", "feed_forward.w1"),
                 ("mlp.down_proj", "feed_forward.w2"), ("mlp.up_proj", "feed_forward.w3"),
                 ("input_layernorm", "attention_norm"), ("post_attention_layernorm", "ffn_norm"),
                 ("lm_head", "output"))  # fmt: skip


def test_wc105_mistral_repos_ship_their_native_copy_beside_the_hf_shards(make_ckpt) -> None:
    """Mistral's Hub repos hold the HF shards with their index and, beside them, params.json with
    consolidated.safetensors in Mistral's own names (for vLLM's --load-format mistral). The HF loaders follow the
    index (vLLM and SGLang drop files it does not name): an info, and its Mistral-named tensors are not
    WC411's unexpected keys. Without params.json the same file stays a warning."""
    from safetensors.torch import load_file, save_file

    path = make_ckpt("llama")
    native = {}
    for shard in shards(path):
        for name, tensor in load_file(shard).items():
            for hf, mistral in MISTRAL_NAMES:
                name = name.replace(hf, mistral)
            native[name] = tensor
    save_file(native, str(path / "consolidated.safetensors"))
    (path / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2}))
    result = run(path)
    assert [(f.code, f.severity.label) for f in result.findings] == [("WC105", "info")], [
        (f.code, f.message) for f in result.findings
    ]
    assert result.exit_code() == 0
    (path / "params.json").unlink()
    assert {(f.code, f.severity.label) for f in run(path).findings} == {("WC105", "warning"), ("WC411", "warning")}


def test_wc106_numbering_gap(make_ckpt) -> None:
    path = make_ckpt("llama")
    files = shards(path)
    total = len(files)
    # Remove a shard and its index entries: the index is self-consistent, only the numbering shows it.
    gone = files[1]
    index = read_index(path)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != gone.name}
    write_index(path, index)
    gone.unlink()
    result = run(path)
    [finding] = by_code(result, "WC106")
    assert f"{total - 1} of {total}" in finding.message and "missing numbers 2" in finding.message
    # ...and the layers it held are gone from the index: coverage catches it too.
    assert "WC401" in codes(result) or "WC402" in codes(result)


def test_wc107_config_missing_or_broken(make_ckpt) -> None:
    path = make_ckpt("llama")
    (path / "config.json").write_text('{"hidden_size": 64,')
    [finding] = by_code(run(path), "WC107")
    assert "invalid JSON" in finding.message
    (path / "config.json").unlink()
    [finding] = by_code(run(path), "WC107")
    assert "missing" in finding.message


def test_wc108_metadata_format(make_ckpt) -> None:
    path = make_ckpt("llama")
    from safetensors import safe_open
    from safetensors.torch import save_file

    victim = shards(path)[0]
    with safe_open(str(victim), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    save_file(tensors, str(victim), metadata={"format": "torch"})
    [finding] = by_code(run(path), "WC108")
    assert "'torch'" in finding.message
    assert "WC108" not in codes(run(make_ckpt("qwen3_moe")))


def test_wc109_and_exit_3_for_empty_or_missing_target(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(empty).exit_code() == 3
    assert run(tmp_path / "typo").exit_code() == 3
    tokenizer_only = tmp_path / "tok"
    tokenizer_only.mkdir()
    (tokenizer_only / "tokenizer.json").write_text("{}")
    (tokenizer_only / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    assert run(tokenizer_only).exit_code() == 3


def test_wc109_config_only_directory_reports_no_weights(make_ckpt, tmp_path: Path) -> None:
    src = make_ckpt("llama")
    cfg_only = tmp_path / "cfg"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text((src / "config.json").read_text())
    (cfg_only / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    result = run(cfg_only)
    [finding] = by_code(result, "WC109")
    assert "pickle" in finding.message and finding.severity is Severity.WARNING
    assert any("config-only" in n for n in result.notes)
    # The weights were never read: the config-level checks ran, the run does not end green.
    assert result.exit_code() == 3 and "pytorch_model.bin" in result.unchecked_targets[0]
    (cfg_only / "pytorch_model.bin").unlink()  # a config alone: config-only lint is a mode, exit 0
    alone = run(cfg_only)
    assert by_code(alone, "WC109") == [] and alone.exit_code() == 0


def test_wc201_missing_shard_lists_its_tensors(make_ckpt) -> None:
    path = make_ckpt("llama")
    victim = shards(path)[2]
    held = [k for k, v in read_index(path)["weight_map"].items() if v == victim.name]
    victim.unlink()
    result = run(path)
    [finding] = by_code(result, "WC201")
    assert finding.location.file == victim.name
    assert finding.count == len(held)
    assert "WC401" not in codes(result)  # claimed by the index, reported once


def test_wc202_ghost_entry_and_wrong_shard(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    first, second = shards(path)[0].name, shards(path)[1].name
    index["weight_map"]["mtp.fc.weight"] = second
    moved = next(k for k, v in index["weight_map"].items() if v == first)
    index["weight_map"][moved] = second
    write_index(path, index)
    messages = [f.message for f in by_code(run(path), "WC202")]
    assert any("not found in any shard" in m and "mtp.fc.weight" in m for m in messages)
    assert any(f"found in {first}" in m and moved in m for m in messages)


def test_wc203_shard_key_not_indexed(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    dropped = [k for k in index["weight_map"] if ".layers.1.self_attn." in k]
    for k in dropped:
        del index["weight_map"][k]
    write_index(path, index)
    findings = by_code(run(path), "WC203")
    assert sum(f.count for f in findings) == len(dropped)
    assert all("model.layers.1.self_attn." in f.message for f in findings)


def test_wc204_tensor_in_two_shards(make_ckpt) -> None:
    import torch

    path = make_ckpt("llama")
    files = shards(path)
    rewrite_shard(files[-1], add={"model.layers.0.input_layernorm.weight": torch.ones(64)})
    [finding] = by_code(run(path), "WC204")
    assert "model.layers.0.input_layernorm.weight" in finding.message


def test_wc205_total_size(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    assert not by_code(run(path), "WC205")
    index["metadata"]["total_size"] = len(index["weight_map"])  # slime-style "rows, not bytes"
    write_index(path, index)
    [finding] = by_code(run(path), "WC205")
    assert finding.severity.label == "warning"
    del index["metadata"]["total_size"]
    write_index(path, index)
    [finding] = by_code(run(path), "WC205")
    assert finding.severity.label == "info"


@pytest.mark.parametrize("target", ["../escape.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_wc206_escaping_entry_refused_never_opened(make_ckpt, tmp_path: Path, target: str) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    index["weight_map"]["lm_head.weight"] = target
    write_index(path, index)
    result = run(path)
    [finding] = by_code(result, "WC206")
    assert "refused" in finding.message
    assert target not in result.checked and all(target != s for s in ["opened"])  # never read
    from weightcheck.checkpoint import load_checkpoint

    assert target not in load_checkpoint(path).shards


def test_wc207_index_invalid(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    del index["metadata"]
    write_index(path, index)
    [finding] = by_code(run(path), "WC207")
    assert "KeyError" in finding.message
    (path / "model.safetensors.index.json").write_text('{"weight_map": {')
    assert any("invalid JSON" in f.message for f in by_code(run(path), "WC207"))


def test_wc401_dropped_layer(make_ckpt) -> None:
    path = make_ckpt("llama")
    config = json.loads((path / "config.json").read_text())
    config["num_hidden_layers"] = 6
    (path / "config.json").write_text(json.dumps(config))
    [finding] = by_code(run(path), "WC401")
    assert "model.layers.{4..5}" in finding.message


def test_wc402_layer_missing_a_projection(make_ckpt) -> None:
    path = make_ckpt("llama")
    index = read_index(path)
    victims = {"model.layers.1.self_attn.k_proj.weight", "model.layers.2.self_attn.k_proj.weight"}
    for shard in {index["weight_map"][v] for v in victims}:
        rewrite_shard(path / shard, drop=victims)
    for v in victims:
        del index["weight_map"][v]
    write_index(path, index)
    [finding] = by_code(run(path), "WC402")
    assert "model.layers.{1..2}.self_attn.k_proj.weight" in finding.message
    assert finding.details["missing"] == ["self_attn.k_proj.weight"]


def test_wc402_router_missing_in_moe_layer(make_ckpt) -> None:
    path = make_ckpt("qwen3_moe")
    index = read_index(path)
    victim = "model.layers.1.mlp.gate.weight"
    rewrite_shard(path / index["weight_map"].pop(victim), drop={victim})
    write_index(path, index)
    [finding] = by_code(run(path), "WC402")
    assert "moe layers 1 lack" in finding.message and victim in finding.message


def test_wc403_experts_missing_and_beyond(make_ckpt) -> None:
    path = make_ckpt("qwen3_moe")
    index = read_index(path)
    renames = {
        k: k.replace(".experts.3.", ".experts.7.") for k in index["weight_map"] if ".layers.2.mlp.experts.3." in k
    }
    for shard in {index["weight_map"][k] for k in renames}:
        rewrite_shard(path / shard, rename=renames)
    for old, new in renames.items():
        index["weight_map"][new] = index["weight_map"].pop(old)
    write_index(path, index)
    messages = [f.message for f in by_code(run(path), "WC403")]
    assert any("layers 2 lack experts 3" in m for m in messages), messages
    assert any("hold experts 7 beyond" in m for m in messages), messages


def test_wc403_expert_missing_one_projection(make_ckpt) -> None:
    path = make_ckpt("qwen3_moe")
    index = read_index(path)
    victim = "model.layers.0.mlp.experts.2.down_proj.weight"
    rewrite_shard(path / index["weight_map"].pop(victim), drop={victim})
    write_index(path, index)
    [finding] = by_code(run(path), "WC403")
    assert victim in finding.message


def test_wc404_wc406_mtp_layers(make_ckpt) -> None:
    import torch

    path = make_ckpt("qwen3_moe")
    config = json.loads((path / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
    [finding] = by_code(run(path), "WC404")
    assert "model.layers.3" in finding.message
    # Store the MTP layer: clean. Store one beyond: WC406.
    last = shards(path)[-1]
    index = read_index(path)
    extra = {"model.layers.3.eh_proj.weight": torch.zeros(64, 128), "model.layers.4.enorm.weight": torch.ones(64)}
    rewrite_shard(last, add=extra)
    for k in extra:
        index["weight_map"][k] = last.name
    write_index(path, index)
    result = run(path)
    assert "WC404" not in codes(result)
    [finding] = by_code(result, "WC406")
    assert "layers 4 are at or beyond" in finding.message


def test_wc405_repeated_segment(make_ckpt) -> None:
    path = make_ckpt("qwen3_tied")
    rewrite_shard(
        path / "model.safetensors",
        rename={"model.norm.weight": "model.language_model.language_model.norm.weight"},
    )
    [finding] = by_code(run(path), "WC405")
    assert "language_model.language_model" in finding.message


def test_wc407_tie_flag(make_ckpt) -> None:
    import torch

    tied = make_ckpt("qwen3_tied")
    assert not by_code(run(tied), "WC407")
    rewrite_shard(tied / "model.safetensors", add={"lm_head.weight": torch.zeros(128, 64)})
    [finding] = by_code(run(tied), "WC407")
    assert finding.severity.label == "warning"

    untied = make_ckpt("llama")
    index = read_index(untied)
    rewrite_shard(untied / index["weight_map"].pop("lm_head.weight"), drop={"lm_head.weight"})
    write_index(untied, index)
    [finding] = by_code(run(untied), "WC407")
    assert finding.severity.label == "error"


def test_hostile_counts_in_config_and_names_do_not_explode(make_ckpt) -> None:
    import torch

    path = make_ckpt("qwen3_moe")
    config = json.loads((path / "config.json").read_text())
    config.update(num_hidden_layers=10**12, num_local_experts=10**15, num_nextn_predict_layers=10**9)
    (path / "config.json").write_text(json.dumps(config))
    last = shards(path)[-1]
    index = read_index(path)
    rewrite_shard(last, add={"model.layers.0.mlp.experts.99999999999.down_proj.weight": torch.zeros(2, 2)})
    index["weight_map"]["model.layers.0.mlp.experts.99999999999.down_proj.weight"] = last.name
    write_index(path, index)
    result = run(path)  # must return promptly, with findings, not MemoryError
    messages = [f.message for f in by_code(result, "WC107")]
    assert any("beyond any real model" in m for m in messages)
    assert result.exit_code() == 1


def test_wc107_mistral_native_layout_is_a_warning_a_missing_config_elsewhere_an_error(tmp_path: Path) -> None:
    """params.json beside consolidated.safetensors is Mistral's own layout (vLLM's --config-format mistral): no
    config.json there is a warning that says so; safetensors without config.json or params.json is an error."""
    import torch
    from safetensors.torch import save_file

    native = tmp_path / "native"
    native.mkdir()
    tensors = {"tok_embeddings.weight": torch.zeros(8, 4), "output.weight": torch.zeros(8, 4)}
    for i in range(2):
        tensors |= {f"layers.{i}.attention.wq.weight": torch.zeros(4, 4), f"layers.{i}.ffn_norm.weight": torch.zeros(4)}
    save_file(tensors, str(native / "consolidated.safetensors"))
    (native / "params.json").write_text(json.dumps({"dim": 4, "n_layers": 2, "n_heads": 1, "vocab_size": 8}))
    [finding] = by_code(run(native), "WC107")
    assert finding.severity is Severity.WARNING and "Mistral's native layout" in finding.message
    assert run(native).exit_code() == 0

    (native / "params.json").unlink()
    [finding] = by_code(run(native), "WC107")
    assert finding.severity is Severity.ERROR and run(native).exit_code() == 1
