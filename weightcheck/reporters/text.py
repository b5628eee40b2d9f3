"""Human-readable report, grouped by rule. Uses rich (colour) on a terminal, plain text otherwise."""

from __future__ import annotations

from itertools import groupby
from typing import TextIO

from weightcheck.findings import Result, Severity

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


_SEVERITY_NOUNS = {"error", "warning", "finding"}


def plural(n: int, noun: str) -> str:
    """`1 warning`, `2 warnings`, `1 shard` (from the key `shards`); other keys (`equal`, `only in reference`)
    are printed as they are."""
    if noun in _SEVERITY_NOUNS:
        return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
    if n == 1 and noun.endswith("s") and not noun.endswith("ss"):
        return f"{n} {noun[:-1]}"
    return f"{n} {noun}"


def _lines(result: Result, verbose: bool) -> list[tuple[str, str]]:
    """(style, text) pairs; style "" means plain."""
    out: list[tuple[str, str]] = []
    findings = result.sorted_findings()
    for (code, name), group in groupby(findings, key=lambda f: (f.code, f.name)):
        items = list(group)
        sev = items[0].severity
        out.append((_STYLE[sev], f"{code} {name} [{sev.label}] — {plural(len(items), 'finding')}"))
        shown = items if verbose else items[:20]
        for f in shown:
            # A name list the message already spells out is not printed a second time in front of it.
            parts = [x for x in (f.location.file, f.location.tensor) if x and x.split(", …")[0] not in f.message]
            where = " ".join(parts)
            out.append(("", f"  {where}: {f.message}" if where else f"  {f.message}"))
            related = getattr(f, "related", None)
            if verbose and related:
                for rel in related:
                    text = getattr(rel, "message", rel)
                    out.append(("dim", f"    related: {getattr(rel, 'code', '')} {text}".rstrip()))
        if len(items) > len(shown):
            out.append(("dim", f"  … {len(items) - len(shown)} more (use --verbose)"))
    for note in result.notes:
        out.append(("dim", f"note: {note}"))
    counts = result.counts()
    # Counts that describe coverage (lint: shards/tensors/layers; diff/verify: compared, equal, failed...).
    hidden = ("rules", "header_bytes_read", "bytes_read")
    checked = ", ".join(
        plural(v, k.replace("_", " ")) for k, v in result.checked.items() if isinstance(v, int) and k not in hidden
    )
    if result.nothing_checked:
        out.append(("bold red", "nothing was checked"))
    elif not result.findings:
        out.append(("bold green", f"clean: {checked}"))
    else:
        summary = ", ".join(plural(n, k) for k, n in counts.items() if n)
        out.append(("bold", f"{summary} ({checked})"))
    return out


def emit_text(result: Result, stream: TextIO, *, color: bool | None = None, verbose: bool = False) -> None:
    use_color = stream.isatty() if color is None else color
    lines = _lines(result, verbose)
    if not use_color:
        for _, text in lines:
            stream.write(text + "\n")
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, force_terminal=True, highlight=False, soft_wrap=True)
    for style, text in lines:
        console.print(Text(text, style=style or ""))
