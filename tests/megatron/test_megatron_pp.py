"""PP = 2: megatron-core Qwen3 (4 layers) in two gloo processes, exported by mbridge's `Bridge.export_weights`
(every stage's tensors broadcast to stage 0, which sends the stream), into SGLang's Qwen3ForCausalLM.
The trainer is started once for the module (megatron-core and mbridge imports cost ~30 s a process on 2
cores); the multi-step test trains its weights, so it runs last."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from megatron_harness import Trainer, write_checkpoint
from sync_common import *  # noqa: F403
from sync_common import by_code, cli_verify, messages, push

from weightcheck.verifying import TrainerLayout, verify

pytestmark = pytest.mark.megatron


@pytest.fixture(scope="module")
def pp_trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ckpt = write_checkpoint("qwen3", tmp_path_factory.mktemp("megatron-pp") / "qwen3")
    trainer = Trainer("pp", "qwen3", ckpt)
    yield trainer, ckpt
    trainer.close()


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
    # Top level or attached to the WC722 of the tensors never sent under their names (one defect, one finding).
    never = {n for top in result.findings for f in (top, *top.related) if f.code == "WC732"
             for n in f.details["params"]}  # fmt: skip
    assert never and all(".layers.2." in n or ".layers.3." in n for n in never)

    # Against the stages' own manifest parts: stage 1's part carries local ids too, and names itself.
    parts = verify(records_dir, manifests / "step-1")
    (shift,) = by_code(parts, "WC725")
    assert "from pp_rank 1 shifted by −2" in shift.message and "manifest part of pp_rank 1" in shift.message

    rc, doc = cli_verify(records_dir, ckpt, "--trainer-pp", "2")
    assert rc == 1 and any(f["code"] == "WC725" and "pp_rank 1" in f["message"] for f in doc["findings"])


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
