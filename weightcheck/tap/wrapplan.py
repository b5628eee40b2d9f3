"""The recording loaders put back, and taken off, in bulk at a sync whose model did not change.

A sync wraps every parameter's loader at its first call and restores them when it closes
(`weightcheck.tap.coverage.ModelWrapping`). Done one parameter at a time that cost ~14 µs per parameter per
sync on CPU (the `named_parameters` walk, the checks, the attribute writes), more than everything else the tap
does per tensor. Syncs repeat on the same model, so after a full (slow) install the layout it saw is kept
here as flat lists, and the next sync checks the layout and the loaders against it and installs the same
wrappers, with every per-parameter step done by C-level `map`s over those lists:

- the module tree and the parameter set: the keys and object ids of every module's `_modules` and
  `_parameters` (a parameter created, replaced, renamed or moved, or a module added, changes them);
- each parameter's dtype and shape (recorded per sync; `param.data = ...` can change them in place);
- the loader attribute the wrapper replaces, as it was before wrapping (an engine that sets a new loader
  between syncs is wrapped afresh), and SGLang's `_skip_weight_check` flag.

Any difference, or anything the bulk path does not model (a loader found on the class, a parameter shared by
two names, a second model in one sync), falls back to the one-at-a-time install, which records exactly what
it did before this shortcut existed. Nothing here holds a parameter or a module strongly between syncs.

Nothing here imports torch: it works on whatever the model's parameters are.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from itertools import chain, compress, repeat
from operator import attrgetter, is_
from typing import Any

# What `dict.get` answers for an attribute a parameter does not have (None can be a stored value).
MISSING: Any = object()
_deref = weakref.ref.__call__
_own_dict = attrgetter("__dict__")
_dtype_and_shape = attrgetter("dtype", "shape")
_children_of = attrgetter("_modules")
_params_of = attrgetter("_parameters")
_tracked = attrgetter("tracked")
# What a sync writes into a coverage, and its value as made (`install`).
_RESET = (("writes", 0), ("shards_written", frozenset()), ("experts_written", frozenset()), ("cast_from", frozenset()))


def layout(modules: list[Any]) -> tuple[list[Any], list[int], list[Any], list[int]]:
    """Keys and object ids of the modules' `_modules` and `_parameters`, in order, flattened."""
    children = list(map(_children_of, modules))
    params = list(map(_params_of, modules))
    return (
        list(chain.from_iterable(children)),
        list(map(id, chain.from_iterable(map(dict.values, children)))),
        list(chain.from_iterable(params)),
        list(map(id, chain.from_iterable(map(dict.values, params)))),
    )


def _any_none(values: list[Any]) -> bool:
    return any(map(is_, values, repeat(None)))


class WrapPlan:
    """One model's parameters as a full install left them: enough to check, install and restore in bulk.

    Per parameter (in `named_parameters` order): its name, a weak reference, dtype name and shape as recorded,
    `(dtype, shape)` as torch reports them, the loader attribute and its value before wrapping (`MISSING` when
    the parameter had none of its own), the `_skip_weight_check` value, and for a tracked parameter the
    wrapper, whether the attribute was its own (restored) or added (removed), and the shards and local
    experts it expects."""

    def __init__(
        self,
        model: Any,
        default_loader: Callable[..., Any] | None,
        wrap_defaults: bool,
        modules: list[Any],
        rows: list[tuple[Any, ...]],
    ) -> None:
        # rows: (name, param, dtype name, shape, attribute, before, skip, wrapper or None, had, shards, experts)
        self.default_loader = default_loader
        self.wrap_defaults = wrap_defaults
        self.module_refs = list(map(weakref.ref, modules))
        self.layout = layout(modules)
        columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(11)]
        names, params, dtype_names, shapes, attributes, before, skips, wrappers, had, shards, experts = columns
        self.names = names
        self.param_refs = list(map(weakref.ref, params))
        self.dtype_shapes = list(map(_dtype_and_shape, params))
        self.dtype_names = dtype_names
        self.shapes = shapes
        self.attributes = attributes
        self.before = before
        self.skips = skips
        self.optional = list(map(bool, skips))
        self.tracked = [wrapper is not None for wrapper in wrappers]
        self.shards = shards
        self.experts = experts
        self.wrapped_attributes = list(compress(attributes, self.tracked))
        self.wrappers = list(compress(wrappers, self.tracked))
        # Restoring: the parameters whose attribute was their own get the original back, the others lose it.
        self.had = [tracked and own for tracked, own in zip(self.tracked, had, strict=True)]
        self.added = [tracked and not own for tracked, own in zip(self.tracked, had, strict=True)]
        self.had_attributes = list(compress(attributes, self.had))
        self.originals = list(compress(before, self.had))
        self.added_attributes = list(compress(attributes, self.added))
        # The coverages the last `install` made, reset and filed again by the next one (see `install`).
        self.made: list[Any] | None = None

    def current_params(self) -> list[Any] | None:
        """The parameters, when the module tree and parameter set are as planned; else None."""
        modules = list(map(_deref, self.module_refs))
        if _any_none(modules):
            return None
        try:
            if layout(modules) != self.layout:
                return None
        except (AttributeError, TypeError):  # a module without the usual dicts: not planned
            return None
        params = list(map(_deref, self.param_refs))
        # Alive and with the planned ids in the dicts: the very same objects (ids are unique among live ones).
        return None if _any_none(params) else params

    def unchanged(self, params: list[Any]) -> list[dict[str, Any]] | None:
        """The parameters' `__dict__`s when dtypes, shapes, loaders and flags are as planned; else None."""
        try:
            if list(map(_dtype_and_shape, params)) != self.dtype_shapes:
                return None
            dicts = list(map(_own_dict, params))
            if list(map(dict.get, dicts, self.attributes, repeat(MISSING))) != self.before:
                return None
            if list(map(dict.get, dicts, repeat("_skip_weight_check"), repeat(False))) != self.skips:
                return None
        except (AttributeError, TypeError, RuntimeError):
            return None
        return dicts

    def install(self, dicts: list[dict[str, Any]], coverage: dict[str, Any], make: Callable[..., Any]) -> None:
        """Put the wrappers in and file a fresh coverage (`make`: `ParamCoverage`) per parameter."""
        deque(map(dict.__setitem__, compress(dicts, self.tracked), self.wrapped_attributes, self.wrappers), 0)
        empty = frozenset()
        made = self.made
        # The last sync's coverages, its record written, are filed again with what a sync writes into them
        # reset: four C-level passes instead of one object made per parameter (~0.2 against ~0.55 µs). Only
        # `tracked` can have changed besides (a draft runner untracks the target's shared parameters); a full
        # install, which sets the other fields, replaces the plan.
        if made is not None and list(map(_tracked, made)) == self.tracked:
            for field_name, value in _RESET:
                deque(map(setattr, made, repeat(field_name), repeat(value)), 0)
        else:
            made = self.made = list(
                map(
                    make,
                    self.dtype_names,
                    self.shapes,
                    self.tracked,
                    repeat(0),
                    self.shards,
                    repeat(empty),
                    self.experts,
                    repeat(empty),
                    repeat(empty),
                    self.optional,
                )
            )
        coverage.update(zip(self.names, made, strict=True))

    def restore(self, dicts: list[dict[str, Any]]) -> None:
        """The engine's loaders back: each attribute as it was before `install`."""
        deque(map(dict.__setitem__, compress(dicts, self.had), self.had_attributes, self.originals), 0)
        deque(map(dict.pop, compress(dicts, self.added), self.added_attributes, repeat(None)), 0)
