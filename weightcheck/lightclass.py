"""`dataclass` and `field` for the classes on lint's start-up path: the standard library's behaviour for the
options this package uses, each class built with one compile instead of one per method.

Why: on Python 3.11, `dataclasses.dataclass` compiles every generated method separately (five or six for a
frozen class: ~1 ms per class), and `import dataclasses` imports `inspect` (with ast, dis and tokenize). The
two-dozen classes config-only lint loads cost ~30 ms of a run whose json-parse floor is ~50 ms (issue #20).

What is supported (the rest raises TypeError rather than behaving differently): `init`, `repr`, `eq`,
`frozen` and `slots` class options; per field `default`, `default_factory`, `init`, `repr`, `compare` and
`hash`; `__post_init__`; string annotations (`from __future__ import annotations`), `ClassVar` ones skipped;
no base-class fields. The generated `__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__` and
`__delattr__` match the standard library's (tests/test_lightclass.py compares the two on the same class
bodies). `dataclasses.replace` and `fields` do not apply to these classes: use `replace` and `fields` here.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~7 ms of lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    _F = TypeVar("_F")
    _T = TypeVar("_T")
else:

    def dataclass_transform(**_: object) -> Callable[[_F], _F]:
        """Type checkers read the real one; at run time it only returns the decorator unchanged."""
        return lambda fn: fn


_NOT_IN_BODY = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                          "_make", "_replace", "_asdict", "_source"})  # fmt: skip
_NOT_COPIED = frozenset({"__module__", "__name__", "__annotations__"})


class _NamedTupleMeta(type):
    """`typing.NamedTuple`'s class-body form, for modules on lint's start-up path (which do not import
    typing): the annotated names are the fields, in order, their values the defaults, everything else in the
    body (methods, properties, the docstring) goes onto the `collections.namedtuple` class, as typing does."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Any:
        if "__annotations__" not in namespace and bases == ():
            return super().__new__(mcls, name, bases, namespace)  # the `NamedTuple` base itself
        annotations = dict(namespace.get("__annotations__", {}))
        defaults: list[str] = []
        for key in annotations:
            if key in namespace:
                defaults.append(key)
            elif defaults:
                raise TypeError(f"Non-default namedtuple field {key} cannot follow default field "
                                + ", ".join(defaults))  # fmt: skip
        made = namedtuple(name, list(annotations), defaults=[namespace[k] for k in defaults],
                          module=namespace["__module__"])  # fmt: skip
        made.__annotations__ = made.__new__.__annotations__ = annotations
        for key, value in namespace.items():
            if key in _NOT_IN_BODY:
                raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
            if key not in _NOT_COPIED and key not in annotations:
                setattr(made, key, value)
        return made


