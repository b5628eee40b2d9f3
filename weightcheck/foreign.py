"""Trainer checkpoint folders weightcheck does not read, named with the converter that makes safetensors of them.

A newcomer points `weightcheck lint` at what the trainer saved: slime's or miles' `--save` folder (Megatron
dist-checkpointing: `iter_0000100/` holding `*.distcp` shards, `.metadata` and `metadata.json` with
`sharded_backend`, `latest_checkpointed_iteration.txt` beside them), or an FSDP2 / Accelerate / torchtitan
`torch.distributed.checkpoint` folder (`*.distcp`, `.metadata`). Lint reads Hugging Face safetensors only, so such
a target checks nothing (exit 3); this says what the folder is and what converts it, instead of "found pickle
weights common.pt; convert them to safetensors" (Megatron's `common.pt` holds no weights).

Only the listing is read, and `metadata.json` / `latest_checkpointed_iteration.txt` (bounded, confined to the
folder); nothing is unpickled.
"""

from __future__ import annotations

import os
from pathlib import Path

_LISTING_BUDGET = 2000
_SMALL_FILE = 64 * 1024

# What converts each format to Hugging Face safetensors, as the frameworks' current sources name it
# (THUDM/slime 624b824 and radixark/miles 31f1ca9: tools/convert_torch_dist_to_hf.py takes the iteration folder and
# the original HF checkpoint, whose config and names it reuses; Accelerate's `accelerate merge-weights` writes
# model.safetensors by default).
MEGATRON_CONVERT = ("slime and miles: `python tools/convert_torch_dist_to_hf.py --input-dir {path} --output-dir OUT "
                    "--origin-hf-dir HF_CHECKPOINT`")  # fmt: skip
DCP_CONVERT = ("Accelerate: `accelerate merge-weights {path} OUT` (accelerate.utils.merge_fsdp_weights); other "
               "trainers: their Hugging Face export")  # fmt: skip


def _listing(folder: Path) -> list[str]:
    from itertools import islice

    try:
        with os.scandir(folder) as it:
            return sorted(e.name for e in islice(it, _LISTING_BUDGET) if e.is_file(follow_symlinks=False))
    except OSError:
        return []


def _small_json(folder: Path, name: str) -> object:
    from weightcheck.safe_io import UnsafePath, confine, load_json

    try:
        return load_json(confine(folder, name), _SMALL_FILE, name)
    except (UnsafePath, ValueError):
        return None


def _small_text(folder: Path, name: str) -> str | None:
    from weightcheck.safe_io import UnsafePath, confine, read_text

    try:
        return read_text(confine(folder, name), _SMALL_FILE, name).strip()[:40]
    except UnsafePath:
        return None


def _distributed(folder: Path, names: list[str]) -> str | None:
    """What a folder of `*.distcp` shards (`names`: its files) is, Megatron's or plain torch DCP, with its
    converter; None otherwise."""
    shards = [n for n in names if n.endswith(".distcp")]
    if not shards:
        return None
    config = _small_json(folder, "metadata.json") if "metadata.json" in names else None
    backend = config.get("sharded_backend") if isinstance(config, dict) else None
    if isinstance(backend, str):
        return (f"a Megatron dist-checkpointing checkpoint (metadata.json: sharded_backend {backend[:40]!r}, "
                f"{len(shards)} *.distcp shard(s)), not Hugging Face safetensors; convert it "
                f"({MEGATRON_CONVERT.format(path=folder)}) and lint OUT")  # fmt: skip
    return (f"a torch.distributed.checkpoint (DCP) folder ({len(shards)} *.distcp shard(s)), not Hugging Face "
            f"safetensors; export it ({DCP_CONVERT.format(path=folder)}) and lint OUT")  # fmt: skip


def describe(target: Path) -> str | None:
    """A sentence naming the trainer format of `target` (a folder) and its converter; None when it is none of
    them. A Megatron save folder (`latest_checkpointed_iteration.txt`) is described through its latest
    `iter_*` folder."""
    if not target.is_dir():
        return None
    names = _listing(target)
    found = _distributed(target, names)
    if found is not None:
        return found
    if "latest_checkpointed_iteration.txt" not in names:
        return None
    latest = _small_text(target, "latest_checkpointed_iteration.txt")
    if latest is None or not latest.isdigit():
        return None
    iteration = target / f"iter_{int(latest):07d}"
    inner = _distributed(iteration, _listing(iteration)) if iteration.is_dir() else None
    if inner is None:
        return f"a Megatron save folder (latest_checkpointed_iteration.txt: {latest}), not Hugging Face safetensors"
    return f"a Megatron save folder (latest_checkpointed_iteration.txt: {latest}); its {iteration.name} is {inner}"
