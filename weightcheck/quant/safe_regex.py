"""Regexes from untrusted files, evaluated without catastrophic backtracking.

An `ignore` list entry like `re:(.+)+!` makes Python's backtracking `re` run for longer than the universe
on a 40-character module name. The consumers we model use Python `re`, so validity and meaning are
Python's; only the *evaluation* changes:

- the pattern must compile with Python `re` (otherwise: invalid, as every consumer would fail too);
- where RE2 (`google-re2`, linear time) accepts the pattern and the text is ASCII without a newline —
  tensor and module names always are — RE2 answers, with the same `match` / `fullmatch` semantics
  (for such text Python's Unicode classes, case folding and `$` agree with RE2's);
- otherwise (RE2 refuses lookarounds, backreferences, `\\Z`, repetition counts above 1000, ...) Python `re`
  answers only if the parsed pattern has no nested or alternated repetition (the shapes that backtrack
  exponentially); a pattern that has both problems is refused: `compile` returns None and `refusal()`
  says why, which the quantization rules report like a pattern that does not compile.
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any


@lru_cache(maxsize=1)
def _re2_module() -> tuple[Any, Any]:
    """(google-re2, its options), or (None, None) without it. Imported on the first `re:` entry, not with
    the package: most ignore lists hold module names only, and config-only lint pays every import."""
    try:
        import re2
    except ImportError:  # pragma: no cover - google-re2 has wheels for every supported platform
        return None, None
    options: Any = re2.Options()
    options.log_errors = False
    options.max_mem = 64 << 20
    return re2, options


try:  # Python >= 3.11
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_PATTERN_CHARS = 1 << 20

_REPEATS = {_sre_parse.MAX_REPEAT, _sre_parse.MIN_REPEAT, getattr(_sre_parse, "POSSESSIVE_REPEAT", None)} - {None}


class SafeRegex:
    """A compiled pattern with Python `re` meaning and (where possible) RE2 evaluation."""

    __slots__ = ("_py", "_re2", "pattern")

    def __init__(self, pattern: str, py: re.Pattern[str] | None, re2_compiled: Any) -> None:
        self.pattern = pattern
        self._py = py
        self._re2 = re2_compiled

    def _use_re2(self, text: str) -> bool:
        # Exact for ASCII text without a newline; beyond that only when `re` could backtrack without end.
        return self._re2 is not None and (self._py is None or (text.isascii() and "\n" not in text))

    def match(self, text: str) -> bool:
        """`re.match`: anchored at the start only."""
        if self._use_re2(text):
            return self._re2.match(text) is not None
        return self._py is not None and self._py.match(text) is not None

    def fullmatch(self, text: str) -> bool:
        if self._use_re2(text):
            return self._re2.fullmatch(text) is not None
        return self._py is not None and self._py.fullmatch(text) is not None


class _DottedLiteral(SafeRegex):
    """A pattern of literal name characters, `.` (any character but a newline) and `\\.` (a dot): what a
    module name used as a regex is (transformers' `modules_to_not_convert` entries, `entry + r"\\."`).
    Matched by comparing characters, with `re` meaning, without compiling a regex: an ignore list of a few
    hundred module names otherwise spends most of a config-only lint in `re` / RE2 compilation."""

    __slots__ = ("_literals", "_width")

    def __init__(self, pattern: str, width: int, pieces: list[tuple[int, str]]) -> None:
        """`pieces`: the literal characters as (start, text) runs: one comparison per piece (`model`,
        `layers`, `3`, ...), not per character."""
        super().__init__(pattern, None, None)
        self._width = width
        self._literals = pieces

    def _fits(self, text: str) -> bool:
        # `.` matches anything but a newline; the other positions must hold their literal characters.
        head = text[: self._width]
        return "\n" not in head and all(head.startswith(piece, i) for i, piece in self._literals)

    def match(self, text: str) -> bool:
        return len(text) >= self._width and self._fits(text)

    def fullmatch(self, text: str) -> bool:
        return len(text) == self._width and self._fits(text)


_DOTTED_LITERAL = re.compile(r"(?:[A-Za-z0-9_]|\\?\.)*")
_LITERAL_RUN = re.compile(r"[^.]+")


def _dotted_literal(pattern: str) -> _DottedLiteral | None:
    """The character-comparing form of `pattern`, if it has that shape (else None: compile it)."""
    if not _DOTTED_LITERAL.fullmatch(pattern):
        return None
    # One character per position: `\.` (a literal dot, the only escape the shape admits) becomes NUL, which the
    # shape excludes, so the literal pieces are the runs of characters other than the `.` wildcard.
    flat = pattern.replace("\\.", "\0") if "\\" in pattern else pattern
    pieces = [(m.start(), m.group().replace("\0", ".")) for m in _LITERAL_RUN.finditer(flat)]
    return _DottedLiteral(pattern, len(flat), pieces)


def _backtracks(pattern: str) -> bool:
    """True when the parsed pattern has a repetition containing another repetition or an alternation
    (`(a+)+`, `(a|aa)*`, `(.*)*`): the shapes with exponential backtracking in Python `re`."""
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:
        return True

    def walk(items: Any, inside_repeat: bool) -> bool:
        for op, arg in items:
            if op in _REPEATS:
                lo, hi, sub = arg
                if inside_repeat and hi != lo:
                    return True
                if walk(sub, inside_repeat or hi > 1):
                    return True
            elif op is _sre_parse.BRANCH:
                if inside_repeat:
                    return True
                if any(walk(b, inside_repeat) for b in arg[1]):
                    return True
            elif op is _sre_parse.SUBPATTERN:
                if walk(arg[-1], inside_repeat):
                    return True
            elif op in (_sre_parse.ASSERT, _sre_parse.ASSERT_NOT):
                if walk(arg[1], True):
                    return True
            elif op is _sre_parse.GROUPREF_EXISTS:
                if walk(arg[1], inside_repeat) or (arg[2] is not None and walk(arg[2], inside_repeat)):
                    return True
            elif op is _sre_parse.GROUPREF and inside_repeat:
                return True
        return False

    return walk(parsed, False)


@lru_cache(maxsize=8192)
def _compile(pattern: str) -> tuple[SafeRegex | None, str | None]:
    if len(pattern) > MAX_PATTERN_CHARS:
        return None, f"pattern longer than {MAX_PATTERN_CHARS} characters"
    literal = _dotted_literal(pattern)
    if literal is not None:
        return literal, None
    try:
        with warnings.catch_warnings():  # `[[:alpha:]]` warns about nested sets; a config must not spam stderr
            warnings.simplefilter("ignore")
            py = re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError, MemoryError) as exc:
        return None, f"does not compile: {str(exc)[:160]}"
    fast = None
    # `[[:alpha:]]` (a POSIX class in RE2, a plain set in `re`) and `a{,3}` (a count in `re` >= 3.11, a
    # literal in RE2) are spelled alike but mean different things: those go to `re`.
    re2, options = _re2_module() if pattern.isascii() and "[:" not in pattern and "{," not in pattern else (None, None)
    if re2 is not None:
        try:
            fast = re2.compile(pattern, options)
        except Exception:
            fast = None
    if fast is not None:
        # RE2 answers for ASCII names; non-ASCII names fall back to `re` only when that cannot blow up.
        return SafeRegex(pattern, None if _backtracks(pattern) else py, fast), None
    if _backtracks(pattern):
        return None, "cannot be evaluated safely: not RE2 syntax, and nested repetition could backtrack without end"
    return SafeRegex(pattern, py, None), None


def compile_regex(pattern: str) -> SafeRegex | None:
    """The safe compiled form of `pattern`, or None (invalid in Python `re`, or refused: see `refusal`)."""
    return _compile(pattern)[0]


def refusal(pattern: str) -> str | None:
    """Why `compile_regex(pattern)` is None (does not compile / cannot be evaluated safely), or None if usable."""
    return _compile(pattern)[1]


def match(pattern: str, text: str) -> bool:
    """`re.match(pattern, text) is not None`, evaluated safely (False for an invalid/refused pattern)."""
    compiled = _compile(pattern)[0]
    return compiled is not None and compiled.match(text)


def fullmatch(pattern: str, text: str) -> bool:
    compiled = _compile(pattern)[0]
    return compiled is not None and compiled.fullmatch(text)


def glob_to_regex(glob: str) -> str:
    """SGLang ModelOpt glob translation (escape `.`, `*` → `.*`, other characters pass through), with runs
    of `*` collapsed first: `**` and `*` match the same strings, and 5,000 of them would otherwise make a
    pattern of 5,000 `.*`."""
    return re.sub(r"\*+", "*", glob).replace(".", r"\.").replace("*", ".*")
