"""The one way weightcheck opens a file it was asked to check.

Every file comes from an untrusted tree (a downloaded checkpoint, a records folder on a shared filesystem,
a manifest folder). `confine(root, name)` resolves a name inside the tree and refuses what leaves it
(absolute names, `..`, symlinks out of the tree, symlink loops); `open_regular` opens non-blocking and
refuses anything `fstat` does not call a regular file (a FIFO would block a plain `open` forever, a
device never ends); `read_bytes` / `load_json` read at most a size budget per kind of file. Problems are
raised as `UnsafePath`, which callers turn into findings. Nothing here writes.

A Hugging Face cache snapshot (`models--org--name/snapshots/<rev>/`) holds symlinks into the repo's own
`blobs/` folder; those are followed (huggingface_hub writes them), anything else leaving the tree is not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

# Below this many bytes a JSON text is parsed by the stdlib: importing orjson (uuid, platform, datetime: ~8 ms)
# costs more than it saves on a config.json, and config-only lint is mostly start-up (issue #20).
SMALL_JSON_BYTES = 1 << 16
_FAST_LOADS: list[Any] = []


def fast_json_loads(raw: bytes | str) -> Any:
    """orjson's `loads` (~3x faster on large headers and indexes), imported on first use; the stdlib's where
    orjson has no wheel. Strict JSON only: callers fall back to `json.loads` for its verdict and message."""
    if not _FAST_LOADS:
        try:
            from orjson import loads
        except ImportError:  # pragma: no cover - exercised only where orjson has no wheel
            loads = json.loads
        _FAST_LOADS.append(loads)
    return _FAST_LOADS[0](raw)


# Size budgets per kind of file. Real files are far below them: a DeepSeek-V3 index is ~9 MB, a config or
# quantization config < 1 MB, one rank's record of a 92k-tensor sync ~30 MB.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_INDEX_BYTES = 128 * 1024 * 1024
MAX_RECORD_BYTES = 256 * 1024 * 1024
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
MAX_TEXT_BYTES = 16 * 1024 * 1024  # name maps, policies, small side files
# Entries of a model.safetensors.index.json: 5x the largest real index (Kimi-K2, ~140k; DeepSeek-V3 ~92k).
# A 1M-entry index costs ~500 MB and tens of seconds in the rules; above the cap the file is refused before
# it is parsed (docs/security.md, memory budget).
MAX_INDEX_ENTRIES = 1 << 19
# JSON nesting is bounded by the parsers themselves: orjson refuses more than 1024 levels and the stdlib
# parser raises RecursionError (caught below), so neither can exhaust the stack.

_O_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class UnsafePath(Exception):
    """A file weightcheck refused to open or read. `kind`: escapes, absolute, missing, loop, not-regular,
    too-large, unreadable, invalid."""

    def __init__(self, name: str, reason: str, kind: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason
        self.kind = kind


def hf_cache_blob_dir(root: Path) -> Path | None:
    """For a Hugging Face cache snapshot (`models--org--name/snapshots/<rev>`), the repo's `blobs` dir."""
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        return Path(os.path.realpath(root.parent.parent / "blobs"))
    return None


def allowed_bases(root: str | os.PathLike[str]) -> list[Path]:
    """The real directories a tree rooted at `root` may resolve into."""
    real = Path(os.path.realpath(root))
    bases = [real]
    blobs = hf_cache_blob_dir(real)
    if blobs is not None:
        bases.append(blobs)
    return bases


def _inside(real: Path, bases: Iterable[Path]) -> bool:
    return any(real == base or base in real.parents for base in bases)


def _realpath(path: Path, name: str) -> Path:
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(name, "symlink loop", "loop") from None
        if exc.errno == errno.ENOENT:
            if os.path.islink(path):
                raise UnsafePath(name, "dangling symlink", "missing") from None
            raise UnsafePath(name, "file does not exist", "missing") from None
        raise UnsafePath(name, f"cannot resolve: {exc.strerror or exc}", "unreadable") from None
    except RuntimeError:  # pathlib's spelling of a loop on some Python versions
        raise UnsafePath(name, "symlink loop", "loop") from None


def confine(
    root: str | os.PathLike[str], name: str, *, bases: list[Path] | None = None, what: str = "the target directory"
) -> Path:
    """Resolve `name` (relative to `root`) to a real path inside the tree, or raise UnsafePath.

    Refused: empty/NUL names, absolute names, `..` components, symlinks (at any level) that resolve
    outside `root` (a Hugging Face cache snapshot's own blobs excepted), symlink loops, missing files.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnsafePath(str(name)[:200], "empty or NUL-containing file name", "escapes")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", name):
        raise UnsafePath(name, "absolute path in a reference", "absolute")
    if ".." in re.split(r"[\\/]", name):
        raise UnsafePath(name, f"path climbs out of {what}", "escapes")
    if len(name) > 4096:
        raise UnsafePath(name[:200], "file name longer than 4096 characters", "escapes")
    real = _realpath(Path(root) / name, name)
    if not _inside(real, bases if bases is not None else allowed_bases(root)):
        raise UnsafePath(name, f"symlink resolves outside {what} ({real})", "escapes")
    return real


def confine_self(path: str | os.PathLike[str]) -> Path:
    """A file named directly by the user: confined to its own directory (so a symlink that leaves it, other
    than into a Hugging Face cache's blobs, is refused)."""
    p = Path(path)
    return confine(p.parent, p.name)


def open_regular(path: str | os.PathLike[str], name: str | None = None) -> tuple[int, os.stat_result]:
    """Open read-only and non-blocking; refuse anything but a regular file. Returns (fd, stat)."""
    label = name if name is not None else os.fspath(path)
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(label, "symlink loop", "loop") from None
        if exc.errno == errno.ENOENT:
            raise UnsafePath(label, "file does not exist", "missing") from None
        raise UnsafePath(label, f"cannot open: {exc.strerror or exc}", "unreadable") from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise UnsafePath(label, f"cannot stat: {exc.strerror or exc}", "unreadable") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath(label, "not a regular file (FIFO, device, socket or directory)", "not-regular")
    return fd, st


def read_bytes(path: str | os.PathLike[str], limit: int, name: str | None = None) -> bytes:
    """The whole file, if it is a regular file of at most `limit` bytes (re-checked while reading)."""
    label = name if name is not None else os.fspath(path)
    fd, st = open_regular(path, label)
    try:
        if st.st_size > limit:
            raise UnsafePath(label, f"{st.st_size} bytes, larger than the {limit}-byte limit", "too-large")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise UnsafePath(label, f"grew past the {limit}-byte limit while reading", "too-large")
        return b"".join(chunks)
    except OSError as exc:
        raise UnsafePath(label, f"read failed: {exc.strerror or exc}", "unreadable") from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int = MAX_TEXT_BYTES, name: str | None = None) -> str:
    label = name if name is not None else os.fspath(path)
    try:
        return read_bytes(path, limit, label).decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePath(label, "not UTF-8 text", "invalid") from None


