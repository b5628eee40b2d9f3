"""What lint's start-up avoids (issue #20: config-only lint is mostly start-up), and the stand-ins it uses:
`weightcheck.lightclass.dataclass` behaves as `dataclasses.dataclass` on the same class bodies, and
`rules.cleandoc` as `inspect.cleandoc` on every rule's text.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from weightcheck import lightclass, rules

ROOT = Path(__file__).resolve().parents[1]


def _bodies() -> dict[str, tuple[dict[str, Any], Any]]:
    """Fresh class bodies (a decorator changes its class): name -> (options, class)."""

    class Plain:
        """A mutable record."""

        a: int
        b: str = "x"
        c: list[int] = dataclasses.field(default_factory=list)

    class Frozen:
        a: int
        b: tuple[int, ...] = ()
        hidden: dict[str, int] = dataclasses.field(default_factory=dict, hash=False, compare=False, repr=False)

    class Slotted:
        name: str
        ids: tuple[str, ...] = ()

    class Derived:
        a: int
        twice: int = dataclasses.field(default=0, init=False, repr=False, compare=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "twice", 2 * self.a)

    class MutableSlots:
        a: int
        b: int | None = None

    return {
        "plain": ({}, Plain),
        "frozen": ({"frozen": True}, Frozen),
        "frozen slots": ({"frozen": True, "slots": True}, Slotted),
        "post_init": ({"frozen": True}, Derived),
        "slots": ({"slots": True}, MutableSlots),
    }


def _light(cls: Any, options: dict[str, Any]) -> Any:
    """The same body under lightclass: its `dataclasses.field(...)` markers rewritten as lightclass fields."""
    namespace = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    for key, value in list(namespace.items()):
        if isinstance(value, dataclasses.Field):
            namespace[key] = lightclass.field(
                default=lightclass.MISSING if value.default is dataclasses.MISSING else value.default,
                default_factory=(
                    lightclass.MISSING if value.default_factory is dataclasses.MISSING else value.default_factory
                ),
                init=value.init, repr=value.repr, compare=value.compare, hash=value.hash,
            )  # fmt: skip
    return lightclass.dataclass(**options)(type(cls.__name__, cls.__bases__, namespace))


SAMPLES: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "plain": [((1,), {}), ((1, "y", [2]), {}), ((), {"a": 3, "c": [1]})],
    "frozen": [((1,), {}), ((1, (2, 3)), {"hidden": {"k": 1}})],
    "frozen slots": [(("n",), {}), (("n", ("1", "2")), {})],
    "post_init": [((4,), {})],
    "slots": [((1,), {}), ((1, 2), {})],
}


@pytest.mark.parametrize("label", list(_bodies()))
def test_lightclass_behaves_as_dataclasses(label: str) -> None:
    options, _ = _bodies()[label]
    std = dataclasses.dataclass(**options)(_bodies()[label][1])
    light = _light(_bodies()[label][1], options)
    std_sig, light_sig = inspect.signature(std), inspect.signature(light)
    assert list(std_sig.parameters) == list(light_sig.parameters)
    for name, param in std_sig.parameters.items():
        other = light_sig.parameters[name]
        assert param.kind == other.kind
        if param.default is not inspect.Parameter.empty and repr(param.default) != "<factory>":
            assert param.default == other.default
    assert ("__slots__" in std.__dict__) == ("__slots__" in light.__dict__)
    assert (std.__hash__ is None) == (light.__hash__ is None)
    made = []
    for args, kwargs in SAMPLES[label]:
        s, li = std(*args, **kwargs), light(*args, **kwargs)
        assert repr(s).replace(std.__qualname__, "X") == repr(li).replace(light.__qualname__, "X")
        assert dataclasses.astuple(s) == tuple(getattr(li, f.name) for f in lightclass.fields(light))
        assert li == light(*args, **kwargs) and li != s and (li == object()) is False
        if std.__hash__ is not None:
            assert hash(li) == hash(light(*args, **kwargs))
        if options.get("frozen"):
            first = lightclass.fields(light)[0].name
            with pytest.raises(AttributeError) as raised:
                setattr(li, first, 0)
            assert type(raised.value).__name__ == "FrozenInstanceError"
            with pytest.raises(AttributeError):
                delattr(li, first)
        else:
            first = lightclass.fields(light)[0].name
            setattr(li, first, 9)
            assert getattr(li, first) == 9
        made.append(li)
    if options.get("frozen") and options.get("slots"):  # pickling goes through __getstate__/__setstate__
        again = object.__new__(light)
        again.__setstate__(made[-1].__getstate__())
        assert again == made[-1]
    # replace: a copy with the changes, init=False fields made again (as dataclasses.replace)
    args, kwargs = SAMPLES[label][0]
    first = lightclass.fields(light)[0].name
    want = dataclasses.astuple(dataclasses.replace(std(*args, **kwargs), **{first: 7}))
    got = lightclass.replace(light(*args, **kwargs), **{first: 7})
    assert tuple(getattr(got, f.name) for f in lightclass.fields(light)) == want


def test_a_real_frozen_slotted_record_pickles() -> None:
    from weightcheck.names import parse

    name = parse("model.layers.3.mlp.experts.7.down_proj.weight")
    assert pickle.loads(pickle.dumps(name)) == name
    assert name.__slots__ and not hasattr(name, "__dict__")


def test_lightclass_refuses_what_it_does_not_support() -> None:
    class Base:
        a: int

    base = lightclass.dataclass(Base)

    class Child(base):  # type: ignore[misc, valid-type]
        b: int

    with pytest.raises(TypeError):
        lightclass.dataclass(Child)

    class Mutable:
        a: list[int] = []  # noqa: RUF012

    with pytest.raises(ValueError):
        lightclass.dataclass(Mutable)

    class Order:
        a: int = 0
        b: int

    with pytest.raises(TypeError):
        lightclass.dataclass(Order)


def test_rule_docs_are_cleaned_as_inspect_does() -> None:
    texts = [r.doc for r in rules.all_rules().values()]
    texts += [(fn.__doc__ or "") for fn in (rules.cleandoc, lightclass.replace, test_lightclass_behaves_as_dataclasses)]
    texts += ["", "\n\n", "  one\n\t  two\n   three\n\n", "first\n    a\n  b\n", "\tx\n\t\ty\n"]
    for text in texts:
        assert rules.cleandoc(text) == inspect.cleandoc(text), text


def test_rule_examples_are_dedented_as_textwrap_does() -> None:
    import textwrap

    texts = [text for r in rules.all_rules().values() for text in (r.bad, r.good)]
    texts += ["", "\n", "  a\n    b\n", "\ta\n\t\tb\n", "  a\n\tb\n", "    \n  a\n  \t\n   b",
              " \t a\n \t  b\n \t\n", "a\n  b", "  x\r\n  y\r\n", "   \n\n"]  # fmt: skip
    for text in texts:
        assert rules.dedent(text) == textwrap.dedent(text), repr(text)


def test_config_only_lint_starts_without_the_heavy_imports() -> None:
    """Plain config-only lint through the console entry imports none of ast, _ast, click, copy, dataclasses, heapq,
    inspect, orjson, struct, textwrap, tomllib, typing, importlib.resources, the Hub module and the other commands'
    rule modules (nor torch, transformers, compressed-tensors: tests/test_light_imports.py); a regression shows
    here first. (contextlib and importlib.util are kept off the path too, but an editable install's start-up
    hook imports both before weightcheck runs, so the probe cannot tell.)"""
    modules = ("ast", "_ast", "click", "copy", "dataclasses", "heapq", "inspect", "orjson", "struct", "textwrap",
               "tomllib", "typing", "importlib.resources", *_OTHER_COMMANDS)  # fmt: skip
    proc = _lint_probe(ROOT / "sample_configs" / "qwen3-30b-a3b-fp8-block", "json", modules)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loaded: \n" in proc.stderr, proc.stderr[-2000:]


_OTHER_COMMANDS = ("weightcheck.hub", "weightcheck.rules.diff", "weightcheck.rules.verify", "weightcheck.rules.rollout")


def _lint_probe(target: Path, fmt: str, modules: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`weightcheck lint TARGET --format FMT` through the console entry; its stderr ends with `loaded: ` and
    those of `modules` that the run imported."""
    probe = (
        "import atexit, sys; atexit.register(lambda: sys.stderr.write('loaded: ' + ','.join(sorted(m for m in "
        f"{modules!r} if m in sys.modules)) + '\\n')); "
        "sys.argv[0] = 'weightcheck'; "
        "from weightcheck.launch import main; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", probe, "lint", str(target), "--format", fmt],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_pattern_expressions_parse_and_walk_as_the_ast_module_does() -> None:
    """Python's parse of a pattern expression (`patternexpr.python_ast`, with `_ast`, not `ast.py`: what decides
    every text the small parser leaves to Python): on every expression of every shipped pattern, and on refused
    ones, the tree and the walk order are `ast.parse`'s and `ast.walk`'s."""
    import ast

    from test_patternexpr import shipped_expressions

    from weightcheck import patternexpr, patterns

    texts = {"f(x)", "x.y", "lambda: 1", "a if b else c", "-(layer + 1) % 2 == 0 or not x", "t[layer] in ['a', 'b']"}
    texts |= shipped_expressions()
    assert len(texts) > 60
    for text in sorted(texts):
        tree = ast.parse(text, mode="eval")
        assert [ast.dump(n) for n in patternexpr.walk_ast(tree)] == [ast.dump(n) for n in ast.walk(tree)]
        try:
            ours = patternexpr.python_ast(text)
        except patterns.PatternError:
            continue
        assert ast.dump(ours) == ast.dump(tree)


