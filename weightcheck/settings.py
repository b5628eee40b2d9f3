"""Settings from `weightcheck.toml` or a pyproject.toml `[tool.weightcheck]` table (or `--config FILE`).

Discovery works like ruff's: the closest `weightcheck.toml` / `.weightcheck.toml` / `pyproject.toml` with a
`[tool.weightcheck]` table, searched from the target's folder upwards, then from the working directory
upwards. In one folder `.weightcheck.toml` wins over `weightcheck.toml`, which wins over `pyproject.toml`.
`weightcheck.toml` holds the keys at top level (no `[tool.weightcheck]` header).

Unlike ruff, whose targets are the user's own sources, weightcheck's target is an artifact from anywhere:
a settings file inside the checkpoint folder (or a folder below it) is not discovered, or a downloaded
checkpoint could switch off the rules that judge it (`ignore = ["ALL"]`) in a CI job that lints it from
the project's checkout. It is named in the report's notes and applies when given with `--config`, or when
weightcheck runs from inside that folder (pre-commit in a model repository: the user's own files).

Command-line options override file settings. Unknown keys and unknown values are errors (a typo must not
silently disable a rule selection).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from weightcheck import safe_io
from weightcheck.lightclass import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

KNOWN_KEYS = {"select", "ignore", "extend-select", "fail-on", "format", "pattern", "allow-skip", "map", "validate-with"}
# Suppression and targets (see docs/suppression.md).
KNOWN_KEYS |= {"per-tensor-ignores", "consumers", "baseline"}
# `weightcheck rollout` thresholds: a `[tool.weightcheck.rollout]` table, keys checked by weightcheck.rollouts.
KNOWN_KEYS |= {"rollout"}


class SettingsError(ValueError):
    pass


@dataclass
class Settings:
    """The resolved `[tool.weightcheck]` / weightcheck.toml settings of one run."""

    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    fail_on: str = "error"
    format: str = "text"
    pattern: str | None = None
    allow_skip: list[str] = field(default_factory=list)
    map: list[str] = field(default_factory=list)
    validate_with: str | None = None  # "mirror" | "compressed-tensors" (lint's WC301)
    per_tensor_ignores: dict[str, list[str]] = field(default_factory=dict)
    consumers: list[str] | None = None
    baseline: str | None = None
    # `[tool.weightcheck.rollout]`: threshold overrides for `weightcheck rollout` (validated there).
    rollout: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    # A settings file found inside the target and not applied (see the module docstring).
    not_applied: str | None = None

    def not_applied_note(self) -> str:
        return (
            f"settings file {self.not_applied} is inside the target and was not applied (a checkpoint does not "
            "configure its own check; pass it with --config to use it)"
        )


def _str_list(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise SettingsError(f"weightcheck setting {key!r} must be a string or a list of strings")


CONFIG_NAMES = (".weightcheck.toml", "weightcheck.toml", "pyproject.toml")
# A config file larger than this is not a config file (and must not be read whole).
_MAX_CONFIG_BYTES = 1 << 20


def _is_own_file(path: Path) -> bool:
    return path.name != "pyproject.toml"


def _read_toml(path: Path, confined: bool = False) -> dict[str, Any]:
    """A discovered config file may sit in the (untrusted) target: it is confined to its own folder (no
    symlink out), opened non-blocking as a regular file, and read within a size budget."""
    # Imported here: most runs find no settings file, and config-only lint pays every import.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    try:
        real = safe_io.confine_self(path) if confined else path
        return tomllib.loads(safe_io.read_text(real, _MAX_CONFIG_BYTES, name=str(path)))
    except safe_io.UnsafePath as exc:
        raise SettingsError(f"{path}: {exc.reason}") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise SettingsError(f"{path}: {exc}") from None


def _has_table(path: Path) -> bool:
    if _is_own_file(path):
        return True
    try:
        raw = safe_io.read_bytes(safe_io.confine_self(path), _MAX_CONFIG_BYTES)
    except safe_io.UnsafePath:
        return False
    return b"[tool.weightcheck" in raw


def _inside(folder: Path, root: Path | None) -> bool:
    return root is not None and (folder == root or root in folder.parents)


def _search_up(start: Path, untrusted: Path | None = None, skipped: list[Path] | None = None) -> Path | None:
    """The closest settings file from `start` upwards, skipping folders at or below `untrusted` (a settings
    file found there is appended to `skipped`)."""
    try:
        start = start.resolve()
    except (OSError, RuntimeError):
        return None
    for folder in (start, *start.parents):
        for name in CONFIG_NAMES:
            candidate = folder / name
            try:
                if candidate.is_file() and _has_table(candidate):
                    if _inside(folder, untrusted):
                        if skipped is not None and candidate not in skipped:
                            skipped.append(candidate)
                        break  # the folder's winning file is not applied; nor are its others
                    return candidate
            except OSError:
                continue
    return None


def _target_folder(target: Path | None) -> Path | None:
    """The checkpoint folder of a target (the folder itself, or the folder of a file in it), resolved."""
    if target is None:
        return None
    try:
        base = target if target.is_dir() else target.parent
        return base.resolve() if base.exists() else None
    except (OSError, RuntimeError):
        return None


def find_config(target: Path | None = None, cwd: Path | None = None, skipped: list[Path] | None = None) -> Path | None:
    """The settings file for `target`: closest to the target first, then closest to the working directory;
    never one inside the target's folder (listed in `skipped` instead)."""
    base = _target_folder(target)
    here = cwd or Path.cwd()
    try:  # noqa: SIM105  (not contextlib.suppress: contextlib stays off lint's start-up path)
        here = here.resolve()
    except (OSError, RuntimeError):
        pass
    # Working inside the target (pre-commit in a model repo, `cd ckpt && weightcheck lint .`): it is the
    # user's own folder, and its settings apply.
    untrusted = None if base is None or _inside(here, base) else base
    if base is not None:
        found = _search_up(base, untrusted=untrusted, skipped=skipped)
        if found is not None:
            return found
    return _search_up(here, untrusted=untrusted, skipped=skipped)


