"""A target and a draft (MTP-style) runner in one process, fed one stream: one record per runner, each judged on
its own (the draft's by-design drops are not drops; a defect in its own layer is named on it). The real-SGLang
version (DeepSeek-V3 + DeepseekV3ForCausalLMNextN) is tests/sglang/test_sglang_draft_runner.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_tap import Engine, default_loader, stream

from weightcheck import tap
from weightcheck.verifying import verify


class TinyMTP(Engine):
    """Keeps only the stream's layer 2 (its own layer 0), as SGLang's NextN classes keep the MTP layer."""

    def load_weights(self, weights: Any, is_mtp: bool = True) -> None:
        super().load_weights((n.replace("layers.2.", "layers.0."), t) for n, t in weights if n.startswith("layers.2."))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Path, Engine, TinyMTP]]:
    root = tmp_path / "records"
    tap.configure(root, digest_threads=2)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    target, draft = Engine(layers=2), TinyMTP(layers=1)
    tap.wrap(target)
    tap.wrap(draft)
    yield root, target, draft
    tap.configure(None)
    tap.set_engine_hooks(tap.EngineHooks())


def test_runner_defaults_and_override() -> None:
    assert tap.runner_of(TinyMTP(layers=1)) == "draft" and tap.runner_of(Engine()) == "target"
    assert tap.runner_of(tap.set_runner(Engine(), "draft")) == "draft"


def test_pair_clean_and_draft_defect_named(pair: tuple[Path, Engine, TinyMTP]) -> None:
    root, target, draft = pair
    sent = stream(layers=3)
    with tap.sync("v1"):
        target.load_weights(iter(sent))
        draft.load_weights(iter(sent))
    files = sorted(p.name for p in (root / "sync-00000").glob("*.jsonl"))
    assert len(files) == 2 and files[0].endswith(".draft.jsonl") != files[1].endswith(".draft.jsonl")
    records = [tap.read_record(root / "sync-00000" / f) for f in files]
    assert sorted(r.runner for r in records) == ["draft", "target"]
    result = verify(root, weight_version="v1")
    assert result.findings == [], [f.message for f in result.findings]

    with tap.sync("v2"):
        lacking = [(n, t) for n, t in sent if n != "layers.2.norm"]
        target.load_weights(iter(lacking))
        draft.load_weights(iter(lacking))
    result = verify(root, weight_version="v2")
    (never,) = [f for f in result.findings if f.code == "WC732"]
    assert never.details["params"] == ["layers.0.norm"] and "[draft]" in never.message
    assert {f.code for f in result.findings} == {"WC732"}, [f.message for f in result.findings]


def test_without_runner_split_the_draft_drops_would_be_reported(pair: tuple[Path, Engine, TinyMTP]) -> None:
    """The same pair with the draft labelled a target: its by-design drops and the target's drop of layer 2
    collide in one record; the split is what keeps the clean run clean."""
    root, target, draft = pair
    tap.set_runner(draft, "target")
    with tap.sync("v1"):
        target.load_weights(iter(stream(layers=3)))
        draft.load_weights(iter(stream(layers=3)))
    assert len(list((root / "sync-00000").glob("*.jsonl"))) == 1
    assert verify(root, weight_version="v1").findings
