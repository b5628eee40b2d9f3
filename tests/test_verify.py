"""`weightcheck verify` on records the tap wrote while a small engine loaded tensors read back from real
transformers-written checkpoints (tests/conftest.py), and against trainer manifests."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from weightcheck import tap
from weightcheck.findings import Finding, Result
from weightcheck.integrations.sync_check import check_weight_update_equal
from weightcheck.manifest import ManifestWriter, manifest_part_path, read_manifest_parts, write_manifest
from weightcheck.verifying import TrainerLayout, WeightSyncError, verify

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def default_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    assert param.shape == loaded_weight.shape, (param.shape, loaded_weight.shape)
    param.data.copy_(loaded_weight)


class Engine(nn.Module):
    """One parameter per checkpoint name (a pipeline stage holds only its layers); names it has no parameter
    for are dropped silently, as Qwen3-MoE does."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], layers: range, num_layers: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=num_layers)
        self.start_layer, self.end_layer = layers.start, layers.stop
        self._names: dict[str, str] = {}
        for name, (shape, dtype) in shapes.items():
            layer = layer_of(name)
            if layer is not None and layer not in layers:
                continue
            key = name.replace(".", "__")
            self._names[name] = key
            self.register_parameter(key, nn.Parameter(torch.rand(shape).to(dtype), requires_grad=False))

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:  # type: ignore[override]
        for name, key in self._names.items():
            yield name, getattr(self, key)

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in params:
                getattr(params[name], "weight_loader", default_loader)(params[name], tensor)


def layer_of(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(2)) if match else None


def relabel_layer(name: str, layer: int) -> str:
    return _LAYER.sub(lambda m: f"{m.group(1)}layers.{layer}.", name, count=1)


def expert_of(name: str) -> int | None:
    match = _EXPERT.search(name)
    return int(match.group(1)) if match else None


def read_stream(path: Path) -> list[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    out: list[tuple[str, torch.Tensor]] = []
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as fh:
            out.extend((key, fh.get_tensor(key)) for key in fh.keys())
    return out


def by_code(result: Result, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


def codes(result: Result) -> set[str]:
    return {f.code for f in result.findings}


def with_related(result: Result, code: str) -> list[Finding]:
    """Findings of `code` at the top level or attached to their root cause (`related`)."""
    return [f for top in result.findings for f in (top, *top.related) if f.code == code]


class Bench:
    """A checkpoint, its tensor stream, and engines tapped into one records directory."""

    def __init__(self, ckpt: Path, records: Path) -> None:
        self.ckpt = ckpt
        self.records = records
        self.stream = read_stream(ckpt)
        self.shapes = {n: (tuple(t.shape), t.dtype) for n, t in self.stream}
        self.num_layers = 1 + max(layer_of(n) or 0 for n in self.shapes)

    def engine(self, layers: range | None = None) -> Engine:
        return Engine(self.shapes, layers or range(self.num_layers), self.num_layers)

    def push(
        self,
        sent: list[tuple[str, torch.Tensor]] | list[list[tuple[str, torch.Tensor]]],
        version: str = "step-1",
        ranks: list[tuple[dict[str, int], range]] | None = None,
        seq: int | None = None,
    ) -> None:
        from weightcheck.tap import core

        buckets = sent if sent and isinstance(sent[0], list) else [sent]
        first_seq = core._STATE.next_seq if seq is None else seq
        for rank, layers in ranks or [({}, range(self.num_layers))]:
            # Every rank is its own process in an engine, numbering its syncs from the same start.
            core._STATE.next_seq = first_seq
            tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader, rank_info=lambda r=rank: dict(r)))
            model = self.engine(layers)
            with tap.sync(version, source="session"):
                for bucket in buckets:
                    model.load_weights(iter(bucket))


@pytest.fixture
def bench(make_ckpt: Callable[[str], Path], tmp_path: Path) -> Iterator[Callable[[str], Bench]]:
    records = tmp_path / "records"
    tap.configure(records, digest_threads=2)
    tap.install(Engine)
    try:
        yield lambda kind: Bench(make_ckpt(kind), records)
    finally:
        tap.uninstall(Engine)
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())


