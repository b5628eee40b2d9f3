"""Quantized stacked experts (gpt-oss MXFP4 `*_blocks` / `*_scales`) on a tiny gpt-oss saved by transformers
`save_pretrained` and packed the way the published checkpoints are (tests/mxfp4_fixture.py): the clean one
lints clean, an expert lost or added in a stack is WC431, blocks and scales that disagree are WC430."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import by_code, run
from mxfp4_fixture import replace_tensors, save_gpt_oss_mxfp4
from quantized import read_tensor

from weightcheck.findings import Severity

STACK = "model.layers.1.mlp.experts.down_proj"


@pytest.fixture(scope="module")
def oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_gpt_oss_mxfp4(tmp_path_factory.mktemp("mxfp4") / "gpt_oss")


@pytest.fixture
def copy(oss: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(oss, tmp_path / "ckpt"))


def _problems(result) -> list[str]:
    return [f"{f.code} {f.message}" for f in result.findings if f.severity >= Severity.WARNING]


def test_clean_mxfp4_checkpoint_lints_clean(oss: Path) -> None:
    result = run(oss)
    assert _problems(result) == []
    assert result.exit_code() == 0


@pytest.mark.parametrize("keep", [slice(0, -1), slice(1, None)], ids=["last-expert-lost", "first-expert-lost"])
def test_expert_lost_from_both_halves_of_a_stack(copy: Path, keep: slice) -> None:
    blocks, scales = read_tensor(copy, f"{STACK}_blocks"), read_tensor(copy, f"{STACK}_scales")
    replace_tensors(copy, {f"{STACK}_blocks": blocks[keep].clone(), f"{STACK}_scales": scales[keep].clone()})
    result = run(copy)
    [finding] = by_code(result, "WC431")
    assert finding.severity == Severity.ERROR and STACK + "_blocks" in finding.details["tensors"][0]
    assert "[3]" in finding.message
    assert not by_code(result, "WC430")  # the halves still agree with each other


def test_extra_expert_in_a_stack(copy: Path) -> None:
    import torch

    blocks = read_tensor(copy, f"{STACK}_blocks")
    replace_tensors(copy, {f"{STACK}_blocks": torch.cat([blocks, blocks[:1]])})
    result = run(copy)
    assert "[5]" in by_code(result, "WC431")[0].message
    assert STACK in by_code(result, "WC430")[0].message  # and blocks no longer match scales


def test_scales_with_a_group_short(copy: Path) -> None:
    scales = read_tensor(copy, f"{STACK}_scales")
    replace_tensors(copy, {f"{STACK}_scales": scales[..., :-1].clone()})
    [finding] = by_code(run(copy), "WC430")
    assert STACK in finding.message and "[4, 64, 1]" in finding.message


def test_scales_missing(copy: Path) -> None:
    replace_tensors(copy, {f"{STACK}_scales": None})
    [finding] = by_code(run(copy), "WC430")
    assert f"{STACK}: only down_proj_blocks stored" in finding.message


def test_clean_has_no_stack_findings(oss: Path) -> None:
    result = run(oss)
    assert not by_code(result, "WC430") and not by_code(result, "WC431")
