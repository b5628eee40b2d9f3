"""The cyclic garbage collector off for the length of one of our own loops that allocate many small, acyclic
objects (lint's header parsing; the tap's wrapping, filing and record writing).

Why: such loops allocate ~10 objects per tensor that all die by reference count, yet their allocations trigger
collections that traverse every tracked object again: lint's time roughly doubled on a 90k-tensor checkpoint,
and inside an engine each collection walks the engine's whole heap (every parameter tensor), 2-3x the tap's own
cost on a stream of 20,000 small tensors. The collector is turned back on only if it was on (a caller that keeps
it off keeps it off). A class rather than `contextlib.contextmanager`: contextlib stays off lint's start-up path.
"""

from __future__ import annotations

import gc


class GCPaused:
    """`with GCPaused(): ...`: the cyclic collector off inside, as it was after."""

    __slots__ = ("enabled",)

    def __enter__(self) -> None:
        self.enabled = gc.isenabled()
        if self.enabled:
            gc.disable()

    def __exit__(self, *exc_info: object) -> None:
        if self.enabled:
            gc.enable()
