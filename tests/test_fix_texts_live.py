"""Fix texts of the diff/live-verify codes applied (issue #19 item 9), for the codes tests/test_fix_texts_all.py
listed as not yet applied: the engine-state checks (WC740–WC743, on the SGLang-like engine of
tests/test_engine_state.py), the FP8/float cast (WC745, engine of tests/test_tap_quant_cast.py), the
rounding-only difference (WC730, kept tensors on the bench of tests/test_verify.py), a partly written stacked
or expert parameter (WC733, loaders of tests/test_tap.py), a fused pair split across calls (WC736, a
DeepSeek-like fused loader), SGLang's /weights_checker verdict (WC737, its snapshot/reset/compare run on a real
tapped engine) and a malformed quantized diff candidate (WC717, llm-compressor W4A16). Each test makes the
real defect, checks that the finding's fix text contains the words applied, does what they say (in the next
sync, in what the trainer sends, or in the candidate's files), runs verify/diff again through the Python API,
and asserts that the code is gone and that no new error appeared. Records are evidence and are never
rewritten: the fixed sync is a new sync of the same records directory, selected by number or weight version.
WC744 (an info note) is excluded in tests/test_fix_texts_all.py, with the reason."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import test_engine_state as _es  # the tapped SGLang-like engine with state digests
import test_tap as _tt  # the SGLang-like engine with stacked q/k/v and FusedMoE loaders
import test_tap_quant_cast as _qc  # the FP8 engine whose loaders copy with a cast
import test_tap_wrote_into as _wi  # a Gemma checkpoint and an engine that adds 1 to the norms it is handed
import test_verify as _tv  # the tapped bench engine and its checkpoint stream
import torch
from torch import nn

from weightcheck import tap
from weightcheck.findings import Finding, Result, Severity
from weightcheck.verifying import verify

setup = _es.setup
records = _qc.records
bench = _tv.bench
gemma = _wi.gemma


def _flat(findings: list[Finding]) -> list[Finding]:
    """Findings with the follow-on findings folded under them (a folded code is still there)."""
    out: list[Finding] = []
    for f in findings:
        out.append(f)
        out.extend(_flat(f.related))
    return out


def _found(result: Result, code: str) -> list[Finding]:
    return [f for f in _flat(result.findings) if f.code == code]


def _errors(result: Result) -> set[tuple[str, str | None]]:
    return {(f.code, f.location.tensor) for f in _flat(result.findings) if f.severity == Severity.ERROR}


def _applied(before: Result, after: Result, code: str, said: str) -> None:
    """The finding was there with the words applied; after the edit it is gone and no new error came."""
    found = _found(before, code)
    assert found, f"the defect did not trigger {code}: {[(f.code, f.message) for f in _flat(before.findings)]}"
    assert all(said in f.fix for f in found), found[0].fix
    assert not _found(after, code), [(f.code, f.message) for f in _flat(after.findings)]
    assert not _errors(after) - _errors(before), [(f.code, f.message) for f in _flat(after.findings)]


# ---- WC740–WC743: engine state after the sync ------------------------------------------------------------
def test_wc740_fix_text_applied(setup: Any) -> None:
    """ "find the transport that wrote the parameter outside load_weights ... and fix its source tensor":
    a direct (load_weights-bypassing) write of a transposed tensor; the transport then writes the tensor
    the trainer meant (not transposed)."""
    records, ckpt, stream = setup
    model = _es.startup(stream)
    with tap.sync("step-1"):
        tap.note_model(model)
        model.load_direct([("norm.weight", stream[0][1]), ("o_proj.weight", stream[1][1].t())])
    before = verify(records, ckpt, sync=1)
    [finding] = _found(before, "WC740")
    assert finding.details["params"] == ["o_proj.weight"]  # names the parameter whose source to fix
    with tap.sync("step-2"):
        tap.note_model(model)
        model.load_direct(stream)  # the source tensor fixed
    _applied(before, verify(records, ckpt, sync=2), "WC740", "fix its source tensor or name mapping")


def test_wc742_fix_text_applied(setup: Any) -> None:
    """ "restore the buffer after memory release ... or recompute it after the sync": the rotary cache the
    release zeroed is recomputed (as the engine built it) before the next sync."""
    records, ckpt, stream = setup
    model = _es.startup(stream)
    model.rotary.cos_sin_cache.zero_()  # released and not restored
    with tap.sync("step-1"):
        model.load_weights(iter(stream))
    before = verify(records, ckpt, sync=1)
    [finding] = _found(before, "WC742")
    assert finding.details["names"] == ["rotary.cos_sin_cache"]
    model.rotary.cos_sin_cache.copy_(_es.RotaryEmbedding().cos_sin_cache)  # recomputed
    with tap.sync("step-2"):
        model.load_weights(iter(stream))
    _applied(before, verify(records, ckpt, sync=2), "WC742", "recompute it after the sync")


def test_wc743_fix_text_applied(setup: Any) -> None:
    """ "check ... any write after load_weights": the write that followed load_weights in the sync is
    removed; the next sync's parameter holds what it received."""
    records, ckpt, stream = setup
    model = _es.startup(stream)
    with tap.sync("step-1"):
        model.load_weights(iter(stream))
        model.norm.weight.data.mul_(2)  # a later write outside load_weights
    before = verify(records, ckpt, sync=1)
    [finding] = _found(before, "WC743")
    assert finding.details["params"] == ["norm.weight"]
    with tap.sync("step-2"):
        model.load_weights(iter(stream))  # and nothing after it
    _applied(before, verify(records, ckpt, sync=2), "WC743", "any write after load_weights")


