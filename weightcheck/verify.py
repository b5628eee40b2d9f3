"""`weightcheck verify`: check what an engine received in each weight sync against what it should hold.

Inputs: the records the load_weights tap wrote (`weightcheck.tap`; one file per engine rank per sync) and a
reference: the Hugging Face checkpoint on disk (step 0) or the trainer-side manifest parts written with
`weightcheck.manifest` for the pushed step. Digests are the same function on both sides
(`weightcheck.digest`), taken on the same bytes with the same algorithm: a checkpoint reference is hashed
with the algorithm the records name (xxh3_128 or sha256); a manifest of another algorithm than the records
cannot be compared (it holds no data to re-hash) and is reported as such (WC721), never as mismatches.

Per sync and per engine (its rank records together):

* stream vs reference: missing (WC722), unexpected (WC723), duplicated (WC724), shifted layers with the
  trainer stage that sent them (WC725), shifted experts with the EP rank (WC726), mismatches classified
  (WC727 other data / dtype / shape / bytes; WC728 zeros; WC729 NaN/Inf; WC730 within rounding);
* engine side, no reference needed: names no rank wrote anywhere (WC731), parameters never written
  (WC732) or partly written (WC733), fused pairs split across calls (WC736), failed calls (WC739);
* consistency: missing rank records (WC734), ranks that received different bytes (WC735).

`verify()` returns a `Result` (same reporters and exit codes as lint). `check_weight_update_equal()` is the
entry point a training loop calls right after a push: it raises `WeightSyncError` carrying the report.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck import safe_io
from weightcheck.collapse import format_ranges, summarize
from weightcheck.digest import SHA256, ManifestError, TensorDigest
from weightcheck.findings import EXIT_FINDINGS, Finding, Location, Result, Severity
from weightcheck.rules import all_rules, matches_selector
from weightcheck.skiplist import first_match
from weightcheck.structure import EXPERT_COUNT_KEYS, QUANT_COMPANIONS, parse_index
from weightcheck.tap.records import (
    CallEntry,
    RecordError,
    SyncRecord,
    TensorEntry,
    bound_record_files,
    find_record_files,
    read_record,
    record_algorithm,
    scan_records,
)
from weightcheck.verify_state import StateHistory, check_dp_replicas, check_sync_state

# More missing ranks than this are not listed one by one (rank sizes come from untrusted records).
_MAX_MISSING_RANKS = 4096
_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
_FUSED_EXPERT_NAME = re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)(_bias|_scale)?$")
_FUSED_PAIRS = (("q_a_proj", "kv_a_proj_with_mqa"),)
_COMPANION_SUFFIXES = tuple(f".{c}" for c in QUANT_COMPANIONS)
# Rounding error (relative L2 of the difference) of one rounding to each dtype, with margin: the bound for
# "this is the same tensor, cast" (WC730). Integers must be exact.
_ROUNDING_REL_L2 = {"BF16": 2.0**-8, "F16": 2.0**-11, "F8_E4M3": 2.0**-4, "F8_E5M2": 2.0**-3, "F32": 2.0**-23}


# ---- options ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerLayout:
    """How the trainer that pushed the weights was parallelised (Megatron); None = unknown."""

    pp_size: int | None = None
    vp_size: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    layout: str | None = None
    ep_size: int | None = None

    def filled_from(self, meta: Mapping[str, Any]) -> TrainerLayout:
        """Fields not set here taken from trainer manifest metadata."""
        values = {key: getattr(self, key) for key in self.__dataclass_fields__}
        for key in values:
            if values[key] is None and meta.get(key) is not None:
                values[key] = meta[key]
        return TrainerLayout(**values)


class WeightSyncError(RuntimeError):
    """Raised by `check_weight_update_equal` when a sync is wrong; `.result` holds the findings, `.report`
    the rendered text."""

    def __init__(self, result: Result, report: str) -> None:
        super().__init__(report)
        self.result = result
        self.report = report


# ---- reference -------------------------------------------------------------------------------------------


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
    problems: list[tuple[str, str, str | None]] = field(default_factory=list)  # (code, message, file)
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


_TRANSPOSED_TEXT = "sent transposed: it equals the reference transposed (square, so its shape could not show it)"


def _layer_id(name: str) -> int | None:
    match = _LAYER.search(name)
    return parse_index(match.group(2)) if match else None


def _expert_id(name: str) -> int | None:
    match = _EXPERT.search(name)
    return parse_index(match.group(1)) if match else None


def _template(name: str) -> str:
    name = _LAYER.sub(lambda m: f"{m.group(1)}layers.{{L}}.", name, count=1)
    return _EXPERT.sub(".experts.{E}.", name, count=1)


def _with_layer(name: str, layer: int) -> str:
    return _LAYER.sub(lambda m: f"{m.group(1)}layers.{layer}.", name, count=1)


def _with_expert(name: str, expert: int) -> str:
    return _EXPERT.sub(f".experts.{expert}.", name, count=1)


def _infer_counts(names: Iterable[str]) -> tuple[int | None, int | None]:
    layers: set[int] = set()
    experts: set[int] = set()
    for name in names:
        layer, expert = _layer_id(name), _expert_id(name)
        if layer is not None:
            layers.add(layer)
        if expert is not None:
            experts.add(expert)
    return (max(layers) + 1 if layers else None), (max(experts) + 1 if experts else None)


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
    problems: list[tuple[str, str, str | None]] = [
        ("WC721", f"reference tensor {name} cannot be read: {why}", None) for name, why in failed.items()
    ]
    for name, reason in sorted(store.unreadable().items()):
        problems.append(("WC721", f"reference tensor {name} cannot be read: {reason}", None))
    cfg = store.ckpt.text_config()
    layers_guess, experts_guess = _infer_counts(digests)
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
    problems: list[tuple[str, str, str | None]] = []
    for part in parts:
        for key, value in part.trainer.items():
            if key in ("pp_rank", "ep_rank"):
                continue
            if key in trainer and trainer[key] != value:
                problems.append(("WC721", f"manifest parts disagree on trainer {key}: {trainer[key]} vs {value}", None))
            trainer.setdefault(key, value)
    names_all = [name for part in parts for name in part.digests]
    layers_guess, experts_guess = _infer_counts(names_all)
    num_layers = trainer.get("num_layers") or layers_guess
    num_experts = trainer.get("num_experts") or experts_guess
    digests: dict[str, TensorDigest] = {}
    origin: dict[str, str] = {}
    relabelled: dict[str, str] = {}
    for part in parts:
        rename = _part_relabelling(part.digests, part.trainer, trainer, num_layers, num_experts)
        # A name sent twice by one part (a gathered stream, or two virtual stages of one rank, where one
        # sender forgot its offset): the earlier digest keeps the name, the later one is relabelled.
        resent, earlier = _duplicate_relabelling(part, trainer, num_layers, num_experts, rename)
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
                        "WC721",
                        f"manifest parts use different digest algorithms for {true_name} ({previous.algorithm} and "
                        f"{digest.algorithm}): write every part with the same algorithm",
                        str(part.path),
                    )
                )
            elif previous is not None and previous != digest:
                problems.append(
                    (
                        "WC721",
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


def _part_relabelling(
    digests: Mapping[str, TensorDigest],
    part: Mapping[str, Any],
    trainer: Mapping[str, Any],
    num_layers: int | None,
    num_experts: int | None,
) -> dict[str, str]:
    """Names of a part that carry local ids (offset forgotten) → their global names."""
    from weightcheck.layout import MegatronPipeline, ep_rank_experts, infer_pp_offset_bug

    rename: dict[str, str] = {}
    pp_rank, pp_size = part.get("pp_rank"), trainer.get("pp_size")
    vp_size = trainer.get("vp_size")
    if pp_rank is not None and pp_size and pp_size > 1 and num_layers and vp_size and vp_size > 1:
        rename.update(_vpp_part_relabelling(digests, pp_rank, trainer, num_layers))
    elif pp_rank and pp_size and pp_size > 1 and num_layers and not vp_size:
        try:
            pipe = MegatronPipeline(
                num_layers,
                pp_size,
                first_stage_layers=trainer.get("first_stage_layers"),
                last_stage_layers=trainer.get("last_stage_layers"),
                layout=trainer.get("layout"),
            )
            observed = {lid for name in digests if (lid := _layer_id(name)) is not None}
            bug = infer_pp_offset_bug(observed, pipe.stage_layers(), stage=(pp_rank, 0))
        except ValueError:
            bug = None
        if bug is not None:
            for name in digests:
                lid = _layer_id(name)
                if lid is not None:
                    rename[name] = _with_layer(name, lid + bug.shift)
    ep_rank, ep_size = part.get("ep_rank"), trainer.get("ep_size")
    if ep_rank and ep_size and ep_size > 1 and num_experts and num_experts % ep_size == 0:
        own = ep_rank_experts(ep_rank, num_experts, ep_size)
        observed = {eid for name in digests if (eid := _expert_id(name)) is not None}
        if observed and observed == set(range(len(own))):
            for name in digests:
                base = rename.get(name, name)
                eid = _expert_id(base)
                if eid is not None:
                    rename[name] = _with_expert(base, eid + own.start)
    return rename


def _own_layers(part: Mapping[str, Any], trainer: Mapping[str, Any], num_layers: int) -> set[int] | None:
    """Global layer ids the part's pipeline rank builds (every virtual stage), None when not known."""
    from weightcheck.layout import MegatronPipeline

    pp_rank, pp_size = part.get("pp_rank"), trainer.get("pp_size")
    if pp_rank is None or not pp_size or pp_size <= 1:
        return None
    try:
        pipe = MegatronPipeline(
            num_layers,
            pp_size,
            trainer.get("vp_size"),
            trainer.get("first_stage_layers"),
            trainer.get("last_stage_layers"),
            trainer.get("layout"),
        )
        return {lid for key, ids in pipe.stage_layers().items() if key[0] == pp_rank for lid in ids}
    except ValueError:
        return None


