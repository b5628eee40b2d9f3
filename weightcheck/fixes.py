"""`weightcheck lint --fix`: the mechanical, safe repairs, applied to JSON files only (never tensor data).

- index `metadata.total_size` set to the bytes the shards hold (WC205, unless lost tensors explain it);
- index entries added for tensors that exist in an indexed shard (WC203), or repointed to the one shard
  that holds a tensor the index places elsewhere (WC202 "found in ...");
- ignore-list entries for routers/embeddings/lm_head some consumer would quantize (WC309), in the form
  every affected consumer reads (`re:.*mlp\\.gate($|\\..*)`), checked against each consumer's matcher.

Writes are atomic (temp file in the same directory, then rename) and only to regular files inside the
checkpoint: a symlinked or escaping target is refused with a WC110 finding, never followed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from weightcheck.findings import Finding, Location, Result, Severity
from weightcheck.lightclass import dataclass, field
from weightcheck.rules import Rule, register

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

FIX_REFUSED = "WC110"

register(
    Rule(
        code=FIX_REFUSED,
        name="fix-refused",
        severity=Severity.ERROR,
        summary="`lint --fix` would have to write through a symlink or outside the checkpoint: not written.",
        doc="`--fix` edits JSON files of the checkpoint in place, atomically. A file that is a symlink (a Hugging "
        "Face cache snapshot, a link to a shared file) or that resolves outside the checkpoint directory is "
        "never written: replacing it would change a file the checkpoint does not own, or cut the link.",
        bad="model.safetensors.index.json -> ../../blobs/3f2a…   (lint --fix would replace the cache blob)",
        good="a regular model.safetensors.index.json inside the checkpoint directory",
        check=None,
        needs=frozenset({"config"}),
        fix="copy the checkpoint out of the cache (or replace the link by a regular copy of the file), then run "
        "`weightcheck lint --fix` on the copy",
    )
)


@dataclass
class FileEdit:
    """One JSON file `--fix` rewrites: its new data, original text and what changed."""

    file: str  # relative to the checkpoint root
    data: Any
    original: str
    what: list[str] = field(default_factory=list)

    def text(self) -> str:
        return json.dumps(self.data, indent=2, ensure_ascii=False) + "\n"

    def diff(self) -> str:
        import difflib  # only --fix --diff; this module is loaded by every lint (it registers WC110)

        return "".join(
            difflib.unified_diff(
                self.original.splitlines(keepends=True),
                self.text().splitlines(keepends=True),
                fromfile=f"a/{self.file}",
                tofile=f"b/{self.file}",
            )
        )


def _walk(findings: Iterable[Finding]) -> Iterator[Finding]:
    for f in findings:
        yield f
        yield from _walk(f.related)


class _Plan:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.edits: dict[str, FileEdit] = {}
        self.refused: list[Finding] = []

    def load(self, rel: str) -> FileEdit | None:
        if rel in self.edits:
            return self.edits[rel]
        path = self.root / rel
        try:
            original = path.read_text(encoding="utf-8")
            data = json.loads(original)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # an unreadable file is its own finding (WC107/WC207), not a fix
        if not isinstance(data, dict):
            return None
        self.edits[rel] = FileEdit(rel, data, original)
        return self.edits[rel]


def plan_fixes(root: Path, result: Result) -> tuple[list[FileEdit], list[Finding]]:
    """The edits the findings of `result` call for, as new JSON documents (nothing written)."""
    from weightcheck.checkpoint import INDEX_NAME

    plan = _Plan(root)
    size_wrong = False
    for f in _walk(result.findings):
        if f.code == "WC205" and "actual" in f.details and "tensors" not in f.details:
            size_wrong = True
        elif f.code == "WC203" and f.location.file and f.details.get("tensors"):
            edit = plan.load(INDEX_NAME)
            if edit and isinstance(edit.data.get("weight_map"), dict):
                keys = [k for k in f.details["tensors"] if k not in edit.data["weight_map"]]
                for key in keys:
                    edit.data["weight_map"][key] = f.location.file
                edit.data["weight_map"] = dict(sorted(edit.data["weight_map"].items()))
                edit.what.append(f"{INDEX_NAME}: {len(keys)} weight_map entries added for {f.location.file}")
        elif f.code == "WC202" and len(f.details.get("found_in", [])) == 1:
            edit = plan.load(INDEX_NAME)
            if edit and isinstance(edit.data.get("weight_map"), dict):
                for key in f.details.get("tensors", []):
                    edit.data["weight_map"][key] = f.details["found_in"][0]
                edit.what.append(f"{INDEX_NAME}: entries repointed to {f.details['found_in'][0]}")
        elif f.code in ("WC309", "WC320") and f.details.get("ignore_source") and f.details.get("add_ignore"):
            rel, _, key = f.details["ignore_source"].partition(":")
            edit = plan.load(rel)
            if edit is None:
                continue
            table = edit.data
            for part in [p for p in key.split(".") if p]:
                table = table.get(part) if isinstance(table, dict) else None
            if not isinstance(table, dict):
                continue
            field_name = f.details.get("ignore_field", "ignore")
            current = table.get(field_name) or []
            if not isinstance(current, list):
                continue
            new = [e for e in f.details["add_ignore"] if e not in current]
            if new:
                table[field_name] = [*current, *new]
                edit.what.append(f"{rel}: {key}.{field_name} += {new}")
    index = plan.edits.get(INDEX_NAME)
    if size_wrong or (index is not None and index.what):
        # Last, from the index as edited: entry fixes can change which shards it references.
        index = index or plan.load(INDEX_NAME)
        total = _total_size(root, index.data.get("weight_map")) if index else None
        meta = index.data.get("metadata") if index else None
        if index and total is not None and isinstance(meta, dict) and meta.get("total_size") != total:
            meta["total_size"] = total
            index.what.append(f"{INDEX_NAME}: metadata.total_size = {total}")
    edits = [e for e in plan.edits.values() if e.what and e.text() != e.original]
    return edits, plan.refused


def _total_size(root: Path, weight_map: Any) -> int | None:
    """Tensor bytes of the shards `weight_map` references, a tensor stored twice counted once (as WC205
    computes it); None when a shard is unreadable (nothing mechanical to write then)."""
    from weightcheck.checkpoint import load_checkpoint

    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return None
    ckpt = load_checkpoint(root)
    total, seen = 0, set()
    for shard in sorted(set(weight_map.values())):
        report = ckpt.shards.get(shard)
        if report is None or not report.names_known or report.problems:
            return None
        total += report.data_end - sum(report.tensors[k].nbytes for k in report.tensors.keys() & seen)
        seen.update(report.tensors)
    return total


def _confined(root: Path, rel: str) -> str | None:
    """Why `rel` must not be written, or None: it must be a regular file directly under the checkpoint."""
    path = root / rel
    if path.is_symlink():
        return f"{rel} is a symlink (written, it would replace the link, or the file it points to)"
    try:
        resolved_parent = path.parent.resolve(strict=True)
    except OSError as exc:
        return f"{rel}: {exc}"
    if resolved_parent != root.resolve() or not path.is_file():
        return f"{rel} is not a regular file inside the checkpoint directory"
    return None


def apply_fixes(root: Path, edits: list[FileEdit]) -> tuple[list[str], list[Finding]]:
    """Write each edit atomically (temp file in the same directory, fsync, rename). Returns what was done
    and WC110 findings for files refused."""
    done: list[str] = []
    refused: list[Finding] = []
    for edit in edits:
        why = _confined(root, edit.file)
        if why:
            message = f"--fix did not write: {why}"
            refused.append(Finding(FIX_REFUSED, "fix-refused", Severity.ERROR, message, Location(file=edit.file)))
            continue
        target = root / edit.file
        mode = target.stat().st_mode & 0o777
        import tempfile  # only when --fix writes

        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(edit.text())
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        done.extend(edit.what)
    return done, refused


def fix_checkpoint(
    target: Path, result: Result, relint: Callable[[], Result], *, write: bool = True
) -> tuple[Result, list[FileEdit] | None]:
    """`lint --fix` for the CLI and the API alike: plan the JSON edits `result`'s findings call for; with
    `write`, apply them and lint again (`relint`), so the result shows what is left. Returns the result
    and the planned edits (`write=False`: `--fix --diff`, nothing written, `result` unchanged); None when
    nothing could be planned (a remote repo, or a run that checked nothing)."""
    from weightcheck.hub import cached_snapshot, parse_target
    from weightcheck.triage import fill_fix_texts

    hub_target = None if target.exists() else parse_target(str(target))
    # A remote repo is never edited; a cached snapshot is (its JSON files, inside the snapshot folder).
    root = target if hub_target is None else cached_snapshot(hub_target)
    if root is None or result.nothing_checked:
        return result, None
    root = root if root.is_dir() else root.parent
    edits, _ = plan_fixes(root, result)
    if not write:
        return result, edits
    done, refused = apply_fixes(root, edits)
    if done:
        result = relint()
        result.notes[:0] = [f"fixed: {what}" for what in done]
    fill_fix_texts(refused)
    result.findings.extend(refused)
    return result, edits
