"""WC407 on an architecture whose output head is not called `lm_head` on disk: GPT-NeoX's transformers 5
model holds `lm_head` but save_pretrained writes `embed_out` (its checkpoint conversion, reversed on save).
The head's on-disk name comes from the generated pattern (the global stored only when untied)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from helpers import by_code, run
from quantized import edit_tensors

from weightcheck.findings import Severity
from weightcheck.patterns import detect_pattern


@pytest.fixture(scope="module")
def neox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools.archgen.tiny import save

    logging.getLogger("transformers").setLevel(logging.ERROR)
    return save("gpt_neox", tmp_path_factory.mktemp("neox") / "gpt_neox", "D", shard="40KB")


@pytest.fixture
def copy(neox: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(neox, tmp_path / "ckpt"))


def test_clean_gpt_neox_lints_clean(neox: Path) -> None:
    cfg = json.loads((neox / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    assert detect_pattern(cfg).name == "gen_gpt_neox"
    result = run(neox)
    assert [f"{f.code} {f.message}" for f in result.findings if f.severity >= Severity.WARNING] == []
    assert result.exit_code() == 0


def test_untied_without_its_head_is_an_error_naming_embed_out(copy: Path) -> None:
    edit_tensors(copy, drop={"embed_out.weight"})
    found = by_code(run(copy), "WC407")
    assert found and found[0].severity == Severity.ERROR
    assert "embed_out.weight" in found[0].message


def test_tied_with_the_head_stored_is_a_warning(copy: Path) -> None:
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    found = by_code(run(copy), "WC407")
    assert found and found[0].severity == Severity.WARNING and "embed_out.weight" in found[0].message
