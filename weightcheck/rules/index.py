"""WC2xx: the index (`model.safetensors.index.json`) against the shards it describes."""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import repeat
from operator import eq

from weightcheck.checkpoint import INDEX_NAME
from weightcheck.collapse import summarize
from weightcheck.findings import Severity
from weightcheck.lazyregex import LazyRegex
from weightcheck.rules import LintContext, rule

# A tensor lost from the checkpoint is also seen as a layer lacking a key (WC401-403), a key the pattern
# expects (WC410), a quantized module lacking a companion (WC313) and a total_size the shards no longer reach.
LOST_TENSOR_FOLLOW_ONS = {code: "subjects" for code in ("WC401", "WC402", "WC403", "WC410", "WC313", "WC205")}
_DIGITS = LazyRegex(r"(?<=\.)\d+(?=\.)")


def _readable(ctx: LintContext, shard: str) -> bool:
    report = ctx.ckpt.shards.get(shard)
    return report is not None and report.names_known


def _located(ctx: LintContext) -> tuple[dict[str, str], int]:
    """{tensor: shard} over the readable indexed shards (a name held twice: the later shard) and how many
    tensors those shards hold in all, built once with C-level dict passes. A clean checkpoint's weight_map
    equals this dict, which answers WC202 and WC203 in one comparison; equal sizes mean no name is held
    twice (WC204, WC205). A shard whose names are unknown holds no tensors (its report has none)."""

    def compute() -> tuple[dict[str, str], int]:
        located: dict[str, str] = {}
        total = 0
        for shard in ctx.ckpt.indexed_shards:
            if _readable(ctx, shard):
                tensors = ctx.ckpt.shards[shard].tensors
                located.update(dict.fromkeys(tensors, shard))
                total += len(tensors)
        return located, total

    return ctx.memo("index-located", compute)


def _index_is_shards(ctx: LintContext) -> bool:
    """weight_map maps every tensor of the readable indexed shards, and nothing else, to its shard: then no
    entry is a ghost (WC202: each entry's shard holds its key) and no stored tensor is unindexed (WC203)."""

    def compute() -> bool:
        if not ctx.ckpt.weight_map:
            return False
        return _index_tiles_shards(ctx) or _located(ctx)[0] == ctx.ckpt.weight_map

    return ctx.memo("index-is-shards", compute)


def _index_tiles_shards(ctx: LintContext) -> bool:
    """The clean checkpoint's answer without building `_located`'s dict: weight_map has as many entries as the
    readable indexed shards hold tensors, and maps each of those tensors to its own shard (one C-level pass
    per shard). Then no name is in two of those shards (weight_map gives a name one shard), so their names
    are exactly weight_map's keys: `_located` would equal weight_map, with no name held twice. False says
    nothing (the callers then ask `_located`)."""

    def compute() -> bool:
        ckpt = ctx.ckpt
        weight_map = ckpt.weight_map
        readable = [s for s in ckpt.indexed_shards if _readable(ctx, s)]
        if not weight_map or len(weight_map) != sum(len(ckpt.shards[s].tensors) for s in readable):
            return False
        get = weight_map.get
        return all(all(map(eq, map(get, ckpt.shards[s].tensors), repeat(s))) for s in readable)

    return ctx.memo("index-tiles-shards", compute)


