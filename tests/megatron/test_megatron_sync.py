"""A real trainer feeding a real engine: megatron-core models at PP = 2 and EP = 2 (two gloo processes each),
exported to HF names by mbridge, streamed into SGLang 0.5.23 model classes with the tap installed by SGLang's
plugin loader, trainer manifest parts written from the same stream; `weightcheck verify` against the
checkpoint and against the manifests.

The planted defects patch the exporter where such bugs live (megatron_harness.py says how). Each trainer group
is started once per module (megatron-core and mbridge imports cost ~30 s a process on 2 cores); the
multi-step test changes the trainer's weights, so it runs last.
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

from megatron_harness import Trainer, serving_config, write_checkpoint  # noqa: E402
from megatron_harness import hf_config as trainer_config  # noqa: E402
from sglang_harness import *  # noqa: E402, F403
from sglang_harness import build_model, fill_pattern  # noqa: E402

from weightcheck import tap  # noqa: E402
from weightcheck.findings import Finding, Result  # noqa: E402
from weightcheck.verify import TrainerLayout, verify  # noqa: E402

pytestmark = pytest.mark.megatron


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


@pytest.fixture(scope="module")
def pp_trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ckpt = write_checkpoint("qwen3", tmp_path_factory.mktemp("megatron-pp") / "qwen3")
    trainer = Trainer("pp", "qwen3", ckpt)
    yield trainer, ckpt
    trainer.close()


@pytest.fixture(scope="module")
def ep_trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ckpt = write_checkpoint("qwen3_moe", tmp_path_factory.mktemp("megatron-ep") / "qwen3_moe")
    trainer = Trainer("ep", "qwen3_moe", ckpt)
    yield trainer, ckpt
    trainer.close()


@pytest.fixture
def engine(plugin_tap: Path) -> Any:
    """`engine(kind)`: an SGLang model of the trainer's architecture, parameters overwritten with a random
    pattern first (as SGLang's checker `reset_tensors` does) so anything a sync misses stands out."""

    def make(kind: str) -> Any:
        model = build_model(kind, trainer_config(kind))
        fill_pattern(model)
        return model

    return make


# ---- PP = 2 -------------------------------------------------------------------------------------------------


def test_pp2_clean_sync_gives_no_finding(pp_trainer: Any, engine: Any, records_dir: Path, tmp_path: Path) -> None:
    trainer, ckpt = pp_trainer
    model = engine("qwen3")
    manifests = tmp_path / "manifests"
    buckets = trainer.sync("step-0", 0, manifests=manifests)
    push(model, buckets, "step-0")

    against_ckpt = verify(records_dir, ckpt, trainer=TrainerLayout(pp_size=2))
    assert against_ckpt.findings == [], messages(against_ckpt)
    assert against_ckpt.checked["tensors"] == 4 * 11 + 3  # 4 layers of 11 HF tensors, embed, norm, lm_head
    against_parts = verify(records_dir, manifests / "step-0")
    assert against_parts.findings == [], messages(against_parts)
    # Each stage wrote the part of what it owns, under global ids.
    parts = {p.name: json.loads(p.read_text()) for p in (manifests / "step-0").glob("*.json")}
    assert set(parts) == {"manifest-pp0-ep0.json", "manifest-pp1-ep0.json"}
    stage1 = parts["manifest-pp1-ep0.json"]["tensors"]
    assert "lm_head.weight" in stage1 and "model.layers.3.mlp.down_proj.weight" in stage1
    assert not any(".layers.0." in n or ".layers.1." in n for n in stage1)
    rc, doc = cli_verify(records_dir, ckpt, "--trainer-pp", "2")
    assert rc == 0 and doc["findings"] == []


def test_pp2_last_stage_without_its_layer_offset(
    pp_trainer: Any, engine: Any, records_dir: Path, tmp_path: Path
) -> None:
    trainer, ckpt = pp_trainer
    model = engine("qwen3")
    manifests = tmp_path / "manifests"
    push(model, trainer.sync("step-1", 1, manifests=manifests, defects=("pp_offset",)), "step-1")

    result = verify(records_dir, ckpt, trainer=TrainerLayout(pp_size=2))
    (shift,) = by_code(result, "WC725")
    assert "layers 0..1 from pp_rank 1 shifted by −2: they hold the data of layers 2..3" in shift.message
    assert "pp_rank 1 sent its local layer ids without its offset 2" in shift.message
    never = {n for f in by_code(result, "WC732") for n in f.details["params"]}
    assert never and all(".layers.2." in n or ".layers.3." in n for n in never)

    # Against the stages' own manifest parts: stage 1's part carries local ids too, and names itself.
    parts = verify(records_dir, manifests / "step-1")
    (shift,) = by_code(parts, "WC725")
    assert "from pp_rank 1 shifted by −2" in shift.message and "manifest part of pp_rank 1" in shift.message

    rc, doc = cli_verify(records_dir, ckpt, "--trainer-pp", "2")
    assert rc == 1 and any(f["code"] == "WC725" and "pp_rank 1" in f["message"] for f in doc["findings"])


# ---- EP = 2 -------------------------------------------------------------------------------------------------


def test_ep2_clean_sync_gives_no_finding(ep_trainer: Any, engine: Any, records_dir: Path, tmp_path: Path) -> None:
    trainer, ckpt = ep_trainer
    model = engine("qwen3_moe")
    manifests = tmp_path / "manifests"
    buckets = trainer.sync("step-0", 0, manifests=manifests)
    assert len(buckets) == 2  # each EP rank sends its own experts
    push(model, buckets, "step-0")

    against_ckpt = verify(records_dir, ckpt, trainer=TrainerLayout(ep_size=2))
    assert against_ckpt.findings == [], messages(against_ckpt)
    against_parts = verify(records_dir, manifests / "step-0")
    assert against_parts.findings == [], messages(against_parts)
    rc, doc = cli_verify(records_dir, manifests / "step-0")
    assert rc == 0 and doc["findings"] == []


def test_ep2_rank_without_its_expert_offset(ep_trainer: Any, engine: Any, records_dir: Path, tmp_path: Path) -> None:
    trainer, ckpt = ep_trainer
    model = engine("qwen3_moe")
    manifests = tmp_path / "manifests"
    push(model, trainer.sync("step-1", 1, manifests=manifests, defects=("ep_offset",)), "step-1")

    result = verify(records_dir, ckpt, trainer=TrainerLayout(ep_size=2))
    (shift,) = by_code(result, "WC726")
    assert "experts 0..1 from ep_rank 1 shifted by −2" in shift.message
    assert "ep_rank 1 sent its local expert ids without its offset 2" in shift.message
    partial = by_code(result, "WC733")
    assert partial and all("local experts 2..3 never written" in f.message for f in partial)

    parts = verify(records_dir, manifests / "step-1")
    (shift,) = by_code(parts, "WC726")
    assert "from ep_rank 1 shifted by −2" in shift.message


def test_router_quantized_online_is_dropped_by_the_engine(
    ep_trainer: Any, engine: Any, records_dir: Path, tmp_path: Path
) -> None:
    trainer, ckpt = ep_trainer
    model = engine("qwen3_moe")
    manifests = tmp_path / "manifests"
    config = serving_config(ckpt, tmp_path / "int4-serving")
    push(model, trainer.sync("step-2", 2, manifests=manifests, serving_config=config), "step-2")

    routers = {f"model.layers.{i}.mlp.gate.weight" for i in (0, 1)}
    packed = {f"model.layers.{i}.mlp.gate.weight_{s}" for i in (0, 1) for s in ("packed", "scale", "shape")}
    for against in (ckpt, manifests / "step-2"):
        result = verify(records_dir, against)
        dropped = by_code(result, "WC731")
        assert {n for f in dropped for n in f.details["names"]} == packed, messages(result)
        assert "quantized tensor for a parameter the engine holds unquantized" in dropped[0].message
        assert {n for f in by_code(result, "WC732") for n in f.details["params"]} == routers
        # Nothing else was touched by the quantizer: its ignore list covered attention, experts, embeddings.
        assert {f.code for f in result.findings} <= {"WC722", "WC723", "WC731", "WC732"}


# ---- every step, not only step 0 (runs last: it trains the PP trainer's weights) --------------------------


def test_three_syncs_defect_only_at_step_2(pp_trainer: Any, engine: Any, records_dir: Path, tmp_path: Path) -> None:
    trainer, ckpt = pp_trainer
    model = engine("qwen3")
    manifests = tmp_path / "manifests"
    push(model, trainer.sync("step-0", 0, manifests=manifests), "step-0")
    push(model, trainer.sync("step-1", 1, manifests=manifests, perturb=True), "step-1")
    push(model, trainer.sync("step-2", 2, manifests=manifests, perturb=True, defects=("pp_offset",)), "step-2")

    layout = TrainerLayout(pp_size=2)
    step0 = verify(records_dir, ckpt, weight_version="step-0", trainer=layout)
    step1 = verify(records_dir, manifests / "step-1", weight_version="step-1")
    step2 = verify(records_dir, manifests / "step-2", weight_version="step-2")
    assert step0.findings == [], messages(step0)
    assert step1.findings == [], messages(step1)
    (shift,) = by_code(step2, "WC725")
    assert "layers 0..1 from pp_rank 1 shifted by −2" in shift.message
    # The weights really changed between syncs: step 1 is not the checkpoint any more.
    assert by_code(verify(records_dir, ckpt, weight_version="step-1"), "WC727")
    # The CLI, step by step, as a shell step after each push would run it.
    assert cli_verify(records_dir, ckpt, "--weight-version", "step-0")[0] == 0
    assert cli_verify(records_dir, manifests / "step-1", "--weight-version", "step-1")[0] == 0
    rc, doc = cli_verify(records_dir, manifests / "step-2", "--weight-version", "step-2")
    assert rc == 1 and {f["code"] for f in doc["findings"]} >= {"WC725"}
