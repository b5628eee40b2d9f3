"""The direct launch of a compiled Triton kernel (weightcheck.tritonlaunch), with stand-ins for Triton's objects.

The launch itself runs only on a GPU (tests/test_fused_digest_cuda.py checks it bit for bit there); here: when it
may skip `JITFunction.run`, with which arguments, and every case that must send a launch back through it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from weightcheck.tritonlaunch import DirectLauncher, direct_supported, int_key, launch_key, pointer_key, raw_key


class FakeTensor:
    def __init__(self, ptr: int, dtype: str = "int32") -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


class FakeKernel:
    """A compiled kernel: records what its `run` was called with."""

    function, packed_metadata = "function", "metadata"

    def __init__(self) -> None:
        self.runs: list[tuple[Any, ...]] = []

    def run(self, *args: Any) -> None:
        self.runs.append(args)


class FakeJit:
    """`JITFunction`: `jit[grid](*args, num_warps=...)` compiles (a new kernel per call here) and returns it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.kernels: list[FakeKernel] = []
        self.used_global_vals: dict[Any, Any] = {}
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: tuple[int]) -> Any:
        def launch(*args: Any, num_warps: int) -> FakeKernel:
            self.calls.append((grid, args, num_warps))
            self.kernels.append(FakeKernel())
            return self.kernels[-1]

        return launch


def make(enabled: bool = True, hooks: Any = None) -> tuple[DirectLauncher, FakeJit, SimpleNamespace]:
    jit = FakeJit()
    driver = SimpleNamespace(active=SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 77))
    chain = SimpleNamespace(calls=[] if hooks is None else hooks)
    knobs = SimpleNamespace(
        runtime=SimpleNamespace(launch_enter_hook=chain, launch_exit_hook=SimpleNamespace(calls=[]))
    )
    return DirectLauncher(jit, enabled, driver=driver, knobs=knobs), jit, knobs


def test_second_launch_with_the_same_key_runs_the_compiled_kernel_with_jit_run_arguments() -> None:
    launcher, jit, _ = make()
    words, out = FakeTensor(4096), FakeTensor(8192, "int64")
    launcher.launch(132, (words, out, 1008, 3), (2, 0x7C00, 2048), 4)
    assert len(jit.calls) == 1 and launcher.direct_launches == 0
    launcher.launch(264, (FakeTensor(1 << 20), out, 2000, 5), (2, 0x7C00, 2048), 4)
    assert len(jit.calls) == 1 and launcher.direct_launches == 1
    (run,) = jit.kernels[0].runs
    # JITFunction.run's call: grid, stream, function, packed metadata, launch metadata and hooks, then every
    # bound argument (constexprs included) in parameter order.
    assert run[:9] == (264, 1, 1, 77, "function", "metadata", None, None, None)
    assert run[9:] == (run[9], out, 2000, 5, 2, 0x7C00, 2048)


@pytest.mark.parametrize(
    "change",
    [
        {"words": FakeTensor(4100)},  # not 16-byte aligned: Triton specializes on alignment
        {"words": FakeTensor(4096, "float32")},
        {"n": 1001},  # not a multiple of 16
        {"n": 1},  # Triton makes 1 a constant
        {"n": 1 << 40},  # 64-bit
        {"steps": 16},
        {"constexprs": (4, 0x7F800000, 2048)},
        {"constexprs": (2, 0x7C00, 1024)},
        {"warps": 8},
    ],
)
def test_any_change_triton_specializes_on_goes_back_through_jit_run(change: dict[str, Any]) -> None:
    launcher, jit, _ = make()
    base = {"words": FakeTensor(4096), "n": 1008, "steps": 3, "constexprs": (2, 0x7C00, 2048), "warps": 4}

    def go(values: dict[str, Any]) -> None:
        launcher.launch(8, (values["words"], FakeTensor(0, "int64"), values["n"], values["steps"]),
                        values["constexprs"], values["warps"])  # fmt: skip

    go(base)
    go({**base, **change})
    assert len(jit.calls) == 2 and launcher.direct_launches == 0
    go({**base, **change})
    assert len(jit.calls) == 2 and launcher.direct_launches == 1


def test_launch_hooks_in_use_a_changed_global_or_pre_run_hooks_keep_jit_run() -> None:
    args = ((FakeTensor(0), FakeTensor(0, "int64"), 32, 1), (0, 0, 2048))
    launcher, jit, _ = make(hooks=["a profiler's hook"])
    for _ in range(3):
        launcher.launch(4, *args, 4)
    assert len(jit.calls) == 3 and launcher.direct_launches == 0

    launcher, jit, _ = make()
    namespace = {"LIMIT": 1}
    jit.used_global_vals = {("LIMIT", 0): (1, namespace)}
    launcher.launch(4, *args, 4)
    launcher.launch(4, *args, 4)
    assert launcher.direct_launches == 1
    namespace["LIMIT"] = 2  # Triton raises on its own launch path: that path must run
    launcher.launch(4, *args, 4)
    assert len(jit.calls) == 2 and launcher.direct_launches == 1

    launcher, jit, _ = make()
    jit.pre_run_hooks.append(lambda *a, **k: None)
    launcher = DirectLauncher(jit, True, driver=launcher._driver, knobs=launcher._knobs)
    launcher.launch(4, *args, 4)
    launcher.launch(4, *args, 4)
    assert len(jit.calls) == 2 and launcher.direct_launches == 0


