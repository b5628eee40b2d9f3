"""`weightcheck diff A B`: registered on the CLI group when weightcheck.cli loads its command modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from weightcheck.cli import (
    check_ray,
    cli,
    finish,
    hub_options,
    output_options,
    progress_option,
    resolve_settings,
    with_revision,
)


@cli.command()
@click.argument("reference", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option(
    "--map",
    "maps",
    multiple=True,
    help="Name map: a file of `pattern_a -> pattern_b` lines, or one inline rule; pattern_a is a glob whose `*` "
    "fill pattern_b's `*`, or `re:REGEX` whose groups do. Repeatable.",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Comparison policy file: `<pattern> <tier> [key=value]` lines (glob or `re:REGEX`, whole name), tried "
    "before the built-in rules.",
)
@click.option(
    "--no-default-policy",
    "no_default_policy",
    is_flag=True,
    help="Only the --policy rules apply (the built-in ones compare every tensor): a tensor none matches is an "
    "error (WC716).",
)
@click.option(
    "--allow-skip",
    multiple=True,
    help="Tensors (glob, or `re:REGEX`; whole name) that may be skipped or missing without failing. Repeatable.",
)
@progress_option
@click.option("--download", is_flag=True, help="A Hub repo id not fully cached is downloaded into the HF cache.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Compare as Ray tasks; alone it starts or joins a local Ray like ray.init(), or the cluster at "
              "ADDRESS ('auto': a running one).")  # fmt: skip
@output_options
@hub_options()
def diff(
    reference: Path,
    candidate: Path,
    maps: tuple[str, ...],
    policy_path: Path | None,
    no_default_policy: bool,
    allow_skip: tuple[str, ...],
    progress: bool | None,
    download: bool,
    ray_address: str | None,
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
    """Compare checkpoint CANDIDATE against REFERENCE tensor by tensor (either may be quantized).

    Lossless paths must be bit-exact; quantized tensors are dequantized and compared within one ULP of
    their format per element; every mismatch is classified (shifted, transposed, never written...).
    """
    from weightcheck.collapse import full_lists
    from weightcheck.compare.policy import PolicyError, load_policy
    from weightcheck.deps import MissingDependency, require
    from weightcheck.diffing import DiffOptions, NameMapError, internal_error, load_name_map
    from weightcheck.diffing import diff as run_diff
    from weightcheck.progress import choose_mode
    from weightcheck.skiplist import check_entries

    check_ray(ray_address)
    reference, candidate = with_revision(reference), with_revision(candidate)
    settings = resolve_settings(
        reference, config_path, command="diff", select=select, ignore=ignore, fail_on=fail_on, fmt=fmt
    )
    base_dir = Path(settings.source).parent if settings.source else None
    try:
        name_maps = [rule for spec in (*settings.map, *maps) for rule in load_name_map(spec, base_dir)]
        policy_rules = load_policy(policy_path) if policy_path else []
        skip_entries = check_entries([*settings.allow_skip, *allow_skip])
    except (NameMapError, PolicyError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    if reference.exists() and candidate.exists():  # a missing path is exit 3 below, not a dependency error
        require("diff", "content", ("torch", "numpy"))
        check_ray(ray_address, connect=True)
    options = DiffOptions(
        maps=name_maps,
        policy_rules=policy_rules,
        default_policy=not no_default_policy,
        allow_skip=skip_entries,
        select=settings.select,
        ignore=settings.ignore,
        progress=choose_mode(progress),
        download=download,
        ray=ray_address,
    )
    try:
        with full_lists(verbose):
            result = run_diff(reference, candidate, options)
    except MissingDependency:
        raise
    except Exception as exc:  # a bug must surface as exit 2 with the usual report, not a traceback
        result = internal_error(str(candidate), exc)
    finish(result, settings, output, exit_zero=exit_zero, color=color, verbose=verbose, debug=debug)
