"""Weight-sync checks wired into RL frameworks' weight-update loops.

Every adapter here does two things at the framework's single trainer-side send point:

1. writes this rank's trainer manifest part (`weightcheck.manifest`) from the very tensors it sends, and
2. after the sync, when asked, calls `check_weight_update_equal()` (`weightcheck.integrations.sync_check`) on the
   engines' tap records (`WEIGHTCHECK_DIR`) against the checkpoint (first sync) or the manifest parts (every
   later sync).

Adapters are off unless enabled: `SyncMonitor.from_env()` returns None unless `WEIGHTCHECK_SYNC_CHECK=1`,
and the adapters do nothing with `monitor=None`. They never break the sync they observe: a failure of the
monitor itself (an unwritable folder...) is logged once and the sync goes on; a wrong sync is logged with
its report. Only `strict=True` (`WEIGHTCHECK_SYNC_STRICT=1`) raises: `WeightSyncError` for a wrong sync, the
original exception for a monitor failure.

Framework adapters: `weightcheck.integrations.verl` (`BaseRollout.update_weights`),
`weightcheck.integrations.miles` and `weightcheck.integrations.slime` (the send method of each
`UpdateWeightFrom*` class). Ranks, layer and expert counts are read from the trainer, rank 0 checks, and a
sync no rank observed is said once ("not observed"), never called wrong. docs/live-verify.md shows the
lines to add.

Environment (read by `SyncMonitor.from_env`):

| variable | meaning |
|---|---|
| `WEIGHTCHECK_SYNC_CHECK=1` | enable (anything else: the adapters do nothing) |
| `WEIGHTCHECK_DIR` | the engines' records directory (the tap's); without it parts are written, no check runs |
| `WEIGHTCHECK_MANIFESTS` | root of the manifest parts (default `$WEIGHTCHECK_DIR/manifests`) |
| `WEIGHTCHECK_REFERENCE` | HF checkpoint the first checked sync is compared with (default: the manifests) |
| `WEIGHTCHECK_CHECK_EVERY=N` | check every N-th sync (default 1; the first is always checked) |
| `WEIGHTCHECK_EXPECT_RECORDS=K` | rank records to wait for (engines x ranks), `WEIGHTCHECK_WAIT_S` how long (30) |
| `WEIGHTCHECK_SYNC_STRICT=1` | raise on a wrong sync instead of logging it |
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from weightcheck.findings import Result
    from weightcheck.manifest import ManifestWriter

log = logging.getLogger("weightcheck.integrations")

__all__ = ["SyncMonitor", "megatron_ranks"]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def megatron_ranks() -> dict[str, int | None]:
    """This process's PP/VP/EP ranks and sizes from megatron-core's parallel state (one rank without it)."""
    out: dict[str, int | None] = {"pp_rank": 0, "pp_size": 1, "ep_rank": 0, "ep_size": 1}
    try:
        from megatron.core import parallel_state as mpu
    except Exception:  # megatron-core absent or broken: a single-rank trainer as far as we can tell
        return out
    try:
        if not mpu.model_parallel_is_initialized():
            return out
        out["pp_rank"] = mpu.get_pipeline_model_parallel_rank()
        out["pp_size"] = mpu.get_pipeline_model_parallel_world_size()
        out["ep_rank"] = mpu.get_expert_model_parallel_rank()
        out["ep_size"] = mpu.get_expert_model_parallel_world_size()
        vp_size = mpu.get_virtual_pipeline_model_parallel_world_size()
        if vp_size and vp_size > 1:
            out["vp_size"] = vp_size
    except Exception as exc:  # never let rank discovery break a sync
        log.warning("weightcheck: cannot read megatron parallel state (%s); assuming one rank", exc)
    return out


# (TransformerConfig attribute, Megatron argument) for each trainer fact a manifest part carries: the
# counts are what lets `verify` relabel a part sent without its stage's offset (one WC725 instead of a
# WC721 per tensor), the uneven-split fields what places each stage's layers.
_MODEL_FACTS = {
    "num_layers": ("num_layers", "num_layers"),
    "num_experts": ("num_moe_experts", "num_experts"),
    "first_stage_layers": ("num_layers_in_first_pipeline_stage", "decoder_first_pipeline_num_layers"),
    "last_stage_layers": ("num_layers_in_last_pipeline_stage", "decoder_last_pipeline_num_layers"),
    "layout": ("pipeline_model_parallel_layout", "pipeline_model_parallel_layout"),
}


def _model_config(model: Any) -> Any:
    """megatron-core's TransformerConfig of a model, a list of VPP chunks, or a wrapped one (DDP,
    Float16Module: `.module` chains), or None."""
    seen = 0
    candidates = list(model) if isinstance(model, (list, tuple)) else [model]
    while candidates and seen < 16:
        node = candidates.pop(0)
        seen += 1
        config = getattr(node, "config", None)
        if config is not None and isinstance(getattr(config, "num_layers", None), int):
            return config
        inner = getattr(node, "module", None)
        if inner is not None:
            candidates.append(inner)
    return None


def _plain(value: Any) -> int | str | None:
    # Only plain values: megatron-core's parsed layout object has no string form `verify` is sure to read.
    if value is None or isinstance(value, bool):
        return None
    return value if isinstance(value, (int, str)) else None


def megatron_model_facts(model: Any = None, args: Any = None) -> dict[str, Any]:
    """Layer and expert counts (and an uneven split) of the trainer: from the model's megatron-core config,
    else the Megatron arguments `args`, else `megatron.training.get_args()` when Megatron-LM is initialised.
    Only the facts found are returned."""
    sources: list[tuple[Any, int]] = []
    config = _model_config(model) if model is not None else None
    if config is not None:
        sources.append((config, 0))
    if args is not None:
        sources.append((args, 1))
    if not sources:
        try:
            from megatron.training.global_vars import get_args

            sources.append((get_args(), 1))
        except Exception:  # Megatron-LM absent (megatron-core alone) or its arguments not parsed
            pass
    out: dict[str, Any] = {}
    for key, names in _MODEL_FACTS.items():
        for source, which in sources:
            value = _plain(getattr(source, names[which], None))
            if value is not None:
                out[key] = value
                break
    return out


def _dist_rank() -> tuple[int, int]:
    """(rank, world size) of torch.distributed's default group, (0, 1) when it is not initialised."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # torch absent: one process
        pass
    return 0, 1


