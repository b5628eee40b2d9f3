"""Run the weightcheck CLI under the hostile-input contract's instruments (used by tests/fuzzing.py).

`python tests/fuzz_child.py AUDIT_LOG MEM_BYTES CPU_SECONDS FORBIDDEN_JSON -- weightcheck-args...`

- a CPU-time limit (RLIMIT_CPU): a hang is measured in CPU seconds, so that a loaded machine's slow wall
  clock is not mistaken for one (SIGXCPU ends the run);
- an address-space limit (RLIMIT_AS) of MEM_BYTES: a blow-up dies with MemoryError instead of taking the
  machine with it;
- a `sys.addaudithook` that logs every `open` whose real path lies under one of the FORBIDDEN prefixes
  (honeypots outside the target, /etc/passwd, /proc/self/environ) as `OUTSIDE path`, and every open for
  writing anywhere as `WRITE path`. The log is written through a file descriptor opened before the hook;
- at exit, the peak resident set size (`MAXRSS kilobytes`, VmHWM of /proc/self/status) is logged, so the
  harness can hold every case to the memory budget of docs/security.md (RLIMIT_AS alone only catches
  blow-ups far above it: torch maps ~1.5 GB of address space it never touches). Not getrusage's
  ru_maxrss: Linux keeps it across execve, so it would report the fuzzing parent's peak at fork time.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys


def peak_rss_kb() -> int:
    """This process's peak resident memory in kB since its execve (VmHWM; a new address space starts at 0)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    audit_path, mem, cpu, forbidden_json, sep, *args = sys.argv[1:]
    assert sep == "--"
    forbidden = [os.path.realpath(p) for p in json.loads(forbidden_json)]
    log_fd = os.open(audit_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def hook(event: str, hook_args: tuple) -> None:
        if event != "open":
            return
        path, mode, flags = hook_args
        if path is None or isinstance(path, int):
            return
        try:
            real = os.path.realpath(os.fsdecode(path))
        except Exception:  # a hook must never raise
            real = repr(path)
        writes = (isinstance(flags, int) and flags & write_flags) or (
            isinstance(mode, str) and any(c in mode for c in "wax+")
        )
        lines = []
        if writes:
            lines.append(f"WRITE {real}\n")
        if any(real == f or real.startswith(f.rstrip("/") + "/") for f in forbidden):
            lines.append(f"OUTSIDE {real}\n")
        for line in lines:
            os.write(log_fd, line.encode("utf-8", "backslashreplace"))

    resource.setrlimit(resource.RLIMIT_AS, (int(mem), int(mem)))
    resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 5))
    sys.addaudithook(hook)
    # SystemExit (the CLI's normal way out) runs atexit handlers; a kill by a limit leaves no line, which the
    # harness already reports as a violation.
    atexit.register(lambda: os.write(log_fd, f"MAXRSS {peak_rss_kb()}\n".encode()))
    sys.argv = ["weightcheck", *args]
    from weightcheck.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
