"""The Python API: `weightcheck.lint()`, `weightcheck.diff()`, `weightcheck.verify()`.

One calling convention: the positional arguments the CLI takes (paths), everything else keyword-only with
the CLI option's name (`select=`, `ignore=`, `content=`, `allow_skip=`...). Each reads the same settings
file as the CLI (`weightcheck.toml` / `[tool.weightcheck]`, discovered from the target's folder upwards
then the working directory's, not inside a target linted from elsewhere: a checkpoint does not configure
its own check;
`config=PATH` names one, `config=False` reads none); keyword arguments override it. Each returns a
`weightcheck.Result`: typed findings, what was checked, `exit_code()`.

Bad input is a finding, never an exception. Usage errors raise: `ValueError` (an unknown selector or
setting, a bad map or policy file) and `weightcheck.MissingDependency` (an `ImportError` naming the extra to
install). This module imports nothing heavy; each function imports its command when called.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightcheck.findings import Result, Severity

if TYPE_CHECKING:
    from weightcheck.settings import Settings
    from weightcheck.verify import Reference, TrainerLayout

PathLike = str | os.PathLike[str]
ConfigArg = PathLike | bool | None


def _settings(
    target: Path | None, config: ConfigArg, command: str, select: Iterable[str] | None, ignore: Iterable[str] | None
) -> Settings:
    from weightcheck.rules import check_selectors
    from weightcheck.settings import Settings, load_settings

    if config is False:
        settings = Settings()
    else:
        explicit = None if config is None or config is True else Path(config)
        settings = load_settings(target, explicit)
    if select is not None:
        settings.select = [select] if isinstance(select, str) else list(select)
    if ignore is not None:
        settings.ignore = [*settings.ignore, *([ignore] if isinstance(ignore, str) else list(ignore))]
    Severity.parse(settings.fail_on)  # a bad config value is an error here too
    check_selectors(settings.select, settings.ignore, command=command)
    return settings


def _noted(result: Result, settings: Settings) -> Result:
    if settings.not_applied:
        result.notes.append(settings.not_applied_note())
    return result


def lint(
    target: PathLike | Sequence[PathLike],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    pattern: str | None = None,
    content: bool = False,
    hash_out: PathLike | None = None,
    against_manifest: PathLike | None = None,
    progress: bool = False,
    config: ConfigArg = None,
) -> Result:
    """`weightcheck lint TARGET...`: a checkpoint folder, a .safetensors file, a config.json, an index file,
    or several of them (one Result). Header-only unless `content=True` (needs `weightcheck[content]`)."""
    from weightcheck.lint import lint_many
    from weightcheck.progress import choose_mode

    targets = [Path(target)] if isinstance(target, (str, os.PathLike)) else [Path(t) for t in target]
    if not targets:
        raise ValueError("lint needs at least one target")
    settings = _settings(targets[0], config, "lint", select, ignore)
    if (hash_out or against_manifest) and not content:
        raise ValueError("hash_out and against_manifest need content=True")
    if content:
        from weightcheck.deps import require

        require("lint(content=True)", "content", ("torch", "numpy"))
    options: dict[str, Any] = {
        "pattern": pattern or settings.pattern,
        "content": content,
        "hash_out": Path(hash_out) if hash_out else None,
        "against_manifest": Path(against_manifest) if against_manifest else None,
        "progress": choose_mode(None) if progress else None,
        "consumers": settings.consumers,  # `consumers = [...]` reaches the rules as on the CLI
    }
    return _noted(lint_many(targets, select=settings.select, ignore=settings.ignore, options=options), settings)


def diff(
    reference: PathLike,
    candidate: PathLike,
    *,
    maps: Iterable[str] = (),
    policy: PathLike | None = None,
    allow_skip: Iterable[str] = (),
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    progress: bool = False,
    config: ConfigArg = None,
) -> Result:
    """`weightcheck diff REFERENCE CANDIDATE`: tensor by tensor (needs `weightcheck[content]`). `maps` are
    map files or inline `a.* -> b.*` rules, `policy` a policy file, `allow_skip` globs or `re:` patterns."""
    from weightcheck.compare.policy import load_policy
    from weightcheck.diff import DiffOptions, load_name_map
    from weightcheck.diff import diff as run_diff
    from weightcheck.progress import choose_mode

    ref, cand = Path(reference), Path(candidate)
    settings = _settings(ref, config, "diff", select, ignore)
    if ref.exists() and cand.exists():
        from weightcheck.deps import require

        require("diff", "content", ("torch", "numpy"))
    base_dir = Path(settings.source).parent if settings.source else None
    options = DiffOptions(
        maps=[rule for spec in (*settings.map, *maps) for rule in load_name_map(spec, base_dir)],
        policy_rules=load_policy(Path(policy)) if policy else [],
        allow_skip=[*settings.allow_skip, *allow_skip],
        select=settings.select,
        ignore=settings.ignore,
        progress=choose_mode(None) if progress else False,
    )
    return _noted(run_diff(ref, cand, options), settings)


def verify(
    records: PathLike,
    against: PathLike | Reference | None = None,
    *,
    weight_version: str | None = None,
    sync: int | str | None = None,
    trainer: TrainerLayout | None = None,
    skip: Iterable[str] = (),
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    config: ConfigArg = None,
) -> Result:
    """`weightcheck verify RECORDS --against REF`: the tap's sync records against a checkpoint or trainer
    manifests. `sync` is a sync number or "latest"; `trainer` a `weightcheck.verify.TrainerLayout`."""
    from weightcheck.verify import verify as run_verify

    root = Path(records)
    settings = _settings(root, config, "verify", select, ignore)
    if against is None or isinstance(against, (str, os.PathLike)):
        from weightcheck.deps import require_verify_deps

        require_verify_deps(root, Path(against) if against is not None else None)
    result = run_verify(
        root,
        against,
        select=settings.select,
        ignore=settings.ignore,
        weight_version=weight_version,
        sync=sync,
        trainer=trainer,
        skip=[*settings.allow_skip, *skip],
    )
    return _noted(result, settings)


def rollout(
    dumps: PathLike,
    *,
    thresholds: dict[str, Any] | None = None,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    config: ConfigArg = None,
) -> Result:
    """`weightcheck rollout DUMPS`: the step-1 checks on rollout/train debug dumps (needs torch for `.pt`).
    `thresholds` uses the config file's `[tool.weightcheck.rollout]` keys (`ref-tol`, `jitter-kl`, ...)."""
    from weightcheck.rollout import Thresholds, check_rollout

    root = Path(dumps)
    settings = _settings(root, config, "rollout", select, ignore)
    th = Thresholds().updated(settings.rollout).updated(thresholds or {})
    return _noted(check_rollout(root, th, select=settings.select, ignore=settings.ignore), settings)


