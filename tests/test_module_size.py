"""Issue #20: no module over ~600 lines without a reason written at its top."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "weightcheck"
LIMIT = 600


def test_long_modules_say_why_at_the_top() -> None:
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) <= LIMIT:
            continue
        docstring = text.split('"""', 2)[1] if text.startswith('"""') else ""
        if "Why one " not in docstring:
            unexplained.append(path.relative_to(PACKAGE).as_posix())
    assert not unexplained, f"over {LIMIT} lines with no 'Why one ...' paragraph in the docstring: {unexplained}"