def load_settings(target: Path | None = None, explicit: Path | None = None) -> Settings:
    skipped: list[Path] = []
    path = explicit or find_config(target, skipped=skipped)
    settings = Settings()
    if explicit is None and skipped:
        settings.not_applied = str(skipped[0])
    if path is None:
        return settings
    doc = _read_toml(path, confined=explicit is None)
    nested = doc.get("tool", {}).get("weightcheck") if isinstance(doc.get("tool"), dict) else None
    if nested is None and _is_own_file(path):  # weightcheck.toml (or any --config file) with top-level keys
        table: Any = doc
        where = str(path)
    else:
        table = nested
        where = f"{path} [tool.weightcheck]"
        if table is None:
            if explicit is not None:
                raise SettingsError(f"{path} has no [tool.weightcheck] table")
            return settings
    if not isinstance(table, dict):
        raise SettingsError(f"{where} must be a table")
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        known = ", ".join(sorted(KNOWN_KEYS))
        raise SettingsError(f"{where}: unknown keys: {', '.join(sorted(unknown))} (known: {known})")
    settings.source = str(path)
    if "select" in table:
        settings.select = _str_list(table["select"], "select")
    if "extend-select" in table:
        settings.select = [*settings.select, *_str_list(table["extend-select"], "extend-select")]
    if "ignore" in table:
        settings.ignore = _str_list(table["ignore"], "ignore")
    for key, attr in (
        ("fail-on", "fail_on"),
        ("format", "format"),
        ("pattern", "pattern"),
        ("validate-with", "validate_with"),
    ):
        if key in table:
            if not isinstance(table[key], str):
                raise SettingsError(f"{where}: {key} must be a string")
            setattr(settings, attr, table[key])
    if "allow-skip" in table:
        settings.allow_skip = _str_list(table["allow-skip"], "allow-skip")
    if "map" in table:
        settings.map = _str_list(table["map"], "map")
    _load_triage(settings, table, path)
    if "rollout" in table:
        if not isinstance(table["rollout"], dict):
            raise SettingsError(f"{where}: rollout must be a table of thresholds")
        settings.rollout = dict(table["rollout"])
    return settings


