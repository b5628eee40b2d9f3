"""Issue #19 item 9 for `weightcheck rollout` / `weightcheck doctor` (WC800–WC813, WC850): each bad input is
written by the real-writer fixtures (tests/rollout_fixtures.py: slime / miles dumps of the tiny trained
Qwen2, the session fixture `rollout_world`), the change the finding's fix text prescribes is made to the
run (the dump regenerated with the template applied once, the reference computed from the actor's weights,
the missing rank file given, a load dir holding the tracker file...), and rollout/doctor run again through
the Python API: the code must be gone, no new error may appear, and the fix text must contain the words
the test applied. The codes whose texts are a diagnosis or an environment remedy no test can rerun are
EXCLUDED in tests/test_fix_texts_all.py, with the reason."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rollout_fixtures as rf
import torch

from weightcheck import api
from weightcheck.checkup import OK
from weightcheck.findings import Finding, Result, Severity

World = dict[str, Any]


def _errors(result: Result) -> set[str]:
    return {f.code for f in result.findings if f.severity == Severity.ERROR}


def _of(result: Result, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


def _dump(path: Path, samples: list[dict[str, Any]], name: str = "0.pt") -> Path:
    """A rollout dump as slime's save_debug_rollout_data writes it."""
    (path / "rollout_data").mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": 0, "samples": samples}, path / "rollout_data" / name)
    return path


def _reward(sample: dict[str, Any]) -> float:
    """The fixture's reward function, read from the right key: 1 when the response is the label."""
    return 1.0 if sample["response"] == sample["label"] else 0.0


@dataclass(frozen=True)
class RolloutCase:
    codes: tuple[str, ...]  # the codes this one bad run raises and this one fix clears
    # (world, dir) -> the dumps of the bad run
    bad: Callable[[World, Path], Path]
    # (world, bad dumps, dir) -> the dumps of the run with the fix text's change made
    fixed: Callable[[World, Path, Path], Path]
    said: str  # words of the fix text this application follows


# ---- the bad runs and their fixed reruns -----------------------------------------------------------------
def _unsafe(world: World, path: Path) -> Path:
    samples = [dict(s) for s in world["clean"].samples]
    samples[0]["metadata"] = {"adapter": argparse.Namespace(name="lora-a")}  # a custom hook's object
    return _dump(path, samples)


def _unsafe_as_dict(world: World, bad: Path, path: Path) -> Path:
    """The custom hook converts its object to a dict before the dump, as the text says."""
    samples = [dict(s) for s in world["clean"].samples]
    samples[0]["metadata"] = {"adapter": vars(argparse.Namespace(name="lora-a"))}
    return _dump(path, samples)


def _jitter(world: World, path: Path) -> Path:
    return rf.write_relax(world["jitter"], path)


def _deterministic_reference(world: World, bad: Path, path: Path) -> Path:
    """Deterministic kernels: the reference forward runs the same (fp32) kernels as the actor's."""
    return rf.write_relax(rf.with_reference(world["jitter"], world["model"]), path)


def _perturbed(world: World, path: Path) -> Path:
    return rf.write_miles(world["perturbed"], path)


def _same_step0_weights(world: World, bad: Path, path: Path) -> Path:
    """--ref-load pointed at the actor's step-0 weights: the reference is computed with them."""
    return rf.write_miles(rf.with_reference(world["perturbed"], world["model"]), path)


def _swapped(world: World, path: Path) -> Path:
    return rf.write_slime(world["swapped"], path)


def _parallelism_rechecked(world: World, bad: Path, path: Path) -> Path:
    """The reference's TP shards assembled in the right order: its head is the actor's head again."""
    return rf.write_slime(rf.with_reference(world["swapped"], world["model"]), path)


def _shifted_engine(world: World, path: Path) -> Path:
    return rf.write_slime(world["shifted_engine"], path)


def _resynced(world: World, bad: Path, path: Path) -> Path:
    """The sync fixed (verify names the layer that landed under the wrong name): the engine samples with the
    trainer's weights."""
    return rf.write_slime(rf.served_by(world["model"], world["model"], seed=1), path)


