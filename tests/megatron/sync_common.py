"""A real trainer feeding a real engine: megatron-core models at PP = 2 and EP = 2 (two gloo processes each),
exported to HF names by mbridge, streamed into SGLang 0.5.23 model classes with the tap installed by SGLang's
plugin loader, trainer manifest parts written from the same stream; `weightcheck verify` against the
checkpoint and against the manifests.

The planted defects patch the exporter where such bugs live (megatron_harness.py says how). Shared by
test_megatron_pp.py and test_megatron_ep.py; not a conftest.py (see tests/sglang/sglang_harness.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# megatron-core and mbridge are imported in the trainer processes only; here it is enough that they are there.
_MISSING = [m for m in ("sglang.srt", "megatron.core", "mbridge") if importlib.util.find_spec(m) is None]
if _MISSING and os.environ.get("WEIGHTCHECK_REQUIRE_MEGATRON"):  # the CI group: a broken install fails
    raise ImportError(f"not installed: {', '.join(_MISSING)}")
if _MISSING:
    pytest.skip(f"not installed: {', '.join(_MISSING)}", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang"))

from megatron_harness import hf_config as trainer_config  # noqa: E402
from sglang_harness import *  # noqa: E402, F403
from sglang_harness import build_model, fill_pattern  # noqa: E402

from weightcheck import tap  # noqa: E402
from weightcheck.findings import Finding, Result  # noqa: E402


def by_code(result: Result, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


def messages(result: Result) -> list[str]:
    return [f"{f.code} {f.message}" for f in result.findings]


def push(model: Any, buckets: list[list[tuple[str, Any]]], version: str) -> None:
    """One sync (SGLang's begin/end weight-update session), each trainer rank's stream one load_weights call."""
    with tap.sync(version, source="session"):
        for bucket in buckets:
            model.load_weights(item for item in bucket)


def cli_verify(records: Path, against: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """`weightcheck verify` as a user runs it."""
    command = [sys.executable, "-m", "weightcheck", "verify", str(records), "--against", str(against)]
    proc = subprocess.run(
        [*command, "--format", "json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def engine(plugin_tap: Path) -> Any:
    """`engine(kind)`: an SGLang model of the trainer's architecture, parameters overwritten with a random
    pattern first (as SGLang's checker `reset_tensors` does) so anything a sync misses stands out."""

    def make(kind: str) -> Any:
        model = build_model(kind, trainer_config(kind))
        fill_pattern(model)
        return model

    return make
