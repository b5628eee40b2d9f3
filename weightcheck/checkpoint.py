"""Checkpoint loader: what is on disk, with every reading problem recorded as data.

Knows about files (config.json, the index, shard headers) and nothing about rules. Rules read the
`Checkpoint` and decide what is wrong.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from weightcheck import safe_io
from weightcheck.lazyregex import LazyRegex
from weightcheck.lightclass import dataclass, field
from weightcheck.safetensors_header import HeaderProblem, HeaderReport, TensorInfo, read_header

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any, Protocol

# Tensors read from one checkpoint's headers (5x DeepSeek-V3's 92k); later shards are reported, not parsed.
MAX_CHECKPOINT_TENSORS = 1 << 19

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# Mistral's native weight files (mistral-inference's layout: params.json + consolidated*.safetensors), which
# Mistral's Hugging Face repos ship beside the HF shards.
KNOWN_UNINDEXED = ("consolidated.safetensors", "consolidated-")
CONFIG_NAME = "config.json"
# Shard names written by huggingface_hub / transformers; DeepSeek uses 6-digit totals.
SHARD_RE = LazyRegex(r"^(?P<stem>.+)-(?P<index>\d{5,6})-of-(?P<total>\d{5,6})\.safetensors$")


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
    # A PEFT adapter folder's copy of its base model's config.json (set aside: it does not describe the tensors)
    base_config: JsonDoc | None = None
    _names: frozenset[str] | None = field(default=None, repr=False)
    _all: tuple[tuple[Any, ...], dict[str, TensorInfo]] | None = field(default=None, repr=False)

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
        return text_config_of(self.config_data)

    def all_tensors(self) -> dict[str, TensorInfo]:
        """Every tensor found in readable shard headers; first shard (sorted) wins on duplicates.
        Built once and shared (half a dozen rules ask; callers must not modify it); rebuilt if the shard
        reports change."""
        key = tuple((name, id(r.tensors), len(r.tensors)) for name, r in sorted(self.shards.items()))
        if self._all is None or self._all[0] != key:
            out: dict[str, TensorInfo] = {}
            for name in sorted(self.shards):
                out.update(self.shards[name].tensors)  # C-level; keys keep their first-seen order
            if len(out) != sum(len(r.tensors) for r in self.shards.values()):
                out = {}  # a tensor in several shards: the first (sorted) must win, update kept the last
                for name in sorted(self.shards):
                    for tensor, info in self.shards[name].tensors.items():
                        out.setdefault(tensor, info)
            self._all = (key, out)
        return self._all[1]

    def tensor_names(self) -> frozenset[str]:
        """Names the checkpoint holds: keys in readable shard headers, plus index keys whose shard cannot
        be read (missing, refused, corrupt) so that a lost shard is not also reported as lost layers.
        Ghost index entries (shard readable, key absent) are excluded. Computed once (rules share it)."""
        if self._names is None:
            # all_tensors() holds every shard's names once (built anyway; one C-level pass over its keys)
            names = frozenset(self.all_tensors())
            unreadable = {s for s in self.indexed_shards if s not in self.shards or not self.shards[s].names_known}
            if unreadable:
                names = names.union(k for k, s in self.weight_map.items() if s in unreadable)
            self._names = names
        return self._names

    def pickle_weights(self) -> list[str]:
        """Files in the root named like pickled weights (`pytorch_model.bin`, `*.pt`): reported, never opened
        (unpickling runs code)."""
        return [name for name in self.other_files if name.endswith(PICKLE_SUFFIXES)]

    def sorted_names(self) -> list[str]:
        """`tensor_names()` sorted. all_tensors() lists names shard by shard, each shard in its header's
        order (sorted runs, as writers lay them out), which a sort merges ~10x faster than a set's hash
        order (60 ms on DeepSeek-V3's 92k names): sorted from there when the two hold the same names."""
        names = self.tensor_names()
        listed = self.all_tensors()
        return sorted(listed if len(listed) == len(names) else names)

    def mistral_native_copy(self) -> list[str]:
        """Mistral's own copy of the weights beside an indexed HF checkpoint (`params.json` and unindexed
        `consolidated*.safetensors`, as Mistral's Hub repos ship both): vLLM reads it with `--load-format mistral`;
        the HF loaders follow the index and never open it (vLLM and SGLang drop files the index does not name)."""
        if not self.weight_map or "params.json" not in self.other_files:
            return []
        indexed = set(self.indexed_shards)
        return [f for f in self.files_on_disk if f.startswith(KNOWN_UNINDEXED) and f not in indexed]

    def stray_adapter_files(self) -> list[str]:
        """A PEFT adapter's weight files (`adapter_model*.safetensors` with its adapter_config.json) in a folder
        that also holds model weights: not an adapter folder, and a file the loaders may read as the model's."""
        if self.peft_adapter() is not None or "adapter_config.json" not in self.extra_json:
            return []
        adapter = [f for f in self.files_on_disk if f.startswith("adapter_model")]
        return adapter if len(adapter) < len(self.files_on_disk) else []

    def peft_adapter(self) -> dict[str, Any] | None:
        """The adapter_config.json of a PEFT adapter folder (`peft_type` set, and no config.json, or one beside
        adapter weights only: see `load_from_source`); None for a model checkpoint."""
        if self.config is not None and self.config.exists:
            return None
        return self.adapter_config()

    def adapter_config(self) -> dict[str, Any] | None:
        """adapter_config.json when it is PEFT's (a `peft_type` key: a broken value is still PEFT's file, and is
        reported as one), whatever else the folder holds."""
        doc = self.extra_json.get("adapter_config.json")
        data = doc.data if doc is not None else None
        return data if isinstance(data, dict) and "peft_type" in data else None

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.shards.values())


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config's language-model part: the nested `text_config`/`llm_config`/`language_config` of a VLM,
    with the outer keys as defaults; the config itself otherwise."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and sub:
            merged = dict(sub)
            for k, v in cfg.items():
                merged.setdefault(k, v)
            if isinstance(cfg.get("tie_word_embeddings"), bool):
                # The wrapper's flag decides: transformers ties by `self.config.tie_word_embeddings` of the
                # model it builds (the VLM's top-level config), whatever the text_config says; Qwen3-VL-30B-A3B
                # ships false at the top (lm_head stored) and true in its text_config.
                merged["tie_word_embeddings"] = cfg["tie_word_embeddings"]
            return merged
    blocks = cfg.get("layers_block_type")
    if "num_hidden_layers" not in cfg and isinstance(blocks, list) and blocks:
        # Nemotron-H in transformers 5 saves only its per-layer block types; the layer count is their length
        # (its config class ignores num_hidden_layers when both are given).
        return {**cfg, "num_hidden_layers": len(blocks)}
    return cfg


