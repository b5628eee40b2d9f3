"""Weight-sync checks wired into RL frameworks' weight-update loops.

Every adapter here does two things at the framework's single trainer-side send point:

1. writes this rank's trainer manifest part (`weightcheck.manifest`) from the very tensors it sends, and
2. after the sync, when asked, calls `weightcheck.verify.check_weight_update_equal()` on the engines' tap
   records (`WEIGHTCHECK_DIR`) against the checkpoint (first sync) or the manifest parts (every later sync).

Adapters are off unless enabled: `SyncMonitor.from_env()` returns None unless `WEIGHTCHECK_SYNC_CHECK=1`,
and the adapters do nothing with `monitor=None`. They never break the sync they observe: a failure of the
monitor itself (an unwritable folder...) is logged once and the sync goes on; a wrong sync is logged with
its report. Only `strict=True` (`WEIGHTCHECK_SYNC_STRICT=1`) raises: `WeightSyncError` for a wrong sync, the
original exception for a monitor failure.

Framework adapters: `weightcheck.integrations.verl` (`ServerAdapter.update_weights`),
`weightcheck.integrations.miles` (`WeightTransferProtocol.send_bucket`), `weightcheck.integrations.slime`
(`convert_to_hf` inside the `UpdateWeightFrom*` classes). docs/live-verify.md shows the lines to add.

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


def megatron_ranks() -> dict[str, int]:
    """This process's PP/EP ranks and sizes from megatron-core's parallel state (zeros and ones without it)."""
    out = {"pp_rank": 0, "pp_size": 1, "ep_rank": 0, "ep_size": 1}
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
    except Exception as exc:  # never let rank discovery break a sync
        log.warning("weightcheck: cannot read megatron parallel state (%s); assuming one rank", exc)
    return out


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
    num_layers: int | None = None
    num_experts: int | None = None
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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> SyncMonitor | None:
        """A monitor configured from the environment (module docstring), or None when not enabled.
        Ranks come from megatron-core's parallel state when it is initialised; `overrides` win."""
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
        values.update(overrides)
        return cls(**values)

    # ---- the send side ---------------------------------------------------------------------------------

    def begin(self, weight_version: str | int | None, step: int | None = None) -> None:
        """A sync starts: open this rank's manifest part for `weight_version`."""
        from weightcheck.manifest import ManifestWriter, manifest_part_path

        self._version = None if weight_version is None else str(weight_version)
        self._broken = False
        self._writer = None
        try:
            path = manifest_part_path(self.manifests, self._version, pp_rank=self.pp_rank, ep_rank=self.ep_rank)
            self._writer = ManifestWriter(
                path,
                weight_version=self._version,
                step=step,
                pp_rank=self.pp_rank,
                pp_size=self.pp_size,
                ep_rank=self.ep_rank,
                ep_size=self.ep_size,
                num_layers=self.num_layers,
                num_experts=self.num_experts,
            )
        except Exception as exc:
            self._failed("open the manifest part", exc)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Digest one tensor being sent (before the sender may reuse its buffer)."""
        if self._writer is None or self._broken:
            return
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
        from weightcheck.verify import TrainerLayout, WeightSyncError, check_weight_update_equal

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
        layout = TrainerLayout(pp_size=self.pp_size or None, ep_size=self.ep_size or None)
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

    def _manifest_folder(self) -> Path:
        from weightcheck.manifest import manifest_part_path

        return manifest_part_path(self.manifests, self._version).parent

    def _failed(self, what: str, exc: BaseException) -> None:
        self._broken = True
        if self.strict:
            raise exc
        log.warning("weightcheck: could not %s (%s: %s); the sync goes on unchecked", what, type(exc).__name__, exc)
