"""The lists of tensor names that may be left out (`allow-skip`, `verify --skip`), in the one user-pattern
syntax of `weightcheck.userpattern` (glob or `re:`, whole name). Kept as the names diff and verify import;
the syntax itself lives in userpattern so every option reads patterns the same way."""

from __future__ import annotations

from weightcheck.userpattern import check_patterns as check_entries
from weightcheck.userpattern import compile_pattern as compile_entry
from weightcheck.userpattern import first_match

__all__ = ["check_entries", "compile_entry", "first_match"]