def _retemplated(world: World, path: Path) -> Path:
    return rf.write_slime(world["retemplated"], path)


def _templated_once(world: World, bad: Path, path: Path) -> Path:
    """Raw messages, the template applied once by the framework; the same sampling seed as the bad run."""
    return rf.write_slime(rf.make_rollout(world["model"], retemplated=False, seed=1), path)


def _nan_reward(world: World, path: Path) -> Path:
    samples = [dict(s) for s in world["clean"].samples]
    samples[5]["reward"] = float("nan")  # a reward function that divides by an empty count
    return _dump(path, samples)


def _reward_fixed(world: World, bad: Path, path: Path) -> Path:
    samples = [dict(s) for s in world["clean"].samples]
    for s in samples:
        s["reward"] = _reward(s)
    return _dump(path, samples)


def _wrong_label_key(world: World, path: Path) -> Path:
    """A --label-key typo: every sample's label lookup finds nothing, every reward is 0."""
    return _dump(path, [dict(s, reward=0.0) for s in world["clean"].samples])


def _short_mask(world: World, path: Path) -> Path:
    samples = [dict(s) for s in world["clean"].samples]
    samples[2]["loss_mask"] = samples[2]["loss_mask"][:-1]
    return _dump(path, samples)


def _mask_per_token(world: World, bad: Path, path: Path) -> Path:
    """The generate function builds loss_mask with one entry per response token."""
    samples = [dict(s) for s in world["clean"].samples]
    samples[2]["loss_mask"] = [1] * samples[2]["response_length"]
    return _dump(path, samples)


def _missing_cp_rank(world: World, path: Path) -> Path:
    root = rf.write_miles(world["clean"], path, tp=1, cp=2)
    kept = path.parent / f"{path.name}-rank1.pt"
    shutil.move(root / "train_data" / "0_1.pt", kept)  # one rank's file left out of what was given
    return root


def _every_rank_given(world: World, bad: Path, path: Path) -> Path:
    shutil.copytree(bad, path)
    shutil.copy(bad.parent / f"{bad.name}-rank1.pt", path / "train_data" / "0_1.pt")
    return path


ROLLOUT_CASES = [
    RolloutCase(("WC800",), _unsafe, _unsafe_as_dict, "convert to dicts or strings before the dump"),
    RolloutCase(("WC801",), _jitter, _deterministic_reference, "Force deterministic kernels"),
    RolloutCase(("WC802",), _perturbed, _same_step0_weights, "Point --ref-load and --load at the same step-0 weights"),
    RolloutCase(("WC803",), _swapped, _parallelism_rechecked, "Re-check parallelism (TP/PP/CP/EP sizes"),
    RolloutCase(("WC804",), _shifted_engine, _resynced, "fix the names it reports and sync again"),
    RolloutCase(("WC805",), _retemplated, _templated_once, "do not template data that is already templated"),
    RolloutCase(("WC806",), _retemplated, _templated_once, "let the framework apply the template once"),
    RolloutCase(("WC808",), _retemplated, _templated_once, "check the chat template"),
    RolloutCase(("WC810",), _nan_reward, _reward_fixed, "Fix the reward function"),
    RolloutCase(("WC811",), _wrong_label_key, _reward_fixed, "--label-key"),
    RolloutCase(("WC812",), _short_mask, _mask_per_token, "one entry per response token"),
    RolloutCase(("WC813",), _missing_cp_rank, _every_rank_given, "Give every rank's file"),
]
# WC850 (doctor) is applied in test_wc850_fix_text_applied below.
APPLIED_HERE = {c for case in ROLLOUT_CASES for c in case.codes} | {"WC850"}


