"""Command-line interface. Exit codes: 0 clean, 1 findings at/above --fail-on, 2 usage/internal error,
3 nothing checked.

Why one ~600-line module: it holds the options every command shares (output, triage, Hub, progress, settings
resolution, `finish`) and the two commands that predate `commands/` (lint, rules); each other command is its
own module in `commands/`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from weightcheck.findings import EXIT_ERROR, Result, Severity
from weightcheck.frontend import (
    debug_requested,
    escape_undecodable_output,
    lint_options,
    prepare_result,
    report_crash,
    report_internal_errors,
)
from weightcheck.reporters import FORMATS, render
from weightcheck.settings import Settings, SettingsError, load_settings, resolve_run_settings
from weightcheck.version import __version__

# Report files take non-UTF-8 names (lone surrogates) as escapes, like stdout (see main()).
REPORT_FILE = click.File("w", errors="backslashreplace")


def config_and_output_options(
    config_help: str = "Settings file (default: discovered from the working directory upwards); its format applies.",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--config` and `-o` for the commands with their own formats (rules, layout, explain-ignore)."""

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("--output", "-o", type=REPORT_FILE, default="-", help="Write here (default: stdout).")(fn)
        return click.option(
            "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help=config_help
        )(fn)

    return apply


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every checking command (lint, diff, verify)."""
    decorators = [
        click.option(
            "--format",
            "--output-format",  # ruff's spelling
            "fmt",
            type=click.Choice(FORMATS),
            default=None,
            help="Output format (default: text, or the config's format).",
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
            "--exit-zero",
            is_flag=True,
            help="Exit 0 even when findings are reported (not when nothing was checked, nor on an internal error).",
        ),
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="weightcheck.toml, or a pyproject.toml with [tool.weightcheck] (default: discovered from the "
            "target's folder upwards, then the working directory's).",
        ),
        click.option(
            "--output", "-o", type=REPORT_FILE, default="-", help="Write the report here (default: stdout)."
        ),
        click.option("--color/--no-color", default=None, help="Force colour on or off in text output."),
        click.option("--verbose", "-v", is_flag=True, help="Show every finding and every name in text output."),
        click.option("--debug", is_flag=True, help="Print the traceback of an internal error (WC000) on stderr."),
        *_triage_options(),
        *_report_shape_options(),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


# ---- suppression, baselines, targets, --fix (docs/suppression.md). Stored in the click context's meta so
# each command's signature stays as it is; `finish` and `lint` read them back.
def _to_meta(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"weightcheck.{param.name}"] = value
    return value


def _meta(name: str, default: Any = None) -> Any:
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(f"weightcheck.{name}", default) if ctx else default


def _triage_options() -> list[Callable[..., Any]]:
    path = click.Path(dir_okay=False, path_type=Path)
    return [
        click.option("--baseline", type=path, expose_value=False, callback=_to_meta,
                     help="Hide the known findings recorded in this baseline file (see --write-baseline)."),
        click.option("--write-baseline", type=path, expose_value=False, callback=_to_meta,
                     help="Record this run's findings as known in FILE (then exit 0)."),
        click.option("--consumers", multiple=True, expose_value=False, callback=_to_meta,
                     help="Consumers you deploy to (e.g. vllm,sglang): other consumers' ignore-list views "
                     "are not checked. Default: all, or [tool.weightcheck] consumers."),
    ]  # fmt: skip


def _report_shape_options() -> list[Callable[..., Any]]:
    """ruff's `--statistics` and `-q/--quiet`, and `--output-sarif FILE` (one run, two reports: the Action)."""
    return [
        click.option("--statistics", is_flag=True, expose_value=False, callback=_to_meta,
                     help="Print one line per rule (count, code, name) instead of the findings (text, json)."),
        click.option("--quiet", "-q", is_flag=True, expose_value=False, callback=_to_meta,
                     help="Text output: the findings only, no notes and no summary line (a run that checked "
                     "nothing still says so)."),
        click.option("--output-sarif", type=click.Path(dir_okay=False, path_type=Path), expose_value=False,
                     callback=_to_meta,
                     help="Also write the SARIF report of this same run to FILE (a CI job lints once for its "
                     "annotations and for code scanning)."),
    ]  # fmt: skip


