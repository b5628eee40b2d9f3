"""Live weight-sync tap: record what an inference engine's `load_weights` receives, per sync and per rank.

Public API:

- `configure(directory, *, keep_tensors=False, strict=False, synchronous_digest=False, digest_threads=None,
  engine=None)` / `configure_from_env()`: turn the tap on (records under `directory`) or off (`None`).
  `WEIGHTCHECK_DIR` turns it on in SGLang through the `weightcheck` plugin (`weightcheck.tap.sglang_plugin`).
- `tap_load_weights(original_fn, model, *args, **kwargs)`: the AROUND hook itself.
- `install(klass)` / `uninstall(klass)`: class patch of `klass.load_weights`, for engines without plugin hooks.
- `wrap(model)` / `unwrap(model)`: instance wrap of one object's bound `load_weights` (a trainer-side replica).
- `set_engine_hooks(EngineHooks(...))`: what the engine tells the tap (ranks, default loader, weight version,
  engine id and version); the SGLang plugin sets them, a custom integration should.
- `sync(weight_version=None)` (context manager), `begin_sync`, `end_sync`, `note_weight_version`, `flush`:
  group load_weights calls into one sync; a call outside any sync is a sync of its own.
- `note_model(model)`: the model whose parameters and buffers are digested after each sync (`state=True`).
- `read_record`, `find_record_files`: read the per-rank record files back (no torch needed).
"""

from weightcheck.tap.core import (
    ENV_DIR,
    EngineHooks,
    TapConfig,
    begin_sync,
    config_from_env,
    configure,
    configure_from_env,
    current_config,
    end_sync,
    flush,
    install,
    last_record_path,
    note_model,
    note_weight_version,
    request_scope,
    runner_of,
    set_engine_hooks,
    set_runner,
    sync,
    tap_load_weights,
    uninstall,
    unwrap,
    wrap,
)
from weightcheck.tap.records import RecordError, SyncRecord, find_record_files, read_record

__all__ = [
    "ENV_DIR",
    "EngineHooks",
    "RecordError",
    "SyncRecord",
    "TapConfig",
    "begin_sync",
    "config_from_env",
    "configure",
    "configure_from_env",
    "current_config",
    "end_sync",
    "find_record_files",
    "flush",
    "install",
    "last_record_path",
    "note_model",
    "note_weight_version",
    "read_record",
    "request_scope",
    "runner_of",
    "set_engine_hooks",
    "set_runner",
    "sync",
    "tap_load_weights",
    "uninstall",
    "unwrap",
    "wrap",
]
