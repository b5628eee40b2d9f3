"""Loading debug dumps without unpickling: `torch.load(weights_only=True)` only, plus torch-free side files.

The frameworks write their dumps with plain `torch.save` of dicts and lists (slime
`slime/observability/rollout_data_utils.py`, miles `miles/ray/rollout/debug_data.py`, Relax
`relax/utils/training/train_dump_utils.py`) and read them back with `weights_only=False`. A dump is input from
anywhere, so weightcheck never does that: it first lists the globals the pickle would import
(`torch.serialization.get_unsafe_globals_in_checkpoint`, which reads the pickle without executing it); a file
that needs anything beyond the restricted unpickler's own types and a short allow-list of numpy
reconstruction helpers (miles and Relax keep `rollout_routed_experts` and some id columns as numpy arrays,
rewards can be numpy scalars) is refused with those globals named. Everything else is loaded with
`weights_only=True` inside a `safe_globals` context, mapped to CPU (miles dumps hold CUDA tensors).

Also read here, without torch: Relax's always-on JSONL rollout results (`rollout_result/{train,eval}/{id}.jsonl`)
and, only where pyarrow is installed, miles's `dashboard_columns/rollout_{id}.parquet`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightcheck import safe_io

# A dump is read whole into memory before it is unpickled; beyond this it is refused (configurable).
# A 1024-sample rollout of 8k tokens with log-probs is ~100 MB; a 2 GiB budget leaves a wide margin.
MAX_DUMP_BYTES = 2 * 1024 * 1024 * 1024
# JSONL lines and files: one rollout result line holds one sample's token ids and log-probs.
MAX_JSONL_BYTES = 1024 * 1024 * 1024
MAX_JSONL_LINE = 64 * 1024 * 1024

# Globals allowed beyond what weights_only permits by itself: numpy arrays, dtypes and scalars only. None of
# them runs user code: `_reconstruct`/`scalar` rebuild an array or scalar from a dtype and raw bytes, and an
# object-dtype array would need further globals, which are then named and refused.
_NUMPY_SAFE = (
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
)
_NUMPY_DTYPE_PREFIX = "numpy.dtypes."


class DumpRefused(Exception):
    """A dump weightcheck will not load: needs unsafe globals, too large, not a torch file, unreadable."""

    def __init__(self, path: str, reason: str, unsafe_globals: list[str] | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.unsafe_globals = unsafe_globals or []


def _allowed(name: str) -> bool:
    return name in _NUMPY_SAFE or (name.startswith(_NUMPY_DTYPE_PREFIX) and name.endswith("DType"))


def _resolve_numpy(name: str) -> Any:
    """The object behind an allow-listed global name (None when this numpy lacks it)."""
    import importlib

    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


def _numpy_dtype_classes() -> list[Any]:
    """`numpy.dtypes.*DType` classes: a pickled dtype is rebuilt by calling them, and
    `get_unsafe_globals_in_checkpoint` does not list them. The object dtype is left out (its elements would
    be arbitrary pickles)."""
    try:
        import numpy.dtypes as dtypes
    except ImportError:  # numpy < 1.25 has no numpy.dtypes; its dtypes need nothing more
        return []
    return [
        getattr(dtypes, name)
        for name in dir(dtypes)
        if name.endswith("DType") and name != "ObjectDType" and isinstance(getattr(dtypes, name), type)
    ]


def load_dump(path: Path, *, limit: int = MAX_DUMP_BYTES, name: str | None = None) -> Any:
    """The unpickled payload of a `torch.save` file, loaded only with `weights_only=True`. Raises DumpRefused."""
    import torch

    label = name or str(path)
    try:
        raw = safe_io.read_bytes(path, limit, label)
    except safe_io.UnsafePath as exc:
        raise DumpRefused(label, exc.reason) from None
    buffer = io.BytesIO(raw)
    # Common case first: the restricted unpickler with the numpy allow-list. Only when it refuses is the
    # pickle scanned for every global it would import (a second pass, so the refusal can name them all).
    allowed = [obj for obj in (_resolve_numpy(g) for g in _NUMPY_SAFE) if obj is not None]
    allowed += _numpy_dtype_classes()
    import warnings

    # Only this allow-list counts, whatever the process registered before: megatron-core's
    # register_safe_globals() (run by its checkpoint loader) adds argparse.Namespace, PosixPath, BytesIO and
    # more to torch's process-wide list, and weightcheck's API may run inside such a trainer process.
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        try:
            # torch warns about pickle protocols it may not support; a failure is reported as a finding anyway
            with warnings.catch_warnings(), torch.serialization.safe_globals(allowed):
                warnings.simplefilter("ignore")
                return torch.load(buffer, map_location="cpu", weights_only=True)
        except Exception as exc:  # the restricted unpickler refused it, or the file is damaged
            text = str(exc)
            error = f"{type(exc).__name__}: {text.splitlines()[0][:240] if text else ''}"
        buffer.seek(0)
        try:
            needed = torch.serialization.get_unsafe_globals_in_checkpoint(buffer)
        except Exception:  # not a zip-format torch file: the restricted unpickler's message is all there is
            needed = _globals_in_message(text)
    finally:
        torch.serialization.add_safe_globals(registered)
    refused = sorted(g for g in needed if not _allowed(g)) or _globals_in_message(text)
    if refused:
        raise DumpRefused(
            label,
            "needs unpickling of " + ", ".join(refused) + " (weightcheck only loads with weights_only=True)",
            refused,
        )
    raise DumpRefused(label, f"cannot be loaded with weights_only=True: {error}")


def _globals_in_message(text: str) -> list[str]:
    """The global torch's restricted unpickler names in its refusal ("Unsupported global: GLOBAL a.b.C")."""
    import re

    found = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", text)
    found += re.findall(r"but got <class '([\w.]+)'>", text)
    return sorted(set(found))


