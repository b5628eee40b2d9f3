"""Whether this process uses weightcheck's compiled parts, and the loaders of both.

Two optional extensions are built by setup.py where a C compiler is found: `weightcheck._onepass` (the tap's
fused digest, weightcheck/_native/onepass.c; used only where its AVX2 loop runs) and `weightcheck._lintfast`
(two of header-only lint's loops that run once per tensor name: header entry validation and grouping by
template; weightcheck/_native/lintfast.c). Each has a Python twin that gives the same results;
WEIGHTCHECK_NATIVE=0 (or false/no/off) selects the Python twins for the whole process.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

ENV_NATIVE = "WEIGHTCHECK_NATIVE"
# [module or None] each, filled on first use (tests swap the module in and out here)
_lintfast: list[Any] = []
_onepass: list[Any] = []


def native_enabled() -> bool:
    """False when WEIGHTCHECK_NATIVE turns the compiled parts off."""
    return os.environ.get(ENV_NATIVE, "1").strip().lower() not in ("0", "false", "no", "off")


def lintfast() -> Any:
    """`weightcheck._lintfast`, or None (not built here, or turned off): callers then run their Python loop."""
    return _lintfast[0] if _lintfast else _load(_lintfast, _import_lintfast)


def onepass() -> Any:
    """`weightcheck._onepass` where this CPU runs its fused loop, or None (not built here, no AVX2 or not
    x86-64, or turned off): the tap then runs the numpy loop over python-xxhash."""
    return _onepass[0] if _onepass else _load(_onepass, _import_onepass)


def _load(cache: list[Any], load: Callable[[], Any]) -> Any:
    module = None
    if native_enabled():
        try:
            module = load()
        except ImportError:
            module = None
    cache[:] = [module]
    return module


def _import_lintfast() -> Any:
    import weightcheck._lintfast as module  # type: ignore[import-not-found]

    return module


def _import_onepass() -> Any:
    import weightcheck._onepass as module  # type: ignore[import-not-found]

    # Without AVX2 (or off x86-64) the module has no fused loop: python-xxhash's own dispatch then hashes
    # faster than a separate pass in C would, so the numpy loop stays.
    return module if module.level() == "avx2-fused" else None