def _read_json(root: Path, name: str, limit: int = safe_io.MAX_CONFIG_BYTES) -> JsonDoc:
    """One JSON side file of the checkpoint, through the confinement layer (inside the tree, regular file,
    bounded size)."""
    doc = JsonDoc(path=str(root / name))
    try:
        real = safe_io.confine(root, name, what="the checkpoint")
        doc.data = safe_io.load_json(real, limit, name, **json_checks(name))
    except safe_io.UnsafePath as exc:
        doc.exists = exc.kind != "missing" or os.path.islink(root / name)
        doc.error = exc.reason if exc.kind in ("missing", "invalid", "too-large") else f"refused to open: {exc.reason}"
    return doc


def json_limit(name: str) -> int:
    """The size cap of one of a checkpoint's JSON files (the index may be large; configs are small)."""
    return safe_io.MAX_INDEX_BYTES if name.endswith(".index.json") else safe_io.MAX_CONFIG_BYTES


def json_checks(name: str) -> dict[str, Any]:
    """The index is read like the safetensors library reads a header: a repeated key is an error (a dict
    would keep the last silently), and its entries are capped before parsing (memory budget)."""
    if name.endswith(".index.json"):
        # + a few keys for "metadata" and its fields
        return {"unique_keys": True, "max_keys": safe_io.MAX_INDEX_ENTRIES + 64}
    return {}


def parse_json_doc(doc: JsonDoc, raw: bytes) -> JsonDoc:
    """Parse `raw` (already bounded by its json_limit) into `doc` with the same parser and messages as local
    files (a remote source's JSON); problems go to `doc.error`."""
    try:
        doc.data = safe_io.parse_json(raw, doc.path, **json_checks(os.path.basename(doc.path)))
    except safe_io.UnsafePath as exc:
        doc.error = exc.reason
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


