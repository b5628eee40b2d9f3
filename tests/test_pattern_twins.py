"""The parsed twin of the shipped hand-written TOML patterns (`patterns/generated/handwritten.json`): current,
equal to tomllib's parse of every file, used only for a file whose text is exactly the recorded one (an edited
file, or a broken twin, falls back to parsing the TOML), and what lets config-only lint skip importing tomllib
(tests/test_startup_path.py checks that it does). Also: the shipped patterns folder of an installed copy is
found without importlib.resources."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

import weightcheck.patterns as patterns
from tools.archgen.twins import TWIN_NAME, twin_text

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "patterns"
_CACHES = ("builtin_patterns", "builtin_families", "builtin_pattern", "_overlaid", "_handwritten_doc",
           "_handwritten_twins")  # fmt: skip


def _clear() -> None:
    for name in _CACHES:
        getattr(patterns, name).cache_clear()


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the shipped patterns folder, read by weightcheck instead of the shipped one."""
    copy = tmp_path / "patterns"
    shutil.copytree(SHIPPED, copy)
    monkeypatch.setattr(patterns, "_pattern_dir", lambda: copy)
    _clear()
    yield copy
    monkeypatch.undo()
    _clear()


def test_the_checked_in_twin_is_current() -> None:
    assert (SHIPPED / "generated" / TWIN_NAME).read_text(encoding="utf-8") == twin_text(SHIPPED), (
        "stale: run `python -m tools.archgen.twins`"
    )


def test_every_shipped_file_is_read_from_the_twin_and_parses_as_tomllib_does() -> None:
    files = sorted(SHIPPED.glob("*.toml"))
    assert len(files) >= 9
    for file in files:
        text = file.read_text(encoding="utf-8")
        twin = patterns._twin_doc(file, text)
        assert twin is not None, file
        assert twin == tomllib.loads(text), file
        assert patterns._shipped_doc(file) == tomllib.loads(text), file


def test_an_edited_file_is_parsed_not_taken_from_the_twin(folder: Path) -> None:
    file = folder / "qwen3_moe.toml"
    text = file.read_text(encoding="utf-8")
    assert 'description = "' in text
    edited = text.replace('description = "', 'description = "EDITED ', 1)
    file.write_text(edited, encoding="utf-8")
    assert patterns._twin_doc(file, edited) is None
    doc = patterns._shipped_doc(file)
    assert doc == tomllib.loads(edited)
    assert doc["family"]["description"].startswith("EDITED ")
    assert patterns.builtin_pattern("qwen3_moe").description.startswith("EDITED ")


@pytest.mark.parametrize("twin", ["{not json", "[]", '{"files": []}', '{"files": {"qwen3_moe.toml": 3}}', None])
def test_a_broken_or_missing_twin_falls_back_to_the_toml_files(folder: Path, twin: str | None) -> None:
    shipped = {name: p.description for name, p in patterns.builtin_patterns().items()}
    path = folder / "generated" / TWIN_NAME
    if twin is None:
        path.unlink()
    else:
        path.write_text(twin, encoding="utf-8")
    _clear()
    assert patterns._handwritten_twins() == ({} if twin is None or "qwen3" not in twin else
                                             {"qwen3_moe.toml": 3})  # fmt: skip
    assert {name: p.description for name, p in patterns.builtin_patterns().items()} == shipped


def test_a_twin_whose_text_does_not_match_is_ignored(folder: Path) -> None:
    """A twin that records another text for a file (an older copy) never lends that file its document."""
    path = folder / "generated" / TWIN_NAME
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["files"]["qwen3_moe.toml"]["doc"]["family"]["description"] = "FROM THE TWIN"
    doc["files"]["qwen3_moe.toml"]["toml"] += "\n# another text\n"
    path.write_text(json.dumps(doc), encoding="utf-8")
    _clear()
    assert patterns.builtin_pattern("qwen3_moe").description != "FROM THE TWIN"


def test_an_installed_copy_finds_its_packaged_patterns_without_importlib_resources(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    package = site / "weightcheck"
    (package / "_patterns").mkdir(parents=True)
    assert patterns.find_pattern_dir(package) == package / "_patterns"
    checkout = tmp_path / "checkout"
    (checkout / "patterns").mkdir(parents=True)
    (checkout / "weightcheck").mkdir()
    assert patterns.find_pattern_dir(checkout / "weightcheck") == checkout / "patterns"
