"""Every registered code has a bad test (a fixture that produces it) and a good test (a fixture on which the
rule runs and the code is absent). A new rule without both fails here.

Most codes are covered by the fix-text harnesses: each case damages a clean fixture built by a real writer
(the code must appear: bad), applies the code's own fix text and checks again (the code must be gone:
good). Their tables are read from the test files' source. The other codes are listed in OTHER with a bad and
a good test; each listed test must exist, and a bad test must name its code (in its body, or in the table
it is parametrized over), so the table cannot point at an unrelated test.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# file → {table name: the parametrized test that runs every case of it, damage then fix}
HARNESSES: dict[str, dict[str, str]] = {
    "test_fix_texts_all.py": {
        "CASES": "test_fix_text_applied_clears_the_finding",
        "DIFF_CASES": "test_diff_fix_text_applied_clears_the_finding",
        "VERIFY_CASES": "test_verify_fix_text_applied_clears_the_finding",
    },
    "test_fix_texts_rollout.py": {"ROLLOUT_CASES": "test_rollout_fix_text_applied_clears_the_finding"},
}

# code → (bad test, good test), as "file::function". One test may be both when it checks before and after.
OTHER: dict[str, tuple[str, str]] = {
    "WC000": (
        "test_adoption.py::test_internal_error_keeps_its_traceback_and_debug_prints_it",
        "test_diff.py::test_identical_copy_is_clean_with_full_coverage",
    ),
    "WC110": ("test_fix.py::test_fix_refuses_a_symlinked_index", "test_fix_texts_all.py::test_wc110_fix_text_applied"),
    "WC202": (
        "test_fix_texts.py::test_fix_texts_that_promise_lint_fix_are_kept_and_no_other_does",
        "test_lint_integrity.py::test_real_checkpoints_are_clean",
    ),
    "WC304": (
        "test_fix_texts.py::test_wc304_suggestion_differs_and_applied_relints_without_wc304",
        "test_fix_texts.py::test_wc304_suggestion_differs_and_applied_relints_without_wc304",
    ),
    "WC309": (
        "test_quant_lint.py::test_router_param_style_entry_fixes_online_quantizer_only",
        "test_fix_texts.py::test_router_fix_written_by_lint_fix_relints_clean",
    ),
    "WC316": (
        "test_rule_codes_bad_good.py::test_wc316_bad_side_file_excludes_one_module_more",
        "test_rule_codes_bad_good.py::test_wc316_good_published_lists_agree",
    ),
    "WC320": (
        "test_engine_unquantized.py::test_engine_unquantized_module_left_out_of_ignore_is_an_error",
        "test_engine_unquantized.py::test_clean_ignore_list_gets_no_error",
    ),
    "WC339": (
        "test_quant_methods.py::test_unknown_method_is_a_warning_naming_skipped_checks",
        "test_quant_methods.py::test_mxfp4_as_transformers_writes_it_is_accepted",
    ),
    "WC701": (
        "test_rule_codes_bad_good.py::test_wc701_bad_noise_in_no_recognised_pattern",
        "test_rule_codes_bad_good.py::test_wc701_good_noise_of_zero_amplitude",
    ),
    "WC709": (
        "test_rule_codes_bad_good.py::test_wc709_bad_integer_candidate_without_scale",
        "test_rule_codes_bad_good.py::test_wc709_good_lossless_widening",
    ),
    "WC710": (
        "test_rule_codes_bad_good.py::test_wc710_bad_rows_missing_in_no_shard_pattern",
        "test_rule_codes_bad_good.py::test_wc710_good_same_shape",
    ),
    "WC711": (
        "test_diff.py::test_bf16_against_its_w4a16_passes_within_quantization_error",
        "test_diff.py::test_two_quantized_copies_compare_their_stored_parts",
    ),
    "WC712": (
        "test_rule_codes_bad_good.py::test_wc712_bad_signed_zeros_equal_in_value_not_in_bytes",
        "test_rule_codes_bad_good.py::test_wc712_good_same_zeros",
    ),
    "WC717": (
        "test_diff.py::test_malformed_quantized_tensor_is_reported",
        "test_fix_texts_live.py::test_wc717_fix_text_applied",
    ),
    "WC718": (
        "test_rule_codes_bad_good.py::test_wc718_bad_shard_symlinked_out_of_the_candidate",
        "test_rule_codes_bad_good.py::test_wc718_good_regular_shard",
    ),
    "WC720": (
        "test_fix_texts_all.py::test_wc720_fix_text_applied",
        "test_fix_texts_all.py::test_wc720_fix_text_applied",
    ),
    "WC721": (
        "test_fix_texts_all.py::test_wc721_fix_text_applied",
        "test_fix_texts_all.py::test_wc721_fix_text_applied",
    ),
    "WC730": (
        "test_fix_texts_live.py::test_wc730_fix_text_applied",
        "test_fix_texts_live.py::test_wc730_fix_text_applied",
    ),
    "WC733": (
        "test_fix_texts_live.py::test_wc733_fix_text_applied",
        "test_fix_texts_live.py::test_wc733_fix_text_applied",
    ),
    "WC736": (
        "test_fix_texts_live.py::test_wc736_fix_text_applied",
        "test_fix_texts_live.py::test_wc736_fix_text_applied",
    ),
    "WC737": (
        "test_fix_texts_live.py::test_wc737_fix_text_applied",
        "test_fix_texts_live.py::test_wc737_fix_text_applied",
    ),
    "WC738": (
        "test_fix_texts_all.py::test_wc738_fix_text_applied",
        "test_fix_texts_all.py::test_wc738_fix_text_applied",
    ),
    "WC739": (
        "test_fix_texts_all.py::test_wc739_fix_text_applied",
        "test_fix_texts_all.py::test_wc739_fix_text_applied",
    ),
    "WC740": (
        "test_fix_texts_live.py::test_wc740_fix_text_applied",
        "test_fix_texts_live.py::test_wc740_fix_text_applied",
    ),
    "WC741": (
        "test_fix_texts_live.py::test_wc741_fix_text_applied",
        "test_fix_texts_live.py::test_wc741_fix_text_applied",
    ),
    "WC742": (
        "test_fix_texts_live.py::test_wc742_fix_text_applied",
        "test_fix_texts_live.py::test_wc742_fix_text_applied",
    ),
    "WC743": (
        "test_fix_texts_live.py::test_wc743_fix_text_applied",
        "test_fix_texts_live.py::test_wc743_fix_text_applied",
    ),
    "WC744": (
        "test_engine_state.py::test_direct_write_of_a_wrong_tensor_is_reported",
        "test_engine_state.py::test_clean_syncs_record_state_and_pass",
    ),
    "WC745": (
        "test_fix_texts_live.py::test_wc745_fix_text_applied_router",
        "test_fix_texts_live.py::test_wc745_fix_text_applied_router",
    ),
    "WC746": (
        "test_tap_wrote_into.py::test_norms_the_engine_writes_into_are_not_compared_then_digested_on_arrival",
        "test_tap_wrote_into.py::test_an_engine_that_copies_what_it_is_handed_gets_no_wc746",
    ),
    "WC807": ("test_rollout.py::test_degenerate_rewards_and_masks", "test_rollout.py::test_clean_dumps_are_clean"),
    "WC809": ("test_rollout.py::test_degenerate_rewards_and_masks", "test_rollout.py::test_clean_dumps_are_clean"),
    "WC433": (
        "test_peft_adapters.py::test_wc433_fix_text_applied",
        "test_peft_adapters.py::test_wc433_fix_text_applied",
    ),
    "WC502": (
        "test_peft_adapters.py::test_wc502_fix_text_applied",
        "test_peft_adapters.py::test_wc502_fix_text_applied",
    ),
    "WC850": (
        "test_fix_texts_rollout.py::test_wc850_fix_text_applied",
        "test_fix_texts_rollout.py::test_wc850_fix_text_applied",
    ),
    **{
        code: (
            "test_doctor.py::test_log_signal_phrases_each_on_the_log_line",
            "test_rule_codes_bad_good.py::test_log_signals_good_ordinary_logs_have_none",
        )
        for code in ("WC851", "WC852", "WC853", "WC854")
    },
}


@cache
def _tree(file: str) -> tuple[str, ast.Module]:
    source = (TESTS / file).read_text(encoding="utf-8")
    return source, ast.parse(source)


def _function(file: str, name: str) -> ast.FunctionDef | None:
    _, tree = _tree(file)
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _table_codes(file: str, table: str) -> set[str]:
    """The first argument of every case constructor in a module-level table (`Case("WC316", ...)`, or a
    tuple of codes: `RolloutCase(("WC800",), ...)`)."""
    _, tree = _tree(file)
    codes: set[str] = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not (isinstance(target, ast.Name) and target.id == table) or node.value is None:
            continue
        for call in ast.walk(node.value):
            if isinstance(call, ast.Call) and call.args:
                first = call.args[0]
                items = first.elts if isinstance(first, (ast.Tuple, ast.List)) else [first]
                codes.update(i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str))
    return {c for c in codes if re.fullmatch(r"WC\d{3}", c)}


def _harnessed() -> dict[str, str]:
    out: dict[str, str] = {}
    for file, tables in HARNESSES.items():
        for table, test in tables.items():
            for code in _table_codes(file, table):
                out.setdefault(code, f"{file}::{test}")
    return out


def _source_naming(file: str, name: str) -> str:
    """The test's own source, plus the module-level tables it is parametrized over (by argument name)."""
    source, tree = _tree(file)
    fn = _function(file, name)
    assert fn is not None
    text = ast.get_source_segment(source, fn) or ""
    decorators = " ".join(ast.get_source_segment(source, d) or "" for d in fn.decorator_list)
    body_names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and (target.id in decorators or target.id in body_names):
            text += ast.get_source_segment(source, node) or ""
    return decorators + text


