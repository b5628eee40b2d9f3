"""The character-comparing path of safe_regex (module names used as regexes, as transformers reads
`modules_to_not_convert`) must answer exactly as Python `re` does, for `match` and `fullmatch`."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from weightcheck.quant import safe_regex

# Pieces of a module-name pattern: name characters, the `.` wildcard, the escaped dot.
PIECES = st.sampled_from(["a", "b", "0", "1", "_", ".", "\\."])
TEXT = st.text(alphabet="ab01_.\nX", max_size=12)


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=8).map("".join), TEXT)
def test_dotted_literal_answers_as_re(pattern: str, text: str) -> None:
    compiled = safe_regex.compile_regex(pattern)
    assert compiled is not None and type(compiled).__name__ == "_DottedLiteral"
    assert compiled.match(text) is (re.match(pattern, text) is not None)
    assert compiled.fullmatch(text) is (re.fullmatch(pattern, text) is not None)


def test_other_shapes_still_compile_as_regexes() -> None:
    for pattern in ("model.layers.*", "a|b", "[ab]", "a\\d", "(a)"):
        compiled = safe_regex.compile_regex(pattern)
        assert compiled is not None and type(compiled).__name__ == "SafeRegex", pattern
    assert safe_regex.match("model\\.layers\\.0", "model.layers.0.mlp") is True
    assert safe_regex.match("model\\.layers\\.0", "modelXlayers.0.mlp") is False
    assert safe_regex.match("model.layers.0", "modelXlayers.0.mlp") is True  # `.` is a wildcard, as in re
