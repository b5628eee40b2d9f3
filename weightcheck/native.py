"""Whether this process uses weightcheck's compiled parts, and the one for lint's per-name loops.

Two optional extensions are built by setup.py where a C compiler is found: `weightcheck._onepass` (the tap's
fused digest; its loader is `weightcheck.tap.digesting._native`, which also asks for AVX2) and
`weightcheck._lintfast` (two of header-only lint's loops that run once per tensor name: header entry
validation and grouping by template; weightcheck/_native/lintfast.c). Each has a Python twin that gives
the same results; WEIGHTCHECK_NATIVE=0 (or false/no/off) selects the Python twins for the whole process.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

ENV_NATIVE = "WEIGHTCHECK_NATIVE"
_lintfast: list[Any] = []  # [module or None], filled on first use


def native_enabled() -> bool:
    """False when WEIGHTCHECK_NATIVE turns the compiled parts off."""
    return os.environ.get(ENV_NATIVE, "1").strip().lower() not in ("0", "false", "no", "off")


def lintfast() -> Any:
    """`weightcheck._lintfast`, or None (not built here, or turned off): callers then run their Python loop."""
    if not _lintfast:
        module = None
        if native_enabled():
            try:
                import weightcheck._lintfast as module  # type: ignore[import-not-found, no-redef]
            except ImportError:
                module = None
        _lintfast.append(module)
    return _lintfast[0]
