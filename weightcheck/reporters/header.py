"""The keys every JSON document of every command starts with: a module of its own so that the emitters
(reporters.machine) and the dispatcher (reporters/__init__, which imports the emitters) do not import each
other."""

from __future__ import annotations

from weightcheck.version import __version__

SCHEMA_VERSION = "1.0"


def tool_header(command: str) -> dict[str, object]:
    """The keys every JSON document of every command starts with."""
    tool = {"name": "weightcheck", "version": __version__}
    return {"schema_version": SCHEMA_VERSION, "tool": tool, "command": command}
