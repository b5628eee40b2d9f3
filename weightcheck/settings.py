"""`[tool.weightcheck]` settings from a pyproject.toml next to the checkpoint (or given with --config).

Command-line options override file settings. Unknown keys are an error (a typo must not silently
disable a rule selection).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOWN_KEYS = {"select", "ignore", "extend-select", "fail-on", "format", "pattern", "allow-skip", "map"}


class SettingsError(ValueError):
    pass


@dataclass
class Settings:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    fail_on: str = "error"
    format: str = "text"
    pattern: str | None = None
    allow_skip: list[str] = field(default_factory=list)
    map: list[str] = field(default_factory=list)
    source: str | None = None


def _str_list(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise SettingsError(f"[tool.weightcheck] {key} must be a string or a list of strings")


def find_config(target: Path) -> Path | None:
    base = target if target.is_dir() else target.parent
    candidate = base / "pyproject.toml"
    return candidate if candidate.is_file() else None


def load_settings(target: Path, explicit: Path | None = None) -> Settings:
    path = explicit or find_config(target)
    settings = Settings()
    if path is None:
        return settings
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: {exc}") from None
    table = doc.get("tool", {}).get("weightcheck")
    if table is None:
        if explicit is not None:
            raise SettingsError(f"{path} has no [tool.weightcheck] table")
        return settings
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: [tool.weightcheck] must be a table")
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        raise SettingsError(f"{path}: unknown [tool.weightcheck] keys: {', '.join(sorted(unknown))}")
    settings.source = str(path)
    if "select" in table:
        settings.select = _str_list(table["select"], "select")
    if "extend-select" in table:
        settings.select = [*settings.select, *_str_list(table["extend-select"], "extend-select")]
    if "ignore" in table:
        settings.ignore = _str_list(table["ignore"], "ignore")
    for key, attr in (("fail-on", "fail_on"), ("format", "format"), ("pattern", "pattern")):
        if key in table:
            if not isinstance(table[key], str):
                raise SettingsError(f"[tool.weightcheck] {key} must be a string")
            setattr(settings, attr, table[key])
    if "allow-skip" in table:
        settings.allow_skip = _str_list(table["allow-skip"], "allow-skip")
    if "map" in table:
        settings.map = _str_list(table["map"], "map")
    return settings