if not TYPE_CHECKING:
    NamedTuple = _NamedTupleMeta("NamedTuple", (), {"__module__": __name__})


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen instance (as `dataclasses.FrozenInstanceError`)."""


class Field:
    __slots__ = ("compare", "default", "default_factory", "hash", "init", "name", "repr")

    def __init__(
        self, default: Any, default_factory: Any, init: bool, repr: bool, compare: bool, hash: bool | None
    ) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.compare, self.hash = init, repr, compare, hash

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, default_factory={self.default_factory!r})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    init: bool = True,
    repr: bool = True,  # the standard library's keywords
    compare: bool = True,
    hash: bool | None = None,
) -> Any:
    return Field(default, default_factory, init, repr, compare, hash)


_FIELDS = "__lightclass_fields__"


@dataclass_transform(field_specifiers=(field,))
def dataclass(
    cls: type[_T] | None = None,
    /,
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    frozen: bool = False,
    slots: bool = False,
) -> Any:
    def wrap(klass: type[_T]) -> type[_T]:
        return _process(klass, init=init, repr_=repr, eq=eq, frozen=frozen, slots=slots)

    return wrap if cls is None else wrap(cls)


def _is_classvar(annotation: object) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return isinstance(text, str) and (text.startswith(("ClassVar", "typing.ClassVar")))


def _process(cls: type[_T], *, init: bool, repr_: bool, eq: bool, frozen: bool, slots: bool) -> type[_T]:
    for base in cls.__mro__[1:]:
        if hasattr(base, _FIELDS) or hasattr(base, "__dataclass_fields__"):
            raise TypeError(f"{cls.__name__}: lightclass does not support inheriting fields")
    namespace = cls.__dict__
    fields: list[Field] = []
    for name, annotation in namespace.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        value = namespace.get(name, MISSING)
        spec = value if isinstance(value, Field) else Field(value, MISSING, True, True, True, None)
        spec.name = name
        if isinstance(spec.default, list | dict | set):
            raise ValueError(f"mutable default {type(spec.default)} for field {name}: use default_factory")
        fields.append(spec)
    seen_default = False
    for f in fields:
        if not f.init:
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")

    # Fields with a plain default keep it as a class attribute (as dataclasses does); Field objects go.
    for f in fields:
        if isinstance(namespace.get(f.name), Field):
            if f.default is MISSING:
                delattr(cls, f.name)
            else:
                setattr(cls, f.name, f.default)

    env: dict[str, Any] = {"MISSING": MISSING, "FrozenInstanceError": FrozenInstanceError, "_object": object}
    lines: list[str] = []
    set_attr = "_object.__setattr__(self, {0!r}, {1})" if frozen else "self.{0} = {1}"
    if init:
        params, body = [], []
        for f in fields:
            if f.init:
                if f.default is not MISSING:
                    env[f"_dflt_{f.name}"] = f.default
                    params.append(f"{f.name}=_dflt_{f.name}")
                elif f.default_factory is not MISSING:
                    env[f"_fact_{f.name}"] = f.default_factory
                    params.append(f"{f.name}=MISSING")
                    body.append(f"  if {f.name} is MISSING: {f.name} = _fact_{f.name}()")
                else:
                    params.append(f.name)
                body.append("  " + set_attr.format(f.name, f.name))
            elif f.default_factory is not MISSING:
                env[f"_fact_{f.name}"] = f.default_factory
                body.append("  " + set_attr.format(f.name, f"_fact_{f.name}()"))
            elif f.default is not MISSING:
                env[f"_dflt_{f.name}"] = f.default
                body.append("  " + set_attr.format(f.name, f"_dflt_{f.name}"))
        if "__post_init__" in namespace:
            body.append("  self.__post_init__()")
        lines.append(f"def __init__(self, {', '.join(params)}):" if params else "def __init__(self):")
        lines += body or ["  pass"]
    # `__init__` is its own group: instantiating a class must not compile its `__repr__` or `__eq__`.
    groups = [_Deferred(cls, "\n".join(lines), env)] if lines else []
    lines = []
    if repr_ and "__repr__" not in namespace:
        parts = ", ".join(f"{f.name}={{self.{f.name}!r}}" for f in fields if f.repr)
        lines.append("def __repr__(self):")
        lines.append(f"  return f\"{{type(self).__qualname__}}({parts})\"")
    compared = [f.name for f in fields if f.compare]
    as_tuple = "(" + "".join(f"self.{n}," for n in compared) + ")"
    if eq and "__eq__" not in namespace:
        other = "(" + "".join(f"other.{n}," for n in compared) + ")"
        lines.append("def __eq__(self, other):")
        lines.append(f"  if other.__class__ is self.__class__: return {as_tuple} == {other}")
        lines.append("  return NotImplemented")
    hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
    if eq and frozen and "__hash__" not in namespace:
        lines.append("def __hash__(self):")
        lines.append("  return hash((" + "".join(f"self.{n}," for n in hashed) + "))")
    if frozen:
        names = tuple(f.name for f in fields)
        env["_cls"], env["_names"] = cls, names
        lines.append("def __setattr__(self, name, value):")
        lines.append("  if type(self) is _cls or name in _names:")
        lines.append("    raise FrozenInstanceError(f'cannot assign to field {name!r}')")
        lines.append("  super(_cls, self).__setattr__(name, value)")
        lines.append("def __delattr__(self, name):")
        lines.append("  if type(self) is _cls or name in _names:")
        lines.append("    raise FrozenInstanceError(f'cannot delete field {name!r}')")
        lines.append("  super(_cls, self).__delattr__(name)")
    if lines:
        groups.append(_Deferred(cls, "\n".join(lines), env))
    for group in groups:
        for name in group.names:
            setattr(cls, name, _DeferredMethod(group, name))
    if eq and not frozen and "__hash__" not in namespace:
        cls.__hash__ = None  # type: ignore[assignment,method-assign]  # mutable and compared: unhashable
    cls.__match_args__ = tuple(f.name for f in fields if f.init)  # type: ignore[attr-defined]
    setattr(cls, _FIELDS, tuple(fields))
    if slots:
        cls = _with_slots(cls, fields, frozen)
        if frozen:
            env["_cls"] = cls  # the methods' `type(self) is _cls` and `super(_cls, ...)` name the new class
        for group in groups:
            group.cls = cls
    return cls


class _Deferred:
    """Generated methods compiled together the first time any of them is looked up: most classes on lint's path
    are never compared, hashed or printed in a run, a third of them are never instantiated there, and compiling
    is most of what building a class costs (0.1-0.7 ms an `__init__`; issue #20). `_process` makes two groups:
    `__init__`, and the others (`__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`)."""

    __slots__ = ("cls", "env", "names", "source")

    def __init__(self, cls: type, source: str, env: dict[str, Any]) -> None:
        self.cls, self.source, self.env = cls, source, env
        self.names = [line[4 : line.index("(")] for line in source.splitlines() if line.startswith("def ")]

    def compile(self) -> type:
        cls = self.cls
        if self.source:  # two threads may both compile: the second puts the same methods again
            made: dict[str, Any] = {}
            exec(self.source, self.env, made)  # source generated by _process from field names only
            for name, fn in made.items():
                fn.__qualname__ = f"{cls.__qualname__}.{name}"
                setattr(cls, name, fn)
            self.source = ""
        return cls


class _DeferredMethod:
    """One name of a `_Deferred` group on the class until the group is compiled. Every way of reaching a method
    looks it up through this descriptor, which compiles the group (the real functions then replace every
    descriptor of the group on the class) and hands back the real one: an instance's call or a special method
    (`type.__call__` looks `__init__` up, `==` looks `__eq__` up), and a read from the class (`Cls.__init__`,
    `inspect.signature(Cls)`, which so sees the real signature)."""

    __slots__ = ("group", "name")

    def __init__(self, group: _Deferred, name: str) -> None:
        self.group, self.name = group, name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        function = vars(self.group.compile())[self.name]
        return function if instance is None else function.__get__(instance, owner)


def _with_slots(cls: type[_T], fields: list[Field], frozen: bool) -> type[_T]:
    namespace = dict(cls.__dict__)
    names = tuple(f.name for f in fields)
    for name in names:
        namespace.pop(name, None)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = names
    if frozen:
        namespace["__getstate__"] = lambda self: [getattr(self, n) for n in names]

        def __setstate__(self: Any, state: list[Any]) -> None:
            for name, value in zip(names, state, strict=True):
                object.__setattr__(self, name, value)

        namespace["__setstate__"] = __setstate__
    new = type(cls)(cls.__name__, cls.__bases__, namespace)
    new.__qualname__ = cls.__qualname__
    return new


def fields(obj: Any) -> tuple[Field, ...]:
    return tuple(getattr(obj, _FIELDS))


def replace(obj: _T, /, **changes: Any) -> _T:
    """A copy of `obj` with `changes` (as `dataclasses.replace`)."""
    for f in getattr(obj, _FIELDS):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with replace()")
            continue
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return type(obj)(**changes)
