"""One syntax for the lists of tensor names that may be left out: `allow-skip` (settings file, `diff
--allow-skip`) and `verify --skip`. An entry is a glob (fnmatch: `*`, `?`, `[...]`) or `re:REGEX` (Python
`re`); either must match the whole name. diff and verify read the same `allow-skip` setting, so they must
read it the same way: before this module, verify took `re:` entries as globs and silently matched nothing.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from functools import lru_cache


@lru_cache(maxsize=4096)
def compile_entry(entry: str) -> re.Pattern[str]:
    """The regex of one entry. Raises ValueError for an `re:` entry that does not compile."""
    if entry.startswith("re:"):
        try:
            return re.compile(entry[3:])
        except re.error as exc:
            raise ValueError(f"skip entry {entry!r} is not a valid regex: {exc}") from None
    return re.compile(fnmatch.translate(entry))


def first_match(name: str, entries: Iterable[str]) -> str | None:
    """The first entry that matches the whole of `name`, or None."""
    for entry in entries:
        if compile_entry(entry).fullmatch(name):
            return entry
    return None


def check_entries(entries: Iterable[str]) -> list[str]:
    """The entries, each compiled once: raises ValueError (a usage error) for an `re:` entry that does not
    compile, before any work starts."""
    out = list(entries)
    for entry in out:
        compile_entry(entry)
    return out