def test_disabled_launcher_always_uses_jit_run_and_a_future_is_resolved() -> None:
    launcher, jit, _ = make(enabled=False)
    args = ((FakeTensor(0), FakeTensor(0, "int64"), 32, 1), (0, 0, 2048))
    launcher.launch(4, *args, 4)
    launcher.launch(4, *args, 4)
    assert len(jit.calls) == 2 and launcher.direct_launches == 0 and not launcher.compiled

    launcher, jit, _ = make()
    kernel = FakeKernel()
    future = SimpleNamespace(result=lambda: kernel)
    jit.__class__ = type("FutureJit", (FakeJit,), {"__getitem__": lambda self, grid: lambda *a, num_warps: future})
    launcher.launch(4, *args, 4)
    launcher.launch(4, *args, 4)
    assert launcher.direct_launches == 1 and len(kernel.runs) == 1


@pytest.mark.parametrize(
    ("version", "environ", "expected"),
    [
        ("3.6.0", {}, True),
        ("3.9.0", {}, True),
        ("3.7.1+git", {}, True),
        ("3.5.1", {}, False),
        ("3.10.0", {}, False),
        ("4.0.0", {}, False),
        ("nightly", {}, False),
        ("3.6.0", {"TRITON_INTERPRET": "1"}, False),
        ("3.6.0", {"WEIGHTCHECK_TRITON_DIRECT": "0"}, False),
        ("3.6.0", {"TRITON_INTERPRET": "0"}, True),
    ],
)
def test_direct_launch_only_on_versions_whose_launch_convention_was_read(
    version: str, environ: dict[str, str], expected: bool
) -> None:
    assert direct_supported(version, environ) is expected


def test_key_separates_pointer_alignment_and_integer_classes() -> None:
    def key(ptr: int, n: int) -> tuple[Any, ...]:
        return launch_key(0, (FakeTensor(ptr), n), (), 4)

    assert key(16, 32) == key(4096, 64)
    assert key(16, 32) != key(20, 32)
    assert key(16, 17) == key(16, 33)
    assert key(16, 17) != key(16, 1)
    assert key(16, 17) != key(16, (1 << 31) + 1)
    assert key(16, (1 << 31) + 1) != key(16, (1 << 63) + 1)
    assert launch_key(0, (FakeTensor(16),), (), 4) != launch_key(1, (FakeTensor(16),), (), 4)
    assert launch_key(0, (True,), (), 4) != launch_key(0, (False,), (), 4) != launch_key(0, (1,), (), 4)


def raw(ptr: int, out: int, n: int, steps: int, dtype: str = "int32") -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """`launch_raw`'s runtime arguments and their key parts for a launch `launch` would see with tensors."""
    specs = (pointer_key(dtype, ptr), pointer_key("int64", out), int_key(n), int_key(steps))
    return (ptr, out, n, steps), specs


@pytest.mark.parametrize("ptr", [0, 16, 4096, 4100, 1 << 40])
@pytest.mark.parametrize("n", [1, 17, 32, (1 << 31) + 1, (1 << 63) + 1])
def test_a_raw_launch_key_equals_the_key_of_the_same_launch_with_tensors(ptr: int, n: int) -> None:
    _runtime, specs = raw(ptr, 8192, n, 3)
    assert raw_key(0, specs, (2, 0x7C00), 4) == launch_key(
        0, (FakeTensor(ptr), FakeTensor(8192, "int64"), n, 3), (2, 0x7C00), 4
    )


def test_a_raw_launch_runs_the_kernel_compiled_for_its_key_with_the_addresses_themselves() -> None:
    launcher, jit, _ = make()
    runtime, specs = raw(4096, 8192, 1008, 3)
    assert not launcher.launch_raw(132, runtime, specs, (2, 0x7C00, 2048), 4)  # nothing compiled yet
    assert not jit.calls and launcher.direct_launches == 0
    launcher.launch(132, (FakeTensor(4096), FakeTensor(8192, "int64"), 1008, 3), (2, 0x7C00, 2048), 4)
    runtime, specs = raw(1 << 20, 8224, 2000, 5)  # another tensor, same key
    assert launcher.launch_raw(264, runtime, specs, (2, 0x7C00, 2048), 4)
    (run,) = jit.kernels[0].runs
    assert run == (264, 1, 1, 77, "function", "metadata", None, None, None, 1 << 20, 8224, 2000, 5, 2, 0x7C00, 2048)
    for other in (raw(4100, 8224, 2000, 5), raw(4096, 8224, 2001, 5), raw(4096, 8224, 2000, 1),
                  raw(4096, 8224, 2000, 5, "float32")):  # fmt: skip
        assert not launcher.launch_raw(264, *other, (2, 0x7C00, 2048), 4)
    assert not launcher.launch_raw(264, runtime, specs, (2, 0x7C00, 1024), 4)
    assert not launcher.launch_raw(264, runtime, specs, (2, 0x7C00, 2048), 8)
    assert len(jit.kernels[0].runs) == 1 and len(jit.calls) == 1


def test_a_raw_launch_is_refused_where_a_direct_launch_is() -> None:
    args = ((FakeTensor(0), FakeTensor(0, "int64"), 32, 1), (0, 0, 2048))
    runtime, specs = raw(0, 0, 32, 1)
    launcher, jit, _ = make(hooks=["a profiler's hook"])
    launcher.launch(4, *args, 4)
    assert not launcher.launch_raw(4, runtime, specs, (0, 0, 2048), 4)
    launcher, jit, _ = make(enabled=False)
    launcher.launch(4, *args, 4)
    assert not launcher.launch_raw(4, runtime, specs, (0, 0, 2048), 4)
    launcher, jit, _ = make()
    namespace = {"LIMIT": 1}
    jit.used_global_vals = {("LIMIT", 0): (1, namespace)}
    launcher.launch(4, *args, 4)
    namespace["LIMIT"] = 2
    assert not launcher.launch_raw(4, runtime, specs, (0, 0, 2048), 4)
    assert all(not kernel.runs for kernel in jit.kernels)
