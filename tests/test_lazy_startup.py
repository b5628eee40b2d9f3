"""What config-only lint's start-up defers until first use (issue #20): module-level regexes
(`weightcheck.lazyregex`) and the generated `__init__` of lightclass classes. Deferred, never different."""

from __future__ import annotations

import inspect
import pickle
import re

import pytest

from weightcheck import lightclass
from weightcheck.lazyregex import LazyRegex


def test_lazy_regex_compiles_at_first_use_and_answers_as_the_compiled_pattern() -> None:
    source = r"^(?P<prefix>(?:[^.]+\.)*?(?:layers|h))\.(?P<idx>\d+)\.(?P<rest>.+)$"
    lazy, compiled = LazyRegex(source), re.compile(source)
    assert "match" not in vars(lazy)  # nothing compiled at import
    names = ["model.layers.3.mlp.gate.weight", "transformer.h.11.attn.c_attn.weight", "lm_head.weight", ""]
    for name in names:
        got, want = lazy.match(name), compiled.match(name)
        assert (got and got.groupdict()) == (want and want.groupdict())
        assert bool(lazy.search(name)) == bool(compiled.search(name))
    assert "match" in vars(lazy) and lazy.groupindex == compiled.groupindex
    digits = LazyRegex(r"(?<=\.)\d+(?=\.)")
    assert digits.sub("*", "a.1.b.22.c") == "a.*.b.*.c"
    assert [m.group() for m in LazyRegex(r"\d+").finditer("x1y22")] == ["1", "22"]
    with pytest.raises(AttributeError):
        lazy.no_such_method  # noqa: B018
    with pytest.raises(re.error):  # a bad pattern fails at first use, as re.compile would at import
        LazyRegex("(").match("x")


@lightclass.dataclass(frozen=True, slots=True)
class _Frozen:
    name: str
    size: int = 0
    parts: tuple[str, ...] = lightclass.field(default_factory=tuple)


@lightclass.dataclass
class _Plain:
    name: str
    seen: list[str] = lightclass.field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen.append(self.name)


class _Sub(_Plain):  # no fields of its own: inherits the generated __init__
    pass


def test_lightclass_init_is_compiled_at_first_instantiation_and_then_called_directly() -> None:
    @lightclass.dataclass
    class Fresh:
        a: int
        b: str = "x"

    assert type(Fresh.__dict__["__init__"]).__name__ == "_DeferredMethod"
    first = Fresh(1)
    assert (first.a, first.b) == (1, "x")
    assert inspect.isfunction(Fresh.__dict__["__init__"])  # replaced itself
    assert Fresh(2, b="y").b == "y"
    with pytest.raises(TypeError):
        Fresh()  # type: ignore[call-arg]


def test_lightclass_lazy_init_through_signature_slots_subclass_and_pickle() -> None:
    @lightclass.dataclass
    class Looked:
        a: int
        b: int = 2

    assert str(inspect.signature(Looked)) == "(a, b=2)"
    assert inspect.isfunction(Looked.__dict__["__init__"])
    frozen = _Frozen("w", 3)
    assert frozen == _Frozen("w", 3, ()) and hash(frozen) == hash(_Frozen("w", 3))
    assert pickle.loads(pickle.dumps(frozen)) == frozen
    with pytest.raises(lightclass.FrozenInstanceError):
        frozen.size = 4  # type: ignore[misc]
    assert _Sub("s").seen == ["s"] and _Plain("p").seen == ["p"]