def _dist_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


@dataclass
class SyncMonitor:
    """Manifest parts at the send point and a check after each sync, for one trainer rank."""

    manifests: Path
    records: Path | None = None
    reference: Path | None = None
    pp_rank: int = 0
    pp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    vp_size: int | None = None
    num_layers: int | None = None
    num_experts: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    layout: str | None = None
    # the stream is the whole model, gathered over PP and EP (verl, slime's and miles' colocated path): its
    # part names no sending rank, and no local ids in it are relabelled
    whole_model: bool = False
    check: bool = True
    checker: bool = True  # this rank runs the check (one rank per trainer is enough)
    check_every: int = 1
    expected_records: int | None = None
    timeout_s: float = 30.0
    strict: bool = False
    barrier: Callable[[], Any] | None = None  # waits for every sender's part before the check
    match_version: bool = True  # False: the engines never see the version (verl): check their latest sync
    results: list[tuple[str, Result]] = field(default_factory=list)
    _writer: ManifestWriter | None = field(default=None, repr=False)
    _version: str | None = field(default=None, repr=False)
    _syncs: int = field(default=0, repr=False)
    _broken: bool = field(default=False, repr=False)
    _sent: int = field(default=0, repr=False)  # tensors this rank digested in the current sync
    _unobserved_said: bool = field(default=False, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> SyncMonitor | None:
        """A monitor configured from the environment (module docstring), or None when not enabled.
        Ranks come from megatron-core's parallel state when it is initialised, layer and expert counts from
        Megatron-LM's arguments when they are parsed (the adapters also read them from the model they
        wrap). With torch.distributed initialised, rank 0 checks and every rank waits for the others'
        parts first; `overrides` win."""
        env = os.environ if environ is None else environ
        if not _truthy(env.get("WEIGHTCHECK_SYNC_CHECK")):
            return None
        records = env.get("WEIGHTCHECK_DIR")
        manifests = env.get("WEIGHTCHECK_MANIFESTS") or (str(Path(records) / "manifests") if records else None)
        if manifests is None:
            log.warning("weightcheck: WEIGHTCHECK_SYNC_CHECK=1 but neither WEIGHTCHECK_MANIFESTS nor WEIGHTCHECK_DIR")
            return None
        values: dict[str, Any] = dict(
            manifests=Path(manifests),
            records=Path(records) if records else None,
            reference=Path(env["WEIGHTCHECK_REFERENCE"]) if env.get("WEIGHTCHECK_REFERENCE") else None,
            strict=_truthy(env.get("WEIGHTCHECK_SYNC_STRICT")),
            check_every=max(1, int(env.get("WEIGHTCHECK_CHECK_EVERY") or 1)),
            expected_records=int(env["WEIGHTCHECK_EXPECT_RECORDS"]) if env.get("WEIGHTCHECK_EXPECT_RECORDS") else None,
            timeout_s=float(env.get("WEIGHTCHECK_WAIT_S") or 30.0),
        )
        values.update(megatron_ranks())
        values.update(megatron_model_facts())
        rank, world = _dist_rank()
        values["checker"] = rank == 0
        if world > 1:
            values["barrier"] = _dist_barrier
        values.update(overrides)
        return cls(**values)

    def learn(self, model: Any = None, args: Any = None) -> None:
        """Fill the layer and expert counts (and an uneven split) not set yet from the trainer's model
        (megatron-core config) or its Megatron arguments."""
        for key, value in megatron_model_facts(model, args).items():
            if getattr(self, key) is None:
                setattr(self, key, value)

    # ---- the send side ---------------------------------------------------------------------------------

    def begin(self, weight_version: str | int | None, step: int | None = None) -> None:
        """A sync starts: open this rank's manifest part for `weight_version`."""
        from weightcheck.manifest import ManifestWriter, manifest_part_path

        self._version = None if weight_version is None else str(weight_version)
        self._broken = False
        self._writer = None
        self._sent = 0
        try:
            path = manifest_part_path(self.manifests, self._version, pp_rank=self.pp_rank, ep_rank=self.ep_rank)
            self._writer = ManifestWriter(
                path,
                weight_version=self._version,
                step=step,
                pp_rank=None if self.whole_model else self.pp_rank,
                pp_size=self.pp_size,
                ep_rank=None if self.whole_model else self.ep_rank,
                ep_size=self.ep_size,
                vp_size=self.vp_size,
                num_layers=self.num_layers,
                num_experts=self.num_experts,
                first_stage_layers=self.first_stage_layers,
                last_stage_layers=self.last_stage_layers,
                layout=self.layout,
            )
        except Exception as exc:
            self._failed("open the manifest part", exc)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Digest one tensor being sent (before the sender may reuse its buffer)."""
        if self._writer is None or self._broken:
            return
        self._sent += 1
        try:
            self._writer.add(name, tensor)
        except Exception as exc:
            self._failed(f"digest {name}", exc)

    def observe(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass `(name, tensor)` pairs through unchanged, digesting each on the way."""
        for name, tensor in named_tensors:
            self.add(name, tensor)
            yield name, tensor

    def set_version(self, weight_version: str | int | None) -> None:
        """The version of the sync being made (for ranks that sent nothing and so never called `begin`)."""
        self._version = None if weight_version is None else str(weight_version)

    @property
    def active(self) -> bool:
        return self._writer is not None

    def end(self, *, write_empty: bool = True) -> Path | None:
        """The sends of this rank are over: write its part (atomically). `write_empty=False`: a rank that
        sent nothing writes no part (it would share its part's path with the rank that did)."""
        writer, self._writer = self._writer, None
        if writer is None or self._broken or (not write_empty and not writer.digests):
            return None
        try:
            return writer.write()
        except Exception as exc:
            self._failed("write the manifest part", exc)
            return None

    # ---- the check -------------------------------------------------------------------------------------

    def after_sync(self) -> Result | None:
        """Check the sync just made (on the checker rank, every `check_every` syncs). Returns the Result, or
        None when nothing was checked; raises only in strict mode."""
        from weightcheck.integrations.sync_check import check_weight_update_equal
        from weightcheck.verifying import TrainerLayout, WeightSyncError

        index, self._syncs = self._syncs, self._syncs + 1
        if self.barrier is not None:
            try:
                self.barrier()
            except Exception as exc:
                self._failed("wait for the other ranks' parts", exc)
                return None
        if not self.check or not self.checker or self.records is None or index % self.check_every:
            return None
        version = self._version
        against = self.reference if index == 0 and self.reference is not None else self._manifest_folder()
        if against != self.reference and not self._parts_written(against):
            # The adapter saw none of the tensors sent (a send path it does not wrap): the engines' records
            # have nothing to be compared with. Say so once; calling the sync wrong would be a false error.
            if not self._unobserved_said:
                self._unobserved_said = True
                log.warning(
                    "weightcheck: weight sync %s not observed: no trainer rank wrote a manifest part under %s "
                    "(the adapter saw no tensor being sent), so syncs are not checked against the trainer; "
                    "see docs/live-verify.md for the send points each adapter wraps",
                    version,
                    against,
                )
            return None
        layout = TrainerLayout(
            pp_size=self.pp_size or None,
            vp_size=self.vp_size,
            first_stage_layers=self.first_stage_layers,
            last_stage_layers=self.last_stage_layers,
            layout=self.layout,
            ep_size=self.ep_size or None,
        )
        try:
            result = check_weight_update_equal(
                self.records,
                against,
                weight_version=version if self.match_version else None,
                expected_records=self.expected_records,
                timeout_s=self.timeout_s,
                trainer=layout,
            )
        except WeightSyncError as err:
            self.results.append((str(version), err.result))
            log.error("weightcheck: weight sync %s is wrong:\n%s", version, err.report)
            if self.strict:
                raise
            return err.result
        except Exception as exc:
            self._failed(f"check weight sync {version}", exc)
            return None
        self.results.append((str(version), result))
        log.info("weightcheck: weight sync %s verified against %s", version, against)
        return result

    @staticmethod
    def _parts_written(folder: Path) -> bool:
        try:
            return any(folder.glob("*.json"))
        except OSError:
            return False

    def _manifest_folder(self) -> Path:
        from weightcheck.manifest import manifest_part_path

        return manifest_part_path(self.manifests, self._version).parent

    def _failed(self, what: str, exc: BaseException) -> None:
        self._broken = True
        if self.strict:
            raise exc
        log.warning("weightcheck: could not %s (%s: %s); the sync goes on unchecked", what, type(exc).__name__, exc)
