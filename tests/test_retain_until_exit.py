"""The console entry ends with os._exit, so it asks lint to keep its working data instead of freeing it on
return (`linting.retain_until_exit`): only the last lint's, and library callers (the default) keep nothing."""

from __future__ import annotations

import gc

from weightcheck import linting


def test_library_lint_retains_nothing(make_ckpt) -> None:
    assert linting._retained is None
    linting.lint(make_ckpt("llama"))
    assert linting._retained is None


def test_console_retention_keeps_only_the_last_lint(make_ckpt) -> None:
    first, second = make_ckpt("llama"), make_ckpt("qwen3_moe")
    try:
        linting.retain_until_exit()
        plain = linting.lint(first)
        assert [ctx.ckpt.root for ctx in linting._retained] == [first]  # type: ignore[union-attr]
        again = linting.lint(second)
        assert [ctx.ckpt.root for ctx in linting._retained] == [second]  # type: ignore[union-attr]
        assert plain.findings == linting.lint(first).findings  # the same result either way
        assert again.exit_code() == linting.lint(second).exit_code()
    finally:
        linting._retained = None
        gc.unfreeze()
