"""Pattern expressions (weightcheck.patternexpr): the small parser against Python's own, text for text.

Every text the small parser accepts must give the tree Python's parser gives (converted the same way), and every
text it leaves must go to Python's parser, so that both accept and refuse the same texts with the same words:
checked on every expression of every shipped pattern, on tricky spellings, and on generated expressions."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import tomllib

from weightcheck import patternexpr
from weightcheck.patternexpr import PatternError

ROOT = Path(__file__).resolve().parents[1]


def _python_tree(text: str) -> Any:
    return patternexpr._from_ast(patternexpr.python_ast(text).body)


def _small_tree(text: str) -> Any:
    """The small parser alone: None where it leaves the text to Python's parser."""
    try:
        tokens = patternexpr._tokens(text)
        parser = patternexpr._Parser(tokens)
        node = parser.expression()
        if parser.at != len(tokens) or not tokens:
            return None
        return node
    except patternexpr._NotSubset:
        return None


def _agree(text: str) -> Any:
    """Both ways give the same tree, or the same PatternError; returns the small parser's tree (or None)."""
    small = _small_tree(text)
    try:
        python = _python_tree(text)
    except PatternError as exc:
        assert small is None, f"{text!r}: the small parser accepted what Python refuses ({exc})"
        with pytest.raises(PatternError) as caught:
            patternexpr.parse.__wrapped__(text)
        assert str(caught.value) == str(exc)
        return None
    if small is not None:
        assert small == python, text
    assert patternexpr.parse.__wrapped__(text) == python, text
    return small


