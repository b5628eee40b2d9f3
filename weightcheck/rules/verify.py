"""WC720–WC749: live weight-sync verification (`weightcheck verify`). Fired by `weightcheck.verifying`, not by lint.

Each rule is a module constant (`SYNC_TENSOR_MISSING`...) that the verify package imports and builds its
findings from (`make_finding`, or `weightcheck.verifying.sink.FindingSink.add`); the rule carries its doc,
examples and fix text. `verify_rule(code)` looks a code up and raises `UnknownRuleCode` for a code that is
not one of these, so a mistyped code fails loudly instead of being dropped.
"""

from __future__ import annotations

from weightcheck.findings import Finding, Location, Severity
from weightcheck.rules import Rule, UnknownRuleCode, metadata_rule

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

# Severities verify emits besides the default (identical duplicates and untraceable writes are warnings;
# ranks that never arrived under --expect-records are an error).
_ALSO = {
    "WC724": frozenset({Severity.WARNING}),
    "WC731": frozenset({Severity.WARNING}),
    "WC734": frozenset({Severity.ERROR}),
}

VERIFY_RULES: dict[str, Rule] = {}


def _verify_rule(code: str, name: str, severity: Severity, *texts: str, fix: str) -> Rule:
    """`metadata_rule` with texts summary, doc, bad, good in that order, kept in VERIFY_RULES."""
    new = metadata_rule(code, name, severity, *texts, fix=fix, command="verify", also=_ALSO.get(code, frozenset()))
    VERIFY_RULES[code] = new
    return new


def verify_rule(code: str | Rule) -> Rule:
    """The registered verify rule for `code` (or the Rule itself, checked to be one of verify's)."""
    key = code.code if isinstance(code, Rule) else code
    found = VERIFY_RULES.get(key)
    if found is None or (isinstance(code, Rule) and code is not found):
        raise UnknownRuleCode(f"{key!r} is not a weightcheck verify rule (WC720–WC749 registered in {__name__})")
    return found


def make_finding(
    rule: Rule,
    message: str,
    *,
    file: str | None = None,
    tensor: str | None = None,
    module: str | None = None,
    count: int = 1,
    severity: Severity | None = None,
    details: dict[str, Any] | None = None,
) -> Finding:
    """A finding of verify rule `rule`, with the rule's code, name, default severity and fix text."""
    rule = verify_rule(rule)
    return Finding(
        code=rule.code,
        name=rule.name,
        severity=severity or rule.severity,
        message=message,
        location=Location(file=file, tensor=tensor, module=module),
        count=count,
        details=details or {},
        fix=rule.fix_text(),
    )