def _check_patterns(patterns: list[str], key: str) -> None:
    """A bad `re:` pattern is a usage error when the settings file is read, before any work starts."""
    from weightcheck.userpattern import PatternSyntaxError, check_patterns

    try:
        check_patterns(patterns)
    except PatternSyntaxError as exc:
        raise SettingsError(f"[tool.weightcheck] {key}: {exc}") from None


def _load_triage(settings: Settings, table: dict[str, Any], path: Path) -> None:
    ignores = table.get("per-tensor-ignores", {})
    if not isinstance(ignores, dict):
        raise SettingsError('[tool.weightcheck] per-tensor-ignores must be a table: "glob" = ["WC309", ...]')
    settings.per_tensor_ignores = {
        str(glob): check_codes(_str_list(codes, f"per-tensor-ignores {glob!r}")) for glob, codes in ignores.items()
    }
    _check_patterns(list(settings.per_tensor_ignores), "per-tensor-ignores")
    if "consumers" in table:
        settings.consumers = check_consumers(_str_list(table["consumers"], "consumers"))
    if "baseline" in table:
        if not isinstance(table["baseline"], str):
            raise SettingsError("[tool.weightcheck] baseline must be a file name")
        settings.baseline = str(path.parent / table["baseline"])


def check_codes(codes: list[str]) -> list[str]:
    """Selectors that select no rule are an error: a typo must never silence nothing or everything."""
    from weightcheck.rules import all_rules, matches_selector

    rules = list(all_rules().values())
    unknown = [c for c in codes if not any(matches_selector(r, [c]) for r in rules)]
    if unknown:
        raise SettingsError(f"unknown rule selector(s) {', '.join(map(repr, unknown))}")
    return codes


def check_consumers(names: list[str]) -> list[str]:
    from weightcheck.quant.matchers import consumer_families

    known = consumer_families()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SettingsError(f"unknown consumer(s) {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return names


def split_codes(values: Iterable[str]) -> list[str]:
    """`--select WC2,WC401 --select WC5` as one list (the command line's comma and repeat forms)."""
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def resolve_run_settings(
    target: Path | None,
    config_path: Path | None,
    *,
    command: str | None,
    formats: Iterable[str],
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    fail_on: str | None = None,
    fmt: str | None = None,
    consumers: Iterable[str] = (),
) -> Settings:
    """Config file settings (discovered or `config_path`) overridden by the command line; every value checked.

    Each problem is a SettingsError whose text is the usage error the CLI prints (the click CLI and the
    launcher's plain-lint path both call this, so there is one wording). `command` ("lint", "diff", "verify")
    also makes a selection that leaves that command no rule an error; `formats` are the reporters' names."""
    from weightcheck.findings import Severity
    from weightcheck.rules import UnknownSelector, check_selectors

    settings = load_settings(target, config_path)
    select, ignore, consumers = list(select), list(ignore), list(consumers)
    if select:
        settings.select = split_codes(select)
    if ignore:
        settings.ignore = [*settings.ignore, *split_codes(ignore)]
    if fail_on:
        settings.fail_on = fail_on
    if fmt:
        settings.format = fmt
    where = f" in {settings.source}" if settings.source else ""
    if settings.validate_with not in (None, "mirror", "compressed-tensors"):
        raise SettingsError(f"validate-with must be mirror or compressed-tensors in {settings.source}")
    if consumers:
        settings.consumers = check_consumers(split_codes(consumers))
    names = list(formats)
    if settings.format not in names:
        raise SettingsError(f"unknown format {settings.format!r}{where} (choose from {', '.join(names)})")
    try:
        Severity.parse(settings.fail_on)
    except ValueError as exc:
        raise SettingsError(f"{exc}{where}") from None
    try:
        check_selectors(settings.select, settings.ignore, command=command)
    except UnknownSelector as exc:
        raise SettingsError(str(exc) + where) from None
    return settings
