"""Trainer-side manifests: digests of the tensors a trainer sends, so every sync can be verified.

A training framework records, next to each weight push, the digest of every (name, tensor) it sends; the
engine-side tap records the digest of every (name, tensor) it receives; `weightcheck verify` compares the
two. Both digests are `weightcheck.digest.digest_tensor` (a hash of the bytes as safetensors stores them),
taken on the same bytes on both sides with the same algorithm: `algorithm=` defaults to
`weightcheck.digest.live_algorithm()`, the tap's rule (xxh3_128 when `xxhash` is installed,
`WEIGHTCHECK_DIGEST=sha256|xxh3_128` overrides), so a trainer and an engine with the same environment agree.
Records and a manifest of different algorithms cannot be compared: `weightcheck verify` says so (WC721)
rather than reporting every tensor as changed.

Each sending rank writes its own part (`manifest-pp1-ep0.json`): a Megatron pipeline stage knows only its
own layers. A part is the digest manifest format (`weightcheck.digest`, readable by `read_manifest`) plus
what a verifier needs to localise a wrong push::

    {"schema_version": "1.0", "kind": "weightcheck-manifest", "tensors": {name: {dtype, shape, xxh3_128}},
     "digest": "xxh3_128", "step": 7, "weight_version": "step-7", "created": 1.7e9,
     "trainer": {"pp_rank": 1, "pp_size": 2, "vp_size": null, "ep_rank": 0, "ep_size": 1,
                 "num_layers": 28, "num_experts": null, "first_stage_layers": null, "last_stage_layers": null,
                 "layout": null},
     "duplicates": [{"name": ..., "dtype": ..., "shape": [...], "xxh3_128": ...}]}

`duplicates` keeps earlier digests of a name this rank sent more than once (the last one is in `tensors`).

Usage, in the trainer's send loop::

    from weightcheck.manifest import ManifestWriter, manifest_part_path

    path = manifest_part_path("/shared/wc/manifests", weight_version, pp_rank=pp_rank, ep_rank=ep_rank)
    with ManifestWriter(path, weight_version=weight_version, pp_rank=pp_rank, pp_size=pp_size,
                        num_layers=num_layers) as manifest:
        engine.update_weights(manifest.wrap(named_tensors))   # digests each tensor as it is sent
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightcheck import safe_io
from weightcheck.digest import (
    ManifestError,
    TensorDigest,
    live_algorithm,
    manifest_document,
    parse_manifest,
)

if TYPE_CHECKING:
    import torch

TRAINER_KEYS = (
    "pp_rank",
    "pp_size",
    "vp_size",
    "ep_rank",
    "ep_size",
    "num_layers",
    "num_experts",
    "first_stage_layers",
    "last_stage_layers",
    "layout",
)
_MAX_TRAINER_INT = 1 << 20
_INT_KEYS = frozenset(TRAINER_KEYS) - {"layout"}

__all__ = [
    "ManifestError",
    "ManifestPart",
    "ManifestWriter",
    "manifest_part_path",
    "read_manifest_parts",
    "write_manifest",
]


def _safe_component(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100] or "_"


def manifest_part_path(
    root: str | os.PathLike[str], weight_version: str | int | None, *, pp_rank: int = 0, ep_rank: int = 0
) -> Path:
    """`root/<weight_version>/manifest-pp{pp_rank}-ep{ep_rank}.json`: one folder per push, one part per rank."""
    folder = Path(root) / _safe_component(str(weight_version if weight_version is not None else "latest"))
    return folder / f"manifest-pp{pp_rank}-ep{ep_rank}.json"


class ManifestWriter:
    """Collects digests of the tensors one trainer rank sends and writes its manifest part atomically."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        step: int | None = None,
        weight_version: str | int | None = None,
        pp_rank: int | None = None,
        pp_size: int | None = None,
        vp_size: int | None = None,
        ep_rank: int | None = None,
        ep_size: int | None = None,
        num_layers: int | None = None,
        num_experts: int | None = None,
        first_stage_layers: int | None = None,
        last_stage_layers: int | None = None,
        layout: str | None = None,
        algorithm: str | None = None,
    ) -> None:
        self.path = Path(path)
        # Resolved now (not per tensor): one manifest, one algorithm.
        self.algorithm = live_algorithm(algorithm)
        self.step = step
        self.weight_version = None if weight_version is None else str(weight_version)
        self.trainer: dict[str, Any] = {
            "pp_rank": pp_rank,
            "pp_size": pp_size,
            "vp_size": vp_size,
            "ep_rank": ep_rank,
            "ep_size": ep_size,
            "num_layers": num_layers,
            "num_experts": num_experts,
            "first_stage_layers": first_stage_layers,
            "last_stage_layers": last_stage_layers,
            "layout": layout,
        }
        self.digests: dict[str, TensorDigest] = {}
        self.duplicates: list[tuple[str, TensorDigest]] = []

    def add(self, name: str, tensor: torch.Tensor) -> TensorDigest:
        """Digest `tensor` now (before the sender may reuse its buffer) under `name`."""
        from weightcheck.digest import digest_tensor

        return self.add_digest(name, digest_tensor(tensor, self.algorithm))

    def add_digest(self, name: str, digest: TensorDigest) -> TensorDigest:
        """Record a digest taken elsewhere; it must use this manifest's algorithm (ValueError otherwise)."""
        if digest.algorithm != self.algorithm:
            raise ValueError(f"{name}: a {digest.algorithm} digest in a {self.algorithm} manifest")
        previous = self.digests.get(name)
        if previous is not None:
            self.duplicates.append((name, previous))
        self.digests[name] = digest
        return digest

    def add_many(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            self.add(name, tensor)

    def wrap(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass `(name, tensor)` pairs through unchanged, digesting each on the way."""
        for name, tensor in named_tensors:
            self.add(name, tensor)
            yield name, tensor

    def document(self) -> dict[str, Any]:
        doc = manifest_document(self.digests)
        doc["digest"] = self.algorithm  # informational: each entry names its algorithm itself
        doc["step"] = self.step
        doc["weight_version"] = self.weight_version
        doc["created"] = time.time()
        doc["trainer"] = dict(self.trainer)
        doc["duplicates"] = [{"name": name, **digest.as_dict()} for name, digest in self.duplicates]
        return doc

    def write(self) -> Path:
        """Write the part (temp file + rename: a reader sees all of it or nothing). Raises ManifestError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.document(), fh, indent=1)
                fh.write("\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ManifestError(f"cannot write manifest {self.path}: {exc.strerror or exc}") from None
        return self.path

    def __enter__(self) -> ManifestWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:  # a push that failed half-way must not leave a manifest claiming it was whole
            self.write()


def write_manifest(
    path: str | os.PathLike[str], named_tensors: Iterable[tuple[str, torch.Tensor]], **meta: Any
) -> Path:
    """Digest every `(name, tensor)` and write one manifest part; `meta` (`algorithm=` included) as for
    `ManifestWriter`."""
    writer = ManifestWriter(path, **meta)
    writer.add_many(named_tensors)
    return writer.write()


# ---- reading ---------------------------------------------------------------------------------------------


@dataclass
class ManifestPart:
    path: Path
    digests: dict[str, TensorDigest]
    trainer: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    weight_version: str | None = None
    duplicates: list[tuple[str, TensorDigest]] = field(default_factory=list)

    def label(self) -> str:
        bits = [f"{key} {self.trainer[key]}" for key in ("pp_rank", "ep_rank") if self.trainer.get(key) is not None]
        return ", ".join(bits) or self.path.name


def _parse_trainer(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError("'trainer' must be an object")
    out: dict[str, Any] = {}
    for key in TRAINER_KEYS:
        item = value.get(key)
        if item is None:
            continue
        bad_int = isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= _MAX_TRAINER_INT
        if key in _INT_KEYS and bad_int:
            # Bounded: layer counts and parallel sizes become ranges when parts are relabelled.
            raise ManifestError(f"trainer.{key} must be an integer from 0 to {_MAX_TRAINER_INT}, got {str(item)[:40]}")
        if key == "layout" and not isinstance(item, str):
            raise ManifestError("trainer.layout must be a string")
        out[key] = item
    return out


def read_manifest_part(path: str | os.PathLike[str]) -> ManifestPart:
    """Read one manifest (part or plain `weightcheck.digest` manifest). Raises ManifestError."""
    target = Path(path)
    try:
        # Through the confinement layer: inside its folder, a regular file, bounded size and depth.
        real = safe_io.confine(target.parent, target.name, what="the manifest folder")
        doc = safe_io.load_json(real, safe_io.MAX_MANIFEST_BYTES, name=str(target))
    except safe_io.UnsafePath as exc:
        what = "is not valid JSON" if exc.kind == "invalid" else "cannot be read"
        raise ManifestError(f"manifest {target} {what}: {exc.reason}") from None
    digests = parse_manifest(doc)
    step = doc.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ManifestError("'step' must be an integer")
    version = doc.get("weight_version")
    duplicates: list[tuple[str, TensorDigest]] = []
    raw_duplicates = doc.get("duplicates") or []
    if not isinstance(raw_duplicates, list):
        raise ManifestError("'duplicates' must be a list")
    for item in raw_duplicates:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ManifestError("each duplicate must be an object with a name")
        parsed = parse_manifest({**manifest_document({}), "tensors": {item["name"]: item}})
        duplicates.append((item["name"], parsed[item["name"]]))
    return ManifestPart(
        path=target,
        digests=digests,
        trainer=_parse_trainer(doc.get("trainer")),
        step=step,
        weight_version=None if version is None else str(version),
        duplicates=duplicates,
    )


def read_manifest_parts(path: str | os.PathLike[str]) -> list[ManifestPart]:
    """A manifest file, or every `*.json` manifest in a folder (one per trainer rank). Raises ManifestError."""
    target = Path(path)
    if target.is_dir():
        # Every `*.json` entry whatever its type: a FIFO or an escaping symlink is refused, not skipped.
        files = sorted(target / n for n in os.listdir(target) if n.endswith(".json") and not n.startswith("."))
        if not files:
            raise ManifestError(f"{target}: no manifest (*.json) files")
        return [read_manifest_part(p) for p in files]
    return [read_manifest_part(target)]
