"""Collapse families of names into patterns: `model.layers.{0..47}.mlp.gate.weight`.

Numeric dotted components are folded one position at a time (innermost first), so
`layers.{0..3}.mlp.experts.{0..127}.down_proj.weight` comes out as one line when every layer lacks the
same experts, and as several lines otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from contextvars import ContextVar, Token

from weightcheck.names import is_index

# `--verbose`: summaries list every pattern instead of "(+N more patterns)".
_FULL_LISTS: ContextVar[bool] = ContextVar("weightcheck_full_lists", default=False)


class full_lists:
    """Within this block `summarize` never truncates (what `-v` asks for). A class rather than
    `contextlib.contextmanager`: contextlib stays off lint's start-up path."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.token: Token[bool] | None = None

    def __enter__(self) -> None:
        self.token = _FULL_LISTS.set(self.enabled)

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            _FULL_LISTS.reset(self.token)


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
    # Only the last few components are folded: a name of 100,000 dots must not cost 100,000 passes.
    for pos_from_right in range(1, min(max_len, 16) + 1):
        groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
        passthrough: list[tuple[str, ...]] = []
        for row in rows:
            if len(row) < pos_from_right:
                passthrough.append(row)
                continue
            idx = len(row) - pos_from_right
            comp = row[idx]
            if is_index(comp) and (comp == "0" or not comp.startswith("0")):
                key = (len(row), idx, row[:idx], row[idx + 1 :])
                groups[key].append(int(comp))
            else:
                passthrough.append(row)
        new_rows = list(passthrough)
        for (_, _idx, head, tail), values in groups.items():
            new_rows.append((*head, brace(values), *tail))
        rows = new_rows
    return sorted(".".join(r) for r in rows)


# A message summarizes at most this many names: a hostile index with 10^6 entries must not make the
# summary cost gigabytes of split names (the finding's count still says how many there are).
SUMMARY_SAMPLE = 50_000


def summarize(names: Iterable[str], limit: int = 6) -> str:
    """One short string for a message: collapsed patterns, truncated with a count."""
    unique = names if isinstance(names, (set, frozenset)) else set(names)
    extra = ""
    if len(unique) > SUMMARY_SAMPLE:
        extra = f" (summary of the first {SUMMARY_SAMPLE} of {len(unique)} names)"
        import heapq

        unique = heapq.nsmallest(SUMMARY_SAMPLE, unique)
    patterns = collapse_names(unique)
    if len(patterns) <= limit or _FULL_LISTS.get():
        return ", ".join(patterns) + extra
    return ", ".join(patterns[:limit]) + f", … (+{len(patterns) - limit} more patterns)" + extra
