"""Pattern expressions (`num_hidden_layers`, `layer >= first_k_dense_replace and layer % step == 0`,
`layer_types[layer] == "full_attention"`): parsed into small tuples, their names listed, evaluated on a config.

Allowed: constants (int, str, True/False/None), names, `+ - * // %`, `and`/`or`/`not`, unary `-`, comparisons
(`== != < <= > >= in`, `not in`, chained), lists, tuples and `name[index]`: Python's syntax and precedence.

How it parses: a small recursive-descent parser reads that subset in the common spelling (ASCII names, decimal
integers, quoted strings without escapes). Anything else it leaves to Python's own parser (`compile` with
`PyCF_ONLY_AST`), which also words every error, so both ways accept and reject the same texts with the same
messages (tests/test_patternexpr.py compares them on every shipped expression and on generated ones). Why two:
`import _ast` costs ~2 ms of config-only lint's ~100 (issue #20), and lint's own patterns use only that subset.

The tuples: ("const", value), ("name", id), ("bin", op, left, right), ("and" | "or", operands),
("not" | "neg", operand), ("cmp", left, ((op, right), ...)), ("list" | "tuple", elements), ("sub", value, index).
"""

from __future__ import annotations

import operator
from functools import cache, lru_cache

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

Node = tuple  # the tuples above


class PatternError(ValueError):
    """A pattern file that does not follow the schema (reported with file and key)."""


_BINOPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}
_CMPOPS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}
_CONSTANTS = {"True": True, "False": False, "None": None}
# Python keywords that are not operators of the subset: a text using one goes to Python's parser.
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "for", "lambda", "await", "yield", "async",
                       "assert", "break", "class", "continue", "def", "del", "elif", "except", "finally", "from",
                       "global", "import", "nonlocal", "pass", "raise", "return", "try", "while", "with",
                       "True", "False", "None"})  # fmt: skip
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_PUNCT = ("//", "==", "!=", "<=", ">=", "+", "-", "*", "%", "<", ">", "(", ")", "[", "]", ",")
# Deeper nesting goes to Python's parser, which has its own limit and error.
_MAX_DEPTH = 50


class _NotSubset(Exception):
    """The text is outside what the small parser reads: Python's parser decides."""


def _tokens(text: str) -> list[tuple[str, Any]]:
    """("name", id), ("int", value), ("str", value) or ("op", symbol) for each token; _NotSubset otherwise."""
    out: list[tuple[str, Any]] = []
    i, n = 0, len(text)
    if text[:1] in (" ", "\t"):
        raise _NotSubset  # Python: "unexpected indent"
    while i < n:
        ch = text[i]
        if ch == " " or ch == "\t":
            i += 1
        elif ch in _NAME_START:
            j = i + 1
            while j < n and text[j] in _NAME_CHARS:
                j += 1
            out.append(("name", text[i:j]))
            i = j
        elif ch in _DIGITS:
            j = i + 1
            while j < n and text[j] in _DIGITS:
                j += 1
            digits = text[i:j]
            if (j < n and (text[j] in _NAME_CHARS or text[j] == ".")) or (digits[0] == "0" and digits != "0"):
                raise _NotSubset  # 0x10, 1e3, 1.5, 1_000, 012: Python's parser
            if len(digits) > 100:
                raise _NotSubset
            out.append(("int", int(digits)))
            i = j
        elif ch == "'" or ch == '"':
            j = text.find(ch, i + 1)
            if j < 0 or not all(" " <= c != "\\" and c != "\x7f" for c in text[i + 1 : j]):
                raise _NotSubset  # escapes and control characters: Python's parser
            out.append(("str", text[i + 1 : j]))
            i = j + 1
        else:
            for symbol in _PUNCT:
                if text.startswith(symbol, i):
                    out.append(("op", symbol))
                    i += len(symbol)
                    break
            else:
                raise _NotSubset  # `/`, `**`, `.`, `:`, `#`, a newline, a non-ASCII character, ...
    return out