def hub_options(revision: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--token`, `--cache-dir` (and `--revision` where the command has none of its own) for every command that
    takes a Hub target, as the Hugging Face CLI spells them. They set what weightcheck's Hub access reads per
    call (HF_TOKEN, HF_HUB_CACHE), so one spelling reaches every code path."""

    def set_env(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
        def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
            if value:
                os.environ[name] = str(value)
            return value

        return callback

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        if revision:
            fn = click.option("--revision", "hub_revision", default=None, expose_value=False, callback=_to_meta,
                              help="For Hub repo targets naming no revision: branch, tag or commit.")(fn)  # fmt: skip
        fn = click.option("--cache-dir", default=None, expose_value=False, callback=set_env("HF_HUB_CACHE"),
                          help="Hugging Face cache folder (default: HF_HUB_CACHE / HF_HOME).")(fn)  # fmt: skip
        return click.option("--token", default=None, expose_value=False, callback=set_env("HF_TOKEN"),
                            help="Hugging Face token for private or gated repos (default: HF_TOKEN).")(fn)  # fmt: skip

    return apply


def with_revision(target: Path) -> Path:
    """`target` with `--revision` applied when it is a Hub repo id naming no revision of its own."""
    from weightcheck.hub import apply_revision

    return apply_revision(target, _meta("hub_revision"))


def _lint_fix_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--diff", "fix_diff", is_flag=True, expose_value=False, callback=_to_meta,
                      help="Print the edits --fix would make as a unified diff, write nothing (exit 1 when "
                      "there are any).")(fn)  # fmt: skip
    return click.option("--fix", is_flag=True, expose_value=False, callback=_to_meta,
                        help="Apply the safe, mechanical fixes to the JSON files (index, ignore lists); "
                        "never tensor data.")(fn)  # fmt: skip


def progress_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--progress/--no-progress",
        default=None,
        help="Progress on stderr for long work: a bar on a terminal, a plain line every 10 s otherwise "
        "(default: on).",
    )(fn)


def resolve_settings(target: Path | None, config_path: Path | None, command: str | None = None, **cli: Any) -> Settings:
    """Config file settings (discovered or --config) overridden by the command line; every value checked
    (`settings.resolve_run_settings`); a problem is a usage error.

    `command` ("lint", "diff", "verify") also makes a selection that leaves that command no rule an error."""
    try:
        return resolve_run_settings(
            target,
            config_path,
            command=command,
            formats=FORMATS,
            select=cli.get("select") or (),
            ignore=cli.get("ignore") or (),
            fail_on=cli.get("fail_on"),
            fmt=cli.get("fmt"),
            consumers=_meta("consumers") or (),
        )
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None


def config_format(target: Path | None, config_path: Path | None, allowed: tuple[str, ...], given: str | None) -> str:
    """For commands with their own formats (rules, layout, explain-ignore): --format, else the config's format
    when this command supports it, else text. The config file is still read, so its errors are reported."""
    try:
        settings = load_settings(target, config_path)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    if given:
        return given
    return settings.format if settings.format in allowed else "text"


def check_ray(address: str | None, *, connect: bool = False) -> None:
    """`--ray` without Ray installed is a usage error (exit 2), before any work starts. With `connect`, Ray is
    started or joined now, so a cluster that cannot be reached is one line and exit 2 (never WC000)."""
    if address is not None:
        from weightcheck.distributed import RayUnavailable, require_ray

        try:
            require_ray()
        except RayUnavailable as exc:
            raise click.UsageError(str(exc)) from None
        if connect:
            from weightcheck.distributed import connect as connect_ray

            try:
                connect_ray(address)
            except RayUnavailable as exc:
                raise click.ClickException(str(exc)) from None


def finish(
    result: Result,
    settings: Settings,
    output: Any,
    *,
    exit_zero: bool,
    color: bool | None,
    verbose: bool,
    debug: bool = False,
) -> None:
    from weightcheck.triage import BaselineError, apply_baseline, read_baseline, write_baseline

    prepare_result(result, settings)

    baseline = _meta("baseline") or (Path(settings.baseline) if settings.baseline else None)
    if _meta("write_baseline"):
        write_baseline(result, _meta("write_baseline"))
        result.notes.append(f"{len(result.findings)} finding(s) written to the baseline {_meta('write_baseline')}")
        exit_zero = True
    elif baseline is not None:
        try:
            apply_baseline(result, read_baseline(baseline))
        except BaselineError as exc:
            raise click.UsageError(str(exc)) from None
    if _meta("output_sarif"):
        try:
            with open(_meta("output_sarif"), "w", encoding="utf-8") as sarif:
                render(result, "sarif", sarif)
        except OSError as exc:
            where = _meta("output_sarif")
            raise click.ClickException(f"--output-sarif: cannot write {where}: {exc.strerror}") from None
    if _meta("statistics"):
        _render_statistics(result, settings.format, output)
    else:
        render(result, settings.format, output, color=color, verbose=verbose, quiet=bool(_meta("quiet")))
    output.flush()
    report_internal_errors(result, debug or debug_requested())
    sys.exit(result.exit_code(Severity.parse(settings.fail_on), exit_zero=exit_zero))


def _render_statistics(result: Result, fmt: str, output: Any) -> None:
    """`--statistics` (ruff's): one line per rule, most frequent first; the exit code is unchanged."""
    import json

    rows: dict[tuple[str, str], int] = {}
    for finding in result.findings:
        rows[(finding.code, finding.name)] = rows.get((finding.code, finding.name), 0) + 1
    ordered = sorted(rows.items(), key=lambda item: (-item[1], item[0][0]))
    if fmt == "json":
        doc = [{"code": code, "name": name, "count": count} for (code, name), count in ordered]
        output.write(json.dumps(doc, indent=2) + "\n")
        return
    if fmt != "text":
        raise click.UsageError("--statistics prints text or json")
    for (code, name), count in ordered:
        output.write(f"{count:>5}\t{code}\t{name}\n")
    if result.nothing_checked or result.unchecked_targets:
        output.write("nothing was checked\n" if result.nothing_checked else "not checked: "
                     f"{', '.join(result.unchecked_targets)}\n")  # fmt: skip


# Commands that live in their own modules, by command name. Each registers itself on `cli` when imported
# and is imported only when that command runs (or --help lists them), so `weightcheck lint` never pays for
# layout/diff/verify imports. Each module is owned by one capability: adding one never touches the others.
LAZY_COMMANDS: dict[str, str] = {
    "layout": "weightcheck.commands.layout",
    "diff": "weightcheck.commands.diff",
    "verify": "weightcheck.commands.verify",
    "explain-ignore": "weightcheck.commands.quant",
    "rollout": "weightcheck.commands.rollout",
    "doctor": "weightcheck.commands.doctor",
}
COMMAND_MODULES = tuple(dict.fromkeys(LAZY_COMMANDS.values()))


class LazyGroup(click.Group):
    """A click group that imports a command's module on first use (click's documented lazy-loading
    pattern: override `get_command` and `list_commands`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            _import_command_module(LAZY_COMMANDS[cmd_name])
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="weightcheck")
def cli() -> None:
    """weightcheck: are the weights you are about to serve the weights you meant to serve?"""


@cli.command()
@click.argument("targets", nargs=-1, type=click.Path(path_type=Path))
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
@click.option(
    "--validate-with",
    type=click.Choice(["mirror", "compressed-tensors"]),
    default=None,
    help="Validator of compressed-tensors configs (WC301): weightcheck's mirror (default, fast) or the installed "
    "compressed-tensors package (imports torch).",
)
@progress_option
@click.option("--revision", default=None, help="For a Hub repo id: branch, tag or commit (default: main).")
@click.option("--download", is_flag=True, help="With --content on a Hub repo: download it into the HF cache first.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="With --content: run the data checks as Ray tasks; alone it starts or joins a local Ray like "
              "ray.init() (RAY_ADDRESS if set), or the cluster at ADDRESS ('auto': a running one).")  # fmt: skip
@output_options
@_lint_fix_options
@click.option("--pre-commit", "pre_commit", is_flag=True, expose_value=False, callback=_to_meta,
              help="As a pre-commit hook: also lint the folders of shard/index files the commit deletes (pre-commit "
              "never passes deleted files); with no checkpoint file changed, exit 0.")  # fmt: skip
@hub_options(revision=False)
def lint(
    targets: tuple[Path, ...],
    pattern: str | None,
    validate_with: str | None,
    content: bool,
    hash_out: Path | None,
    against_manifest: Path | None,
    progress: bool | None,
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
    debug: bool,
) -> None:
    """Lint checkpoints: a directory, a .safetensors file, a config.json (config-only), an index file (its
    folder), or org/name[@rev] in the local Hugging Face cache. Several targets (as pre-commit passes them)
    give one report; targets naming the same checkpoint lint it once, whole. Header-only unless --content is
    given.

    \b
    Local path or Hub repo: an existing path is local; hf://org/name is the Hub. A missing org/name is a
    local typo (no Hub request) when it starts with ./ ../ / or ~, its first component exists here, or it
    ends in .json/.safetensors/.jsonl/.toml; otherwise the HF cache, then the Hub, are tried."""
    from weightcheck.collapse import full_lists
    from weightcheck.deps import require
    from weightcheck.linting import lint_many
    from weightcheck.patterns import PatternError

    if _meta("pre_commit"):
        targets = _pre_commit_targets(targets)
    if not targets:
        raise click.UsageError("Missing argument 'TARGETS...'.")
    settings = resolve_settings(
        targets[0], config_path, command="lint", select=select, ignore=ignore, fail_on=fail_on, fmt=fmt
    )
    if (hash_out or against_manifest) and not content:
        raise click.UsageError("--hash and --against-manifest need --content")
    if len(targets) > 1 and (hash_out or against_manifest):
        raise click.UsageError("--hash and --against-manifest take one target")
    if content:
        require("lint --content", "content", ("torch", "numpy"))
    validator = validate_with or settings.validate_with
    if validator == "compressed-tensors":  # asked for by name: never fall back to the mirror in silence
        require("lint --validate-with compressed-tensors", "quant", ("compressed_tensors",))
    if ray_address is not None and not content:
        raise click.UsageError("--ray needs --content (header-only lint reads kilobytes: nothing to distribute)")
    check_ray(ray_address)
    if ray_address is not None and all(Path(t).exists() for t in targets):
        check_ray(ray_address, connect=True)  # a missing target is exit 3 below, without starting Ray
    options = lint_options(
        settings,
        pattern=pattern,
        validate_with=validator,
        content=content,
        hash_out=hash_out,
        against_manifest=against_manifest,
        progress=progress,
        revision=revision,
        download=download,
        ray_address=ray_address,
    )
    try:
        with full_lists(verbose):  # -v: every name pattern, not "(+N more patterns)"
            result = lint_many(targets, select=settings.select, ignore=settings.ignore, options=options)
            if _meta("fix") or _meta("fix_diff"):  # --diff alone previews what --fix would change
                if len(targets) != 1:
                    raise click.UsageError("--fix takes one checkpoint at a time")
                again = lambda: lint_many(targets, select=settings.select, ignore=settings.ignore, options=options)  # noqa: E731
                result = _fix(Path(targets[0]), result, output, again)
    except PatternError as exc:
        raise click.UsageError(str(exc)) from None
    finish(result, settings, output, exit_zero=exit_zero, color=color, verbose=verbose, debug=debug)


def _pre_commit_targets(passed: tuple[Path, ...]) -> tuple[Path, ...]:
    """`--pre-commit`: the passed files plus the folders of deleted shards/indexes; none at all is a hook run
    on a commit that changes no checkpoint file, which pre-commit itself reports as skipped (exit 0)."""
    from weightcheck.precommit import GitUnavailable, hook_targets

    try:
        targets, notes = hook_targets(list(passed))
    except GitUnavailable as exc:
        raise click.UsageError(f"--pre-commit: {exc}") from None
    for note in notes:
        click.echo(f"weightcheck: {note}", err=True)
    if not targets:
        click.echo("weightcheck: no checkpoint file changed: nothing for this hook to check", err=True)
        sys.exit(0)
    return tuple(targets)


def _fix(target: Path, result: Result, output: Any, relint: Callable[[], Result]) -> Result:
    """`lint --fix [--diff]`: plan the JSON edits the findings call for; print them (--diff, then exit 1
    when there are any) or write them and lint again, so the report shows what is left."""
    from weightcheck.fixes import fix_checkpoint

    # --diff alone previews what --fix would change (nothing written).
    result, edits = fix_checkpoint(target, result, relint, write=not _meta("fix_diff"))
    if _meta("fix_diff") and edits is not None:
        for edit in edits:
            output.write(edit.diff())
        output.flush()
        sys.exit(1 if edits else 0)
    return result


@cli.command()
@click.argument("code", required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None)
@config_and_output_options()
def rules(code: str | None, fmt: str | None, config_path: Path | None, output: Any) -> None:
    """List all rules, or explain one (by code or name). Severity lists every severity a rule emits."""
    import json

    from weightcheck.reporters import tool_header
    from weightcheck.rules import FAMILIES, Rule, all_rules, get_rule

    fmt = config_format(None, config_path, ("text", "json"), fmt)

    def entry(r: Rule, full: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": r.code,
            "name": r.name,
            "severity": r.severity.label,
            "severities": [s.label for s in r.severities],
            "summary": r.summary,
            "command": r.command,
        }
        if full:
            out.update(doc=r.doc, bad=r.bad.strip(), good=r.good.strip())
        return out

    if code:
        found = get_rule(code)
        if found is None:
            raise click.UsageError(f"no rule {code!r}; run `weightcheck rules` for the list")
        if fmt == "json":
            click.echo(json.dumps({**tool_header("rules"), "rule": entry(found, True)}, indent=2), file=output)
        else:
            click.echo(found.explain(), file=output)
        return
    registry = all_rules()
    if fmt == "json":
        doc = {**tool_header("rules"), "rules": [entry(r, False) for r in registry.values()]}
        click.echo(json.dumps(doc, indent=2), file=output)
        return
    family = None
    for r in registry.values():
        if r.code[:3] != family:
            family = r.code[:3]
            click.echo(f"\n{family}xx — {FAMILIES.get(family, '')}", file=output)
        click.echo(f"  {r.code}  {r.name:<32} {r.severity_label:<14} {r.summary}", file=output)


def _import_command_module(module: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # a real import error inside the command module must surface
            raise


def _load_commands() -> None:
    """Import every command module now (for callers that walk `cli.commands`)."""
    for module in COMMAND_MODULES:
        _import_command_module(module)


def main() -> None:
    from weightcheck.deps import MissingDependency

    escape_undecodable_output()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_ERROR)
    except MissingDependency as exc:  # one line naming the extra to install, never a crash per tensor
        click.echo(f"weightcheck: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    except click.exceptions.Abort:
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as exc:  # internal error: exit 2, short message, no silent pass
        report_crash(exc)
        sys.exit(EXIT_ERROR)


if __name__ == "__main__":
    # Run through the package module so command modules register on the same `cli` object.
    from weightcheck.cli import main as package_main

    package_main()
