"""Operands: one logical tensor of a checkpoint, readable a block of rows at a time.

A logical tensor is either a stored tensor (`PlainOperand`) or a quantized module's weight assembled from
its stored parts (`QuantOperand`, dequantized on the fly). Both present the tensor as `[rows, cols]`
(leading dims flattened; 0-D and 1-D tensors are one row) and give, per block of rows, the values and
the step of the stored format (one ULP, in value units) that the ULP tier uses as tolerance.

`SlicedOperand` and `TransposedOperand` are views used by mismatch classification (TP shard, transpose).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from weightcheck.compare.ulp import dtype_ulp

if TYPE_CHECKING:
    import torch

    from weightcheck.dequant import QuantizedTensor
    from weightcheck.tensors import TensorStore

# Rows sampled for cheap "could this be the same tensor?" probes (shift search, TP shards).
_PROBE_ROWS = 4
_PROBE_MAX_COLS = 8192
# Transposed comparisons materialize the tensor; beyond this many elements they are not attempted.
MAX_MATERIALIZE = 64 * 1024 * 1024


class Operand:
    name: str
    shape: tuple[int, ...]
    label: str  # dtype or quantization format, for messages
    value_dtype: str  # safetensors dtype of `block` values

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1] if self.shape else 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def quantized(self) -> QuantizedTensor | None:
        return None

    def block(self, r0: int, r1: int, *, with_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows r0..r1 as a 2-D tensor, and (with_step) the per-element ULP in float32 or None if exact."""
        raise NotImplementedError

    def probe(self) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
        """(rows, values, step) for a few fixed rows and at most `_PROBE_MAX_COLS` columns."""
        rows = sorted({0, self.rows // 3, (2 * self.rows) // 3, self.rows - 1})[:_PROBE_ROWS]
        import torch

        values, steps = [], []
        for r in rows:
            v, s = self.block(r, r + 1, with_step=True)
            values.append(v[:, :_PROBE_MAX_COLS])
            if s is not None:
                steps.append(s.expand_as(v)[:, :_PROBE_MAX_COLS])
        step = torch.cat(steps) if len(steps) == len(values) and steps else None
        return rows, torch.cat(values), step

    def release(self) -> None:
        """Let go of resident pages read so far."""


# Sub-byte dtypes without torch arithmetic: compared as their raw bytes (exact tier only makes sense).
_RAW_BYTE_DTYPES = frozenset({"F4", "F6_E2M3", "F6_E3M2"})


class PlainOperand(Operand):
    def __init__(self, store: TensorStore, stored: str, name: str | None = None) -> None:
        self.store = store
        self.stored = stored
        self.name = name or stored
        info = store.info(stored)
        self.label = info.dtype
        if info.dtype in _RAW_BYTE_DTYPES:
            self.shape = (info.nbytes,)
            self.value_dtype = "U8"
        else:
            self.shape = info.shape
            self.value_dtype = info.dtype
        self._view: torch.Tensor | None = None

    def view(self) -> torch.Tensor:
        if self._view is None:
            if self.label in _RAW_BYTE_DTYPES:
                import torch

                raw = self.store.raw(self.stored)
                self._view = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(self.rows, self.cols)
            else:
                self._view = self.store.get(self.stored).reshape(self.rows, self.cols)
        return self._view

    def block(self, r0: int, r1: int, *, with_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        values = self.view()[r0:r1]
        return values, (dtype_ulp(values, self.value_dtype) if with_step else None)

    def words(self) -> torch.Tensor:
        return self.store.get_words(self.stored)

    def release(self) -> None:
        self._view = None
        self.store.release(self.stored)


class QuantOperand(Operand):
    def __init__(self, store: TensorStore, qt: QuantizedTensor) -> None:
        self.store = store
        self.qt = qt
        self.name = qt.name
        self.shape = qt.shape
        self.label = qt.spec.describe()
        self.value_dtype = qt.out_dtype

    @property
    def quantized(self) -> QuantizedTensor:
        return self.qt

    def block(self, r0: int, r1: int, *, with_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        from weightcheck.dequant import dequantize_rows

        return dequantize_rows(self.qt, self.store.get, r0, r1, with_step=with_step)

    def codes_histogram(self) -> tuple[int, torch.Tensor] | None:
        """(levels, counts per level) of the integer codes of an INT format (None otherwise)."""
        import torch

        from weightcheck.dequant import PACK_QUANTIZED, unpack_int32

        spec = self.qt.spec
        if spec.format != PACK_QUANTIZED:
            return None
        levels = 1 << spec.num_bits
        counts = torch.zeros(levels, dtype=torch.int64)
        packed = self.store.get(self.qt.parts["weight_packed"])
        packed = packed.reshape(-1, packed.shape[-1])
        step = max(1, (4 * 1024 * 1024) // max(self.cols, 1))
        for r0 in range(0, self.rows, step):
            codes = unpack_int32(packed[r0 : r0 + step], spec.num_bits, self.cols, legacy=spec.legacy_packing)
            counts += torch.bincount(codes.reshape(-1).to(torch.int64) + levels // 2, minlength=levels)
        return levels, counts

    def release(self) -> None:
        for stored in self.qt.parts.values():
            self.store.release(stored)


class SlicedOperand(Operand):
    """Shard `k` of `n` of `base` along `dim` (0: rows of the [rows, cols] view, 1: columns)."""

    def __init__(self, base: Operand, dim: int, k: int, n: int) -> None:
        self.base, self.dim, self.k, self.n = base, dim, k, n
        self.name = f"{base.name}[shard {k}/{n} of dim {dim}]"
        self.label = base.label
        self.value_dtype = base.value_dtype
        rows, cols = base.rows, base.cols
        if dim == 0:
            self.shape = (rows // n, cols)
            self.offset = k * (rows // n)
        else:
            self.shape = (rows, cols // n)
            self.offset = k * (cols // n)

    def block(self, r0: int, r1: int, *, with_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.dim == 0:
            return self.base.block(self.offset + r0, self.offset + r1, with_step=with_step)
        values, step = self.base.block(r0, r1, with_step=with_step)
        c0, c1 = self.offset, self.offset + self.shape[1]
        if step is not None:
            step = step.expand_as(values)[:, c0:c1]
        return values[:, c0:c1], step

    def release(self) -> None:
        self.base.release()


class TransposedOperand(Operand):
    """`base` transposed (2-D only). Materialized once: used only to explain a mismatch."""

    def __init__(self, base: Operand) -> None:
        self.base = base
        self.name = f"{base.name}.T"
        self.shape = (base.cols, base.rows)
        self.label = base.label
        self.value_dtype = base.value_dtype
        self._full: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def _materialize(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self._full is None:
            values, step = self.base.block(0, self.base.rows, with_step=True)
            if step is not None:
                step = step.expand_as(values).t()
            self._full = (values.t(), step)
        return self._full

    def block(self, r0: int, r1: int, *, with_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        values, step = self._materialize()
        return values[r0:r1], (step[r0:r1] if step is not None and with_step else None)

    def release(self) -> None:
        self._full = None
        self.base.release()