class _Parser:
    """Recursive descent over the tokens, one method per Python grammar level of the subset."""

    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens, self.at, self.depth = tokens, 0, 0

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, symbol: str) -> bool:
        token = self.peek()
        if token is not None and token[0] in ("op", "name") and token[1] == symbol:
            self.at += 1
            return True
        return False

    def expect(self, symbol: str) -> None:
        if not self.take(symbol):
            raise _NotSubset

    def nested(self, parse: Callable[[], Node]) -> Node:
        """`parse()` one level deeper (a parenthesis, a bracket, a unary operator): past _MAX_DEPTH, Python's
        parser decides."""
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _NotSubset
        node = parse()
        self.depth -= 1
        return node

    def chain(self, length: int) -> None:
        """A chain of binary operators nests one level per operator (left to right): as deep as parentheses."""
        if self.depth + length > _MAX_DEPTH:
            raise _NotSubset

    def expression(self) -> Node:
        return self.nested(self.or_test)

    def or_test(self) -> Node:
        return self.boolean(self.and_test, "or")

    def and_test(self) -> Node:
        return self.boolean(self.not_test, "and")

    def boolean(self, operand: Callable[[], Node], word: str) -> Node:
        """`a or b or c` (one node with every operand, as Python's BoolOp)."""
        operands = [operand()]
        while self.take(word):
            operands.append(operand())
        return operands[0] if len(operands) == 1 else (word, tuple(operands))

    def not_test(self) -> Node:
        return ("not", self.nested(self.not_test)) if self.take("not") else self.comparison()

    def comparison(self) -> Node:
        left = self.arith()
        pairs = []
        while True:
            token = self.peek()
            if token is None:
                break
            if token[0] == "op" and token[1] in ("==", "!=", "<", "<=", ">", ">="):
                op = token[1]
                self.at += 1
            elif token == ("name", "in"):
                op = "in"
                self.at += 1
            elif token == ("name", "not"):  # `not in` (a `not` here is nothing else)
                self.at += 1
                self.expect("in")
                op = "not in"
            else:
                break
            pairs.append((op, self.arith()))
            self.chain(len(pairs))
        return ("cmp", left, tuple(pairs)) if pairs else left

    def arith(self) -> Node:
        return self.binary(self.term, ("+", "-"))

    def term(self) -> Node:
        return self.binary(self.factor, ("*", "//", "%"))

    def binary(self, operand: Callable[[], Node], symbols: tuple[str, ...]) -> Node:
        """A left-associative chain of the binary operators `symbols` over `operand`s."""
        node, length = operand(), 0
        while (token := self.peek()) is not None and token[0] == "op" and token[1] in symbols:
            self.at += 1
            node, length = ("bin", token[1], node, operand()), length + 1
            self.chain(length)
        return node

    def factor(self) -> Node:
        if self.take("-"):
            return ("neg", self.nested(self.factor))
        node, length = self.atom(), 0
        while self.take("["):
            index = self.expression()
            self.expect("]")
            node, length = ("sub", node, index), length + 1
            self.chain(length)
        return node

    def atom(self) -> Node:
        token = self.peek()
        if token is None:
            raise _NotSubset
        kind, value = token
        self.at += 1
        if kind in ("int", "str"):
            if self.peek() is not None and self.peek()[0] == "str":  # type: ignore[index]
                raise _NotSubset  # 'a' 'b': Python joins adjacent strings
            return ("const", value)
        if kind == "name":
            if value in _CONSTANTS:
                return ("const", _CONSTANTS[value])
            if value in _KEYWORDS:
                raise _NotSubset
            return ("name", value)
        if value == "(":
            if self.take(")"):
                return ("tuple", ())
            first = self.expression()
            if self.take(")"):
                return first
            elements = [first]
            while self.take(","):
                if self.take(")"):
                    return ("tuple", tuple(elements))
                elements.append(self.expression())
            self.expect(")")
            return ("tuple", tuple(elements))
        if value == "[":
            elements = []
            while not self.take("]"):
                elements.append(self.expression())
                if not self.take(","):
                    self.expect("]")
                    break
            return ("list", tuple(elements))
        raise _NotSubset


@lru_cache(maxsize=1024)
def parse(text: str) -> Node:
    """The expression's tuple tree; PatternError if Python does not parse it or it uses anything else."""
    try:
        tokens = _tokens(text)
        parser = _Parser(tokens)
        node = parser.expression()
        if parser.at != len(tokens) or not tokens:
            raise _NotSubset
        return node
    except _NotSubset:
        pass
    try:
        return _from_ast(python_ast(text).body)
    except RecursionError:  # Python's parser, or the tree it made, deeper than the stack allows
        raise PatternError(f"expression {text[:80]!r}... is nested too deeply") from None


@lru_cache(maxsize=256)
def python_ast(text: str) -> Any:
    """Python's parse of the text (`ast.parse(text, mode="eval")`), checked against the allowed node types."""
    import _ast as ast  # the node classes without `ast.py`

    try:
        tree = compile(str(text), "<unknown>", "eval", ast.PyCF_ONLY_AST)
    except SyntaxError as exc:
        raise PatternError(f"expression {text!r} does not parse: {exc.msg}") from None
    except RecursionError:  # "maximum recursion depth exceeded during ast construction"
        raise PatternError(f"expression {text[:80]!r}... is nested too deeply") from None
    allowed = (
        ast.Expression, ast.BinOp, ast.BoolOp, ast.Compare, ast.UnaryOp, ast.Name, ast.Constant, ast.Load,
        ast.And, ast.Or, ast.Not, ast.USub, ast.List, ast.Tuple, ast.Subscript, *_ast_ops(),
    )  # fmt: skip
    for node in walk_ast(tree):
        if not isinstance(node, allowed):
            raise PatternError(f"expression {text!r} uses {type(node).__name__}, which patterns do not allow")
    return tree


