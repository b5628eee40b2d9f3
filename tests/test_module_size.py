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


def test_the_stated_size_is_the_module_size() -> None:
    """A 'Why one ~N-line module' paragraph states its module's size within a fifth: a reader weighing the reason
    weighs it against the module as it is, not as it was when the paragraph was written."""
    import re

    stale = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        match = re.search(r"Why one ~([\d,]+)-line module", text)
        if match is None:
            continue
        stated, actual = int(match.group(1).replace(",", "")), len(text.splitlines())
        if not 0.8 * actual <= stated <= 1.2 * actual:
            stale.append(f"{path.relative_to(PACKAGE).as_posix()}: says ~{stated}, has {actual}")
    assert not stale, f"stale module sizes: {stale}"
