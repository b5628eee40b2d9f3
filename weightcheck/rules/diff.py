"""WC7xx codes of `weightcheck diff`, as Rule objects: diff imports these and builds every finding from one,
so a code's doc, examples and fix text live in one place and a mistyped code fails loudly (UnknownRuleCode)
instead of being dropped by the selection filter.

They have no `check`: diff's comparison engine (weightcheck.diffing) decides which rule a tensor pair breaks;
registering them here documents them in `weightcheck rules`, SARIF and docs/rules.md.
"""

from __future__ import annotations

from weightcheck.findings import Severity
from weightcheck.rules import Rule, UnknownRuleCode, metadata_rule

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["UnknownRuleCode"]  # raised by diff_rule / class_rule

# Severities diff emits besides the default: an explicitly allowed skip or name-only tensor is info.
_ALLOWED_IS_INFO = frozenset({Severity.INFO})


_DIFF_RULES: dict[str, Rule] = {}


def _diff_rule(code: str, name: str, severity: Severity, **texts: Any) -> Rule:
    """`metadata_rule` for diff (texts: summary, doc, bad, good, fix; `also`), kept in diff's own table."""
    made = metadata_rule(code, name, severity, command="diff", needs=frozenset({"tensors", "data"}), **texts)
    _DIFF_RULES[code] = made
    return made


VALUE_MISMATCH = _diff_rule(
    "WC701",
    "diff-value-mismatch",
    Severity.ERROR,
    summary="A tensor differs from the reference beyond its tier's tolerance, in no recognised pattern.",
    doc="Values differ and none of the specific classes (shifted, transposed, scaled, zero, NaN, never "
    "written, partial) explains it. The evidence gives the count of elements outside tolerance, the first "
    "and the worst, rel-L2, SQNR and cosine.",
    bad="B.layers.3.mlp.down_proj.weight: 41123 of 5767168 elements outside 1 ULP (worst 37× the tolerance)",
    good="bit-identical, or within one ULP of each side's format",
    fix="find the conversion step that changed the values (compare intermediate outputs with diff)",
)


NEVER_WRITTEN = _diff_rule(
    "WC702",
    "diff-never-written",
    Severity.ERROR,
    summary="The tensor still holds an engine's reset values (uniform [0, 1) floats, flat full-range ints).",
    doc="A weight-sync or export path that skipped a tensor leaves whatever the buffer was initialised with: "
    "`torch.rand`-style uniform values, or integer codes spread evenly over the whole range. Real weights "
    "are roughly Gaussian around zero.",
    bad="B's q_proj.weight has mean 0.500 and std 0.289 with every value in [0, 1)",
    good="values distributed like the reference's",
    fix="the tensor was never loaded: check the loader's name mapping for it (see WC713/WC714 neighbours)",
)


ALL_ZERO = _diff_rule(
    "WC703",
    "diff-all-zero",
    Severity.ERROR,
    summary="The tensor is all zeros where the reference is not.",
    doc="Zeroed buffers are what a failed or skipped copy looks like after `zero_()`/`torch.zeros` allocation "
    "(a zero router silently routes every token to expert 0).",
    bad="B.layers.0.mlp.gate.weight: every element is zero",
    good="the reference's values",
    fix="the tensor was zeroed or never copied: check the converter's path for it",
)


NAN_INF = _diff_rule(
    "WC704",
    "diff-nan-inf",
    Severity.ERROR,
    summary="One side holds NaN or Inf values.",
    doc="NaN never equals anything, not even an identical NaN: a tensor with NaN fails every tier. The "
    "evidence counts NaN and Inf on each side.",
    bad="B's down_proj.weight holds 12 NaN values",
    good="finite values on both sides",
    fix="find the step that produced NaN/Inf and re-export",
)


SHIFTED_OR_SWAPPED = _diff_rule(
    "WC705",
    "diff-shifted-or-swapped",
    Severity.ERROR,
    summary="The tensor equals the reference's tensor at another layer or expert index (offset reported).",
    doc="Off-by-k layer numbering (pipeline-parallel offsets, MTP layers), swapped layers or experts, and "
    "expert permutations all show as a tensor that matches a neighbour of the reference. Two tensors "
    "holding each other's data are reported as swapped.",
    bad="layer 0 holds the reference's layer 1 (offset +1, swapped); layer 1 holds layer 0 (offset -1, swapped)",
    good="every tensor matches the reference at its own index",
    fix="fix the layer/expert offset where the candidate was written (pipeline or expert-parallel offset)",
)


