"""`weightcheck rollout` on slime / miles / Relax debug dumps written as each framework writes them, with
log-probs from a tiny real transformers model (tests/rollout_fixtures.py names the source commits read).

Each case states what the framework's own step-0 assertion would say (computed here from the same
numbers, independently of weightcheck) and checks that weightcheck gives that verdict plus a diagnosis.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import rollout_fixtures as rf
import torch
from click.testing import CliRunner

from weightcheck.cli import cli
from weightcheck.findings import Result, Severity
from weightcheck.rollouts import Thresholds, check_rollout


def codes(result: Result) -> set[str]:
    return {f.code for f in result.findings}


def by_code(result: Result, code: str) -> list[Any]:
    return [f for f in result.findings if f.code == code]


WRITERS = {"slime": rf.write_slime, "miles": rf.write_miles, "relax": rf.write_relax}


@pytest.mark.parametrize("framework", sorted(WRITERS))
def test_clean_dumps_are_clean(rollout_world: dict[str, Any], tmp_path: Path, framework: str) -> None:
    root = WRITERS[framework](rollout_world["clean"], tmp_path / framework)
    step0 = rf.framework_step0(rollout_world["clean"])
    assert step0["ref_diff"] == 0.0 and step0["train_rollout_abs_diff"] <= 0.1  # slime/miles would pass
    result = check_rollout(root)
    assert result.findings == [], [f.message for f in result.findings]
    assert result.exit_code() == 0 and not result.nothing_checked
    assert result.checked["step1_samples"] == len(rollout_world["clean"].samples)
    assert result.checked["train_rollout_samples"] == len(rollout_world["clean"].samples)


def test_miles_cp_slices_are_put_back_in_order(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    """TP replicas dropped and zigzag CP slices reassembled: the merged values are the unsliced ones."""
    from weightcheck.rollouts.readers import read_dumps

    root = rf.write_miles(rollout_world["perturbed"], tmp_path / "m", tp=2, cp=2)
    dumps = read_dumps(sorted((root / "train_data").glob("*.pt")))
    assert not dumps.problems
    (train,) = dumps.trains
    assert [s.position for s in train.samples] == list(range(len(rollout_world["clean"].samples)))
    expected_all = zip(rollout_world["perturbed"].log_probs, rollout_world["perturbed"].ref_log_probs, strict=True)
    for sample, (expected, ref) in zip(train.samples, expected_all, strict=True):
        assert sample.log_probs == pytest.approx(expected, abs=0) and sample.ref_log_probs == pytest.approx(ref, abs=0)


def test_miles_missing_cp_rank_is_reported(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    root = rf.write_miles(rollout_world["clean"], tmp_path / "m", tp=1, cp=2)
    (root / "train_data" / "0_1.pt").unlink()
    result = check_rollout(root)
    assert "WC813" in codes(result) and "CP ranks [1] of 2 missing" in by_code(result, "WC813")[0].message


def test_template_mismatch_is_diagnosed(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    bad = rollout_world["retemplated"]
    step0 = rf.framework_step0(bad)
    # slime's CI sanity bound (-1 < mean log_probs < 0) fails on this rollout; KL is still 0.
    assert step0["mean_log_probs"] < -1 and step0["ref_diff"] == 0.0
    result = check_rollout(rf.write_slime(bad, tmp_path / "s"))
    (elevated,) = by_code(result, "WC805")
    assert elevated.severity == Severity.ERROR and "chat-template-mismatch signature" in elevated.message
    assert "chat template" in elevated.details["cause"]
    (double,) = by_code(result, "WC806")
    assert "'<|im_start|>system' appears 2 times" in double.message
    assert "WC808" in codes(result)  # the confused model never emits its stop token
    assert not codes(result) & {"WC801", "WC802", "WC803", "WC804"}  # weights are fine
    assert result.exit_code() == 1


def test_reference_differing_in_one_layer(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    data = rollout_world["perturbed"]
    step0 = rf.framework_step0(data)
    assert step0["ref_diff"] >= 1e-8 and 1e-4 <= step0["kl"] <= 1  # slime/miles would fail; above jitter
    result = check_rollout(rf.write_miles(data, tmp_path / "m"))
    (finding,) = by_code(result, "WC802")
    assert finding.details["framework_assertion"] == "fails"
    assert finding.details["kl"] == pytest.approx(step0["kl"], rel=1e-6)
    assert "reference model differs" in finding.details["cause"]
    assert finding.details["samples"] and all(finding.details["positions"].values())
    assert "token" in (finding.location.tensor or "")
    assert codes(result) == {"WC802"}


def test_jitter_gets_the_framework_verdict(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    data = rollout_world["jitter"]
    step0 = rf.framework_step0(data)
    assert 0 < step0["kl"] < 1e-4 and data.log_probs != data.ref_log_probs
    result = check_rollout(rf.write_relax(data, tmp_path / "r"))
    (finding,) = by_code(result, "WC801")
    fails = step0["ref_diff"] >= 1e-8  # what slime's and miles' assertion decide
    assert finding.details["framework_assertion"] == ("fails" if fails else "passes")
    assert finding.severity == (Severity.ERROR if fails else Severity.WARNING)
    assert "non-deterministic kernels" in finding.details["cause"]
    # A user who accepts this jitter raises the tolerance: then only single tokens differ (a warning).
    relaxed = check_rollout(tmp_path / "r", Thresholds(ref_tol=0.1))
    assert by_code(relaxed, "WC801")[0].severity == Severity.WARNING


def test_configuration_error_is_large_kl(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    data = rollout_world["swapped"]
    assert rf.framework_step0(data)["kl"] > 1
    result = check_rollout(rf.write_slime(data, tmp_path / "s"))
    (finding,) = by_code(result, "WC803")
    assert "configuration error" in finding.details["cause"]


def test_engine_serving_other_weights_is_a_train_rollout_diff(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    data = rollout_world["shifted_engine"]
    step0 = rf.framework_step0(data)
    assert step0["train_rollout_abs_diff"] > 0.1  # slime's --ci-train-rollout-logprob-abs-diff-threshold fails
    result = check_rollout(rf.write_slime(data, tmp_path / "s"))
    (finding,) = by_code(result, "WC804")
    assert finding.details["abs_diff"] == pytest.approx(step0["train_rollout_abs_diff"], rel=1e-6)
    assert "weight sync" in finding.details["cause"]
    assert "WC802" not in codes(result) and "WC803" not in codes(result)  # actor == reference


def test_dump_needing_an_arbitrary_class_is_refused_with_the_class_named(
    rollout_world: dict[str, Any], tmp_path: Path
) -> None:
    samples = [dict(s) for s in rollout_world["clean"].samples]
    samples[0]["metadata"] = {"adapter": argparse.Namespace(name="lora-a")}  # any object a custom hook stores
    (tmp_path / "rollout_data").mkdir()
    torch.save({"rollout_id": 0, "samples": samples}, tmp_path / "rollout_data" / "0.pt")
    result = check_rollout(tmp_path)
    (finding,) = by_code(result, "WC800")
    assert "argparse.Namespace" in finding.message and finding.details["unsafe_globals"] == ["argparse.Namespace"]
    assert result.exit_code() == 1


def test_numpy_arrays_of_miles_and_relax_dumps_load(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    import numpy as np

    samples = [dict(s) for s in rollout_world["clean"].samples]
    for s in samples:  # R3 routing as miles/Relax keep it, and a numpy scalar reward
        s["rollout_routed_experts"] = np.zeros((len(s["tokens"]) - 1, 2, 2), dtype=np.int32)
        s["reward"] = np.float32(s["reward"])
    (tmp_path / "rollout_data").mkdir()
    torch.save(dict(rollout_id=0, metadata={}, samples=samples), tmp_path / "rollout_data" / "0.pt")
    result = check_rollout(tmp_path)
    assert result.findings == [] and result.checked["rewards"] == len(samples)


def test_cli_formats_and_exit_codes(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    root = rf.write_miles(rollout_world["perturbed"], tmp_path / "m")
    runner = CliRunner()
    out = runner.invoke(cli, ["rollout", str(root), "--format", "json"])
    assert out.exit_code == 1, out.output
    doc = json.loads(out.output)
    assert doc["command"] == "rollout" and doc["findings"][0]["code"] == "WC802"
    assert runner.invoke(cli, ["rollout", str(root), "--jitter-kl", "10", "--ref-tol", "1"]).exit_code == 0
    sarif = json.loads(runner.invoke(cli, ["rollout", str(root), "--format", "sarif"]).output)
    assert sarif["runs"][0]["results"][0]["ruleId"] == "WC802"
    assert "::error" in runner.invoke(cli, ["rollout", str(root), "--format", "github"]).output
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(cli, ["rollout", str(empty)]).exit_code == 3
    config = tmp_path / "weightcheck.toml"
    config.write_text("[rollout]\njitter-kl = 10.0\nref-tol = 1.0\n")
    assert runner.invoke(cli, ["rollout", str(root), "--config", str(config)]).exit_code == 0
    config.write_text("[rollout]\njiter-kl = 10.0\n")
    bad = runner.invoke(cli, ["rollout", str(root), "--config", str(config)])
    assert bad.exit_code == 2 and "unknown rollout setting 'jiter-kl'" in bad.output


def test_every_rollout_rule_has_doc_and_examples() -> None:
    from weightcheck.rules import all_rules

    mine = [r for r in all_rules().values() if r.code.startswith("WC8")]
    assert len(mine) >= 19
    for rule in mine:
        assert rule.doc and rule.bad and rule.good and rule.fix_text(), rule.code
        assert rule.command in ("rollout", "doctor")


def test_routing_replay_relaxes_to_miles_bound(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    data = rollout_world["perturbed"]
    root = rf.write_miles(data, tmp_path / "m")
    result = check_rollout(root, Thresholds(routing_replay=True))
    (finding,) = by_code(result, "WC802")
    fails = rf.framework_step0(data)["ref_diff"] >= 5e-3  # miles under --use-rollout-routing-replay
    assert finding.severity == (Severity.ERROR if fails else Severity.WARNING)


def test_eval_dump_is_told_apart(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "rollout_data").mkdir()
    samples = [dict(s, reward=0.0) for s in rollout_world["clean"].samples]
    torch.save({"rollout_id": 0, "samples": samples}, tmp_path / "rollout_data" / "eval_0.pt")
    result = check_rollout(tmp_path)
    (constant,) = by_code(result, "WC811")
    assert constant.message.startswith("rollout eval_0:")


def _rollout_dump(path: Path, samples: list[dict[str, Any]]) -> Path:
    """A rollout dump as slime's save_debug_rollout_data writes it."""
    path.mkdir(parents=True)
    torch.save({"rollout_id": 0, "samples": samples}, path / "0.pt")
    return path


