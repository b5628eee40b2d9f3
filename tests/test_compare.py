"""The comparison engine on small tensors written with safetensors: tiers, ULP bounds, metrics, policy
DSL and every mismatch class (each with a tensor that has the defect and one that does not)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from weightcheck.compare.classify import ReferenceIndex, classify
from weightcheck.compare.engine import EQUAL, FAILED, WITHIN, compare_pair, lossless, measure, widens
from weightcheck.compare.operands import PlainOperand
from weightcheck.compare.policy import DEFAULT_RULES, Policy, PolicyError, PolicyRule, parse_policy
from weightcheck.compare.ulp import dtype_ulp, float_ulp
from weightcheck.tensors import TensorStore

AUTO = PolicyRule(".*", "auto")
EXACT = PolicyRule(".*", "exact")
ULP = PolicyRule(".*", "ulp")


@pytest.fixture
def pair(tmp_path: Path):
    """`pair(a, b)` → (operand A, operand B), each tensor stored in its own safetensors file."""
    from safetensors.torch import save_file

    def make(a: torch.Tensor, b: torch.Tensor, name: str = "w") -> tuple[PlainOperand, PlainOperand]:
        ops = []
        for side, tensor in (("a", a), ("b", b)):
            folder = tmp_path / f"{side}{len(list(tmp_path.iterdir()))}"
            folder.mkdir()
            save_file({name: tensor.contiguous()}, str(folder / "model.safetensors"))
            ops.append(PlainOperand(TensorStore.open(folder), name))
        return ops[0], ops[1]

    return make


def weights(*shape: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.02).to(dtype)


# ---- policy DSL ---------------------------------------------------------------------------------
def test_policy_parses_tiers_and_options() -> None:
    rules = parse_policy(
        r"""
        # comment
        \.experts\.   ulp  ulps=2
        ^lm_head\.weight$  stat rel_l2=0.25 sqnr_db=12   # trailing comment
        bias$  exact
        """,
        source="p.txt",
    )
    assert [(r.tier, r.ulps, r.rel_l2, r.sqnr_db) for r in rules] == [
        ("ulp", 2.0, None, None),
        ("stat", 1.0, 0.25, 12.0),
        ("exact", 1.0, None, None),
    ]
    assert rules[1].source == "p.txt:4"


@pytest.mark.parametrize(
    "line, error",
    [
        ("w(  exact", "invalid regex"),
        ("w  fuzzy", "unknown tier"),
        ("w  exact ulps=2", "not valid for tier exact"),
        ("w  ulp ulps=abc", "must be a number"),
        ("w  ulp ulps=0", "positive"),
        ("justone", "expected"),
    ],
)
def test_policy_errors_name_the_line(line: str, error: str) -> None:
    with pytest.raises(PolicyError, match=rf"p:2: .*{error}"):
        parse_policy(f"ok exact\n{line}", source="p")


def test_default_policy_covers_every_name_and_user_rules_alone_reject_unknown_kinds() -> None:
    policy = Policy(DEFAULT_RULES)
    for name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.gate.e_score_correction_bias",
        "model.layers.0.self_attn.k_scale",
        "model.layers.0.mlp.experts.gate_up_proj",
        "lm_head.weight",
    ):
        assert policy.rule_for(name).pattern != DEFAULT_RULES[-1].pattern, name  # a rule of its own kind
    for name in ("model.rotary_emb.inv_freq", "model.layers.0.self_attn.sinks", "vision_tower.head.probe"):
        assert policy.rule_for(name) == DEFAULT_RULES[-1], name  # compared as stored, never skipped
    user = Policy.with_user_rules(parse_policy(r"q_proj\.weight$ stat"))
    assert user.rule_for("model.layers.0.self_attn.q_proj.weight").tier == "stat"
    alone = Policy.with_user_rules(parse_policy(r"q_proj\.weight$ stat"), include_default=False)
    assert alone.rule_for("model.rotary_emb.inv_freq") is None


# ---- ULPs and metrics ---------------------------------------------------------------------------
def test_float_ulp_by_format() -> None:
    values = torch.tensor([1.0, 1.5, -2.0, 0.0, 1e-40, float("nan"), float("inf")])
    ulp = dtype_ulp(values, "BF16")
    assert ulp is not None
    assert ulp[:3].tolist() == [2.0**-7, 2.0**-7, 2.0**-6]
    assert ulp[3] == ulp[4] == 2.0**-126 * 2.0**-7  # zero and subnormals: the subnormal step
    assert math.isnan(ulp[5]) and math.isnan(ulp[6])
    assert float_ulp(torch.tensor([448.0]), eps=0.125, smallest_normal=2.0**-6).item() == 32.0  # e4m3 max
    assert dtype_ulp(torch.tensor([3]), "I32") is None


def test_metrics_match_their_definitions(pair) -> None:
    a, b = weights(300, 70, seed=1, dtype=torch.float32), weights(300, 70, seed=2, dtype=torch.float32)
    op_a, op_b = pair(a, b)
    m = measure(op_a, op_b, tolerance="none", chunk=1000)  # many blocks: accumulation must be exact
    a64, b64 = a.double(), b.double()
    assert m.rel_l2 == pytest.approx(float((a64 - b64).norm() / a64.norm()), rel=1e-9)
    assert m.sqnr_db == pytest.approx(float(20 * torch.log10(a64.norm() / (a64 - b64).norm())), rel=1e-9)
    assert m.cosine == pytest.approx(float((a64 * b64).sum() / (a64.norm() * b64.norm())), rel=1e-9)
    flat = int((a64 - b64).abs().argmax())
    assert m.max_abs_index == flat and m.as_dict((300, 70))["max_abs_at"] == [flat // 70, flat % 70]


def test_lossless_widening_table() -> None:
    assert widens("BF16", "F32") and widens("F8_E4M3", "BF16") and widens("I8", "I64")
    assert not widens("F32", "BF16") and not widens("BF16", "F16") and not widens("I8", "F32")
    assert lossless("F32", "BF16") and not lossless("BF16", "F16")


# ---- tiers ----------------------------------------------------------------------------------------
def test_exact_tier_bit_identical(pair) -> None:
    a = weights(64, 32)
    assert compare_pair(*pair(a, a.clone()), AUTO).status == EQUAL
    b = a.clone()
    b[3, 4] = b[3, 4] + 0.5
    verdict = compare_pair(*pair(a, b), AUTO)
    assert verdict.status == FAILED and verdict.metrics is not None and verdict.metrics.exceed == 1
    assert verdict.metrics.as_dict((64, 32))["first_outside_at"] == [3, 4]


def test_nan_never_equals_itself(pair) -> None:
    a = weights(16, 16)
    a[2, 2] = float("nan")
    verdict = compare_pair(*pair(a, a.clone()), AUTO)
    assert verdict.status == FAILED and verdict.klass == "nan-inf"
    verdict = compare_pair(*pair(a, a.clone()), ULP)
    assert verdict.status == FAILED


def test_signed_zero_is_equal_in_value_not_in_bytes(pair) -> None:
    a = torch.zeros(8, 8, dtype=torch.bfloat16)
    verdict = compare_pair(*pair(a, -a), AUTO)
    assert verdict.status == WITHIN and "signed zeros" in verdict.message


def test_lossless_widening_compares_exactly(pair) -> None:
    a = weights(32, 32)
    assert compare_pair(*pair(a, a.to(torch.float32)), AUTO).status == EQUAL
    b = a.to(torch.float32)
    b[0, 0] += 1e-6
    assert compare_pair(*pair(a, b), AUTO).status == FAILED


def test_lossy_cast_is_within_one_ulp(pair) -> None:
    a = weights(64, 64, dtype=torch.float32) * 3
    op_a, op_b = pair(a, a.to(torch.bfloat16))
    verdict = compare_pair(op_a, op_b, AUTO)
    assert verdict.status == WITHIN and verdict.klass == "within-tolerance"
    b = a.to(torch.bfloat16)
    b[5, 5] = (b[5, 5].float() * (1 + 2**-5)).to(torch.bfloat16)  # 4 bf16 ULPs off
    assert compare_pair(*pair(a, b), AUTO).status == FAILED


def test_int_against_float_is_a_dtype_mismatch(pair) -> None:
    verdict = compare_pair(*pair(torch.ones(4, 4), torch.ones(4, 4, dtype=torch.int8)), AUTO)
    assert verdict.status == FAILED and verdict.klass == "dtype-mismatch"
    # A declared numeric comparison (ulp rule) of the same values passes.
    assert compare_pair(*pair(torch.ones(4, 4), torch.ones(4, 4, dtype=torch.int8)), ULP).passed


def test_stat_tier_thresholds(pair) -> None:
    a = weights(128, 128, dtype=torch.float32)
    noise = weights(128, 128, seed=9, dtype=torch.float32)
    b = a + 0.1 * noise  # rel-L2 about 0.1
    assert compare_pair(*pair(a, b), PolicyRule(".*", "stat", rel_l2=0.2)).status == WITHIN
    failed = compare_pair(*pair(a, b), PolicyRule(".*", "stat", rel_l2=0.05))
    assert failed.status == FAILED and "rel-L2" in failed.message
    assert compare_pair(*pair(a, b), PolicyRule(".*", "stat", sqnr_db=30)).status == FAILED


# ---- classification -------------------------------------------------------------------------------
def explain(op_a, op_b, rule=AUTO, reference=None):
    verdict = compare_pair(op_a, op_b, rule)
    assert verdict.status == FAILED, verdict.message
    return classify(op_a, op_b, verdict, rule, reference)


def test_classify_all_zero_and_never_written(pair) -> None:
    a = weights(64, 64)
    assert explain(*pair(a, torch.zeros_like(a))).klass == "all-zero"
    uniform = torch.rand(64, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert explain(*pair(a, uniform)).klass == "never-written"
    codes = torch.randint(-128, 128, (64, 64), generator=torch.Generator().manual_seed(2), dtype=torch.int8)
    assert explain(*pair(torch.zeros(64, 64, dtype=torch.int8) + 1, codes)).klass == "never-written"
    # Good: a different Gaussian weight is a plain mismatch, not "never written".
    assert explain(*pair(a, weights(64, 64, seed=5))).klass == "value-mismatch"


def test_classify_nan(pair) -> None:
    a = weights(32, 32)
    b = a.clone()
    b[0, :3] = float("nan")
    found = explain(*pair(a, b))
    assert found.klass == "nan-inf" and found.evidence["nan_b"] == 3


def test_classify_transposed_and_scaled(pair) -> None:
    a = weights(48, 48)
    assert explain(*pair(a, a.t().contiguous())).klass == "transposed"
    wide = weights(48, 96)
    found = explain(*pair(wide, wide.t().contiguous()))
    assert found.klass == "transposed"
    scaled = explain(*pair(a.float(), a.float() * 1.05))
    assert scaled.klass == "scaled" and scaled.evidence["factor"] == pytest.approx(1.05, rel=1e-4)


def test_classify_partially_written(pair) -> None:
    a = weights(64, 32)
    b = torch.zeros_like(a)
    b[16:32] = a[16:32]  # TP shard 1 of 4 along rows
    found = explain(*pair(a, b))
    assert found.klass == "partially-written"
    assert (found.evidence["shard"], found.evidence["shards"], found.evidence["dim"]) == (1, 4, 0)
    # B holds only one shard: a shape mismatch explained as a TP split along dim 1.
    shard = explain(*pair(a, a[:, 16:].contiguous()))
    assert shard.klass == "partially-written" and (shard.evidence["shard"], shard.evidence["dim"]) == (1, 1)
    # Good: a shape mismatch that is no shard stays a shape mismatch.
    assert explain(*pair(a, weights(64, 16, seed=3))).klass == "shape-mismatch"


def test_classify_shift_finds_the_other_layer(pair, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    layers = {f"model.layers.{i}.w": weights(16, 16, seed=i) for i in range(5)}
    save_file(layers, str(tmp_path / "model.safetensors"))
    store = TensorStore.open(tmp_path)
    reference = ReferenceIndex(sorted(layers), lambda n: PlainOperand(store, n))
    op_a = PlainOperand(store, "model.layers.1.w")
    _, op_b = pair(layers["model.layers.1.w"], layers["model.layers.3.w"], name="model.layers.1.w")
    found = explain(op_a, op_b, reference=reference)
    assert found.klass == "shifted/swapped"
    assert (found.evidence["index"], found.evidence["offset"]) == ("layer", 2)
    _, unrelated = pair(layers["model.layers.1.w"], weights(16, 16, seed=99), name="model.layers.1.w")
    assert explain(op_a, unrelated, reference=reference).klass == "value-mismatch"
