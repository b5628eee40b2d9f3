"""The transport of the stand-ins: what Ray + NCCL/CUDA IPC do between a trainer rank and the engines.

A sending rank writes each bucket (in order, names may repeat) to `$WIRE/<version>/<rank>-<seq>`; the rank
hosting the engine loads every rank's buckets, rank by rank, in one weight-update session when the trainer
resumes generation (`continue_generation`), as SGLang applies them before that call returns."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

_seq = {"n": 0}


def send(named_tensors: list[tuple[str, torch.Tensor]], weight_version: Any) -> None:
    folder = Path(os.environ["STANDIN_WIRE"]) / str(weight_version)
    folder.mkdir(parents=True, exist_ok=True)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    stem = folder / f"{rank}-{_seq['n']:05d}"
    _seq["n"] += 1
    save_file({f"{i:06d}": t.contiguous() for i, (_, t) in enumerate(named_tensors)}, f"{stem}.safetensors")
    stem.with_suffix(".json").write_text(json.dumps([n for n, _ in named_tensors]))


def received(weight_version: Any) -> list[list[tuple[str, torch.Tensor]]]:
    folder = Path(os.environ["STANDIN_WIRE"]) / str(weight_version)
    buckets = []
    for names_file in sorted(folder.glob("*.json"), key=lambda p: tuple(int(x) for x in p.stem.split("-"))):
        tensors = load_file(str(names_file.with_suffix(".safetensors")))
        names = json.loads(names_file.read_text())
        buckets.append([(n, tensors[f"{i:06d}"]) for i, n in enumerate(names)])
    return buckets


class RolloutEngine:
    """What `rollout_engines[i]` does for the updater (Ray actor calls made synchronous): the tapped
    engine model lives in this process."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.pending: list[str] = []

    def pause_generation(self, **_: Any) -> None:
        pass

    def flush_cache(self) -> None:
        pass

    def update_weights(self, weight_version: Any) -> None:
        self.pending.append(str(weight_version))

    def continue_generation(self) -> None:
        from weightcheck import tap

        for version in dict.fromkeys(self.pending):
            with tap.sync(version, source="session"):
                for bucket in received(version):
                    self.model.load_weights(iter(bucket))
        self.pending.clear()
