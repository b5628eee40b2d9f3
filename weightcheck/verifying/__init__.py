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
* consistency: missing rank records (WC734), ranks that received different bytes (WC735);
* engine state (`WEIGHTCHECK_STATE=1`): WC740–WC744.

The package, top to bottom: `run` (`verify()`: the driver) → `checks` (one module per family of checks on
one sync, run on a `SyncContext`) and `state` (engine-state checks) → `merge` (records into syncs),
`reference` / `relabel` (the reference), `sink` (findings from the Rule objects of `weightcheck.rules.verify`),
`_names` (layer/expert ids) → `options`. `waiting` waits for rank records; `sync` is the checked push a
training loop makes. `verify()` returns a `Result` (same reporters and exit codes as lint); rendering is the
caller's: `check_weight_update_equal()` (in `weightcheck.integrations.sync_check`)
raises `WeightSyncError` carrying the rendered report.
"""

from __future__ import annotations

from weightcheck.verifying.options import TrainerLayout
from weightcheck.verifying.reference import (
    Reference,
    ReferenceError,
    load_checkpoint_reference,
    load_manifest_reference,
    load_reference,
)
from weightcheck.verifying.run import verify
from weightcheck.verifying.sync import WeightSyncError, check_pushed_sync
from weightcheck.verifying.waiting import count_records, records_incomplete, wait_for_records

__all__ = [
    "Reference",
    "ReferenceError",
    "TrainerLayout",
    "WeightSyncError",
    "check_pushed_sync",
    "check_weight_update_equal",
    "count_records",
    "load_checkpoint_reference",
    "load_manifest_reference",
    "load_reference",
    "records_incomplete",
    "verify",
    "wait_for_records",
]

