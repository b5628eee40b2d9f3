"""`weightcheck doctor RUN` on a run directory assembled from real parts: the tiny model's checkpoint
(transformers save_pretrained), tap records of a sync whose second pipeline stage forgot its layer offset
(the tap on a small engine, as tests/test_verify.py records them), miles dumps whose reference differs,
a trainer log without Megatron's load line and an SGLang log with an illegal memory access."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rollout_fixtures as rf
import torch
from click.testing import CliRunner
from test_verify import Engine, default_loader, layer_of, read_stream, relabel_layer

from weightcheck import api, tap
from weightcheck.checkup import CHECKLIST, NOT_CHECKED, OK, PROBLEM
from weightcheck.cli import cli

TRAINER_LOG = """\
using world size: 4, data-parallel size: 1, context-parallel size: 2, tensor-model-parallel size: 2
> building GPT2BPETokenizer tokenizer ...
WARNING: could not find the metadata file /ckpt/torch_dist/latest_checkpointed_iteration.txt
    will not load any checkpoints and will start from random
(min, max) time across ranks (ms):
    load-checkpoint ................................: (0.21, 0.25)
"""
SGLANG_LOG = """\
[2026-11-20 10:00:01] INFO: Start update_weights_from_tensor weight_sync version=1
[2026-11-20 10:00:03] ERROR: Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: CUDA error: an illegal memory access was encountered
"""


def push_pp_offset_sync(ckpt: Path, records: Path) -> None:
    """Engine side of a sync from a trainer with PP=2 (one layer per stage) whose stage 1 sent its layer 1 as
    layer 0."""
    stream = read_stream(ckpt)
    shapes = {n: (tuple(t.shape), t.dtype) for n, t in stream}
    sent = [(n, t) for n, t in stream if (layer_of(n) or 0) < 1]
    sent += [(relabel_layer(n, 0), t) for n, t in stream if layer_of(n) == 1]
    tap.configure(records, digest_threads=1)
    tap.install(Engine)
    try:
        tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader, rank_info=lambda: {}))
        model = Engine(shapes, range(2), 2)
        with tap.sync("step-1", source="session"):
            model.load_weights(iter(sent))
    finally:
        tap.uninstall(Engine)
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())


@pytest.fixture
def run_dir(rollout_world: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    run = tmp_path / "run"
    ckpt = run / "checkpoint"
    # A copy: Module.to() converts in place, and a bf16 round trip would change the session's shared model
    # (every later log-prob computed from it would differ from the dumps' by bf16 rounding).
    copy.deepcopy(rollout_world["model"]).to(torch.bfloat16).save_pretrained(ckpt)
    push_pp_offset_sync(ckpt, run / "records")
    rf.write_miles(rollout_world["perturbed"], run / "dump")
    (run / "logs").mkdir()
    (run / "logs" / "trainer.log").write_text(TRAINER_LOG)
    (run / "logs" / "sglang.log").write_text(SGLANG_LOG)
    yield run


def test_doctor_names_each_planted_problem_on_its_line(run_dir: Path) -> None:
    (run_dir / "checkpoint" / "merges.txt").write_text("illegal memory access\n")  # a tokenizer file, not a log
    result, lines = api.doctor(run_dir, config=False)
    assert [line.key for line in lines] == [key for key, _ in CHECKLIST]  # the guides' order
    verdicts = {line.key: line for line in lines}

    loaded = verdicts["checkpoint-loaded"]
    assert loaded.verdict == PROBLEM and any(
        "will start from random" in e and "trainer.log:4" in e for e in loaded.evidence
    )
    assert verdicts["checkpoint-lint"].verdict == OK

    sync = verdicts["weight-sync"]
    assert sync.verdict == PROBLEM and any("WC725" in e and "shifted by −1" in e for e in sync.evidence)
    assert verdicts["buffers"].verdict == NOT_CHECKED and "WEIGHTCHECK_STATE=1" in verdicts["buffers"].why_not

    kl = verdicts["logprobs-equal"]
    assert kl.verdict == PROBLEM and any("WC802" in e for e in kl.evidence)
    assert verdicts["train-vs-rollout"].verdict == OK
    assert verdicts["rollout-coherent"].verdict == OK

    logs = verdicts["log-signals"]
    assert logs.verdict == PROBLEM and any("WC851" in e and "sglang.log:3" in e for e in logs.evidence)
    assert any("1 weight_sync event line" in e for e in logs.evidence)
    assert any("2 log file(s)" in e for e in logs.evidence)
    assert {"WC850", "WC725", "WC802", "WC851"} <= {f.code for f in result.findings}
    assert result.exit_code() == 1


def test_absent_inputs_are_not_checked_never_ok(run_dir: Path, tmp_path: Path) -> None:
    only_logs = tmp_path / "only-logs"
    only_logs.mkdir()
    (only_logs / "sglang.log").write_text(SGLANG_LOG)
    _, lines = api.doctor(only_logs, config=False)
    verdicts = {line.key: line.verdict for line in lines}
    assert verdicts["log-signals"] == PROBLEM
    for key in ("checkpoint-lint", "weight-sync", "buffers", "rollout-coherent", "logprobs-equal", "rewards"):
        assert verdicts[key] == NOT_CHECKED, key
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing, lines = api.doctor(empty, config=False)
    assert all(line.verdict == NOT_CHECKED for line in lines)
    assert nothing.nothing_checked and nothing.exit_code() == 3


def test_loaded_checkpoint_and_load_dir_are_ok(run_dir: Path) -> None:
    (run_dir / "logs" / "trainer.log").write_text(
        "  successfully loaded checkpoint from /ckpt/torch_dist [ t 1/2, p 1/1 ] at iteration 0\n"
    )
    (run_dir / "load").mkdir()
    (run_dir / "load" / "latest_checkpointed_iteration.txt").write_text("0\n")
    _, lines = api.doctor(run_dir, config=False)
    line = next(x for x in lines if x.key == "checkpoint-loaded")
    assert line.verdict == OK
    assert any("latest_checkpointed_iteration.txt:1: 0" in e for e in line.evidence)
    assert any("trainer.log:1" in e for e in line.evidence)


def test_cli_text_and_json(run_dir: Path) -> None:
    runner = CliRunner()
    text = runner.invoke(cli, ["doctor", str(run_dir)])
    assert text.exit_code == 1, text.output
    positions = [text.output.index(title) for _, title in CHECKLIST]
    assert positions == sorted(positions)
    assert "[not checked] Engine buffers" in text.output and "[PROBLEM] Megatron loaded the checkpoint" in text.output
    doc = json.loads(runner.invoke(cli, ["doctor", str(run_dir), "--format", "json"]).output)
    assert [line["key"] for line in doc["checklist"]] == [key for key, _ in CHECKLIST]
    assert doc["checklist"][3]["verdict"] == "not checked" and doc["checklist"][3]["not_checked_because"]


def test_log_signal_phrases_each_on_the_log_line(tmp_path: Path) -> None:
    """Lines in the form their writers print them (torch ProcessGroupNCCL's watchdog, Ray's exception names,
    an inductor traceback ending in JSONDecodeError); an env dump naming NCCL_TIMEOUT is not a timeout."""
    logs = tmp_path / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-01.err").write_text(
        "NCCL_TIMEOUT=900 NCCL_DEBUG=INFO\n"
        "[rank3]:[E1120 10:00:00.1 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds "
        "before timing out.\n"
    )
    (logs / "worker-02.err").write_text(
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/torch/_inductor/codecache.py", line 5042, in load\n'
        "    cmd_parts, error_output = json.loads(cache_entry.error_json)\n"
        "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n"
    )
    (logs / "driver.out").write_text("ray.exceptions.WorkerCrashedError: The worker died unexpectedly\n")
    (logs / "other.err").write_text("json.decoder.JSONDecodeError: unrelated to the compiler\n")
    os.mkfifo(logs / "stuck.log")  # a FIFO must not hang the read
    (logs / "long.log").write_bytes(b"x" * (3 * 64 * 1024) + b"\nillegal memory access\n")
    result, lines = api.doctor(tmp_path, config=False)
    by = {f.code: f for f in result.findings}
    assert by["WC853"].location.file.endswith("worker-01.err") and "worker-01.err:2" in by["WC853"].message
    assert "worker-02.err:4" in by["WC854"].message and "other.err" not in by["WC854"].message
    assert "driver.out:1" in by["WC852"].message
    assert "long.log:2" in by["WC851"].message  # the over-long line is skipped, the next one still read
    assert any("stuck.log" in n for n in result.notes)
    assert next(x for x in lines if x.key == "log-signals").verdict == PROBLEM


# The lines a Megatron trainer prints before it loads anything, as Megatron-LM prints them
# (megatron/training/arguments.py `using world size: ...`; megatron/training/training.py `get_model`'s parameter
# count, NVIDIA/Megatron-LM d98e8a6), and the line slime and miles log when --load is a Hugging Face
# checkpoint (`_load_checkpoint_hf` in slime/backends/megatron_utils/checkpoint.py, THUDM/slime 624b824, and
# miles/backends/megatron_utils/checkpoint.py, radixark/miles 31f1ca9).
MEGATRON_START = (
    "using world size: 2, data-parallel size: 1, context-parallel size: 1, hierarchical context-parallel sizes: "
    "None, tensor-model-parallel size: 1, pipeline-model-parallel size: 2\n"
    " > number of parameters on (tensor, gtp_weight_remat, pipeline) model parallel rank (0, 0, 0): 520192\n"
)
SLIME_HF_LOAD = "Load checkpoint from HuggingFace model into Megatron (path={load})\n"


def _loaded_line(run: Path) -> Any:
    _, lines = api.doctor(run, config=False)
    return next(x for x in lines if x.key == "checkpoint-loaded")


def test_engine_logs_alone_say_nothing_about_megatrons_load(tmp_path: Path) -> None:
    """An SGLang log (or Ray's, or any log without a Megatron trainer's lines) lacks the load line because
    it is not the trainer's log: the line is not checked, never a WC850 error."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "sglang.log").write_text(SGLANG_LOG)
    (run / "raylet.out").write_text("[2026-11-20 10:00:00,001 I 1 1] main.cc:200: Starting raylet\n")
    result, lines = api.doctor(run, config=False)
    line = next(x for x in lines if x.key == "checkpoint-loaded")
    assert line.verdict == NOT_CHECKED and "trainer" in line.why_not, (line.verdict, line.why_not)
    assert "WC850" not in {f.code for f in result.findings}
    # the bad twin: the trainer's log is among them, and it never loaded -> WC850 names that log
    (run / "trainer.log").write_text(MEGATRON_START + "training ...\n")
    result, lines = api.doctor(run, config=False)
    wc850 = [f for f in result.findings if f.code == "WC850"]
    assert len(wc850) == 1 and "trainer.log" in wc850[0].message and "sglang.log" not in wc850[0].message