TRANSPOSED = _diff_rule(
    "WC706",
    "diff-transposed",
    Severity.ERROR,
    summary="The tensor is the reference transposed.",
    doc="Conversions between [in, out] (Megatron, JAX, AWQ qweight) and [out, in] (PyTorch Linear) layouts "
    "that forget the transpose; square matrices keep their shape, so only values show it.",
    bad="B.layers.2.self_attn.o_proj.weight equals reference.T",
    good="same layout as the reference",
    fix="transpose the tensor where it is written (a Megatron/HF layout mix-up)",
)


SCALED = _diff_rule(
    "WC707",
    "diff-scaled",
    Severity.ERROR,
    summary="The tensor is the reference times a constant factor.",
    doc="A scale applied twice or not at all (quantization scale, muP/embedding multipliers, norm offsets). "
    "Cosine similarity is blind to it (1.0), so the factor is fitted by least squares.",
    bad="B ≈ 1.05 × reference (residual 2e-3)",
    good="factor 1",
    fix="remove the extra scaling (a scale folded in twice, or missing)",
)


PARTIALLY_WRITTEN = _diff_rule(
    "WC708",
    "diff-partially-written",
    Severity.ERROR,
    summary="Only part of the tensor matches: one TP shard, or a block of rows/columns.",
    doc="Tensor-parallel gathers that wrote a single rank's shard, or a copy that stopped early. The evidence "
    "gives the matching range and, when it is a 1/n fraction, the shard index.",
    bad="only rows 0..1023 of 4096 match: TP shard 0 of 4 along dim 0 was written",
    good="every row and column matches",
    fix="gather every tensor-parallel shard before writing (only one rank's slice arrived)",
)


DTYPE_MISMATCH = _diff_rule(
    "WC709",
    "diff-dtype-mismatch",
    Severity.ERROR,
    summary="The dtypes cannot be compared under the tier (no lossless conversion between them).",
    doc="bf16 ↔ f32 is compared exactly after widening; an integer tensor against a float one, or an exact "
    "rule on a lossy pair, is a dtype mismatch (use a `ulp` policy rule for a declared cast).",
    bad="reference BF16, candidate I8 without a scale",
    good="same dtype, a lossless widening, or a quantized format with its scales",
    fix="convert with a lossless dtype path, or declare the intended tier with --policy",
)


SHAPE_MISMATCH = _diff_rule(
    "WC710",
    "diff-shape-mismatch",
    Severity.ERROR,
    summary="The shapes differ (and B is neither a TP shard nor the transpose of A).",
    doc="Shapes are compared on logical tensors: a quantized module's shape is its dequantized weight's.",
    bad="reference [4096, 4096], candidate [4096, 2048] that matches no shard",
    good="equal shapes",
    fix="re-export with the reference's shape (check TP gathering and transposition)",
)


WITHIN_QUANTIZATION_ERROR = _diff_rule(
    "WC711",
    "diff-within-quantization-error",
    Severity.INFO,
    summary="The tensors differ, but every element within one quantization step of each side.",
    doc="Expected when one side is quantized: each element of the dequantized weight is within one ULP of its "
    "format (INT step × scale, FP8/FP4 ULP × scale) plus the other side's ULP. The evidence gives rel-L2 "
    "and SQNR for the record.",
    bad="(informational) 14 tensors within 1 ULP; worst rel-L2 0.11 (SQNR 19 dB)",
    good="(informational)",
    fix="expected after quantization; declare the tier with --policy if it should not be reported",
)


WITHIN_TOLERANCE = _diff_rule(
    "WC712",
    "diff-within-tolerance",
    Severity.INFO,
    summary="The tensors differ within the declared tolerance of a lossy, non-quantized path.",
    doc="A float cast (f32 → bf16) within one ULP, a `stat` rule's thresholds, or equal values whose bytes "
    "differ (signed zeros).",
    bad="(informational) values equal but bytes differ (signed zeros)",
    good="(informational)",
    fix="expected for a lossy path; narrow or widen the tolerance with --policy",
)


ONLY_IN_REFERENCE = _diff_rule(
    "WC713",
    "diff-only-in-a",
    Severity.ERROR,
    summary="A tensor of the reference has no counterpart in the candidate.",
    doc="After the name map, nothing in B carries this name: a dropped layer, expert or head. Allowed with "
    "`--allow-skip PATTERN` (then reported as info).",
    bad="model.layers.47.mlp.experts.127.down_proj.weight only in A",
    good="every reference tensor present in B (or an explicit --allow-skip)",
    fix="export the tensor, or map its name with --map (or allow it with --allow-skip)",
    also=_ALLOWED_IS_INFO,
)


ONLY_IN_CANDIDATE = _diff_rule(
    "WC714",
    "diff-only-in-b",
    Severity.ERROR,
    summary="A tensor of the candidate has no counterpart in the reference.",
    doc="An extra tensor in B: a doubled prefix, a stray copy, a renamed weight missing a map entry. "
    "Activation/KV-cache quantization parameters (input_scale, k_scale...) are expected on a quantized "
    "side only and are reported as info.",
    bad="model.model.layers.0.mlp.down_proj.weight only in B",
    good="every B tensor paired (activation scales excepted)",
    fix="drop the tensor, or map its name with --map (or allow it with --allow-skip)",
    also=_ALLOWED_IS_INFO,
)


