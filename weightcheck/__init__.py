"""weightcheck: are the weights you are about to serve the weights you meant to serve?

Python API (see README "Python API"): `weightcheck.lint()`, `weightcheck.diff()`, `weightcheck.verify()`,
`weightcheck.rollout()` and `weightcheck.doctor()`, each returning a typed `weightcheck.Result` (doctor: with
its checklist lines). Importing the package imports nothing heavy.

The engines behind them live in modules with other names (`weightcheck.linting`, `weightcheck.diffing`,
`weightcheck.verifying`, `weightcheck.checkup`, `weightcheck.rollouts`), so `weightcheck.lint` is only ever the
function. `weightcheck.TrainerLayout` and `weightcheck.WeightSyncError` (the live check's) load on first use.
"""

from __future__ import annotations

from weightcheck.api import diff, doctor, lint, rollout, verify
from weightcheck.deps import MissingDependency
from weightcheck.findings import Finding, Location, Result, Severity
from weightcheck.version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Finding", "Location", "MissingDependency", "Result", "Severity", "TrainerLayout", "WeightSyncError",
    "__version__", "diff", "doctor", "lint", "rollout", "verify",
]  # fmt: skip


_LAZY = {"TrainerLayout": "weightcheck.verifying", "WeightSyncError": "weightcheck.verifying"}


def __getattr__(name: str) -> Any:
    # The live check's types load on first use: `import weightcheck` stays as light as config-only lint needs.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