def test_slime_and_miles_loading_a_hugging_face_checkpoint_is_loaded(tmp_path: Path) -> None:
    """slime and miles load a Hugging Face checkpoint given as --load into Megatron themselves: no
    latest_checkpointed_iteration.txt, no Megatron 'successfully loaded' line, their own log line instead."""
    from conftest import BUILDERS

    run = tmp_path / "run"
    load = BUILDERS["llama"](run / "load")  # transformers save_pretrained
    (run / "trainer.log").write_text(MEGATRON_START + SLIME_HF_LOAD.format(load=load))
    line = _loaded_line(run)
    assert line.verdict == OK, (line.verdict, line.evidence)
    assert any("Hugging Face checkpoint" in e for e in line.evidence)
    assert any("Load checkpoint from HuggingFace" in e for e in line.evidence)
    # bad twins: a load folder that is neither a Megatron checkpoint nor a Hugging Face one, and a trainer
    # log without the line
    (load / "config.json").unlink()
    assert _loaded_line(run).verdict == PROBLEM
    (load / "config.json").write_text("{}")
    (run / "trainer.log").write_text(MEGATRON_START)
    line = _loaded_line(run)
    assert line.verdict == PROBLEM and any("no 'loaded checkpoint from' line" in e for e in line.evidence)
