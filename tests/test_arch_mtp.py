"""MTP weights in generated patterns: releases of Qwen3-Next, Qwen3.5 and Nemotron-H ship `mtp.*` tensors
that transformers' model class skips on load (`_keys_to_ignore_on_load_unexpected`, read by the generator);
lint accepts them under the derived prefix instead of warning WC411, and still warns on anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import by_code, run

from tools.archgen.generate import mtp_prefixes


def test_prefixes_come_from_the_transformers_classes() -> None:
    from transformers import DeepseekV3ForCausalLM, Ernie4_5_MoeForCausalLM, Qwen3NextForCausalLM

    assert mtp_prefixes(Qwen3NextForCausalLM._keys_to_ignore_on_load_unexpected) == ["mtp."]
    # a layer index of the full-size model, and a bare substring: no prefix to derive
    assert mtp_prefixes(DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected) == []
    assert mtp_prefixes(Ernie4_5_MoeForCausalLM._keys_to_ignore_on_load_unexpected) == []


def test_generated_qwen3_next_records_where_its_mtp_prefix_came_from() -> None:
    from tools.archgen.generate import GENERATED_DIR

    doc = json.loads((GENERATED_DIR / "qwen3_next.json").read_text())
    assert doc["provenance"]["skipped_on_load"] == ["^mtp.*"]
    assert "mtp." in doc["family"]["allowed_prefixes"]


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools.archgen.tiny import save

    return save("qwen3_next", tmp_path_factory.mktemp("q3n") / "ckpt", "D", shard="10MB")


def _with_extra(src: Path, dst: Path, names: list[str]) -> Path:
    import shutil

    import torch
    from safetensors.torch import save_file

    path = Path(shutil.copytree(src, dst))
    hidden = json.loads((path / "config.json").read_text())["hidden_size"]
    save_file({n: torch.zeros(hidden) for n in names}, str(path / "extra.safetensors"), metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"].update({n: "extra.safetensors" for n in names})
        index.write_text(json.dumps(doc))
    return path


def test_release_mtp_tensors_are_not_unexpected(qwen3_next: Path, tmp_path: Path) -> None:
    path = _with_extra(qwen3_next, tmp_path / "mtp", ["mtp.norm.weight", "mtp.layers.0.input_layernorm.weight"])
    assert by_code(run(path), "WC411") == []


def test_other_stray_tensors_still_are(qwen3_next: Path, tmp_path: Path) -> None:
    path = _with_extra(qwen3_next, tmp_path / "odd", ["mtp_extra.norm.weight"])
    [finding] = by_code(run(path), "WC411")
    assert "mtp_extra.norm.weight" in finding.message
