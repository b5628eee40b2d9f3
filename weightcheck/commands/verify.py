"""`weightcheck verify RECORDS --against REF`: registered on the CLI group when weightcheck.cli loads it.

Also the command-line equivalent of `check_weight_update_equal`: `--weight-version V --wait N
--expect-records K` checks the sync just pushed, waiting for every rank's record, and exits 1 when it is
wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from weightcheck.cli import cli, finish, hub_options, output_options, resolve_settings, with_revision
from weightcheck.findings import Result, internal_error


def _sync_choice(value: str | None) -> int | str | None:
    if value is None or value == "latest":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter("use a sync number (the NNNNN of sync-NNNNN/) or 'latest'") from None


@cli.command()
@click.argument("records", type=click.Path(path_type=Path))
@click.option(
    "--against",
    type=click.Path(path_type=Path),
    default=None,
    help="Reference: a safetensors checkpoint (step 0) or trainer manifest(s) (a file or a folder of parts).",
)
@click.option("--weight-version", default=None, help="Check only the sync that pushed this weight version.")
@click.option("--sync", "sync_choice", default=None, help="Check only sync N (sync-0000N/), or 'latest'.")
@click.option("--trainer-pp", type=int, default=None, help="Trainer pipeline-parallel size (names the stage).")
@click.option("--trainer-vp", type=int, default=None, help="Trainer virtual pipeline size.")
@click.option("--trainer-first-stage-layers", type=int, default=None, help="Layers on the trainer's first stage.")
@click.option("--trainer-last-stage-layers", type=int, default=None, help="Layers on the trainer's last stage.")
@click.option("--trainer-layout", default=None, help="Megatron pipeline_model_parallel_layout string.")
@click.option("--trainer-ep", type=int, default=None, help="Trainer expert-parallel size (names the EP rank).")
@click.option("--skip", multiple=True, help="Tensor/parameter names (glob, or `re:REGEX`; whole name, as allow-skip) "
              "to leave out of every check. Repeatable.")  # fmt: skip
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for --expect-records records to land.")
@click.option("--expect-records", type=int, default=None, help="Rank records the selected sync must have.")
@click.option("--download", is_flag=True, help="An --against repo id not fully cached is downloaded into the HF cache.")
@output_options
@hub_options()
def verify(
    records: Path,
    against: Path | None,
    weight_version: str | None,
    sync_choice: str | None,
    trainer_pp: int | None,
    trainer_vp: int | None,
    trainer_first_stage_layers: int | None,
    trainer_last_stage_layers: int | None,
    trainer_layout: str | None,
    trainer_ep: int | None,
    skip: tuple[str, ...],
    wait: float,
    expect_records: int | None,
    download: bool,
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
) -> None:
    """Check the weight syncs recorded by the load_weights tap (WEIGHTCHECK_DIR) against a reference.

    Per sync and engine: tensors missing, unexpected, duplicated, shifted by a forgotten pipeline or expert
    offset (with the trainer stage named), mismatched (classified), dropped by the engine, and engine
    parameters never or partly written.
    """
    from weightcheck.collapse import full_lists
    from weightcheck.deps import MissingDependency, require_verify_deps
    from weightcheck.verifying import TrainerLayout, records_incomplete, wait_for_records
    from weightcheck.verifying import verify as run_verify

    against = with_revision(against) if against is not None else None
    settings = resolve_settings(
        records, config_path, command="verify", select=select, ignore=ignore, fail_on=fail_on, fmt=fmt
    )
    require_verify_deps(records, against)
    from weightcheck.skiplist import check_entries

    try:
        skip_entries = check_entries([*settings.allow_skip, *skip])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sync = _sync_choice(sync_choice)
    trainer = TrainerLayout(
        pp_size=trainer_pp,
        vp_size=trainer_vp,
        first_stage_layers=trainer_first_stage_layers,
        last_stage_layers=trainer_last_stage_layers,
        layout=trainer_layout,
        ep_size=trainer_ep,
    )
    if expect_records is not None:
        wait_for_records(records, weight_version, expect_records, wait, say=lambda line: click.echo(line, err=True))
    try:
        with full_lists(verbose):
            result = run_verify(
                records,
                against,
                select=settings.select,
                ignore=settings.ignore,
                weight_version=weight_version,
                sync=sync,
                trainer=trainer,
                skip=skip_entries,
                download=download,
            )
        if expect_records is not None and (
            incomplete := records_incomplete(records, weight_version, expect_records, wait)
        ):
            result.findings.append(incomplete)
    except MissingDependency:
        raise
    except Exception as exc:  # a bug must surface as exit 2 with the usual report, not a traceback
        result = Result(target=str(records), command="verify")
        result.findings.append(internal_error("verify", exc))
    finish(result, settings, output, exit_zero=exit_zero, color=color, verbose=verbose, debug=debug)
