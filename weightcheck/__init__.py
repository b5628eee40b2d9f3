"""weightcheck: are the weights you are about to serve the weights you meant to serve?

Python API (see README "Python API"): `weightcheck.lint()`, `weightcheck.diff()`, `weightcheck.verify()`,
`weightcheck.rollout()` and `weightcheck.doctor()`, each returning a typed `weightcheck.Result` (doctor: with
its checklist lines). Importing the package imports nothing heavy.

The engines behind them live in modules with other names (`weightcheck.linting`, `weightcheck.diffing`,
`weightcheck.checkup`, `weightcheck.rollouts`), so `weightcheck.lint` is only ever the function.
"""

from __future__ import annotations

import sys
import types

from weightcheck.api import diff, doctor, lint, rollout, verify
from weightcheck.deps import MissingDependency
from weightcheck.findings import Finding, Location, Result, Severity
from weightcheck.version import __version__

__all__ = [
    "Finding", "Location", "MissingDependency", "Result", "Severity", "__version__", "diff", "doctor", "lint",
    "rollout", "verify",
]  # fmt: skip


class _Package(types.ModuleType):
    """`weightcheck.verify` is still both the API function and the verify engine (`weightcheck/verify.py`,
    becoming the `weightcheck/verify/` package): importing a submodule makes Python set it as an attribute of
    the package; this keeps the function. TODO(lead, after the verify-package merge): rename that package
    (e.g. `weightcheck/verifying/`) as lint/diff/doctor/rollout were, and delete this class."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "verify" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