def test_degenerate_rewards_and_masks(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    clean = [dict(s) for s in rollout_world["clean"].samples]
    assert check_rollout(_rollout_dump(tmp_path / "good", clean)).findings == []

    looping = [dict(s) for s in clean]
    s = looping[3]
    prompt = s["tokens"][: len(s["tokens"]) - s["response_length"]]
    loop = [rf.FIRST_WORD, rf.FIRST_WORD + 1, rf.FIRST_WORD + 2] * 14  # a 3-token n-gram, 42 tokens
    rows = rf.full_log_probs(rollout_world["model"], prompt + loop, len(loop))
    s.update(tokens=prompt + loop, response_length=len(loop), loss_mask=[1] * len(loop), rollout_log_probs=rows)
    (finding,) = by_code(check_rollout(_rollout_dump(tmp_path / "loop", looping)), "WC809")
    assert "sample 3 (index 3) tokens 0..41 repeat a 3-token n-gram 14 times" in finding.message

    nan = [dict(s) for s in clean]
    nan[5]["reward"] = float("nan")
    (finding,) = by_code(check_rollout(_rollout_dump(tmp_path / "nan", nan)), "WC810")
    assert finding.details["samples"] == [5]

    masks = [dict(s) for s in clean]
    masks[2]["loss_mask"] = masks[2]["loss_mask"][:-1]
    (finding,) = by_code(check_rollout(_rollout_dump(tmp_path / "mask", masks)), "WC812")
    assert "loss_mask has 1 entries, response_length 2" in finding.message

    empty = [dict(s) for s in clean]
    empty[0].update(
        tokens=empty[0]["tokens"][: -empty[0]["response_length"]],
        response_length=0,
        loss_mask=[],
        rollout_log_probs=[],
        response="",
        status="aborted",
    )
    assert "WC807" in codes(check_rollout(_rollout_dump(tmp_path / "empty", empty)))


def test_refusal_ignores_safe_globals_the_process_registered(
    rollout_world: dict[str, Any], tmp_path: Path
) -> None:
    """megatron-core's register_safe_globals() adds argparse.Namespace (and more) to torch's process-wide
    list; inside such a process a dump holding one must still be refused, and the process's list kept."""
    samples = [dict(s) for s in rollout_world["clean"].samples]
    samples[0]["metadata"] = {"adapter": argparse.Namespace(name="lora-a")}
    (tmp_path / "rollout_data").mkdir()
    torch.save({"rollout_id": 0, "samples": samples}, tmp_path / "rollout_data" / "0.pt")
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([argparse.Namespace])
    try:
        (finding,) = by_code(check_rollout(tmp_path), "WC800")
        assert finding.details["unsafe_globals"] == ["argparse.Namespace"]
        assert argparse.Namespace in torch.serialization.get_safe_globals()  # the process's list is restored
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)
