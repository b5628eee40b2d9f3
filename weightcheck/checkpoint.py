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
from typing import Any, Protocol

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
    # What reports call the checkpoint: the directory, or `hf://org/name@commit[/sub]` for a remote repo.
    label: str = ""
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

    def __post_init__(self) -> None:
        self.label = self.label or str(self.root)

    # ---- derived views -------------------------------------------------------------------------
    @property
    def index_only(self) -> bool:
        """Only the JSON files are here (what `hf download --include '*.json'` leaves): the index names
        shards, none of which is present. Its keys are checked; shard-existence rules are not run."""
        return bool(self.weight_map) and not self.files_on_disk and not self.shards

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
        raw = path.read_bytes()
    except OSError as exc:
        doc.error = f"cannot read: {exc.strerror or exc}"
        return doc
    return parse_json_doc(doc, raw)


def parse_json_doc(doc: JsonDoc, raw: bytes) -> JsonDoc:
    """Parse `raw` (already bounded by MAX_JSON_BYTES) into `doc`; problems go to `doc.error`."""
    try:
        text = raw.decode("utf-8")
        try:
            doc.data = fast_json_loads(text)
        except ValueError:
            doc.data = json.loads(text)  # reference parser for the error message
    except UnicodeDecodeError:
        doc.error = "not UTF-8"
    except (ValueError, RecursionError) as exc:
        doc.error = f"invalid JSON: {str(exc)[:160]}"
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


class FileSource(Protocol):
    """Where the loader reads a checkpoint directory from: a local directory (`LocalSource`) or a Hub repo
    read by HTTP ranges (`weightcheck.hub.HubSource`). Rules never see the difference."""

    label: str
    root: Path

    def entries(self) -> list[str]:
        """Names of the files (and, locally, directories) directly in the checkpoint root, sorted."""
        ...

    def read_json(self, name: str) -> JsonDoc: ...

    def read_headers(self, names: list[str]) -> dict[str, HeaderReport | PathRefusal]:
        """Each shard's validated header, or why it was not opened; in the order given."""
        ...


class LocalSource:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = str(root)

    def entries(self) -> list[str]:
        return sorted(os.listdir(self.root))

    def read_json(self, name: str) -> JsonDoc:
        return _read_json(self.root / name)

    def read_headers(self, names: list[str]) -> dict[str, HeaderReport | PathRefusal]:
        out: dict[str, HeaderReport | PathRefusal] = {}
        for name in names:
            real, refusal = resolve_inside(self.root, name)
            out[name] = refusal if refusal is not None else read_header(real)  # type: ignore[arg-type]
        return out


def load_checkpoint(target: str | os.PathLike[str] | FileSource) -> Checkpoint:
    """Load a checkpoint directory (or a single .safetensors / config.json file, or a `FileSource`)
    header-only."""
    if not isinstance(target, (str, os.PathLike)):
        return load_from_source(target)
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
    if not path.is_dir():
        return Checkpoint(root=path)
    return load_from_source(LocalSource(path))


# JSON files read besides config.json and the index (each whole, each size-capped).
EXTRA_JSON = ("hf_quant_config.json", "generation_config.json")


def load_from_source(source: FileSource) -> Checkpoint:
    ckpt = Checkpoint(root=source.root, label=source.label)
    entries = source.entries()
    ckpt.files_on_disk = [e for e in entries if e.endswith(".safetensors")]
    ckpt.other_files = [e for e in entries if not e.endswith(".safetensors")]
    ckpt.config = source.read_json(CONFIG_NAME)
    for extra in EXTRA_JSON:
        if extra in entries:
            ckpt.extra_json[extra] = source.read_json(extra)
    if INDEX_NAME in entries:
        ckpt.index = source.read_json(INDEX_NAME)
        _parse_index(ckpt)

    # Open every shard named by the index plus every .safetensors file present, each once.
    to_open = list(dict.fromkeys([*ckpt.indexed_shards, *ckpt.files_on_disk]))
    for name, opened in source.read_headers(to_open).items():
        if isinstance(opened, PathRefusal):
            ckpt.refused.append(opened)
        else:
            ckpt.shards[name] = opened
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
