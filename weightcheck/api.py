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

from weightcheck.findings import Result, Severity

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

    from weightcheck.settings import Settings
    from weightcheck.verifying import Reference, TrainerLayout

PathLike = str | os.PathLike[str]
ConfigArg = PathLike | bool | None



class _HubAccess:
    """`token=` / `cache_dir=`: what the CLI's `--token` / `--cache-dir` set (HF_TOKEN, HF_HUB_CACHE), for the
    duration of one call only (weightcheck.hub reads both per call), so a library caller's environment is
    left as it was. A class rather than `contextlib.contextmanager`: contextlib stays off lint's start-up path."""

    def __init__(self, token: str | None, cache_dir: PathLike | None) -> None:
        self.wanted = {"HF_TOKEN": token, "HF_HUB_CACHE": str(cache_dir) if cache_dir is not None else None}
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        self.saved = {name: os.environ.get(name) for name, value in self.wanted.items() if value}
        os.environ.update({name: value for name, value in self.wanted.items() if value})

    def __exit__(self, *exc_info: object) -> None:
        for name, old in self.saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _with_revision(target: Path, revision: str | None) -> Path:
    """A Hub target naming no revision of its own gets `revision=` (the CLI's `--revision` on diff/verify)."""
    from weightcheck.hub import apply_revision

    return apply_revision(target, revision)

def _settings(
    target: Path | None,
    config: ConfigArg,
    command: str,
    select: Iterable[str] | None,
    ignore: Iterable[str] | None,
    fail_on: str | Severity | None = None,
    consumers: Iterable[str] | None = None,
) -> Settings:
    from weightcheck.rules import check_selectors
    from weightcheck.settings import Settings, SettingsError, check_consumers, load_settings

    if config is False:
        settings = Settings()
    else:
        explicit = None if config is None or config is True else Path(config)
        settings = load_settings(target, explicit)
    if select is not None:
        settings.select = [select] if isinstance(select, str) else list(select)
    if ignore is not None:
        settings.ignore = [*settings.ignore, *([ignore] if isinstance(ignore, str) else list(ignore))]
    if fail_on is not None:
        settings.fail_on = fail_on.label if isinstance(fail_on, Severity) else fail_on
    if consumers is not None:
        try:
            settings.consumers = check_consumers([consumers] if isinstance(consumers, str) else list(consumers))
        except SettingsError as exc:
            raise ValueError(str(exc)) from None
    Severity.parse(settings.fail_on)  # a bad config value is an error here too
    check_selectors(settings.select, settings.ignore, command=command)
    return settings


