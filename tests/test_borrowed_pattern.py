"""A wrapper model_type with no pattern of its own borrows its text_config's (weightcheck.patterns.borrowed).

Kimi-K2.5/K2.6 (`kimi_k25`) is a DeepSeek-V3 language model in a VLM wrapper: its released checkpoints keep
the language model under `language_model.model.layers.N` and the head at `language_model.lm_head` (nvidia's
Kimi-K2.6-NVFP4 ignore list names them so). Linted with the borrowed `deepseek_v3` pattern at its own root
(`model.layers`), a clean checkpoint gave WC410 errors for every language-model weight, and its config-only
ignore list WC302 for every entry. The fixture is transformers' own tiny `kimi_k25`, rewritten to the released
layout: transformers 5.17 writes the decoder layers as `language_model.model.blocks.N` (its conversion
mapping renames the vision tower's `layers` to `blocks` and the language model's with them), and its tiny
config carries the default's stale `qk_head_dim`.

Also here: a config.json that leaves `tie_word_embeddings` out has its class's default (Gemma-2: tied), so
the `lm_head` entry llm-compressor writes by default is not "unmatched" (WC302)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import by_code, rewrite_shard, run

from weightcheck.findings import Severity

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools.archgen.tiny import save

    folder = tmp_path_factory.mktemp("kimi_k25")
    save("kimi_k25", folder)
    released = "language_model.model.layers."
    for shard in folder.glob("*.safetensors"):
        from safetensors import safe_open

        with safe_open(str(shard), framework="pt") as fh:
            rename = {k: k.replace("language_model.model.blocks.", released) for k in fh.keys()}
        rewrite_shard(shard, rename=rename)
    index = folder / "model.safetensors.index.json"
    index.write_text(index.read_text().replace("language_model.model.blocks.", released))
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    text["qk_head_dim"] = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_clean_wrapper_checkpoint_is_clean(kimi: Path) -> None:
    result = run(kimi)
    assert result.findings == [], [f.message for f in result.findings]
    assert any("'kimi_k25' has no pattern of its own" in note for note in result.notes)
    assert result.exit_code() == 0


def test_a_missing_router_is_named_under_the_wrappers_root_as_a_warning(kimi: Path, tmp_path: Path) -> None:
    folder = _copy(kimi, tmp_path / "ckpt")
    router = "language_model.model.layers.2.mlp.gate.weight"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"].pop(router)
    rewrite_shard(shard, drop={router})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (missing,) = by_code(run(folder), "WC410")
    assert router in missing.message and missing.severity is Severity.WARNING  # borrowed: never an error


def _ct_config(ignore: list[str], scheme: str = "FP8_DYNAMIC") -> dict:
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    qc = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])},
        ignore=ignore,
        format="float-quantized" if scheme.startswith("FP8") else "pack-quantized",
        quant_method="compressed-tensors",
    )
    return json.loads(qc.model_dump_json(exclude_none=True))


def _config_only(kimi: Path, tmp_path: Path, ignore: list[str], scheme: str = "FP8_DYNAMIC") -> Path:
    config = json.loads((kimi / "config.json").read_text())
    config["quantization_config"] = _ct_config(ignore, scheme)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


# As nvidia's Kimi-K2.6-NVFP4 lists them: the language model's head, embedding and routers (layers 1-3 are
# MoE here), and the wrapper's own vision tower and projector, which the borrowed pattern does not know.
LISTED = [
    "language_model.lm_head",
    "language_model.model.embed_tokens",
    *(f"language_model.model.layers.{layer}.mlp.gate" for layer in (1, 2, 3)),
    "vision_tower.encoder.blocks.0.wqkv",
    "mm_projector.proj.0",
]


def test_a_wrappers_ignore_list_is_read_under_its_root(kimi: Path, tmp_path: Path) -> None:
    result = run(_config_only(kimi, tmp_path, LISTED))
    assert not by_code(result, "WC302"), [f.message for f in result.findings]
    assert not [f for f in result.findings if "mlp.gate" in f.message], [f.message for f in result.findings]
    assert any("2 ignore entries are not plain names under the language model's root" in n for n in result.notes)


def test_a_router_left_out_of_a_wrappers_list_is_named(kimi: Path, tmp_path: Path) -> None:
    """W4A16 (Kimi-K2-Thinking's INT4 scheme): the reader that would quantize the router left out is slime's
    and miles' online compressed-tensors quantizer (the engines build routers unquantized), which packs INT
    weights only, so an FP8 list leaving a router out names nothing."""
    listed = [e for e in LISTED if e != "language_model.model.layers.2.mlp.gate"]
    result = run(_config_only(kimi, tmp_path, listed, "W4A16"))
    named = [f for f in result.findings if "language_model.model.layers.2.mlp.gate" in f.message]
    assert named and all("layers.1.mlp.gate" not in f.message for f in named)
    assert by_code(result, "WC302") == []  # nothing else became unmatched


def test_a_typo_under_the_wrappers_root_is_still_unmatched(kimi: Path, tmp_path: Path) -> None:
    result = run(_config_only(kimi, tmp_path, [*LISTED, "language_model.model.layers.1.mlp.gates"]))
    (unmatched,) = by_code(result, "WC302")
    assert "language_model.model.layers.1.mlp.gates" in unmatched.message


def _gemma2(tmp_path: Path, ignore: list[str], **extra: object) -> Path:
    from transformers import Gemma2Config

    config = Gemma2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, vocab_size=128, num_hidden_layers=2).to_diff_dict()  # fmt: skip
    config.pop("tie_word_embeddings", None)  # as Google's released config.json files leave it out
    config.update(extra, quantization_config=_ct_config(ignore))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("explicit", [False, True], ids=["flag-left-out", "flag-true"])
def test_llm_compressors_default_head_entry_on_a_tied_model_is_not_unmatched(tmp_path: Path, explicit: bool) -> None:
    extra = {"tie_word_embeddings": True} if explicit else {}
    result = run(_gemma2(tmp_path, ["lm_head", "model.embed_tokens"], **extra))
    assert not by_code(result, "WC302"), [f.message for f in result.findings]


def test_a_head_entry_misspelled_on_a_tied_model_is_unmatched(tmp_path: Path) -> None:
    (unmatched,) = by_code(run(_gemma2(tmp_path, ["lm_heads", "model.embed_tokens"])), "WC302")
    assert "'lm_heads'" in unmatched.message


# ---- MTP blocks a pattern does not list: Nemotron-3 names them `mtp.layers.N` ------------------------------


@pytest.mark.parametrize(("entry", "unmatched"), [("re:mtp.layers.*", False), ("re:mtpx.layers.*", True)])
def test_an_entry_for_numbered_mtp_blocks_is_left_to_them(tmp_path: Path, entry: str, unmatched: bool) -> None:
    """NVIDIA's Nemotron-3 checkpoints name their MTP blocks `mtp.layers.N...` (transformers does not build
    them, so the pattern lists none): `re:mtp.layers.*` is for them, not "matches no module" (WC302)."""
    from oracle_configs import published_configs

    ((_, config),) = published_configs("nemotron_h")[:1]
    config = {**config, "quantization_config": _ct_config(["lm_head", r"re:.*mixer\.gate$", entry])}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run(tmp_path)
    messages = [f.message for f in by_code(result, "WC302")]
    assert len(messages) == unmatched
    assert all(m.startswith(f"ignore entry {entry!r} matches no module") for m in messages)
