"""`posmix128` in one fused kernel per tensor (Triton): the same function as `weightcheck.devdigest`, bit for bit.

`weightcheck.devdigest.posmix128_tensor` runs posmix128 as ~18 eager int64 torch kernels per chunk of words
(each one a full read and write of an int64 temporary): on a GPU that is many launches per tensor and 8-16
bytes of traffic per 4-byte word. Here a fixed grid of Triton programs strides over the tensor's blocks of
words: each loads each word once, keys it by its absolute position, mixes it, keeps its lanes' sums in
registers, and adds its two lane sums into an int64 output with atomic adds once (with them, for the tap, the
count of words with a bit set and of NaN/Inf values: `fused_lanes_and_stats`). Integer addition modulo 2^64
is associative and commutative, so the order in which programs land does not change the result: the digest
equals the reference on every device and on the stored bytes.

The definition (see `weightcheck.devdigest`) is unchanged, so records and manifests keep the algorithm name
`posmix128`: a digest taken by this kernel and one taken by the eager kernels or from a checkpoint on disk
compare equal.

Used by `posmix128_tensor` for CUDA tensors when Triton is importable (`WEIGHTCHECK_FUSED_DIGEST=0` turns it
off). On CPU it runs only under Triton's interpreter (`TRITON_INTERPRET=1`): that is how the tests check it
bit for bit against the reference without a GPU. A tensor whose byte count is not a multiple of 4 has its
last 1-3 bytes (one zero-padded word) added by the eager path.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from weightcheck.posmix import M1, M2, G, S, _byte_view, _lanes_torch, finalize, torch_module
from weightcheck.tritonlaunch import DirectLauncher, direct_supported, int_key, pointer_key

if TYPE_CHECKING:
    import torch

ENV_FUSED = "WEIGHTCHECK_FUSED_DIGEST"
# The fixed grid: words per program and step, programs per multiprocessor of the GPU (each strides over the
# tensor's blocks), and a few programs under Triton's interpreter, where a test still sees several programs each
# taking several steps. 2,048 words and 4 programs per multiprocessor (4 warps each): 1,475-1,513 GB/s on a 1 GiB
# tensor on an H100 and the fastest on the tap's stream of 13.5 MB tensors, in benchmarks/bench_fused_digest.py's
# sweep (1,024 x 4: 1,363-1,388; 512 x 8 read the 1 GiB tensor at 1,481-1,599 but the stream at 218-314).
BLOCK_WORDS = 2048
PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 3
# A lane counts at most 2 values per step in 32 bits: no program takes more steps than this.
MAX_STEPS = 1 << 29
# The many-tensor kernel's tensors are its grid's second axis, which CUDA caps at 65,535.
MAX_TENSORS_PER_LAUNCH = 65535


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a Triton that cannot load its backends here
        return False
    return True


def fused_enabled(environ: Any = None) -> bool:
    env = os.environ if environ is None else environ
    return (env.get(ENV_FUSED) or "1").strip().lower() not in ("0", "false", "no", "off")


tl: Any = None  # triton.language, bound when the kernel is first built (Triton resolves it in this module)


# The digest with the tap's statistics in the same pass: out[0], out[1] are posmix128's two lane sums, out[2]
# counts the words with a bit set (all bytes zero: 0), out[3] the NaN/Inf values of a float of WIDTH bytes (2 or
# 4) whose exponent-all-ones pattern is PATTERN (a value is NaN/Inf exactly when its sign-cleared bits are
# >= PATTERN); WIDTH 0: no NaN/Inf count (integers, bool, and the digest alone).
# A fixed grid of programs strides over the blocks of words (`iters` blocks each): each lane keeps its own sums
# in registers and a program reduces and adds them to `out` once, at the end. One program per block instead
# reduced four values across the block and issued four atomics for every 1,024 words, which kept the kernel at
# about a third of the device's read bandwidth (an H100, benchmarks/bench_fused_digest.py).
# A word's key k = splitmix(i * G + S) needs i * G: that linear part advances by the same constant each
# stride (arithmetic mod 2^64), so it is one 64-bit add per word instead of a 64-bit multiply.
# No annotations but the constexprs': Triton's compiler (not its interpreter) resolves each annotation as a
# global of this module, and `Any` is not one it accepts (a GPU run failed so; tests/test_fused_digest_cuda.py).
def _posmix_kernel(words_ptr, out_ptr, n_words, iters, WIDTH: tl.constexpr, PATTERN: tl.constexpr,  # type: ignore[no-untyped-def]
                   BLOCK: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    stride = tl.num_programs(0).to(tl.int64) * BLOCK
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # int64: tensors past 2^31 words
    # i * G + S for this lane's first word, then + stride * G per step (uint64 arithmetic wraps).
    linear = offs.to(tl.uint64) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
    linear_step = stride.to(tl.uint64) * 0x9E3779B97F4A7C15
    lane_a = tl.zeros([BLOCK], dtype=tl.uint64)
    lane_b = tl.zeros([BLOCK], dtype=tl.uint64)
    set_words = tl.zeros([BLOCK], dtype=tl.int32)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for _ in range(0, iters):
        mask = offs < n_words
        w32 = tl.load(words_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        # k_i = splitmix(i * G + S); x_i = fmix((w_i ^ k_i) * M1): >> is logical on uint64.
        k = linear ^ (linear >> 31)
        x = (w32.to(tl.uint64) ^ k) * 0xBF58476D1CE4E5B9
        x = x ^ (x >> 29)
        x = x * 0x94D049BB133111EB
        x = x ^ (x >> 32)
        x = tl.where(mask, x, 0)
        lane_a += x
        lane_b += x * (k | 1)
        set_words += tl.where(mask & (w32 != 0), 1, 0)
        if WIDTH == 2:
            bad += tl.where(mask & ((w32 & 0x7FFF) >= PATTERN), 1, 0)
            bad += tl.where(mask & (((w32 >> 16) & 0x7FFF) >= PATTERN), 1, 0)
        if WIDTH == 4:
            bad += tl.where(mask & ((w32 & 0x7FFFFFFF) >= PATTERN), 1, 0)
        offs += stride
        linear += linear_step
    tl.atomic_add(out_ptr, tl.sum(lane_a, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(out_ptr + 1, tl.sum(lane_b, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(out_ptr + 2, tl.sum(set_words.to(tl.int64), axis=0))
    if WIDTH != 0:
        tl.atomic_add(out_ptr + 3, tl.sum(bad.to(tl.int64), axis=0))


# The same pass over many tensors in one launch (`fused_stats_many`): program (p, t) of a grid of P x T programs
# strides over tensor t's words with the P programs of its column, its address and word count read from row t
# of an int64 [T, 2] table, and adds into row t of an int64 [T, 4] output. Why a second kernel: on the tap's GPU
# path a launch costs the host 47-70 µs right after the engine's copy (an H100, benchmarks/gpu_host_cost.py),
# about the whole of the 5 % budget per 13.5 MB tensor; one launch per call's tensors takes that away. The body
# is `_posmix_kernel`'s, line for line (a jitted helper shared by both would be bound at build time; the
# one-tensor kernel stays as measured on the GPU), and the tests hold both to the same reference.
# ALIGNED: every address in the table is a multiple of 16 bytes and every word count a multiple of 16, which the
# kernel is told (`tl.multiple_of`): an address or count read from memory tells Triton's compiler nothing, and
# without it each word is loaded on its own instead of four at a time.
def _posmix_many_kernel(table_ptr, out_ptr, WIDTH: tl.constexpr, PATTERN: tl.constexpr,  # type: ignore[no-untyped-def]
                        BLOCK: tl.constexpr, ALIGNED: tl.constexpr):  # fmt: skip
    t = tl.program_id(1).to(tl.int64)
    pid = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0).to(tl.int64)
    words_ptr = tl.load(table_ptr + 2 * t).to(tl.pointer_type(tl.int32))
    n_words = tl.load(table_ptr + 2 * t + 1)
    if ALIGNED:
        words_ptr = tl.multiple_of(words_ptr, 16)
        n_words = tl.multiple_of(n_words, 16)
    iters = ((n_words + BLOCK - 1) // BLOCK + programs - 1) // programs
    stride = programs * BLOCK
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    linear = offs.to(tl.uint64) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
    linear_step = stride.to(tl.uint64) * 0x9E3779B97F4A7C15
    lane_a = tl.zeros([BLOCK], dtype=tl.uint64)
    lane_b = tl.zeros([BLOCK], dtype=tl.uint64)
    set_words = tl.zeros([BLOCK], dtype=tl.int32)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for _ in range(0, iters):
        mask = offs < n_words
        w32 = tl.load(words_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        k = linear ^ (linear >> 31)
        x = (w32.to(tl.uint64) ^ k) * 0xBF58476D1CE4E5B9
        x = x ^ (x >> 29)
        x = x * 0x94D049BB133111EB
        x = x ^ (x >> 32)
        x = tl.where(mask, x, 0)
        lane_a += x
        lane_b += x * (k | 1)
        set_words += tl.where(mask & (w32 != 0), 1, 0)
        if WIDTH == 2:
            bad += tl.where(mask & ((w32 & 0x7FFF) >= PATTERN), 1, 0)
            bad += tl.where(mask & (((w32 >> 16) & 0x7FFF) >= PATTERN), 1, 0)
        if WIDTH == 4:
            bad += tl.where(mask & ((w32 & 0x7FFFFFFF) >= PATTERN), 1, 0)
        offs += stride
        linear += linear_step
    row = out_ptr + 4 * t
    tl.atomic_add(row, tl.sum(lane_a, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(row + 1, tl.sum(lane_b, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(row + 2, tl.sum(set_words.to(tl.int64), axis=0))
    if WIDTH != 0:
        tl.atomic_add(row + 3, tl.sum(bad.to(tl.int64), axis=0))


# The kernel's literals are devdigest's constants (Triton needs literals there); checked at import.
assert (G, S, M1, M2) == (0x9E3779B97F4A7C15, 0x632BE59BD9B4E019, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    """The jitted kernel, built on first use (`TRITON_INTERPRET=1` at that moment: the interpreter)."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    return triton.jit(_posmix_kernel)