@rule(
    "WC201",
    "indexed-shard-missing",
    Severity.ERROR,
    summary="The index names a shard file that is not on disk.",
    bad='"weight_map": {"model.layers.40.mlp.down_proj.weight": "model-00010-of-00093.safetensors"}  (file absent)',
    good="Every file named in weight_map exists in the checkpoint directory.",
    fix="Copy the missing shard into the checkpoint (re-download or re-export it); never drop its index entries.",
    implies={**LOST_TENSOR_FOLLOW_ONS, "WC106": "subjects"},
)
def indexed_shard_missing(ctx: LintContext) -> None:
    """Older loaders leave the parameters of a missing shard uninitialized and serve garbage (sgl-project/sglang#32279);
    SGLang fails fast only since sgl-project/sglang#32279. The finding lists the tensors that shard should
    hold, collapsed by layer. Not run in index-only mode (no shard present at all: a `*.json`-only
    download), which the run's notes state once."""
    if ctx.options.get("index_only"):
        return
    missing = {r.name for r in ctx.ckpt.refused if r.kind == "missing"}
    if not missing:  # every indexed shard is there: no need to walk weight_map (92k entries on DeepSeek-V3)
        return
    by_shard: dict[str, list[str]] = defaultdict(list)
    for key, shard in ctx.ckpt.weight_map.items():
        if shard in missing:
            by_shard[shard].append(key)
    for shard, keys in sorted(by_shard.items()):
        ctx.report(
            f"{shard} is named by {INDEX_NAME} for {len(keys)} tensors but does not exist: {summarize(keys)}",
            file=shard,
            count=len(keys),
            details={"tensors": sorted(keys)[:1000], "files": [shard]},
        )


@rule(
    "WC202",
    "indexed-key-not-in-shard",
    Severity.ERROR,
    summary="An index entry points at a shard that does not contain that tensor (a ghost entry).",
    bad='"mtp.fc.weight": "model-00012-of-00012.safetensors"   (the shard has no mtp.fc.weight)',
    good="Each weight_map key is present in the header of the shard it names.",
    fix="Re-export the tensor into the shard, or point the index entry at the shard that holds it "
    "(`weightcheck lint --fix` repoints an entry whose tensor sits in exactly one other shard).",
    implies=LOST_TENSOR_FOLLOW_ONS,
)
def indexed_key_not_in_shard(ctx: LintContext) -> None:
    """Writers that record the keys they *meant* to write produce index entries for tensors that are not in
    the shard (redai-studio/Relax#148, huggingface/huggingface_hub#4725). Loaders that trust the index then miss the
    tensor. The finding says
    whether the tensor lives in another shard (wrong mapping) or nowhere (lost)."""
    ckpt = ctx.ckpt
    if _index_is_shards(ctx):
        return
    present = {s: ckpt.shards[s].tensors for s in ckpt.indexed_shards if _readable(ctx, s)}
    ghosts = [(key, shard) for key, shard in ckpt.weight_map.items() if shard in present and key not in present[shard]]
    if not ghosts:
        return
    located: dict[str, list[str]] = defaultdict(list)
    for name, report in ckpt.shards.items():
        for key in report.tensors:
            located[key].append(name)
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)
    for key, shard in ghosts:
        groups[(shard, tuple(sorted(located.get(key, ()))))].append(key)
    for (shard, elsewhere), keys in sorted(groups.items()):
        where = f"found in {', '.join(elsewhere)}" if elsewhere else "not found in any shard"
        ctx.report(
            f"{len(keys)} index entries point at {shard}, which lacks them ({where}): {summarize(keys)}",
            file=shard,
            tensor=summarize(keys, limit=3),
            count=len(keys),
            details={"tensors": sorted(keys)[:1000], "found_in": list(elsewhere)},
            fix=_ghost_fix(shard, elsewhere),
        )


def _ghost_fix(shard: str, elsewhere: tuple[str, ...]) -> str:
    """What to do about ghost entries: only a tensor held by exactly one other shard is mechanical (--fix)."""
    if len(elsewhere) == 1:
        return f"point the entries at {elsewhere[0]} (`weightcheck lint --fix` does it)"
    if elsewhere:
        return "keep one copy of each tensor (see WC204) and point its entry at that shard; --fix cannot choose one"
    return (
        f"re-export the lost tensor(s) into {shard}; if the model must not have them, delete their weight_map "
        "entries by hand (a lost tensor is not a mechanical fix: `lint --fix` leaves it alone)"
    )