def doctor(
    run: PathLike,
    *,
    checkpoint: PathLike | None = None,
    load: Iterable[PathLike] = (),
    records: PathLike | None = None,
    manifests: PathLike | None = None,
    dumps: PathLike | None = None,
    log: Iterable[PathLike] = (),
    thresholds: dict[str, Any] | None = None,
    config: ConfigArg = None,
) -> tuple[Result, list[Any]]:
    """`weightcheck doctor RUN`: the guides' step-1 checklist for one run. Returns the Result (every finding)
    and the checklist lines (`weightcheck.doctor.Line`: key, title, verdict, evidence, next_step)."""
    from weightcheck.doctor import discover
    from weightcheck.doctor import doctor as run_doctor
    from weightcheck.rollout import Thresholds

    root = Path(run)
    settings = _settings(root, config, "doctor", None, None)
    th = Thresholds().updated(settings.rollout).updated(thresholds or {})

    def opt(value: PathLike | None) -> Path | None:
        return Path(value) if value is not None else None

    inputs = discover(
        root,
        checkpoint=opt(checkpoint),
        load=[Path(p) for p in load],
        records=opt(records),
        manifests=opt(manifests),
        dumps=opt(dumps),
        log=[Path(p) for p in log],
    )
    result, lines = run_doctor(inputs, thresholds=th, select=settings.select, ignore=settings.ignore)
    return _noted(result, settings), lines
