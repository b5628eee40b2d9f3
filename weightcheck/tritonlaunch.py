"""Launch a jitted Triton kernel's compiled form directly once Triton has compiled and launched it for a key.

Why: on the tap's GPU path the sync waits for the host's work per tensor, not for the kernel, and Triton's
`JITFunction.run` was most of that work: 23 µs of the tap's 26 µs per tensor back to back, and ~96 µs right
after the engine's own 13.5 MB host-to-device copy had churned the host's caches (an H100,
benchmarks/gpu_host_cost.py). Per launch `run` reads its knobs, binds and specializes every argument, builds
and hashes its cache key (with `str()` of the options) and walks its checks; the compiled kernel's own `run`
is the launch itself.

How it stays right: the first launch for a key goes through `JITFunction.run`, which compiles (or finds) the
kernel for exactly these arguments and returns it; later launches with the same key call that kernel's `run`
with the arguments `JITFunction.run` passes (`*bound_args.values()`, constexprs included; Triton 3.6 to 3.9,
`triton/runtime/jit.py`). The key is at least as fine as Triton's specialization: for each pointer, its dtype
and whether its address is a multiple of 16; for each runtime integer, whether it is 1, a multiple of 16 and in
32-bit range (the properties Triton's `specialize_impl` reads); each constexpr by value; the warps; the device.

Anything this does not mirror sends the launch back to `JITFunction.run`: another Triton version, the
interpreter, launch hooks in use (a profiler), pre-run hooks, a changed global the kernel used.
`WEIGHTCHECK_TRITON_DIRECT=0` turns it off.
"""

from __future__ import annotations

import os
from typing import Any

ENV_DIRECT = "WEIGHTCHECK_TRITON_DIRECT"
# The Triton versions whose `JITFunction.run` launches with `kernel.run(grid_0, grid_1, grid_2, stream,
# kernel.function, kernel.packed_metadata, launch_metadata, enter_hook, exit_hook, *bound_args.values())`
# (read in 3.6.0's and 3.9.0's source).
VERSIONS = ((3, 6), (3, 9))


def direct_supported(version: str, environ: Any = None) -> bool:
    """Whether this Triton version and environment allow direct launches (never under the interpreter)."""
    env = os.environ if environ is None else environ
    if (env.get(ENV_DIRECT) or "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if (env.get("TRITON_INTERPRET") or "0").strip().lower() not in ("", "0", "false", "no", "off"):
        return False
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return VERSIONS[0] <= (major, minor) <= VERSIONS[1]


def int_key(value: int) -> tuple[bool, bool, bool, bool]:
    """`launch_key`'s part for a runtime integer: the classes Triton specializes it on."""
    return (value == 1, value % 16 == 0, -(1 << 31) <= value < (1 << 31), value < (1 << 63))


def launch_key(device: int, runtime: tuple[Any, ...], constexprs: tuple[Any, ...], num_warps: int) -> tuple[Any, ...]:
    """The cache key of a launch: at least as fine as Triton's specialization of these arguments."""
    parts: list[Any] = [device, num_warps, constexprs]
    for arg in runtime:
        if isinstance(arg, bool):  # Triton's u1: by value, to be safe
            parts.append(("bool", arg))
        elif isinstance(arg, int):
            parts.append(int_key(arg))
        else:
            parts.append(pointer_key(arg.dtype, arg.data_ptr()))
    return tuple(parts)


def pointer_key(dtype: Any, address: int) -> tuple[Any, bool]:
    """`launch_key`'s part for a tensor of `dtype` at `address`, from the two values alone (`launch_raw`)."""
    return (dtype, address % 16 == 0)


def raw_key(device: int, specs: tuple[Any, ...], constexprs: tuple[Any, ...], num_warps: int) -> tuple[Any, ...]:
    """`launch_key` of a launch whose runtime parts are given already (`pointer_key`, `int_key`): equal to
    `launch_key` of the same launch with tensors (tests/test_tritonlaunch.py)."""
    return (device, num_warps, constexprs, *specs)


def _hooks_idle(knobs: Any) -> bool:
    """No launch hook is in use (Triton 3.6+ keeps an empty chain of hooks; older ones kept None)."""
    for chain in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if chain is not None and getattr(chain, "calls", True):
            return False
    return True


class DirectLauncher:
    """Launches of one jitted kernel: through `JITFunction.run` once per key, then the compiled kernel's `run`.

    `runtime` are the kernel's leading runtime arguments (tensors and integers, in its parameter order) and
    `constexprs` its constexpr arguments after them, in order; both are passed positionally."""

    def __init__(self, jit: Any, enabled: bool, driver: Any = None, knobs: Any = None) -> None:
        self.jit = jit
        self.enabled = enabled and not getattr(jit, "pre_run_hooks", None)
        self._driver = driver
        self._knobs = knobs
        self.compiled: dict[tuple[Any, ...], Any] = {}
        self.direct_launches = 0  # for the benchmarks and tests: how many launches skipped JITFunction.run

    def launch(self, grid: int, runtime: tuple[Any, ...], constexprs: tuple[Any, ...], num_warps: int) -> None:
        if self.enabled:
            driver = self._driver
            device = driver.active.get_current_device()
            key = launch_key(device, runtime, constexprs, num_warps)
            kernel = self.compiled.get(key)
            if kernel is not None and self._globals_unchanged() and _hooks_idle(self._knobs):
                stream = driver.active.get_current_stream(device)
                args = (*runtime, *constexprs)
                kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata, None,
                           None, None, *args)  # fmt: skip
                self.direct_launches += 1
                return
            kernel = self.jit[(grid,)](*runtime, *constexprs, num_warps=num_warps)
            if hasattr(kernel, "result"):  # an asynchronous compile's future
                kernel = kernel.result()
            if all(hasattr(kernel, name) for name in ("run", "function", "packed_metadata")):
                self.compiled[key] = kernel
            return
        self.jit[(grid,)](*runtime, *constexprs, num_warps=num_warps)

    def launch_raw(
        self, grid: int, runtime: tuple[Any, ...], specs: tuple[Any, ...], constexprs: tuple[Any, ...], num_warps: int
    ) -> bool:
        """A direct launch with raw device addresses (ints) where the kernel takes pointers, for a key that
        `launch` compiled already; `specs` are the runtime arguments' key parts (`pointer_key`, `int_key`).
        False, having launched nothing, where that is not so (the caller launches through `launch`).

        Why: each tensor argument costs the launcher a `data_ptr()` call and a `cuPointerGetAttribute` driver
        call, and the caller's views to make the tensor (flat, int32) cost four torch calls; right after the
        engine's pageable copy each of them is several times slower than in a loop (benchmarks/gpu_tap_steps.py).
        Triton's launchers take an int as the address itself (3.6 to 3.9, `backends/nvidia/driver.{c,py}`)."""
        if not self.enabled:
            return False
        driver = self._driver
        device = driver.active.get_current_device()
        kernel = self.compiled.get(raw_key(device, specs, constexprs, num_warps))
        if kernel is None or not self._globals_unchanged() or not _hooks_idle(self._knobs):
            return False
        stream = driver.active.get_current_stream(device)
        kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *runtime,
                   *constexprs)  # fmt: skip
        self.direct_launches += 1
        return True

    def _globals_unchanged(self) -> bool:
        """Triton's own check before each launch: the globals the kernel read when compiled are unchanged."""
        missing = object()
        for (name, _), (value, namespace) in getattr(self.jit, "used_global_vals", {}).items():
            if namespace.get(name, missing) != value:
                return False
        return True
