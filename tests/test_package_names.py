"""`weightcheck.lint`, `diff`, `verify`, `rollout` and `doctor` are the API functions, whatever engine modules
were imported before (the engines live under other names: linting, diffing, checkup, rollouts)."""

from __future__ import annotations

import importlib
from pathlib import Path

API = ("lint", "diff", "verify", "rollout", "doctor")
ENGINES = ("weightcheck.linting", "weightcheck.diffing", "weightcheck.checkup", "weightcheck.rollouts",
           "weightcheck.rollouts.checks", "weightcheck.verifying")  # fmt: skip


def test_api_names_stay_functions_after_every_engine_is_imported() -> None:
    import weightcheck
    from weightcheck import api

    for module in ENGINES:
        importlib.import_module(module)
    for name in API:
        assert getattr(weightcheck, name) is getattr(api, name), name
        assert name in weightcheck.__all__


def test_engine_modules_do_not_take_the_api_names() -> None:
    """No engine module is named like an API function: the package holds no `lint.py` / `lint/` etc."""
    import weightcheck

    root = Path(weightcheck.__file__).parent
    for name in API:
        assert not (root / f"{name}.py").exists() and not (root / name).exists(), name


def test_live_check_types_are_exported_lazily() -> None:
    import weightcheck
    from weightcheck.verifying import TrainerLayout, WeightSyncError

    assert weightcheck.TrainerLayout is TrainerLayout and weightcheck.WeightSyncError is WeightSyncError