_KEY_TOKEN = re.compile(r'"\s*:')
_KEY_TOKEN_BYTES = re.compile(rb'"\s*:')


def key_tokens(raw: bytes | str) -> int:
    """How many `"...":` key tokens the JSON text holds: an upper bound on its object keys (a string value
    may contain `":` too), counted without parsing."""
    # Writers put no whitespace before a colon (json.dumps, with or without indent). When every colon of
    # the text follows a quote, no token has whitespace before its colon, and the tokens are exactly the
    # `":` pairs: two C-level counts instead of a regex walk (~0.1 s on DeepSeek-V3's 8 MB index).
    if isinstance(raw, bytes):
        plain = raw.count(b'":')
        if plain == raw.count(b":"):
            return plain
        pattern = _KEY_TOKEN_BYTES
    else:
        plain = raw.count('":')
        if plain == raw.count(":"):
            return plain
        pattern = _KEY_TOKEN
    return sum(1 for _ in pattern.finditer(raw))  # not findall: a list of 10^6 matches is memory too


_CONTAINERS = frozenset({dict, list})


def _all_keys(doc: Any) -> int:
    count = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            count += len(node)
            # An index's weight_map holds ~92k strings: one C-level pass decides there is nothing below.
            if not _CONTAINERS.isdisjoint(map(type, node.values())):
                stack.extend(v for v in node.values() if type(v) in (dict, list))
        elif type(node) is list:
            stack.extend(v for v in node if type(v) in (dict, list))
    return count


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _loads(raw: bytes | str) -> Any:
    """The document, by orjson for a large text; the stdlib parser gives the reference verdict and message (it
    accepts a superset of what orjson accepts, with the same result on strict JSON), and reads small texts."""
    if len(raw) >= SMALL_JSON_BYTES:
        try:
            return fast_json_loads(raw)
        except ValueError:
            pass
    doc = json.loads(raw)
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be encoded
    return doc


def parse_json(raw: bytes | str, name: str, *, unique_keys: bool = False, max_keys: int | None = None) -> Any:
    """Parse JSON text (depth bounded by the parsers). Raises UnsafePath(kind="invalid") with the parser's message.

    A lone UTF-16 surrogate escape ("\\ud800": valid JSON text, no UTF-8 string) is refused: orjson refuses it,
    the stdlib fallback would let it through to crash a report writer. `max_keys` refuses (kind "too-large")
    a text with more key tokens, before parsing; `unique_keys` refuses a key repeated in one object (a dict
    keeps the last silently), paying for the slow exact parse only when the text's key tokens outnumber the
    parsed keys."""
    tokens = key_tokens(raw) if max_keys is not None or unique_keys else 0  # counted once for both uses
    if max_keys is not None and tokens > max_keys:
        raise UnsafePath(name, f"about {tokens} keys, more than the {max_keys} weightcheck reads", "too-large")
    try:
        doc = _loads(raw)
        if unique_keys and tokens != _all_keys(doc):
            json.loads(raw, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as dup:
        raise UnsafePath(name, f"key {str(dup)[:120]!r} appears twice in one object", "invalid") from None
    except UnicodeEncodeError:
        raise UnsafePath(name, "a lone UTF-16 surrogate escape (not UTF-8 text)", "invalid") from None
    except UnicodeDecodeError:
        raise UnsafePath(name, "not UTF-8", "invalid") from None
    except (ValueError, RecursionError, OverflowError) as exc:
        raise UnsafePath(name, f"invalid JSON: {str(exc)[:160]}", "invalid") from None
    return doc


def load_json(
    path: str | os.PathLike[str],
    limit: int,
    name: str | None = None,
    *,
    unique_keys: bool = False,
    max_keys: int | None = None,
) -> Any:
    """Read (bounded) and parse one JSON file. Raises UnsafePath."""
    label = name if name is not None else os.fspath(path)
    raw = read_bytes(path, limit, label)
    return parse_json(raw, label, unique_keys=unique_keys, max_keys=max_keys)


def is_dir_inside(
    root: str | os.PathLike[str], name: str, bases: list[Path] | None = None, what: str = "the target directory"
) -> Path:
    """A subdirectory of `root` that stays inside it. Raises UnsafePath (kind not-regular when not a dir)."""
    real = confine(root, name, bases=bases, what=what)
    if not real.is_dir():
        raise UnsafePath(name, "not a directory", "not-regular")
    return real
