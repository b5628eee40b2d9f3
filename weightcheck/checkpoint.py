"""Checkpoint loader: what is on disk, with every reading problem recorded as data.

Knows about files (config.json, the index, shard headers) and nothing about rules. Rules read the
`Checkpoint` and decide what is wrong.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck.safetensors_header import HeaderReport, TensorInfo, fast_json_loads, read_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# Shard names written by huggingface_hub / transformers; DeepSeek uses 6-digit totals.
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5,6})-of-(?P<total>\d{5,6})\.safetensors$")
# Largest config/index we parse. A real DeepSeek-V3 index is ~9 MB.
MAX_JSON_BYTES = 256 * 1024 * 1024


@dataclass
class JsonDoc:
    """A parsed JSON file, or why it could not be parsed."""

    path: str
    data: Any = None
    error: str | None = None
    exists: bool = True


@dataclass
class PathRefusal:
    """A file the loader refused to open (escapes the checkpoint, not a regular file...)."""

    name: str
    reason: str
    kind: str  # "escapes", "not-regular", "absolute", "missing"


@dataclass
class Checkpoint:
    root: Path
    config: JsonDoc | None = None
    index: JsonDoc | None = None
    shards: dict[str, HeaderReport] = field(default_factory=dict)
    refused: list[PathRefusal] = field(default_factory=list)
    # safetensors files present on disk (names relative to root), whether or not indexed.
    files_on_disk: list[str] = field(default_factory=list)
    # Shards named in the index (raw strings as written).
    indexed_shards: list[str] = field(default_factory=list)
    weight_map: dict[str, str] = field(default_factory=dict)
    other_files: list[str] = field(default_factory=list)
    extra_json: dict[str, JsonDoc] = field(default_factory=dict)
    _names: frozenset[str] | None = field(default=None, repr=False)

    # ---- derived views -------------------------------------------------------------------------
    @property
    def has_weights(self) -> bool:
        return bool(self.files_on_disk or self.weight_map)

    @property
    def config_data(self) -> dict[str, Any]:
        if self.config and isinstance(self.config.data, dict):
            return self.config.data
        return {}

    def text_config(self) -> dict[str, Any]:
        """The language-model part of the config (VLMs nest it under `text_config`/`llm_config`)."""
        cfg = self.config_data
        for key in ("text_config", "llm_config", "language_config"):
            sub = cfg.get(key)
            if isinstance(sub, dict) and sub:
                merged = dict(sub)
                for k, v in cfg.items():
                    merged.setdefault(k, v)
                return merged
        return cfg

    def all_tensors(self) -> dict[str, TensorInfo]:
        """Every tensor found in readable shard headers; first shard (sorted) wins on duplicates."""
        out: dict[str, TensorInfo] = {}
        for name in sorted(self.shards):
            for key, info in self.shards[name].tensors.items():
                out.setdefault(key, info)
        return out

    def tensor_names(self) -> frozenset[str]:
        """Names the checkpoint holds: keys in readable shard headers, plus index keys whose shard cannot
        be read (missing, refused, corrupt) so that a lost shard is not also reported as lost layers.
        Ghost index entries (shard readable, key absent) are excluded. Computed once (rules share it)."""
        if self._names is None:
            names: set[str] = set()
            for report in self.shards.values():
                names.update(report.tensors)
            unreadable = {s for s in self.indexed_shards if s not in self.shards or not self.shards[s].names_known}
            if unreadable:
                names.update(k for k, s in self.weight_map.items() if s in unreadable)
            self._names = frozenset(names)
        return self._names

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.shards.values())


def _read_json(path: Path) -> JsonDoc:
    doc = JsonDoc(path=str(path))
    try:
        st = path.stat()
    except FileNotFoundError:
        doc.exists = False
        doc.error = "missing"
        return doc
    except OSError as exc:
        doc.error = f"cannot stat: {exc.strerror or exc}"
        return doc
    if not path.is_file():
        doc.error = "not a regular file"
        return doc
    if st.st_size > MAX_JSON_BYTES:
        doc.error = f"{st.st_size} bytes, larger than the {MAX_JSON_BYTES}-byte limit"
        return doc
    try:
        text = path.read_bytes().decode("utf-8")
        try:
            doc.data = fast_json_loads(text)
        except ValueError:
            doc.data = json.loads(text)  # reference parser for the error message
    except UnicodeDecodeError:
        doc.error = "not UTF-8"
    except (ValueError, RecursionError) as exc:
        doc.error = f"invalid JSON: {str(exc)[:160]}"
    except OSError as exc:
        doc.error = f"cannot read: {exc.strerror or exc}"
    return doc


def _hf_cache_blob_dir(root: Path) -> Path | None:
    """For a Hugging Face cache snapshot (`models--org--name/snapshots/<rev>`), the repo's `blobs` dir.

    Files there are symlinks into `../../blobs/`; following them is expected, not an escape.
    """
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        return (root.parent.parent / "blobs").resolve()
    return None


def resolve_inside(root: Path, name: str) -> tuple[Path | None, PathRefusal | None]:
    """Resolve `name` relative to `root`, refusing anything that leaves it.

    Refused: absolute paths, `..` components, symlinks whose target is outside the checkpoint (except
    a Hugging Face cache snapshot's own blobs), and anything that is not a regular file.
    """
    if not name or "\x00" in name:
        return None, PathRefusal(name, "empty or NUL-containing file name", "escapes")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", name):
        return None, PathRefusal(name, "absolute path in a checkpoint reference", "absolute")
    parts = re.split(r"[\\/]", name)
    if ".." in parts:
        return None, PathRefusal(name, "path climbs out of the checkpoint directory", "escapes")
    root_real = root.resolve()
    candidate = root / name
    if not os.path.lexists(candidate):
        return None, PathRefusal(name, "file does not exist", "missing")
    real = candidate.resolve()
    allowed = [root_real]
    blobs = _hf_cache_blob_dir(root_real)
    if blobs is not None:
        allowed.append(blobs)
    if not any(real == base or base in real.parents for base in allowed):
        return None, PathRefusal(name, f"symlink resolves outside the checkpoint ({real})", "escapes")
    try:
        if not real.is_file():
            return None, PathRefusal(name, "not a regular file (FIFO, device or directory)", "not-regular")
    except OSError as exc:
        return None, PathRefusal(name, f"cannot stat: {exc}", "not-regular")
    return real, None


def load_checkpoint(target: str | os.PathLike[str]) -> Checkpoint:
    """Load a checkpoint directory (or a single .safetensors / config.json file) header-only."""
    path = Path(target)
    if path.is_file() and path.suffix == ".safetensors":
        # A single-file checkpoint: its config.json (and quantization config) sit beside it.
        ckpt = Checkpoint(root=path.parent)
        ckpt.files_on_disk = [path.name]
        ckpt.shards[path.name] = read_header(path)
        if (path.parent / CONFIG_NAME).is_file():
            ckpt.config = _read_json(path.parent / CONFIG_NAME)
        if (path.parent / "hf_quant_config.json").is_file():
            ckpt.extra_json["hf_quant_config.json"] = _read_json(path.parent / "hf_quant_config.json")
        return ckpt
    if path.is_file() and path.suffix == ".json":
        ckpt = Checkpoint(root=path.parent)
        ckpt.config = _read_json(path)
        return ckpt
    ckpt = Checkpoint(root=path)
    if not path.is_dir():
        return ckpt

    entries = sorted(os.listdir(path))
    ckpt.files_on_disk = [e for e in entries if e.endswith(".safetensors")]
    ckpt.other_files = [e for e in entries if not e.endswith(".safetensors")]
    ckpt.config = _read_json(path / CONFIG_NAME)
    for extra in ("hf_quant_config.json", "generation_config.json"):
        if extra in entries:
            ckpt.extra_json[extra] = _read_json(path / extra)
    if INDEX_NAME in entries:
        ckpt.index = _read_json(path / INDEX_NAME)
        _parse_index(ckpt)

    # Open every shard named by the index plus every .safetensors file on disk, each once.
    to_open: list[str] = []
    for name in [*ckpt.indexed_shards, *ckpt.files_on_disk]:
        if name not in to_open:
            to_open.append(name)
    for name in to_open:
        real, refusal = resolve_inside(path, name)
        if refusal is not None:
            ckpt.refused.append(refusal)
            continue
        assert real is not None
        ckpt.shards[name] = read_header(real)
    return ckpt


def _parse_index(ckpt: Checkpoint) -> None:
    doc = ckpt.index
    if doc is None or not isinstance(doc.data, dict):
        return
    weight_map = doc.data.get("weight_map")
    if not isinstance(weight_map, dict):
        return
    # Non-string values are reported by WC207 and left out here.
    if all(type(v) is str for v in weight_map.values()):
        clean = weight_map
    else:
        clean = {k: v for k, v in weight_map.items() if isinstance(v, str)}
    ckpt.weight_map = clean
    ckpt.indexed_shards = list(dict.fromkeys(clean.values()))