def _record_bodies(base: Any) -> dict[str, Any]:
    class Plain(base):
        """A record."""

        name: str
        size: int

    class Defaults(base):
        name: str
        shape: tuple[int, ...] = ()
        begin: int = 0

        @property
        def twice(self) -> int:
            return 2 * self.begin

        def label(self) -> str:
            return f"{self.name}:{self.begin}"

    return {"plain": Plain, "defaults": Defaults}


@pytest.mark.parametrize("label", ["plain", "defaults"])
def test_lightclass_namedtuple_behaves_as_typing_namedtuple(label: str) -> None:
    """Modules on lint's path take `NamedTuple` from lightclass (typing is not imported at start-up): the same
    class body gives the same fields, defaults, annotations, docstring, methods and tuple behaviour."""
    import typing

    std, light = _record_bodies(typing.NamedTuple)[label], _record_bodies(lightclass.NamedTuple)[label]
    assert issubclass(light, tuple) and light.__mro__[1:] == std.__mro__[1:]
    assert light._fields == std._fields and light._field_defaults == std._field_defaults
    # typing wraps string annotations in ForwardRef; the names and their order are what matters here
    assert list(light.__annotations__) == list(std.__annotations__) and light.__doc__ == std.__doc__
    assert light.__module__ == std.__module__ and light.__qualname__ == std.__qualname__
    args = ("w", 3) if label == "plain" else ("w",)
    a, b = std(*args), light(*args)
    assert tuple(a) == tuple(b) and repr(a) == repr(b) and a._asdict() == b._asdict()
    assert b._replace(name="v") == light("v", *args[1:]) and light._make(tuple(a)) == b
    if label == "defaults":
        assert b.twice == a.twice and b.label() == a.label()
        assert tuple.__new__(light, ("x", (1,), 4)).begin == 4  # how safetensors_header builds TensorInfo


def test_lightclass_namedtuple_refuses_as_typing_does() -> None:
    import typing

    for base in (typing.NamedTuple, lightclass.NamedTuple):
        with pytest.raises(TypeError, match="Non-default namedtuple field b cannot follow default field"):

            class Bad(base):  # type: ignore[misc]
                a: int = 0
                b: int

        with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):

            class Worse(base):  # type: ignore[misc]
                a: int

                def _replace(self) -> None: ...


def test_header_only_lint_with_the_text_report_starts_without_typing() -> None:
    """Header-only lint of a shipped checkpoint, text report (what a terminal shows): no typing, click,
    textwrap, tomllib, importlib.resources, the Hub module or the other commands' rule modules. orjson is
    imported here (it parses the headers) and brings dataclasses, inspect and ast with it, so those are not
    asked about."""
    modules = ("click", "textwrap", "tomllib", "typing", "importlib.resources", *_OTHER_COMMANDS)
    proc = _lint_probe(ROOT / "sample_configs" / "tiny-glm4-moe-w4a16-router-packed", "text", modules)
    assert proc.returncode == 1, proc.stderr[-2000:]  # the sample's findings
    assert "WC3" in proc.stdout
    assert "loaded: \n" in proc.stderr, proc.stderr[-2000:]