@cache
def _ast_ops() -> dict[type, str]:
    """The operator classes of Python's AST, by their symbol in the tuple trees."""
    import _ast as ast

    return {
        ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
        ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
        ast.In: "in", ast.NotIn: "not in",
    }  # fmt: skip


def walk_ast(node: Any) -> Any:
    """`ast.walk`: the node and every node below it, breadth first, in `ast.walk`'s order."""
    import _ast as ast

    todo = [node]
    for node in todo:  # grows while it is read: breadth first
        yield node
        for name in node._fields:
            child = getattr(node, name, None)
            if isinstance(child, ast.AST):
                todo.append(child)
            elif isinstance(child, list):
                todo.extend(item for item in child if isinstance(item, ast.AST))


def _from_ast(node: Any) -> Node:
    """The tuple tree of an allowed Python AST (`python_ast`)."""
    import _ast as ast

    ops = _ast_ops()
    if isinstance(node, ast.Constant):
        return ("const", node.value)
    if isinstance(node, ast.Name):
        return ("name", node.id)
    if isinstance(node, ast.BinOp):
        return ("bin", ops[type(node.op)], _from_ast(node.left), _from_ast(node.right))
    if isinstance(node, ast.BoolOp):
        return ("or" if isinstance(node.op, ast.Or) else "and", tuple(_from_ast(v) for v in node.values))
    if isinstance(node, ast.UnaryOp):
        return ("not" if isinstance(node.op, ast.Not) else "neg", _from_ast(node.operand))
    if isinstance(node, ast.Compare):
        pairs = tuple((ops[type(op)], _from_ast(c)) for op, c in zip(node.ops, node.comparators, strict=True))
        return ("cmp", _from_ast(node.left), pairs)
    if isinstance(node, (ast.List, ast.Tuple)):
        return ("list" if isinstance(node, ast.List) else "tuple", tuple(_from_ast(e) for e in node.elts))
    if isinstance(node, ast.Subscript):
        return ("sub", _from_ast(node.value), _from_ast(node.slice))
    raise PatternError(f"unsupported expression node {type(node).__name__}")


def names(node: Node) -> frozenset[str]:
    """The names (config keys, `layer`) an expression's tree reads."""
    found: set[str] = set()
    todo = [node]
    while todo:
        item = todo.pop()
        kind = item[0]
        if kind == "name":
            found.add(item[1])
        elif kind == "bin":
            todo += item[2:]
        elif kind in ("and", "or", "list", "tuple"):
            todo += item[1]
        elif kind in ("not", "neg"):
            todo.append(item[1])
        elif kind == "cmp":
            todo.append(item[1])
            todo += [right for _op, right in item[2]]
        elif kind == "sub":
            todo += item[1:]
    return frozenset(found)


def evaluate_node(node: Node, env: dict[str, Any]) -> Any:
    """Evaluate a tree; unknown names raise KeyError (the caller decides what that means)."""
    kind = node[0]
    if kind == "const":
        return node[1]
    if kind == "name":
        name = node[1]
        if name in ("true", "True"):
            return True
        if name in ("false", "False"):
            return False
        if name not in env:
            raise KeyError(name)
        return env[name]
    if kind in ("list", "tuple"):
        return [evaluate_node(e, env) for e in node[1]]
    if kind == "sub":  # `layer_types[layer]`: an int index into a config list
        seq, index = evaluate_node(node[1], env), evaluate_node(node[2], env)
        if not isinstance(seq, (list, str)) or not isinstance(index, int) or isinstance(index, bool):
            raise TypeError("subscript needs a list and an integer")
        return seq[index]
    if kind == "bin":
        left, right = evaluate_node(node[2], env), evaluate_node(node[3], env)
        # Arithmetic on numbers only: a config string times a huge number would be string repetition
        # (`"aaaa" * 10**12`), a blow-up rather than a shape. TypeError is "not computable" to callers.
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            raise TypeError(f"arithmetic on non-numbers ({type(left).__name__}, {type(right).__name__})")
        return _BINOPS[node[1]](left, right)
    if kind == "not":
        return not evaluate_node(node[1], env)
    if kind == "neg":
        return -evaluate_node(node[1], env)
    if kind in ("and", "or"):
        # Decided by any operand that decides it, whatever the order: a generated condition lists its parts
        # in its own order, not the model code's, and `((layer + 1) % decoder_sparse_step == 0) and (layer not
        # in mlp_only_layers)` is False on a layer in mlp_only_layers even when the step is 0 (the modeling
        # code tests the list first). An operand that cannot be evaluated counts only if nothing decides.
        decides = kind == "or"
        failed: Exception | None = None
        for operand in node[1]:
            try:
                if bool(evaluate_node(operand, env)) == decides:
                    return decides
            except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, IndexError) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return not decides
    if kind == "cmp":
        left = evaluate_node(node[1], env)
        for op, comparand in node[2]:
            right = evaluate_node(comparand, env)
            if not _CMPOPS[op](left, right):
                return False
            left = right
        return True
    raise PatternError(f"unsupported expression node {kind}")
