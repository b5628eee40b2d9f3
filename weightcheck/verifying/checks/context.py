"""What every check of one sync of one engine sees: the records (a `SyncView`), the reference in the
records' digest algorithm, the trainer layout, the skip patterns, the baseline, and `add` for findings
(labelled with the sync, engine and weight version)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weightcheck.digest import SHA256, TensorDigest
from weightcheck.rules import Rule
from weightcheck.skiplist import first_match
from weightcheck.tap.records import SyncRecord, TensorEntry
from weightcheck.verifying.options import TrainerLayout
from weightcheck.verifying.reference import Reference
from weightcheck.verifying.sink import FindingSink
from weightcheck.verifying.state import StateHistory


def digest_of(entry: TensorEntry) -> TensorDigest | None:
    if entry.hexdigest is None or entry.dtype is None or entry.shape is None:
        return None
    return TensorDigest(entry.dtype, entry.shape, entry.hexdigest, entry.algorithm)


def param_key(name: str) -> str:
    """A name compared with parameter names: engines add or drop a leading `model.` (SGLang's Qwen3 adds it)."""
    return name[len("model.") :] if name.startswith("model.") else name


def untracked_keys(record: SyncRecord) -> set[str]:
    """Parameters of a rank whose writes the tap could not observe (`tracked: false`), as `param_key`s."""
    return {param_key(name) for name, param in record.params.items() if not param.tracked}


def rank_list(records: Sequence[SyncRecord]) -> str:
    labels = [r.rank_label() for r in records]
    return "; ".join(dict.fromkeys(labels))


@dataclass
class SyncView:
    seq: int
    engine: str
    records: list[SyncRecord]
    label: str  # "sync 3 (step-7)"

    @property
    def weight_version(self) -> str | None:
        versions = [r.weight_version for r in self.records if r.weight_version is not None]
        return Counter(versions).most_common(1)[0][0] if versions else None


class SyncContext:
    def __init__(
        self,
        view: SyncView,
        reference: Reference | None,
        findings: FindingSink,
        trainer: TrainerLayout,
        skip: Sequence[str],
        baseline: Mapping[tuple[int, int, int], set[str]],
        history: StateHistory | None = None,
        *,
        written_elsewhere: Iterable[str] = (),
        stream_owner: bool = True,
    ) -> None:
        self.view = view
        # Names another runner of the same engine (a draft model) wrote: not dropped by this one.
        self.written_elsewhere = set(written_elsewhere)
        # False for a draft runner: the stream (drops, content, reference) is judged on the target's records.
        self.stream_owner = stream_owner
        self.history = history
        # The reference in the records' algorithm (a checkpoint is re-hashed if need be); other algorithms
        # present in this sync (ranks configured differently) get their own view through `ref_for`.
        algorithms = Counter(e.algorithm for r in view.records for e in r.tensors if e.hexdigest is not None)
        primary = algorithms.most_common(1)[0][0] if algorithms else SHA256
        self.ref = reference.in_algorithm(primary) if reference is not None else None
        self.out = findings
        self.trainer = trainer.filled_from(reference.trainer) if reference is not None else trainer
        self.skip = list(skip)
        self.baseline = baseline
        self.file = f"sync-{view.seq:05d}" if view.seq >= 0 else view.records[0].path.name

    def ref_for(self, digest: TensorDigest | None) -> Reference:
        """The reference whose digests are comparable with `digest` (when the reference can provide them)."""
        assert self.ref is not None
        if digest is None or self.ref.algorithms <= {digest.algorithm}:
            return self.ref
        return self.ref.in_algorithm(digest.algorithm)

    def skipped(self, name: str) -> bool:
        return first_match(name, self.skip) is not None  # glob or `re:`, as diff reads allow-skip

    def add(self, rule: Rule, message: str, **kw: Any) -> None:
        """A finding of `rule` about this sync: the message prefixed with the sync's label, the details with
        its number, engine and weight version."""
        details = kw.pop("details", None) or {}
        details.setdefault("sync", self.view.seq)
        details.setdefault("engine", self.view.engine)
        if self.view.weight_version is not None:
            details.setdefault("weight_version", self.view.weight_version)
        kw.setdefault("file", self.file)
        self.out.add(rule, f"{self.view.label}: {message}", details=details, **kw)

    def rank_ranges(self) -> list[tuple[int, int] | None]:
        out: list[tuple[int, int] | None] = []
        for record in self.view.records:
            model = record.model
            start, end = model.get("start_layer"), model.get("end_layer")
            out.append((int(start), int(end)) if isinstance(start, int) and isinstance(end, int) else None)
        return out

    def num_layers(self) -> int | None:
        for record in self.view.records:
            value = record.model.get("num_hidden_layers")
            if isinstance(value, int):
                return value
        return self.ref.num_layers if self.ref is not None else None
