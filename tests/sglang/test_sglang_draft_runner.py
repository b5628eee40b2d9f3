"""A target and a draft (MTP/NextN) runner in one engine process, fed one stream through SGLang 0.5.23's own
`SchedulerWeightUpdaterManager` fan-out (target runner, then the speculative worker's draft runner, with the same
deserialized payload): DeepSeek-V3 as the target and SGLang's `DeepseekV3ForCausalLMNextN` as the draft.

The draft keeps only its MTP layer (`model.layers.{num_hidden_layers}.*`, remapped to `model.decoder.*`) and drops
every other name by design; the target drops the MTP layer. The tap writes one record per runner
(`"runner": "draft"` in the draft's header) and verify judges each runner on its own records: neither by-design
drop is reported, and a defect in the MTP layer is named on the draft. What is stubbed is the same as in
test_sglang_sync_paths.py (the worker/ModelRunner shells and the CUDA-IPC serialization, which need a GPU).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("WEIGHTCHECK_REQUIRE_SGLANG"):
    import sglang.srt  # noqa: F401
else:
    pytest.importorskip("sglang.srt")

import test_sglang_sync_paths as paths
from sglang_harness import *  # noqa: F403

from weightcheck import tap
from weightcheck.verifying import verify

pytestmark = pytest.mark.sglang


def mtp_checkpoint(harness: Any, ckpt: Path, tmp: Path) -> tuple[Path, list[tuple[str, Any]]]:
    """The target's checkpoint plus DeepSeek's MTP layer (layer id = num_hidden_layers: a decoder layer and the
    eh_proj/enorm/hnorm/shared_head.norm tensors), as a second safetensors file, and the full stream."""
    import torch
    from safetensors.torch import save_file

    stream = harness.checkpoint_stream(ckpt)
    generator = torch.Generator().manual_seed(99)
    mtp = {
        name.replace("model.layers.2.", "model.layers.3."): torch.rand(t.shape, generator=generator).to(t.dtype)
        for name, t in stream
        if name.startswith("model.layers.2.")
    }
    hidden = 64
    for name, shape in (
        ("eh_proj.weight", (hidden, 2 * hidden)),
        ("enorm.weight", (hidden,)),
        ("hnorm.weight", (hidden,)),
        ("shared_head.norm.weight", (hidden,)),
    ):
        mtp[f"model.layers.3.{name}"] = torch.rand(shape, generator=generator)
    full = tmp / "deepseek-mtp"
    shutil.copytree(ckpt, full)
    save_file(mtp, str(full / "mtp.safetensors"))
    return full, stream + list(mtp.items())


@pytest.fixture
def pair(plugin_tap: Path, harness: Any, checkpoints: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import torch
    from sglang.srt.models.deepseek_nextn import DeepseekV3ForCausalLMNextN

    # set_embed_and_head ends with torch.cuda.empty_cache()/synchronize(), which raise without a GPU.
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    ckpt = checkpoints("deepseek_v3")
    reference, stream = mtp_checkpoint(harness, ckpt, tmp_path)
    config = harness.tiny_config("deepseek_v3", num_nextn_predict_layers=1)
    target = harness.build_model("deepseek_v3", config)
    draft = DeepseekV3ForCausalLMNextN(config)
    tap.wrap(draft)  # the plugin taps the served class; the draft class is tapped on its instance
    for model in (target, draft):
        harness.fill_pattern(model)
    # What SGLang's EAGLE/MTP worker does at startup: the draft uses the target's embedding and head tensors.
    draft.set_embed_and_head(*target.get_embed_and_head())
    target.load_weights(iter(harness.checkpoint_stream(ckpt)))  # the startup load: the tap's served model
    assert tap.runner_of(target) == "target" and tap.runner_of(draft) == "draft"
    yield paths.Stack(target, ckpt, draft=draft), reference, stream
    tap.unwrap(draft)


def test_target_and_draft_clean_then_mtp_defect_named(records_dir: Path, pair: Any) -> None:
    stack, reference, stream = pair
    with stack.session():
        for bucket in paths.buckets(stream, 2):
            stack.tensor_update(bucket, "step-1", load_format="flattened_bucket")
    files = sorted(p.name for p in (records_dir / "sync-00001").glob("*.jsonl"))
    assert len(files) == 2 and sum(".draft." in f for f in files) == 1, files
    draft_record = tap.read_record(next((records_dir / "sync-00001").glob("*.draft.jsonl")))
    assert draft_record.runner == "draft" and draft_record.model["class"] == "DeepseekV3ForCausalLMNextN"
    assert draft_record.params["model.eh_proj.weight"].writes == 1
    result = verify(records_dir, reference, weight_version="step-1")
    assert result.findings == [], [f.message for f in result.findings]

    # The trainer forgets the MTP layer's eh_proj: missing from the stream, and never written on the draft.
    lost = "model.layers.3.eh_proj.weight"
    with stack.session():
        for bucket in paths.buckets([(n, t) for n, t in stream if n != lost], 2):
            stack.tensor_update(bucket, "step-2", load_format="flattened_bucket")
    result = verify(records_dir, reference, weight_version="step-2")
    assert {n for f in paths.by_code(result, "WC722") for n in f.details["names"]} == {lost}
    # One defect, one finding: the draft's unwritten parameter is attached to the missing tensor (related).
    (never,) = [r for f in paths.by_code(result, "WC722") for r in f.related if r.code == "WC732"]
    assert never.details["params"] == ["model.eh_proj.weight"] and "[draft]" in never.message
    assert paths.serious(result) == {"WC722"}, [f.message for f in result.findings]


def test_records_without_runner_field_read_as_target(records_dir: Path, pair: Any) -> None:
    """Records written before runners existed have no `runner` field: they read as the target's."""
    stack, _, stream = pair
    with stack.session():
        stack.tensor_update(stream, "step-1")
    for path in (records_dir / "sync-00001").glob("*.jsonl"):
        if ".draft." not in path.name:
            assert "runner" not in tap.read_record(path).header
            assert tap.read_record(path).runner == "target"