if TYPE_CHECKING:  # only annotations use it (and typing is not imported at run time)

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
        return _read_json(self.root, name, json_limit(name))

    def read_headers(self, names: list[str]) -> dict[str, HeaderReport | PathRefusal]:
        out: dict[str, HeaderReport | PathRefusal] = {}
        bases = safe_io.allowed_bases(self.root)
        total = 0
        for name in names:
            real = _plain_file_in(bases[0], name)
            refusal: PathRefusal | None = None
            if real is None:
                real, refusal = resolve_inside(self.root, name, bases)
            if refusal is not None:
                out[name] = refusal
                continue
            if total > MAX_CHECKPOINT_TENSORS:
                # Memory grows with the tensors held (docs/security.md): shards past the cap are not parsed.
                report = HeaderReport(path=str(real))
                report.problems.append(
                    HeaderProblem(
                        "TooManyTensors",
                        f"not read: the shards before it already hold {total} tensors, "
                        f"more than the {MAX_CHECKPOINT_TENSORS} weightcheck reads in one checkpoint",
                    )
                )
                out[name] = report
                continue
            report = read_header(real)  # type: ignore[arg-type]
            total += len(report.tensors)
            out[name] = report
        return out


def _plain_file_in(real_root: Path, name: str) -> Path | None:
    """`resolve_inside`'s answer for the usual shard, with one lstat instead of a walk up the whole path: a plain
    file name (no separator, not `.`/`..`, no NUL) that is a regular file, not a symlink, in the resolved
    root resolves to itself there. None for anything else: the caller then asks `resolve_inside`, which
    decides and words every refusal. 163 shards: ~7 ms of `resolve_inside` become ~1 ms."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        return None
    path = real_root / name
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    return path if stat.S_ISREG(mode) else None


def load_checkpoint(target: str | os.PathLike[str] | FileSource) -> Checkpoint:
    """Load a checkpoint directory (or a single .safetensors / config.json file, or a `FileSource`)
    header-only."""
    if not isinstance(target, (str, os.PathLike)):
        return load_from_source(target)
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
    if not path.is_dir():
        return Checkpoint(root=path)
    return load_from_source(LocalSource(path))


# Pickled weight files: named in findings and notes, never opened.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")

# JSON files read besides config.json and the index (each whole, each size-capped).
EXTRA_JSON = ("hf_quant_config.json", "generation_config.json", "adapter_config.json")


def load_from_source(source: FileSource) -> Checkpoint:
    ckpt = Checkpoint(root=source.root, label=source.label)
    entries = source.entries()
    ckpt.files_on_disk = [e for e in entries if e.endswith(".safetensors")]
    ckpt.other_files = [e for e in entries if not e.endswith(".safetensors")]
    ckpt.config = source.read_json(CONFIG_NAME)
    for extra in EXTRA_JSON:
        if extra in entries:
            doc = ckpt.extra_json[extra] = source.read_json(extra)
            if doc.error and doc.error.startswith("refused to open: "):
                # No rule reads these files' errors; WC104 reports the refusal (config/index have their own).
                ckpt.refused.append(PathRefusal(extra, doc.error.removeprefix("refused to open: "), "not-regular"))
    if INDEX_NAME in entries:
        ckpt.index = source.read_json(INDEX_NAME)
        _parse_index(ckpt)
    if (
        ckpt.config is not None
        and ckpt.config.exists
        and ckpt.files_on_disk
        and ckpt.index is None
        and all(f.startswith("adapter_model") for f in ckpt.files_on_disk)
        and ckpt.adapter_config() is not None
    ):
        # A PEFT adapter folder that also holds the base model's config.json (some trainers copy it there): the
        # config describes the base model, not these tensors, so the adapter is checked as one without it.
        ckpt.base_config, ckpt.config = ckpt.config, None

    # Open every shard named by the index plus every .safetensors file present, each once.
    # A dict, not a list: an index naming 10^5 distinct shards must not cost a quadratic membership test.
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
    if set(map(type, weight_map.values())) <= {str}:  # one C-level pass over DeepSeek-V3's 92k values
        clean = weight_map
    else:
        clean = {k: v for k, v in weight_map.items() if isinstance(v, str)}
    ckpt.weight_map = clean
    ckpt.indexed_shards = list(dict.fromkeys(clean.values()))
