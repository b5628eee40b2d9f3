"""EP = 2: megatron-core Qwen3-MoE (4 experts) in two gloo processes; each EP rank sends its own experts,
named by mbridge's rank-local map (replicated weights from EP rank 0), into SGLang's Qwen3MoeForCausalLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from megatron_harness import Trainer, serving_config, write_checkpoint
from sync_common import *  # noqa: F403
from sync_common import by_code, cli_verify, messages, push

from weightcheck.verifying import TrainerLayout, verify

pytestmark = pytest.mark.megatron


@pytest.fixture(scope="module")
def ep_trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ckpt = write_checkpoint("qwen3_moe", tmp_path_factory.mktemp("megatron-ep") / "qwen3_moe")
    trainer = Trainer("ep", "qwen3_moe", ckpt)
    yield trainer, ckpt
    trainer.close()


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
        # Top level, or attached to the WC722 of the routers' tensors never sent (one defect, one finding).
        never = [f for top in result.findings for f in (top, *top.related) if f.code == "WC732"]
        assert {n for f in never for n in f.details["params"]} == routers
        # Nothing else was touched by the quantizer: its ignore list covered attention, experts, embeddings.
        assert {f.code for f in result.findings} <= {"WC722", "WC723", "WC731", "WC732"}
