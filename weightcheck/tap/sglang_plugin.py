"""SGLang integration: the `sglang.srt.plugins` entry point `weightcheck = weightcheck.tap.sglang_plugin:register`.

SGLang (>= 0.5.2x with `sglang.srt.plugins`) runs `register()` in every scheduler process before the model
is built. With `WEIGHTCHECK_DIR` unset it returns at once and installs nothing: zero cost. With it set it
registers, through `HookRegistry`:

* an AFTER hook on `sglang.srt.model_loader.loader._initialize_model`: once the served model class is known,
  an AROUND hook `tap_load_weights` on `<ModelClass>.load_weights` (so the startup disk load is tapped too,
  and only the class actually served is patched: no other model module is imported);
* AROUND hooks on `<ModelClass>.load_weights` for every class named in `WEIGHTCHECK_SGLANG_TARGETS`
  (comma-separated `module.Class`), registered up front;
* AROUND hooks on the scheduler's `SchedulerWeightUpdaterManager`: `begin_weight_update` /
  `end_weight_update` open and close a sync (0.5.23 requires this session around every tensor or
  distributed update), and `update_weights_from_{tensor,distributed,disk,ipc}` pass the request's
  `weight_version` to the sync (SGLang gives it to the scheduler, never to `load_weights`) and make a sync
  of their own outside a session (older releases).

Fallback for SGLang without `sglang.srt.plugins` (older 0.4.x/0.5.x): call `register()` early in each
scheduler process (a `sitecustomize.py` on the scheduler's path, or a `--forward-hooks` factory). It then
patches the same targets directly (class patch, `weightcheck.tap.install`).
"""

from __future__ import annotations

import functools
import logging
import os
import pkgutil
import socket
from collections.abc import Callable
from typing import Any

from weightcheck.tap import core

log = logging.getLogger("weightcheck.tap")

ENV_TARGETS = "WEIGHTCHECK_SGLANG_TARGETS"
INITIALIZE_MODEL = "sglang.srt.model_loader.loader._initialize_model"
WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
UPDATE_METHODS = (
    "update_weights_from_tensor",
    "update_weights_from_distributed",
    "update_weights_from_disk",
    "update_weights_from_ipc",
)

_tapped_classes: set[str] = set()


def register() -> None:
    """Plugin entry point. Does nothing unless `WEIGHTCHECK_DIR` is set; never raises into SGLang."""
    if not os.environ.get(core.ENV_DIR, "").strip():
        return
    try:
        _register()
    except Exception as exc:
        core._fail("registering the SGLang plugin", exc)


def _register() -> None:
    config = core.configure_from_env()
    if config is None:
        return
    log.info("weightcheck tap on: recording load_weights calls under %s", config.directory)
    core.set_engine_hooks(
        core.EngineHooks(
            rank_info=sglang_rank_info,
            default_loader=_sglang_default_loader(),
            current_weight_version=_serving_weight_version,
            engine_id=_engine_id,
            engine_version=_sglang_version,
        )
    )
    targets = [t.strip() for t in os.environ.get(ENV_TARGETS, "").split(",") if t.strip()]
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        _register_without_plugins(targets)
        return
    for target in targets:
        HookRegistry.register(f"{_class_path(target)}.load_weights", core.tap_load_weights, HookType.AROUND)
        _tapped_classes.add(_class_path(target))
    HookRegistry.register(INITIALIZE_MODEL, _after_initialize_model, HookType.AFTER)
    HookRegistry.register(f"{WEIGHT_UPDATER}.begin_weight_update", _session_begin, HookType.AROUND)
    HookRegistry.register(f"{WEIGHT_UPDATER}.end_weight_update", _session_end, HookType.AROUND)
    for method in UPDATE_METHODS:
        HookRegistry.register(f"{WEIGHT_UPDATER}.{method}", _request_hook(method), HookType.AROUND)
    # load_plugins() applies hooks after every plugin ran; applying here too (already-patched targets are
    # skipped) makes a register() called on its own, outside load_plugins(), effective.
    HookRegistry.apply_hooks()
    for target in targets:
        try:
            _repoint_flashrl_marker(pkgutil.resolve_name(_class_path(target)))
        except Exception as exc:
            core._fail(f"tapping {target}", exc)


def _class_path(target: str) -> str:
    return target[: -len(".load_weights")] if target.endswith(".load_weights") else target


def tap_class(klass: type) -> None:
    """Tap `klass.load_weights` through HookRegistry (or a class patch without it); idempotent."""
    path = f"{klass.__module__}.{klass.__qualname__}"
    if path in _tapped_classes and getattr(klass.load_weights, "__wrapped__", None) is not None:
        return
    _tapped_classes.add(path)
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        core.install(klass)
        return
    HookRegistry.register(f"{path}.load_weights", core.tap_load_weights, HookType.AROUND)
    HookRegistry.apply_hooks()
    _repoint_flashrl_marker(klass)


def _repoint_flashrl_marker(klass: type) -> None:
    """`functools.wraps` copies `_supports_quantized_rl_reload` (pointing at the original) onto the wrapper;
    SGLang's FlashRL loader requires the marker to be the installed callable itself."""
    method = klass.__dict__.get("load_weights")
    if method is not None and getattr(method, "_supports_quantized_rl_reload", None) is not None:
        method._supports_quantized_rl_reload = method


