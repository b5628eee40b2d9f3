"""The package version, in a module of its own: reporters, the tap and the CLI stamp it on what they write,
and importing it from `weightcheck` itself would make them depend on the package's top (the Python API)."""

__version__ = "0.1.0"
