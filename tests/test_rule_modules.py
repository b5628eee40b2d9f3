"""`RULE_MODULES_BY_COMMAND`: each command imports only the modules holding its rules (a plain lint does not
import diff's, verify's or rollout's, #20), so the table must name, for every command, every module that
registers one of its rules, and `command_rules` must give what `all_rules` gives for that command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import importlib, json
from weightcheck import rules
seen, owner = set(rules._REGISTRY), {}
for module in rules.RULE_MODULES:
    importlib.import_module(module)
    for code in set(rules._REGISTRY) - seen:
        owner[code] = [module, rules._REGISTRY[code].command]
    seen |= set(rules._REGISTRY)
print(json.dumps(owner))
"""


def _fresh(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_every_rule_module_is_listed_under_its_rules_command() -> None:
    from weightcheck.rules import RULE_MODULES_BY_COMMAND

    owner = json.loads(_fresh(_PROBE))
    assert len(owner) > 100
    for code, (module, command) in owner.items():
        assert module in RULE_MODULES_BY_COMMAND[command], (code, module, command)
    # and no module is listed for a command none of its rules belongs to
    for command, modules in RULE_MODULES_BY_COMMAND.items():
        for module in modules:
            assert any(m == module and c == command for m, c in owner.values()), (command, module)


def test_command_rules_equal_all_rules_of_that_command_in_a_fresh_process() -> None:
    code = """
import json
from weightcheck import rules
first = {cmd: sorted(rules.command_rules(cmd)) for cmd in ("lint", "diff", "verify", "rollout", "doctor")}
every = rules.all_rules()
again = {cmd: sorted(c for c, r in every.items() if r.command == cmd) for cmd in first}
print(json.dumps([first, again]))
"""
    first, again = json.loads(_fresh(code))
    assert first == again and all(first.values())


def test_rules_covering_loads_the_rest_only_for_a_code_not_loaded() -> None:
    code = """
import json, sys
from weightcheck import rules
rules.command_rules("lint")
lint_only = "weightcheck.rules.verify" not in sys.modules
known = rules.rules_covering(["WC302", "WC000"])
loaded = "weightcheck.rules.verify" in sys.modules
wider = rules.rules_covering(["WC302", "WC721"])["WC721"].command
print(json.dumps([lint_only, loaded, known["WC302"].name, wider, "weightcheck.rules.verify" in sys.modules]))
"""
    lint_only, verify_loaded, name, command, verify_loaded_after = json.loads(_fresh(code))
    assert lint_only and not verify_loaded and name == "ignore-entry-unmatched"
    assert command == "verify" and verify_loaded_after