@pytest.mark.parametrize("case", ROLLOUT_CASES, ids=lambda c: "+".join(c.codes))
def test_rollout_fix_text_applied_clears_the_finding(rollout_world: World, tmp_path: Path, case: RolloutCase) -> None:
    bad = case.bad(rollout_world, tmp_path / "bad")
    before = api.rollout(bad, config=False)
    for code in case.codes:
        found = _of(before, code)
        assert found, f"{code} did not fire on its bad run: {[f.code for f in before.findings]}"
        assert case.said in found[0].fix, (code, found[0].fix)
    after = api.rollout(case.fixed(rollout_world, bad, tmp_path / "fixed"), config=False)
    assert not after.nothing_checked
    left = [(f.code, f.message) for f in after.findings if f.code in case.codes]
    assert not left, f"applying the fix text of {case.codes} left: {left}"
    new = _errors(after) - _errors(before)
    assert not new, f"applying the fix text of {case.codes} introduced errors: {new}"
    # Nothing new of any severity either (what stays, e.g. WC811 on a batch whose groups are constant, was
    # there before the fix and is not what the text addresses).
    assert not {f.code for f in after.findings} - {f.code for f in before.findings}


# Megatron-LM's lines (megatron/training/checkpointing.py), as tests/test_doctor.py's trainer log holds them.
_NOT_LOADED = (
    "WARNING: could not find the metadata file /ckpt/torch_dist/latest_checkpointed_iteration.txt\n"
    "    will not load any checkpoints and will start from random\n"
)
_LOADED = "  successfully loaded checkpoint from {load} [ t 1/1, p 1/1 ] at iteration 0\n"


def test_wc850_fix_text_applied(tmp_path: Path) -> None:
    """WC850: the run pointed --load at a directory without latest_checkpointed_iteration.txt and started
    from random. The text: point --load at a directory holding that file. Done: the load dir gets the tracker
    (Megatron's checkpoint of iteration 0), and the rerun's trainer log holds the line Megatron prints when
    it loads from it; doctor's checkpoint-loaded line then turns OK."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "trainer.log").write_text(_NOT_LOADED)
    (run / "load").mkdir()
    before, _ = api.doctor(run, config=False)
    found = _of(before, "WC850")
    assert found, [f.code for f in before.findings]
    assert "Point --load / --ref-load at a directory holding latest_checkpointed_iteration.txt" in found[0].fix

    (run / "load" / "latest_checkpointed_iteration.txt").write_text("0\n")
    (run / "logs" / "trainer.log").write_text(_LOADED.format(load=run / "load"))
    after, lines = api.doctor(run, config=False)
    assert not _of(after, "WC850"), [f.message for f in _of(after, "WC850")]
    assert not _errors(after) - _errors(before)
    assert next(line for line in lines if line.key == "checkpoint-loaded").verdict == OK


def test_the_meta_test_knows_these_codes() -> None:
    """tests/test_fix_texts_all.py's registry lists exactly the rollout/doctor codes applied here."""
    from test_fix_texts_all import APPLIED_ELSEWHERE, EXCLUDED, NOT_YET

    assert {c for c in APPLIED_ELSEWHERE if c.startswith("WC8")} == APPLIED_HERE
    assert not APPLIED_HERE & (set(EXCLUDED) | set(NOT_YET))


def test_wc802_diff_the_text_names_points_at_the_reference_layer(rollout_world: World, tmp_path: Path) -> None:
    """WC802's text names `weightcheck diff REF ACTOR` to find where --ref-load and --load differ: on the
    saved actor and the reference of the bad run it names the one layer that differs; once --ref-load points
    at the actor's weights (the applied fix above) the diff is clean."""
    model = rollout_world["model"]
    actor = tmp_path / "actor"
    model.save_pretrained(actor)
    ref = tmp_path / "ref"
    rf.perturbed(model, layer=1, scale=rollout_world["perturbed_scale"]).save_pretrained(ref)  # world["perturbed"]'s
    differing = {f.location.tensor for f in api.diff(ref, actor, config=False).findings if f.location.tensor}
    assert differing == {"model.layers.1.mlp.down_proj.weight"}, differing
    assert api.diff(actor, actor, config=False).findings == []
