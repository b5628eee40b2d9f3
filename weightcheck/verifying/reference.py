"""The reference a sync is checked against: a safetensors checkpoint (hashed here, in the records' digest
algorithm) or the trainer's manifest parts (merged; parts whose ids lack their rank's offset relabelled by
`weightcheck.verifying.relabel`). Problems with the reference are returned as (rule, message, file) for the
caller to report (WC721); nothing here renders or reports."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck.digest import SHA256, ManifestError, TensorDigest
from weightcheck.rules import Rule
from weightcheck.rules.verify import SYNC_REFERENCE_INVALID
from weightcheck.structure import EXPERT_COUNT_KEYS
from weightcheck.verifying import _names
from weightcheck.verifying.relabel import duplicate_relabelling, part_relabelling


class ReferenceError(ValueError):
    """The reference cannot be used at all; the message says why."""


@dataclass
class Reference:
    label: str
    kind: str  # "checkpoint" | "manifest"
    digests: dict[str, TensorDigest]
    num_layers: int | None = None
    num_experts: int | None = None
    trainer: dict[str, Any] = field(default_factory=dict)
    # name → sending trainer ranks ("pp_rank 1"), known for manifest references
    origin: dict[str, str] = field(default_factory=dict)
    # manifest names relabelled because their part's ids lack the stage offset: true name → sent name
    relabelled: dict[str, str] = field(default_factory=dict)
    problems: list[tuple[Rule, str, str | None]] = field(default_factory=list)  # (rule, message, file)
    store: Any = None  # TensorStore of a checkpoint reference (values for WC730)
    # Checkpoint references: the digests per algorithm (`digests` is one of them); filled on demand.
    variants: dict[str, dict[str, TensorDigest]] = field(default_factory=dict)
    _by_digest: dict[TensorDigest, list[str]] | None = None

    @property
    def algorithms(self) -> set[str]:
        return {digest.algorithm for digest in self.digests.values()}

    def in_algorithm(self, algorithm: str) -> Reference:
        """This reference with digests of `algorithm`: a checkpoint is re-hashed (once) from its data; a
        manifest has no data, so it is returned as it is (its digests then compare as not comparable)."""
        if self.algorithms <= {algorithm}:
            return self
        if algorithm not in self.variants and self.store is not None:
            digests, _ = _digest_store(self.store, list(self.digests), (algorithm,))
            self.variants[algorithm] = digests[algorithm]
        if algorithm not in self.variants:
            return self
        import dataclasses

        return dataclasses.replace(self, digests=self.variants[algorithm], _by_digest=None)

    def names_with(self, digest: TensorDigest) -> list[str]:
        if self._by_digest is None:
            index: dict[TensorDigest, list[str]] = defaultdict(list)
            for name, value in self.digests.items():
                index[value].append(name)
            self._by_digest = dict(index)
        return self._by_digest.get(digest, [])


def _digest_store(
    store: Any, names: Sequence[str], algorithms: Sequence[str], threads: int | None = None
) -> tuple[dict[str, dict[str, TensorDigest]], dict[str, str]]:
    """`({algorithm: {name: digest}}, {name: why unreadable})`: every algorithm in one pass per tensor,
    tensors hashed in parallel threads (both hashes release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from weightcheck.digest import digest_stored
    from weightcheck.tensors import TensorReadError

    def digest(name: str) -> tuple[str, list[TensorDigest] | str]:
        try:
            return name, [digest_stored(store, name, algorithm) for algorithm in algorithms]
        except (TensorReadError, OSError, ValueError) as exc:
            return name, f"{exc}"
        finally:
            store.release(name)

    out: dict[str, dict[str, TensorDigest]] = {algorithm: {} for algorithm in algorithms}
    failed: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as pool:
        for name, value in pool.map(digest, names):
            if isinstance(value, str):
                failed[name] = value
                continue
            for item in value:
                out[item.algorithm][name] = item
    return out, failed


def load_checkpoint_reference(
    path: Path, threads: int | None = None, algorithms: Sequence[str] = (SHA256,)
) -> Reference:
    """Digests of every readable tensor of a safetensors checkpoint, in each of `algorithms` (the first is
    `Reference.digests`; the others are `Reference.in_algorithm` views), hashed in parallel threads."""
    from weightcheck.digest import check_algorithm
    from weightcheck.structure import config_int
    from weightcheck.tensors import TensorStore

    wanted = list(dict.fromkeys(check_algorithm(a) for a in algorithms)) or [SHA256]
    store = TensorStore.open(path)
    names = store.names()
    if not names and not store.unreadable():
        store.close()
        raise ReferenceError(f"{path}: no safetensors tensors to compare against")
    variants, failed = _digest_store(store, names, wanted, threads)
    digests = variants[wanted[0]]
    problems: list[tuple[Rule, str, str | None]] = [
        (SYNC_REFERENCE_INVALID, f"reference tensor {name} cannot be read: {why}", None) for name, why in failed.items()
    ]
    for name, reason in sorted(store.unreadable().items()):
        problems.append((SYNC_REFERENCE_INVALID, f"reference tensor {name} cannot be read: {reason}", None))
    cfg = store.ckpt.text_config()
    layers_guess, experts_guess = _names.infer_counts(digests)
    return Reference(
        label=str(path),
        kind="checkpoint",
        digests=digests,
        num_layers=config_int(cfg, ("num_hidden_layers", "num_layers", "n_layer")) or layers_guess,
        num_experts=config_int(cfg, EXPERT_COUNT_KEYS) or experts_guess,
        problems=problems,
        store=store,
        variants=variants,
    )


def load_manifest_reference(path: Path) -> Reference:
    """Merge trainer manifest parts; parts whose layer/expert ids lack their rank's offset are relabelled."""
    from weightcheck.manifest import read_manifest_parts

    try:
        parts = read_manifest_parts(path)
    except ManifestError as exc:
        raise ReferenceError(str(exc)) from None
    trainer: dict[str, Any] = {}
    problems: list[tuple[Rule, str, str | None]] = []
    for part in parts:
        for key, value in part.trainer.items():
            if key in ("pp_rank", "ep_rank"):
                continue
            if key in trainer and trainer[key] != value:
                problems.append(
                    (
                        SYNC_REFERENCE_INVALID,
                        f"manifest parts disagree on trainer {key}: {trainer[key]} vs {value}",
                        None,
                    )
                )
            trainer.setdefault(key, value)
    names_all = [name for part in parts for name in part.digests]
    layers_guess, experts_guess = _names.infer_counts(names_all)
    num_layers = trainer.get("num_layers") or layers_guess
    num_experts = trainer.get("num_experts") or experts_guess
    digests: dict[str, TensorDigest] = {}
    origin: dict[str, str] = {}
    relabelled: dict[str, str] = {}
    for part in parts:
        rename = part_relabelling(part.digests, part.trainer, trainer, num_layers, num_experts)
        # A name sent twice by one part (a gathered stream, or two virtual stages of one rank, where one
        # sender forgot its offset): the earlier digest keeps the name, the later one is relabelled.
        resent, earlier = duplicate_relabelling(part, trainer, num_layers, num_experts, rename)
        rename.update(resent)
        items = [(n, d, False) for n, d in earlier.items()] + [(n, d, True) for n, d in part.digests.items()]
        for name, digest, latest in items:
            true_name = rename.get(name, name) if latest else name
            if true_name != name:
                relabelled[true_name] = name
            previous = digests.get(true_name)
            if previous is not None and not previous.comparable(digest):
                problems.append(
                    (
                        SYNC_REFERENCE_INVALID,
                        f"manifest parts use different digest algorithms for {true_name} ({previous.algorithm} and "
                        f"{digest.algorithm}): write every part with the same algorithm",
                        str(part.path),
                    )
                )
            elif previous is not None and previous != digest:
                problems.append(
                    (
                        SYNC_REFERENCE_INVALID,
                        f"manifest parts disagree on {true_name}: {origin.get(true_name, 'another part')} and "
                        f"{part.label()} "
                        "sent different bytes under this name",
                        str(part.path),
                    )
                )
            digests[true_name] = digest
            if part.trainer.get("pp_rank") is not None or part.trainer.get("ep_rank") is not None:
                origin[true_name] = part.label()
    return Reference(
        label=str(path),
        kind="manifest",
        digests=digests,
        num_layers=num_layers,
        num_experts=num_experts,
        trainer=trainer,
        origin=origin,
        relabelled=relabelled,
        problems=problems,
    )


def load_reference(
    path: str | os.PathLike[str], algorithms: Sequence[str] = (SHA256,), download: bool = False
) -> Reference:
    """A checkpoint directory/file (safetensors, hashed with each of `algorithms`) or a manifest (file, or
    folder of parts; its own algorithm). Raises ReferenceError."""
    from weightcheck.hub import HubError, resolve

    try:  # a repo id: its cached snapshot, or a download when allowed (digests need the tensor data)
        target = resolve(path, needs_data=True, download_ok=download, what="verify --against").path or Path(path)
    except HubError as exc:
        raise ReferenceError(str(exc)) from None
    if not target.exists():
        raise ReferenceError(f"{target}: no such file or directory")
    if target.is_dir():
        if any(target.glob("*.safetensors")) or (target / "model.safetensors.index.json").exists():
            return load_checkpoint_reference(target, algorithms=algorithms)
        return load_manifest_reference(target)
    if target.suffix == ".safetensors":
        return load_checkpoint_reference(target, algorithms=algorithms)
    return load_manifest_reference(target)
