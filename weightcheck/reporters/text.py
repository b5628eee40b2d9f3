"""Human-readable report, grouped by rule. Uses rich (colour) on a terminal, plain text otherwise."""

from __future__ import annotations

from itertools import groupby

from weightcheck.findings import Finding, Result, Severity

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms of every lint's start-up, #20)
if TYPE_CHECKING:
    from typing import TextIO

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


def _where(f: Finding) -> str:
    # A location already spelled out in the message is not printed twice.
    parts = [x for x in (f.location.file, f.location.tensor) if x and x.split(", …")[0] not in f.message]
    return " ".join(parts)


def _lines(result: Result, verbose: bool, quiet: bool = False) -> list[tuple[str, str]]:
    """(style, text) pairs; style "" means plain."""
    out: list[tuple[str, str]] = []
    findings = result.sorted_findings()
    for (code, name), group in groupby(findings, key=lambda f: (f.code, f.name)):
        items = list(group)
        sev = items[0].severity
        head = f"{code} {name} [{sev.label}] — {plural(len(items), 'finding')} · weightcheck rules {code}"
        out.append((_STYLE[sev], head))
        shown = items if verbose else items[:20]
        one_fix = len({f.fix for f in items}) == 1
        for f in shown:
            where = _where(f)
            out.append(("", f"  {where}: {f.message}" if where else f"  {f.message}"))
            if f.fix and not one_fix:
                out.append(("dim", f"    fix: {f.fix}"))
            if f.related and verbose:
                for r in f.related:
                    rw = _where(r)
                    out.append(("dim", f"    related {r.code} {r.name}: {rw + ': ' if rw else ''}{r.message}"))
            elif f.related:
                codes = ", ".join(dict.fromkeys(r.code for r in f.related))
                more = f"    + {len(f.related)} follow-on finding(s) from this cause ({codes}); -v shows them"
                out.append(("dim", more))
        if len(items) > len(shown):
            out.append(("dim", f"  … {len(items) - len(shown)} more (use --verbose)"))
        if one_fix and items[0].fix:
            out.append(("dim", f"  fix: {items[0].fix}"))
    if quiet:  # -q: the findings only; a run that checked nothing still says so (exit 3 needs a reason)
        if result.nothing_checked:
            out.append(("bold red", "nothing was checked"))
        elif result.unchecked_targets:
            out.append(("bold red", f"not checked: {', '.join(result.unchecked_targets)} (exit 3)"))
        return out
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
        return out
    config_only = result.command == "lint" and not result.checked.get("shards") and not result.checked.get("tensors")
    if not result.findings and config_only:
        # a folder whose conversion never wrote weights must not read as a clean checkpoint
        out.append(("bold green", "clean, config only: no weights were found or read"))
    elif not result.findings:
        out.append(("bold green", f"clean: {checked}"))
    else:
        summary = ", ".join(plural(n, k) for k, n in counts.items() if n)
        out.append(("bold", f"{summary} ({checked})"))
    if result.unchecked_targets:  # one missing target among good ones: named, not "nothing was checked"
        out.append(("bold red", f"not checked: {', '.join(result.unchecked_targets)} (exit 3)"))
    return out


def emit_text(
    result: Result, stream: TextIO, *, color: bool | None = None, verbose: bool = False, quiet: bool = False
) -> None:
    use_color = stream.isatty() if color is None else color
    lines = _lines(result, verbose, quiet)
    if not use_color:
        for _, text in lines:
            stream.write(text + "\n")
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, force_terminal=True, highlight=False, soft_wrap=True)
    for style, text in lines:
        console.print(Text(text, style=style or ""))
