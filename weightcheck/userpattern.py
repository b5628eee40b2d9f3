"""The one syntax for tensor-name patterns a user writes: `--allow-skip` / `allow-skip` (diff and verify),
`verify --skip`, `--map` / `map` (diff), `--policy` files (diff) and `per-tensor-ignores` (every command).

A pattern is either

- a **glob** (Python `fnmatch`, case-sensitive): `*` any run of characters (dots included, possibly empty),
  `?` one character, `[...]` a character class; it must match the **whole** name:
  `model.layers.*.mlp.gate.weight`, `*.inv_freq`;
- or `re:REGEX`, a Python regular expression that must match the **whole** name (`re.fullmatch`):
  `re:model\\.layers\\.(1|3)\\..*`.

In a `--map` rule `A -> B`, each `*` of a glob A captures (lazily, the shortest run that still lets the rest
match) and fills the `*` of B in order; an `re:` A fills B's `*` with its groups.

Compatibility, policy files only: the policy format used to take a regex searched anywhere in the name
(`re.search`). A bare policy pattern keeps that reading where the glob reading could not be meant: when it
has regex syntax no tensor name contains (`\\ ^ $ ( ) | + { }`: `\\.experts\\.`, `bias$`), or no glob
wildcard at all (`lm_head`: a glob without a wildcard names one exact tensor, which the old reading also
matches). A bare pattern with a wildcard that is not a valid regex (`*.bias`) is a glob; one that reads both
ways (`model.layers.*`) is refused, with the `re:` spelling of the old reading in the message.

User patterns come from the user's own command line and settings file, so they run on Python `re` (an ignore
list read from a checkpoint goes through `weightcheck.quant.safe_regex` instead).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

GLOB_WILDCARDS = frozenset("*?[")
# Regex syntax that never appears in a tensor name: a bare policy pattern holding one is the old regex.
REGEX_ONLY = frozenset("\\^$()|+{}")


class PatternSyntaxError(ValueError):
    """A user pattern that cannot be read (a usage error: exit 2, never a finding)."""


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The regex of one pattern, to be applied with `fullmatch`. Raises PatternSyntaxError for an `re:`
    pattern that does not compile."""
    if pattern.startswith("re:"):
        try:
            return re.compile(pattern[3:])
        except (re.error, OverflowError, RecursionError) as exc:
            raise PatternSyntaxError(f"pattern {pattern!r} is not a valid regex: {exc}") from None
    return re.compile(fnmatch.translate(pattern))


def matches(pattern: str, name: str) -> bool:
    """True when `pattern` (glob or `re:`) matches the whole of `name`."""
    return compile_pattern(pattern).fullmatch(name) is not None


def first_match(name: str, patterns: Iterable[str]) -> str | None:
    """The first pattern that matches the whole of `name`, or None."""
    for pattern in patterns:
        if compile_pattern(pattern).fullmatch(name):
            return pattern
    return None


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns, each compiled once, so a bad `re:` is a usage error before any work starts."""
    out = list(patterns)
    for pattern in out:
        compile_pattern(pattern)
    return out


# ---- --map: patterns that capture ------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def capture_pattern(pattern: str) -> re.Pattern[str]:
    """The regex of a map rule's left side: a glob whose every `*` is a lazy capture group (`?` and `[...]`
    match as in any glob, without capturing), or an `re:` regex with its own groups."""
    if pattern.startswith("re:"):
        return compile_pattern(pattern)
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append("(.*?)")
        elif char == "?":
            out.append(".")
        elif char == "[":
            # A class as fnmatch reads it: translate just that piece (fnmatch's own rules for `!`, `]`).
            end = _class_end(pattern, i)
            if end is None:
                out.append(re.escape(char))
            else:
                out.append(fnmatch.translate(pattern[i : end + 1]).removesuffix(r"\Z"))  # `(?s:[...])`
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("(?s:" + "".join(out) + ")")


def _class_end(pattern: str, start: int) -> int | None:
    """Index of the `]` closing the class opened at `start`, as fnmatch finds it, or None (then `[` is literal)."""
    j = start + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    return j if j < len(pattern) else None


def captures(pattern: str) -> int:
    """How many values the left side of a map rule captures (its `*`s, or an `re:` pattern's groups)."""
    return capture_pattern(pattern).groups


# ---- --policy: the one syntax, plus the old regex-search reading of bare patterns ------------------------


@dataclass(frozen=True)
class PolicyPattern:
    """A policy rule's pattern: `search` is True for a bare pattern kept in the old `re.search` reading."""

    text: str
    search: bool

    def matches(self, name: str) -> bool:
        if self.search:
            return _search_regex(self.text).search(name) is not None
        return compile_pattern(self.text).fullmatch(name) is not None


@lru_cache(maxsize=1024)
def _search_regex(text: str) -> re.Pattern[str]:
    return re.compile(text)


@lru_cache(maxsize=1024)
def policy_pattern(text: str) -> PolicyPattern:
    """Read a policy pattern (see the module doc). Raises PatternSyntaxError for an invalid regex and for a
    bare pattern that reads both as a glob and as the old searched regex."""
    if text.startswith("re:"):
        compile_pattern(text)
        return PolicyPattern(text, search=False)
    try:
        _search_regex(text)
        valid_regex = True
    except (re.error, OverflowError, RecursionError) as exc:
        valid_regex, error = False, exc
    if REGEX_ONLY & set(text) or not GLOB_WILDCARDS & set(text):
        if not valid_regex:
            raise PatternSyntaxError(f"invalid regex {text!r}: {error}")
        return PolicyPattern(text, search=True)
    if valid_regex:
        raise PatternSyntaxError(
            f"pattern {text!r} reads both as a glob (whole name) and as the old regex searched in the name: "
            f"write `re:.*(?:{text}).*` for the regex, or a glob that covers the whole name (policy patterns "
            "follow the one user-pattern syntax: glob or `re:`, whole name)"
        )
    return PolicyPattern(text, search=False)
