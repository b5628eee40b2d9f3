"""Config-only lint in process CPU time (user + system of the whole child process), against the json-parse
floor, and optionally against another source tree (a baseline commit) in the same run.

    python benchmarks/bench_config_cpu.py [--repeat 9] [--baseline-tree DIR]

CPU time is far less sensitive than wall time to the other jobs on a shared machine. Commands alternate
within each repetition (floor, this tree, baseline tree); figures are medians. Inputs: the published
Qwen3-30B-A3B-FP8 config (`sample_configs/qwen3-30b-a3b-fp8-block`, a 145-entry `modules_to_not_convert`)
and the Qwen3-235B-A22B-style config of bench_lint_real.py (94 layers x 128 experts, 283 entries).

`--python PY`: floor and lint run with that interpreter and the weightcheck installed in its environment (a
plain `pip install .`: an editable install's start-up hook adds ~20 ms to the floor as well). Lint then runs
that environment's `weightcheck` console script, as a user types it (`python -m` adds runpy, ~5 ms).
`--baseline-python PY`: the baseline is the weightcheck installed with that interpreter (e.g. a plain install
of an older commit in another venv), run the same way.

`--baseline-tree DIR`: a directory holding another checkout's `weightcheck/` (and `patterns/`), e.g.
`mkdir /tmp/base && git archive <commit> weightcheck patterns | tar -x -C /tmp/base`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from childproc import child_cpu_seconds  # noqa: E402 (found through the line above)

FLOOR = "import json, sys; json.load(open(sys.argv[1] + '/config.json'))"
# What the `weightcheck` console script runs (`weightcheck.launch:main`; `weightcheck.cli:main` in trees before
# the launcher): `python -m weightcheck` reaches the same entry in either tree.
LINT = "-m weightcheck lint"


PYTHON = [sys.executable]  # `--python`: another interpreter (a plain, non-editable install) for every command


def _console_script(python: str) -> str | None:
    script = Path(python).parent / "weightcheck"
    return str(script) if script.is_file() else None


def cpu_seconds(code: str, target: Path, tree: Path | None, python: str | None = None) -> float:
    """User + system CPU seconds of one `python -c code target --format json` process (lint: `python -m
    weightcheck lint`, or with `python` given, that environment's console script)."""
    script = _console_script(python) if python else None
    if code is LINT and script:
        args = [script, "lint", str(target.resolve()), "--format", "json"]
    elif code is LINT:
        args = [python or PYTHON[0], "-m", "weightcheck", "lint", str(target.resolve()), "--format", "json"]
    else:
        args = [PYTHON[0], "-c", code, str(target.resolve())]
    seconds, returncode = child_cpu_seconds(args, tree, cached_bytecode=True)
    if code is LINT and returncode not in (0, 1):
        raise SystemExit(f"lint of {target} exited {returncode}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--baseline-tree", type=Path)
    ap.add_argument(
        "--python",
        type=Path,
        help="run floor and lint with this interpreter and the weightcheck installed there (no source tree): "
        "an editable install's start-up hook costs the floor ~20 ms that a plain `pip install` does not",
    )
    ap.add_argument("--baseline-python", type=Path, help="baseline: the weightcheck installed with this interpreter")
    args = ap.parse_args()
    if args.python:
        PYTHON[0] = str(args.python)
    from bench_lint_real import qwen3_235b_fp8

    work = Path(tempfile.mkdtemp(prefix="wc-config-cpu-"))
    inputs = {
        "Qwen3-30B-A3B-FP8 (published, 145 entries)": ROOT / "sample_configs" / "qwen3-30b-a3b-fp8-block",
        "Qwen3-235B-A22B-style FP8 (94x128, 283 entries)": qwen3_235b_fp8(work),
    }
    trees = {"floor": None, "lint": None if args.python else ROOT}
    pythons = {"lint": str(args.python) if args.python else None}
    if args.baseline_tree:
        trees["baseline"] = args.baseline_tree.resolve()
    elif args.baseline_python:
        trees["baseline"] = None
        pythons["baseline"] = str(args.baseline_python)
    for key, tree in trees.items():  # warm the bytecode caches before timing
        if key != "floor":
            cpu_seconds(LINT, next(iter(inputs.values())), tree, pythons.get(key))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| input | floor | lint | ratio |" + (" baseline | ratio |" if "baseline" in trees else ""))
    for label, target in inputs.items():
        times: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(args.repeat):
            for key, tree in trees.items():
                times[key].append(cpu_seconds(FLOOR if key == "floor" else LINT, target, tree, pythons.get(key)))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = f"| {label} | {med['floor']:.3f} s | {med['lint']:.3f} s | {med['lint'] / med['floor']:.1f}x |"
        if "baseline" in med:
            row += f" {med['baseline']:.3f} s | {med['baseline'] / med['floor']:.1f}x |"
        print(row, flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
