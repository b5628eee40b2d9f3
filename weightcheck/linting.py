"""`weightcheck lint`: load (header-only), run the selected rules, return a Result."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from pathlib import Path

from weightcheck.checkpoint import CONFIG_NAME, INDEX_NAME, load_checkpoint
from weightcheck.findings import Result, internal_error
from weightcheck.gcpause import GCPaused
from weightcheck.lightclass import replace
from weightcheck.rules import LintContext, Rule, command_rules, matches_selector, run_rules

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any


def selected_rules(select: Iterable[str] = ("ALL",), ignore: Iterable[str] = (), command: str = "lint") -> list[Rule]:
    select, ignore = list(select) or ["ALL"], list(ignore)
    return [
        r for r in command_rules(command).values() if matches_selector(r, select) and not matches_selector(r, ignore)
    ]


def lint(
    target: str | Path,
    *,
    select: Iterable[str] = ("ALL",),
    ignore: Iterable[str] = (),
    options: dict[str, Any] | None = None,
) -> Result:
    with GCPaused():
        return _lint(Path(target), select, ignore, options)


def lint_many(
    targets: Iterable[str | Path],
    *,
    select: Iterable[str] = ("ALL",),
    ignore: Iterable[str] = (),
    options: dict[str, Any] | None = None,
) -> Result:
    """Lint several targets (what pre-commit passes: every changed config.json / index file) into one Result.

    Targets that resolve to the same checkpoint folder are linted once. Finding files become paths relative
    to the working directory (`Result.root` is ""). A target that checked nothing is named in
    `unchecked_targets` and keeps the exit code at 3: a typo'd path among good ones must not turn the gate green."""
    given = [Path(t) for t in targets]
    if len(given) == 1:
        return lint(given[0], select=select, ignore=ignore, options=options)
    paths, covered = checkpoint_targets(given)
    merged = Result(target=" ".join(str(p) for p in given), command="lint", root="")
    merged.notes.extend(f"{part}: linted with the whole checkpoint {whole}" for part, whole in covered)
    # note text -> the targets it was given for: three config-only targets give each note once, naming all
    # three (pre-commit passes every changed config.json), not six lines.
    note_targets: dict[str, list[str]] = {}
    for path in paths:
        one = lint(path, select=select, ignore=ignore, options=options)
        root = Path(one.root) if one.root is not None else _checkpoint_root(path)
        for finding in one.findings:
            file = finding.location.file
            file = str(root / file) if file and not Path(file).is_absolute() else file or str(path)
            finding.location = replace(finding.location, file=file)
            merged.findings.append(finding)
        for note in one.notes:
            # A note that already names its target is not prefixed twice ("nope: nope: no such file").
            text = note[len(f"{path}: ") :] if note.startswith(f"{path}: ") else note
            note_targets.setdefault(text, []).append(str(path))
        for key_, value in one.checked.items():
            merged.checked[key_] = merged.checked.get(key_, 0) + value
        if one.nothing_checked:
            merged.unchecked_targets.append(str(path))
        else:
            merged.unchecked_targets.extend(one.unchecked_targets)
    merged.notes.extend(f"{', '.join(names)}: {text}" for text, names in note_targets.items())
    # "Nothing was checked" only when no target was; one missing target among good ones is named instead
    # (and still exits 3: see Result.exit_code).
    merged.nothing_checked = len(merged.unchecked_targets) == len(paths)
    merged.checked["targets"] = len(paths)
    return merged


