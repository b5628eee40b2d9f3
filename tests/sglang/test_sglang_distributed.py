"""`update_weights_from_distributed`, the non-colocated default, through SGLang 0.5.23's real code path in
separate processes: one trainer process and one engine process (SGLang's own parallel state on gloo), the tap
installed by SGLang's plugin loader (`WEIGHTCHECK_DIR`, `WEIGHTCHECK_STATE=1`).

The engine is TP=1 (the code handles any `TP`): a second engine process costs another SGLang import, ~40 s more
and ~1.2 GB on the 2-core CI machine, and TP=2 narrowing of a received stream is already covered by
test_sglang_parallel.py; what is specific to this path (a custom group beside the engine's own, joined at
`rank_offset + tp_rank`, a broadcast into empty tensors, two groups in one session) is exercised at TP=1.

The trainer is the source rank of each pipeline stage, with one update group per stage as slime's
`UpdateWeightFromDistributed` builds them (`<name>-pp_<stage>`, rank 0, world size 1 + engine ranks). It joins
each group with SGLang's own `init_custom_process_group` (the function slime and OpenRLHF copy), writes one
manifest part per stage (`weightcheck.manifest.ManifestWriter`), sends each engine rank the request an
`Engine.update_weights_from_distributed` call carries (names, dtypes, shapes, group, weight version), and
broadcasts every tensor from rank 0.

Each engine rank runs what its scheduler runs: `SchedulerWeightUpdaterManager.init_weights_update_group`
(→ `TpModelWorker.init_weights_update_group` → `WeightUpdater.init_weights_update_group`, which joins the group
as rank `rank_offset + tp_rank` through `init_custom_process_group`), then per push `begin_weight_update`,
`update_weights_from_distributed` per bucket (`WeightUpdater.receive_weights_from_distributed`: one
`torch.distributed.broadcast` into an empty tensor per name, or with `load_format="flattened_bucket"` one
broadcast into an empty packed bucket that is unpacked by the announced names, dtypes and shapes; then
`load_weights_from_distributed` → the model's `load_weights`) and `end_weight_update`, and at the end
`destroy_weights_update_group`.

Stubbed, and why:
* the HTTP server, tokenizer manager and scheduler event loop: a full server cannot start on CPU (the
  ModelRunner allocates the KV cache and attention backends, which need a GPU). The request objects
  (`InitWeightsUpdateGroupReqInput`, `UpdateWeightsFromDistributedReqInput`, ...) are built from the trainer's
  messages, which travel over a multiprocessing queue instead of HTTP + ZMQ, and handed to the manager's
  handlers as the scheduler's dispatcher does;
* the `TpModelWorker`/`ModelRunner` objects around the manager and `WeightUpdater` (a `SimpleNamespace` with
  the real `TpModelWorker.init_weights_update_group`/`destroy_weights_update_group` bound to it), as in
  test_sglang_sync_paths.py; the scheduler's `flush_cache` and `record_weight_version_change`;
* the backend is gloo instead of NCCL (`backend="gloo"` in the init request, as any caller may pass), and
  pynccl / custom all-reduce are off in the engine's parallel state (they need CUDA).

Every wait has a timeout: a hang kills the processes and fails the test, it does not stall the group.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("WEIGHTCHECK_REQUIRE_SGLANG"):
    import sglang.srt  # noqa: F401
else:
    pytest.importorskip("sglang.srt")

from sglang_harness import *  # noqa: F403
from sglang_harness import (
    TARGETS,
    _init_layout,
    build_model,
    checkpoint_stream,
    fill_pattern,
    free_port,
    install_cpu_stubs,
    tiny_config,
)

from weightcheck import tap
from weightcheck.findings import Result, Severity
from weightcheck.verifying import verify

pytestmark = pytest.mark.sglang

TP = 1
GROUP = "weightcheck-pp"  # one update group per trainer pipeline stage: f"{GROUP}_{stage}"
STAGES = 2  # the trainer's pipeline: layer 0 (+ embedding) | layer 1 (+ final norm, lm_head)
WAIT_S = 300.0  # the longest an engine waits for the trainer's next request
DEADLINE_S = 480.0  # the whole launch (SGLang imports on a loaded 2-core machine take most of it)

# The pushes of one launch: weight version -> the trainer's defect (None: a clean push).
PUSHES = {
    "step-1": None,
    "step-2": "wrong-dtype",
    "step-3": "pp-offset",
    "step-4": "omit",
    # load_format="flattened_bucket": one broadcast of a packed bucket per stage, unpacked by the announced
    # names, dtypes and shapes (`WeightUpdater._receive_bucketed_weights_from_distributed`).
    "step-5": "flattened",
    "step-6": "flattened-swapped",
}
WRONG_DTYPE = "model.layers.1.mlp.down_proj.weight"
OMITTED = "model.layers.0.self_attn.k_norm.weight"
# Two tensors of one shape whose names the bucket's announced metadata lists in the wrong order.
SWAPPED = ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight")


def serious(result: Result) -> set[str]:
    return {f.code for f in result.findings if f.severity >= Severity.WARNING}


def by_code(result: Result, code: str) -> list[Any]:
    return [f for f in result.findings if f.code == code]


def stage_of(name: str) -> int:
    if ".layers.0." in name or "embed_tokens" in name:
        return 0
    return 1


def trainer_pushes(stream: list[tuple[str, Any]], defect: str | None) -> list[tuple[int, list[tuple[str, Any]]]]:
    """What each trainer stage sends in one push, as (stage, [(name, tensor)]), stage 0 first.

    * `wrong-dtype`: one tensor is sent (and announced) as bfloat16 instead of the checkpoint's dtype;
    * `pp-offset`: stage 1 sends its layer under its local id (`layers.0.` instead of `layers.1.`);
    * `omit`: one tensor is never sent (nor announced);
    * `flattened`, `flattened-swapped`: the stream as it is (the trainer packs it into one bucket per stage)."""
    import torch

    pushes: list[tuple[int, list[tuple[str, Any]]]] = []
    for stage in range(STAGES):
        named = []
        for name, tensor in stream:
            if stage_of(name) != stage or (defect == "omit" and name == OMITTED):
                continue
            if defect == "wrong-dtype" and name == WRONG_DTYPE:
                tensor = tensor.to(torch.bfloat16)
            if defect == "pp-offset" and stage == 1:
                name = name.replace(".layers.1.", ".layers.0.")
            named.append((name, tensor))
        pushes.append((stage, named))
    return pushes


def trainer_worker(checkpoint: str, manifests: str, ports: list[int], request_queues: list[Any], results: Any) -> None:
    """The trainer: rank 0 of one update group per stage; a manifest part and a broadcast per stage and push."""
    try:
        import torch
        from sglang.srt.utils import init_custom_process_group
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        from weightcheck.manifest import ManifestWriter, manifest_part_path

        groups = []
        for stage, port in enumerate(ports):
            # The engines' init requests are sent first (a trainer posts them, then joins the rendezvous).
            for queue in request_queues:
                queue.put({"op": "init", "port": port, "group_name": f"{GROUP}_{stage}"})
            groups.append(
                init_custom_process_group(
                    backend="gloo",
                    init_method=f"tcp://127.0.0.1:{port}",
                    world_size=1 + len(request_queues),
                    rank=0,
                    group_name=f"{GROUP}_{stage}",
                )
            )
        stream = checkpoint_stream(Path(checkpoint))
        for version, defect in PUSHES.items():
            pushes = trainer_pushes(stream, defect)
            flattened = defect is not None and defect.startswith("flattened")
            requests = []
            for stage, named in pushes:
                names = [n for n, _ in named]
                if defect == "flattened-swapped" and stage == 0:
                    a, b = names.index(SWAPPED[0]), names.index(SWAPPED[1])
                    names[a], names[b] = names[b], names[a]
                requests.append(
                    {
                        "group_name": f"{GROUP}_{stage}",
                        "names": names,
                        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
                        "shapes": [list(t.shape) for _, t in named],
                        "weight_version": version,
                        "load_format": "flattened_bucket" if flattened else None,
                    }
                )
            for queue in request_queues:
                queue.put({"op": "push", "requests": requests})
            for stage, named in pushes:
                path = manifest_part_path(manifests, version, pp_rank=stage, ep_rank=0)
                with ManifestWriter(
                    path, weight_version=version, pp_rank=stage, pp_size=STAGES, num_layers=2
                ) as manifest:
                    if flattened:  # the trainer's own record is of the tensors it packed, by their names
                        for name, tensor in named:
                            manifest.add(name, tensor)
                        bucket = FlattenedTensorBucket(named_tensors=named).get_flattened_tensor()
                        torch.distributed.broadcast(bucket, src=0, group=groups[stage])
                        continue
                    for _, tensor in manifest.wrap(named):
                        torch.distributed.broadcast(tensor.contiguous(), src=0, group=groups[stage])
        for queue in request_queues:
            queue.put({"op": "stop"})
        results.put({"role": "trainer"})
    except BaseException as exc:  # reported to the parent, which fails the test with it
        import traceback

        results.put({"role": "trainer", "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"})


def engine_worker(rank: int, port: int, checkpoint: str, records: str, requests: Any, results: Any) -> None:
    """One TP rank of the engine: SGLang's parallel state, the plugin's tap, the scheduler's weight-update
    handlers; serves the trainer's requests until told to stop."""
    try:
        from types import MethodType, SimpleNamespace

        install_cpu_stubs()
        os.environ["WEIGHTCHECK_DIR"] = records
        os.environ["WEIGHTCHECK_STATE"] = "1"
        os.environ["WEIGHTCHECK_SGLANG_TARGETS"] = ",".join(f"{m}.{c}" for m, c in TARGETS.values())
        _init_layout(rank, TP, port, TP, 1, 1)
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers import io_struct
        from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
        from sglang.srt.managers.tp_worker import TpModelWorker
        from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

        holder = {"model": build_model("qwen3", tiny_config("qwen3"))}
        fill_pattern(holder["model"])
        updater = WeightUpdater(
            tp_rank=rank,
            device="cpu",
            gpu_id=0,
            model_config=ModelConfig(checkpoint),
            custom_weight_loaders={},
            get_model=lambda: holder["model"],
            update_model_fields=lambda model, **kw: holder.update(model=model),
            recapture_cuda_graph=lambda: None,
            get_model_runner=lambda: SimpleNamespace(model=holder["model"]),
        )
        runner = SimpleNamespace(weight_updater=updater, model=holder["model"])
        worker = SimpleNamespace(model_runner=runner, weight_update_runners=lambda: [("target", runner)])
        worker.init_weights_update_group = MethodType(TpModelWorker.init_weights_update_group, worker)
        worker.destroy_weights_update_group = MethodType(TpModelWorker.destroy_weights_update_group, worker)
        manager = SchedulerWeightUpdaterManager(
            tp_worker=worker,
            draft_worker=None,
            memory_saver_adapter=None,
            flush_cache=lambda empty_cache=False: True,
            is_fully_idle=lambda **kw: True,
            scheduler=SimpleNamespace(record_weight_version_change=lambda new_version: None),
        )
        groups = []
        while True:
            message = requests.get(timeout=WAIT_S)
            if message["op"] == "stop":
                break
            if message["op"] == "init":
                reply = manager.init_weights_update_group(
                    io_struct.InitWeightsUpdateGroupReqInput(
                        master_address="127.0.0.1",
                        master_port=message["port"],
                        rank_offset=1,
                        world_size=1 + TP,
                        group_name=message["group_name"],
                        backend="gloo",
                    )
                )
                assert reply.success, reply.message
                groups.append(message["group_name"])
                continue
            assert manager.begin_weight_update(io_struct.BeginWeightUpdateReqInput()).success
            for request in message["requests"]:
                reply = manager.update_weights_from_distributed(
                    io_struct.UpdateWeightsFromDistributedReqInput(**request)
                )
                assert reply.success, reply.message
            assert manager.end_weight_update(io_struct.EndWeightUpdateReqInput()).success
        for name in groups:
            reply = manager.destroy_weights_update_group(io_struct.DestroyWeightsUpdateGroupReqInput(group_name=name))
            assert reply.success, reply.message
        results.put({"role": f"engine-{rank}"})
    except BaseException as exc:
        import traceback

        results.put(
            {"role": f"engine-{rank}", "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"}
        )


