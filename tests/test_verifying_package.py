"""The verify package's shape: findings built from Rule objects (a wrong code fails loudly), fix texts with
their rules, imports that run downward only, and GPT-2-style `h.N` layer names read as layers (a stage
that forgot its offset in a real GPT-2 checkpoint written by transformers is a WC725 shift)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from weightcheck import tap
from weightcheck.lightclass import replace
from weightcheck.rules import UnknownRuleCode, all_rules, get_rule
from weightcheck.rules.verify import VERIFY_RULES, make_finding, verify_rule
from weightcheck.verifying import _names, verify
from weightcheck.verifying.sink import FindingSink

PACKAGE = Path(__file__).resolve().parent.parent / "weightcheck"
_H = re.compile(r"(^|\.)h\.(\d+)\.")


# ---- Rule objects ---------------------------------------------------------------------------------------


def test_every_verify_code_is_a_rule_object_with_its_fix() -> None:
    registered = {code: r for code, r in all_rules().items() if r.command == "verify"}
    assert registered == VERIFY_RULES and len(VERIFY_RULES) >= 26
    for code, rule in VERIFY_RULES.items():
        assert rule.fix, code  # the fix text lives with the rule, not in a separate table
        assert get_rule(code) is rule
    from weightcheck.rules.fixtexts import FIX_TEXTS

    assert not set(FIX_TEXTS) & set(VERIFY_RULES)


def test_an_unknown_code_raises_never_dropped() -> None:
    with pytest.raises(UnknownRuleCode, match="WC799"):
        verify_rule("WC799")
    sink = FindingSink(["ALL"], [])
    lint_rule = all_rules()["WC101"]  # a registered rule, but not verify's
    with pytest.raises(UnknownRuleCode):
        sink.add(lint_rule, "a lint rule through verify's sink")
    missing = VERIFY_RULES["WC722"]
    forged = replace(missing)  # same code, not the registered object
    with pytest.raises(UnknownRuleCode):
        sink.add(forged, "a copy of a rule")
    deselected = FindingSink(["WC723"], [])
    with pytest.raises(UnknownRuleCode):  # deselected or not, a wrong rule is a bug
        deselected.add(lint_rule, "x")
    assert sink.items == [] and deselected.items == []


def test_findings_carry_their_rule_code_name_severity_and_fix() -> None:
    sink = FindingSink(["WC72"], ["WC723"])
    missing, unexpected = VERIFY_RULES["WC722"], VERIFY_RULES["WC723"]
    sink.add(missing, "model.norm.weight never sent", tensor="model.norm.weight")
    sink.add(unexpected, "deselected: not kept")
    (finding,) = sink.items
    assert (finding.code, finding.name, finding.severity) == ("WC722", missing.name, missing.severity)
    assert finding.fix == missing.fix_text() and finding.location.tensor == "model.norm.weight"
    assert make_finding(VERIFY_RULES["WC734"], "m").fix == VERIFY_RULES["WC734"].fix


# ---- imports run downward -------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


@pytest.mark.parametrize(
    ("folder", "above"),
    [
        (
            "verify",
            (
                "weightcheck.reporters",
                "weightcheck.cli",
                "weightcheck.commands",
                "weightcheck.integrations",
                "weightcheck.api",
                "weightcheck.triage",
            ),
        ),
        ("tap", ("weightcheck.verifying", "weightcheck.integrations", "weightcheck.reporters", "weightcheck.cli")),
    ],
)
def test_imports_run_downward(folder: str, above: tuple[str, ...]) -> None:
    upward = {
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for module in _imports(path)
        if module.startswith(above)
    }
    assert not upward


def test_no_verify_module_is_long() -> None:
    long = {p.name: n for p in (PACKAGE / "verify").rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long


def test_public_surface_of_weightcheck_verify() -> None:
    import weightcheck
    from weightcheck import verify as verify_package
    from weightcheck.verifying import (  # noqa: F401  (importable, as before the split)
        Reference,
        ReferenceError,
        TrainerLayout,
        WeightSyncError,
        count_records,
        load_checkpoint_reference,
        load_manifest_reference,
        load_reference,
        records_incomplete,
        wait_for_records,
    )

    # the trainer-side helper renders a report: it lives above verify, in integrations, with no shim here
    assert not hasattr(verify_package, "check_weight_update_equal")
    assert callable(weightcheck.verify) and weightcheck.verify is not verify  # the API function, not the package


# ---- h.N layer names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "layer", "expert", "template"),
    [
        ("model.layers.3.mlp.down_proj.weight", 3, None, "model.layers.{L}.mlp.down_proj.weight"),
        ("transformer.h.3.attn.c_attn.weight", 3, None, "transformer.h.{L}.attn.c_attn.weight"),
        ("h.11.mlp.c_fc.bias", 11, None, "h.{L}.mlp.c_fc.bias"),
        ("model.layers.2.mlp.experts.7.up_proj.weight", 2, 7, "model.layers.{L}.mlp.experts.{E}.up_proj.weight"),
        (
            "model.language_model.layers.5.self_attn.q_proj.weight",
            5,
            None,
            "model.language_model.layers.{L}.self_attn.q_proj.weight",
        ),
        ("transformer.wte.weight", None, None, "transformer.wte.weight"),
        # a digit run too long to be an id is no id (the name model's bound): the name is kept as written
        ("model.layers.99999999999999999999.mlp.weight", None, None, "model.layers.99999999999999999999.mlp.weight"),
    ],
)
def test_layer_and_expert_ids(name: str, layer: int | None, expert: int | None, template: str) -> None:
    assert _names.layer_id(name) == layer and _names.expert_id(name) == expert
    assert _names.template(name) == template
    if layer is not None:
        assert _names.layer_id(_names.with_layer(name, layer + 4)) == layer + 4
        assert _names.template(_names.with_layer(name, layer + 4)) == template


@pytest.fixture
def gpt2(tmp_path: Path) -> Iterator[tuple[Path, Path, list[tuple[str, torch.Tensor]]]]:
    """A tiny GPT-2 written by transformers' save_pretrained, and an engine tapped into a records folder."""
    from test_verify import Engine, default_loader, read_stream
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
    ckpt = tmp_path / "gpt2"
    GPT2LMHeadModel(cfg).save_pretrained(ckpt, max_shard_size="60KB")
    records = tmp_path / "records"
    tap.configure(records, digest_threads=2)
    tap.install(Engine)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=default_loader))
    try:
        yield ckpt, records, read_stream(ckpt)
    finally:
        tap.uninstall(Engine)
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())


