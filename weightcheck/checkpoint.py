"""Checkpoint loader: what is on disk, with every reading problem recorded as data.

Knows about files (config.json, the index, shard headers) and nothing about rules. Rules read the
`Checkpoint` and decide what is wrong.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck import safe_io
from weightcheck.safetensors_header import HeaderReport, TensorInfo, read_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# Shard names written by huggingface_hub / transformers; DeepSeek uses 6-digit totals.
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5,6})-of-(?P<total>\d{5,6})\.safetensors$")


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


def _read_json(root: Path, name: str, limit: int = safe_io.MAX_CONFIG_BYTES) -> JsonDoc:
    """One JSON side file of the checkpoint, through the confinement layer (inside the tree, regular file,
    bounded size)."""
    doc = JsonDoc(path=str(root / name))
    try:
        real = safe_io.confine(root, name, what="the checkpoint")
        doc.data = safe_io.load_json(real, limit, name)
    except safe_io.UnsafePath as exc:
        doc.exists = exc.kind != "missing" or os.path.islink(root / name)
        doc.error = exc.reason if exc.kind in ("missing", "invalid", "too-large") else f"refused to open: {exc.reason}"
    return doc


def resolve_inside(root: Path, name: str, bases: list[Path] | None = None) -> tuple[Path | None, PathRefusal | None]:
    """Resolve `name` relative to `root` through the confinement layer, as a value instead of an exception.

    Refused: absolute paths, `..` components, symlinks whose target is outside the checkpoint (except
    a Hugging Face cache snapshot's own blobs), symlink loops, and anything that is not a regular file.
    """
    try:
        real = safe_io.confine(root, name, bases=bases, what="the checkpoint")
    except safe_io.UnsafePath as exc:
        kind = {"absolute": "absolute", "missing": "missing"}.get(exc.kind, "escapes")
        if exc.kind == "loop":
            kind = "not-regular"
        return None, PathRefusal(exc.name, exc.reason, kind)
    try:
        if not real.is_file():
            return None, PathRefusal(name, "not a regular file (FIFO, device or directory)", "not-regular")
    except OSError as exc:
        return None, PathRefusal(name, f"cannot stat: {exc}", "not-regular")
    return real, None


def load_checkpoint(target: str | os.PathLike[str]) -> Checkpoint:
    """Load a checkpoint directory (or a single .safetensors / config.json file) header-only."""
    path = Path(target)
    if path.suffix in (".safetensors", ".json") and not path.is_dir() and os.path.lexists(path):
        # A single file named by the user: confined to its own directory, like a file inside a checkpoint.
        ckpt = Checkpoint(root=path.parent)
        if path.suffix == ".json":
            ckpt.config = _read_json(path.parent, path.name)
            return ckpt
        ckpt.files_on_disk = [path.name]
        real, refusal = resolve_inside(path.parent, path.name)
        if refusal is not None:
            ckpt.refused.append(refusal)
        else:
            ckpt.shards[path.name] = read_header(real)
        # A single-file checkpoint: its config.json (and quantization config) sit beside it.
        try:
            siblings = set(os.listdir(path.parent))
        except OSError:
            siblings = set()
        if CONFIG_NAME in siblings:
            ckpt.config = _read_json(path.parent, CONFIG_NAME)
        if "hf_quant_config.json" in siblings:
            ckpt.extra_json["hf_quant_config.json"] = _read_json(path.parent, "hf_quant_config.json")
        return ckpt
    ckpt = Checkpoint(root=path)
    if not path.is_dir():
        return ckpt

    entries = sorted(os.listdir(path))
    ckpt.files_on_disk = [e for e in entries if e.endswith(".safetensors")]
    ckpt.other_files = [e for e in entries if not e.endswith(".safetensors")]
    ckpt.config = _read_json(path, CONFIG_NAME)
    for extra in ("hf_quant_config.json", "generation_config.json"):
        if extra in entries:
            doc = ckpt.extra_json[extra] = _read_json(path, extra)
            if doc.error and doc.error.startswith("refused to open: "):
                # No rule reads these files' errors; WC104 reports the refusal (config/index have their own).
                ckpt.refused.append(PathRefusal(extra, doc.error.removeprefix("refused to open: "), "not-regular"))
    if INDEX_NAME in entries:
        ckpt.index = _read_json(path, INDEX_NAME, safe_io.MAX_INDEX_BYTES)
        _parse_index(ckpt)

    # Open every shard named by the index plus every .safetensors file on disk, each once.
    # A dict, not a list: an index naming 10^5 distinct shards must not cost a quadratic membership test.
    to_open = dict.fromkeys([*ckpt.indexed_shards, *ckpt.files_on_disk])
    bases = safe_io.allowed_bases(path)
    for name in to_open:
        real, refusal = resolve_inside(path, name, bases)
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