@functools.lru_cache(maxsize=1)
def _many_kernel() -> Any:
    """The many-tensor kernel, jitted on first use like `_kernel`."""
    _kernel()  # binds `tl`
    import triton

    return triton.jit(_posmix_many_kernel)


@functools.lru_cache(maxsize=1)
def _launcher() -> DirectLauncher:
    """The kernel's launcher: `JITFunction.run` once per specialization, then the compiled kernel directly
    (`weightcheck.tritonlaunch`; the host's work per tensor is what a GPU sync waits for)."""
    import triton
    from triton import knobs
    from triton.runtime.driver import driver

    jit = _kernel()
    return DirectLauncher(jit, direct_supported(triton.__version__), driver=driver, knobs=knobs)


def posmix128_fused(tensor: torch.Tensor, block_words: int = BLOCK_WORDS) -> str:
    """`posmix128` of the tensor's stored bytes in one Triton kernel on its device (CUDA, or CPU under
    `TRITON_INTERPRET=1`). Equal to `weightcheck.devdigest.posmix128_tensor` and `posmix128_bytes`."""
    import sys

    if sys.byteorder != "little":
        raise TypeError("posmix128 on a big-endian host is not supported")
    data = _byte_view(tensor)
    a, b = fused_lanes(data, block_words).tolist()
    return finalize(int(a), int(b), data.numel())


