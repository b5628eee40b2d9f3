"""`weightcheck doctor RUN`: registered on the CLI group when weightcheck.cli loads it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from weightcheck.cli import cli, output_options, report_internal_errors, resolve_settings
from weightcheck.commands.rollout import threshold_options, thresholds_from
from weightcheck.findings import Result, Severity, internal_error

_PATH = click.Path(path_type=Path)


@cli.command()
@click.argument("run", type=_PATH)
@click.option(
    "--checkpoint", type=_PATH, default=None, help="The HF checkpoint the engine serves (lint; verify's reference)."
)
@click.option("--load", type=_PATH, multiple=True, help="Megatron --load / --ref-load directory. Repeatable.")
@click.option("--records", type=_PATH, default=None, help="The tap's records folder (WEIGHTCHECK_DIR).")
@click.option(
    "--manifests", type=_PATH, default=None, help="Trainer manifests: verify's reference instead of the checkpoint."
)
@click.option("--dumps", type=_PATH, default=None, help="The --dump-details folder (rollout_data/, train_data/).")
@click.option(
    "--log", type=_PATH, multiple=True, help="A log file (trainer stdout, SGLang log, Ray worker log). Repeatable."
)
@threshold_options
@output_options
def doctor(
    run: Path,
    checkpoint: Path | None,
    load: tuple[Path, ...],
    records: Path | None,
    manifests: Path | None,
    dumps: Path | None,
    log: tuple[Path, ...],
    fmt: str | None,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: str | None,
    exit_zero: bool,
    config_path: Path | None,
    output: Any,
    color: bool | None,
    verbose: bool,
    debug: bool,
    **values: Any,
) -> None:
    """Walk the step-1 checklist of the slime / miles / Relax debugging guides for one run directory.

    Each line (checkpoint loaded, lint, first sync, buffers, rollout coherence, log_probs vs ref_log_probs,
    template signature, train vs rollout, rewards, log signal phrases) gets a verdict, its evidence (file:line)
    and the guides' next step; a line whose input is absent says "not checked". Inputs are found under RUN
    by convention or named with the options.
    """
    from weightcheck import api
    from weightcheck.checkup import discover, render_checklist
    from weightcheck.checkup import doctor as run_doctor
    from weightcheck.deps import MissingDependency

    settings = resolve_settings(run, config_path, command=None, select=select, ignore=ignore, fail_on=fail_on, fmt=fmt)
    where = f" in {settings.source}" if settings.source else ""
    th = thresholds_from(settings.rollout, values, where)
    # A missing path is "nothing checked" for its line (exit 3 when nothing at all was), as for lint.
    missing: list[str] = []

    def present(option: str, value: Path | None) -> Path | None:
        if value is not None and not value.exists():
            missing.append(f"{option} {value} does not exist")
            return None
        return value

    checkpoint, records, dumps, manifests = (
        present("--checkpoint", checkpoint),
        present("--records", records),
        present("--dumps", dumps),
        present("--manifests", manifests),
    )
    load = tuple(p for p in load if present("--load", p) is not None)
    log = tuple(p for p in log if present("--log", p) is not None)
    if not run.exists():
        missing.append(f"{run} does not exist")
    inputs = discover(run, checkpoint=checkpoint, load=load, records=records, manifests=manifests, dumps=dumps, log=log)
    inputs.notes.extend(missing)
    lines: list[Any] = []
    try:
        result, lines = run_doctor(
            inputs, lint=api.lint, verify=api.verify, thresholds=th, select=settings.select, ignore=settings.ignore
        )
    except MissingDependency:
        raise
    except Exception as exc:  # a bug must surface as exit 2 with the usual report, not a traceback
        result = Result(target=str(run), command="doctor")
        result.findings.append(internal_error("doctor", exc))
    from weightcheck.triage import fill_fix_texts

    fill_fix_texts(result.findings)
    fmt_out = settings.format
    if fmt_out == "json":
        from weightcheck.reporters.machine import result_document

        doc = result_document(result)
        doc["checklist"] = [line.as_dict() for line in lines]
        output.write(json.dumps(doc, indent=2) + "\n")
    else:
        if fmt_out == "text":
            output.write(render_checklist(lines, result) + "\n")
        from weightcheck.reporters import render

        render(result, fmt_out, output, color=color, verbose=verbose)
    output.flush()
    report_internal_errors(result, debug)
    sys.exit(result.exit_code(Severity.parse(settings.fail_on), exit_zero=exit_zero))
