"""The same checkpoint gives byte-identical JSON whatever the interpreter's hash seed: users diff reports
across runs and CI jobs. The shipped router-packed sample reported its modules in set order before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "sample_configs").iterdir() if p.is_dir())


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.name for p in SAMPLES])
def test_lint_json_does_not_depend_on_the_hash_seed(sample: Path) -> None:
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-m", "weightcheck", "lint", str(sample), "--format", "json"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)  # fmt: skip
        assert run.returncode in (0, 1), run.stderr
        outputs.add(run.stdout)
    assert len(outputs) == 1
