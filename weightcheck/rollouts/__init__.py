"""`weightcheck rollout DUMPS`: the step-1 checklist of the slime / miles / Relax debugging guides, answered
from the debug dumps a run leaves (`--save-debug-rollout-data`, `--save-debug-train-data`, `--dump-details`).

loader (`loading`) -> normalized dumps (`readers`) -> findings (`checks`, rules in `weightcheck.rules.rollout`)
-> `Result`. torch is imported only when a `.pt` file is read.
"""

from __future__ import annotations

from pathlib import Path

from weightcheck import safe_io
from weightcheck.findings import Result
from weightcheck.rollouts.checks import Thresholds

__all__ = ["Thresholds", "check_rollout", "check_rollout_verdicts", "discover"]

# Folders a `--dump-details` directory (or a run directory) holds that are not dumps weightcheck reads.
_SKIP_DIRS = {"tokenizer", "events", "trajectory", "policy_loss_debug", "__pycache__"}
_MAX_FILES = 10_000
_MAX_DEPTH = 4


def discover(target: Path) -> tuple[list[Path], list[str]]:
    """Dump files under `target` (a file, a `--dump-details` folder, a folder of `.pt` files, a Relax
    `rollout_result/` folder): `.pt` and `.jsonl` files, and miles's `dashboard_columns/rollout_{id}.parquet`;
    symlinks out of the folder refused. Returns (paths, notes)."""
    notes: list[str] = []
    if target.is_file():
        return [target], notes
    if not target.is_dir():
        return [], [f"{target} does not exist"]
    found: list[Path] = []
    stack: list[tuple[Path, int]] = [(target, 0)]
    root = target
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError as exc:
            notes.append(f"{folder}: cannot list: {exc.strerror or exc}")
            continue
        for entry in entries:
            rel = str(entry.relative_to(root))
            try:
                real = safe_io.confine(root, rel)
            except safe_io.UnsafePath as exc:
                notes.append(f"{rel}: skipped ({exc.reason})")
                continue
            if real.is_dir():
                if entry.name in _SKIP_DIRS or depth + 1 > _MAX_DEPTH:
                    continue
                stack.append((entry, depth + 1))
            elif entry.suffix in (".pt", ".jsonl") or (
                entry.suffix == ".parquet" and entry.parent.name == "dashboard_columns"
            ):
                found.append(entry)
                if len(found) >= _MAX_FILES:
                    notes.append(f"more than {_MAX_FILES} dump files: only the first {_MAX_FILES} are read")
                    return sorted(found), notes
    return sorted(found), notes


def check_rollout(
    target: Path,
    thresholds: Thresholds | None = None,
    *,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    files: list[Path] | None = None,
) -> Result:
    """Read the dumps under `target` (or the given `files`) and run the WC8xx checks."""
    return check_rollout_verdicts(target, thresholds, select=select, ignore=ignore, files=files)[0]


def check_rollout_verdicts(
    target: Path,
    thresholds: Thresholds | None = None,
    *,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    files: list[Path] | None = None,
) -> tuple[Result, dict[str, str]]:
    """`check_rollout` plus one line per step-1 verdict (what `doctor` prints on its checklist)."""
    from weightcheck.rollouts.checks import run_checks
    from weightcheck.rollouts.readers import read_dumps
    from weightcheck.rules import all_rules, matches_selector

    th = thresholds or Thresholds()
    result = Result(target=str(target), command="rollout", root=str(target) if target.is_dir() else None)
    paths, notes = (files, []) if files is not None else discover(target)
    result.notes.extend(notes)
    if not paths:
        result.nothing_checked = True
        result.notes.append(f"no rollout or train dump (.pt, .jsonl) found under {target}")
        return result, {}
    if any(p.suffix == ".pt" for p in paths):
        from weightcheck.deps import require

        require("rollout on .pt dumps", "content", ("torch",))  # one usage error, not a crash per file
    root = target if target.is_dir() else target.parent
    dumps = read_dumps(paths, reward_key=th.reward_key, root=root)
    rules = all_rules()
    chosen = select or ["ALL"]

    def enabled(code: str) -> bool:
        rule = rules.get(code)
        return rule is None or (matches_selector(rule, chosen) and not matches_selector(rule, ignore or []))

    report = run_checks(dumps, th, enabled)
    result.findings.extend(report.findings)
    result.notes.extend(report.notes)
    result.checked = {"files": dumps.files_read, **report.checked}
    result.checked["samples"] = sum(len(d.samples) for d in dumps.rollouts)
    result.checked["train_samples"] = sum(len(d.samples) for d in dumps.trains)
    # Files were read but no check had anything to look at (empty dumps): not a pass. A refused dump is a
    # finding (WC800), a verdict on that file.
    if not report.checked and not result.findings:
        result.nothing_checked = True
        result.notes.append("no check had data to look at (no readable samples)")
    return result, report.verdicts
