"""`weightcheck lint`: load (header-only), run the selected rules, return a Result."""

from __future__ import annotations

import gc
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from weightcheck.checkpoint import load_checkpoint
from weightcheck.findings import INTERNAL_ERROR_CODE, Finding, Location, Result, Severity
from weightcheck.rules import LintContext, Rule, all_rules, matches_selector, run_rules


def selected_rules(select: Iterable[str] = ("ALL",), ignore: Iterable[str] = (), command: str = "lint") -> list[Rule]:
    select, ignore = list(select) or ["ALL"], list(ignore)
    return [
        r
        for r in all_rules().values()
        if r.command == command and matches_selector(r, select) and not matches_selector(r, ignore)
    ]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Header parsing allocates ~10 objects per tensor, all acyclic; the cyclic GC re-scanning them
    dozens of times roughly doubles lint time on a 90k-tensor checkpoint."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def lint(
    target: str | Path,
    *,
    select: Iterable[str] = ("ALL",),
    ignore: Iterable[str] = (),
    options: dict[str, Any] | None = None,
) -> Result:
    with _gc_paused():
        return _lint(Path(target), select, ignore, options)


def _lint(path: Path, select: Iterable[str], ignore: Iterable[str], options: dict[str, Any] | None) -> Result:
    from weightcheck.hub import HubError, resolve

    result = Result(target=str(path), command="lint")
    opts = dict(options or {})
    try:
        resolved = resolve(
            str(path),
            needs_data=bool(opts.get("content")),
            download_ok=bool(opts.get("download")),
            revision=opts.get("revision"),
            what="lint --content",
        )
    except HubError as exc:
        result.nothing_checked = True
        result.notes.append(str(exc))
        return result
    if resolved.note:
        result.notes.append(resolved.note)
    if resolved.source is None and not resolved.path.exists():  # type: ignore[union-attr]
        result.nothing_checked = True
        result.notes.append(f"{path}: no such file or directory (nor a repo id in the local Hugging Face cache)")
        return result
    target = resolved.source or resolved.path
    assert target is not None
    ckpt = load_checkpoint(target)
    if resolved.path is not None:
        opts["local_path"] = str(resolved.path)  # what Ray tasks open on their node
    path = resolved.path if resolved.path is not None else path
    config_only = not ckpt.has_weights
    if config_only and (ckpt.config is None or not ckpt.config.exists):
        result.nothing_checked = True
        result.notes.append(f"{path}: no safetensors weights, index or config.json to check")
        return result

    if opts.get("pattern"):  # an explicit --pattern must exist and be valid: fail early (usage error)
        from weightcheck.patterns import resolve_pattern

        resolve_pattern(opts["pattern"], ckpt.config_data)
    opts["config_only"] = config_only
    ctx = LintContext(ckpt=ckpt, options=opts)
    rules = selected_rules(select, ignore)
    if not opts.get("content"):
        rules = [r for r in rules if "data" not in r.needs]
    if ckpt.index_only:
        shards = len(ckpt.indexed_shards)
        result.notes.append(
            f"index-only mode: none of the {shards} shard(s) named by the index is present (a `*.json`-only "
            "download?); the index is checked against itself and the config, shard files and headers are not"
        )
        opts["index_only"] = True
    if config_only:
        skipped = [r.code for r in rules if "tensors" in r.needs]
        rules = [r for r in rules if "tensors" not in r.needs]
        result.notes.append(f"config-only mode: no tensors to read, {len(skipped)} tensor-level rules could not run")
    for crashed in run_rules(ctx, rules):
        ctx.findings.append(
            Finding(
                code=INTERNAL_ERROR_CODE,
                name="internal-error",
                severity=Severity.ERROR,
                message=f"rule {crashed.code} crashed: {traceback.format_exc(limit=3).strip().splitlines()[-1]}",
                location=Location(file=str(path)),
                details={"traceback": traceback.format_exc()},
            )
        )
    result.findings = ctx.findings
    result.checked = {
        "shards": len(ckpt.shards),
        **({"remote_bytes_received": resolved.source.bytes_received} if resolved.source else {}),
        "tensors": len(ckpt.tensor_names()),
        "rules": len(rules),
        "header_bytes_read": ckpt.bytes_read,
    }
    result.notes.extend(ctx.cache.get("notes", []))
    if "quant" in ctx.cache:
        result.notes.extend(ctx.cache["quant"].notes)
    if "structure" in ctx.cache and ctx.cache["structure"].prefix is not None:
        s = ctx.cache["structure"]
        result.checked["layers"] = len(s.ids)
    return result