@dataclass
class JsonlLine:
    line: int
    value: dict[str, Any] | None
    error: str = ""


def read_jsonl(path: Path, *, limit: int = MAX_JSONL_BYTES, name: str | None = None) -> Iterator[JsonlLine]:
    """One JSON object per line, streamed; a bad line is yielded with its error, never raised."""
    label = name or str(path)
    try:
        fd, st = safe_io.open_regular(path, label)
    except safe_io.UnsafePath as exc:
        raise DumpRefused(label, exc.reason) from None
    if st.st_size > limit:
        import os

        os.close(fd)
        raise DumpRefused(label, f"{st.st_size} bytes, larger than the {limit}-byte limit")
    with open(fd, "rb", closefd=True) as handle:
        for number, raw in enumerate(iter(lambda: handle.readline(MAX_JSONL_LINE + 1), b""), start=1):
            if len(raw) > MAX_JSONL_LINE:
                yield JsonlLine(number, None, f"line longer than {MAX_JSONL_LINE} bytes")
                # skip the rest of this over-long line
                while raw and not raw.endswith(b"\n"):
                    raw = handle.readline(MAX_JSONL_LINE + 1)
                continue
            if not raw.strip():
                continue
            try:
                value = safe_io.parse_json(raw, label)
            except safe_io.UnsafePath as exc:
                yield JsonlLine(number, None, exc.reason)
                continue
            if not isinstance(value, dict):
                yield JsonlLine(number, None, "not a JSON object")
                continue
            yield JsonlLine(number, value)


def read_parquet_rows(path: Path, *, limit: int = MAX_DUMP_BYTES) -> list[dict[str, Any]] | None:
    """Rows of a parquet side file when pyarrow is installed; None otherwise (the file is then not read)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        raw = safe_io.read_bytes(path, limit, str(path))
    except safe_io.UnsafePath as exc:
        raise DumpRefused(str(path), exc.reason) from None
    try:
        return pq.read_table(io.BytesIO(raw)).to_pylist()
    except Exception as exc:
        raise DumpRefused(str(path), f"not a readable parquet file: {type(exc).__name__}: {str(exc)[:200]}") from None


def as_float_list(value: Any) -> list[float] | None:
    """A per-token sequence (tensor, numpy array, list) as floats on CPU; None when it is not one."""
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().to("cpu").double().reshape(-1).tolist()
    elif hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()
        if not isinstance(value, list):
            value = [value]
    if not isinstance(value, (list, tuple)):
        return None
    if all(type(item) in (float, int) for item in value):  # the usual case, without a per-item try
        return [float(item) for item in value]
    out: list[float] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            try:
                item = float(item)
            except (TypeError, ValueError):
                return None
        out.append(float(item))
    return out


def as_int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(item) is int for item in value):  # token ids as the dumps hold them
        return list(value)
    if hasattr(value, "dtype") and not getattr(value.dtype, "is_floating_point", True) and hasattr(value, "tolist"):
        out = value.tolist()  # an integer tensor: exact, no float round trip
        return out if isinstance(out, list) and all(type(x) is int for x in out) else None
    floats = as_float_list(value)
    if floats is None:
        return None
    if any(not math.isfinite(x) or x != int(x) for x in floats):
        return None
    return [int(x) for x in floats]
