"""The missing-extra hint names a command that works for how weightcheck was installed, also when the
checkout's own build leftovers (`weightcheck.egg-info`, as `pip install -e .` leaves it) come first on the
path: CI runs the suite from a clone with the checkout on PYTHONPATH, where the first distribution found
carries no direct_url.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightcheck.deps import install_command

TREE = Path(__file__).resolve().parent.parent


def test_egg_info_without_direct_url_first_on_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    egg = tmp_path / "weightcheck.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: weightcheck\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hint = install_command("content")
    assert hint.startswith("pip install ") and hint.endswith("[content]'"), hint
    assert "'weightcheck[content]'" not in hint  # the registry spelling fails: no release is published
    # Running from this checkout: the hint installs from a local folder (this tree, or the one pip recorded).
    assert "/" in hint.split("pip install ", 1)[1]