def _after_initialize_model(model: Any, *args: Any, **kwargs: Any) -> None:
    try:
        tap_class(type(model))
        _repoint_flashrl_marker(type(model))
        # The served model: its state is digested after each sync (WEIGHTCHECK_STATE=1), including syncs that
        # never reach load_weights (load_format="direct", custom loaders, RDMA).
        core.note_model(model)
    except Exception as exc:
        core._fail("tapping the model class", exc)


def _session_begin(original_fn: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any) -> Any:
    result = original_fn(manager, *args, **kwargs)
    try:
        if getattr(result, "success", True):
            # A session the engine refused (one already open) does not open a sync either.
            core.begin_sync(source="session")
    except Exception as exc:
        core._fail("opening a sync", exc)
    return result


def _session_end(original_fn: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return original_fn(manager, *args, **kwargs)
    finally:
        try:
            core.end_sync()
        except Exception as exc:
            core._fail("writing a sync record", exc)


def _request_hook(method: str) -> Callable[..., Any]:
    def hook(original_fn: Callable[..., Any], manager: Any, recv_req: Any = None, *args: Any, **kwargs: Any) -> Any:
        version = getattr(recv_req, "weight_version", None)
        with core.request_scope(None if version is None else str(version), source=f"request:{method}"):
            return original_fn(manager, recv_req, *args, **kwargs)

    hook.__name__ = f"weightcheck_{method}"
    return hook


# ---- what SGLang tells us ----------------------------------------------------------------------------------


def sglang_rank_info() -> dict[str, Any]:
    """TP/PP/EP (and world) rank and size of this process, from SGLang's parallel state; {} before init.

    0.5.23 answers through `runtime_context.get_parallel()` (its `parallel_state.get_*` functions are
    deprecated there); older releases only have the functions.
    """
    fields = {
        "tp_rank": ("tp_rank", "get_tensor_model_parallel_rank"),
        "tp_size": ("tp_size", "get_tensor_model_parallel_world_size"),
        "pp_rank": ("pp_rank", "get_pipeline_model_parallel_rank"),
        "pp_size": ("pp_size", "get_pipeline_model_parallel_world_size"),
        "ep_rank": ("moe_ep_rank", "get_moe_expert_parallel_rank"),
        "ep_size": ("moe_ep_size", "get_moe_expert_parallel_world_size"),
        "world_rank": ("launch_world_rank", "get_world_rank"),
        "world_size": ("launch_world_size", "get_world_size"),
    }
    parallel: Any = None
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
    except Exception:
        parallel = None
    try:
        from sglang.srt.distributed import parallel_state
    except Exception:
        parallel_state = None  # type: ignore[assignment]
    info: dict[str, Any] = {}
    for key, (attribute, function) in fields.items():
        try:
            if parallel is not None:
                info[key] = int(getattr(parallel, attribute))
                continue
        except Exception:
            pass
        try:
            if parallel_state is not None:
                info[key] = int(getattr(parallel_state, function)())
        except Exception:
            continue
    return info


def _sglang_default_loader() -> Callable[..., Any] | None:
    try:
        from sglang.srt.model_loader.weight_utils import default_weight_loader
    except Exception:
        return None
    return default_weight_loader


def _serving_weight_version() -> str | None:
    try:
        from sglang.srt.runtime_context import get_serving

        version = get_serving().weight_version
    except Exception:
        return None
    return None if version is None else str(version)


def _engine_id() -> str | None:
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
        return f"{socket.gethostname()}:{args.port}"
    except Exception:
        return None


@functools.lru_cache(maxsize=1)
def _sglang_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


# ---- SGLang without plugins ------------------------------------------------------------------------------


def _register_without_plugins(targets: list[str]) -> None:
    for target in targets:
        try:
            core.install(pkgutil.resolve_name(_class_path(target)))
        except Exception as exc:
            core._fail(f"patching {target}", exc)
    try:
        import sglang.srt.model_loader.loader as loader
    except Exception as exc:
        core._fail("patching the model loader", exc)
        return
    original = loader._initialize_model
    if getattr(original, "__weightcheck_tap__", False):
        return

    @functools.wraps(original)
    def initialize_and_tap(*args: Any, **kwargs: Any) -> Any:
        model = original(*args, **kwargs)
        _after_initialize_model(model)
        return model

    initialize_and_tap.__weightcheck_tap__ = True  # type: ignore[attr-defined]
    loader._initialize_model = initialize_and_tap
    try:
        import sglang.srt.managers.scheduler_components.weight_updater as updater

        manager = updater.SchedulerWeightUpdaterManager
    except Exception:
        return  # releases before the session API: each load_weights call is its own sync
    for method, hook in [
        ("begin_weight_update", _session_begin),
        ("end_weight_update", _session_end),
        *[(m, _request_hook(m)) for m in UPDATE_METHODS],
    ]:
        if hasattr(manager, method):
            _patch_method(manager, method, hook)


def _patch_method(klass: type, method: str, hook: Callable[..., Any]) -> None:
    original = getattr(klass, method)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(klass, method, wrapper)