def test_wc741_fix_text_applied(tmp_path: Path) -> None:
    """ "re-sync from one source so every ... DP engine receives the same bytes": two DP engines got
    different tensors for step-1; step-2 sends both the one source's tensor."""
    records = tmp_path / "records"
    tap.set_engine_hooks(tap.EngineHooks(default_loader=_es.default_loader))
    try:
        for version, scales in (("step-1", (1.0, 2.0)), ("step-2", (1.0, 1.0))):
            for engine, scale in zip(("engine-a", "engine-b"), scales, strict=True):
                tap.configure(records, state=True, engine=engine)
                model = tap.wrap(_es.Model())
                with tap.sync(version):
                    model.load_weights([("norm.weight", torch.full((8,), scale))])
    finally:
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())
    before = verify(records, None, weight_version="step-1")
    [finding] = _found(before, "WC741")
    assert finding.details["engines"] == ["engine-a", "engine-b"]
    after = verify(records, None, weight_version="step-2")
    assert after.checked.get("syncs", 0) >= 1  # the fixed syncs were checked, not skipped
    _applied(before, after, "WC741", "re-sync from one source so every TP/EP rank (or DP engine) receives")


# ---- WC745: FP8 codes cast into a float parameter, or a float tensor into an FP8 one ----------------------
def test_wc745_fix_text_applied_router(records: Path) -> None:
    """ "leave modules the engine builds unquantized (routers ...) in BF16": the router is sent in BF16."""
    _qc.push(records, _qc.stream(router_fp8=True))
    before = verify(records, weight_version="step-1")
    [finding] = _found(before, "WC745")
    assert finding.details["names"] == ["router.weight"]
    model = tap.wrap(_qc.Engine())
    with tap.sync("step-2"):
        model.load_weights(iter(_qc.stream()))
    _applied(before, verify(records, weight_version="step-2"), "WC745",
             "leave modules the engine builds unquantized (routers, ignore list) in BF16")  # fmt: skip


def test_wc745_fix_text_applied_quantized_module(records: Path) -> None:
    """ "quantize every module it serves quantized, with its scale": proj is sent as FP8 with its scale."""
    _qc.push(records, _qc.stream(proj_bf16=True))
    before = verify(records, weight_version="step-1")
    [finding] = _found(before, "WC745")
    assert finding.details["names"] == ["proj.weight"]
    model = tap.wrap(_qc.Engine())
    with tap.sync("step-2"):
        model.load_weights(iter(_qc.stream()))
    _applied(before, verify(records, weight_version="step-2"), "WC745",
             "quantize every module it serves quantized, with its scale")  # fmt: skip


