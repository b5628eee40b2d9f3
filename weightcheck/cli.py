"""Command-line interface. Exit codes: 0 clean, 1 findings at/above --fail-on, 2 usage/internal error,
3 nothing checked."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from weightcheck import __version__
from weightcheck.findings import EXIT_ERROR, Result, Severity
from weightcheck.reporters import FORMATS, render
from weightcheck.settings import Settings, SettingsError, load_settings


def _split_codes(values: tuple[str, ...]) -> list[str]:
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every checking command (lint, diff, verify)."""
    decorators = [
        click.option(
            "--format",
            "fmt",
            type=click.Choice(FORMATS),
            default=None,
            help="Output format (default: text, or [tool.weightcheck] format).",
        ),
        click.option("--select", multiple=True, help="Rule codes or prefixes to run (e.g. WC2,WC401). Default ALL."),
        click.option("--ignore", multiple=True, help="Rule codes or prefixes to skip."),
        click.option(
            "--fail-on",
            type=click.Choice(["error", "warning", "info"]),
            default=None,
            help="Lowest severity that makes the exit code 1 (default: error).",
        ),
        click.option(
            "--exit-zero", is_flag=True, help="Exit 0 even when findings are reported (not when nothing was checked)."
        ),
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="pyproject.toml with a [tool.weightcheck] table (default: one next to the target).",
        ),
        click.option(
            "--output", "-o", type=click.File("w"), default="-", help="Write the report here (default: stdout)."
        ),
        click.option("--color/--no-color", default=None, help="Force colour on or off in text output."),
        click.option("--verbose", "-v", is_flag=True, help="Show every finding in text output."),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def resolve_settings(target: Path, config_path: Path | None, **cli: Any) -> Settings:
    try:
        settings = load_settings(target, config_path)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    if cli.get("select"):
        settings.select = _split_codes(cli["select"])
    if cli.get("ignore"):
        settings.ignore = [*settings.ignore, *_split_codes(cli["ignore"])]
    if cli.get("fail_on"):
        settings.fail_on = cli["fail_on"]
    if cli.get("fmt"):
        settings.format = cli["fmt"]
    if settings.format not in FORMATS:
        raise click.UsageError(f"unknown format {settings.format!r} in {settings.source}")
    try:
        Severity.parse(settings.fail_on)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return settings


def check_ray(address: str | None) -> None:
    """`--ray` without Ray installed is a usage error (exit 2), before any work starts."""
    if address is not None:
        from weightcheck.distributed import RayUnavailable, require_ray

        try:
            require_ray()
        except RayUnavailable as exc:
            raise click.UsageError(str(exc)) from None


def finish(
    result: Result, settings: Settings, output: Any, *, exit_zero: bool, color: bool | None, verbose: bool
) -> None:
    render(result, settings.format, output, color=color, verbose=verbose)
    output.flush()
    sys.exit(result.exit_code(Severity.parse(settings.fail_on), exit_zero=exit_zero))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="weightcheck")
def cli() -> None:
    """weightcheck: are the weights you are about to serve the weights you meant to serve?"""


@cli.command()
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--pattern", default=None, help="Architecture pattern name or TOML file (default: detected).")
@click.option("--content", is_flag=True, help="Also read tensor data: NaN/Inf, zeros, bad scales, tied weights.")
@click.option(
    "--hash",
    "hash_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --content: write a per-tensor digest manifest (JSON) to this file.",
)
@click.option(
    "--against-manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --content: compare per-tensor digests with this manifest.",
)
@click.option("--revision", default=None, help="For a Hub repo id: branch, tag or commit (default: main).")
@click.option("--download", is_flag=True, help="With --content on a Hub repo: download it into the HF cache first.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="With --content: run the data checks as Ray tasks (local, or the cluster at ADDRESS).")  # fmt: skip
@output_options
def lint(
    target: Path,
    pattern: str | None,
    content: bool,
    hash_out: Path | None,
    against_manifest: Path | None,
    revision: str | None,
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
) -> None:
    """Lint a checkpoint directory (or a config.json). Header-only unless --content is given."""
    from weightcheck.lint import lint as run_lint
    from weightcheck.patterns import PatternError

    settings = resolve_settings(target, config_path, select=select, ignore=ignore, fail_on=fail_on, fmt=fmt)
    if (hash_out or against_manifest) and not content:
        raise click.UsageError("--hash and --against-manifest need --content")
    if ray_address is not None and not content:
        raise click.UsageError("--ray needs --content (header-only lint reads kilobytes: nothing to distribute)")
    check_ray(ray_address)
    options = {
        "pattern": pattern or settings.pattern,
        "content": content,
        "hash_out": hash_out,
        "against_manifest": against_manifest,
        "revision": revision,
        "download": download,
        "ray": ray_address,
        # Progress bars (drawn on stderr) only for a human watching text output.
        "progress": settings.format == "text" and sys.stderr.isatty(),
    }
    try:
        result = run_lint(target, select=settings.select, ignore=settings.ignore, options=options)
    except PatternError as exc:
        raise click.UsageError(str(exc)) from None
    finish(result, settings, output, exit_zero=exit_zero, color=color, verbose=verbose)


@cli.command()
@click.argument("code", required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def rules(code: str | None, fmt: str) -> None:
    """List all rules, or explain one (by code or name)."""
    import json

    from weightcheck.rules import FAMILIES, all_rules, get_rule

    if code:
        found = get_rule(code)
        if found is None:
            raise click.UsageError(f"no rule {code!r}; run `weightcheck rules` for the list")
        if fmt == "json":
            click.echo(
                json.dumps(
                    {
                        "code": found.code,
                        "name": found.name,
                        "severity": found.severity.label,
                        "summary": found.summary,
                        "doc": found.doc,
                        "bad": found.bad.strip(),
                        "good": found.good.strip(),
                        "command": found.command,
                    },
                    indent=2,
                )
            )
        else:
            click.echo(found.explain())
        return
    registry = all_rules()
    if fmt == "json":
        click.echo(
            json.dumps(
                [
                    {
                        "code": r.code,
                        "name": r.name,
                        "severity": r.severity.label,
                        "summary": r.summary,
                        "command": r.command,
                    }
                    for r in registry.values()
                ],
                indent=2,
            )
        )
        return
    family = None
    for r in registry.values():
        if r.code[:3] != family:
            family = r.code[:3]
            click.echo(f"\n{family}xx — {FAMILIES.get(family, '')}")
        click.echo(f"  {r.code}  {r.name:<32} {r.severity.label:<8} {r.summary}")


# Commands that live in their own modules register themselves on `cli` when imported. Each module is
# owned by one capability (layout, diff, verify...), so adding one never touches the commands above.
COMMAND_MODULES = (
    "weightcheck.commands.layout",
    "weightcheck.commands.diff",
    "weightcheck.commands.verify",
    "weightcheck.commands.quant",
)


def _load_commands() -> None:
    import importlib

    for module in COMMAND_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real import error inside the command module must surface
                raise


def main() -> None:
    _load_commands()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_ERROR)
    except click.exceptions.Abort:
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as exc:  # internal error: exit 2, short message, no silent pass
        click.echo(f"weightcheck: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_ERROR)


if __name__ == "__main__":
    # Run through the package module so command modules register on the same `cli` object.
    from weightcheck.cli import main as package_main

    package_main()