def test_every_registered_code_has_a_bad_and_a_good_test() -> None:
    from weightcheck.rules import all_rules

    covered = set(_harnessed()) | set(OTHER)
    missing = sorted(code for code, r in all_rules().items() if code not in covered and not r.retired)
    assert missing == [], f"codes without a bad and a good test (add a harness case or an OTHER entry): {missing}"
    assert sorted(set(OTHER) - set(all_rules())) == [], "OTHER lists codes that are not registered"


def test_the_harness_tests_exist() -> None:
    for file, tables in HARNESSES.items():
        for table, test in tables.items():
            fn = _function(file, test)
            assert fn is not None, f"{file}::{test}"
            assert table in " ".join(ast.get_source_segment(_tree(file)[0], d) or "" for d in fn.decorator_list)
            assert _table_codes(file, table), f"{file}: {table} holds no case"


def test_every_listed_test_exists_and_the_bad_one_names_its_code() -> None:
    problems = []
    for code, (bad, good) in sorted(OTHER.items()):
        for test in (bad, good):
            file, _, name = test.partition("::")
            if not (TESTS / file).is_file() or _function(file, name) is None:
                problems.append(f"{code}: {test} does not exist")
        file, _, name = bad.partition("::")
        if (TESTS / file).is_file() and _function(file, name) is not None and code not in _source_naming(file, name):
            problems.append(f"{code}: {bad} does not name {code}")
    assert problems == []


def test_the_checks_can_fail() -> None:
    assert _function("test_diff.py", "test_no_such_test") is None
    assert "WC705" in _source_naming("test_diff.py", "test_swapped_layers_are_reported_with_their_offsets")
    assert "WC999" not in _source_naming("test_diff.py", "test_swapped_layers_are_reported_with_their_offsets")
    # a parametrized test names the codes of its table
    assert "WC702" in _source_naming("test_diff.py", "test_mismatch_classes")
    assert {"WC316", "WC701", "WC718"} <= set(_harnessed())