@rule(
    "WC203",
    "shard-key-not-indexed",
    Severity.ERROR,
    summary="A tensor stored in an indexed shard is absent from weight_map.",
    bad="model-00003-of-00004.safetensors holds model.layers.7.mlp.gate.weight; weight_map has no such key",
    good="weight_map lists every tensor of every shard it references.",
    fix='add "<tensor>": "<its shard>" to weight_map for each tensor (`weightcheck lint --fix` does it)',
)
def shard_key_not_indexed(ctx: LintContext) -> None:
    """transformers reports missing/unexpected keys from the index, so a tensor present only in a shard is
    invisible to it, while vLLM loads every tensor of every indexed file (NVIDIA-NeMo/Megatron-Bridge#4083,
    NVIDIA/Model-Optimizer#2427). Either way the
    index is incomplete."""
    ckpt = ctx.ckpt
    if not ckpt.weight_map or _index_is_shards(ctx):
        return
    for shard in ckpt.indexed_shards:
        report = ckpt.shards.get(shard)
        if report is None or not report.names_known:
            continue
        weight_map = ckpt.weight_map
        absent = [k for k in report.tensors if k not in weight_map]
        if absent:
            ctx.report(
                f"{len(absent)} tensors in {shard} are not in {INDEX_NAME}: {summarize(absent)}",
                file=shard,
                tensor=summarize(absent, limit=3),
                count=len(absent),
                details={"tensors": sorted(absent)[:1000]},
            )


@rule(
    "WC204",
    "tensor-in-several-shards",
    Severity.ERROR,
    summary="The same tensor name is stored in more than one shard.",
    bad="model.norm.weight in model-00001-of-00002 and in model-00002-of-00002",
    good="Each tensor name appears in exactly one shard.",
)
def tensor_in_several_shards(ctx: LintContext) -> None:
    """When two files hold the same name, the last one loaded wins silently, and which one that is depends
    on the loader's iteration order. Only shards that belong to the checkpoint (indexed, or all files when
    there is no index) are considered."""
    ckpt = ctx.ckpt
    indexed = ckpt.index is not None and bool(ckpt.weight_map)
    if indexed and (_index_tiles_shards(ctx) or len(_located(ctx)[0]) == _located(ctx)[1]):  # the same test, shared
        return
    considered = ckpt.indexed_shards if indexed else ckpt.files_on_disk
    reports = [(s, ckpt.shards[s]) for s in considered if s in ckpt.shards]
    # Cheap test first: duplicates exist iff the union is smaller than the sum of the parts.
    if len(set().union(*(r.tensors for _, r in reports))) == sum(len(r.tensors) for _, r in reports):
        return
    located: dict[str, list[str]] = defaultdict(list)
    for shard, report in reports:
        for key in report.tensors:
            located[key].append(shard)
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for key, shards in located.items():
        if len(shards) > 1:
            groups[tuple(sorted(shards))].append(key)
    for shards, keys in sorted(groups.items()):
        ctx.report(
            f"{len(keys)} tensors stored in {len(shards)} shards ({', '.join(shards)}): {summarize(keys)}",
            file=shards[0],
            tensor=summarize(keys, limit=3),
            count=len(keys),
        )