# ---- clean and broken syncs against a checkpoint ---------------------------------------------------


def test_clean_sync_passes(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream)
    result = verify(b.records, b.ckpt)
    assert result.findings == [] and not result.nothing_checked
    assert result.checked["tensors"] == len(b.stream) == result.checked["reference_tensors"]
    assert result.exit_code() == 0


def test_pp_stage_without_offset_is_named_with_its_shift(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")  # 4 layers; trainer PP=2: pp_rank 1 holds layers 2..3
    sent = [(n, t) for n, t in b.stream if (layer_of(n) or 0) < 2]
    sent += [(relabel_layer(n, layer_of(n) - 2), t) for n, t in b.stream if (layer_of(n) or 0) >= 2]  # type: ignore[operator]
    b.push(sent)
    result = verify(b.records, b.ckpt)
    (shift,) = by_code(result, "WC725")
    assert "layers 0..1 from pp_rank 1 shifted by −2" in shift.message
    assert shift.details["true_layers"] == [2, 3] and shift.details["forgot_offset"] is True
    assert "even split" in shift.details["stage_inferred_from"]
    # Never written because never sent under their own names: attached to WC722 (one defect, one finding).
    assert not by_code(result, "WC732")
    assert {n for f in with_related(result, "WC732") for n in f.details["params"]} == {
        n for n in b.shapes if layer_of(n) in (2, 3)
    }
    assert by_code(result, "WC724")[0].details["identical"] is False
    # Not also reported as a pile of per-tensor mismatches.
    assert not by_code(result, "WC727")
    exact = verify(b.records, b.ckpt, trainer=TrainerLayout(pp_size=2))
    assert by_code(exact, "WC725")[0].details["stage_inferred_from"] == "from the trainer layout"


def test_pp_offset_applied_twice_is_a_positive_shift(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    sent = [(relabel_layer(n, layer_of(n) + 1) if layer_of(n) in (1, 2) else n, t) for n, t in b.stream]  # type: ignore[operator]
    b.push(sent)
    (shift,) = by_code(verify(b.records, b.ckpt), "WC725")
    assert "shifted by +1" in shift.message and shift.details["sent_layers"] == [2, 3]


def test_ep_rank_without_expert_offset(bench: Callable[[str], Bench]) -> None:
    b = bench("qwen3_moe")  # 4 experts; trainer EP=2: ep_rank 1 holds experts 2..3
    sent = [(n, t) for n, t in b.stream if (expert_of(n) or 0) < 2]
    sent += [(_EXPERT.sub(f".experts.{expert_of(n) - 2}.", n), t) for n, t in b.stream if (expert_of(n) or 0) >= 2]  # type: ignore[operator]
    b.push(sent)
    result = verify(b.records, b.ckpt)
    (shift,) = by_code(result, "WC726")
    assert "experts 0..1 from ep_rank 1 shifted by −2" in shift.message
    assert shift.details["layers"] == [0, 1, 2]
    (exact,) = by_code(verify(b.records, b.ckpt, trainer=TrainerLayout(ep_size=2)), "WC726")
    assert exact.details["ep_rank"] == "ep_rank 1" and "assuming" not in exact.message


def test_dropped_quantized_router_missing_and_unexpected(bench: Callable[[str], Bench]) -> None:
    b = bench("qwen3_moe")
    sent = []
    for name, tensor in b.stream:
        if name.endswith("mlp.gate.weight"):
            sent.append((name[: -len("weight")] + "weight_packed", torch.zeros(4, 8, dtype=torch.int32)))
        else:
            sent.append((name, tensor))
    b.push(sent)
    result = verify(b.records, b.ckpt)
    (dropped,) = by_code(result, "WC731")
    assert dropped.details["names"] == [f"model.layers.{i}.mlp.gate.weight_packed" for i in range(3)]
    assert "quantized tensor for a parameter the engine holds unquantized" in dropped.message
    assert "silently" in dropped.message
    assert by_code(result, "WC723")[0].details["names"] == dropped.details["names"]
    assert by_code(result, "WC722")[0].details["names"] == [f"model.layers.{i}.mlp.gate.weight" for i in range(3)]
    assert {n for f in with_related(result, "WC732") for n in f.details["params"]} == {
        f"model.layers.{i}.mlp.gate.weight" for i in range(3)
    }


def test_content_classes(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    tensors = dict(b.stream)
    sent = dict(tensors)
    sent["model.layers.0.input_layernorm.weight"] = torch.zeros_like(tensors["model.layers.0.input_layernorm.weight"])
    sent["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    # up_proj sent with gate_proj's data (a converter that mixed up the halves of gate_up)
    sent["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.gate_proj.weight"]
    sent["model.layers.2.mlp.down_proj.weight"] = tensors["model.layers.2.mlp.down_proj.weight"].to(torch.bfloat16)
    sent["model.layers.3.mlp.down_proj.weight"] = tensors["model.layers.3.mlp.down_proj.weight"] * 1.5
    b.push(list(sent.items()))
    result = verify(b.records, b.ckpt)
    assert by_code(result, "WC728")[0].details["names"] == ["model.layers.0.input_layernorm.weight"]
    assert by_code(result, "WC729")[0].details["names"] == ["model.norm.weight"]
    mismatch = {f.details["class"]: f for f in by_code(result, "WC727")}
    assert (
        "carries the data of model.layers.1.mlp.gate_proj.weight"
        in mismatch["data-of:model.layers.1.mlp.gate_proj.weight"].message
    )
    assert mismatch["dtype"].details["names"] == ["model.layers.2.mlp.down_proj.weight"]
    assert mismatch["bytes"].details["names"] == ["model.layers.3.mlp.down_proj.weight"]
    # The engine wrote everything: no coverage finding.
    assert not {"WC731", "WC732", "WC733"} & codes(result)


def test_kept_tensors_tell_a_rounding_from_a_corruption(bench: Callable[[str], Bench], tmp_path: Path) -> None:
    b = bench("llama")
    tap.configure(b.records, keep_tensors=True)
    tensors = dict(b.stream)
    sent = dict(tensors)
    down = "model.layers.2.mlp.down_proj.weight"
    sent[down] = tensors[down].to(torch.bfloat16)  # the trainer sends BF16 of an F32 checkpoint tensor
    sent["model.layers.3.mlp.down_proj.weight"] = tensors["model.layers.3.mlp.down_proj.weight"] * 1.5
    b.push(list(sent.items()))
    result = verify(b.records, b.ckpt)
    (within,) = by_code(result, "WC730")
    assert within.details["names"] == [down]
    values = [f for f in by_code(result, "WC727") if f.details["class"] == "values"]
    assert values and "outside" in values[0].message


def test_missing_duplicate_and_engine_partial_coverage(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    withheld = "model.layers.1.post_attention_layernorm.weight"
    sent = [(n, t) for n, t in b.stream if n != withheld]
    sent.append(sent[0])  # resent, identical
    b.push(sent)
    result = verify(b.records, b.ckpt)
    assert by_code(result, "WC722")[0].details["names"] == [withheld]
    (dup,) = by_code(result, "WC724")
    assert dup.severity.label == "warning" and dup.details["identical"]
    # The parameter left unwritten is the missing tensor's follow-on, not a second error (issue #19).
    (missing,) = by_code(result, "WC722")
    assert not by_code(result, "WC732") and [r.code for r in missing.related] == ["WC732"]
    assert missing.related[0].details["params"] == [withheld]


def test_split_fused_pair_is_reported_once(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    q_a, kv_a = "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    b.push([[(q_a, torch.ones(2, 2))], [(kv_a, torch.ones(2, 2)), *b.stream]])
    result = verify(b.records)  # engine-side checks need no reference
    (pair,) = by_code(result, "WC736")
    assert pair.details["pair"] == [q_a, kv_a] and "call 0" in pair.message and "call 1" in pair.message
    assert not by_code(result, "WC731")
    assert any("no --against" in n for n in result.notes)


def test_layer_beyond_the_model_is_dropped(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push([*b.stream, ("model.layers.9.mlp.up_proj.weight", torch.ones(2))])
    (dropped,) = by_code(verify(b.records, b.ckpt), "WC731")
    assert "beyond the model's 4 layers" in dropped.message


# ---- ranks ----------------------------------------------------------------------------------------------


def pp_ranks(size: int, num_layers: int) -> list[tuple[dict[str, int], range]]:
    per = num_layers // size
    return [
        ({"pp_rank": r, "pp_size": size, "tp_rank": 0, "tp_size": 1}, range(r * per, (r + 1) * per))
        for r in range(size)
    ]


def test_engine_pipeline_stages_skip_other_stages_names_without_false_drops(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream, ranks=pp_ranks(2, 4))
    result = verify(b.records, b.ckpt)
    assert result.findings == [] and result.checked["records"] == 2


def test_missing_stage_record_is_reported_and_its_names_not_called_dropped(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream, ranks=pp_ranks(2, 4)[:1])
    result = verify(b.records, b.ckpt)
    (incomplete,) = by_code(result, "WC734")
    assert "pp_rank 1" in incomplete.message
    assert not by_code(result, "WC731")


def test_tp_ranks_that_received_different_bytes(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    tp = [({"tp_rank": r, "tp_size": 2}, range(4)) for r in range(2)]
    b.push(b.stream, ranks=tp[:1])
    corrupted = [(n, t + 1 if n == "model.norm.weight" else t) for n, t in b.stream]
    b.push(corrupted, ranks=tp[1:], seq=0)
    result = verify(b.records, b.ckpt, sync=0)
    assert by_code(result, "WC735")[0].details["names"] == ["model.norm.weight"]


def test_params_never_loaded_in_the_first_sync_are_not_expected_later(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    derived = "model.layers.0.mlp.up_proj.weight"  # stands in for a derived parameter no sync writes
    sent = [(n, t) for n, t in b.stream if n != derived]
    b.push(sent, "step-0")
    b.push(sent, "step-1")
    first = verify(b.records, sync=0)
    later = verify(b.records, weight_version="step-1")
    assert by_code(first, "WC732") and not by_code(later, "WC732")


# ---- selection, bad input, CLI --------------------------------------------------------------------


def test_weight_version_selection_and_not_found(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream, "step-1")
    b.push(b.stream, "step-2")
    assert verify(b.records, b.ckpt, weight_version="step-2").checked["syncs"] == 1
    assert verify(b.records, b.ckpt, sync="latest").checked["syncs"] == 1
    missing = verify(b.records, b.ckpt, weight_version="step-9")
    assert by_code(missing, "WC738") and "step-1" in by_code(missing, "WC738")[0].message


def test_corrupt_record_is_a_finding_and_the_rest_is_checked(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream, ranks=pp_ranks(2, 4))
    broken = sorted((b.records / "sync-00000").glob("*.jsonl"))[0]
    broken.write_text(broken.read_text()[:200])
    result = verify(b.records, b.ckpt)
    (bad,) = by_code(result, "WC720")
    assert broken.name in bad.message and result.checked["records"] == 1


def test_unparsable_manifest_is_a_finding_not_a_traceback(bench: Callable[[str], Bench], tmp_path: Path) -> None:
    b = bench("llama")
    b.push(b.stream)
    bad = tmp_path / "manifest.json"
    bad.write_text("{nope")
    result = verify(b.records, bad)
    (finding,) = by_code(result, "WC721")
    assert "not valid JSON" in finding.message and result.exit_code() == 1


def test_cli_exit_codes_and_formats(bench: Callable[[str], Bench], tmp_path: Path) -> None:
    from weightcheck.cli import _load_commands, cli

    _load_commands()
    b = bench("llama")
    b.push(b.stream)
    runner = CliRunner()
    clean = runner.invoke(cli, ["verify", str(b.records), "--against", str(b.ckpt), "--format", "json"])
    assert clean.exit_code == 0, clean.output
    doc = json.loads(clean.output)
    assert doc["command"] == "verify" and doc["findings"] == []
    nothing = runner.invoke(cli, ["verify", str(tmp_path / "nope"), "--against", str(b.ckpt)])
    assert nothing.exit_code == 3
    sent = [(n, t) for n, t in b.stream if (layer_of(n) or 0) < 2]
    sent += [(relabel_layer(n, layer_of(n) - 2), t) for n, t in b.stream if (layer_of(n) or 0) >= 2]  # type: ignore[operator]
    b.push(sent, "step-2")
    bad = runner.invoke(
        cli, ["verify", str(b.records), "--against", str(b.ckpt), "--weight-version", "step-2", "--trainer-pp", "2"]
    )
    assert bad.exit_code == 1 and "layers 0..1 from pp_rank 1 shifted by −2" in bad.output
    ignored = runner.invoke(
        cli,
        ["verify", str(b.records), "--against", str(b.ckpt), "--sync", "1", "--select", "WC738", "--format", "sarif"],
    )
    assert ignored.exit_code == 0 and json.loads(ignored.output)["version"] == "2.1.0"
    usage = runner.invoke(cli, ["verify", str(b.records), "--sync", "x"])
    assert usage.exit_code == 2
    explained = runner.invoke(cli, ["rules", "WC725"])
    assert explained.exit_code == 0 and "sync-layer-shifted" in explained.output


# ---- trainer manifests ----------------------------------------------------------------------------


def test_manifest_reference_with_per_stage_parts(bench: Callable[[str], Bench], tmp_path: Path) -> None:
    b = bench("llama")
    root = tmp_path / "manifests"
    stage0 = [(n, t) for n, t in b.stream if (layer_of(n) is not None and layer_of(n) < 2) or "embed_tokens" in n]  # type: ignore[operator]
    sent_by_stage0 = {n for n, _ in stage0}
    stage1_true = [(n, t) for n, t in b.stream if n not in sent_by_stage0]
    # pp_rank 1 forgot its offset: it sends (and records in its manifest) layers 2..3 as 0..1.
    stage1 = [(relabel_layer(n, layer_of(n) - 2), t) if layer_of(n) is not None else (n, t) for n, t in stage1_true]  # type: ignore[operator]
    for rank, part in ((0, stage0), (1, stage1)):
        with ManifestWriter(
            manifest_part_path(root, "step-5", pp_rank=rank),
            weight_version="step-5",
            pp_rank=rank,
            pp_size=2,
            num_layers=4,
        ) as writer:
            list(writer.wrap(part))
    parts = read_manifest_parts(root / "step-5")
    assert [p.trainer["pp_rank"] for p in parts] == [0, 1]
    b.push(stage0 + stage1, "step-5")
    result = verify(b.records, root / "step-5")
    (shift,) = by_code(result, "WC725")
    assert "layers 0..1 from pp_rank 1 shifted by −2" in shift.message
    assert "manifest part of pp_rank 1" in shift.details["stage_inferred_from"]
    assert not by_code(result, "WC721")  # the relabelled parts agree


def test_manifest_parts_that_disagree(tmp_path: Path, bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream)
    write_manifest(tmp_path / "m" / "a.json", [("x", torch.zeros(2))], pp_rank=0)
    write_manifest(tmp_path / "m" / "b.json", [("x", torch.ones(2))], pp_rank=1)
    (conflict,) = by_code(verify(b.records, tmp_path / "m"), "WC721")
    assert "disagree on x" in conflict.message


@pytest.mark.parametrize("algorithm", ["sha256", "xxh3_128"])
def test_manifest_digests_match_the_checkpoint(
    make_ckpt: Callable[[str], Path], tmp_path: Path, algorithm: str
) -> None:
    from weightcheck.digest import read_manifest
    from weightcheck.verifying import load_checkpoint_reference

    ckpt = make_ckpt("qwen3_tied")
    path = write_manifest(tmp_path / "m.json", read_stream(ckpt), step=3, algorithm=algorithm)
    digests = read_manifest(path)
    assert {d.algorithm for d in digests.values()} == {algorithm}
    assert digests == load_checkpoint_reference(ckpt, algorithms=[algorithm]).digests


# ---- training-loop entry point --------------------------------------------------------------------


def test_check_weight_update_equal_raises_with_the_report(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream, "step-1")
    assert check_weight_update_equal(b.records, b.ckpt, weight_version="step-1", expected_records=1).findings == []
    b.push([(n, t) for n, t in b.stream if "norm" not in n], "step-2")
    with pytest.raises(WeightSyncError) as caught:
        check_weight_update_equal(b.records, b.ckpt, weight_version="step-2")
    assert "WC722" in caught.value.report and caught.value.result.exit_code() == 1
    with pytest.raises(WeightSyncError, match="only 1 of 2"):
        check_weight_update_equal(b.records, b.ckpt, weight_version="step-1", expected_records=2, timeout_s=0.3)


class FakeSGLang(http.server.BaseHTTPRequestHandler):
    """Answers /weights_checker like SGLang 0.5.23 (200 on success, 400 with the message on failure)."""

    actions: ClassVar[list[str]] = []
    compare_ok: ClassVar[bool] = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).actions.append(body["action"])
        ok = body["action"] != "compare" or type(self).compare_ok
        message = (
            "ok" if ok else "check tensor equality failed:\nname=model.layers.1.mlp.gate_up_proj.weight max_abs_err=1"
        )
        payload = json.dumps({"success": ok, "message": message}).encode()
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_engine() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeSGLang.actions = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_weights_checker_interop(bench: Callable[[str], Bench], fake_engine: str) -> None:
    from weightcheck.integrations.weights_checker import (
        WeightsCheckerClient,
        WeightsCheckerError,
        checked_weight_update,
    )

    b = bench("llama")
    FakeSGLang.compare_ok = True
    with checked_weight_update(b.records, b.ckpt, engines=[fake_engine], weight_version="step-1"):
        b.push(b.stream, "step-1")
    assert FakeSGLang.actions == ["snapshot", "reset_tensors", "compare"]
    FakeSGLang.compare_ok = False
    update = checked_weight_update(b.records, b.ckpt, engines=[fake_engine], weight_version="step-2")
    with pytest.raises(WeightSyncError) as caught, update:
        b.push(b.stream, "step-2")
    assert [f.code for f in caught.value.result.findings] == ["WC737"]
    assert "gate_up_proj" in caught.value.report
    with pytest.raises(WeightsCheckerError):
        WeightsCheckerClient("http://127.0.0.1:9", timeout_s=2).snapshot()
    with pytest.raises(ValueError, match="unknown /weights_checker action"):
        WeightsCheckerClient(fake_engine).call("explode")


def test_a_loaded_reference_is_reused_across_syncs(bench: Callable[[str], Bench]) -> None:
    from weightcheck.verifying import load_reference

    b = bench("llama")
    reference = load_reference(b.ckpt)
    for step in ("step-1", "step-2"):
        b.push(b.stream, step)
        assert check_weight_update_equal(b.records, reference, weight_version=step).findings == []
    reference.store.close()


def test_record_referring_to_an_unknown_call_does_not_crash(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push([*b.stream, ("model.unknown.weight", torch.ones(2))])
    path = next((b.records / "sync-00000").glob("*.jsonl"))
    path.write_text(
        path.read_text().replace('"call":0,"name":"model.unknown.weight"', '"call":7,"name":"model.unknown.weight"')
    )
    (dropped,) = by_code(verify(b.records, b.ckpt), "WC731")
    assert dropped.details["names"] == ["model.unknown.weight"]


def test_request_level_syncs_of_one_version_are_one_sync(bench: Callable[[str], Bench]) -> None:
    """SGLang without the session API: every bucket is its own update request, all with the push's version."""
    b = bench("llama")
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    model = b.engine()
    half = len(b.stream) // 2
    for bucket in (b.stream[:half], b.stream[half:]):
        with tap.request_scope("step-4", source="request:update_weights_from_distributed"):
            model.load_weights(iter(bucket))
    assert len(list(b.records.iterdir())) == 2  # two request-level syncs on disk
    result = verify(b.records, b.ckpt, weight_version="step-4")
    assert result.findings == [] and result.checked["syncs"] == 1


def test_bare_calls_carrying_one_weight_version_are_one_sync(bench: Callable[[str], Bench]) -> None:
    """A custom engine without `tap.sync`: each bucket is a bare load_weights call (a sync of its own on disk);
    the engine reports one weight version for all three, so verify checks them as one push: clean."""
    b = bench("llama")
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader, current_weight_version=lambda: "step-9"))
    model = b.engine()
    third = len(b.stream) // 3
    for bucket in (b.stream[:third], b.stream[third : 2 * third], b.stream[2 * third :]):
        model.load_weights(iter(bucket))
    assert len(list(b.records.iterdir())) == 3
    result = verify(b.records, b.ckpt)
    assert result.findings == [], [f.message for f in result.findings]
    assert result.checked["syncs"] == 1
    # A bucket withheld is still named, as in one sync.
    tap.configure(b.records / "again")
    model = b.engine()
    for bucket in (b.stream[:third], b.stream[2 * third :]):
        model.load_weights(iter(bucket))
    missing = {n for f in by_code(verify(b.records / "again", b.ckpt), "WC722") for n in f.details["names"]}
    assert missing == {n for n, _ in b.stream[third : 2 * third]}


def test_bare_calls_of_different_versions_stay_apart(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    versions = iter(["step-1", "step-2"])
    current = {"v": "step-1"}
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader, current_weight_version=lambda: current["v"]))
    model = b.engine()
    for version in versions:
        current["v"] = version
        model.load_weights(iter(b.stream))
    result = verify(b.records, b.ckpt)
    assert result.findings == [] and result.checked["syncs"] == 2  # not merged: no duplicate warnings


def test_untracked_parameters_are_unknown_never_dropped(bench: Callable[[str], Bench]) -> None:
    """No default loader given (the custom-engine recipe without `set_engine_hooks`): parameters without a
    loader attribute are `tracked: false`, and the tensors written into them are not WC731 drops."""
    b = bench("llama")
    tap.set_engine_hooks(tap.EngineHooks())  # no default_loader: every parameter of this engine is untracked
    model = b.engine()
    with tap.sync("step-1"):
        model.load_weights(iter([*b.stream, ("model.layers.0.mlp.gate.weight_packed", torch.ones(2))]))
    record = tap.read_record(next((b.records / "sync-00000").glob("*.jsonl")))
    assert record.params and not any(p.tracked for p in record.params.values())
    result = verify(b.records, b.ckpt)
    # The quantized companion matches no parameter at all: still a drop (an error), the rest is unknown.
    (dropped,) = by_code(result, "WC731")
    assert dropped.details["names"] == ["model.layers.0.mlp.gate.weight_packed"]
    assert "quantized tensor" in dropped.message
    assert codes(result) == {"WC731", "WC723"}


def test_instance_wrap_taps_one_object(bench: Callable[[str], Bench]) -> None:
    """`tap.wrap(model)`: the bound load_weights of one object (a trainer-side replica), class untouched."""
    b = bench("llama")
    tap.uninstall(Engine)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    model, other = b.engine(), b.engine()
    assert tap.wrap(model) is model and tap.wrap(model) is model  # idempotent
    other.load_weights(iter(b.stream))  # not wrapped: nothing recorded
    assert not list(b.records.rglob("*.jsonl"))
    with tap.sync("step-3"):
        model.load_weights(iter(b.stream))
    (file,) = b.records.rglob("*.jsonl")
    assert len(tap.read_record(file).tensors) == len(b.stream)
    assert verify(b.records, b.ckpt, weight_version="step-3").findings == []
    tap.unwrap(model)
    assert "load_weights" not in model.__dict__
    tap.install(Engine)  # the fixture uninstalls it


def test_record_cannot_point_its_tensors_outside_its_folder(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    b.push(b.stream)
    path = next((b.records / "sync-00000").glob("*.jsonl"))
    path.write_text(path.read_text().replace('"tensors_file":null', '"tensors_file":"../../etc/passwd"'))
    (bad,) = by_code(verify(b.records, b.ckpt), "WC720")
    assert "next to the record" in bad.message


# ---- digest algorithms ------------------------------------------------------------------------------------


def _configure_digest(b: Bench, algorithm: str) -> None:
    tap.configure(b.records, digest_threads=2, digest=algorithm)


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_records_of_either_algorithm_against_the_checkpoint(bench: Callable[[str], Bench], algorithm: str) -> None:
    b = bench("llama")
    _configure_digest(b, algorithm)
    b.push(b.stream, "step-1")
    corrupted = [(n, t * 1.5 if n == "model.layers.3.mlp.down_proj.weight" else t) for n, t in b.stream]
    b.push(corrupted, "step-2")
    (record,) = [r for p in sorted(b.records.glob("sync-00000/*.jsonl")) for r in [tap.read_record(p)]]
    assert record.header["digest"] == algorithm and {e.algorithm for e in record.tensors} == {algorithm}
    assert verify(b.records, b.ckpt, weight_version="step-1").findings == []  # the checkpoint is re-hashed
    (bad,) = by_code(verify(b.records, b.ckpt, weight_version="step-2"), "WC727")
    assert bad.details["names"] == ["model.layers.3.mlp.down_proj.weight"] and f"({algorithm})" in bad.message


def test_a_sha256_checkpoint_reference_is_rehashed_for_xxh3_records(bench: Callable[[str], Bench]) -> None:
    from weightcheck.verifying import load_reference

    b = bench("llama")
    _configure_digest(b, "xxh3_128")
    b.push(b.stream)
    reference = load_reference(b.ckpt)  # sha256, loaded before the records' algorithm was known
    try:
        assert {d.algorithm for d in reference.digests.values()} == {"sha256"}
        assert verify(b.records, reference).findings == []
    finally:
        reference.store.close()


def test_xxh3_records_against_an_xxh3_manifest(bench: Callable[[str], Bench], tmp_path: Path) -> None:
    b = bench("llama")
    _configure_digest(b, "xxh3_128")
    manifest = write_manifest(tmp_path / "m.json", b.stream, algorithm="xxh3_128")
    assert json.loads(manifest.read_text())["digest"] == "xxh3_128"
    b.push(b.stream, "step-1")
    b.push([(n, t + 1 if n == "model.norm.weight" else t) for n, t in b.stream], "step-2")
    assert verify(b.records, manifest, weight_version="step-1").findings == []
    (bad,) = by_code(verify(b.records, manifest, weight_version="step-2"), "WC727")
    assert bad.details["names"] == ["model.norm.weight"]


def test_a_manifest_of_another_algorithm_is_not_compared_not_mismatched(
    bench: Callable[[str], Bench], tmp_path: Path
) -> None:
    b = bench("llama")
    _configure_digest(b, "xxh3_128")
    manifest = write_manifest(tmp_path / "m.json", b.stream, algorithm="sha256")
    b.push(b.stream)
    result = verify(b.records, manifest)
    assert not {"WC725", "WC727", "WC728", "WC730"} & codes(result)  # no false mismatch or shift
    (finding,) = by_code(result, "WC721")
    assert "not compared" in finding.message and "WEIGHTCHECK_DIGEST=sha256" in finding.message
    assert finding.details["records_digest"] == "xxh3_128" and finding.details["reference_digest"] == "sha256"
    assert finding.count == len(b.stream) and result.exit_code() == 1  # unverified is not green


def test_ranks_hashing_with_different_algorithms_do_not_disagree(bench: Callable[[str], Bench]) -> None:
    b = bench("llama")
    tp = [({"tp_rank": r, "tp_size": 2}, range(4)) for r in range(2)]
    _configure_digest(b, "xxh3_128")
    b.push(b.stream, ranks=tp[:1])
    _configure_digest(b, "sha256")
    b.push(b.stream, ranks=tp[1:], seq=0)
    result = verify(b.records, b.ckpt, sync=0)
    assert result.findings == []  # each rank checked against the checkpoint in its own algorithm


def test_manifest_writer_refuses_a_digest_of_another_algorithm(tmp_path: Path) -> None:
    from weightcheck.digest import digest_tensor

    writer = ManifestWriter(tmp_path / "m.json", algorithm="xxh3_128")
    with pytest.raises(ValueError, match="sha256 digest in a xxh3_128 manifest"):
        writer.add_digest("w", digest_tensor(torch.ones(2), "sha256"))
