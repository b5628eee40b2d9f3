"""Progress for long work (reading tensor data), always on stderr so stdout stays the report.

On a terminal: a rich bar. Off a terminal (CI logs, batch jobs): one plain line every
`WEIGHTCHECK_PROGRESS_INTERVAL` seconds (default 10), so a log is never silent for minutes; runs shorter
than one interval print nothing. The output format does not matter: JSON/SARIF go to stdout or `-o`.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any, TextIO

# "bar" (rich, terminal), "lines" (plain periodic lines), or None (off).
Mode = str | None


def choose_mode(flag: bool | None, stream: TextIO | None = None) -> Mode:
    """`--progress/--no-progress` (None: not given) → the mode for `stream` (default stderr)."""
    if flag is False:
        return None
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "bar" if tty else "lines"


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("WEIGHTCHECK_PROGRESS_INTERVAL", "10")))
    except ValueError:
        return 10.0


def _human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"  # pragma: no cover


class Progress:
    """`advance(nbytes, name)` as work is done; `close()` at the end (also on error)."""

    def __init__(self, label: str, total: int, mode: Mode, stream: TextIO | None = None) -> None:
        self.label, self.total, self.mode = label, max(total, 1), mode
        self.stream = stream or sys.stderr
        self.done = 0
        self.started = self._last = time.monotonic()
        self._bar: Any = None
        if mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(f"[bold]{label}"),
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=Console(file=self.stream),
                transient=True,
            )
            self._task = self._bar.add_task("", total=self.total)
            self._bar.start()

    def advance(self, nbytes: int, name: str = "") -> None:
        self.done += nbytes
        if self._bar is not None:
            self._bar.update(self._task, advance=nbytes, description=name[-60:])
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self._last >= _interval():
                self._last = now
                self._line(name)

    def _line(self, name: str) -> None:
        elapsed = time.monotonic() - self.started
        pct = 100.0 * self.done / self.total
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        self.stream.write(
            f"weightcheck {self.label}: {pct:5.1f}% {_human(self.done)} of {_human(self.total)}, "
            f"{_human(rate)}/s, ~{eta:.0f}s left{f' ({name[-60:]})' if name else ''}\n"
        )
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