@rule(
    "WC205",
    "index-total-size",
    Severity.WARNING,
    also=(Severity.INFO,),
    summary="metadata.total_size differs from the sum of tensor bytes in the shards.",
    bad='"metadata": {"total_size": 2301}   (sum of rows, not bytes; the tensors hold 4718592 bytes)',
    good='"metadata": {"total_size": 4718592}',
    fix="set metadata.total_size to the sum of the shards' tensor bytes (`weightcheck lint --fix` does it)",
)
def index_total_size(ctx: LintContext) -> None:
    """`total_size` is the sum of tensor storage bytes (headers excluded). Nobody checks it, but a wrong value
    reveals a writer that dropped tensors or counted something else (slime's `tools/convert_hf_to_int4_direct.py`
    writes it in rows). Skipped when any
    indexed shard is unreadable; a missing `total_size` is reported as info (DeepSeek's fp8_cast_bf16
    writes an empty metadata object)."""
    ckpt = ctx.ckpt
    doc = ckpt.index
    if doc is None or not isinstance(doc.data, dict):
        return
    meta = doc.data.get("metadata")
    if not isinstance(meta, dict):
        return  # WC207 reports a missing metadata object
    total = meta.get("total_size")
    if total is None:
        ctx.report("metadata has no total_size", file=INDEX_NAME, severity=Severity.INFO)
        return
    if not isinstance(total, (int, float)) or isinstance(total, bool):
        ctx.report(f"metadata.total_size is {str(total)[:40]!r}, not a number", file=INDEX_NAME)
        return
    if isinstance(total, float) and not math.isfinite(total):  # `1e400` parses as inf
        ctx.report(f"metadata.total_size is {total!r}, not a finite number", file=INDEX_NAME)
        return
    if any(not _readable(ctx, s) for s in ckpt.indexed_shards):
        return
    reports = [ckpt.shards[s] for s in ckpt.indexed_shards]
    if any(r.problems for r in reports):
        return
    actual = sum(r.data_end for r in reports)
    # A tensor stored twice (WC204) counts once in total_size (every indexed shard is readable here, so
    # `_located` saw them all: equal sizes mean no name is held twice, and the loop would subtract nothing;
    # `_index_tiles_shards` says the same without that dict).
    seen: set[str] = set()
    held_twice = not _index_tiles_shards(ctx) and len(_located(ctx)[0]) != _located(ctx)[1]
    for r in reports if held_twice else ():
        for key in r.tensors.keys() & seen:
            actual -= r.tensors[key].nbytes
        seen.update(r.tensors)
    if int(total) != actual:
        ghosts = _lost_entries_explaining(ckpt, int(total) - actual)
        because = f"; the difference is the size of the lost tensor(s) {summarize(ghosts)}" if ghosts else ""
        ctx.report(
            f"metadata.total_size is {int(total)} but the indexed shards hold {actual} bytes of tensors "
            f"({actual - int(total):+d}){because}",
            file=INDEX_NAME,
            fix=f'set "metadata": {{"total_size": {actual}}} in {INDEX_NAME} (`weightcheck lint --fix` does it)'
            if not ghosts
            else "restore the lost tensor(s); total_size is right for the checkpoint as it should be",
            details={"total_size": int(total), "actual": actual, **({"tensors": ghosts} if ghosts else {})},
        )