@pytest.fixture(scope="module")
def distributed_run(checkpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One launch (trainer + TP=2 engine: 3 processes) for every push of PUSHES."""
    import multiprocessing
    import queue
    import time

    root = tmp_path_factory.mktemp("distributed")
    ckpt = checkpoints("qwen3")
    records, manifests = root / "records", root / "manifests"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    request_queues = [context.Queue() for _ in range(TP)]
    engine_port, group_ports = free_port(), [free_port() for _ in range(STAGES)]
    processes = [
        context.Process(
            target=engine_worker,
            args=(rank, engine_port, str(ckpt), str(records), request_queues[rank], results),
            daemon=True,  # never outlives the test run, whatever happens to it
        )
        for rank in range(TP)
    ]
    processes.append(
        context.Process(
            target=trainer_worker, args=(str(ckpt), str(manifests), group_ports, request_queues, results), daemon=True
        )
    )
    for process in processes:
        process.start()
    roles = [f"engine-{rank}" for rank in range(TP)] + ["trainer"]
    replies: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(replies) < len(processes) and not any("error" in r for r in replies.values()):
            try:
                reply = results.get(timeout=2.0)
                replies[reply["role"]] = reply
                continue
            except queue.Empty:
                pass
            # A rank that died without a word (gloo aborts the process on a collective mismatch) would leave
            # the others waiting on it until their own timeouts.
            dead = [
                f"{role} (exit code {process.exitcode})"
                for role, process in zip(roles, processes, strict=True)
                if process.exitcode not in (None, 0) and role not in replies
            ]
            if dead:
                pytest.fail(f"{', '.join(dead)} ended without a reply; replies: {list(replies)}")
            if time.monotonic() > deadline:
                pytest.fail(f"no reply within {DEADLINE_S:.0f} s (a hung rendezvous or broadcast); got {list(replies)}")
    finally:
        failed = len(replies) < len(processes) or any("error" in r for r in replies.values())
        for process in processes:  # after a failure the others may wait on it forever: kill them at once
            process.join(timeout=1 if failed else 30)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    errors = [f"{r['role']}: {r['error']}" for r in replies.values() if "error" in r]
    assert not errors, errors[0]
    return {"records": records, "manifests": manifests, "ckpt": ckpt}


def test_clean_distributed_push(distributed_run: dict[str, Any]) -> None:
    """Two stages, two groups, one session: no finding against the checkpoint nor against the trainer's
    manifest parts; every TP rank recorded the session under the request's weight version."""
    records, ckpt = distributed_run["records"], distributed_run["ckpt"]
    result = verify(records, ckpt, weight_version="step-1")
    assert result.findings == [], [f.message for f in result.findings]
    assert result.checked["records"] == TP
    against_manifests = verify(records, distributed_run["manifests"] / "step-1", weight_version="step-1")
    assert against_manifests.findings == [], [f.message for f in against_manifests.findings]
    pushed = [r for r in map(tap.read_record, records.rglob("*.jsonl")) if r.weight_version == "step-1"]
    assert sorted(r.rank["tp_rank"] for r in pushed) == list(range(TP))
    # One session, one sync; one load_weights call per request (one per stage's group).
    assert all(r.header["sync"]["source"] == "session" and len(r.calls) == STAGES for r in pushed)


def test_wrong_dtype_is_named(distributed_run: dict[str, Any]) -> None:
    """One tensor announced and broadcast as bfloat16 (the engine casts it into its float32 parameter): the
    stream check names the dtype, and the engine-state check sees the rounded parameter on every TP rank
    (against the state of the clean push of the same checkpoint)."""
    result = verify(distributed_run["records"], distributed_run["ckpt"], weight_version="step-2")
    assert serious(result) == {"WC727", "WC740"}, [f.message for f in result.findings]
    (mismatch,) = by_code(result, "WC727")
    assert mismatch.location.tensor == WRONG_DTYPE and "sent as BF16, reference F32" in mismatch.message
    diverged = by_code(result, "WC740")
    assert len(diverged) == TP and all(f.details["params"] == [WRONG_DTYPE] for f in diverged)


def test_pp_offset_names_the_stage(distributed_run: dict[str, Any]) -> None:
    """Stage 1 broadcasts layer 1 as `layers.0.` on its own group; against the trainer's manifest parts the
    shift is named with the stage that sent it, and layer 1 is never written in the engine."""
    result = verify(distributed_run["records"], distributed_run["manifests"] / "step-3", weight_version="step-3")
    # WC732 (layer 1 never written) is WC722's follow-on when its parameters map onto the missing names.
    assert serious(result) - {"WC732"} == {"WC722", "WC724", "WC725"}, [f.message for f in result.findings]
    (shifted,) = by_code(result, "WC725")
    assert "pp_rank 1 sent its local layer ids without its offset 1 (the manifest part of pp_rank 1)" in (
        shifted.message
    )
    never = {p for top in result.findings for f in (top, *top.related) if f.code == "WC732"
             for p in f.details["params"]}  # fmt: skip
    assert never and all(".layers.1." in p for p in never)


def test_omitted_tensor_is_named(distributed_run: dict[str, Any]) -> None:
    """One tensor neither announced nor broadcast: missing against the checkpoint (WC722), and never written
    on the engine (WC732), which the engine side reports even against the trainer's own manifest."""
    result = verify(distributed_run["records"], distributed_run["ckpt"], weight_version="step-4")
    assert serious(result) == {"WC722"}, [f.message for f in result.findings]  # one defect, one finding
    assert {n for f in by_code(result, "WC722") for n in f.details["names"]} == {OMITTED}
    (never,) = [r for f in by_code(result, "WC722") for r in f.related if r.code == "WC732"]
    assert never.details["params"] == [OMITTED] and "received no data on" in never.message
    against_manifests = verify(
        distributed_run["records"], distributed_run["manifests"] / "step-4", weight_version="step-4"
    )
    assert serious(against_manifests) == {"WC732"}, [f.message for f in against_manifests.findings]


def test_flattened_bucket_broadcast(distributed_run: dict[str, Any]) -> None:
    """load_format="flattened_bucket": a clean packed push is clean; a bucket whose announced names list two
    same-shaped tensors in the wrong order (the bytes land under each other's name) is named, against the
    checkpoint and against the trainer's manifest of what it packed."""
    records, ckpt = distributed_run["records"], distributed_run["ckpt"]
    clean = verify(records, ckpt, weight_version="step-5")
    assert clean.findings == [], [f.message for f in clean.findings]
    # Against the checkpoint the engine-state check also sees the swapped halves of gate_up_proj (WC740).
    for against, expected in ((ckpt, {"WC727", "WC740"}), (distributed_run["manifests"] / "step-6", {"WC727"})):
        result = verify(records, against, weight_version="step-6")
        assert serious(result) == expected, (against, [f.message for f in result.findings])
        a, b = SWAPPED
        assert sorted(f.message.split(": ", 1)[1] for f in by_code(result, "WC727")) == [
            f"{a} carries the data of {b}",
            f"{b} carries the data of {a}",
        ]