SKIPPED = _diff_rule(
    "WC715",
    "diff-skipped",
    Severity.ERROR,
    summary="A tensor pair was not compared (unreadable data, no policy rule, ...) and no --allow-skip covers it.",
    doc="A diff that silently skips is a diff that silently passes: every skip carries its reason, and fails "
    "the run unless `--allow-skip PATTERN` names the tensor (then it is info).",
    bad="not compared: B: shard model-00002-of-00003.safetensors is missing",
    good="every pair compared, or the skip allowed explicitly",
    fix="make the data readable, add a policy rule, or list it with --allow-skip if skipping is intended",
    also=_ALLOWED_IS_INFO,
)


NO_POLICY_RULE = _diff_rule(
    "WC716",
    "diff-no-policy-rule",
    Severity.ERROR,
    summary="No comparison policy rule matches the tensor's name.",
    doc="With `--no-default-policy` only the `--policy` rules apply, and every tensor must be matched by one of "
    "them: a tensor none matches is an error rather than a silent pass. (The built-in rules end with one that "
    "compares any other tensor as stored: gpt-oss's attention sinks, SigLIP's probe, RWKV's time_* parameters.) "
    "Add a rule with `--policy` or allow the skip.",
    bad="--no-default-policy, a policy for `*.weight` only: model.rotary_emb.inv_freq matches no rule",
    good="a `--policy` line such as `inv_freq$ exact`",
    fix="add a --policy rule that matches the tensor's name",
    also=_ALLOWED_IS_INFO,
)


QUANTIZED_TENSOR_MALFORMED = _diff_rule(
    "WC717",
    "diff-quantized-tensor-malformed",
    Severity.ERROR,
    summary="A quantized module's stored tensors are inconsistent and cannot be dequantized.",
    doc="Scale shape that tiles no strategy, weight_shape disagreeing with weight_packed, a packed zero point "
    "of the wrong shape: the engine would fail to load it or load garbage.",
    bad="weight_scale [256, 3] does not divide 256 columns",
    good="scales, zero points and shapes consistent with the packed weight",
    fix="re-export the quantized module: its packed weight, scales and shape disagree",
    also=_ALLOWED_IS_INFO,
)


FILE_REFUSED = _diff_rule(
    "WC718",
    "diff-file-refused",
    Severity.ERROR,
    summary="A file a compared checkpoint references was refused: it leaves the checkpoint, loops, or is not a "
    "regular file.",
    doc="weightcheck opens nothing outside the checkpoint and no FIFO or device. An index entry routed through "
    "a symlink that leaves the directory is refused even when the tensor also exists in a regular shard, "
    "so such a checkpoint never diffs clean.",
    bad="B: refused to open sub/x.safetensors: symlink resolves outside the checkpoint (/elsewhere/x.safetensors)",
    good="every referenced file a regular file inside the checkpoint",
    fix="replace the symlink (or FIFO/device) with a regular file inside the checkpoint folder, or fix the "
    "index entry that routes through it",
)


# Mismatch class (weightcheck.compare.engine / compare.classify) -> the rule that reports it.
CLASS_RULES: dict[str, Rule] = {
    "value-mismatch": VALUE_MISMATCH,
    "never-written": NEVER_WRITTEN,
    "all-zero": ALL_ZERO,
    "nan-inf": NAN_INF,
    "shifted/swapped": SHIFTED_OR_SWAPPED,
    "transposed": TRANSPOSED,
    "scaled": SCALED,
    "partially-written": PARTIALLY_WRITTEN,
    "dtype-mismatch": DTYPE_MISMATCH,
    "shape-mismatch": SHAPE_MISMATCH,
    "within-quantization-error": WITHIN_QUANTIZATION_ERROR,
    "within-tolerance": WITHIN_TOLERANCE,
}


def diff_rule(code: str) -> Rule:
    """The diff rule of `code`; UnknownRuleCode for any other code (a typo must not vanish)."""
    try:
        return _DIFF_RULES[code]
    except KeyError:
        raise UnknownRuleCode(f"{code!r} is not a diff rule code (known: {', '.join(sorted(_DIFF_RULES))})") from None


def class_rule(klass: str) -> Rule:
    """The rule reporting mismatch class `klass`; UnknownRuleCode for a class no rule reports."""
    try:
        return CLASS_RULES[klass]
    except KeyError:
        raise UnknownRuleCode(f"mismatch class {klass!r} has no diff rule (known: {', '.join(CLASS_RULES)})") from None