def _vpp_part_relabelling(
    digests: Mapping[str, TensorDigest], pp_rank: int, trainer: Mapping[str, Any], num_layers: int
) -> dict[str, str]:
    """A part of a rank that builds several virtual stages: ids outside the rank's layers, while exactly
    one of its virtual stages sent nothing of its own, are that stage's ids without its offset."""
    from weightcheck.layout import MegatronPipeline, infer_pp_offset_bug

    try:
        pipe = MegatronPipeline(
            num_layers,
            trainer["pp_size"],
            trainer.get("vp_size"),
            trainer.get("first_stage_layers"),
            trainer.get("last_stage_layers"),
            trainer.get("layout"),
        )
        stages = {key: ids for key, ids in pipe.stage_layers().items() if key[0] == pp_rank}
    except ValueError:
        return {}
    observed = {lid for name in digests if (lid := _layer_id(name)) is not None}
    own = {lid for ids in stages.values() for lid in ids}
    extra = observed - own
    silent = [key for key, ids in stages.items() if ids and not set(ids) & observed]
    if not extra or len(silent) != 1:
        return {}
    bug = infer_pp_offset_bug(extra, pipe.stage_layers(), stage=silent[0])
    if bug is None:
        return {}
    return {
        name: _with_layer(name, lid + bug.shift)
        for name in digests
        if (lid := _layer_id(name)) is not None and lid in extra
    }


def _constant_shift(sent: set[int], missing: set[int]) -> int | None:
    if not sent or len(sent) != len(missing):
        return None
    a, b = sorted(sent), sorted(missing)
    shift = b[0] - a[0]
    return shift if shift and all(x + shift == y for x, y in zip(a, b, strict=True)) else None


def _duplicate_relabelling(
    part: Any,
    trainer: Mapping[str, Any],
    num_layers: int | None,
    num_experts: int | None,
    rename: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, TensorDigest]]:
    """Names one part sent twice, when shifting their ids by one constant lands exactly on the ids the part
    should hold and lacks: (later digest's name → true name, name → earlier digest). A stream gathered from
    every rank (or a rank's virtual stages in order) sends rank 0's tensors first, so the later copy is the
    one whose sender forgot its offset."""
    first: dict[str, TensorDigest] = {}
    counts: dict[str, int] = {}
    for name, digest in part.duplicates:
        counts[name] = counts.get(name, 0) + 1
        first.setdefault(name, digest)
    twice = {name for name, n in counts.items() if n == 1 and name in part.digests and name not in rename}
    if not twice:
        return {}, {}
    names = set(part.digests)
    out: dict[str, str] = {}
    if num_layers:
        own = _own_layers(part.trainer, trainer, num_layers)
        expected = own if own is not None else set(range(num_layers))
        present = {lid for name in names if (lid := _layer_id(name)) is not None}
        sent = {lid for name in twice if (lid := _layer_id(name)) is not None}
        shift = _constant_shift(sent, expected - present)
        if shift is not None:
            for name in twice:
                lid = _layer_id(name)
                if lid is not None and _with_layer(name, lid + shift) not in names:
                    out[name] = _with_layer(name, lid + shift)
    if num_experts and not out:
        present_e = {eid for name in names if (eid := _expert_id(name)) is not None}
        sent_e = {eid for name in twice if (eid := _expert_id(name)) is not None}
        shift = _constant_shift(sent_e, set(range(num_experts)) - present_e)
        if shift is not None:
            for name in twice:
                eid = _expert_id(name)
                if eid is not None and _with_expert(name, eid + shift) not in names:
                    out[name] = _with_expert(name, eid + shift)
    return out, {name: first[name] for name in out}


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


# ---- findings --------------------------------------------------------------------------------------------


