"""Module-level regular expressions compiled at their first use, not at import.

Why: importing a module compiled every `re.compile(...)` at its top, and Python's regex compiler takes
0.1-0.4 ms per pattern: ~5 ms of config-only lint's start-up went to patterns that lint of a config never
reads (content, index and layer rules, shard names; issue #20, `python benchmarks/bench_config_cpu.py`).
After the first use the compiled pattern's methods sit on the object itself, so a later `.match` costs what
it costs on a compiled pattern.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

_METHODS = ("match", "search", "fullmatch", "sub", "subn", "finditer", "findall", "split", "groupindex", "groups")


class LazyRegex:
    """`re.compile(pattern, flags)` on first use: `.match`, `.search`, `.sub`, ... as on the compiled pattern."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern, self.flags = pattern, flags

    def __getattr__(self, name: str) -> Any:
        # Only reached for what is not set yet: compile, then keep the compiled pattern's methods here.
        if name.startswith("__"):
            raise AttributeError(name)
        compiled = re.compile(self.pattern, self.flags)
        for method in _METHODS:
            setattr(self, method, getattr(compiled, method))
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"LazyRegex({self.pattern!r})"