def fused_lanes(data: torch.Tensor, block_words: int = BLOCK_WORDS) -> torch.Tensor:
    """The two lane sums of posmix128 over the flat uint8 tensor `data`, as an int64[2] tensor on its device;
    nothing waits for the device (`finalize` of the two values and `data.numel()` is the digest)."""
    return fused_lanes_and_stats(data, 0, 0, block_words)[:2]


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_programs(device: Any, n_blocks: int, programs: int | None = None) -> int:
    """How many programs stride over `n_blocks` blocks: PROGRAMS_PER_SM per multiprocessor of a GPU (a few
    under the interpreter), never more than there are blocks, and enough that none takes over MAX_STEPS."""
    if programs is None:
        programs = _multiprocessors(device.index) * PROGRAMS_PER_SM if device.type == "cuda" else INTERPRETER_PROGRAMS
    return _fit_grid(n_blocks, programs)


def _fit_grid(n_blocks: int, programs: int) -> int:
    """`programs`, never more than there are blocks, and enough that none takes over MAX_STEPS."""
    return max(1, min(n_blocks, programs), triton_cdiv(n_blocks, MAX_STEPS))


@functools.cache
def _multiprocessors(index: int | None) -> int:
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return int(properties.multi_processor_count)


def fused_stats_at(tensor: torch.Tensor, width: int, pattern: int, out_address: int) -> bool:
    """`fused_lanes_and_stats` of a contiguous tensor on the current GPU into the zeroed int64[4] at device
    address `out_address` (16-byte aligned), launched with raw addresses (`DirectLauncher.launch_raw`): no view
    of the tensor is made. True when launched; False, having launched nothing, when this path does not apply
    (a byte count or address not a multiple of 4, another device, no compiled kernel for the key yet, direct
    launches off): `fused_lanes_and_stats` then does it, and compiles the key for the next tensor."""
    n_bytes = tensor.nbytes
    address = tensor.data_ptr()
    if not n_bytes or n_bytes & 3 or address & 3:
        return False
    launcher = _launcher()
    if not launcher.enabled:
        return False
    n_full = n_bytes >> 2
    n_blocks = -(-n_full // BLOCK_WORDS)
    index = tensor.get_device()
    programs = _fit_grid(n_blocks, _multiprocessors(index) * PROGRAMS_PER_SM)
    iters = -(-n_blocks // programs)
    torch = torch_module()
    if index != torch.cuda.current_device():
        return False
    specs = (pointer_key(torch.int32, address), pointer_key(torch.int64, out_address), int_key(n_full),
             int_key(iters))  # fmt: skip
    return launcher.launch_raw(programs, (address, out_address, n_full, iters), specs, (width, pattern, BLOCK_WORDS), 4)


def fused_lanes_and_stats(
    data: torch.Tensor,
    width: int,
    pattern: int,
    block_words: int = BLOCK_WORDS,
    programs: int | None = None,
    num_warps: int = 4,
    out: Any = None,
) -> Any:
    """posmix128's two lanes, the count of 4-byte words with a bit set and the count of NaN/Inf values (floats of
    `width` 2 or 4 bytes with exponent pattern `pattern`; `width` 0: none counted) over the flat uint8 tensor
    `data`, as an int64[4] tensor on its device, in one kernel (the last 1-3 bytes by torch); nothing waits for
    the device. The element count of `data` must be whole elements of `width` bytes. `out`: a zeroed int64[4]
    tensor on the same device to add into (the tap hands out rows of one zeroed block: no allocation and fill per
    tensor). `programs` and `num_warps` override the grid's size and the warps per program (the benchmark)."""
    torch = torch_module()
    n_bytes = data.numel()
    n_full = n_bytes >> 2
    device = data.device
    if out is None:
        out = torch.zeros(4, dtype=torch.int64, device=device)
    if n_full:
        body = data if n_full << 2 == n_bytes else data[: n_full << 2]
        words = body.view(torch.int32) if data.data_ptr() & 3 == 0 else body.clone().view(torch.int32)
        n_blocks = -(-n_full // block_words)
        grid = grid_programs(device, n_blocks, programs)
        launcher = _launcher()
        runtime = (words, out, n_full, -(-n_blocks // grid))
        # Triton launches on the current device: a tensor on another GPU makes its own current for the launch.
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):
                launcher.launch(grid, runtime, (width, pattern, block_words), num_warps)
        else:
            launcher.launch(grid, runtime, (width, pattern, block_words), num_warps)
    tail = n_bytes - n_full * 4
    if tail:  # a whole 16-bit value (width 2) or 1-3 bytes of a 1-byte dtype: counted with torch
        rest = data[n_full * 4 :]
        weights = torch.tensor([1, 1 << 8, 1 << 16, 1 << 24][:tail], dtype=torch.int64, device=data.device)
        word = (rest.to(torch.int64) * weights).sum().reshape(1)
        extra = [*_lanes_torch(word, n_full), (word != 0).sum()]
        if width == 2:
            value = word & 0x7FFF
            extra.append((value >= pattern).sum())
        else:
            extra.append(torch.zeros((), dtype=torch.int64, device=data.device))
        out += torch.stack(extra)
    return out


def many_programs(device: Any, n_tensors: int, max_words: int, block_words: int = BLOCK_WORDS) -> int:
    """Programs per tensor for `fused_stats_many`: the device's PROGRAMS_PER_SM per multiprocessor shared among the
    tensors (a few under the interpreter), never more than the largest tensor's blocks, and enough that no
    program takes over MAX_STEPS."""
    n_blocks = max(1, -(-max_words // block_words))
    total = _multiprocessors(device.index) * PROGRAMS_PER_SM if device.type == "cuda" else INTERPRETER_PROGRAMS
    return _fit_grid(n_blocks, max(1, total // max(1, n_tensors)))


def fused_stats_many(
    table: torch.Tensor,
    out: torch.Tensor,
    max_words: int,
    width: int,
    pattern: int,
    block_words: int = BLOCK_WORDS,
    aligned: bool = False,
    programs: int | None = None,
) -> None:
    """`fused_lanes_and_stats` of many tensors in one launch: row t of the int64 [T, 2] `table` on the device holds
    a tensor's word address (a multiple of 4) and its word count (its byte count / 4, whole), and row t of the
    zeroed int64 [T, 4] `out` on the same device receives its two lanes, set words and NaN/Inf count. `max_words`:
    the largest word count in the table (sizes the grid). `aligned`: every address is a multiple of 16 and every
    word count of 16 (the caller checked; the kernel then loads words four at a time). `programs`: per tensor
    (the benchmark; default `many_programs`). Nothing waits for the device."""
    torch = torch_module()
    n_tensors = table.shape[0]
    if not n_tensors:
        return
    if n_tensors > MAX_TENSORS_PER_LAUNCH:
        raise ValueError(f"{n_tensors} tensors in one launch: at most {MAX_TENSORS_PER_LAUNCH} (the grid's 2nd axis)")
    device = table.device
    per_tensor = programs or many_programs(device, n_tensors, max_words, block_words)
    grid = (per_tensor, n_tensors)
    kernel = _many_kernel()
    constexprs = {"WIDTH": width, "PATTERN": pattern, "BLOCK": block_words, "ALIGNED": aligned}
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            kernel[grid](table, out, **constexprs)
    else:
        kernel[grid](table, out, **constexprs)
