"""CPU time of one child process, for the benchmarks that time whole processes (bench_lint, bench_config_cpu).

User + system CPU seconds of the whole child: far less sensitive than wall time to other jobs on a shared
machine. The child runs outside every source tree: `python -m` and `python -c` put the working directory first
on sys.path, which would shadow a PYTHONPATH naming another tree (a baseline commit's checkout).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path


def child_cpu_seconds(args: list[str], tree: Path | None = None, cached_bytecode: bool = False) -> tuple[float, int]:
    """(user + system CPU seconds, exit code) of `args` run to the end, output discarded. `tree`: put first on
    PYTHONPATH. `cached_bytecode`: unset PYTHONDONTWRITEBYTECODE, so that the child compiles once and reads its
    cache after, as an installed package does."""
    env = dict(os.environ)
    if cached_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    proc = subprocess.Popen(
        args, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, proc.returncode