class _Findings:
    def __init__(self, select: Sequence[str], ignore: Sequence[str]) -> None:
        rules = all_rules()
        self.rules = {code: r for code, r in rules.items() if r.command == "verify"}
        self.enabled = {
            code for code, r in self.rules.items() if matches_selector(r, select) and not matches_selector(r, ignore)
        }
        self.items: list[Finding] = []

    def add(
        self,
        code: str,
        message: str,
        *,
        file: str | None = None,
        tensor: str | None = None,
        module: str | None = None,
        count: int = 1,
        severity: Severity | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        if code not in self.enabled:
            return
        r = self.rules[code]
        self.items.append(
            Finding(
                code=code,
                name=r.name,
                severity=severity or r.severity,
                message=message,
                location=Location(file=file, tensor=tensor, module=module),
                count=count,
                details=details or {},
            )
        )


# ---- one sync of one engine --------------------------------------------------------------------------


def _digest_of(entry: TensorEntry) -> TensorDigest | None:
    if entry.hexdigest is None or entry.dtype is None or entry.shape is None:
        return None
    return TensorDigest(entry.dtype, entry.shape, entry.hexdigest, entry.algorithm)


def _rank_key(record: SyncRecord) -> tuple[int, int, int]:
    rank = record.rank
    return (int(rank.get("pp_rank", 0) or 0), int(rank.get("tp_rank", 0) or 0), int(rank.get("ep_rank", 0) or 0))


def _slot(record: SyncRecord) -> tuple[str, int, int, int]:
    """Runner and rank: a draft (MTP/NextN) runner's record in the same process is a slot of its own."""
    return (record.runner, *_rank_key(record))


def _param_key(name: str) -> str:
    """A name compared with parameter names: engines add or drop a leading `model.` (SGLang's Qwen3 adds it)."""
    return name[len("model.") :] if name.startswith("model.") else name


def _untracked_keys(record: SyncRecord) -> set[str]:
    """Parameters of a rank whose writes the tap could not observe (`tracked: false`), as `_param_key`s."""
    return {_param_key(name) for name, param in record.params.items() if not param.tracked}


def _rank_list(records: Sequence[SyncRecord]) -> str:
    labels = [r.rank_label() for r in records]
    return "; ".join(dict.fromkeys(labels))


@dataclass
class _SyncView:
    seq: int
    engine: str
    records: list[SyncRecord]
    label: str  # "sync 3 (step-7)"

    @property
    def weight_version(self) -> str | None:
        versions = [r.weight_version for r in self.records if r.weight_version is not None]
        return Counter(versions).most_common(1)[0][0] if versions else None


@dataclass
class _ShiftPair:
    sent: str
    true: str
    kind: str  # "layer" | "expert"
    delta: int  # true id − sent id


class _SyncChecker:
    def __init__(
        self,
        view: _SyncView,
        reference: Reference | None,
        findings: _Findings,
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
        # present in this sync (ranks configured differently) get their own view through `_ref_for`.
        algorithms = Counter(e.algorithm for r in view.records for e in r.tensors if e.hexdigest is not None)
        primary = algorithms.most_common(1)[0][0] if algorithms else SHA256
        self.ref = reference.in_algorithm(primary) if reference is not None else None
        self.out = findings
        self.trainer = trainer.filled_from(reference.trainer) if reference is not None else trainer
        self.skip = list(skip)
        self.baseline = baseline
        self.file = f"sync-{view.seq:05d}" if view.seq >= 0 else view.records[0].path.name

    def _ref_for(self, digest: TensorDigest | None) -> Reference:
        """The reference whose digests are comparable with `digest` (when the reference can provide them)."""
        assert self.ref is not None
        if digest is None or self.ref.algorithms <= {digest.algorithm}:
            return self.ref
        return self.ref.in_algorithm(digest.algorithm)

    def _skipped(self, name: str) -> bool:
        return first_match(name, self.skip) is not None  # glob or `re:`, as diff reads allow-skip

    def _add(self, code: str, message: str, **kw: Any) -> None:
        details = kw.pop("details", None) or {}
        details.setdefault("sync", self.view.seq)
        details.setdefault("engine", self.view.engine)
        if self.view.weight_version is not None:
            details.setdefault("weight_version", self.view.weight_version)
        kw.setdefault("file", self.file)
        self.out.add(code, f"{self.view.label}: {message}", details=details, **kw)

    # -- main -----------------------------------------------------------------------------------------
    def run(self) -> None:
        self._check_ranks()
        self._check_calls()
        if not self.stream_owner:
            self._check_params()
            return
        bypassed = False
        if self.history is not None:
            bypassed = check_sync_state(
                self.view.seq,
                self.view.engine,
                self.view.records,
                self.history,
                self._add,
                reference_kind=self.ref.kind if self.ref is not None else None,
                skipped=self._skipped,
            )
        effective, occurrences = self._streams()
        self._check_disagreement(occurrences)
        self._check_duplicates(occurrences)
        split = self._check_split_pairs()
        self._check_dropped(occurrences, split)
        self._check_params()
        self._check_quantization_casts()
        self._check_content(effective)
        if self.ref is not None and not bypassed:
            self._check_against_reference(effective, occurrences)

    # -- ranks and calls ---------------------------------------------------------------------------
    def _check_ranks(self) -> None:
        records = self.view.records
        sizes = records[0].rank
        tp_size = int(sizes.get("tp_size", 1) or 1)
        pp_size = int(sizes.get("pp_size", 1) or 1)
        present = {(int(r.rank.get("pp_rank", 0) or 0), int(r.rank.get("tp_rank", 0) or 0)) for r in records}
        if tp_size * pp_size > len(records) + _MAX_MISSING_RANKS:
            # Sizes no set of records could back (each record is one rank): say so, allocate nothing.
            self._add(
                "WC734",
                f"engine {self.view.engine} claims tp_size {tp_size} x pp_size {pp_size} ranks but only "
                f"{len(records)} records exist: rank coverage not checked",
                details={"missing_ranks": []},
            )
            return
        expected = {(p, t) for p in range(pp_size) for t in range(tp_size)}
        missing = sorted(expected - present)
        if missing:
            labels = ", ".join(f"pp_rank {p} tp_rank {t}" for p, t in missing[:8])
            more = f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""
            self._add(
                "WC734",
                f"no records from {labels}{more} of engine {self.view.engine} (tp_size {tp_size}, pp_size "
                f"{pp_size}): names owned by those ranks are not checked for drops",
                details={"missing_ranks": [list(m) for m in missing]},
            )

    def _check_calls(self) -> None:
        for record in self.view.records:
            if record.header["sync"].get("incomplete"):
                self._add(
                    "WC739",
                    f"the sync never ended on {record.rank_label()} (record flushed at shutdown): a partial update",
                    details={"record": record.path.name},
                )
            for call in record.calls:
                if call.error:
                    self._add(
                        "WC739",
                        f"load_weights call {call.call} raised on {record.rank_label()}: {call.error}; the engine "
                        "holds a partial update",
                        details={"call": call.call, "record": record.path.name},
                    )

    # -- streams ---------------------------------------------------------------------------------------
    def _streams(
        self,
    ) -> tuple[dict[str, tuple[TensorDigest | None, TensorEntry]], dict[str, list[tuple[SyncRecord, TensorEntry]]]]:
        """Per name: the effective (last) entry agreed by ranks, and every occurrence on every rank."""
        occurrences: dict[str, list[tuple[SyncRecord, TensorEntry]]] = defaultdict(list)
        for record in self.view.records:
            for entry in sorted(record.tensors, key=lambda e: e.seq):
                occurrences[entry.name].append((record, entry))
        effective: dict[str, tuple[TensorDigest | None, TensorEntry]] = {}
        for name, items in occurrences.items():
            last_per_rank: dict[int, TensorEntry] = {}
            for record, entry in items:
                last_per_rank[id(record)] = entry
            entry = next(iter(last_per_rank.values()))
            effective[name] = (_digest_of(entry), entry)
        return effective, occurrences

    def _check_disagreement(self, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> None:
        differing: list[str] = []
        for name, items in occurrences.items():
            last: dict[int, tuple[SyncRecord, TensorDigest | None]] = {}
            for record, entry in items:
                last[id(record)] = (record, _digest_of(entry))
            # Ranks that hashed with different algorithms cannot be told apart by their digests: compare each
            # algorithm's group on its own (and dtype/shape across all of them).
            digests = {d for _, d in last.values() if d is not None}
            by_algorithm = Counter(d.algorithm for d in digests)
            forms = {(d.dtype, d.shape) for d in digests}
            if any(n > 1 for n in by_algorithm.values()) or len(forms) > 1:
                differing.append(name)
        if differing:
            self._add(
                "WC735",
                f"ranks received different bytes for {summarize(differing)}",
                tensor=summarize(differing, limit=1),
                count=len(differing),
                details={"names": sorted(differing)},
            )

    def _check_duplicates(self, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> None:
        conflicting: list[str] = []
        identical: list[str] = []
        for name, items in occurrences.items():
            per_rank: dict[int, list[TensorEntry]] = defaultdict(list)
            for record, entry in items:
                per_rank[id(record)].append(entry)
            worst = max(per_rank.values(), key=len)
            if len(worst) < 2:
                continue
            digests = {_digest_of(e) for e in worst}
            (conflicting if len(digests) > 1 else identical).append(name)
        if conflicting:
            self._add(
                "WC724",
                f"{summarize(conflicting)} sent more than once with different contents (the engine keeps the last "
                "copy); two trainer ranks sent the same names",
                tensor=summarize(conflicting, limit=1),
                count=len(conflicting),
                details={"names": sorted(conflicting), "identical": False},
            )
        if identical:
            self._add(
                "WC724",
                f"{summarize(identical)} sent more than once with identical contents",
                tensor=summarize(identical, limit=1),
                count=len(identical),
                severity=Severity.WARNING,
                details={"names": sorted(identical), "identical": True},
            )

    # -- engine side ---------------------------------------------------------------------------------
    def _check_split_pairs(self) -> set[str]:
        split_names: set[str] = set()
        for record in self.view.records:
            calls_of: dict[str, set[int]] = defaultdict(set)
            wrote: dict[str, bool] = defaultdict(bool)
            for entry in record.tensors:
                calls_of[entry.name].add(entry.call)
                wrote[entry.name] |= bool(entry.wrote)
            for name in list(calls_of):
                for first, second in _FUSED_PAIRS:
                    if f".{first}." not in name:
                        continue
                    partner = name.replace(f".{first}.", f".{second}.")
                    if partner not in calls_of or calls_of[name] & calls_of[partner]:
                        continue
                    if wrote[name] or wrote[partner] or name in split_names:
                        continue
                    split_names.update((name, partner))
                    self._add(
                        "WC736",
                        f"{name} (call {format_ranges(calls_of[name])}) and {partner} (call "
                        f"{format_ranges(calls_of[partner])}) arrived in different load_weights calls; the engine "
                        "fuses them only within one call, so neither was written",
                        tensor=name,
                        details={"pair": [name, partner], "record": record.path.name},
                    )
        return split_names

    def _rank_ranges(self) -> list[tuple[int, int] | None]:
        out: list[tuple[int, int] | None] = []
        for record in self.view.records:
            model = record.model
            start, end = model.get("start_layer"), model.get("end_layer")
            out.append((int(start), int(end)) if isinstance(start, int) and isinstance(end, int) else None)
        return out

    def _num_layers(self) -> int | None:
        for record in self.view.records:
            value = record.model.get("num_hidden_layers")
            if isinstance(value, int):
                return value
        return self.ref.num_layers if self.ref is not None else None

    def _check_dropped(self, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]], split: set[str]) -> None:
        records = self.view.records
        pp_size = int(records[0].rank.get("pp_size", 1) or 1)
        pp_present = {int(r.rank.get("pp_rank", 0) or 0) for r in records}
        all_stages = all(p in pp_present for p in range(pp_size))  # stops at the first absent stage
        ranges = [r for r in self._rank_ranges() if r is not None]
        num_layers = self._num_layers()
        calls: dict[tuple[int, int], CallEntry] = {(id(r), c.call): c for r in records for c in r.calls}
        no_call = CallEntry(call=-1, names=0)
        dropped: dict[str, list[str]] = defaultdict(list)  # reason → names
        uncertain: list[str] = []
        unobserved: list[str] = []  # may have gone into a parameter whose writes the tap could not observe
        untracked = {id(r): _untracked_keys(r) for r in records}
        # The tensor each raising call was handing to a loader when it raised: its last consumed tensor.
        last_of_call: dict[tuple[int, int], int] = {}
        for record in records:
            for entry in record.tensors:
                key = (id(record), entry.call)
                last_of_call[key] = max(last_of_call.get(key, entry.seq), entry.seq)
        for name, items in occurrences.items():
            if name in split or self._skipped(name):
                continue
            if name in self.written_elsewhere or any(entry.wrote or entry.offrank for _, entry in items):
                continue
            if any(_param_key(name) in untracked[id(record)] for record, _ in items):
                continue  # its parameter's coverage is unknown (`tracked: false`): unknown, never "dropped"
            if name.endswith(_COMPANION_SUFFIXES) and self._companion_landed(name, occurrences):
                continue
            if any(entry.error and entry.dtype is None for _, entry in items):
                continue  # not a tensor: reported by the content checks
            layer = _layer_id(name)
            beyond = layer is not None and num_layers is not None and layer >= num_layers
            # Without every stage's record, the stage that owns this name may be one without records.
            owned_by_missing = layer is None or not any(start <= layer < end for start, end in ranges)
            if not beyond and not all_stages and owned_by_missing:
                continue
            call_of = [calls.get((id(record), entry.call), no_call) for record, entry in items]
            warned = [msg for call in call_of for msg in call.engine_warnings if name in msg]
            untraced = any(call.unattributed_writes for call in call_of)
            raised = [
                (call, last_of_call.get((id(record), entry.call)) == entry.seq)
                for (record, entry), call in zip(items, call_of, strict=True)
                if call.error
            ]
            if raised and not beyond:
                # Sent, and the engine raised (WC739): not a name the engine has no parameter for.
                call, on_it = next(((c, last) for c, last in raised if last), raised[0])
                error = str(call.error)[:160]
                what = (
                    "the engine raised while loading it"
                    if on_it
                    else "sent in a call that raised before it was written"
                )
                dropped[f"{what} (load_weights call {call.call}: {error}; see WC739)"].append(name)
                continue
            if beyond:
                reason = f"layer id beyond the model's {num_layers} layers"
            elif _FUSED_EXPERT_NAME.search(name):
                reason = "transformers-5 fused expert names; send per-expert checkpoint names"
            elif name.endswith(_COMPANION_SUFFIXES):
                reason = "quantized tensor for a parameter the engine holds unquantized"
            else:
                reason = "no parameter of the engine takes this name"
            reason += "; the engine logged a warning" if warned else "; silently, without a log line"
            if untraced and not beyond:
                uncertain.append(name)
            elif (
                not beyond
                and not warned
                and reason.startswith("no parameter")
                and any(untracked[id(record)] for record, _ in items)
            ):
                # Some parameters of this rank are untracked and the engine may rename names on the way in:
                # the name cannot be called dropped with certainty.
                unobserved.append(name)
            else:
                dropped[reason].append(name)
        for reason, names in dropped.items():
            self._add(
                "WC731",
                f"{summarize(names)} sent but written into no parameter on any rank ({reason})",
                tensor=summarize(names, limit=1),
                count=len(names),
                details={"names": sorted(names), "reason": reason},
            )
        if uncertain:
            self._add(
                "WC731",
                f"{summarize(uncertain)} sent but no write could be traced to them (the call also made writes the "
                "tap could not attribute: they may have been written through a derived tensor)",
                tensor=summarize(uncertain, limit=1),
                count=len(uncertain),
                severity=Severity.WARNING,
                details={"names": sorted(uncertain), "reason": "untraced"},
            )

        if unobserved:
            self._add(
                "WC731",
                f"{summarize(unobserved)} sent and no write traced to them, but this engine has parameters whose "
                "writes the tap cannot observe (`tracked: false`, no loader attribute and no default loader "
                "given: see `set_engine_hooks(EngineHooks(default_loader=...))`); unknown, not known dropped",
                tensor=summarize(unobserved, limit=1),
                count=len(unobserved),
                severity=Severity.INFO,
                details={"names": sorted(unobserved), "reason": "untracked-params"},
            )

    @staticmethod
    def _companion_landed(name: str, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> bool:
        """A companion `X.weight_scale_inv` whose `X.weight` went into parameter `P.weight`, on a rank that holds
        `P.weight_scale_inv` and wrote it in this sync: it landed there even when the tap could not trace the
        write by value (DeepSeek's loader concatenates the q_a/kv_a scales, tiny tensors whose values repeat
        across layers, and may write them from its thread pool long after they arrived)."""
        base, _, companion = name.rpartition(".")
        for record, entry in occurrences.get(f"{base}.weight", ()):
            for label in entry.wrote:
                param = label.split(":")[0]
                target = record.params.get(param[: -len("weight")] + companion) if param.endswith("weight") else None
                if target is not None and target.writes > 0:
                    return True
        return False

    def _check_params(self) -> None:
        never: dict[tuple[str, ...], list[SyncRecord]] = defaultdict(list)
        partial: list[tuple[SyncRecord, str, str]] = []
        for record in self.view.records:
            expected = self.baseline.get(_rank_key(record))
            names: list[str] = []
            for name, param in record.params.items():
                if not param.tracked or self._skipped(name):
                    continue
                if param.writes == 0:
                    if param.optional:  # e.g. KV-cache scales an FP8 checkpoint need not carry
                        continue
                    if expected is None or name in expected:
                        names.append(name)
                    continue
                if param.shards_expected and set(param.shards_expected) - set(param.shards_written):
                    lacking = sorted(set(param.shards_expected) - set(param.shards_written))
                    partial.append((record, name, f"shard {', '.join(lacking)} never written"))
                if param.experts_local and param.experts_written is not None:
                    lacking_experts = set(range(param.experts_local)) - set(param.experts_written)
                    if lacking_experts:
                        partial.append((record, name, f"local experts {format_ranges(lacking_experts)} never written"))
            if names:
                never[tuple(sorted(names))].append(record)
        for names, records in never.items():
            self._add(
                "WC732",
                f"{summarize(names)} received no data on {_rank_list(records)} (still holds what it held before)",
                tensor=summarize(names, limit=1),
                count=len(names),
                details={"params": list(names), "ranks": [r.rank for r in records]},
            )
        per_record: dict[tuple[str, int], tuple[SyncRecord, list[str]]] = {}
        for record, name, what in partial:
            per_record.setdefault((what, id(record)), (record, []))[1].append(name)
        grouped: dict[tuple[str, tuple[str, ...]], list[SyncRecord]] = defaultdict(list)
        for (what, _), (record, names) in per_record.items():
            grouped[(what, tuple(sorted(names)))].append(record)
        for (what, names), records in grouped.items():
            self._add(
                "WC733",
                f"{summarize(names)}: {what} on {_rank_list(records)}",
                tensor=summarize(names, limit=1),
                count=len(names),
                details={"params": list(names), "missing": what},
            )

    def _check_quantization_casts(self) -> None:
        """WC745: a loader copied FP8 codes into a float parameter, or a float tensor into an FP8 parameter."""
        casts: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # (from, to, param) → incoming names
        for record in self.view.records:
            for name, param in record.params.items():
                if not param.cast_from or self._skipped(name):
                    continue
                senders = {e.name for e in record.tensors if any(w.split(":")[0] == name for w in e.wrote)}
                for dtype in param.cast_from:
                    casts[(dtype, param.dtype or "?", name)] |= senders
        grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
        for source, target, name in casts:
            grouped[(source, target)].append(name)
        for (source, target), params in grouped.items():
            names = sorted({n for p in params for n in casts[(source, target, p)]})
            if source.startswith("F8_"):
                why = "FP8 codes that lose their scale: the engine holds this module unquantized (quant_config=None)"
            else:
                why = "rounded to FP8 with no scale: the trainer did not quantize a module the engine serves quantized"
            self._add(
                "WC745",
                f"{summarize(params)}: {source} tensor copied into the {target} parameter, {why}"
                + (f" (sent as {summarize(names)})" if names else ""),
                tensor=summarize(params, limit=1),
                count=len(params),
                details={"params": sorted(params), "names": names, "from": source, "to": target},
            )

    # -- content -----------------------------------------------------------------------------------------
    def _check_content(self, effective: Mapping[str, tuple[TensorDigest | None, TensorEntry]]) -> None:
        nonfinite = [name for name, (_, e) in effective.items() if e.nonfinite and not self._skipped(name)]
        if nonfinite:
            self._add(
                "WC729",
                f"{summarize(nonfinite)} hold NaN/Inf values",
                tensor=summarize(nonfinite, limit=1),
                count=len(nonfinite),
                details={"names": sorted(nonfinite), "counts": {n: effective[n][1].nonfinite for n in nonfinite}},
            )
        broken = [name for name, (_, e) in effective.items() if e.error and e.dtype is None]
        if broken:
            self._add(
                "WC727",
                f"{summarize(broken)} are not tensors ({effective[broken[0]][1].error})",
                tensor=summarize(broken, limit=1),
                count=len(broken),
                details={"names": sorted(broken), "class": "not-a-tensor"},
            )

    # -- against the reference ----------------------------------------------------------------------
    def _check_against_reference(
        self,
        effective: Mapping[str, tuple[TensorDigest | None, TensorEntry]],
        occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]],
    ) -> None:
        assert self.ref is not None
        ref = self.ref
        sent = {name for name in effective if not self._skipped(name)}
        expected = {name for name in ref.digests if not self._skipped(name)}
        shifts = self._find_shifts(occurrences)
        shifted_sent = {p.sent for p in shifts}
        shifted_true = {p.true for p in shifts}
        self._report_shifts(shifts)

        missing = sorted(expected - sent)
        explained = [n for n in missing if n in shifted_true]
        unexplained = [n for n in missing if n not in shifted_true]
        raised = [(record, call) for record in self.view.records for call in record.calls if call.error]
        if unexplained and raised:
            # The tap sees only what the engine consumed: after a call raised, the rest of its request was sent
            # and never consumed, which is not "never sent".
            record, call = raised[0]
            where = f"load_weights call {call.call} raised on {record.rank_label()} (WC739)"
            if ref.kind == "manifest":
                text = f"sent by the trainer (its manifest lists them) but never consumed by the engine: {where}"
            else:
                text = f"never received by the engine: {where}; sent after the tensor it raised on, or never sent"
            self._add(
                "WC722",
                f"{summarize(unexplained)} {text}",
                tensor=summarize(unexplained, limit=1),
                count=len(unexplained),
                details={"names": unexplained, "after_engine_error": True},
            )
        elif unexplained:
            self._add(
                "WC722",
                f"{summarize(unexplained)} never sent in this sync",
                tensor=summarize(unexplained, limit=1),
                count=len(unexplained),
                details={"names": unexplained},
            )
        if explained:
            self._add(
                "WC722",
                f"{summarize(explained)} never sent under their own names: their data arrived under shifted names "
                "(see WC725/WC726)",
                tensor=summarize(explained, limit=1),
                count=len(explained),
                details={"names": explained, "explained_by_shift": True},
            )
        extra = sorted(n for n in sent - set(ref.digests) if n not in shifted_sent)
        if extra:
            self._add(
                "WC723",
                f"{summarize(extra)} sent but not in the reference",
                tensor=summarize(extra, limit=1),
                count=len(extra),
                details={"names": extra},
            )
        mismatched: dict[str, list[str]] = defaultdict(list)
        messages: dict[str, str] = {}
        incomparable: dict[tuple[str, str], list[str]] = defaultdict(list)
        for name in sorted(sent & set(ref.digests)):
            digest, entry = effective[name]
            want = self._ref_for(digest).digests.get(name, ref.digests[name])
            if digest == want or name in shifted_sent or (entry.error and entry.dtype is None):
                continue  # equal, explained by a shift, or not a tensor at all (reported by the content checks)
            if (
                digest is not None
                and not digest.comparable(want)
                and (digest.dtype, digest.shape)
                == (
                    want.dtype,
                    want.shape,
                )
            ):
                incomparable[(digest.algorithm, want.algorithm)].append(name)
                continue  # nothing is known about these bytes: not a mismatch
            klass, message = self._classify(name, digest, want, entry)
            mismatched[klass].append(name)
            messages.setdefault(klass, message)
        for (mine, theirs), names in incomparable.items():
            self._add(
                "WC721",
                f"{summarize(names)} not compared: the records hash with {mine}, the reference manifest with "
                f"{theirs}, and a manifest holds no data to re-hash; record and write manifests with one algorithm "
                f"(WEIGHTCHECK_DIGEST={theirs} in the engine, or ManifestWriter(algorithm={mine!r}) in the trainer)",
                tensor=summarize(names, limit=1),
                count=len(names),
                details={"names": names, "records_digest": mine, "reference_digest": theirs},
            )
        for klass, names in mismatched.items():
            code = {"zeros": "WC728", "within-rounding": "WC730", "nonfinite": "WC729"}.get(klass, "WC727")
            if klass == "nonfinite":
                continue  # WC729 already reported from the tap's counts
            message = messages[klass] if len(names) == 1 else f"{summarize(names)}: {messages[klass]}"
            self._add(
                code,
                message,
                tensor=summarize(names, limit=1),
                count=len(names),
                details={"names": names, "class": klass},
            )

    def _classify(
        self, name: str, digest: TensorDigest | None, want: TensorDigest, entry: TensorEntry
    ) -> tuple[str, str]:
        assert self.ref is not None
        if digest is None:
            return "undigested", f"{name} could not be digested by the tap ({entry.error})"
        if entry.nonfinite:
            return "nonfinite", f"{name} holds {entry.nonfinite} NaN/Inf values"
        if entry.zeros:
            return "zeros", "all zeros, the reference is not"
        others = [n for n in self._ref_for(digest).names_with(digest) if n != name]
        if others:
            return f"data-of:{others[0]}", f"{name} carries the data of {others[0]}"
        if digest.shape != want.shape:
            return "shape", f"shape {list(digest.shape)}, reference {list(want.shape)}"
        values = self._compare_values(name, entry)
        if values is not None:
            return values
        if digest.dtype != want.dtype:
            return "dtype", f"sent as {digest.dtype}, reference {want.dtype} (bytes cannot match)"
        if self._transposed_reference(name, digest):
            return "transposed", _TRANSPOSED_TEXT
        return "bytes", f"bytes differ from the reference ({digest.algorithm})"

    def _transposed_reference(self, name: str, digest: TensorDigest) -> bool:
        """A square matrix sent transposed keeps its shape and dtype, so only its bytes differ: with the
        checkpoint's data at hand, its transposed digest says whether that is what happened."""
        store = self.ref.store if self.ref is not None else None
        if store is None or len(digest.shape) != 2 or digest.shape[0] != digest.shape[1] or digest.shape[0] < 2:
            return False
        try:
            from weightcheck.digest import digest_tensor

            transposed = digest_tensor(store.get(name).t().contiguous(), digest.algorithm)
        except Exception:  # unreadable or undigestable: "bytes differ" stays the answer
            return False
        finally:
            with contextlib.suppress(Exception):
                store.release(name)
        return transposed == digest

    def _compare_values(self, name: str, entry: TensorEntry) -> tuple[str, str] | None:
        """With kept tensors and a checkpoint reference: numeric comparison through weightcheck.compare."""
        if self.ref is None or self.ref.store is None or entry.tensor_key is None or entry.tensors_path is None:
            return None
        try:
            from weightcheck.compare.classify import classify
            from weightcheck.compare.engine import TRANSPOSED, compare_pair
            from weightcheck.compare.operands import PlainOperand
            from weightcheck.compare.policy import PolicyRule
            from weightcheck.tensors import TensorStore

            with TensorStore.open(entry.tensors_path) as sent_store:
                a = PlainOperand(self.ref.store, name)
                b = PlainOperand(sent_store, entry.tensor_key, name=name)
                # One ULP of each side's format: a faithful rounding of the reference passes, nothing else.
                rule = PolicyRule(pattern="", tier="ulp")
                verdict = compare_pair(a, b, rule)
                klass = None if verdict.passed else classify(a, b, verdict, rule).klass
                a.release()
                b.release()
        except Exception:  # unreadable kept tensors: fall back to the digest-only classification
            return None
        if verdict.passed:
            return "within-rounding", f"differs only within rounding ({verdict.message})"
        if klass == TRANSPOSED:  # diff's classifier, on the kept tensor
            return "transposed", _TRANSPOSED_TEXT
        return "values", f"values differ: {verdict.message}"

    # -- shifts --------------------------------------------------------------------------------------------
    def _find_shifts(self, occurrences: Mapping[str, list[tuple[SyncRecord, TensorEntry]]]) -> list[_ShiftPair]:
        assert self.ref is not None
        ref = self.ref
        candidates: list[tuple[str, list[_ShiftPair]]] = []
        seen: set[tuple[str, TensorDigest]] = set()
        for name, items in occurrences.items():
            for _, entry in items:
                digest = _digest_of(entry)
                if digest is None or (name, digest) in seen:
                    continue
                ref = self._ref_for(digest)
                if ref.digests.get(name) == digest:
                    continue
                seen.add((name, digest))
                options: list[_ShiftPair] = []
                template, layer, expert = _template(name), _layer_id(name), _expert_id(name)
                for other in ref.names_with(digest):
                    if other == name or _template(other) != template:
                        continue
                    other_layer, other_expert = _layer_id(other), _expert_id(other)
                    # An id beyond the bounded digit count parses as None: never a shift partner.
                    layer_shift = layer is not None and other_layer is not None and other_layer != layer
                    expert_shift = expert is not None and other_expert is not None and other_expert != expert
                    if layer_shift and other_expert == expert:
                        options.append(_ShiftPair(name, other, "layer", other_layer - layer))  # type: ignore[operator]
                    elif expert_shift and other_layer == layer:
                        options.append(_ShiftPair(name, other, "expert", other_expert - expert))  # type: ignore[operator]
                if options:
                    candidates.append((name, options))
        # Identical tensors (norms at init) match several layers: keep, per tensor, the shift most tensors share.
        votes = Counter((p.kind, p.delta) for _, options in candidates for p in options)
        chosen: list[_ShiftPair] = []
        for _, options in candidates:
            chosen.append(max(options, key=lambda p: (votes[(p.kind, p.delta)], -abs(p.delta))))
        return chosen

    def _report_shifts(self, shifts: Sequence[_ShiftPair]) -> None:
        groups: dict[tuple[str, int], list[_ShiftPair]] = defaultdict(list)
        for pair in shifts:
            groups[(pair.kind, pair.delta)].append(pair)
        for (kind, delta), pairs in sorted(groups.items()):
            if kind == "layer":
                self._report_layer_shift(delta, pairs)
            else:
                self._report_expert_shift(delta, pairs)

    def _shift_text(self, delta: int) -> str:
        return f"shifted by −{delta}" if delta > 0 else f"shifted by +{-delta}"

    def _report_layer_shift(self, delta: int, pairs: Sequence[_ShiftPair]) -> None:
        sent_ids = sorted({_layer_id(p.sent) for p in pairs if _layer_id(p.sent) is not None})  # type: ignore[type-var]
        true_ids = sorted({_layer_id(p.true) for p in pairs if _layer_id(p.true) is not None})  # type: ignore[type-var]
        stage, how, bug = self._sending_stage(sent_ids, true_ids, [p.true for p in pairs])
        sent_names = sorted({p.sent for p in pairs})
        where = f" from {stage}" if stage else ""
        text = f"layers {format_ranges(sent_ids)}{where} {self._shift_text(delta)}: they hold the data of layers "
        text += f"{format_ranges(true_ids)}"
        if stage and bug is not None and bug.forgot_offset:
            text += f"; {stage} sent its local layer ids without its offset {delta}"
        elif stage:
            text += f"; {stage} applied a wrong layer offset"
        text += f" ({how})"
        details: dict[str, Any] = {
            "shift": -delta,
            "sent_layers": sent_ids,
            "true_layers": true_ids,
            "stage": stage,
            "stage_inferred_from": how,
            "forgot_offset": bool(bug.forgot_offset) if bug is not None else None,
            "names": sent_names,
        }
        self._add("WC725", text, tensor=summarize(sent_names, limit=1), count=len(sent_names), details=details)

    def _sending_stage(
        self, sent_ids: list[int], true_ids: list[int], true_names: Sequence[str]
    ) -> tuple[str | None, str, Any]:
        """(stage label, how it was inferred, OffsetBug or None)."""
        from weightcheck.layout import MegatronPipeline, infer_pp_offset_bug

        assert self.ref is not None
        origins = {self.ref.origin[n] for n in true_names if n in self.ref.origin}
        num_layers = self.ref.num_layers
        trainer = self.trainer
        pipe: MegatronPipeline | None = None
        how = "from the trainer layout"
        assumed = 0  # stages of an assumed even split (no layout known)
        if num_layers:
            try:
                if trainer.pp_size:
                    pipe = MegatronPipeline(
                        num_layers,
                        trainer.pp_size,
                        trainer.vp_size,
                        trainer.first_stage_layers,
                        trainer.last_stage_layers,
                        trainer.layout,
                    )
                elif sent_ids == list(range(len(true_ids))) and num_layers % len(true_ids) == 0 and len(true_ids) > 0:
                    assumed = num_layers // len(true_ids)
                    pipe = MegatronPipeline(num_layers, assumed)
                    how = (
                        f"assuming an even split over {num_layers // len(true_ids)} stages; pass --trainer-pp to be "
                        "exact"
                    )
            except ValueError:
                pipe = None
        if pipe is not None:
            try:
                owners = {pipe.owner(t) for t in true_ids}
            except ValueError:
                owners = set()
            if len(owners) == 1:
                key = owners.pop()
                bug = infer_pp_offset_bug(sent_ids, pipe.stage_layers(), stage=key)
                label = f"pp_rank {key[0]}" + (f" vp_stage {key[1]}" if pipe.num_vp_stages > 1 else "")
                if assumed > 3 and any(assumed % vp == 0 for vp in range(2, assumed // 2 + 1)) and not origins:
                    # As many stages could be fewer ranks with virtual stages (pp 2 × vp 2 for 4): naming
                    # `pp_rank 3` could name a rank the run does not have, so name the stage by its layers.
                    label = f"the stage holding layers {format_ranges(true_ids)}"
                    how = (
                        f"{label} is pp_rank {key[0]} of an even split into {assumed} stages, or a virtual stage of "
                        "fewer ranks; pass --trainer-pp and --trainer-vp to name it"
                    )
                if len(origins) == 1:
                    how = f"the manifest part of {next(iter(origins))}"
                return label, how, bug
        if len(origins) == 1:
            return next(iter(origins)), "from the trainer manifest", None
        return None, "the sending stage could not be inferred; pass --trainer-pp", None

    def _report_expert_shift(self, delta: int, pairs: Sequence[_ShiftPair]) -> None:
        from weightcheck.layout import ep_owner

        assert self.ref is not None
        sent_ids = sorted({e for p in pairs if (e := _expert_id(p.sent)) is not None})
        true_ids = sorted({e for p in pairs if (e := _expert_id(p.true)) is not None})
        layers = sorted({lid for p in pairs if (lid := _layer_id(p.sent)) is not None})
        num_experts = self.ref.num_experts
        ep_size = self.trainer.ep_size
        how = "from the trainer layout"
        local_ids = bool(true_ids) and sent_ids == list(range(len(true_ids)))
        if not ep_size and num_experts and local_ids and num_experts % len(true_ids) == 0:
            ep_size = num_experts // len(true_ids)
            how = f"assuming {ep_size} EP ranks of {len(true_ids)} experts; pass --trainer-ep to be exact"
        rank_label = None
        if ep_size and num_experts:
            try:
                owners = {ep_owner(t, num_experts, ep_size)[0] for t in true_ids}
            except ValueError:
                owners = set()
            if len(owners) == 1:
                rank_label = f"ep_rank {owners.pop()}"
        origins = {self.ref.origin[p.true] for p in pairs if p.true in self.ref.origin}
        if rank_label is None and len(origins) == 1:
            rank_label, how = next(iter(origins)), "from the trainer manifest"
        sent_names = sorted({p.sent for p in pairs})
        where = f" from {rank_label}" if rank_label else ""
        text = (
            f"experts {format_ranges(sent_ids)}{where} {self._shift_text(delta)} (layers {format_ranges(layers)}): "
            f"they hold the data of experts {format_ranges(true_ids)}"
        )
        if rank_label and sent_ids == list(range(len(true_ids))):
            text += f"; {rank_label} sent its local expert ids without its offset {delta}"
        if rank_label:
            text += f" ({how})"
        details = {
            "shift": -delta,
            "sent_experts": sent_ids,
            "true_experts": true_ids,
            "layers": layers,
            "ep_rank": rank_label,
            "names": sent_names,
        }
        self._add("WC726", text, tensor=summarize(sent_names, limit=1), count=len(sent_names), details=details)


# ---- driver ---------------------------------------------------------------------------------------------


def _explains(missing: str, param: str) -> bool:
    """A tensor never sent (WC722) explains an engine parameter that received nothing (WC732): the same name
    or the same module leaf (a draft model's `model.eh_proj.weight` from `model.layers.3.eh_proj.weight`), or
    a fused parameter of the same layer (`qkv_proj.weight` from `q_proj.weight`, experts' `w13_weight`)."""
    if missing == param:
        return True
    m_layer, p_layer = _layer_id(missing), _layer_id(param)
    if m_layer is not None and p_layer is not None and m_layer != p_layer:
        return False
    if missing.split(".")[-2:] == param.split(".")[-2:]:
        return True

    # Same layer, same kind of leaf (`weight` and `w13_weight`; `weight_scale` and `w2_weight_scale`): the
    # engine fuses what the trainer sends split.
    def kind(name: str) -> str:
        return name.rsplit(".", 1)[-1].rsplit("_", 1)[-1]

    return m_layer is not None and m_layer == p_layer and kind(missing) == kind(param)


def _fold_never_written(items: list[Finding], start: int) -> None:
    """One defect, one finding: the parameters a sync left unwritten (WC732) because their tensors were never
    sent (WC722) are that WC722's follow-on (`related`, shown with -v and in JSON), not a second error."""
    sync = items[start:]
    missing = [f for f in sync if f.code == "WC722"]
    if not missing:
        return
    folded: list[Finding] = []
    for never in (f for f in sync if f.code == "WC732"):
        params = [p for p in never.details.get("params", []) if isinstance(p, str)]
        for root in missing:
            names = [n for n in root.details.get("names", []) if isinstance(n, str)]
            if params and all(any(_explains(n, p) for n in names) for p in params):
                root.related.append(never)
                root.severity = max(root.severity, never.severity)
                folded.append(never)
                break
    if folded:
        items[start:] = [f for f in sync if not any(f is x for x in folded)]


def _baselines(records: Sequence[SyncRecord]) -> dict[tuple[str, tuple[str, int, int, int]], tuple[int, set[str]]]:
    """Per (engine, rank): the params written in its earliest recorded sync."""
    out: dict[tuple[str, tuple[int, int, int]], tuple[int, set[str]]] = {}
    for record in records:
        key = (record.engine, _slot(record))
        written = {name for name, p in record.params.items() if p.writes > 0 or not p.tracked}
        if key not in out or record.seq < out[key][0]:
            out[key] = (record.seq, written)
    return out


def _merge_records(records: Sequence[SyncRecord]) -> SyncRecord:
    """One rank's consecutive implicit syncs of one weight version (SGLang without the session API makes every
    bucket its own request; a custom engine calls `load_weights` once per bucket) as one sync: calls and
    tensors renumbered in order, coverage summed."""
    ordered = sorted(records, key=lambda r: r.seq)
    if len(ordered) == 1:
        return ordered[0]
    import copy

    first = ordered[0]
    header = copy.deepcopy(first.header)
    header["sync"]["merged_seqs"] = [r.seq for r in ordered]
    header["sync"]["incomplete"] = any(r.header["sync"].get("incomplete") for r in ordered)
    calls: list[CallEntry] = []
    tensors: list[TensorEntry] = []
    params: dict[str, Any] = {}
    for record in ordered:
        call_offset, seq_offset = len(calls), len(tensors)
        for call in record.calls:
            calls.append(copy.copy(call))
            calls[-1].call += call_offset
        for entry in sorted(record.tensors, key=lambda e: e.seq):
            moved = copy.copy(entry)
            moved.call += call_offset
            moved.seq += seq_offset
            tensors.append(moved)
        for name, param in record.params.items():
            merged = params.get(name)
            if merged is None:
                params[name] = copy.deepcopy(param)
                continue
            merged.writes += param.writes
            merged.tracked = merged.tracked or param.tracked
            merged.shards_written = sorted(set(merged.shards_written) | set(param.shards_written))
            if param.experts_written is not None:
                merged.experts_written = sorted(set(merged.experts_written or []) | set(param.experts_written))
            merged.cast_from = sorted(set(merged.cast_from) | set(param.cast_from))
            merged.optional = merged.optional and param.optional
    if ordered[-1].states:  # the state after the last bucket
        header["state_digest"] = ordered[-1].header.get("state_digest")
    return SyncRecord(
        path=first.path, header=header, calls=calls, tensors=tensors, params=params, states=ordered[-1].states
    )


def _mergeable(record: SyncRecord) -> bool:
    """Syncs opened implicitly (one update request, or one bare `load_weights` call) rather than by a session
    or `tap.sync`: several of them carrying one weight version are one push."""
    source = str(record.header["sync"].get("source") or "")
    return (source.startswith("request") or source == "call") and record.weight_version is not None


def _logical_syncs(records: Sequence[SyncRecord]) -> dict[tuple[int, str], list[SyncRecord]]:
    """Group records into syncs per engine: by seq, except that a run of consecutive implicit syncs (update
    requests without a session, bare `load_weights` calls) of one rank carrying one weight version is one
    sync (merged per rank): a push made of many buckets is checked as a whole. A sync of another kind or
    version in between ends the run."""
    per_rank: dict[tuple[str, tuple[str, int, int, int]], list[SyncRecord]] = defaultdict(list)
    for record in records:
        per_rank[(record.engine, _slot(record))].append(record)
    groups: dict[tuple[int, str], list[SyncRecord]] = defaultdict(list)
    for (engine, _), rank_records in per_rank.items():
        runs: list[list[SyncRecord]] = []
        for record in sorted(rank_records, key=lambda r: r.seq):
            if not _mergeable(record):
                groups[(record.seq, engine)].append(record)
                runs.append([])  # ends the current run
                continue
            if not runs or not runs[-1] or runs[-1][-1].weight_version != record.weight_version:
                runs.append([])
            runs[-1].append(record)
        for run in runs:
            if run:
                merged = _merge_records(run)
                groups[(merged.seq, engine)].append(merged)
    return groups


def _dedupe_ranks(records: list[SyncRecord], findings: _Findings, label: str, file: str) -> list[SyncRecord]:
    by_rank: dict[tuple[str, int, int, int], SyncRecord] = {}
    dropped: list[SyncRecord] = []
    for record in sorted(records, key=lambda r: r.header["sync"].get("started") or 0):
        key = _slot(record)
        if key in by_rank:
            dropped.append(by_rank[key])
        by_rank[key] = record
    if dropped:
        findings.add(
            "WC734",
            f"{label}: several records for the same rank ({', '.join(r.path.name for r in dropped)} are older); "
            "the newest is checked (an engine restarted into the same directory?)",
            file=file,
            severity=Severity.WARNING,
        )
    return sorted(by_rank.values(), key=_slot)


def verify(
    records: str | os.PathLike[str],
    against: str | os.PathLike[str] | Reference | None = None,
    *,
    select: Iterable[str] = ("ALL",),
    ignore: Iterable[str] = (),
    weight_version: str | None = None,
    sync: int | str | None = None,
    trainer: TrainerLayout | None = None,
    skip: Iterable[str] = (),
    download: bool = False,
) -> Result:
    """Verify every recorded sync (or the one selected by `weight_version` / `sync`, an int or "latest")."""
    started = time.perf_counter()
    root = Path(records)
    result = Result(target=str(root), command="verify")
    findings = _Findings(list(select) or ["ALL"], list(ignore))
    files, refused = scan_records(root)
    for refusal in refused:
        findings.add("WC720", f"sync folder {refusal.name}: {refusal.reason}", file=str(root / refusal.name))
    if not files and not refused:
        result.nothing_checked = True
        why = "no such file or directory" if not root.exists() else "no sync-*/ record files"
        result.notes.append(f"{root}: {why} (is WEIGHTCHECK_DIR set in the engine processes?)")
        return result
    if against is not None and not isinstance(against, Reference) and not Path(against).exists():
        # A typo'd reference checks nothing: exit 3, whatever --exit-zero says (never a green gate).
        result.nothing_checked = True
        result.notes.append(f"reference {against}: no such file or directory")
        return result
    # Memory budget: thousands of sync folders or rank files are not all loaded (newest first, the rest reported).
    files, left_out = bound_record_files(files)
    if left_out:
        findings.add("WC720", left_out, file=str(root))
    loaded: list[SyncRecord] = []
    for paths in files.values():
        for path in paths:
            try:
                loaded.append(read_record(path))
            except RecordError as exc:
                findings.add("WC720", f"{path.name}: {exc}", file=str(path))
    reference: Reference | None = None
    owns_reference = not isinstance(against, Reference)
    # A checkpoint is hashed with the algorithm(s) the records used, in one pass.
    algorithms = sorted({record_algorithm(r.header) for r in loaded}) or [SHA256]
    if isinstance(against, Reference):
        reference = against
    elif against is not None:
        try:
            reference = load_reference(against, algorithms, download=download)
        except (ReferenceError, ManifestError) as exc:
            findings.add("WC721", f"reference unusable: {exc}; only engine-side checks ran", file=str(against))
    if reference is not None:
        for code, message, file in reference.problems:
            findings.add(code, message, file=file or reference.label)
    elif against is None:
        result.notes.append("no --against reference: only engine-side checks (drops, coverage) ran")

    groups = _logical_syncs(loaded)
    selected = sorted(groups)
    if weight_version is not None:
        selected = [k for k in selected if any(r.weight_version == weight_version for r in groups[k])]
    if sync is not None:
        seqs = sorted({seq for seq, _ in selected})
        want = seqs[-1] if sync == "latest" and seqs else sync
        selected = [k for k in selected if k[0] == want]
    if not selected and loaded:
        what = f"weight version {weight_version!r}" if weight_version is not None else f"sync {sync!r}"
        versions = sorted({r.weight_version or "?" for r in loaded})
        findings.add(
            "WC738",
            f"no records for {what} (recorded versions: {', '.join(versions[:10])})",
            file=str(root),
        )
        # The sync or version asked for does not exist: nothing was checked (exit 3, even with --exit-zero).
        result.nothing_checked = True
        result.notes.append(f"no records for {what}: nothing was verified")
    baselines = _baselines(loaded)
    history = StateHistory(groups)
    layout = trainer or TrainerLayout()
    tensors = params = 0
    replicas: list[tuple[str | None, str, list[SyncRecord]]] = []
    several_engines = len({e for _, e in selected}) > 1  # once, not per sync: 10^4 syncs made it quadratic
    for seq, engine in selected:
        label = f"sync {seq}"
        view_records = groups[(seq, engine)]
        version = Counter(r.weight_version for r in view_records if r.weight_version).most_common(1)
        if version:
            label += f" ({version[0][0]})"
        if several_engines:
            label += f" [{engine}]"
        file = f"sync-{seq:05d}"
        view_records = _dedupe_ranks(view_records, findings, label, file)
        by_runner: dict[str, list[SyncRecord]] = defaultdict(list)
        for record in view_records:
            by_runner[record.runner].append(record)
        # Each runner is judged on its own records. A draft (MTP/NextN) runner receives the target's whole stream
        # and keeps only its own layer by design: its unwritten names are not drops, its parameters' coverage is
        # checked; the stream against the reference is judged once, on the target, where a name the draft wrote
        # (the MTP layer, beyond the target's layers) is not a drop either.
        first_of_sync = len(findings.items)
        for runner in sorted(by_runner, key=lambda r: (r != "target", r)):
            records_of = by_runner[runner]
            target = runner == "target" or "target" not in by_runner
            elsewhere = {
                entry.name
                for other, recs in by_runner.items()
                if other != runner
                for record in recs
                for entry in record.tensors
                if entry.wrote or entry.offrank
            }
            view = _SyncView(
                seq=seq, engine=engine, records=records_of, label=label if target else f"{label} [{runner}]"
            )
            baseline: dict[tuple[int, int, int], set[str]] = {}
            for record in records_of:
                first = baselines.get((engine, _slot(record)))
                if first is not None and first[0] < seq:
                    baseline[_rank_key(record)] = first[1]
            _SyncChecker(
                view,
                reference if target else None,
                findings,
                layout,
                list(skip),
                baseline,
                history if target else None,
                written_elsewhere=elsewhere,
                stream_owner=target,
            ).run()
            if target:
                replicas.append((view.weight_version, engine, records_of))
        # Over every runner of this sync: a draft model's unwritten parameter is the target stream's missing tensor.
        _fold_never_written(findings.items, first_of_sync)
        tensors += sum(len(r.tensors) for r in view_records)
        params += sum(len(r.params) for r in view_records)
    check_dp_replicas(replicas, lambda code, message, **kw: findings.add(code, message, file=str(root), **kw))
    if owns_reference and reference is not None and reference.store is not None:
        reference.store.close()
    from weightcheck.triage import fill_fix_texts

    result.findings = findings.items
    fill_fix_texts(result.findings)  # the Python API's findings say what to do, as the CLI's do
    result.checked = {
        "syncs": len({seq for seq, _ in selected}),
        "records": sum(len(groups[k]) for k in selected),
        "tensors": tensors,
        "params": params,
        "reference_tensors": len(reference.digests) if reference is not None else 0,
    }
    if not loaded:
        result.nothing_checked = not result.findings
    # WEIGHTCHECK_PROFILE=1 in the engine: where the tap's time went, per sync (information, not a finding).
    from weightcheck.tap.records import profile_notes

    result.notes.extend(profile_notes(record for key in selected for record in groups[key]))
    result.notes.append(f"verified in {time.perf_counter() - started:.2f}s")
    return result


def check_weight_update_equal(
    records: str | os.PathLike[str],
    against: str | os.PathLike[str] | Reference | None,
    *,
    weight_version: str | None = None,
    expected_records: int | None = None,
    timeout_s: float = 30.0,
    fail_on: Severity = Severity.ERROR,
    trainer: TrainerLayout | None = None,
    skip: Iterable[str] = (),
    ignore: Iterable[str] = (),
    engine_checkers: Sequence[Any] = (),
) -> Result:
    """Verify the sync just pushed; raise `WeightSyncError` (with the text report) when it is wrong.

    Call right after the framework's `update_weights()`. `weight_version` selects the sync (else the
    latest); `expected_records` (engine ranks × engines) makes it wait up to `timeout_s` for every rank's
    record to land. `engine_checkers` (from `weightcheck.tap.weights_checker`) are asked to run SGLang's own
    `/weights_checker compare`, and their failures are added to the report.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        count = count_records(Path(records), weight_version)
        if expected_records is None or count >= expected_records or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    result = verify(
        records,
        against,
        weight_version=weight_version,
        sync=None if weight_version is not None else "latest",
        trainer=trainer,
        skip=skip,
        ignore=ignore,
    )
    if expected_records is not None and count < expected_records:
        result.notes.append(f"only {count} of {expected_records} expected rank records arrived within {timeout_s}s")
        findings = _Findings(["WC734"], [])
        findings.add(
            "WC734",
            f"only {count} of {expected_records} rank records for this sync arrived within {timeout_s:g}s",
            file=str(records),
            severity=Severity.ERROR,
        )
        result.findings.extend(findings.items)
    for checker in engine_checkers:
        result.findings.extend(checker.compare_findings())
    if result.nothing_checked or result.exit_code(fail_on) == EXIT_FINDINGS:
        import io

        from weightcheck.reporters import render

        buffer = io.StringIO()
        render(result, "text", buffer, color=False, verbose=True)
        raise WeightSyncError(result, f"weight sync check failed for {records}:\n{buffer.getvalue()}")
    return result


def wait_for_records(
    root: Path, weight_version: str | None, expected: int, wait: float, say: Callable[[str], None] | None = None
) -> None:
    """`--wait` / `wait=`: poll until the sync's `expected` rank records have landed or `wait` seconds passed.
    `say` hears a line when the wait starts, one each time the count changes, and one at the end (the CLI
    prints them on stderr: a silent wait of minutes looks like a hang)."""
    deadline = time.monotonic() + max(0.0, wait)
    found = count_records(root, weight_version)
    if found >= expected or wait <= 0:
        return
    tell = say or (lambda _line: None)
    what = f" of weight version {weight_version}" if weight_version else ""
    tell(f"weightcheck verify: waiting up to {wait:g}s for {expected} rank records{what}: {found} so far")
    while found < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        now = count_records(root, weight_version)
        if now != found:
            found = now
            tell(f"weightcheck verify: {found} of {expected} rank records")
    if found < expected:
        tell(f"weightcheck verify: stopped waiting after {wait:g}s with {found} of {expected}")


def records_incomplete(root: Path, weight_version: str | None, expected: int, wait: float) -> Finding | None:
    """WC734 when fewer than `expected` rank records of the sync are there (after `wait_for_records`)."""
    found = count_records(root, weight_version)
    if found >= expected:
        return None
    return Finding(
        code="WC734",
        name="sync-ranks-incomplete",
        severity=Severity.ERROR,
        message=f"only {found} of {expected} rank records arrived within {wait:g}s",
    )


def count_records(root: Path, weight_version: str | None) -> int:
    files = find_record_files(root)
    if not files:
        return 0
    if weight_version is None:
        return len(files[max(files)])
    count = 0
    for paths in files.values():
        for path in paths:
            try:
                # Only the header line matters; the confinement layer refuses FIFOs and escaping symlinks.
                fd, _ = safe_io.open_regular(safe_io.confine(path.parent, path.name))
            except safe_io.UnsafePath:
                continue
            with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
                header = fh.readline(1 << 20)
            if f'"weight_version":"{weight_version}"' in header.replace(" ", ""):
                count += 1
    return count
