"""Reading a run's logs for `weightcheck doctor`: line by line, size-capped, never executed, each line matched
against the phrases the slime / miles / Relax guides tell people to grep for, and against the lines only a
Megatron trainer's log holds (so an engine's log is never read as a trainer's that failed to load)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from weightcheck import safe_io

# Logs are read up to this many bytes each (the tail of a huge log is less useful than its start, where the
# load line is) and lines are cut at this length.
MAX_LOG_BYTES = 256 * 1024 * 1024
MAX_LINE = 64 * 1024


def relative_label(path: Path, run: Path) -> str:
    """`path` as shown in reports: relative to the run folder when inside it."""
    try:
        return str(path.relative_to(run))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Signal:
    code: str | None  # None: an informative phrase (weight_sync events), not a problem
    key: str
    pattern: re.Pattern[str]


SIGNALS = (
    Signal("WC851", "illegal-memory-access", re.compile(r"illegal memory access", re.I)),
    Signal("WC852", "worker-crashed", re.compile(r"WorkerCrashed|RaySystemError")),
    # torch ProcessGroupNCCL's watchdog: "[Rank N] Watchdog caught collective operation timeout: WorkNCCL(...)"
    # and its abort message; an env dump such as NCCL_TIMEOUT=900 must not match.
    Signal(
        "WC853",
        "nccl-timeout",
        re.compile(r"Watchdog caught collective operation timeout|Some NCCL operations have failed or timed out"),
    ),
    Signal(None, "weight-sync", re.compile(r"weight_sync")),
)
# Megatron-LM's `successfully loaded checkpoint from {load_dir} [ t .., p .. ] at iteration N`
# (megatron/training/checkpointing.py), and slime's and miles' own line when --load is a Hugging Face checkpoint,
# which they load into Megatron without Megatron's loader: `Load checkpoint from HuggingFace model into Megatron
# (path=...)` (`_load_checkpoint_hf` in {slime,miles}/backends/megatron_utils/checkpoint.py).
_LOADED = re.compile(r"loaded checkpoint from|Load checkpoint from HuggingFace model into Megatron", re.I)
_NOT_LOADED = re.compile(r"will not load any checkpoints and will start from random", re.I)
# Lines only a Megatron trainer's log holds (megatron/training/arguments.py's `using world size: N, ...`, the
# model builder's ` > number of parameters on (tensor, [...,] pipeline) model parallel rank ...`, the checkpoint
# tracker warning), besides the load lines above. A log without any is an engine's, Ray's or another tool's:
# its lack of a load line says nothing about Megatron.
_TRAINER = re.compile(r"using world size: \d|number of parameters on \(tensor|could not find the metadata file")
_JSON_DECODE = re.compile(r"JSONDecodeError")
_INDUCTOR = re.compile(r"torch/_inductor|torch\._inductor|inductor", re.I)


@dataclass
class LogScan:
    files: int = 0
    lines: int = 0
    loaded: list[str] = field(default_factory=list)
    not_loaded: list[str] = field(default_factory=list)
    trainer_logs: list[str] = field(default_factory=list)  # the files with a Megatron trainer's lines
    hits: dict[str, list[str]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    capped: list[str] = field(default_factory=list)


def read_lines(path: Path, limit: int = MAX_LOG_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) of a log, read as bytes within `limit`, decoded leniently; never executed."""
    fd, _ = safe_io.open_regular(path, str(path))
    with open(fd, "rb", closefd=True) as handle:
        read = 0
        number = 0
        while read < limit:
            raw = handle.readline(MAX_LINE)
            if not raw:
                return
            read += len(raw)
            if not raw.endswith(b"\n"):
                # an over-long line: the rest of it is skipped (bounded by `limit`)
                rest = raw
                while rest and not rest.endswith(b"\n") and read < limit:
                    rest = handle.readline(MAX_LINE)
                    read += len(rest)
            number += 1
            yield number, raw.decode("utf-8", errors="replace").rstrip("\r\n")


def scan_logs(logs: list[Path], run: Path) -> LogScan:
    scan = LogScan()
    for path in logs:
        label = relative_label(path, run)
        try:
            recent: list[str] = []  # the last lines, to tell an inductor JSONDecodeError from another
            count = 0
            trainer = False
            for number, text in read_lines(path):
                count = number
                where = f"{label}:{number}"
                if _LOADED.search(text):
                    scan.loaded.append(f"{where}: {text.strip()[:200]}")
                    trainer = True
                if _NOT_LOADED.search(text):
                    scan.not_loaded.append(f"{where}: {text.strip()[:200]}")
                    trainer = True
                if not trainer and _TRAINER.search(text):
                    trainer = True
                for signal in SIGNALS:
                    if signal.pattern.search(text):
                        scan.hits.setdefault(signal.key, []).append(f"{where}: {text.strip()[:200]}")
                if _JSON_DECODE.search(text) and any(_INDUCTOR.search(r) for r in [*recent, text]):
                    scan.hits.setdefault("inductor-cache", []).append(f"{where}: {text.strip()[:200]}")
                recent = [*recent[-30:], text]
            scan.files += 1
            scan.lines += count
            if trainer:
                scan.trainer_logs.append(label)
            try:
                if path.stat().st_size > MAX_LOG_BYTES:
                    scan.capped.append(label)
            except OSError:
                pass
        except safe_io.UnsafePath as exc:
            scan.unreadable.append(f"{label}: {exc.reason}")
        except OSError as exc:
            scan.unreadable.append(f"{label}: {exc.strerror or exc}")
    return scan
