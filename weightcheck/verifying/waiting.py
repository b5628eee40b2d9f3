"""Waiting for a sync's rank records to land (`--wait`, `wait=`, `expected_records=`) and the WC734 finding
when fewer arrived than expected."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from weightcheck import safe_io
from weightcheck.findings import Finding, Severity
from weightcheck.rules.verify import SYNC_RANKS_INCOMPLETE, make_finding
from weightcheck.tap.records import find_record_files


def wait_for_records(
    root: Path, weight_version: str | None, expected: int, wait: float, say: Callable[[str], None] | None = None
) -> None:
    """`--wait` / `wait=`: poll until the sync's `expected` rank records have landed or `wait` seconds passed.
    `say` hears a line when the wait starts, one each time the count changes, and one at the end (the CLI
    prints them on stderr: a silent wait of minutes looks like a hang)."""
    deadline = time.monotonic() + max(0.0, wait)
    found = count_records(root, weight_version)
    if found >= expected or wait <= 0:
        return
    tell = say or (lambda _line: None)
    what = f" of weight version {weight_version}" if weight_version else ""
    tell(f"weightcheck verify: waiting up to {wait:g}s for {expected} rank records{what}: {found} so far")
    while found < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        now = count_records(root, weight_version)
        if now != found:
            found = now
            tell(f"weightcheck verify: {found} of {expected} rank records")
    if found < expected:
        tell(f"weightcheck verify: stopped waiting after {wait:g}s with {found} of {expected}")


def records_incomplete(root: Path, weight_version: str | None, expected: int, wait: float) -> Finding | None:
    """WC734 when fewer than `expected` rank records of the sync are there (after `wait_for_records`)."""
    found = count_records(root, weight_version)
    if found >= expected:
        return None
    return make_finding(
        SYNC_RANKS_INCOMPLETE,
        f"only {found} of {expected} rank records arrived within {wait:g}s",
        severity=Severity.ERROR,
    )


def count_records(root: Path, weight_version: str | None) -> int:
    files = find_record_files(root)
    if not files:
        return 0
    if weight_version is None:
        return len(files[max(files)])
    count = 0
    for paths in files.values():
        for path in paths:
            try:
                # Only the header line matters; the confinement layer refuses FIFOs and escaping symlinks.
                fd, _ = safe_io.open_regular(safe_io.confine(path.parent, path.name))
            except safe_io.UnsafePath:
                continue
            with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
                header = fh.readline(1 << 20)
            if f'"weight_version":"{weight_version}"' in header.replace(" ", ""):
                count += 1
    return count
