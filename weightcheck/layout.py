"""Layer-id and expert-id maps across Megatron-Core, SGLang and vLLM. Pure Python: no torch, no megatron.

A verifier that diffs what a Megatron trainer pushed against a checkpoint, or against what an inference
engine holds, needs three maps (megatron-core's `get_transformer_layer_offset`, SGLang's `get_pp_indices`):

* Megatron (pp_rank, vp_stage, local index) → global decoder layer id. `MegatronPipeline` reproduces
  megatron-core 0.16's `get_transformer_layer_offset` (branch for branch) and `get_num_layers_to_build`,
  and refuses the configurations megatron-core refuses (plus the few it accepts but then builds overlapping
  or missing layers for, e.g. 30 layers on pp=4 in older releases, NVIDIA/Megatron-LM#1304).
* Global layer id → the SGLang (`sglang_pp_indices`) or vLLM (`vllm_pp_indices`) pipeline stage owning it.
  The two engines distribute a remainder differently; never reuse one formula for both.
* Local expert index → global expert id under expert parallelism (`ep_global_expert`).

Stages are keyed `(pp_rank, vp_stage)`; without virtual pipelining `vp_stage` is 0. Layer ids are 0-based
(Megatron's `layer_number` is 1-based: `layer_number - 1 == global id`). Invalid configurations raise
`ValueError` with a message saying which rule they break.

Why one ~700-line module: every map above reproduces a framework's own function branch for branch (cited at
each), and the three maps are used together by verify's relabelling; they share the stage arithmetic.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from weightcheck.collapse import format_ranges
from weightcheck.names import decoder_layer_span, grouped_expert_span, sequential_expert_span

StageKey = tuple[int, int]
"""A Megatron pipeline stage: `(pp_rank, vp_stage)`; `vp_stage` is 0 without virtual pipelining."""

# Megatron's layout alphabet (`PipelineParallelLayerLayout.parse_str_to_list`).
LAYOUT_SYMBOLS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
# A layout string expanding beyond this is a typo (`t*10000000`), not a model.
_MAX_LAYOUT_CHARS = 1_000_000


# --------------------------------------------------------------------------------------------------------------
# Megatron pipeline layout strings
# --------------------------------------------------------------------------------------------------------------


def _unroll(match: re.Match[str]) -> str:
    body, times = match.group(1), int(match.group(2))
    if len(body) * times > _MAX_LAYOUT_CHARS:
        raise ValueError(f"pipeline layout repetition {match.group(0)!r} expands beyond {_MAX_LAYOUT_CHARS} symbols")
    return body * times


def parse_pipeline_layout(layout: str) -> list[str]:
    """Unroll a `pipeline_model_parallel_layout` string into its stages, in listed (VPP-major) order.

    Same grammar and order of rewrites as megatron-core: commas are dropped, then `(...)*n` groups are
    unrolled (no nesting), then `x*n`; `|` separates stages. Each returned stage is a string over `EtmL`,
    e.g. `"Ettt|(tt|)*2,m|L"` → `["Ettt", "tt", "tt", "m", "L"]`. Stage `i` belongs to
    `(pp_rank = i % pp, vp_stage = i // pp)`.
    """
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", _unroll, text)
    text = re.sub(r"(.)\*(\d+)", _unroll, text)
    stages = text.split("|")
    for stage in stages:
        for symbol in stage:
            if symbol not in LAYOUT_SYMBOLS:
                raise ValueError(
                    f"invalid layer symbol {symbol!r} in pipeline layout {layout!r} "
                    f"(stage {stage!r}); known symbols: {', '.join(LAYOUT_SYMBOLS)}"
                )
    return stages


def _layout_grid(stages: Sequence[str], pp_size: int) -> list[list[str]]:
    """`grid[pp_rank][vp_stage]` from the VPP-major stage list (megatron's 1D → 2D conversion)."""
    vp = len(stages) // pp_size
    return [[stages[v * pp_size + p] for v in range(vp)] for p in range(pp_size)]


def _validate_layout(stages: Sequence[str], pp_size: int, num_layers: int, mtp_num_layers: int | None) -> None:
    """megatron-core's `PipelineParallelLayerLayout.validate_layer_layout`, as ValueErrors."""
    flat = "".join(stages)
    if not flat or flat[0] != "E":
        raise ValueError(f"pipeline layout must start with the embedding 'E', got {flat[:1]!r}")
    if flat[-1] != "L":
        raise ValueError(f"pipeline layout must end with the loss 'L', got {flat[-1]!r}")
    if flat.count("E") != 1:
        raise ValueError(f"pipeline layout must hold exactly one 'E', got {flat.count('E')}")
    if flat.count("L") != 1:
        raise ValueError(f"pipeline layout must hold exactly one 'L' (megatron-core 0.16), got {flat.count('L')}")
    if flat.count("t") != num_layers:
        raise ValueError(f"pipeline layout holds {flat.count('t')} decoder layers 't' but num_layers is {num_layers}")
    n_mtp = flat.count("m")
    if n_mtp != (mtp_num_layers or 0):
        raise ValueError(f"pipeline layout holds {n_mtp} MTP layers 'm' but mtp_num_layers is {mtp_num_layers}")
    if n_mtp and "t" in flat[flat.index("m") :]:
        raise ValueError("pipeline layout places decoder layers after MTP layers")
    grid = _layout_grid(stages, pp_size)
    for pp_rank, row in enumerate(grid):
        if any("m" in stage for stage in row[:-1]):
            raise ValueError(f"MTP layers must sit in the last virtual stage of a rank (pp_rank {pp_rank})")
        if "m" in row[-1] and row[-1].count("m") != n_mtp:
            raise ValueError("all MTP layers must sit in one virtual pipeline stage")


# --------------------------------------------------------------------------------------------------------------
# Megatron pipeline parallelism
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MegatronPipeline:
    """A Megatron-Core pipeline configuration (the `TransformerConfig` fields that place decoder layers).

    Constructing one validates it like megatron-core does (`TransformerConfig.__post_init__`,
    `PipelineParallelLayerLayout`, the asserts in `get_num_layers_to_build`) and raises `ValueError`
    otherwise. It is also refused when megatron-core would accept it but build overlapping or missing layers
    (virtual stages with `pp_size == 1`, negative middle stages): a verifier must not trust such a map.

    `vp_size` is detected from `layout` when that is given (as megatron-core does); a layout's `m` count must
    equal `mtp_num_layers` (None counts as 0, as in megatron-core).
    """

    num_layers: int
    pp_size: int = 1
    vp_size: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    layout: str | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    mtp_num_layers: int | None = None
    # Derived in __post_init__; not part of equality/hash (they follow from the fields above).
    _stages: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_fields()
        if self.layout is not None:
            stages = parse_pipeline_layout(self.layout)
            if len(stages) % self.pp_size:
                raise ValueError(f"pipeline layout has {len(stages)} stages, not a multiple of pp_size {self.pp_size}")
            detected = len(stages) // self.pp_size
            if self.vp_size is not None and self.vp_size != detected:
                raise ValueError(
                    f"vp_size {self.vp_size} conflicts with the pipeline layout ({len(stages)} stages over "
                    f"pp_size {self.pp_size} = {detected} virtual stages)"
                )
            if detected > 1:  # megatron-core adopts the detected size only when it is > 1
                object.__setattr__(self, "vp_size", detected)
            _validate_layout(stages, self.pp_size, self.num_layers, self.mtp_num_layers)
            object.__setattr__(self, "_stages", tuple(stages))
        elif self.uneven:
            self._check_uneven()
        else:
            self._check_even()
        self._check_partition()

    # -- validation -------------------------------------------------------------------------------------------

    def _check_fields(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.pp_size < 1:
            raise ValueError(f"pp_size must be >= 1, got {self.pp_size}")
        if self.vp_size is not None and self.vp_size < 1:
            raise ValueError(f"vp_size must be >= 1 or unset, got {self.vp_size}")
        if self.mtp_num_layers is not None and self.mtp_num_layers < 0:
            raise ValueError(f"mtp_num_layers must be >= 0, got {self.mtp_num_layers}")
        accounted = self.account_for_embedding or self.account_for_loss
        if self.uneven and accounted:
            raise ValueError(
                "first/last stage layer counts cannot be combined with account_for_embedding/account_for_loss"
            )
        if self.layout is not None and (self.uneven or accounted):
            raise ValueError(
                "pipeline layout cannot be combined with first/last stage layer counts or "
                "account_for_embedding/account_for_loss"
            )

    def _check_uneven(self) -> None:
        vp = self.vp_size
        middle_layers, middle_stages = self.num_layers, self.pp_size
        for what, count in (("first", self.first_stage_layers), ("last", self.last_stage_layers)):
            if count is None:
                continue
            if count <= 0:
                raise ValueError(f"{what}_stage_layers must be > 0, got {count}")
            if vp is not None and count % vp:
                raise ValueError(f"{what}_stage_layers {count} must be divisible by vp_size {vp}")
            middle_layers -= count
            middle_stages -= 1
        if bool(middle_layers) != bool(middle_stages):
            raise ValueError(
                f"{middle_layers} layers remain for {middle_stages} middle pipeline stages "
                f"(num_layers {self.num_layers}, pp_size {self.pp_size}, first {self.first_stage_layers}, "
                f"last {self.last_stage_layers})"
            )
        if middle_layers < 0 and middle_stages > 0:  # megatron-core lets this through: negative layer counts
            raise ValueError(
                f"first + last stage layers exceed num_layers {self.num_layers} "
                f"({self.first_stage_layers} + {self.last_stage_layers})"
            )
        if vp is not None and middle_stages == 0 and self.pp_size > 1:
            # get_transformer_layer_offset divides by the middle stage count here (every release checked).
            raise ValueError(
                "megatron-core cannot build virtual pipeline stages with first and last stage counts and no "
                "middle stage (its offset divides by zero on pp_rank 1); use a pipeline layout instead"
            )
        if middle_stages > 0 and middle_layers % middle_stages:
            raise ValueError(f"{middle_layers} middle layers do not divide over {middle_stages} middle pipeline stages")
        if middle_stages > 0 and vp is not None and (middle_layers // middle_stages) % vp:
            raise ValueError(
                f"{middle_layers // middle_stages} layers per middle pipeline rank must be divisible by vp_size {vp}"
            )

    def _check_even(self) -> None:
        total = self.num_layers + self.account_for_embedding + self.account_for_loss
        if total % self.pp_size:
            extra = " (with the embedding/loss accounted for)" if total != self.num_layers else ""
            raise ValueError(
                f"{total} layers{extra} are not divisible by pp_size {self.pp_size}: megatron-core refuses it "
                "(older releases silently built fewer layers, NVIDIA/Megatron-LM#1304); set "
                "first/last stage layer counts or a pipeline layout"
            )
        per_rank = total // self.pp_size
        if self.vp_size is not None and self.pp_size > 1 and per_rank % self.vp_size:
            raise ValueError(f"{per_rank} layers per pipeline rank are not divisible by vp_size {self.vp_size}")

    def _check_partition(self) -> None:
        """Every decoder layer on exactly one stage: catches what megatron-core accepts but builds wrong."""
        # megatron-core skips the offset entirely when pp_size == 1, so virtual chunks there all start at 0.
        why = " (with pp_size 1 megatron-core gives every virtual stage offset 0)" if self.pp_size == 1 else ""
        seen: dict[int, StageKey] = {}
        for key in self.stage_keys():
            count = self.num_layers_to_build(*key)
            if count < 0:
                raise ValueError(f"megatron-core would build {count} layers on stage {key}")
            offset = self.offset(*key)
            for layer in range(offset, offset + count):
                if layer in seen:
                    raise ValueError(f"megatron-core would build layer {layer} on stages {seen[layer]} and {key}{why}")
                if not 0 <= layer < self.num_layers:
                    raise ValueError(f"megatron-core would build layer {layer} (beyond the model) on stage {key}")
                seen[layer] = key
        if len(seen) != self.num_layers:
            missing = format_ranges(set(range(self.num_layers)) - set(seen))
            raise ValueError(f"megatron-core would build no stage for layers {missing}{why}")

    # -- queries ----------------------------------------------------------------------------------------------

    @property
    def uneven(self) -> bool:
        return self.first_stage_layers is not None or self.last_stage_layers is not None

    @property
    def num_vp_stages(self) -> int:
        """Virtual stages per rank (1 without virtual pipelining)."""
        return self.vp_size or 1

    def stage_keys(self) -> list[StageKey]:
        """Every `(pp_rank, vp_stage)`, rank-major."""
        return [(p, v) for p in range(self.pp_size) for v in range(self.num_vp_stages)]

    def _key(self, pp_rank: int, vp_stage: int | None) -> tuple[int, int]:
        if not 0 <= pp_rank < self.pp_size:
            raise ValueError(f"pp_rank {pp_rank} out of range for pp_size {self.pp_size}")
        if vp_stage is None:
            if self.num_vp_stages > 1:  # megatron-core asserts the same
                raise ValueError(f"vp_stage is required with vp_size {self.vp_size}")
            vp_stage = 0
        if not 0 <= vp_stage < self.num_vp_stages:
            raise ValueError(f"vp_stage {vp_stage} out of range for vp_size {self.vp_size}")
        return pp_rank, vp_stage

    def offset(self, pp_rank: int, vp_stage: int | None = None) -> int:
        """Global id of the stage's first decoder layer: megatron-core's `get_transformer_layer_offset`."""
        pp_rank, vp_stage = self._key(pp_rank, vp_stage)
        pp = self.pp_size
        if pp == 1:
            return 0
        if self._stages:
            # Decoder layers in every stage listed before this one (VPP-major order).
            return sum(stage.count("t") for stage in self._stages[: vp_stage * pp + pp_rank])
        vp = self.vp_size
        if self.uneven:
            first = self.first_stage_layers or 0
            last = self.last_stage_layers or 0
            middle_stages = pp - (self.first_stage_layers is not None) - (self.last_stage_layers is not None)
            middle_layers = self.num_layers - first - last
            middle_rank = pp_rank if self.first_stage_layers is None else pp_rank - 1
            if vp is not None:
                first_chunk, middle_chunk, last_chunk = first // vp, middle_layers // vp, last // vp
                chunk = first_chunk + middle_chunk + last_chunk
                if pp_rank == 0:
                    return vp_stage * chunk
                return vp_stage * chunk + first_chunk + middle_rank * (middle_chunk // middle_stages)
            per_rank = middle_layers // middle_stages if middle_stages > 0 else 0
            return 0 if pp_rank == 0 else middle_rank * per_rank + first
        total = self.num_layers + self.account_for_embedding + self.account_for_loss
        per_rank = total // pp
        offset = vp_stage * (total // vp) + pp_rank * (per_rank // vp) if vp is not None else pp_rank * per_rank
        # The embedding occupies one slot of the very first chunk only.
        if self.account_for_embedding and not (vp_stage == 0 and pp_rank == 0):
            offset -= 1
        return offset

    def num_layers_to_build(self, pp_rank: int, vp_stage: int | None = None) -> int:
        """Decoder layers on one stage: megatron-core's `get_num_layers_to_build`."""
        pp_rank, vp_stage = self._key(pp_rank, vp_stage)
        if self._stages:
            return _layout_grid(self._stages, self.pp_size)[pp_rank][vp_stage].count("t")
        pp, vp = self.pp_size, self.vp_size
        if self.uneven:
            middle_layers, middle_stages = self.num_layers, pp
            for count in (self.first_stage_layers, self.last_stage_layers):
                if count is not None:
                    middle_layers -= count
                    middle_stages -= 1
            per_rank = middle_layers // middle_stages if middle_stages > 0 else 0
            if pp_rank == 0 and self.first_stage_layers is not None:
                per_rank = self.first_stage_layers
            if pp_rank == pp - 1 and self.last_stage_layers is not None:
                per_rank = self.last_stage_layers
        else:
            per_rank = (self.num_layers + self.account_for_embedding + self.account_for_loss) // pp
        count = per_rank // vp if vp is not None and pp > 1 else per_rank
        if self.account_for_embedding and pp_rank == 0 and vp_stage == 0:
            count -= 1
        if self.account_for_loss and pp_rank == pp - 1 and vp_stage == self.num_vp_stages - 1:
            count -= 1
        return count

    def stage_layers(self) -> dict[StageKey, list[int]]:
        """Global decoder layer ids of every `(pp_rank, vp_stage)`, rank-major."""
        out: dict[StageKey, list[int]] = {}
        for key in self.stage_keys():
            start = self.offset(*key)
            out[key] = list(range(start, start + self.num_layers_to_build(*key)))
        return out

    def local_to_global(self, local_idx: int, pp_rank: int, vp_stage: int | None = None) -> int:
        """`decoder.layers.{local_idx}` on this stage → global layer id; refuses indices the stage lacks."""
        count = self.num_layers_to_build(pp_rank, vp_stage)
        if not 0 <= local_idx < count:
            raise ValueError(
                f"local layer {local_idx} does not exist on stage (pp_rank {pp_rank}, vp_stage {vp_stage}): "
                f"it builds {count} layers"
            )
        return self.offset(pp_rank, vp_stage) + local_idx

    def owner(self, global_layer: int) -> StageKey:
        """The `(pp_rank, vp_stage)` that builds a global decoder layer."""
        for key in self.stage_keys():
            start = self.offset(*key)
            if start <= global_layer < start + self.num_layers_to_build(*key):
                return key
        raise ValueError(f"layer {global_layer} is not a decoder layer of a {self.num_layers}-layer model")

    def mtp_stage(self) -> StageKey | None:
        """Where MTP layers live: the layout's `m` stage, else the last rank's last virtual stage."""
        if not self.mtp_num_layers:
            return None
        if self._stages:
            grid = _layout_grid(self._stages, self.pp_size)
            for key in self.stage_keys():
                if "m" in grid[key[0]][key[1]]:
                    return key
        return self.pp_size - 1, self.num_vp_stages - 1


@lru_cache(maxsize=256)
def _pipeline(
    num_layers: int,
    pp_size: int,
    vp_size: int | None,
    first_stage_layers: int | None,
    last_stage_layers: int | None,
    layout: str | None,
    account_for_embedding: bool,
    account_for_loss: bool,
    mtp_num_layers: int | None,
) -> MegatronPipeline:
    # Cached: a verifier maps thousands of names with one configuration.
    return MegatronPipeline(
        num_layers=num_layers,
        pp_size=pp_size,
        vp_size=vp_size,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        layout=layout,
        account_for_embedding=account_for_embedding,
        account_for_loss=account_for_loss,
        mtp_num_layers=mtp_num_layers,
    )


def local_to_global_layer(
    local_idx: int,
    num_layers: int,
    pp_size: int,
    pp_rank: int,
    vp_size: int | None = None,
    vp_stage: int | None = None,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    layout: str | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    mtp_num_layers: int | None = None,
) -> int:
    """Megatron `decoder.layers.{local_idx}` on `(pp_rank, vp_stage)` → global layer id (= HF layer id)."""
    pipe = _pipeline(
        num_layers,
        pp_size,
        vp_size,
        first_stage_layers,
        last_stage_layers,
        layout,
        account_for_embedding,
        account_for_loss,
        mtp_num_layers,
    )
    return pipe.local_to_global(local_idx, pp_rank, vp_stage)


def mtp_hf_layer(mtp_idx: int, num_layers: int) -> int:
    """Megatron `mtp.layers.{mtp_idx}` → HF `model.layers.{num_layers + mtp_idx}` (MTP gets no PP offset)."""
    if mtp_idx < 0:
        raise ValueError(f"MTP index must be >= 0, got {mtp_idx}")
    return num_layers + mtp_idx


def suggest_uneven_split(num_layers: int, pp_size: int, vp_size: int | None = None) -> tuple[int, int] | None:
    """A valid `(first_stage_layers, last_stage_layers)` for a layer count that does not divide over `pp_size`.

    Picks the smallest largest stage, then first/last as close to each other as possible, the first the
    lighter (it also carries the embedding). None when no uneven split fits (e.g. pp_size < 2).
    """
    best: tuple[tuple[int, int, int], tuple[int, int]] | None = None
    if pp_size < 2:
        return None
    for first in range(1, num_layers):
        for last in range(1, num_layers - first + 1):
            try:
                MegatronPipeline(num_layers, pp_size, vp_size, first_stage_layers=first, last_stage_layers=last)
            except ValueError:
                continue
            middle = (num_layers - first - last) // (pp_size - 2) if pp_size > 2 else 0
            score = (max(first, last, middle), abs(first - last), first - last)
            if best is None or score < best[0]:
                best = (score, (first, last))
    return best[1] if best else None


# --------------------------------------------------------------------------------------------------------------
# Expert parallelism and names
# --------------------------------------------------------------------------------------------------------------


def _check_ep(num_experts: int, ep_size: int, ep_rank: int) -> int:
    if num_experts < 1 or ep_size < 1:
        raise ValueError(f"num_experts and ep_size must be >= 1, got {num_experts} and {ep_size}")
    if num_experts % ep_size:
        raise ValueError(f"{num_experts} experts do not divide over ep_size {ep_size}")
    if not 0 <= ep_rank < ep_size:
        raise ValueError(f"ep_rank {ep_rank} out of range for ep_size {ep_size}")
    return num_experts // ep_size


def ep_global_expert(local: int, ep_rank: int, num_experts: int, ep_size: int) -> int:
    """Local expert `local` on `ep_rank` → global expert id (`local + ep_rank * num_experts // ep_size`).

    The same rule for TE grouped-GEMM `weight{local}` suffixes (slime/miles), SequentialMLP
    `local_experts.{local}` (Megatron-Bridge, mbridge).
    """
    per_rank = _check_ep(num_experts, ep_size, ep_rank)
    if not 0 <= local < per_rank:
        raise ValueError(f"local expert {local} out of range: {per_rank} experts per EP rank")
    return local + ep_rank * per_rank


def ep_rank_experts(ep_rank: int, num_experts: int, ep_size: int) -> range:
    """Global expert ids held by `ep_rank`."""
    per_rank = _check_ep(num_experts, ep_size, ep_rank)
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


def ep_owner(global_expert: int, num_experts: int, ep_size: int) -> tuple[int, int]:
    """Global expert id → `(ep_rank, local index)`."""
    per_rank = _check_ep(num_experts, ep_size, 0)
    if not 0 <= global_expert < num_experts:
        raise ValueError(f"expert {global_expert} out of range for {num_experts} experts")
    return divmod(global_expert, per_rank)




def megatron_local_name_to_global(
    name: str,
    *,
    num_layers: int,
    pp_size: int = 1,
    pp_rank: int = 0,
    vp_size: int | None = None,
    vp_stage: int | None = None,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    layout: str | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    mtp_num_layers: int | None = None,
    ep_rank: int = 0,
    ep_size: int = 1,
    num_experts: int | None = None,
) -> str:
    """A parameter name as one Megatron rank sees it → its global name.

    * `decoder.layers.{i}.` → `decoder.layers.{i + PP offset}.` (the index must exist on that stage);
    * `mtp.layers.{i}.` keeps `i` (MTP gets no PP offset; its HF layer is `mtp_hf_layer(i, num_layers)`);
    * experts: TE grouped-GEMM `mlp.experts.<...>.weight{k}`/`bias{k}` and SequentialMLP
      `mlp.experts.local_experts.{k}.` → global expert `k + ep_rank * num_experts // ep_size`. (slime leaves
      `local_experts.{k}` un-offset; the true global id is what a verifier compares against.)

    Prefixes such as `module.module.` are kept. With `ep_size > 1`, `num_experts` is required.
    """
    span = decoder_layer_span(name)
    if span:
        layer = local_to_global_layer(
            int(name[span[0] : span[1]]),
            num_layers,
            pp_size,
            pp_rank,
            vp_size,
            vp_stage,
            first_stage_layers,
            last_stage_layers,
            layout,
            account_for_embedding,
            account_for_loss,
            mtp_num_layers,
        )
        name = f"{name[: span[0]]}{layer}{name[span[1] :]}"
    expert = grouped_expert_span(name) or sequential_expert_span(name)
    # Without EP and without an expert count there is nothing to offset and nothing to check against.
    if expert and (ep_size > 1 or num_experts is not None):
        if num_experts is None:
            raise ValueError("num_experts is required to offset expert ids when ep_size > 1")
        glob = ep_global_expert(int(name[expert[0] : expert[1]]), ep_rank, num_experts, ep_size)
        name = f"{name[: expert[0]]}{glob}{name[expert[1] :]}"
    return name


# --------------------------------------------------------------------------------------------------------------
# Inference-engine pipeline partitions
# --------------------------------------------------------------------------------------------------------------


def _explicit_partition(partition: str, num_layers: int, pp_size: int) -> list[int]:
    try:
        counts = [int(part) for part in partition.split(",")]
    except ValueError as err:
        raise ValueError(f"Invalid partition string: {partition}") from err
    if len(counts) != pp_size:
        raise ValueError(f"partition {partition!r} has {len(counts)} entries, pp_size is {pp_size}")
    if sum(counts) != num_layers:
        raise ValueError(f"partition {partition!r} sums to {sum(counts)}, the model has {num_layers} layers")
    return counts


def _check_pp(num_layers: int, pp_rank: int, pp_size: int) -> None:
    if num_layers < 0 or pp_size < 1:
        raise ValueError(f"need num_layers >= 0 and pp_size >= 1, got {num_layers} and {pp_size}")
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} out of range for pp_size {pp_size}")


def sglang_pp_indices(num_layers: int, pp_rank: int, pp_size: int, partition: str | None = None) -> tuple[int, int]:
    """SGLang's `get_pp_indices`: the half-open `[start, end)` of layers on `pp_rank` (checked against 0.5.23).

    `partition` is the value of `SGLANG_PP_LAYER_PARTITION` ("16,15,15,15"); it is ignored when
    `pp_size == 1` (a singleton draft group). By default the **last** `num_layers % pp_size` stages get one
    extra layer.
    """
    _check_pp(num_layers, pp_rank, pp_size)
    if partition is not None and pp_size > 1:
        counts = _explicit_partition(partition, num_layers, pp_size)
        start = sum(counts[:pp_rank])
        return start, start + counts[pp_rank]
    base, remainder = divmod(num_layers, pp_size)
    if pp_rank >= pp_size - remainder:
        start = pp_rank * (base + 1) - (pp_size - remainder)
        return start, start + base + 1
    return pp_rank * base, (pp_rank + 1) * base


def vllm_pp_indices(num_layers: int, pp_rank: int, pp_size: int, partition: str | None = None) -> tuple[int, int]:
    """vLLM's `get_pp_indices`: `[start, end)` on `pp_rank`.

    `partition` is `VLLM_PP_LAYER_PARTITION` (honoured even with `pp_size == 1`). By default the remainder
    goes to stages `[-2], [-3], …`: the last stage never gets an extra layer.
    """
    _check_pp(num_layers, pp_rank, pp_size)
    if partition is not None:
        counts = _explicit_partition(partition, num_layers, pp_size)
    else:
        counts = [num_layers // pp_size] * pp_size
        for i in range(2, num_layers % pp_size + 2):
            counts[-i] += 1
    start = sum(counts[:pp_rank])
    return start, start + counts[pp_rank]


def sglang_pp_ranges(num_layers: int, pp_size: int, partition: str | None = None) -> list[tuple[int, int]]:
    """`[start, end)` of every SGLang pipeline stage."""
    return [sglang_pp_indices(num_layers, rank, pp_size, partition) for rank in range(pp_size)]


def vllm_pp_ranges(num_layers: int, pp_size: int, partition: str | None = None) -> list[tuple[int, int]]:
    """`[start, end)` of every vLLM pipeline stage."""
    return [vllm_pp_indices(num_layers, rank, pp_size, partition) for rank in range(pp_size)]


def range_owner(global_layer: int, ranges: Sequence[tuple[int, int]]) -> int | None:
    """Index of the `[start, end)` range holding `global_layer`, or None ("on no stage")."""
    for rank, (start, end) in enumerate(ranges):
        if start <= global_layer < end:
            return rank
    return None


def stage_feeds(
    trainer_stages: Mapping[StageKey, Iterable[int]], engine_ranges: Sequence[tuple[int, int]]
) -> dict[StageKey, list[int]]:
    """For each trainer stage, the engine pp_ranks its layers land on (sorted). Layers on no engine stage
    are left out here; `range_owner` returns None for them."""
    feeds: dict[StageKey, list[int]] = {}
    for key, layers in trainer_stages.items():
        owners = {range_owner(layer, engine_ranges) for layer in layers}
        feeds[key] = sorted(o for o in owners if o is not None)
    return feeds


# --------------------------------------------------------------------------------------------------------------
# Diagnosing the "stage forgot its offset" bug
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetBug:
    """Observed layer ids equal a stage's expected ids shifted down by `shift`.

    `shift` is what the sender failed to add (`expected = observed + shift`); `forgot_offset` is True when
    the observed ids are exactly the local indices `0..n-1` (the offset was never applied).
    `ambiguous_with` lists other stages that fit equally well when the sender was not named.
    """

    stage: Hashable
    shift: int
    forgot_offset: bool
    ambiguous_with: tuple[Hashable, ...] = ()


def _shift_to(observed: list[int], expected: Iterable[int]) -> int | None:
    want = sorted(set(expected))
    if not want or len(want) != len(observed):
        return None
    shift = want[0] - observed[0]
    return shift if all(o + shift == w for o, w in zip(observed, want, strict=True)) else None


def infer_pp_offset_bug(
    observed_ids: Iterable[int],
    stage_ranges: Mapping[Hashable, Iterable[int]],
    *,
    stage: Hashable | None = None,
) -> OffsetBug | None:
    """Say whether the layer ids a Megatron stage sent are its expected ids shifted by −offset.

    `stage_ranges` maps a stage key to its expected global ids (a list, or `range(start, end)`), e.g.
    `MegatronPipeline(...).stage_layers()`. Pass `stage=` when the sender is known: the answer is then exact.
    Without it, ids equal to some stage's expected ids are taken as correct (None), and otherwise every
    stage whose ids they match under a non-zero shift is a candidate (the first in `stage_ranges` order is
    reported, the rest in `ambiguous_with`). Returns None when no shift explains the ids.
    """
    observed = sorted(set(observed_ids))
    if not observed:
        return None
    keys = [stage] if stage is not None else list(stage_ranges)
    if stage is not None and stage not in stage_ranges:
        raise ValueError(f"unknown stage {stage!r}")
    shifts = {key: _shift_to(observed, stage_ranges[key]) for key in keys}
    if any(s == 0 for s in shifts.values()):
        return None
    hits = [(key, s) for key, s in shifts.items() if s is not None]
    if not hits:
        return None
    (key, shift), others = hits[0], hits[1:]
    forgot = observed == list(range(len(observed)))
    return OffsetBug(stage=key, shift=shift, forgot_offset=forgot, ambiguous_with=tuple(k for k, _ in others))
