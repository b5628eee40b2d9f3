"""SyncMonitor reads the trainer's layer and expert counts from megatron-core's TransformerConfig (through
the wrappers Megatron puts around a model) or Megatron's arguments, and says once that a sync it did not
observe is not checked, never calling it wrong. One process; the two-rank trainer is
tests/test_integrations_trainer.py."""

from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path

import pytest

from weightcheck.integrations import SyncMonitor, megatron_model_facts


def test_counts_from_the_models_config_through_its_wrappers() -> None:
    torch = pytest.importorskip("torch")
    transformer = pytest.importorskip("megatron.core.transformer")
    config = transformer.TransformerConfig(
        num_layers=6,
        hidden_size=8,
        num_attention_heads=1,
        num_moe_experts=4,
        pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
        num_layers_in_first_pipeline_stage=2,
    )

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config

    class Wrapper(torch.nn.Module):  # DDP / Float16Module: `.module`, and a `.config` that is not a model's
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module
            self.config = Namespace(grad_reduce_in_fp32=True)

    facts = megatron_model_facts([Wrapper(Wrapper(GPT()))])
    assert facts == {"num_layers": 6, "num_experts": 4, "first_stage_layers": 2}
    monitor = SyncMonitor(Path("unused"), num_experts=8)
    monitor.learn(model=[Wrapper(GPT())])
    assert (monitor.num_layers, monitor.num_experts) == (6, 8)  # what was set is kept


def test_counts_from_megatron_arguments_without_a_model() -> None:
    args = Namespace(num_layers=28, num_experts=None, decoder_last_pipeline_num_layers=3)
    assert megatron_model_facts(None, args) == {"num_layers": 28, "last_stage_layers": 3}
    assert megatron_model_facts(object(), None) == {}


def test_a_sync_nobody_observed_is_said_once_and_not_called_wrong(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = tmp_path / "records"
    (records / "sync-00000").mkdir(parents=True)  # the engines recorded syncs; the trainer side saw nothing
    monitor = SyncMonitor(tmp_path / "manifests", records=records, timeout_s=0.1)
    caplog.set_level(logging.INFO, "weightcheck.integrations")
    for version in (1, 2, 3):
        monitor.set_version(version)
        assert monitor.after_sync() is None
    assert monitor.results == []
    said = [r for r in caplog.records if "not observed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
