"""`weightcheck explain-ignore`: per ignore entry, what each consumer matches, and where they disagree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from weightcheck.cli import cli, config_and_output_options, hub_options, with_revision
from weightcheck.collapse import summarize
from weightcheck.findings import EXIT_NOTHING_CHECKED


def explain(path: Path, pattern: str | None = None) -> dict[str, Any]:
    """The explanation as a document (also what --format json prints)."""
    from weightcheck.checkpoint import load_checkpoint
    from weightcheck.hub import resolve
    from weightcheck.quant.analysis import analyze_checkpoint

    resolved = resolve(path, needs_data=False, download_ok=False, what="explain-ignore")  # a repo: header-only
    qa = analyze_checkpoint(load_checkpoint(resolved.source or resolved.path or path), pattern)
    doc: dict[str, Any] = {"target": str(path), "notes": qa.notes, "entries": []}
    if qa.spec is None:
        doc["error"] = "no quantization config found"
        return doc
    doc.update(method=qa.spec.method, source=qa.spec.source, field=qa.spec.ignore_field)
    if qa.inventory is None:
        doc["error"] = "no modules to match against (no tensors and no architecture pattern)"
        return doc
    # Per consumer, entry -> the names it matches (sorted), from the compiled template-level evaluation.
    by_entry: dict[str, dict[str, list[str]]] = {}
    for consumer in qa.consumers:
        names: set[str] | dict[str, Any] = (
            set(qa.inventory.params) if consumer.level == "param" else qa.inventory.modules
        )
        inverse: dict[str, list[str]] = {}
        for name, found in qa.hits(consumer).items():
            if name in names:
                for e in found:
                    inverse.setdefault(e, []).append(name)
        by_entry[consumer.key] = {e: sorted(v) for e, v in inverse.items()}
    for entry in qa.spec.ignore:
        per: dict[str, Any] = {}
        module_sets: dict[str, frozenset[str]] = {}
        for consumer in qa.consumers:
            hits = by_entry[consumer.key].get(entry, [])
            if consumer.level == "param":
                covered = frozenset(p.rsplit(".", 1)[0] for p in hits if p.endswith(".weight"))
            else:
                covered = frozenset(hits)
            module_sets[consumer.key] = covered
            per[consumer.key] = {"label": consumer.label, "level": consumer.level, "count": len(hits),
                                 "matches": summarize(hits, limit=4) if hits else ""}  # fmt: skip
        distinct = {s for s in module_sets.values()}
        doc["entries"].append({"entry": entry, "consumers": per, "agree": len(distinct) <= 1})
    doc["summary"] = _summary(doc["entries"])
    return doc


def _summary(entries: list[dict[str, Any]]) -> dict[str, int]:
    """What a long list comes down to (a 145-entry list is ~700 lines of detail)."""
    unmatched = sum(1 for e in entries if not any(c["count"] for c in e["consumers"].values()))
    disagree = sum(1 for e in entries if not e["agree"])
    return {"entries": len(entries), "agree": len(entries) - disagree, "disagree": disagree,
            "match_nothing": unmatched}  # fmt: skip


@cli.command("explain-ignore")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--pattern", default=None, help="Architecture pattern (default: detected from config.json).")
@click.option("--format", "--output-format", "fmt", type=click.Choice(["text", "json"]), default=None)
@click.option("--disagreements-only", "-d", is_flag=True,
              help="Show only the entries the consumers read differently (the summary still counts all).")  # fmt: skip
@config_and_output_options("Settings file (default: discovered like lint's); its pattern and format apply.")
@hub_options()
def explain_ignore(
    target: Path, pattern: str | None, fmt: str | None, disagreements_only: bool, config_path: Path | None, output: Any
) -> None:
    """Show, per ignore entry, which modules each consumer (compressed-tensors, vLLM, SGLang by version,
    transformers, slime/miles online quantizers) matches, and where they disagree."""
    from weightcheck.cli import config_format
    from weightcheck.hub import HubError, parse_target
    from weightcheck.patterns import PatternError
    from weightcheck.reporters import tool_header
    from weightcheck.settings import SettingsError, load_settings

    target = with_revision(target)
    fmt = config_format(target, config_path, ("text", "json"), fmt)
    try:
        pattern = pattern or load_settings(target, config_path).pattern
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    if parse_target(str(target)) is None and not target.exists():
        click.echo(f"{target}: no such file or directory", err=True)
        raise SystemExit(EXIT_NOTHING_CHECKED)
    try:
        doc = explain(target, pattern)
    except PatternError as exc:
        raise click.UsageError(str(exc)) from None
    except HubError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(EXIT_NOTHING_CHECKED) from None
    if disagreements_only and "entries" in doc:
        doc["entries"] = [e for e in doc["entries"] if not e["agree"]]
    if fmt == "json":
        click.echo(json.dumps({**tool_header("explain-ignore"), **doc}, indent=2), file=output)
    else:
        _print_text(doc, output)
    if "error" in doc:
        raise SystemExit(EXIT_NOTHING_CHECKED)


def _print_text(doc: dict[str, Any], output: Any = None) -> None:
    if "error" in doc:
        click.echo(f"{doc['target']}: {doc['error']}", file=output)
        return
    total = doc.get("summary", {}).get("entries", len(doc["entries"]))
    shown = f" (showing the {len(doc['entries'])} read differently)" if total != len(doc["entries"]) else ""
    head = f"{doc['method']} ignore list ({doc['source']} → {doc['field']}), {total} entries{shown}"
    click.echo(head, file=output)
    for item in doc["entries"]:
        flag = "" if item["agree"] else "   ← consumers disagree"
        click.echo(f"\n{item['entry']!r}{flag}", file=output)
        for info in item["consumers"].values():
            what = f"{info['count']:>5} {info['level']}s  {info['matches']}" if info["count"] else "    — nothing"
            click.echo(f"  {info['label']:<52} {what}", file=output)
    for note in doc["notes"]:
        click.echo(f"\nnote: {note}", file=output)
    summary = doc.get("summary")
    if summary:
        nothing = f", {summary['match_nothing']} match nothing" if summary["match_nothing"] else ""
        click.echo(
            f"\n{summary['entries']} entries: {summary['agree']} read alike by every consumer, "
            f"{summary['disagree']} read differently{nothing}",
            file=output,
        )
