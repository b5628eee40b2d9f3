"""Every fix text is checked by applying it: a finding that says `lint --fix` repairs it is gone after
`lint --fix`; one that remains never claims so; an entry a finding says to write is written and relinted
(issue #19 item 9: WC202 on a lost tensor promised --fix, WC304 suggested the identical entry)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import read_index, write_index
from helpers import rewrite_shard
from quantized import quant_config, set_ignore

# What a fix text says when it promises that `lint --fix` repairs the finding.
CLAIMS_FIX = re.compile(r"lint --fix`? (does|adds|repoints|mends)")
# The codes `weightcheck.fixes.plan_fixes` edits for (WC207 only says --fix works once the index parses;
# WC110 is --fix's own refusal).
FIXED_BY_FIX = {"WC202", "WC203", "WC205", "WC309", "WC320"}


def wc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True, timeout=300)


def lint_json(path: Path, *extra: str) -> list[dict]:
    proc = wc("lint", str(path), "--format", "json", *extra)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return list(_walk(json.loads(proc.stdout)["findings"]))


def _walk(findings: list[dict]):
    for f in findings:
        yield f
        yield from _walk(f.get("related", []))


def _key(f: dict) -> tuple:
    return f["code"], f["location"].get("file"), f["location"].get("tensor")


# ---- the broken checkpoints: real save_pretrained / llm-compressor output, one defect each ------------
def _lost(path: Path) -> None:
    name = "model.layers.1.mlp.down_proj.weight"
    rewrite_shard(path / read_index(path)["weight_map"][name], drop={name})


def _misplaced(path: Path) -> None:
    index = read_index(path)
    moved = "model.layers.0.mlp.up_proj.weight"
    real = index["weight_map"][moved]
    index["weight_map"][moved] = next(s for s in sorted(set(index["weight_map"].values())) if s != real)
    write_index(path, index)


def _unindexed(path: Path) -> None:
    index = read_index(path)
    index["weight_map"].pop("model.norm.weight")
    write_index(path, index)


def _total_size(path: Path) -> None:
    index = read_index(path)
    index["metadata"]["total_size"] += 4096
    write_index(path, index)


def _stray_shard(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"model.extra_head.weight": torch.zeros(4, 4)}, str(path / "extra.safetensors"), {"format": "pt"})


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "lost-tensor": (_lost, "WC202"),
    "misplaced-entry": (_misplaced, "WC202"),
    "unindexed-tensor": (_unindexed, "WC203"),
    "total-size": (_total_size, "WC205"),
    "stray-shard": (_stray_shard, "WC105"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_fix_texts_that_promise_lint_fix_are_kept_and_no_other_does(make_ckpt, kind: str) -> None:
    damage, code = DAMAGE[kind]
    path = make_ckpt("llama")
    damage(path)
    before = lint_json(path)
    assert code in {f["code"] for f in before}
    assert all(f["fix"] for f in before), [f["code"] for f in before if not f["fix"]]
    promised = {_key(f) for f in before if CLAIMS_FIX.search(f["fix"])}
    assert all(k[0] in FIXED_BY_FIX for k in promised), promised
    wc("lint", str(path), "--fix")
    after = lint_json(path)
    assert not promised & {_key(f) for f in after}, "lint --fix did not do what the fix text said"
    still_claiming = [(f["code"], f["fix"]) for f in after if CLAIMS_FIX.search(f["fix"])]
    assert not still_claiming, still_claiming


def test_a_lost_tensor_says_what_to_do_by_hand_before_and_after_fix(make_ckpt) -> None:
    path = make_ckpt("llama")
    _lost(path)
    for _ in range(2):  # before --fix, then after it (the finding stays, and so must an honest text)
        [ghost] = [f for f in lint_json(path) if f["code"] == "WC202"]
        assert "not found in any shard" in ghost["message"]
        assert "re-export" in ghost["fix"] and not CLAIMS_FIX.search(ghost["fix"]), ghost["fix"]
        wc("lint", str(path), "--fix")


def test_router_fix_written_by_lint_fix_relints_clean(make_quant) -> None:
    path = make_quant("qwen3_moe", "W4A16")
    set_ignore(path, ["lm_head", "re:.*embed_tokens($|\\..*)"])
    [router] = [f for f in lint_json(path) if f["code"] == "WC309"]
    assert router["fix"]
    wc("lint", str(path), "--fix")
    assert [f for f in lint_json(path) if f["code"] == "WC309"] == []


@pytest.mark.parametrize(
    "entry",
    ["re:.*mlp.gate.weight$", "re:.*mlp\\.gate\\.weight$", "re:.*mlp\\.gate\\..*", "re:.*mlp\\.gate\\.weight"],
)
def test_wc304_suggestion_differs_and_applied_relints_without_wc304(make_quant, tmp_path: Path, entry: str) -> None:
    source = make_quant("qwen3_moe", "W4A16")
    path = tmp_path / "ck"
    shutil.copytree(source, path)
    set_ignore(path, ["lm_head", "re:.*embed_tokens($|\\..*)", entry])
    [finding] = [f for f in lint_json(path) if f["code"] == "WC304"]
    forms = finding["details"]["replace_by"]
    assert forms and entry not in forms, finding["fix"]
    assert all(repr(form) in finding["fix"] for form in forms)
    ignore = quant_config(path)["ignore"]
    set_ignore(path, [e for e in ignore if e != entry] + forms)  # apply the fix text as written
    after = lint_json(path)
    assert not [f for f in after if f["code"].startswith("WC30")], [(f["code"], f["message"]) for f in after]


def test_wc304_plain_parameter_entry_suggestion_applied(make_quant, tmp_path: Path) -> None:
    source = make_quant("qwen3_moe", "W4A16")
    path = tmp_path / "ck"
    shutil.copytree(source, path)
    set_ignore(path, ["lm_head", "model.embed_tokens.weight", "re:.*mlp\\.gate($|\\..*)"])
    [finding] = [f for f in lint_json(path) if f["code"] == "WC304"]
    assert finding["details"]["replace_by"] == ["model.embed_tokens"]
    set_ignore(path, ["lm_head", "model.embed_tokens", "re:.*mlp\\.gate($|\\..*)"])
    assert not [f for f in lint_json(path) if f["code"] == "WC304"]


def test_only_fixable_rules_promise_lint_fix() -> None:
    """A rule's own fix text names `lint --fix` only when fixes.py edits for it (or says when it cannot)."""
    from weightcheck.rules import all_rules

    for rule in all_rules().values():
        text = rule.fix_text()
        if CLAIMS_FIX.search(text):
            assert rule.code in FIXED_BY_FIX | {"WC207"}, (rule.code, text)
