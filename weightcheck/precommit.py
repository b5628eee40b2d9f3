"""`lint --pre-commit`: the targets a pre-commit hook run must lint, deleted files included.

pre-commit passes the staged files that match a hook's `files` pattern, but never deleted ones (its
`git diff --diff-filter=ACMRTUXB`): `git rm model-00002-of-00003.safetensors` alone would skip the hook and
leave a broken checkpoint green. The hook therefore runs on every commit (`always_run`) and asks git which
shard or index files were deleted; their folders are linted whole, with the files pre-commit passed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# What the `weightcheck-checkpoint` hook watches: shards and indexes (kept in step with .pre-commit-hooks.yaml).
CHECKPOINT_FILE = re.compile(r"(^|/)[^/]*\.safetensors(\.index\.json)?$")


class GitUnavailable(Exception):
    """git is missing or this is not a work tree: the deleted files cannot be known."""


def deleted_files(cwd: Path | None = None) -> list[str]:
    """Files deleted by the change being checked: the staged diff, or FROM..TO when pre-commit runs on a
    range (`pre-commit run --from-ref A --to-ref B` exports PRE_COMMIT_FROM_REF / PRE_COMMIT_TO_REF)."""
    span = (
        [os.environ["PRE_COMMIT_FROM_REF"] + "..." + os.environ["PRE_COMMIT_TO_REF"]]
        if (os.environ.get("PRE_COMMIT_FROM_REF") and os.environ.get("PRE_COMMIT_TO_REF"))
        else ["--cached"]
    )
    try:
        proc = subprocess.run(
            ["git", "diff", *span, "--name-only", "--no-renames", "--diff-filter=D", "-z"],
            cwd=cwd,
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitUnavailable(f"cannot run git: {exc}") from None
    if proc.returncode != 0:
        raise GitUnavailable(f"git diff failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
    return [name for name in proc.stdout.decode(errors="surrogateescape").split("\0") if name]


def hook_targets(passed: list[Path], cwd: Path | None = None) -> tuple[list[Path], list[str]]:
    """The files pre-commit passed plus the folders of deleted shard/index files that still exist (a folder
    deleted whole is no checkpoint any more). Paths are relative to the repository root, pre-commit's
    working directory. Returns (targets, notes)."""
    top = _toplevel(cwd)
    targets = list(passed)
    notes: list[str] = []
    for name in deleted_files(cwd):
        if not CHECKPOINT_FILE.search(name):
            continue
        folder = top / Path(name).parent
        if folder.is_dir():
            target = Path(os.path.relpath(folder, cwd or Path.cwd()))
            notes.append(f"{name} was deleted: linting its folder {target}")
            if target not in targets:
                targets.append(target)
    return targets, notes


def _toplevel(cwd: Path | None) -> Path:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitUnavailable(f"cannot run git: {exc}") from None
    if proc.returncode != 0:
        raise GitUnavailable("not inside a git work tree (the pre-commit hook runs in one)")
    return Path(proc.stdout.strip())