# ---- WC746: the engine wrote into the tensor it was handed before the tap digested it --------------------
def test_wc746_fix_text_applied(gemma: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ "set WEIGHTCHECK_TAP_SYNC_DIGEST=1 in the engine": a fresh engine process with it set compares the norms
    in its first sync too."""
    from weightcheck.tap import digesting

    records_dir, ckpt, stream = gemma
    monkeypatch.setattr(digesting, "_WROTE_INTO", set())
    tap.configure(records_dir)
    _wi.sync(_wi.GemmaLike(stream), stream, "step-1")
    before = verify(records_dir, ckpt, weight_version="step-1")
    assert _found(before, "WC746")[0].details["names"] == _wi.norms(stream)
    monkeypatch.setattr(digesting, "_WROTE_INTO", set())  # a new engine process
    monkeypatch.setenv("WEIGHTCHECK_DIR", str(records_dir))
    monkeypatch.setenv("WEIGHTCHECK_TAP_SYNC_DIGEST", "1")
    tap.configure_from_env()  # how the engine's plugin configures the tap
    _wi.sync(_wi.GemmaLike(stream), stream, "step-2")
    after = verify(records_dir, ckpt, weight_version="step-2")
    _applied(before, after, "WC746", "set WEIGHTCHECK_TAP_SYNC_DIGEST=1 in the engine")
    assert after.findings == [], [(f.code, f.message) for f in after.findings]


# ---- WC730: a difference within the rounding of a lower-precision transfer -------------------------------
def test_wc730_fix_text_applied(bench: Any) -> None:
    """ "use a lossless dtype if bytes must match": the trainer sends the F32 checkpoint tensor it had
    rounded to BF16 in its own dtype."""
    b = bench("llama")
    tap.configure(b.records, keep_tensors=True)
    down = "model.layers.2.mlp.down_proj.weight"
    b.push([(n, t.to(torch.bfloat16) if n == down else t) for n, t in b.stream], "step-1")
    before = verify(b.records, b.ckpt, weight_version="step-1")
    [finding] = _found(before, "WC730")
    assert finding.details["names"] == [down]
    b.push(list(b.stream), "step-2")  # the lossless dtype: the checkpoint's own
    after = verify(b.records, b.ckpt, weight_version="step-2")
    _applied(before, after, "WC730", "use a lossless dtype if bytes must match")
    assert not after.findings, [(f.code, f.message) for f in after.findings]


# ---- WC733: a stacked or expert parameter partly written ---------------------------------------------------
@pytest.fixture
def stacked(tmp_path: Path) -> Iterator[Path]:
    """The SGLang-like engine of tests/test_tap.py: stacked q/k/v (`loaded_shard_id`) and a FusedMoE whose
    loader takes shard and expert ids, tapped into one records directory."""
    root = tmp_path / "records"
    tap.configure(root, digest_threads=1)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=_tt.default_loader))
    tap.install(_tt.Engine)
    try:
        yield root
    finally:
        tap.uninstall(_tt.Engine)
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())


@pytest.mark.parametrize(
    ("left_out", "missing"),
    [("layers.0.k_proj.weight", "shard k never written"), ("layers.1.experts.3.", "local experts 3 never written")],
    ids=["qkv-shard", "expert"],
)
def test_wc733_fix_text_applied(stacked: Path, left_out: str, missing: str) -> None:
    """ "send every shard/expert of the parameter in the same sync": the trainer's bucket filter left out the
    k shard of a stacked qkv (or one expert's projections); the next sync sends all of them."""
    model = _tt.Engine(moe=True)
    full = _tt.stream(moe=True)
    with tap.sync("step-1"):
        model.load_weights(iter([(n, t) for n, t in full if not n.startswith(left_out)]))
    before = verify(stacked, weight_version="step-1")
    [finding] = _found(before, "WC733")
    assert finding.details["missing"].startswith(missing), finding.details
    with tap.sync("step-2"):
        model.load_weights(iter(full))
    after = verify(stacked, weight_version="step-2")
    _applied(before, after, "WC733", "send every shard/expert of the parameter in the same sync")
    assert not after.findings, [(f.code, f.message) for f in after.findings]


# ---- WC736: a fused pair split across load_weights calls -----------------------------------------------------
class _Weight(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, 8), requires_grad=False)


class _FusedAAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fused_qkv_a_proj_with_mqa = _Weight(6)


class _FusedAEngine(nn.Module):
    """Loads like SGLang's DeepSeek-V2/V3 with `fused_qkv_a_proj_with_mqa`: q_a_proj and kv_a_proj_with_mqa are
    cached within one load_weights call and written, concatenated, once both arrived in it; a half left over
    when the call ends is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Module()])
        self.layers[0].self_attn = _FusedAAttention()
        self.norm = _Weight(1)

    def load_weights(self, weights: Any) -> None:
        params = dict(self.named_parameters())
        cached: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            if ".q_a_proj." in name or ".kv_a_proj_with_mqa." in name:
                cached[name] = tensor
                q_a = name.replace(".kv_a_proj_with_mqa.", ".q_a_proj.")
                kv_a = q_a.replace(".q_a_proj.", ".kv_a_proj_with_mqa.")
                if q_a in cached and kv_a in cached:
                    fused = torch.cat([cached.pop(q_a), cached.pop(kv_a)])
                    param = params[q_a.replace(".q_a_proj.", ".fused_qkv_a_proj_with_mqa.")]
                    getattr(param, "weight_loader", _es.default_loader)(param, fused)
            elif name in params:
                getattr(params[name], "weight_loader", _es.default_loader)(params[name], tensor)


def test_wc736_fix_text_applied(tmp_path: Path) -> None:
    """ "send q_a_proj and kv_a_proj_with_mqa of a layer in the same load_weights call": the trainer's
    buckets cut the pair apart (neither half is written); the fixed bucketing keeps it in one bucket."""
    root = tmp_path / "records"
    tap.configure(root, digest_threads=1)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=_es.default_loader))
    try:
        model = tap.wrap(_FusedAEngine())
        q_a = ("layers.0.self_attn.q_a_proj.weight", torch.randn(4, 8))
        kv_a = ("layers.0.self_attn.kv_a_proj_with_mqa.weight", torch.randn(2, 8))
        norm = ("norm.weight", torch.randn(1, 8))
        with tap.sync("step-1"):
            model.load_weights(iter([norm, q_a]))  # bucket 1
            model.load_weights(iter([kv_a]))  # bucket 2
        before = verify(root, weight_version="step-1")
        [finding] = _found(before, "WC736")
        assert finding.details["pair"] == [q_a[0], kv_a[0]]
        with tap.sync("step-2"):
            model.load_weights(iter([norm]))
            model.load_weights(iter([q_a, kv_a]))  # one bucket holds both
        after = verify(root, weight_version="step-2")
    finally:
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())
    _applied(before, after, "WC736", "send q_a_proj and kv_a_proj_with_mqa of a layer in the same load_weights call")
    assert not after.findings, [(f.code, f.message) for f in after.findings]
    fused = model.layers[0].self_attn.fused_qkv_a_proj_with_mqa.weight
    assert torch.equal(fused, torch.cat([q_a[1], kv_a[1]]))  # the fix reached the engine's parameter


# ---- WC717: a malformed quantized candidate in `weightcheck diff` --------------------------------------------
@pytest.fixture(scope="module")
def w4a16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny bf16 Llama (save_pretrained) and its W4A16 export by llm-compressor `oneshot`, built with the
    helpers of tests/quant_fixtures.py (one layer: only the scheme this test needs, not the whole suite)."""
    from quant_fixtures import build_base, quantize

    root = tmp_path_factory.mktemp("wc717")
    base = build_base(root / "base", layers=1)
    return base, quantize(base, "W4A16", root / "W4A16")


def test_wc717_fix_text_applied(w4a16: tuple[Path, Path], tmp_path: Path) -> None:
    """ "re-export the quantized module": the candidate's up_proj scale was written with the wrong group
    count; the module the finding names is written again, every stored part of it, from the untouched
    export, and the diff against the base passes within quantization error."""
    import shutil

    from quant_fixtures import edit_tensors
    from safetensors import safe_open

    from weightcheck.diffing import DiffOptions, diff

    base, export = w4a16
    candidate = shutil.copytree(export, tmp_path / "candidate")
    scale = "model.layers.0.mlp.up_proj.weight_scale"
    edit_tensors(candidate, lambda t: t.__setitem__(scale, torch.ones(512, 3, dtype=torch.bfloat16)))
    before = diff(base, candidate, DiffOptions())
    [finding] = _found(before, "WC717")
    module = finding.location.tensor.removesuffix(".weight")
    assert module == "model.layers.0.mlp.up_proj"
    exported: dict[str, torch.Tensor] = {}
    for shard in export.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as fh:
            exported.update({k: fh.get_tensor(k) for k in fh.keys() if k.startswith(module + ".")})
    assert len(exported) >= 3  # packed weight, scale, shape: the whole module, as the quantizer wrote it
    edit_tensors(candidate, lambda t: t.update(exported))
    after = diff(base, candidate, DiffOptions())
    _applied(before, after, "WC717", "re-export the quantized module")
    assert after.exit_code() == 0, [(f.code, f.message) for f in _flat(after.findings)]


# ---- WC737: SGLang's own /weights_checker, next to weightcheck's findings -----------------------------------
class _CheckerOf(http.server.BaseHTTPRequestHandler):
    """/weights_checker as SGLang 0.5.23 runs it, on a real (tapped) engine's parameters: `snapshot` copies
    them, `reset_tensors` overwrites them with random values, `compare` reports every parameter that differs
    from the snapshot (400 with SGLang's "check tensor equality failed" message), so its verdict follows what
    the push actually wrote."""

    engine: ClassVar[Any] = None
    snapshot: ClassVar[dict[str, torch.Tensor]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        params = dict(type(self).engine.named_parameters())
        bad: list[str] = []
        if body["action"] == "snapshot":
            type(self).snapshot = {n: p.detach().clone() for n, p in params.items()}
        elif body["action"] == "reset_tensors":
            for p in params.values():
                p.data.copy_(torch.rand_like(p, dtype=torch.float32).to(p.dtype))
        elif body["action"] == "compare":
            bad = [n for n, p in params.items() if not torch.equal(p, type(self).snapshot[n])]
        lines = [f"name={n} max_abs_err={(params[n].float() - type(self).snapshot[n].float()).abs().max():g}"
                 for n in bad]  # fmt: skip
        message = "check tensor equality failed:\n" + "\n".join(lines) if bad else "ok"
        payload = json.dumps({"success": not bad, "message": message}).encode()
        self.send_response(400 if bad else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


def test_wc737_fix_text_applied(bench: Any) -> None:
    """ "find the parameter SGLang's /weights_checker names, then apply the fix of weightcheck's finding for
    that parameter": the step-0 check (snapshot → reset → push the same weights → compare) of a trainer that
    withholds one tensor; SGLang names the parameter, weightcheck's WC722 for the same name says "make the
    trainer send the tensor", and the re-run push that does passes both."""
    from weightcheck.integrations.weights_checker import checked_weight_update
    from weightcheck.verifying import WeightSyncError

    b = bench("llama")
    engine = b.engine()
    reference = dict(b.stream)
    _CheckerOf.engine = engine
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CheckerOf)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    withheld = "model.layers.1.post_attention_layernorm.weight"

    def push(version: str, sent: list[tuple[str, torch.Tensor]]) -> None:
        """The step-0 check: the engine starts from the checkpoint on disk (what the snapshot holds), the
        trainer pushes the same weights."""
        for name, param in engine.named_parameters():
            param.data.copy_(reference[name])
        with (
            checked_weight_update(b.records, b.ckpt, engines=[url], weight_version=version),
            tap.sync(version, source="session"),
        ):
            engine.load_weights(iter(sent))

    try:
        with pytest.raises(WeightSyncError) as caught:
            push("step-0", [(n, t) for n, t in b.stream if n != withheld])
        before = caught.value.result
        [checker] = _found(before, "WC737")
        [named] = re.findall(r"name=(\S+)", checker.message)  # the parameter SGLang names
        assert named == withheld
        [matching] = [f for f in _flat(before.findings) if f.code.startswith("WC72") and named in f.subjects()]
        assert "make the trainer send the tensor" in matching.fix  # its fix, applied: the tensor is sent
        push("step-0-rerun", list(b.stream))
    finally:
        server.shutdown()
        server.server_close()
    after = verify(b.records, b.ckpt, weight_version="step-0-rerun")
    assert after.checked.get("syncs", 0) >= 1
    _applied(before, after, "WC737", "find the parameter SGLang's /weights_checker names")
    assert "then apply the fix of weightcheck's finding for that parameter" in checker.fix


# ---- registration in the fix-text meta-test -----------------------------------------------------------------
APPLIED_HERE = {"WC717", "WC730", "WC733", "WC736", "WC737", "WC740", "WC741", "WC742", "WC743", "WC745"}


def test_codes_applied_here_are_registered_as_applied() -> None:
    """The meta-test of tests/test_fix_texts_all.py counts these codes as applied only through its
    APPLIED_ELSEWHERE set: each must be there, none may still be listed as not yet applied, and each must
    have a test in this file."""
    import test_fix_texts_all as meta

    assert APPLIED_HERE <= meta.APPLIED_ELSEWHERE
    assert not APPLIED_HERE & set(meta.NOT_YET)
    for code in APPLIED_HERE:
        assert any(name.startswith(f"test_{code.lower()}_fix_text_applied") for name in globals()), code