def _noted(
    result: Result, settings: Settings, baseline: PathLike | None = None, write_baseline: PathLike | None = None
) -> Result:
    """What the CLI's `finish` does besides rendering: fix texts, the settings note, the run's fail-on
    threshold, and the baseline (`baseline=` hides known findings; `write_baseline=` records them)."""
    from weightcheck.triage import BaselineError, apply_baseline, fill_fix_texts, read_baseline
    from weightcheck.triage import write_baseline as record_baseline

    fill_fix_texts(result.findings)
    if settings.not_applied:
        result.notes.append(settings.not_applied_note())
    result.fail_on = Severity.parse(settings.fail_on)
    known = baseline if baseline is not None else settings.baseline
    if write_baseline is not None:
        record_baseline(result, Path(write_baseline))
        result.notes.append(f"{len(result.findings)} finding(s) written to the baseline {write_baseline}")
    elif known:
        try:
            apply_baseline(result, read_baseline(Path(known)))
        except BaselineError as exc:
            raise ValueError(str(exc)) from None
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
    fail_on: str | Severity | None = None,
    consumers: Iterable[str] | None = None,
    baseline: PathLike | None = None,
    write_baseline: PathLike | None = None,
    validate_with: str | None = None,
    revision: str | None = None,
    download: bool = False,
    ray: str | None = None,
    fix: bool = False,
    fix_diff: bool = False,
    token: str | None = None,
    cache_dir: PathLike | None = None,
) -> Result:
    """`weightcheck lint TARGET...`: a checkpoint folder, a .safetensors file, a config.json, an index file,
    or several of them (one Result). Header-only unless `content=True` (needs `weightcheck[content]`).

    `fix=True` writes the mechanical JSON fixes and lints again; with `fix_diff=True` nothing is written and
    the planned edits are returned as unified diffs in `result.notes` (prefixed "fix --diff:")."""
    from weightcheck.linting import lint_many
    from weightcheck.progress import choose_mode

    targets = [Path(target)] if isinstance(target, (str, os.PathLike)) else [Path(t) for t in target]
    if not targets:
        raise ValueError("lint needs at least one target")
    settings = _settings(targets[0], config, "lint", select, ignore, fail_on, consumers)
    if (hash_out or against_manifest) and not content:
        raise ValueError("hash_out and against_manifest need content=True")
    if ray is not None and not content:
        raise ValueError("ray needs content=True (header-only lint reads kilobytes: nothing to distribute)")
    if fix_diff and not fix:
        raise ValueError("fix_diff needs fix=True")
    if (fix or fix_diff) and len(targets) != 1:
        raise ValueError("fix takes one checkpoint at a time")
    validator = validate_with or settings.validate_with
    if validator not in (None, "mirror", "compressed-tensors"):
        raise ValueError(f"validate_with must be mirror or compressed-tensors, not {validator!r}")
    from weightcheck.deps import require

    if content:
        require("lint(content=True)", "content", ("torch", "numpy"))
    if validator == "compressed-tensors":
        require("lint(validate_with='compressed-tensors')", "quant", ("compressed_tensors",))
    if ray is not None:
        from weightcheck.distributed import require_ray

        require_ray()
    options: dict[str, Any] = {
        "pattern": pattern or settings.pattern,
        "validate_with": validator,
        "content": content,
        "hash_out": Path(hash_out) if hash_out else None,
        "against_manifest": Path(against_manifest) if against_manifest else None,
        "progress": choose_mode(None) if progress else None,
        "revision": revision,
        "download": download,
        "ray": ray,
        "per_tensor_ignores": settings.per_tensor_ignores,
        "consumers": settings.consumers,  # `consumers = [...]` reaches the rules as on the CLI
    }

    def run() -> Result:
        return lint_many(targets, select=settings.select, ignore=settings.ignore, options=options)

    with _HubAccess(token, cache_dir):
        result = run()
        if fix:
            from weightcheck.fixes import fix_checkpoint

            result, edits = fix_checkpoint(targets[0], result, run, write=not fix_diff)
            if fix_diff:
                result.notes.extend(f"fix --diff:\n{edit.diff()}" for edit in edits or [])
    return _noted(result, settings, baseline, write_baseline)


