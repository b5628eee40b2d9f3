"""Readers for the three frameworks' dump layouts, detected from a payload's keys; one normalized model out.

Layouts (source read: slime THUDM/slime@624b824a, miles radixark/miles@31f1ca96, Relax
redai-infra/Relax@2765d18a):

- rollout dump, all three: `{"rollout_id", "samples": [Sample.to_dict(), ...]}` (`status` already a string);
  miles adds a top-level `metadata`, Relax a per-sample `decoded_tokens`. Written by
  `--save-debug-rollout-data P` / `--dump-details D` as `D/rollout_data/{rollout_id}.pt`.
- slime train dump (`slime/observability/train_data_utils.py`, `format_version: 2`): one file per rollout,
  written by the last PP stage's TP0/CP0 after context-parallel fields were restored to full length;
  `samples` (one dict per sample, with `rollout_position` = index in the rollout dump) and `dp_shards`.
- miles train dump (`miles/utils/train_dump_utils.py`): one file per rank, `D/train_data/{rollout_id}_{rank}.pt`
  = `dict(rollout_id, rank, rollout_data, cp_rank, cp_size, qkv_format)`; `rollout_data` is field-oriented
  (`tokens`, `response_lengths`, `loss_masks`, `log_probs`, `ref_log_probs`, `rollout_log_probs`,
  `advantages`, ...), per-token fields are this CP rank's zigzag slice and may be CUDA tensors. Every rank
  writes: TP replicas repeat the same samples, and earlier PP stages lack `log_probs`.
- Relax train dump: one file per rank, `dict(rollout_id, rank, samples=[{"sample_index": local i, <field>:
  list, ...}])`.

Nothing here knows about rules: readers return samples and a list of problems (file, message).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck.rollouts.loading import (
    DumpRefused,
    as_float_list,
    as_int_list,
    load_dump,
    read_jsonl,
    read_parquet_rows,
)

# Per-token train fields that miles slices by context-parallel rank (miles `slice_log_prob_with_cp` callers).
_CP_FIELDS = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "returns", "values", "entropy", "kl")


@dataclass
class RolloutSample:
    """One sample of a rollout dump (or a rollout-result JSONL line)."""

    file: str
    position: int  # index in the dump's sample list
    index: int | None = None  # Sample.index
    group_index: int | None = None
    tokens: list[int] | None = None
    response_length: int | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    reward: float | None = None
    reward_raw: Any = None
    status: str | None = None
    prompt: str = ""
    response: str = ""

    @property
    def name(self) -> str:
        return f"sample {self.position}" + (f" (index {self.index})" if self.index is not None else "")


@dataclass
class TrainSample:
    """One training sample of a train dump, after merging ranks and reassembling CP slices."""

    file: str
    position: int  # order in the merged dump (rollout_position when the dump has it)
    index: int | None = None
    tokens: list[int] | None = None
    response_length: int | None = None
    loss_mask: list[int] | None = None
    log_probs: list[float] | None = None
    ref_log_probs: list[float] | None = None
    rollout_log_probs: list[float] | None = None
    advantages: list[float] | None = None

    @property
    def name(self) -> str:
        return f"sample {self.position}" + (f" (index {self.index})" if self.index is not None else "")


@dataclass
class Problem:
    file: str
    message: str
    unsafe_globals: list[str] = field(default_factory=list)
    # "unreadable" (WC800) or "ranks" (WC813: merging per-rank files failed)
    kind: str = "unreadable"


@dataclass
class RolloutDump:
    file: str
    rollout_id: int | str | None
    framework: str
    samples: list[RolloutSample]


@dataclass
class TrainDump:
    files: list[str]
    rollout_id: int | str | None
    framework: str
    samples: list[TrainSample]


@dataclass
class DumpSet:
    rollouts: list[RolloutDump] = field(default_factory=list)
    trains: list[TrainDump] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files_read: int = 0
    notes: list[str] = field(default_factory=list)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if hasattr(value, "item"):
        try:
            item = value.item()
        except (ValueError, RuntimeError):
            return None
        return item if isinstance(item, int) else None
    return None


def _reward(value: Any, key: str | None) -> float | None:
    if isinstance(value, dict):
        if key is None:
            # slime/miles `--reward-key`: without it a dict reward cannot be judged
            return None
        value = value.get(key)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "item"):
        try:
            return float(value.item())
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # chat messages: [{"role", "content"}]
        parts = []
        for message in value:
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                parts.append(message["content"])
        return "\n".join(parts)
    return ""


def _rollout_sample(file: str, position: int, raw: dict[str, Any], reward_key: str | None) -> RolloutSample:
    status = raw.get("status")
    if hasattr(status, "value"):
        status = status.value
    return RolloutSample(
        file=file,
        position=position,
        index=_int(raw.get("index", raw.get("sample_index"))),
        group_index=_int(raw.get("group_index")),
        tokens=as_int_list(raw.get("tokens")),
        response_length=_int(raw.get("response_length")),
        loss_mask=as_int_list(raw.get("loss_mask")),
        rollout_log_probs=as_float_list(raw.get("rollout_log_probs")),
        reward=_reward(raw.get("reward"), reward_key),
        reward_raw=raw.get("reward"),
        status=status if isinstance(status, str) else None,
        prompt=_text(raw.get("prompt")),
        response=_text(raw.get("response")),
    )


def detect(payload: Any) -> str | None:
    """The layout of a loaded dump: "rollout:<fw>", "train:slime", "train:miles", "train:relax", or None."""
    if not isinstance(payload, dict):
        return None
    samples = payload.get("samples")
    if "rollout_data" in payload and "rank" in payload:
        return "train:miles"
    if isinstance(samples, list):
        if "format_version" in payload or "dp_shards" in payload:
            return "train:slime"
        if "rank" in payload:
            return "train:relax"
        first = next((s for s in samples if isinstance(s, dict)), {})
        if "metadata" in payload and "decoded_tokens" not in first:
            return "rollout:miles"
        if "decoded_tokens" in first:
            return "rollout:relax"
        return "rollout:slime"
    return None


def _train_sample(file: str, position: int, raw: dict[str, Any]) -> TrainSample:
    index = _int(raw.get("rollout_position"))
    return TrainSample(
        file=file,
        position=index if index is not None else position,
        index=_int(raw.get("sample_index")),
        tokens=as_int_list(raw.get("tokens")),
        response_length=_int(raw.get("response_lengths", raw.get("response_length"))),
        loss_mask=as_int_list(raw.get("loss_masks", raw.get("loss_mask"))),
        log_probs=as_float_list(raw.get("log_probs")),
        ref_log_probs=as_float_list(raw.get("ref_log_probs")),
        rollout_log_probs=as_float_list(raw.get("rollout_log_probs")),
        advantages=as_float_list(raw.get("advantages")),
    )


def cp_logits_offsets(
    total_length: int, response_length: int, cp_rank: int, cp_size: int, padded: int | None
) -> list[tuple[int, int]]:
    """Response-relative [start, stop) ranges one CP rank holds (miles `get_logits_and_tokens_offset_with_cp`,
    `miles/backends/training_utils/cp_utils.py` @31f1ca96: two zigzag chunks per rank)."""
    length = padded if padded is not None else total_length
    chunk = (length + 2 * cp_size - 1) // (2 * cp_size)
    prompt = total_length - response_length
    out = []
    for lo, hi in (
        (cp_rank * chunk, (cp_rank + 1) * chunk),
        ((2 * cp_size - cp_rank - 1) * chunk, (2 * cp_size - cp_rank) * chunk),
    ):
        start, stop = max(lo, prompt - 1), min(hi, total_length - 1)
        if start < stop:
            out.append((start - (prompt - 1), stop - (prompt - 1)))
    return out


def _merge_miles(files: list[tuple[str, dict[str, Any]]], problems: list[Problem]) -> list[TrainSample]:
    """Per-rank miles files of one rollout -> one sample list: TP/PP duplicates dropped (after checking they
    agree), CP slices put back in response order."""
    # key: (sample identity) -> cp_rank -> (file, per-sample dict)
    groups: dict[tuple[Any, ...], dict[int, tuple[str, dict[str, Any]]]] = {}
    cp_sizes: set[int] = set()
    order: dict[tuple[Any, ...], int] = {}
    qkv: dict[tuple[Any, ...], str] = {}
    for file, payload in files:
        data = payload.get("rollout_data")
        if not isinstance(data, dict):
            problems.append(Problem(file, "rollout_data is not a dict"))
            continue
        cp_rank = _int(payload.get("cp_rank")) or 0
        cp_size = _int(payload.get("cp_size")) or 1
        cp_sizes.add(cp_size)
        lengths = data.get("response_lengths")
        if not isinstance(lengths, (list, tuple)) and not hasattr(lengths, "tolist"):
            problems.append(Problem(file, "rollout_data has no response_lengths list"))
            continue
        count = len(lengths)
        for i in range(count):
            row = {}
            for key, column in data.items():
                per_sample = isinstance(column, (list, tuple)) or getattr(column, "ndim", 0) >= 1
                if per_sample and len(column) == count:
                    row[key] = column[i]
            tokens = as_int_list(row.get("tokens"))
            ident = _int(row.get("partition"))
            sample_index = _int(row.get("sample_indices"))
            key = (ident, sample_index, tuple(tokens) if tokens is not None else None)
            order.setdefault(key, ident if ident is not None else len(order))
            qkv[key] = str(payload.get("qkv_format") or "thd")
            slot = groups.setdefault(key, {})
            previous = slot.get(cp_rank)
            if previous is None or (previous[1].get("log_probs") is None and row.get("log_probs") is not None):
                slot[cp_rank] = (file, row)
            elif row.get("log_probs") is not None:
                a = as_float_list(previous[1].get("log_probs"))
                b = as_float_list(row.get("log_probs"))
                if a != b:
                    problems.append(
                        Problem(
                            file,
                            f"log_probs of sample {key[0] if key[0] is not None else key[1]} differ from {previous[0]} "
                            "for the same CP rank (TP replicas must agree)",
                            kind="ranks",
                        )
                    )
    cp_size = max(cp_sizes) if cp_sizes else 1
    samples = []
    for key, slots in sorted(groups.items(), key=lambda item: order[item[0]]):
        file, first = slots[min(slots)]
        base = _train_sample(file, order[key], first)
        base.index = key[1]
        if cp_size > 1:
            missing = sorted(set(range(cp_size)) - set(slots))
            if missing:
                problems.append(
                    Problem(file, f"CP ranks {missing} of {cp_size} missing for sample {order[key]}", kind="ranks")
                )
                continue
            total = len(base.tokens) if base.tokens is not None else None
            response = base.response_length
            if total is None or response is None:
                problems.append(
                    Problem(file, f"sample {order[key]}: no tokens/response_lengths to place CP slices", kind="ranks")
                )
                continue
            padded = _int(first.get("max_seq_lens")) if qkv[key] == "bshd" else None
            for name in _CP_FIELDS:
                chunks = {r: as_float_list(row.get(name)) for r, (_, row) in slots.items()}
                if all(c is None for c in chunks.values()):
                    continue
                full: list[float] = [math.nan] * response
                ok = True
                for r, chunk in chunks.items():
                    spans = cp_logits_offsets(total, response, r, cp_size, padded)
                    need = sum(b - a for a, b in spans)
                    if chunk is None or len(chunk) != need:
                        ok = False
                        break
                    taken = 0
                    for a, b in spans:
                        full[a:b] = chunk[taken : taken + b - a]
                        taken += b - a
                if not ok:
                    problems.append(
                        Problem(
                            file, f"sample {order[key]}: {name} CP slices do not fit the zigzag layout", kind="ranks"
                        )
                    )
                if hasattr(base, name):  # TrainSample keeps the per-token fields the checks read
                    setattr(base, name, full if ok else None)
        samples.append(base)
    return samples


def read_dumps(
    paths: Iterable[Path], *, reward_key: str | None = None, limit: int | None = None, root: Path | None = None
) -> DumpSet:
    """Load every `.pt` / `.jsonl` file given; group per-rank train files by rollout id."""
    out = DumpSet()
    per_rank: dict[tuple[str, Any], list[tuple[str, dict[str, Any]]]] = {}
    per_rank_samples: dict[tuple[str, Any], list[tuple[str, dict[str, Any]]]] = {}

    def rel(p: Path) -> str:
        try:
            return str(p.relative_to(root)) if root is not None else str(p)
        except ValueError:
            return str(p)

    for path in paths:
        file = rel(path)
        if path.suffix == ".jsonl":
            out.files_read += 1
            samples = []
            try:
                for line in read_jsonl(path, name=file):
                    if line.value is None:
                        out.problems.append(Problem(f"{file}:{line.line}", line.error))
                        continue
                    samples.append(_jsonl_sample(file, line.line, len(samples), line.value, reward_key))
            except DumpRefused as exc:
                out.problems.append(Problem(file, exc.reason))
                continue
            if samples:
                out.rollouts.append(RolloutDump(file, _stem_id(path), "relax-jsonl", samples))
            continue
        if path.suffix == ".parquet":
            _read_parquet(path, file, out)
            continue
        try:
            payload = load_dump(path, name=file, **({"limit": limit} if limit else {}))
        except DumpRefused as exc:
            out.files_read += 1
            out.problems.append(Problem(file, exc.reason, exc.unsafe_globals))
            continue
        out.files_read += 1
        layout = detect(payload)
        if layout is None:
            out.problems.append(Problem(file, "not a rollout or train dump (no 'samples' list or 'rollout_data' dict)"))
            continue
        rollout_id = payload.get("rollout_id")
        if path.stem.startswith("eval_"):  # eval rollouts carry the train rollout's id; the file name tells them apart
            rollout_id = path.stem
        if layout.startswith("rollout:"):
            samples_raw = payload["samples"]
            samples = [
                _rollout_sample(file, i, s, reward_key) for i, s in enumerate(samples_raw) if isinstance(s, dict)
            ]
            if len(samples) != len(samples_raw):
                out.problems.append(Problem(file, f"{len(samples_raw) - len(samples)} sample(s) are not dicts"))
            out.rollouts.append(RolloutDump(file, rollout_id, layout.split(":")[1], samples))
        elif layout == "train:slime":
            samples = [_train_sample(file, i, s) for i, s in enumerate(payload["samples"]) if isinstance(s, dict)]
            out.trains.append(TrainDump([file], rollout_id, "slime", samples))
        elif layout == "train:miles":
            per_rank.setdefault((str(path.parent), rollout_id), []).append((file, payload))
        else:
            per_rank_samples.setdefault((str(path.parent), rollout_id), []).append((file, payload))
    # miles's parquet sidecar mirrors its .pt rollout dump: read only where the .pt of that rollout is absent.
    have = {str(d.rollout_id) for d in out.rollouts if d.framework != "miles-parquet"}
    out.rollouts = [d for d in out.rollouts if d.framework != "miles-parquet" or str(d.rollout_id) not in have]
    for (_, rollout_id), files in per_rank.items():
        merged = _merge_miles(sorted(files, key=lambda f: _int(f[1].get("rank")) or 0), out.problems)
        out.trains.append(TrainDump([f for f, _ in files], rollout_id, "miles", merged))
    for (_, rollout_id), files in per_rank_samples.items():
        out.trains.append(TrainDump([f for f, _ in files], rollout_id, "relax", _merge_relax(files, out.problems)))
    return out


def _read_parquet(path: Path, file: str, out: DumpSet) -> None:
    """miles `dashboard_columns/rollout_{id}.parquet` (`miles/ray/rollout/debug_data.py:save_dashboard_columns`:
    sample_index, response_length, total_length, tokens, loss_mask, rollout_log_probs), when pyarrow is there."""
    try:
        rows = read_parquet_rows(path)
    except DumpRefused as exc:
        out.files_read += 1
        out.problems.append(Problem(file, exc.reason))
        return
    if rows is None:
        out.notes.append(f"{file}: not read (pyarrow is not installed)")
        return
    out.files_read += 1
    samples = [
        RolloutSample(
            file=file,
            position=i,
            index=_int(row.get("sample_index")),
            tokens=as_int_list(row.get("tokens")),
            response_length=_int(row.get("response_length")),
            loss_mask=as_int_list(row.get("loss_mask")),
            rollout_log_probs=as_float_list(row.get("rollout_log_probs")),
        )
        for i, row in enumerate(rows)
    ]
    stem = path.stem.removeprefix("rollout_")
    out.rollouts.append(RolloutDump(file, int(stem) if stem.isdigit() else stem, "miles-parquet", samples))


def _merge_relax(files: list[tuple[str, dict[str, Any]]], problems: list[Problem]) -> list[TrainSample]:
    """Relax: every rank writes its local samples (`sample_index` is the local position); TP replicas repeat
    them. Samples are keyed by (local index, tokens); a replica that disagrees is a problem."""
    seen: dict[tuple[Any, ...], TrainSample] = {}
    for file, payload in sorted(files, key=lambda f: _int(f[1].get("rank")) or 0):
        for i, raw in enumerate(payload.get("samples") or []):
            if not isinstance(raw, dict):
                continue
            sample = _train_sample(file, len(seen), raw)
            # A TP replica repeats (local index, tokens); two samples of one rank with equal tokens (a GRPO
            # group's identical answers) differ in their local index.
            key = (sample.index, tuple(sample.tokens) if sample.tokens is not None else (file, i))
            previous = seen.get(key)
            if previous is None or (previous.log_probs is None and sample.log_probs is not None):
                if previous is not None:
                    sample.position = previous.position
                seen[key] = sample
            elif sample.log_probs is not None and previous.log_probs != sample.log_probs:
                problems.append(
                    Problem(
                        file,
                        f"log_probs of {previous.name} differ from {previous.file} (replicas must agree)",
                        kind="ranks",
                    )
                )
    return sorted(seen.values(), key=lambda s: s.position)


def _stem_id(path: Path) -> int | str:
    return int(path.stem) if path.stem.isdigit() else path.stem


def _jsonl_sample(file: str, line: int, position: int, row: dict[str, Any], reward_key: str | None) -> RolloutSample:
    """A Relax rollout-result line (`relax/utils/training/train_dump_utils.py` `_sample_to_summary_record`)."""
    response_ids = as_int_list(row.get("response_token_ids"))
    mask = as_int_list(row.get("response_rollout_log_probs_mask"))
    return RolloutSample(
        file=f"{file}:{line}",
        position=_int(row.get("sample_index")) if _int(row.get("sample_index")) is not None else position,
        group_index=_int(row.get("group_index")),
        tokens=None if response_ids is None else response_ids,
        response_length=_int(row.get("response_length")),
        loss_mask=mask,
        rollout_log_probs=as_float_list(row.get("response_rollout_log_probs")),
        reward=_reward(row.get("reward"), reward_key),
        reward_raw=row.get("reward"),
        status=row.get("status") if isinstance(row.get("status"), str) else None,
        prompt=_text(row.get("prompt")),
        response=_text(row.get("response")),
    )
