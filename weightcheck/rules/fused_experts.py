"""WC43x: quantized stacked (fused) experts.

gpt-oss ships its experts as MXFP4 stacks (`experts.gate_up_proj_blocks` / `_scales`), one leading dim per
expert: transformers' mxfp4 integration (`convert_moe_packed_tensors`) requires `blocks.shape[:-1] ==
scales.shape`, each block byte holding two FP4 codes (16 bytes = one 32-value group, one E8M0 scale).
A stack one expert short or long loads into the wrong expert slots or fails at load."""

from __future__ import annotations

from weightcheck.collapse import summarize
from weightcheck.findings import Severity
from weightcheck.names import last_segments_fixed
from weightcheck.rules import LintContext, rule, templates_of
from weightcheck.structure import EXPERT_COUNT_KEYS, config_int

_SUFFIXES = ("_blocks", "_scales")


def _stacks(ctx: LintContext) -> dict[str, dict[str, tuple[str, str, tuple[int, ...]]]]:
    """`<...>.experts.<proj>` -> {"_blocks"/"_scales": (name, dtype, shape)} for every MXFP4-style stack."""
    return ctx.memo("mxfp4-stacks", lambda: _find_stacks(ctx))


def _stack_leaf(name: str) -> bool:
    head, _, leaf = name.rpartition(".")
    return head.endswith("experts") and leaf.endswith(_SUFFIXES)


def _find_stacks(ctx: LintContext) -> dict[str, dict[str, tuple[str, str, tuple[int, ...]]]]:
    out: dict[str, dict[str, tuple[str, str, tuple[int, ...]]]] = {}
    tensors = ctx.ckpt.all_tensors()
    for parts, members in templates_of(ctx).items():
        # `experts.<leaf>` is the template's literal end: decided once for all its names
        if last_segments_fixed(parts, 2) and not _stack_leaf(members[0][0]):
            continue
        for name, _ in members:
            if not _stack_leaf(name):
                continue
            info = tensors[name]
            head, _, leaf = name.rpartition(".")
            suffix = "_blocks" if leaf.endswith("_blocks") else "_scales"
            out.setdefault(f"{head}.{leaf[: -len(suffix)]}", {})[suffix] = (name, info.dtype, tuple(info.shape))
    return out


@rule(
    "WC430",
    "stacked-expert-blocks-mismatch",
    Severity.ERROR,
    summary="An MXFP4 expert stack (`*_blocks` / `*_scales`) is incomplete or its two parts disagree in shape.",
    bad="gate_up_proj_blocks [32, 5760, 90, 16] with gate_up_proj_scales [32, 5760, 45], or no _scales at all",
    good="gate_up_proj_blocks [E, rows, groups, 16] uint8 with gate_up_proj_scales [E, rows, groups] uint8",
    fix="re-export the stack's blocks and scales together from one MXFP4 quantization of the same weight",
)
def stacked_expert_blocks_mismatch(ctx: LintContext) -> None:
    """transformers asserts `blocks.shape[:-1] == scales.shape` when it dequantizes; SGLang's MXFP4 MoE
    reshapes both by the expert count. A missing half leaves the experts unloadable."""
    bad: list[str] = []
    for stack, parts in sorted(_stacks(ctx).items()):
        blocks, scales = parts.get("_blocks"), parts.get("_scales")
        if blocks is None or scales is None:
            bad.append(f"{stack}: only {(blocks or scales)[0].rsplit('.', 1)[-1]} stored")  # type: ignore[index]
        elif len(blocks[2]) < 2 or blocks[2][:-1] != scales[2] or blocks[2][-1] != 16:
            bad.append(f"{stack}: blocks {list(blocks[2])} vs scales {list(scales[2])} (want blocks = scales + [16])")
        elif blocks[1] != "U8" or scales[1] != "U8":
            bad.append(f"{stack}: blocks {blocks[1]}, scales {scales[1]} (MXFP4 stores both as U8)")
    if bad:
        ctx.report(
            f"{len(bad)} MXFP4 expert stack(s) malformed: {'; '.join(bad[:5])}",
            tensor=bad[0].split(":")[0],
            count=len(bad),
            details={"stacks": bad[:500]},
        )


@rule(
    "WC431",
    "stacked-expert-count-mismatch",
    Severity.ERROR,
    summary="A quantized expert stack's leading dim is not the config's expert count (an expert lost or extra).",
    bad="num_local_experts = 32, model.layers.3.mlp.experts.down_proj_blocks [31, 2880, 90, 16]",
    good="every `*_blocks` / `*_scales` stack has num_local_experts rows in its leading dim",
    fix="re-export the stacked experts with every expert the config declares (gather all EP ranks), "
    "or correct the config's expert count",
)
def stacked_expert_count_mismatch(ctx: LintContext) -> None:
    """Per-expert names make a lost expert a missing key; a stack hides it in a shape. Engines slice the
    stack by expert id, so a short stack shifts or drops experts (or fails the load)."""
    n = config_int(ctx.ckpt.text_config(), EXPERT_COUNT_KEYS, "experts")
    if not n:
        return
    off = sorted(
        f"{name} [{shape[0]}]"
        for parts in _stacks(ctx).values()
        for name, _, shape in parts.values()
        if shape and shape[0] != n
    )
    if off:
        names = [o.split(" ")[0] for o in off]
        ctx.report(
            f"{len(off)} expert stack tensor(s) whose leading dim is not the config's {n} experts: "
            f"{summarize(names)} ({', '.join(off[:3])})",
            tensor=names[0],
            count=len(off),
            details={"experts": n, "tensors": off[:500]},
        )
