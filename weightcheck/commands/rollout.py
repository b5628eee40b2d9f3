"""`weightcheck rollout DUMPS`: registered on the CLI group when weightcheck.cli loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from weightcheck.cli import cli, finish, output_options, resolve_settings
from weightcheck.findings import Result, internal_error

# CLI option -> Thresholds attribute (the same names as the config file's [tool.weightcheck.rollout] keys).
THRESHOLD_OPTIONS = (
    ("--ref-tol", "ref_tol", float, "Step-1 |mean(log_probs) − mean(ref_log_probs)| bound (slime/miles: 1e-8)."),
    ("--jitter-kl", "jitter_kl", float, "KL below which a step-1 difference is kernel jitter (guides: 1e-4)."),
    ("--large-kl", "large_kl", float, "KL above which step 1 is a configuration error (guides: 1)."),
    ("--train-rollout-diff", "train_rollout_diff", float, "Mean |log_probs − rollout_log_probs| bound (slime: 0.1)."),
    (
        "--train-rollout-mean-tol",
        "train_rollout_mean_tol",
        float,
        "|mean log_probs − mean rollout_log_probs| bound (miles: 0.03).",
    ),
    ("--elevated-nll", "elevated_nll", float, "Mean −log p per token that flags a template mismatch (guides: 0.8)."),
    (
        "--truncated-fraction",
        "truncated_fraction",
        float,
        "Share of truncated samples that flags missing stop tokens (0.5).",
    ),
    ("--repeat-min-tokens", "repeat_min_tokens", int, "Tokens a trailing n-gram loop must cover to be reported (32)."),
    ("--step1-rollout", "step1_rollout", int, "Rollout id whose train dump is step 1 (default 0)."),
    ("--reward-key", "reward_key", str, "Key of a dict reward (as --reward-key of slime/miles)."),
)


def threshold_options(fn: Any) -> Any:
    for flag, attr, kind, text in reversed(THRESHOLD_OPTIONS):
        fn = click.option(flag, attr, type=kind, default=None, help=text)(fn)
    return click.option(
        "--routing-replay/--no-routing-replay",
        "routing_replay",
        default=None,
        help="The run used rollout routing replay (R3): step-1 bound 5e-3 (miles).",
    )(fn)


def thresholds_from(settings_rollout: dict[str, Any], cli_values: dict[str, Any], where: str) -> Any:
    from weightcheck.rollouts import Thresholds

    try:
        th = Thresholds().updated(settings_rollout, where)
        return th.updated({k: v for k, v in cli_values.items() if v is not None})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@cli.command()
@click.argument("dumps", type=click.Path(path_type=Path))
@threshold_options
@output_options
def rollout(
    dumps: Path,
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
    """Check rollout and train debug dumps (--save-debug-rollout-data, --dump-details) against the step-1
    checklist of the slime / miles / Relax debugging guides.

    DUMPS: a --dump-details folder (rollout_data/, train_data/), a folder of dumps, one .pt file, or a Relax
    rollout_result/ folder of JSONL files. Dumps are loaded with torch.load(weights_only=True) only.
    """
    from weightcheck.deps import MissingDependency
    from weightcheck.rollouts import check_rollout

    settings = resolve_settings(
        dumps, config_path, command="rollout", select=select, ignore=ignore, fail_on=fail_on, fmt=fmt
    )
    where = f" in {settings.source}" if settings.source else ""
    th = thresholds_from(settings.rollout, values, where)
    try:
        result = check_rollout(dumps, th, select=settings.select, ignore=settings.ignore)
    except MissingDependency:
        raise
    except Exception as exc:  # a bug must surface as exit 2 with the usual report, not a traceback
        result = Result(target=str(dumps), command="rollout")
        result.findings.append(internal_error("rollout", exc))
    finish(result, settings, output, exit_zero=exit_zero, color=color, verbose=verbose, debug=debug)