def _push(stream: list[tuple[str, torch.Tensor]], sent: list[tuple[str, torch.Tensor]]) -> None:
    from test_verify import Engine

    shapes = {n: (tuple(t.shape), t.dtype) for n, t in stream}
    model = Engine(shapes, range(1), 1)  # the test engine keys stages on `layers.N`: GPT-2 names are all held
    with tap.sync("step-1", source="session"):
        model.load_weights(iter(sent))


def test_gpt2_stage_without_offset_is_a_layer_shift(
    gpt2: tuple[Path, Path, list[tuple[str, torch.Tensor]]],
) -> None:
    ckpt, records, stream = gpt2
    assert any(".h.3." in n for n, _ in stream)  # transformers writes GPT-2's blocks as transformer.h.N

    def layer(name: str) -> int | None:
        match = _H.search(name)
        return int(match.group(2)) if match else None

    # Trainer PP=2: pp_rank 1 (layers 2..3) sent its local ids 0..1.
    sent = [(n, t) for n, t in stream if (layer(n) or 0) < 2]
    def local(name: str) -> str:
        return _H.sub(lambda m: f"{m.group(1)}h.{int(m.group(2)) - 2}.", name, count=1)

    sent += [(local(n), t) for n, t in stream if (layer(n) or 0) >= 2]
    _push(stream, sent)
    result = verify(records, ckpt)
    shifts = [f for f in result.findings if f.code == "WC725"]
    assert len(shifts) == 1, [f.code for f in result.findings]
    assert shifts[0].details["sent_layers"] == [0, 1] and shifts[0].details["true_layers"] == [2, 3]
    assert "shifted by −2" in shifts[0].message
    assert not [f for f in result.findings if f.code == "WC727"]  # not a pile of per-tensor mismatches


def test_gpt2_clean_sync_passes(gpt2: tuple[Path, Path, list[tuple[str, torch.Tensor]]]) -> None:
    ckpt, records, stream = gpt2
    _push(stream, stream)
    result = verify(records, ckpt)
    assert result.findings == [] and result.exit_code() == 0
    assert result.checked["tensors"] == len(stream)


def test_fused_expert_names() -> None:
    assert _names.is_fused_expert("model.layers.0.mlp.experts.gate_up_proj")
    assert _names.is_fused_expert("model.layers.0.mlp.experts.down_proj_bias")
    assert not _names.is_fused_expert("model.layers.0.mlp.experts.3.down_proj.weight")