def _lost_entries_explaining(ckpt, missing_bytes: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Index entries whose tensor is in no shard, when their sizes (taken from a peer with the same name
    up to layer/expert ids) add up to exactly the bytes total_size counts too many: then total_size is
    the index's honest record of a tensor that was lost, and WC202 is the root cause."""
    if missing_bytes <= 0:
        return []
    stored: dict[str, int] = {}
    peer_size: dict[str, int] = {}
    for report in ckpt.shards.values():
        for key, info in report.tensors.items():
            stored[key] = info.nbytes
            peer_size.setdefault(_DIGITS.sub("*", key), info.nbytes)
    lost = sorted(k for k in ckpt.weight_map if k not in stored)
    sizes = [peer_size.get(_DIGITS.sub("*", k)) for k in lost]
    if not lost or any(size is None for size in sizes) or sum(sizes) != missing_bytes:  # type: ignore[arg-type]
        return []
    return lost


@rule(
    "WC206",
    "index-path-escapes",
    Severity.ERROR,
    summary="An index entry names a file outside the checkpoint directory; it is refused, never opened.",
    bad='"lm_head.weight": "../other_model/model-00001-of-00002.safetensors"   or "/etc/passwd"',
    good='"lm_head.weight": "model-00002-of-00002.safetensors"',
)
def index_path_escapes(ctx: LintContext) -> None:
    """Loaders join weight_map values to the checkpoint path; `..`, absolute paths and symlinks that leave
    the directory make them read files the checkpoint does not own. weightcheck refuses such entries and
    reports every tensor that relied on them."""
    indexed = set(ctx.ckpt.indexed_shards)
    if not any(r.name in indexed and r.kind in ("escapes", "absolute") for r in ctx.ckpt.refused):
        return
    by_file: dict[str, list[str]] = defaultdict(list)
    for key, shard in ctx.ckpt.weight_map.items():
        by_file[shard].append(key)
    for refusal in ctx.ckpt.refused:
        if refusal.name in indexed and refusal.kind in ("escapes", "absolute"):
            keys = by_file[refusal.name]
            # The entry's name is inside when the file is a symlink that leaves: rewriting the entry cannot
            # help, replacing the link by the shard can (applying the default text changed nothing).
            fix = (
                f"replace the symlink {refusal.name!r} by a regular copy of the shard it should be (the "
                "entry's name is fine; the file it resolves to is outside the checkpoint)"
                if "symlink" in refusal.reason
                else ""
            )
            ctx.report(
                f"refused {refusal.name!r}: {refusal.reason}; {len(keys)} tensors point at it: {summarize(keys)}",
                file=refusal.name,
                count=len(keys),
                fix=fix,
            )


@rule(
    "WC207",
    "index-invalid",
    Severity.ERROR,
    summary="model.safetensors.index.json cannot be parsed or lacks weight_map / metadata.",
    bad='{"weight_map": {...}}   (no "metadata": transformers raises KeyError) — or truncated JSON',
    good='{"metadata": {"total_size": 123}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}',
    fix="Rewrite the index from the shards (transformers' save_pretrained writes it; `weightcheck lint --fix` "
    "mends total_size and missing entries once the file parses).",
    implies={"WC105": "all", "WC106": "all", "WC201": "all", "WC202": "all", "WC203": "all", "WC205": "all"},
    # Reads the index file only: it runs in config-only mode too, where an index that names no shards
    # (refused symlink, corrupt JSON, empty weight_map) left a folder holding just config.json.
    needs=("index",),
)
def index_invalid(ctx: LintContext) -> None:
    """transformers reads `index["metadata"]` unconditionally (KeyError when absent) and takes the shard list
    from `weight_map`; a non-string value or an empty map makes the whole checkpoint unloadable or empty."""
    doc = ctx.ckpt.index
    if doc is None:
        return
    if doc.error:
        refused = doc.error.startswith("refused to open: ")
        fix = f"replace {INDEX_NAME} by a regular file inside the checkpoint folder (a copy of what it points at)"
        ctx.report(f"{INDEX_NAME}: {doc.error}", file=INDEX_NAME, fix=fix if refused else "")
        return
    data = doc.data
    if not isinstance(data, dict):
        ctx.report(f"{INDEX_NAME} is not a JSON object", file=INDEX_NAME)
        return
    wm = data.get("weight_map")
    if not isinstance(wm, dict):
        ctx.report(f"{INDEX_NAME} has no weight_map object", file=INDEX_NAME)
    else:
        if not wm:
            ctx.report(f"{INDEX_NAME} weight_map is empty", file=INDEX_NAME)
        # One C-level pass over the value types first (92k on DeepSeek-V3); the exact walk only otherwise.
        bad = [] if set(map(type, wm.values())) <= {str} else [k for k, v in wm.items() if not isinstance(v, str)]
        if bad:
            ctx.report(
                f"{len(bad)} weight_map values are not file names: {summarize(map(str, bad))}",
                file=INDEX_NAME,
                count=len(bad),
            )
    if "metadata" not in data:
        ctx.report(f"{INDEX_NAME} has no metadata object (transformers raises KeyError)", file=INDEX_NAME)
    elif not isinstance(data["metadata"], dict):
        ctx.report(f"{INDEX_NAME} metadata is not an object", file=INDEX_NAME)
