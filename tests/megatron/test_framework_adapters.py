"""The framework adapters (weightcheck.integrations) around stand-ins with the frameworks' call signatures,
feeding a real SGLang model class with the tap on. The lines marked "user lines" are the ones
docs/live-verify.md shows for each framework.

verl, miles and slime are not installed here (docs/live-verify.md says why), so each stand-in reproduces only
the call sequence of the real send point: miles' `WeightTransferProtocol` (begin_sync → send_bucket* →
after_base_weights → finalize → after_engines_resumed), slime's `UpdateWeightFrom*` (`update_weights()` bumps
`weight_version` and sends what its module's `convert_to_hf` returns), verl's `BaseRollout.update_weights`
(an async method taking a generator of HF-named tensors and `global_steps`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

_MISSING = [m for m in ("sglang.srt",) if importlib.util.find_spec(m) is None]
if _MISSING and os.environ.get("WEIGHTCHECK_REQUIRE_MEGATRON"):
    raise ImportError(f"not installed: {', '.join(_MISSING)}")
if _MISSING:
    pytest.skip(f"not installed: {', '.join(_MISSING)}", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang"))

from sglang_harness import *  # noqa: E402, F403

from weightcheck import tap  # noqa: E402
from weightcheck.verifying import WeightSyncError  # noqa: E402

pytestmark = pytest.mark.megatron


def convert_to_hf(args: Any, model_name: str, name: str, param: Any, quantization_config: Any = None) -> list:
    """The stand-in of slime's converter (module-level, as in slime's update modules): names are HF already."""
    return [(name, param)]


class StandInSlimUpdater:
    """slime `UpdateWeightFromTensor` / `UpdateWeightFromDistributed`: `update_weights()` bumps the version,
    converts every parameter with this module's `convert_to_hf` and sends the result."""

    def __init__(self, model: Any, stream: Any) -> None:
        self.model, self.stream, self.weight_version = model, stream, 0

    def update_weights(self) -> None:
        self.weight_version += 1
        with tap.sync(str(self.weight_version), source="session"):
            for name, param in self.stream():
                self.model.load_weights(iter(convert_to_hf(None, "qwen3", name, param, None)))


class StandInProtocol:
    """miles `WeightTransferProtocol`, colocated flavour: each bucket one load_weights call in a session."""

    is_sender = True

    def __init__(self, model: Any) -> None:
        self.model = model

    def begin_sync(self, weight_version: int, iter_buckets: Any) -> bool:
        tap.begin_sync(source="session", weight_version=str(weight_version))
        return True

    def send_bucket(self, bucket: list[tuple[str, Any]]) -> None:
        self.model.load_weights(iter(bucket))

    def after_base_weights(self) -> None:
        pass

    def finalize(self, weight_version: int) -> None:
        tap.end_sync()

    def after_engines_resumed(self) -> None:
        pass


def miles_updater_sync(protocol: Any, weight_version: int, stream: list[tuple[str, Any]]) -> None:
    """The order miles' updater drives a protocol in (`updater.py`)."""
    buckets = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    if not protocol.begin_sync(weight_version, lambda: iter(buckets)):
        return
    for bucket in buckets:
        protocol.send_bucket(bucket)
    protocol.after_base_weights()
    protocol.finalize(weight_version)
    protocol.after_engines_resumed()


class StandInRollout:
    """verl `ServerAdapter.update_weights(weights, global_steps=None, **kwargs)`: consumes the generator in
    buckets, one load_weights call each, in one session."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def update_weights(self, weights: Any, global_steps: int | None = None, **kwargs: Any) -> None:
        with tap.sync(None, source="session"):
            bucket: list[tuple[str, Any]] = []
            for item in weights:
                bucket.append(item)
                if len(bucket) == 7:
                    self.model.load_weights(iter(bucket))
                    bucket = []
            if bucket:
                self.model.load_weights(iter(bucket))


@pytest.fixture
def setup(harness: Any, checkpoints: Any, records_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An SGLang Qwen3 engine with the tap recording into `records_dir`, the checkpoint it serves, three
    "training steps" of weights (step 0 = the checkpoint), and the environment a user sets."""
    ckpt = checkpoints("qwen3")
    model = harness.build_model("qwen3", harness.tiny_config("qwen3"))
    harness.fill_pattern(model)
    base = harness.checkpoint_stream(ckpt)
    steps = [base] + [[(n, (t.float() + 0.01 * k).to(t.dtype)) for n, t in base] for k in (1, 2)]
    monkeypatch.setenv("WEIGHTCHECK_SYNC_CHECK", "1")
    monkeypatch.setenv("WEIGHTCHECK_DIR", str(records_dir))
    monkeypatch.setenv("WEIGHTCHECK_MANIFESTS", str(tmp_path / "manifests"))
    monkeypatch.setenv("WEIGHTCHECK_REFERENCE", str(ckpt))
    return model, steps


