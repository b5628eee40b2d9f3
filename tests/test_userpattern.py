"""One user-pattern syntax (glob or `re:`, whole name) for --allow-skip, verify --skip, --map, --policy and
per-tensor-ignores: the module itself, then each option read through it, with a glob and an `re:` pattern."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import quant_fixtures
import torch
from quant_fixtures import edit_tensors

from weightcheck import skiplist, userpattern
from weightcheck.compare.policy import DEFAULT_RULES, Policy, PolicyError, parse_policy
from weightcheck.diffing import DiffOptions, NameMapError, diff, parse_name_map, skip_allowed
from weightcheck.findings import Finding, Location, Result, Severity
from weightcheck.triage import suppress_per_name
from weightcheck.userpattern import PatternSyntaxError, capture_pattern, first_match, matches, policy_pattern

NORM = "model.layers.3.post_attention_layernorm.weight"
copy_ckpt = quant_fixtures.copy_ckpt


# ---- the syntax ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pattern, name, expected",
    [
        ("model.layers.*.weight", NORM, True),
        ("*.post_attention_layernorm.weight", NORM, True),
        ("model.layers.?.post_attention_layernorm.weight", NORM, True),
        ("model.layers.[0-2].post_attention_layernorm.weight", NORM, False),
        ("layers.*", NORM, False),  # whole name: a glob is not a substring search
        ("re:model\\.layers\\.\\d+\\..*", NORM, True),
        ("re:layers\\.3", NORM, False),  # whole name for re: too (not re.search, not re.match)
        ("re:model\\.layers", NORM, False),
        (NORM, NORM, True),
    ],
)
def test_glob_and_re_match_the_whole_name(pattern: str, name: str, expected: bool) -> None:
    assert matches(pattern, name) is expected
    assert (first_match(name, ["nothing", pattern]) == pattern) is expected


def test_bad_re_is_a_usage_error_and_skiplist_is_the_same_syntax() -> None:
    with pytest.raises(PatternSyntaxError, match="not a valid regex"):
        userpattern.check_patterns(["ok.*", "re:(unclosed"])
    # diff's allow-skip and verify's --skip (weightcheck.skiplist) are one function: they cannot drift apart
    assert skiplist.first_match is userpattern.first_match
    for entry in ("re:model\\.layers\\..*", "model.layers.*", "re:layers"):
        assert (skip_allowed(NORM, [entry]) is None) == (skiplist.first_match(NORM, [entry]) is None)


def test_map_captures_globs_lazily_and_regex_groups() -> None:
    (glob_rule,) = parse_name_map("model.layers.*.mlp.* -> decoder.*.ffn.*")
    assert glob_rule.apply("model.layers.12.mlp.down_proj.weight") == "decoder.12.ffn.down_proj.weight"
    assert glob_rule.apply("model.embed_tokens.weight") is None
    (re_rule,) = parse_name_map(r"re:model\.layers\.(\d+)\.mlp\.(.*) -> decoder.*.ffn.*")
    assert re_rule.apply("model.layers.12.mlp.down_proj.weight") == "decoder.12.ffn.down_proj.weight"
    assert re_rule.apply("model.layers.x.mlp.down_proj.weight") is None  # \d+ is honoured
    (class_rule,) = parse_name_map("model.layers.[02].* -> even.*")  # `[...]` is a class, as in every glob
    assert class_rule.apply("model.layers.2.mlp.gate") == "even.mlp.gate"
    assert class_rule.apply("model.layers.1.mlp.gate") is None
    assert capture_pattern("a.*").groups == 1


def test_map_errors_count_regex_groups_not_stars() -> None:
    with pytest.raises(NameMapError, match="same number of `\\*`"):
        parse_name_map(r"re:model\.(.*)\.(.*) -> x.*", source="m")  # two groups, one `*`
    with pytest.raises(NameMapError, match=r"m:1: .*not a valid regex"):
        parse_name_map("re:(a -> b", source="m")
    assert parse_name_map(r"re:model\.(.*) -> x.*")  # `*` inside the regex is not a capture


@pytest.mark.parametrize(
    "text, search, name, expected",
    [
        ("re:.*\\.bias", False, "model.layers.0.self_attn.q_proj.bias", True),
        ("re:bias", False, "model.layers.0.self_attn.q_proj.bias", False),
        ("*.bias", False, "model.layers.0.self_attn.q_proj.bias", True),
        ("*.bias", False, "model.layers.0.self_attn.q_proj.bias_x", False),
        ("\\.experts\\.", True, "model.layers.0.mlp.experts.3.down_proj.weight", True),  # older form kept
        ("bias$", True, "model.layers.0.self_attn.q_proj.bias", True),
        ("lm_head", True, "lm_head.weight", True),
    ],
)
def test_policy_patterns(text: str, search: bool, name: str, expected: bool) -> None:
    pattern = policy_pattern(text)
    assert pattern.search is search and pattern.matches(name) is expected


def test_policy_pattern_that_reads_both_ways_is_refused_with_the_spelling() -> None:
    with pytest.raises(PolicyError, match=r"p:1: .*re:\.\*\(\?:model\.layers\.\*\)\.\*"):
        parse_policy("model.layers.*  exact", source="p")
    # the built-in rules keep their old regex reading (regex-only syntax: never a glob)
    assert all(policy_pattern(rule.pattern).search for rule in DEFAULT_RULES)
    user = Policy.with_user_rules(parse_policy("*.q_proj.weight stat\nre:.*k_proj\\.weight ulp"))
    assert user.rule_for("model.layers.0.self_attn.q_proj.weight").tier == "stat"
    assert user.rule_for("model.layers.0.self_attn.k_proj.weight").tier == "ulp"
    assert user.rule_for("model.layers.0.self_attn.v_proj.weight").tier == "auto"


@pytest.mark.parametrize("pattern", ["model.embed_tokens.*", "re:model\\.embed_tokens\\..*"])
def test_per_tensor_ignores_take_glob_and_re(pattern: str) -> None:
    embed = Finding("WC309", "x", Severity.WARNING, "m", Location(), details={"tensors": ["model.embed_tokens.weight"]})
    gate = Finding("WC309", "x", Severity.ERROR, "m", Location(), details={"tensors": ["model.layers.0.mlp.gate"]})
    kept, dropped = suppress_per_name([embed, gate], {pattern: ["WC309"]})
    assert kept == [gate] and dropped == 1


# ---- each option, end to end ----------------------------------------------------------------------------
def wc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightcheck", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)  # fmt: skip


def run_diff(a: Path, b: Path, **options) -> Result:
    return diff(a, b, DiffOptions(progress=False, **options))


def test_diff_options_with_glob_and_re(make_ckpt, copy_ckpt, tmp_path: Path) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    edit_tensors(b, lambda t: t.pop("model.layers.3.mlp.down_proj.weight"))
    assert run_diff(a, b).exit_code() == 1
    for entry in ("model.layers.3.mlp.*", r"re:model\.layers\.3\.mlp\..*"):
        assert run_diff(a, b, allow_skip=[entry]).exit_code() == 0, entry
    for entry in ("layers.3.mlp.*", r"re:layers\.3"):  # not whole-name: still an error
        assert run_diff(a, b, allow_skip=[entry]).exit_code() == 1, entry

    renamed = copy_ckpt(a)
    edit_tensors(renamed, lambda t: t.update({k.replace("model.", "model.language_model.", 1): t.pop(k) for k in [*t]}))
    for spec in ("model.* -> model.language_model.*", r"re:model\.(.*) -> model.language_model.*"):
        assert run_diff(a, renamed, maps=parse_name_map(spec)).exit_code() == 0, spec

    for path in (a, b):
        edit_tensors(path, lambda t: t.__setitem__("model.rotary_emb.inv_freq", torch.arange(8, dtype=torch.float32)))
    for line in ("*.inv_freq exact", r"re:.*\.inv_freq exact", r"inv_freq$ exact"):
        policy = tmp_path / "policy.txt"
        policy.write_text(line + "\n")
        proc = wc("diff", str(a), str(b), "--policy", str(policy), "--allow-skip", "model.layers.3.mlp.*",
                  "--format", "json", "--no-progress")  # fmt: skip
        assert proc.returncode == 0, (line, proc.stdout, proc.stderr)
    policy.write_text("model.rotary_emb.* exact\n")  # reads both ways: refused, never silently re-read
    proc = wc("diff", str(a), str(b), "--policy", str(policy))
    assert proc.returncode == 2 and "re:.*(?:model.rotary_emb.*).*" in proc.stderr


def test_settings_file_patterns_use_the_same_syntax(make_ckpt, copy_ckpt) -> None:
    a = make_ckpt("llama")
    b = copy_ckpt(a)
    edit_tensors(b, lambda t: t.pop("lm_head.weight"))
    settings = a.parent / "pyproject.toml"
    for entry in ("lm_*.weight", r"re:lm_head\.weight"):
        settings.write_text(f"[tool.weightcheck]\nallow-skip = ['{entry}']\n")  # a TOML literal string
        assert wc("diff", str(a), str(b), "--no-progress", cwd=a.parent).returncode == 0, entry
    settings.write_text('[tool.weightcheck]\n[tool.weightcheck.per-tensor-ignores]\n"re:(bad" = ["WC309"]\n')
    proc = wc("lint", str(a), cwd=a.parent)
    assert proc.returncode == 2 and "not a valid regex" in proc.stderr
