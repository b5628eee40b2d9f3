"""A trainer's own checkpoint folder given to lint: Megatron dist-checkpointing (what slime and miles save with
--save: `iter_*/` with `*.distcp`, `.metadata`, `metadata.json`) and torch.distributed.checkpoint (FSDP2,
Accelerate, torchtitan). Lint reads safetensors only, so these check nothing (exit 3, as before); the note now
says what the folder is and which converter makes safetensors of it, instead of "found pickle weights common.pt;
convert them to safetensors" (Megatron's common.pt holds no weights). Written by the real writers: torch's
`dcp.save` and megatron-core's `save_config`."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from weightcheck.linting import lint

torch = pytest.importorskip("torch")


def _dcp(path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.save({"decoder.layers.0.mlp.linear_fc1.weight": torch.randn(8, 4)}, checkpoint_id=str(path))
    return path


def _megatron(save_dir: Path, iteration: int = 10) -> Path:
    """A Megatron torch_dist iteration folder: the DCP shards (what its torch_dist strategy writes through
    torch.distributed.checkpoint), metadata.json from megatron-core's own `save_config`, a legacy common.pt, and
    the save folder's latest_checkpointed_iteration.txt."""
    core = pytest.importorskip("megatron.core.dist_checkpointing.core")
    folder = _dcp(save_dir / f"iter_{iteration:07d}")
    core.save_config(core.CheckpointingConfig("torch_dist"), str(folder))
    torch.save({"args": None}, folder / "common.pt")
    (save_dir / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return folder


def _note(path: Path) -> str:
    result = lint(path)
    assert result.nothing_checked and result.exit_code() == 3
    return " ".join(result.notes)


def test_megatron_iteration_folder_names_its_converter(tmp_path: Path) -> None:
    folder = _megatron(tmp_path / "save")
    note = _note(folder)
    assert "Megatron dist-checkpointing" in note and "torch_dist" in note
    assert f"convert_torch_dist_to_hf.py --input-dir {folder}" in note and "--origin-hf-dir" in note
    assert "pickle" not in note  # common.pt is not the weights


def test_megatron_save_folder_points_at_its_latest_iteration(tmp_path: Path) -> None:
    _megatron(tmp_path / "save", iteration=120)
    note = _note(tmp_path / "save")
    assert "latest_checkpointed_iteration.txt: 120" in note and "iter_0000120" in note


def test_plain_dcp_folder_is_named(tmp_path: Path) -> None:
    note = _note(_dcp(tmp_path / "step_10"))
    assert "torch.distributed.checkpoint (DCP)" in note and "accelerate merge-weights" in note


def test_hostile_metadata_and_iteration_files_are_not_trusted(tmp_path: Path) -> None:
    """metadata.json that is not JSON, or a symlink out of the folder; an iteration file that is not a number:
    the folder is still named as what its listing shows, and nothing is read outside it."""
    folder = _dcp(tmp_path / "save" / "iter_0000010")
    (folder / "metadata.json").write_text("{not json")
    assert "torch.distributed.checkpoint (DCP)" in _note(folder)
    os.remove(folder / "metadata.json")
    outside = tmp_path / "outside.json"
    outside.write_text('{"sharded_backend": "torch_dist"}')
    (folder / "metadata.json").symlink_to(outside)
    assert "torch.distributed.checkpoint (DCP)" in _note(folder)
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("release\n" * 10)
    note = _note(tmp_path / "save")
    assert "Megatron save folder" not in note and "no safetensors weights" in note


def test_a_hf_checkpoint_beside_dcp_shards_is_linted_as_usual(tmp_path: Path) -> None:
    """The good twin: a folder that holds safetensors weights is linted, whatever else is in it."""
    from safetensors.torch import save_file

    path = tmp_path / "ckpt"
    _dcp(path)  # the DCP shards and .metadata in the folder itself
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4)}, str(path / "model.safetensors"))
    result = lint(path)
    assert not result.nothing_checked