SYNC_RECORD_INVALID = _verify_rule(
    "WC720",
    "sync-record-invalid",
    Severity.ERROR,
    "A tap record file cannot be read (truncated, not JSON, wrong schema).",
    """
    Records are written atomically, so a damaged file means something other than the tap wrote or cut it.
    The file is skipped; the other ranks are still checked.
    """,
    "sync-00003/tp0-pp0-ep0.host.123.jsonl  # no 'end' line",
    'every record ends with {"t": "end", ...} carrying the counts',
    # Applied in tests/test_fix_texts_all.py: a re-run alone left the finding (the unreadable file cannot say
    # which sync it held, so verify reports it whatever sync is selected).
    fix="re-run the sync with the tap enabled (a truncated record means the process died while writing), "
    "then move the damaged record file out of the records directory: it cannot say which sync it held, so "
    "it is reported whatever sync you select",
)
SYNC_REFERENCE_INVALID = _verify_rule(
    "WC721",
    "sync-reference-invalid",
    Severity.ERROR,
    "The reference (checkpoint or trainer manifest) cannot be read, its parts disagree, or its digests cannot "
    "be compared with the records'.",
    """
    Without a readable reference only the engine-side checks (dropped names, parameters never written) run.
    Manifest parts written by several trainer ranks must agree on every name they share. A manifest whose
    digests use another algorithm than the records (sha256 vs xxh3_128) holds no data to re-hash: its
    tensors are reported here as not compared, never as mismatches.
    """,
    "weightcheck verify rec/ --against broken-manifest.json",
    "weightcheck verify rec/ --against manifests/step-7/",
    fix="pass a reference checkpoint or manifest that is readable and uses the records' digest algorithm",
)
SYNC_TENSOR_MISSING = _verify_rule(
    "WC722",
    "sync-tensor-missing",
    Severity.ERROR,
    "The reference has a tensor that no rank received in this sync.",
    """
    A tensor the trainer should have pushed never arrived: the engine keeps its old (or, after
    `release_memory_occupation`, garbage) value. When the missing names are the true names of a shifted
    stage or expert group, the message points at WC725/WC726. The tap sees what the engine consumed: after
    a `load_weights` call raised (WC739), the rest of its request was sent but never consumed, and the
    message says so instead of "never sent".
    """,
    "reference: model.layers.3.mlp.down_proj.weight; sync: (absent)",
    "every reference tensor is sent once per sync",
    fix="make the trainer send the tensor (check its name mapping and bucket filter)",
)
SYNC_TENSOR_UNEXPECTED = _verify_rule(
    "WC723",
    "sync-tensor-unexpected",
    Severity.WARNING,
    "A tensor was sent that the reference does not have.",
    """
    Often a quantized companion (`weight_packed`, `weight_scale`) of a tensor the reference holds unquantized,
    a layer id beyond the model, or a name in another naming scheme.
    """,
    "sync: model.layers.0.mlp.gate.weight_packed; reference: model.layers.0.mlp.gate.weight",
    "sync and reference use the same names",
    fix="fix the sender's name mapping, or drop the tensor from the update",
)
SYNC_TENSOR_DUPLICATED = _verify_rule(
    "WC724",
    "sync-tensor-duplicated",
    Severity.ERROR,
    "A name was sent more than once in one sync (or by several trainer ranks).",
    """
    With different contents the engine keeps whichever arrived last: typically two pipeline stages sending
    the same layer ids (see WC725). Identical repeats are a warning (wasted bandwidth).
    """,
    "pp_rank 0 and pp_rank 1 both send model.layers.0.*",
    "each stage sends its own global layer ids",
    fix="send each name once per sync (check overlapping buckets or ranks both sending it)",
)
SYNC_LAYER_SHIFTED = _verify_rule(
    "WC725",
    "sync-layer-shifted",
    Severity.ERROR,
    "Layers carry the data of other layers: a pipeline stage sent its layers without (or with a wrong) offset.",
    """
    The digest of a sent tensor equals the reference digest of the same tensor in another layer. The shift
    and the trainer stage that sent the layers are inferred with `weightcheck.layout` (Megatron offsets; pass
    `--trainer-pp` and friends, or record them in the trainer manifest, to make the stage exact).
    """,
    "pp_rank 1 sends layers 2..3 as model.layers.0..1 (local ids, offset forgotten)",
    "pp_rank 1 adds its offset 2: model.layers.2..3",
    fix="add the pipeline stage's layer offset where the trainer names its layers",
)
SYNC_EXPERT_SHIFTED = _verify_rule(
    "WC726",
    "sync-expert-shifted",
    Severity.ERROR,
    "Experts carry the data of other experts: an expert-parallel rank sent local expert ids.",
    """
    The digest of a sent expert tensor equals the reference digest of another expert of the same layer; the
    EP rank is inferred from the shift and the expert count (`--trainer-ep` makes it exact).
    """,
    "ep_rank 1 sends experts 2..3 as mlp.experts.0..1",
    "ep_rank 1 offsets its local expert ids by 2",
    fix="add the expert-parallel rank's expert offset where the trainer names its experts",
)
SYNC_TENSOR_MISMATCH = _verify_rule(
    "WC727",
    "sync-tensor-mismatch",
    Severity.ERROR,
    "A sent tensor differs from the reference (dtype, shape, bytes or values).",
    """
    Classified when possible: another tensor's data, dtype or shape changed, sent transposed (a square
    matrix keeps its shape: named when the checkpoint's transposed tensor has the sent digest, or diff's
    classifier says so on a kept tensor), bytes differ; with `WEIGHTCHECK_TAP_TENSORS=1` and a checkpoint
    reference the values are compared too (max abs, rel-L2).
    """,
    "sync: q_proj.weight sha256 3f2a…; reference: 9c1d…",
    "digests equal on both sides",
    fix="find where the sent bytes diverge from the trainer's (casting, resharding, stale buffer)",
)
SYNC_TENSOR_ZEROS = _verify_rule(
    "WC728",
    "sync-tensor-zeros",
    Severity.ERROR,
    "A sent tensor is all zeros where the reference is not.",
    """
    A zero router or head makes the rollout garbage without any error (a common symptom of a converter that
    allocated but never filled a buffer).
    """,
    "sync: model.layers.0.mlp.gate.weight == 0",
    "the router carries trained values",
    fix="the sender sent a zeroed buffer: check it is filled before the broadcast",
)
SYNC_TENSOR_NONFINITE = _verify_rule(
    "WC729",
    "sync-tensor-nonfinite",
    Severity.ERROR,
    "A sent tensor holds NaN or Inf values.",
    "Counted by the tap on the incoming tensor; reported whether or not a reference is given.",
    "sync: model.norm.weight has 64 NaN",
    "all values finite",
    fix="find the step that produced NaN/Inf before the sync",
)
SYNC_WITHIN_TOLERANCE = _verify_rule(
    "WC730",
    "sync-within-tolerance",
    Severity.WARNING,
    "A sent tensor differs from the reference only within the rounding of its lower-precision dtype.",
    """
    Needs the tensors themselves (`WEIGHTCHECK_TAP_TENSORS=1`) and a checkpoint reference. Bound: rel-L2 of
    the difference below the rounding error of the coarser dtype (BF16 2^-8, F16 2^-11, FP8 E4M3 2^-4).
    """,
    "sync sends F32 values of a BF16 checkpoint tensor",
    "sync sends the BF16 bytes",
    fix="expected for a lower-precision transfer; use a lossless dtype if bytes must match",
)
ENGINE_DROPPED_TENSOR = _verify_rule(
    "WC731",
    "engine-dropped-tensor",
    Severity.ERROR,
    "The engine received a tensor and wrote it into no parameter on any rank.",
    """
    SGLang drops names it cannot place, often silently (Qwen3-MoE and GLM4-MoE never log it): a quantized
    router (`mlp.gate.weight_packed`) for an unquantized router, transformers-5 fused expert names, a layer id
    beyond the model. Names skipped because another rank owns them (pipeline stage, expert) are not reported.
    A tensor the engine raised on (WC739) is reported as such, not as a name the engine has no parameter for.
    """,
    "sync: model.layers.0.mlp.gate.weight_packed → no parameter written",
    "sync: model.layers.0.mlp.gate.weight → mlp.gate.weight written",
    fix="fix the engine-side name the tensor is sent under, so a weight_loader takes it",
)
ENGINE_PARAM_NEVER_WRITTEN = _verify_rule(
    "WC732",
    "engine-param-never-written",
    Severity.ERROR,
    "An engine parameter received no data in this sync.",
    """
    It keeps its previous value (or garbage after a memory release, or the pattern a checker filled in).
    In update syncs, parameters never written in the first recorded sync (derived buffers) are not expected.
    """,
    "model.layers.1.self_attn.fused_qkv_a_proj_with_mqa.weight: never written",
    "every parameter is written by the sync",
    fix="send the parameter in every sync (check the trainer's bucket list)",
)
ENGINE_PARAM_PARTIALLY_WRITTEN = _verify_rule(
    "WC733",
    "engine-param-partially-written",
    Severity.ERROR,
    "A stacked or expert parameter got only some of its shards or experts.",
    """
    `qkv_proj` needs q, k and v; `gate_up_proj` gate and up; a fused-MoE `w13` every local expert's w1 and w3.
    A part never written keeps its old values while the parameter looks "written".
    """,
    "model.layers.0.self_attn.qkv_proj.weight: shard k never written",
    "all shards written",
    fix="send every shard/expert of the parameter in the same sync",
)
SYNC_RANKS_INCOMPLETE = _verify_rule(
    "WC734",
    "sync-ranks-incomplete",
    Severity.WARNING,
    "Records of some engine ranks are missing (or duplicated), so cross-rank checks are partial.",
    """
    Each rank writes its own record. Without all pipeline stages, a name owned by a missing stage cannot be
    told apart from a dropped one, so WC731 is not reported for it.
    """,
    "pp_size 2, records only for pp_rank 0",
    "one record per (tp_rank, pp_rank)",
    fix="enable the tap on every engine rank (WEIGHTCHECK_DIR visible to each), then re-run",
)
SYNC_RANKS_DISAGREE = _verify_rule(
    "WC735",
    "sync-ranks-disagree",
    Severity.ERROR,
    "Engine ranks received different bytes for the same name.",
    "Every rank of an engine gets the same full tensor; a difference means a corrupted or stale transfer.",
    "tp_rank 0 and tp_rank 1 got different model.embed_tokens.weight",
    "identical digests on every rank",
    fix="make every rank receive the same bytes (check the broadcast group)",
)
SYNC_FUSED_PAIR_SPLIT = _verify_rule(
    "WC736",
    "sync-fused-pair-split",
    Severity.ERROR,
    "A pair the engine fuses within one load_weights call arrived in different calls.",
    """
    SGLang's DeepSeek loader caches `q_a_proj` and `kv_a_proj_with_mqa` per call and writes
    `fused_qkv_a_proj_with_mqa` only when both arrive in the same call; split across buckets, both are dropped
    silently (sgl-project/sglang#14178). Keep the pair in one bucket.
    """,
    "bucket 3: layers.5.self_attn.q_a_proj.weight; bucket 4: layers.5.self_attn.kv_a_proj_with_mqa.weight",
    "one bucket holds both",
    fix="send q_a_proj and kv_a_proj_with_mqa of a layer in the same load_weights call (one bucket holds "
    "both): the engine fuses the pair only within one call and drops a half left over",
)
ENGINE_CHECKER_FAILED = _verify_rule(
    "WC737",
    "engine-checker-failed",
    Severity.ERROR,
    "SGLang's own /weights_checker compare reported a mismatch (interop mode).",
    "Reported next to weightcheck's localised findings for the same sync.",
    "/weights_checker compare: check tensor equality failed",
    "/weights_checker compare: success",
    fix="find the parameter SGLang's /weights_checker names, then apply the fix of weightcheck's finding "
    "for that parameter in the same sync (WC72x/WC74x: it says what went wrong), and re-run the checked push",
)
SYNC_NOT_FOUND = _verify_rule(
    "WC738",
    "sync-not-found",
    Severity.ERROR,
    "No records for the requested sync or weight version.",
    "The tap was off, the engine wrote elsewhere, or the version string differs from the one pushed.",
    "weightcheck verify rec/ --weight-version step-9  # only step-1..8 recorded",
    "the version that was pushed",
    fix="pass a sync or weight version that the records hold",
)
SYNC_LOAD_FAILED = _verify_rule(
    "WC739",
    "sync-load-failed",
    Severity.ERROR,
    "load_weights raised during the sync, or the sync never ended.",
    "The engine holds a partial update; SGLang's tensor path does not roll back.",
    "call 2 raised KeyError: 'model.layers.0.self_attn.qkv_proj.weight_packed'",
    "every call completes",
    fix="read the engine's log for the load_weights exception; an unfinished sync must be re-run",
)
ENGINE_STATE_DIVERGED = _verify_rule(
    "WC740",
    "engine-state-diverged",
    Severity.ERROR,
    "After the sync, an engine parameter differs from its state after the startup load of the same checkpoint.",
    """
    Needs `WEIGHTCHECK_STATE=1` in the engine (the tap digests every parameter and buffer after each sync) and
    the startup checkpoint as the reference: pushing the weights the engine started from must leave its
    state as the startup load left it. Covers transports that bypass load_weights (`load_format="direct"`,
    custom loaders, RDMA/P2P), which the stream checks cannot see.
    """,
    "update_weights_from_tensor(load_format='direct') wrote gate_up_proj from the wrong tensor",
    "every parameter equals its startup state",
    fix="find the transport that wrote the parameter outside load_weights (direct, custom loader, "
    "RDMA/P2P) and fix its source tensor or name mapping; WC744 says which sync bypassed the tap",
)
ENGINE_REPLICAS_DISAGREE = _verify_rule(
    "WC741",
    "engine-replicas-disagree",
    Severity.ERROR,
    "Replicas that must hold the same bytes do not: a replicated tensor across TP/EP ranks, or two DP engines.",
    """
    Norms, routers and other tensors that are not split across ranks must be equal on every TP/EP rank of a
    pipeline stage; two engines serving one weight version must hold equal state rank by rank. Needs
    `WEIGHTCHECK_STATE=1`.
    """,
    "model.layers.3.mlp.gate.weight differs between tp_rank 0 and tp_rank 1",
    "replicated tensors agree on every rank",
    fix="re-sync from one source so every TP/EP rank (or DP engine) receives the same bytes; check the "
    "broadcast group and any rank-local post-processing",
)
ENGINE_BUFFER_CHANGED = _verify_rule(
    "WC742",
    "engine-buffer-changed",
    Severity.ERROR,
    "A registered buffer differs from its state after the startup load (released and not restored?).",
    """
    Buffers (rotary caches, masks, derived constants) are not written by weight syncs. One that changed was
    most likely released during memory release (`release_memory_occupation`) and not restored, or
    overwritten by a transport. Needs `WEIGHTCHECK_STATE=1`.
    """,
    "model.layers.0.self_attn.rotary_emb.cos_sin_cache: all zeros after resume",
    "every buffer equals its startup state",
    fix="restore the buffer after memory release (resume with its tags) or recompute it after the sync",
)
ENGINE_PARAM_NOT_AS_RECEIVED = _verify_rule(
    "WC743",
    "engine-param-not-as-received",
    Severity.ERROR,
    "A parameter written whole by one incoming tensor does not hold that tensor's bytes after the sync.",
    """
    The tap saw the tensor reach the parameter's loader, yet the parameter holds something else: a loader
    that transformed it, a later write outside load_weights, or a write that did not land. Compared only
    where dtype and shape are equal (no TP split, padding or cast). Needs `WEIGHTCHECK_STATE=1`.
    """,
    "model.norm.weight holds other bytes than the model.norm.weight the tap saw written into it",
    "every whole-tensor write holds the bytes received",
    fix="check the parameter's weight_loader (a transform or a write that did not land) and any write "
    "after load_weights",
)
SYNC_BYPASSED_LOAD_WEIGHTS = _verify_rule(
    "WC744",
    "sync-bypassed-load-weights",
    Severity.INFO,
    "Nothing reached load_weights in this sync; only the engine-state checks judged it.",
    """
    A sync through `load_format="direct"`, a custom weight loader or RDMA/P2P: the stream checks have nothing
    to compare, so verify reports how many engine parameters changed and relies on WC740–WC742.
    """,
    "sync 4: 0 tensors through load_weights; 38 parameters changed since sync 3",
    "transports that go through load_weights, or WEIGHTCHECK_STATE=1",
    fix="expected for direct/custom/P2P transports; enable WEIGHTCHECK_STATE=1 so the state checks judge "
    "them",
)
ENGINE_PARAM_CAST_ACROSS_QUANTIZATION = _verify_rule(
    "WC745",
    "engine-param-cast-across-quantization",
    Severity.ERROR,
    "A loader copied FP8 data into an unquantized parameter, or unquantized data into an FP8 parameter.",
    """
    Most of SGLang's loaders copy with a cast (`param.data.copy_(loaded_weight)`), so a dtype that crosses
    the FP8/float line raises nothing (0.5.23 refuses a downcast only in `load_column_parallel_weight` off
    CPU: "Downcasting not allowed", THUDM/slime#1679, recorded as a failed load, WC739). FP8 codes written
    into a BF16 parameter (a router the engine builds with `quant_config=None`, sent quantized) keep their
    codes and lose their scale; a BF16 tensor written into an FP8 parameter (a module the trainer's quantizer
    skipped) is rounded to FP8 with no scale, while the parameter's `weight_scale_inv` keeps its old value.
    The tap compares the dtype each loader was handed with the parameter's, so a loader that dequantizes
    first (hands on a float tensor) is not reported.
    """,
    "model.layers.0.mlp.gate.weight: F8_E4M3 data copied into a BF16 parameter",
    "quantize exactly the modules the engine quantizes (its quantization_config and ignore list)",
    fix="make the trainer's quantizer follow the engine's quantization_config: leave modules the engine "
    "builds unquantized (routers, ignore list) in BF16, and quantize every module it serves quantized, with its scale",
)
SYNC_TENSOR_WRITTEN_BEFORE_DIGEST = _verify_rule(
    "WC746",
    "sync-tensor-written-before-digest",
    Severity.WARNING,
    "The engine wrote into a tensor it was handed before the tap digested it: what arrived was not compared.",
    """
    The tap digests the stream's small CPU tensors in batches, after the engine has seen them (and, with
    `WEIGHTCHECK_DEVICE_HOLD=1`, GPU tensors at the end of the call). A loader that writes into the tensor it
    is handed moves the tensor's version counter: SGLang 0.5.23's Gemma adds 1 to each norm weight
    (`models/gemma.py`), GPT-OSS zeroes `w2_weight_bias` on TP ranks above 0 of a BF16 model
    (`models/gpt_oss.py`). The tap then records the tensor as not digested, never with the loader's bytes
    (which would read as "bytes differ"), and from then on, in that engine process, digests that name as it
    arrives: later syncs compare it. Not a defect of the sync. A write the version counter does not see (a
    tensor made under `torch.inference_mode`, a custom kernel writing through a raw pointer) is not caught.
    """,
    "sync 0: model.norm.weight, model.layers.0.input_layernorm.weight: written into by the engine before the "
    "tap digested them; not compared",
    "loaders that copy from what they are handed, or syncs after the first (those names digested on arrival)",
    fix="nothing to fix in the sync; to compare these tensors in the first sync too, set "
    "WEIGHTCHECK_TAP_SYNC_DIGEST=1 in the engine (every tensor digested as it arrives, at some cost per tensor)",
)