def checkpoint_targets(paths: Iterable[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """Resolve targets to the checkpoints they name before linting, so that one checkpoint is linted once and
    whole: `config.json` plus the index (or a shard, or the folder) of the same folder is that folder, not a
    config-only lint that happens to run first and hides the rest. What pre-commit and the Action pass.

    Returns the targets to lint, in first-seen order, and (target, checkpoint) for each target that a whole
    checkpoint lint covers. A folder, an index file, or a shard named by its folder's index names the whole
    folder; a lone .safetensors file covers the config.json beside it (its lint reads that config); a
    config.json alone stays config-only. Paths that do not exist (typos, Hub repo ids) pass through."""
    wholes: dict[Path, Path] = {}  # resolved folder -> the folder as given
    files: dict[Path, list[Path]] = {}  # resolved folder -> lone .safetensors files in it
    for path in paths:
        if not path.exists():
            continue
        folder = _whole_folder(path)
        if folder is not None:
            wholes.setdefault(folder.resolve(), folder)
        elif path.suffix == ".safetensors":
            files.setdefault(path.parent.resolve(), []).append(path)
    out: dict[Path | str, Path] = {}
    covered: list[tuple[Path, Path]] = []
    for path in paths:
        if not path.exists():
            out.setdefault(str(path), path)
            continue
        home = path.resolve() if path.is_dir() else path.parent.resolve()
        whole = wholes.get(home)
        if whole is not None:
            if path != whole and path.resolve() != whole.resolve():
                covered.append((path, whole))
            out.setdefault(home, whole)
        elif path.name == CONFIG_NAME and files.get(home):
            covered.append((path, files[home][0]))
        else:
            out.setdefault(path.resolve(), path)
    return list(out.values()), covered


def _whole_folder(path: Path) -> Path | None:
    """The checkpoint folder a target names whole (a folder, its index, one of its indexed shards), else None."""
    if path.is_dir():
        return path
    if path.name.endswith(INDEX_SUFFIX):
        return path.parent
    if path.suffix == ".safetensors" and (_indexed_elsewhere(path) or (path.parent / INDEX_NAME).exists()):
        return path.parent  # a shard, or a stray file beside an index (WC105): the folder is the checkpoint
    return None


def _checkpoint_root(path: Path) -> Path:
    """The folder whose files a target's findings are relative to."""
    if path.is_dir():
        return path
    if path.name.endswith(INDEX_SUFFIX):
        return path.parent
    return path.parent if path.exists() else path


INDEX_SUFFIX = ".safetensors.index.json"

# Set to a list by a caller that ends the process without the interpreter's teardown (the console entry's
# `os._exit`): the last lint's context (checkpoint headers, inventory, templates) is kept there instead of
# being freed when lint returns. Freeing DeepSeek-V3's ~92k header entries and ~46k modules costs ~0.09 s CPU, which
# nobody needs when the process exits right after writing the report. None (the default) frees as usual, so
# library callers linting many checkpoints hold no more memory than one lint's.
_retained: list[Any] | None = None


def retain_until_exit() -> None:
    """Keep each lint's working data alive until the process exits (see `_retained`)."""
    global _retained
    if _retained is None:
        _retained = []


def _indexed_elsewhere(path: Path) -> bool:
    """True when an index beside `path` lists it among other shards (then a one-file lint would be partial)."""
    from weightcheck.checkpoint import _read_json, json_limit

    index = path.parent / INDEX_NAME
    if not index.is_file():
        return False
    doc = _read_json(index.parent, index.name, json_limit(index.name))
    weight_map = doc.data.get("weight_map") if isinstance(doc.data, dict) else None
    if not isinstance(weight_map, dict):
        return False
    shards = {v for v in weight_map.values() if isinstance(v, str)}
    return path.name in shards and len(shards) > 1


class _LocalTarget:
    """What `hub.resolve` answers for an existing local path: the path itself, no note, no remote source."""

    __slots__ = ("path",)
    note = None
    source = None

    def __init__(self, path: Path) -> None:
        self.path = path


def _existing_local(path: Path) -> _LocalTarget | None:
    """An existing local path (not `hf://`) resolves to itself, as `hub.resolve` decides first; answered here
    because importing the Hub module is ~2 ms of a config-only lint's start-up."""
    text = os.fspath(path)
    if text.startswith("hf:/") or not os.path.exists(text):
        return None
    return _LocalTarget(Path(text))


def _checkpoints_below(root: Path, depth: int = 3, limit: int = 5, budget: int = 2000) -> list[str]:
    """Subfolders (relative, at most `depth` deep, symlinks not followed) holding a config.json or safetensors:
    a training run's output (`checkpoint-100/`, verl's `global_step_10/actor/huggingface/`) given as the target.
    Bounded: at most `budget` directory entries listed in all, never a file opened."""
    from itertools import islice

    out: list[str] = []
    stack, left = [(root, 0)], budget
    while stack and len(out) < limit and left > 0:
        folder, level = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(islice(it, left), key=lambda e: e.name)
        except OSError:
            continue
        left -= len(entries)
        for entry in entries:
            if left <= 0 or not entry.is_dir(follow_symlinks=False) or entry.name.startswith("."):
                continue
            try:
                with os.scandir(entry.path) as it:
                    names = [e.name for e in islice(it, left) if e.is_file(follow_symlinks=False)]
            except OSError:
                continue
            left -= len(names)
            if "config.json" in names or any(n.endswith(".safetensors") for n in names):
                out.append(str(Path(entry.path).relative_to(root)))
            elif level + 1 < depth:
                stack.append((Path(entry.path), level + 1))
    return sorted(out)[:limit]


def _explicit(select: Iterable[str]) -> bool:
    """The user chose rules (`--select`), beyond the default of all."""
    chosen = [s.strip().upper() for s in select]
    return bool(chosen) and chosen != ["ALL"]


def _codes(codes: list[str]) -> str:
    return ", ".join(codes[:6]) + (f" and {len(codes) - 6} more" if len(codes) > 6 else "")


def _lint(path: Path, select: Iterable[str], ignore: Iterable[str], options: dict[str, Any] | None) -> Result:
    result = Result(target=str(path), command="lint")
    select = list(select)  # read twice (selection, then whether it was the user's)
    opts = dict(options or {})
    resolved: Any = _existing_local(path)
    if resolved is None:
        from weightcheck.hub import HubError, resolve

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
        from weightcheck.deps import install_command, installed
        from weightcheck.hub import local_looking

        why_local = local_looking(str(path))
        # A typo'd local path is never sent to the Hub, and the user hears why it was taken as local.
        if why_local:
            why = f" (a local path: {why_local}; hf://{path} would name a Hub repo)"
        else:
            hint = "" if installed("huggingface_hub") else f"; Hub repo ids need: {install_command('hub')}"
            why = f" (nor a repo id in the local Hugging Face cache){hint}"
        result.notes.append(f"{path}: no such file or directory{why}")
        return result
    if resolved.path is not None:
        path = resolved.path
        if path.is_file() and path.name.endswith(INDEX_SUFFIX):
            # An index is not a config: lint the checkpoint it indexes (its folder), header-only.
            result.notes.append(f"{path.name} is an index: linting its folder {path.parent}")
            path = path.parent
        elif path.is_file() and path.suffix == ".safetensors" and _indexed_elsewhere(path):
            result.notes.append(
                f"{path.name} is one shard of the indexed checkpoint in {path.parent}: linting the folder"
            )
            path = path.parent
        result.root = str(path if path.is_dir() else path.parent)
        opts["local_path"] = str(path)  # what Ray tasks open on their node
        ckpt = load_checkpoint(path)
    else:
        assert resolved.source is not None
        ckpt = load_checkpoint(resolved.source)
    config_only = not ckpt.has_weights
    if config_only and (ckpt.config is None or not ckpt.config.exists):
        result.nothing_checked = True
        from weightcheck.rules.files import pickles_found

        # A newcomer's pickled checkpoint: say what was found and why it was not read, not only what was not.
        local_dir = resolved.path is not None and path.is_dir()
        from weightcheck.foreign import describe

        foreign = describe(path) if local_dir else None
        if foreign is not None:  # a trainer's own format: what converts it (its common.pt holds no weights)
            result.notes.append(f"{path}: no safetensors weights, index or config.json to check: {foreign}")
            return result
        found = pickles_found(ckpt)
        convert = "; convert them to safetensors" if found else ""
        inside = _checkpoints_below(path) if local_dir else []
        below = f"; checkpoints in its subfolders, lint each: {', '.join(inside)}" if inside else ""
        result.notes.append(f"{path}: no safetensors weights, index or config.json to check{found}{convert}{below}")
        return result

    if opts.get("pattern"):  # an explicit --pattern must exist and be valid: fail early (usage error)
        from weightcheck.patterns import resolve_pattern

        resolve_pattern(opts["pattern"], ckpt.config_data)
    opts["config_only"] = config_only
    ctx = LintContext(ckpt=ckpt, options=opts)
    rules = selected_rules(select, ignore)
    cannot_run: list[str] = []  # why selected rules cannot run on this target with these options
    if not opts.get("content"):
        data = [r.code for r in rules if "data" in r.needs]
        rules = [r for r in rules if "data" not in r.needs]
        if data and _explicit(select):
            cannot_run.append(f"{_codes(data)} need tensor data: not run without --content")
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
        if skipped and _explicit(select):
            cannot_run.append(f"{_codes(skipped)} need tensor headers: not run on a config without weights")
    result.notes.extend(cannot_run)
    if not any(r.check is not None and not r.retired for r in rules):
        # An explicit selection that this target or these options rule out (`--select WC6` without --content):
        # nothing ran, and the run must not read as clean.
        result.nothing_checked = True
        if not cannot_run:
            result.notes.append("none of the selected rules applies to this target")
        return result
    for crashed, exc in run_rules(ctx, rules):
        ctx.findings.append(internal_error(f"rule {crashed.code}", exc))
    from weightcheck.triage import finalize

    result.findings = ctx.findings
    finalize(result, opts.get("per_tensor_ignores"))
    if config_only:
        pickles = ckpt.pickle_weights()
        if pickles:
            # The weights are there, in a format lint never opens: the config-level checks ran, the weights were
            # not checked, and the run must not end green (exit 3, naming them).
            result.unchecked_targets.append(
                f"{path} (pickle weights {', '.join(pickles[:4])}: never opened; convert them to safetensors)"
            )
    result.checked = {
        "shards": len(ckpt.shards),
        **({"remote_bytes_received": resolved.source.bytes_received} if resolved.source else {}),
        "tensors": len(ckpt.tensor_names()),
        "rules": len(rules),
        "header_bytes_read": ckpt.bytes_read,
    }
    result.notes.extend(ctx.cache.get("notes", []))
    if _retained is not None:
        _retained[:] = [ctx]  # the last lint's only: several targets free the earlier ones (memory stays one lint's)
        # and out of the cyclic GC's sight: with them tracked, the collections that rendering the report
        # triggers would scan all of them (slower than freeing them)
        gc.freeze()
    if "quant" in ctx.cache:
        result.notes.extend(ctx.cache["quant"].notes)
    if "structure" in ctx.cache and ctx.cache["structure"].prefix is not None:
        s = ctx.cache["structure"]
        result.checked["layers"] = len(s.ids)
    return result