WITHHELD = "model.layers.1.mlp.down_proj.weight"


def _without(stream: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(n, t) for n, t in stream if n != WITHHELD]


def _assert_checked(monitor: Any, caplog: pytest.LogCaptureFixture) -> None:
    (_, r0), (_, r1), (_, r2) = monitor.results
    assert r0.findings == [] and r1.findings == [], [f.message for f in r0.findings + r1.findings]
    # Against the step's own manifest the withheld tensor was never sent, so the engine's parameter is what
    # is wrong: never written.
    assert {n for f in r2.findings if f.code == "WC732" for n in f.details["params"]} == {WITHHELD}
    assert any("weight sync" in r.message and "is wrong" in r.message for r in caplog.records)


def test_miles_send_bucket(setup: Any, caplog: pytest.LogCaptureFixture) -> None:
    model, steps = setup
    # user lines (miles)
    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.miles import instrument

    monitor = SyncMonitor.from_env()
    protocol = instrument(StandInProtocol(model), monitor)
    # end of user lines
    caplog.set_level(logging.INFO, "weightcheck.integrations")
    for version, stream in enumerate(steps):
        miles_updater_sync(protocol, version, _without(stream) if version == 2 else stream)  # the sync goes on
    _assert_checked(monitor, caplog)
    assert (Path(os.environ["WEIGHTCHECK_MANIFESTS"]) / "2" / "manifest-pp0-ep0.json").is_file()


def test_slime_update_weight_class(setup: Any, caplog: pytest.LogCaptureFixture) -> None:
    model, steps = setup
    current: dict[str, Any] = {"stream": steps[0]}
    updater = StandInSlimUpdater(model, lambda: current["stream"])
    # user lines (slime)
    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.slime import instrument

    monitor = SyncMonitor.from_env()
    updater = instrument(updater, monitor)
    # end of user lines
    caplog.set_level(logging.INFO, "weightcheck.integrations")
    try:
        for k, stream in enumerate(steps):
            current["stream"] = _without(stream) if k == 2 else stream
            updater.update_weights()
    finally:
        sys.modules[__name__].convert_to_hf = convert_to_hf.__wrapped__  # type: ignore[attr-defined]
    _assert_checked(monitor, caplog)
    assert [v for v, _ in monitor.results] == ["1", "2", "3"]


def test_verl_rollout_update_weights(setup: Any, caplog: pytest.LogCaptureFixture) -> None:
    model, steps = setup
    # user lines (verl)
    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.verl import instrument

    monitor = SyncMonitor.from_env(pp_rank=0, pp_size=1, ep_rank=0, ep_size=1)
    rollout = instrument(StandInRollout(model), monitor)
    # end of user lines
    caplog.set_level(logging.INFO, "weightcheck.integrations")
    for step, stream in enumerate(steps):
        asyncio.run(rollout.update_weights(iter(_without(stream) if step == 2 else stream), global_steps=step))
    _assert_checked(monitor, caplog)


def test_strict_mode_raises_and_off_by_default(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, steps = setup
    from weightcheck.integrations import SyncMonitor
    from weightcheck.integrations.miles import instrument

    monkeypatch.setenv("WEIGHTCHECK_SYNC_STRICT", "1")
    protocol = instrument(StandInProtocol(model), SyncMonitor.from_env())
    with pytest.raises(WeightSyncError) as err:
        miles_updater_sync(protocol, 0, _without(steps[0]))
    assert any(f.code == "WC722" for f in err.value.result.findings)  # step 0: against the checkpoint

    monkeypatch.delenv("WEIGHTCHECK_SYNC_CHECK")
    plain = StandInProtocol(model)
    assert SyncMonitor.from_env() is None and instrument(plain, SyncMonitor.from_env()) is plain
    assert "send_bucket" not in vars(plain)
