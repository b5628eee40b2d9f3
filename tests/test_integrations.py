"""weightcheck.integrations without any framework or engine: off unless enabled, never breaks the sync it
observes, strict only on request. (The adapters against SGLang: tests/megatron/test_framework_adapters.py.)"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from weightcheck.integrations import SyncMonitor
from weightcheck.integrations.miles import instrument as miles_instrument
from weightcheck.integrations.slime import instrument as slime_instrument
from weightcheck.integrations.verl import instrument as verl_instrument


def test_off_unless_enabled(tmp_path: Path) -> None:
    assert SyncMonitor.from_env({}) is None
    assert SyncMonitor.from_env({"WEIGHTCHECK_DIR": str(tmp_path)}) is None
    assert SyncMonitor.from_env({"WEIGHTCHECK_SYNC_CHECK": "0", "WEIGHTCHECK_DIR": str(tmp_path)}) is None
    thing = object()
    for instrument in (miles_instrument, slime_instrument, verl_instrument):
        assert instrument(thing, None) is thing
    monitor = SyncMonitor.from_env({"WEIGHTCHECK_SYNC_CHECK": "1", "WEIGHTCHECK_DIR": str(tmp_path)})
    assert monitor is not None and monitor.manifests == tmp_path / "manifests" and monitor.records == tmp_path
    assert (monitor.pp_size, monitor.ep_size, monitor.strict) == (1, 1, False)


def test_part_written_from_the_tensors_sent(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    monitor = SyncMonitor(tmp_path / "m", pp_rank=1, pp_size=2, num_layers=4)
    monitor.begin("step-3", step=3)
    sent = list(monitor.observe([("model.layers.2.mlp.down_proj.weight", torch.ones(2, 2))]))
    assert [n for n, _ in sent] == ["model.layers.2.mlp.down_proj.weight"]
    path = monitor.end()
    assert path == tmp_path / "m" / "step-3" / "manifest-pp1-ep0.json"
    doc = json.loads(path.read_text())
    assert doc["trainer"]["pp_rank"] == 1 and list(doc["tensors"]) == ["model.layers.2.mlp.down_proj.weight"]
    assert monitor.after_sync() is None  # no records directory: parts only, no check


def test_never_breaks_the_sync_unless_strict(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monitor = SyncMonitor(blocker / "manifests", records=tmp_path / "records")
    caplog.set_level(logging.WARNING, "weightcheck.integrations")
    monitor.begin("v1")
    assert list(monitor.observe([("w", torch.zeros(1))]))  # the tensors still flow
    assert monitor.end() is None
    assert any("the sync goes on unchecked" in r.message for r in caplog.records)

    strict = SyncMonitor(blocker / "manifests", strict=True)
    strict.begin("v1")
    strict.add("w", torch.zeros(1))
    with pytest.raises(OSError):
        strict.end()