def diff(
    reference: PathLike,
    candidate: PathLike,
    *,
    maps: Iterable[str] = (),
    policy: PathLike | None = None,
    no_default_policy: bool = False,
    allow_skip: Iterable[str] = (),
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    progress: bool = False,
    config: ConfigArg = None,
    fail_on: str | Severity | None = None,
    consumers: Iterable[str] | None = None,
    baseline: PathLike | None = None,
    write_baseline: PathLike | None = None,
    download: bool = False,
    ray: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: PathLike | None = None,
) -> Result:
    """`weightcheck diff REFERENCE CANDIDATE`: tensor by tensor (needs `weightcheck[content]`). `maps` are
    map files or inline `a.* -> b.*` rules, `policy` a policy file (`no_default_policy`: its rules alone),
    `allow_skip` globs or `re:` patterns."""
    from weightcheck.compare.policy import load_policy
    from weightcheck.diffing import DiffOptions, load_name_map
    from weightcheck.diffing import diff as run_diff
    from weightcheck.progress import choose_mode
    from weightcheck.skiplist import check_entries

    ref, cand = _with_revision(Path(reference), revision), _with_revision(Path(candidate), revision)
    settings = _settings(ref, config, "diff", select, ignore, fail_on, consumers)
    if ray is not None:
        from weightcheck.distributed import require_ray

        require_ray()
    if ref.exists() and cand.exists():
        from weightcheck.deps import require

        require("diff", "content", ("torch", "numpy"))
    base_dir = Path(settings.source).parent if settings.source else None
    options = DiffOptions(
        maps=[rule for spec in (*settings.map, *maps) for rule in load_name_map(spec, base_dir)],
        policy_rules=load_policy(Path(policy)) if policy else [],
        default_policy=not no_default_policy,
        allow_skip=check_entries([*settings.allow_skip, *allow_skip]),
        select=settings.select,
        ignore=settings.ignore,
        progress=choose_mode(None) if progress else False,
        download=download,
        ray=ray,
    )
    with _HubAccess(token, cache_dir):
        result = run_diff(ref, cand, options)
    return _noted(result, settings, baseline, write_baseline)


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
    fail_on: str | Severity | None = None,
    consumers: Iterable[str] | None = None,
    baseline: PathLike | None = None,
    write_baseline: PathLike | None = None,
    download: bool = False,
    trainer_pp: int | None = None,
    trainer_vp: int | None = None,
    trainer_first_stage_layers: int | None = None,
    trainer_last_stage_layers: int | None = None,
    trainer_layout: str | None = None,
    trainer_ep: int | None = None,
    wait: float = 0.0,
    expect_records: int | None = None,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: PathLike | None = None,
) -> Result:
    """`weightcheck verify RECORDS --against REF`: the tap's sync records against a checkpoint or trainer
    manifests. `sync` is a sync number or "latest"; `trainer` a `weightcheck.verifying.TrainerLayout`, or its
    fields as the CLI's `trainer_pp=`... keywords. `skip` entries are globs or `re:` regexes (as allow-skip).
    `expect_records=N` waits up to `wait` seconds for N rank records, then reports WC734 if fewer came."""
    from weightcheck.skiplist import check_entries
    from weightcheck.verifying import TrainerLayout, records_incomplete, wait_for_records
    from weightcheck.verifying import verify as run_verify

    root = Path(records)
    settings = _settings(root, config, "verify", select, ignore, fail_on, consumers)
    fields = {
        "pp_size": trainer_pp,
        "vp_size": trainer_vp,
        "first_stage_layers": trainer_first_stage_layers,
        "last_stage_layers": trainer_last_stage_layers,
        "layout": trainer_layout,
        "ep_size": trainer_ep,
    }
    if any(v is not None for v in fields.values()):
        if trainer is not None:
            raise ValueError("pass trainer= or the trainer_* keywords, not both")
        trainer = TrainerLayout(**fields)
    skip_entries = check_entries([*settings.allow_skip, *skip])
    if against is None or isinstance(against, (str, os.PathLike)):
        from weightcheck.deps import require_verify_deps

        require_verify_deps(root, Path(against) if against is not None else None)
    if against is not None and isinstance(against, (str, os.PathLike)):
        against = _with_revision(Path(against), revision)
    if expect_records is not None:  # before verifying, as the CLI's --wait: the records it reads must be there
        wait_for_records(root, weight_version, expect_records, wait)
    with _HubAccess(token, cache_dir):
        result = run_verify(
            root,
            against,
            select=settings.select,
            ignore=settings.ignore,
            weight_version=weight_version,
            sync=sync,
            trainer=trainer,
            skip=skip_entries,
            download=download,
        )
    if expect_records is not None and (incomplete := records_incomplete(root, weight_version, expect_records, wait)):
        result.findings.append(incomplete)
    return _noted(result, settings, baseline, write_baseline)


def rollout(
    dumps: PathLike,
    *,
    thresholds: dict[str, Any] | None = None,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    config: ConfigArg = None,
    fail_on: str | Severity | None = None,
    consumers: Iterable[str] | None = None,
    baseline: PathLike | None = None,
    write_baseline: PathLike | None = None,
) -> Result:
    """`weightcheck rollout DUMPS`: the step-1 checks on rollout/train debug dumps (needs torch for `.pt`).
    `thresholds` takes the CLI's threshold options by their attribute names or the config file's
    `[tool.weightcheck.rollout]` keys (`ref_tol` / `ref-tol`, `routing_replay`, ...)."""
    from weightcheck.rollouts import Thresholds, check_rollout

    root = Path(dumps)
    settings = _settings(root, config, "rollout", select, ignore, fail_on, consumers)
    th = Thresholds().updated(settings.rollout).updated(thresholds or {})
    result = check_rollout(root, th, select=settings.select, ignore=settings.ignore)
    return _noted(result, settings, baseline, write_baseline)


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
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    config: ConfigArg = None,
    fail_on: str | Severity | None = None,
    consumers: Iterable[str] | None = None,
    baseline: PathLike | None = None,
    write_baseline: PathLike | None = None,
) -> tuple[Result, list[Any]]:
    """`weightcheck doctor RUN`: the guides' step-1 checklist for one run. Returns the Result (every finding)
    and the checklist lines (`weightcheck.checkup.Line`: key, title, verdict, evidence, next_step)."""
    from weightcheck.checkup import discover
    from weightcheck.checkup import doctor as run_doctor
    from weightcheck.rollouts import Thresholds

    root = Path(run)
    settings = _settings(root, config, "doctor", select, ignore, fail_on, consumers)
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
    result, lines = run_doctor(
        inputs, lint=lint, verify=verify, thresholds=th, select=settings.select, ignore=settings.ignore
    )
    return _noted(result, settings, baseline, write_baseline), lines
