"""weightcheck: are the weights you are about to serve the weights you meant to serve?

Python API (see README "Python API"): `weightcheck.lint()`, `weightcheck.diff()`, `weightcheck.verify()`,
each returning a typed `weightcheck.Result`. Importing the package imports nothing heavy.
"""

from __future__ import annotations

import sys
import types

from weightcheck.api import diff, lint, verify
from weightcheck.deps import MissingDependency
from weightcheck.findings import Finding, Location, Result, Severity
from weightcheck.version import __version__

__all__ = ["Finding", "Location", "MissingDependency", "Result", "Severity", "__version__", "diff", "lint", "verify"]

_API = {"lint": lint, "diff": diff, "verify": verify}


class _Package(types.ModuleType):
    """`weightcheck.lint` etc. are both API functions and implementation modules (`weightcheck.lint.lint`).
    Importing a submodule makes Python set it as an attribute of the package; this keeps the function."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
