"""Collapse families of names into patterns: `model.layers.{0..47}.mlp.gate.weight`.

Numeric dotted components are folded one position at a time (innermost first), so
`layers.{0..3}.mlp.experts.{0..127}.down_proj.weight` comes out as one line when every layer lacks the
same experts, and as several lines otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# `--verbose`: summaries list every pattern instead of "(+N more patterns)".
_FULL_LISTS: ContextVar[bool] = ContextVar("weightcheck_full_lists", default=False)


@contextmanager
def full_lists(enabled: bool = True) -> Iterator[None]:
    """Within this block `summarize` never truncates (what `-v` asks for)."""
    token = _FULL_LISTS.set(enabled)
    try:
        yield
    finally:
        _FULL_LISTS.reset(token)


def format_ranges(values: Iterable[int]) -> str:
    """`[0,1,2,3,7,9,10]` → `0..3,7,9..10`."""
    ordered = sorted(set(values))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for v in ordered[1:]:
        if v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        start = prev = v
    parts.append(str(start) if start == prev else f"{start}..{prev}")
    return ",".join(parts)


def brace(values: Iterable[int]) -> str:
    ordered = sorted(set(values))
    if len(ordered) == 1:
        return str(ordered[0])
    return "{" + format_ranges(ordered) + "}"


def ids_pattern(values: Iterable[int]) -> str:
    """Layer/expert ids for a name pattern: `7` for one id, `{0..3,7}` for several."""
    return brace(values)


def collapse_names(names: Iterable[str]) -> list[str]:
    """Collapse dotted names with numeric components into brace patterns, sorted."""
    rows: list[tuple[str, ...]] = [tuple(n.split(".")) for n in set(names)]
    if not rows:
        return []
    # Positions (from the right, to be robust to different prefixes) holding numbers somewhere.
    max_len = max(len(r) for r in rows)
    for pos_from_right in range(1, max_len + 1):
        groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
        passthrough: list[tuple[str, ...]] = []
        for row in rows:
            if len(row) < pos_from_right:
                passthrough.append(row)
                continue
            idx = len(row) - pos_from_right
            comp = row[idx]
            if comp.isdigit() and (comp == "0" or not comp.startswith("0")):
                key = (len(row), idx, row[:idx], row[idx + 1 :])
                groups[key].append(int(comp))
            else:
                passthrough.append(row)
        new_rows = list(passthrough)
        for (_, _idx, head, tail), values in groups.items():
            new_rows.append((*head, brace(values), *tail))
        rows = new_rows
    return sorted(".".join(r) for r in rows)


def summarize(names: Iterable[str], limit: int = 6) -> str:
    """One short string for a message: collapsed patterns, truncated with a count."""
    patterns = collapse_names(names)
    if len(patterns) <= limit or _FULL_LISTS.get():
        return ", ".join(patterns)
    return ", ".join(patterns[:limit]) + f", … (+{len(patterns) - limit} more patterns)"