def shipped_expressions() -> set[str]:
    """Every expression of every shipped pattern (generated JSON and hand-written TOML)."""
    texts: set[str] = set()

    def collect(value: Any, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                collect(v, k)
        elif isinstance(value, list):
            for v in value:
                collect(v, key)
        elif isinstance(value, str) and key in ("when", "shape", "bias", "moe_layers", "experts", "num_layers",
                                                "mtp_layers"):  # fmt: skip
            texts.add(value)

    for path in sorted((ROOT / "patterns" / "generated").rglob("*.json")):
        collect(json.loads(path.read_text()))
    for path in sorted((ROOT / "patterns").glob("*.toml")):
        collect(tomllib.loads(path.read_text()))
    return texts


def test_every_shipped_expression_is_read_by_the_small_parser_as_python_reads_it() -> None:
    texts = shipped_expressions()
    assert len(texts) > 60
    left_to_python = [text for text in sorted(texts) if _agree(text) is None]
    # Config-only lint must not need Python's parser (that is the point: no `_ast` on its path).
    assert left_to_python == [], left_to_python


TRICKY = [
    # accepted by both
    "a", "  a", "a ", "\ta\t", "0", "123", "-1", "- -a", "not not a", "a - -b", "a * -b", "-a[0]", "(a)[0]",
    "[1, 2][i]", "a[b][c]", "a[b[c]]", "(a)", "((a))", "()", "(a,)", "(a, b)", "(a, b,)", "[]", "[a]", "[a,]",
    "[a, [b, c]]", "a < b < c", "a == b != c", "a in b", "a not in b", "not a in b", "not a == b",
    "a or b or c", "a and b or c and d", "(a or b) or c", "a or (b or c)", "a and not b", "x % 2 == 0",
    "a // b * c % d", "a + b * c - d", "(a + b) * c", "'x'", '"y"', "t[layer] == 'full_attention'",
    "layer_types[layer] in ['a', 'b']", "True", "False", "None", "true", "abc_1", "_x", "a==b", "a<=b>=c",
    "'it''s'", "\"it's\"", "'é'", "'a' + b", "a*b//c", "a - 1 - 2",
    # left to Python's parser: accepted there, or refused with Python's words
    "", " ", "a b", "1 2", "a +", "(a", "a)", "[a", "a]", "a[", "a[]", "a[1:2]", "a[1, 2]", "a, b", "a.b",
    "f(x)", "a / b", "a ** b", "+a", "~a", "a is b", "a is not b", "a if b else c", "lambda: 1", "a <> b",
    "not", "a not b", "a == not b", "a and", "or a", "012", "00", "0x10", "1e3", "1.5", "1_000", "1if a else 2",
    "'a' 'b'", "'a\\nb'", "'unterminated", "b'x'", "f'x'", "r'x'", "u'x'", "a\n", "a\nb", "(a\n+ b)", "a # c",
    "é", "a\\\n+b", "\x00", "'\x00'", "'\r'", "[x for x in y]", "{1: 2}", "{1}", "a := 1", "*a", "a[b:]",
    "await a", "yield", "import", "class", "1 if", "not in a", "in", "a in", "a not in", "a <", "< a",
    "-" * 60 + "a", "(" * 60 + "a" + ")" * 60, "not " * 60 + "a", "[" * 60 + "]" * 60, "1" * 150,
]  # fmt: skip


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_spellings_agree_with_python(text: str) -> None:
    _agree(text)


def test_the_small_parser_reads_the_common_forms_itself() -> None:
    for text in ("a", "-1", "a < b < c", "t[layer] == 'x'", "(a, b)", "[]", "a not in b", "not a or b and c"):
        assert _small_tree(text) is not None, text
    for text in ("a.b", "1.5", "a / b", "a, b", "'a\\n'", "é", "(" * 60 + "a" + ")" * 60):
        assert _small_tree(text) is None, text


def _generated(rng: random.Random, depth: int) -> str:
    """A random expression of the subset, with random spacing and parentheses."""
    space = rng.choice(["", " ", "  ", "\t"])
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(["a", "layer", "n_1", "_x", "0", "7", "16", "'s'", '"t"', "True", "None", "true"])
    kind = rng.randrange(9)
    a, b = _generated(rng, depth - 1), _generated(rng, depth - 1)
    if kind == 0:
        return f"{a}{space}{rng.choice(['+', '-', '*', '//', '%'])}{space}{b}"
    if kind == 1:
        return f"{a} {rng.choice(['and', 'or'])} {b}"
    if kind == 2:
        return f"not {a}"
    if kind == 3:
        return f"-{space}{a}"
    if kind == 4:
        ops = ["==", "!=", "<", "<=", ">", ">=", " in ", " not in "]
        return f"{a}{space}{rng.choice(ops)}{space}{b}{space}{rng.choice(ops)}{space}{_generated(rng, 0)}"
    if kind == 5:
        return f"({space}{a}{space})"
    if kind == 6:
        return f"[{a},{space}{b}{rng.choice(['', ','])}]"
    if kind == 7:
        return f"({a},{space}{b})"
    return f"{rng.choice(['t', 'layer_types', '(t)'])}[{a}]"


def test_generated_expressions_agree_with_python() -> None:
    rng = random.Random(20261126)
    read_by_small = 0
    for _ in range(3000):
        text = _generated(rng, rng.randrange(1, 5))
        if _agree(text) is not None:
            read_by_small += 1
    assert read_by_small > 2500  # the generator stays inside the subset: most texts never reach Python's parser


def test_evaluation_and_names_on_the_tuple_trees() -> None:
    env = {"layer": 3, "first_k_dense_replace": 1, "step": 2, "t": ["full", "sliding"], "only": [3]}
    tree = patternexpr.parse("layer >= first_k_dense_replace and (layer + 1) % step == 0 and layer not in only")
    assert patternexpr.evaluate_node(tree, env) is False
    assert patternexpr.names(tree) == {"layer", "first_k_dense_replace", "step", "only"}
    assert patternexpr.evaluate_node(patternexpr.parse("t[layer % 2] == 'sliding'"), env) is True
    assert patternexpr.evaluate_node(patternexpr.parse("-layer * 2 // 4"), env) == (-3 * 2) // 4
    with pytest.raises(KeyError):
        patternexpr.evaluate_node(patternexpr.parse("missing + 1"), env)
    with pytest.raises(TypeError):  # arithmetic on a string: never a repetition blow-up
        patternexpr.evaluate_node(patternexpr.parse("'aaaa' * 1000000000000"), env)
    # A deciding operand wins whatever the order; one that cannot be computed counts only if nothing decides.
    assert patternexpr.evaluate_node(patternexpr.parse("missing == 1 or layer == 3"), env) is True
    with pytest.raises(KeyError):
        patternexpr.evaluate_node(patternexpr.parse("missing == 1 or layer == 4"), env)


@pytest.mark.parametrize(
    "text",
    ["a+" * 5000 + "a", "-" * 5000 + "a", "not " * 3000 + "a", "(" * 3000 + "a" + ")" * 3000, "a" + "[0]" * 5000],
    ids=["sum chain", "unary chain", "not chain", "parentheses", "subscript chain"],
)
def test_an_expression_nested_past_the_stack_is_a_pattern_error_never_a_recursion_error(text: str) -> None:
    """A hostile pattern file: Python's own parser raised RecursionError here ("internal error", exit 2)."""
    with pytest.raises(PatternError, match=r"nested too deeply|does not parse|too many nested"):
        patternexpr.parse.__wrapped__(text)


def test_long_flat_expressions_still_parse() -> None:
    assert patternexpr.parse.__wrapped__("a < " * 3000 + "a")[0] == "cmp"
    assert len(patternexpr.parse.__wrapped__("a and " * 3000 + "a")[1]) == 3001
    assert len(patternexpr.parse.__wrapped__("layer in [" + ", ".join(map(str, range(5000))) + "]")[2][0][1][1]) == 5000
    chain = patternexpr.parse.__wrapped__("a + " * 300 + "a")  # Python's parser: as deep as it was
    assert patternexpr.evaluate_node(chain, {"a": 1}) == 301
