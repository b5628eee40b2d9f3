"""The hostile-input fuzzing suite: hypothesis drives one mutation family per test over real artefacts
(tests/fuzzing.py) and every case must keep the contract (allowed exit code, a JSON report, no traceback,
bounded time and memory, nothing opened outside the target, nothing written).

CI (scripts/ci-groups/30-fuzz.sh) runs a short, derandomized pass: `pytest -m fuzz tests/test_fuzz.py`.
A long local run (docs/security.md):

    WC_FUZZ_EXAMPLES=5 WC_FUZZ_SECONDS=1200 WC_FUZZ_RANDOM=1 WC_FUZZ_KEEP_GOING=/tmp/fuzz.log \\
        WC_FUZZ_STATS=/tmp/fuzz.json pytest -m fuzz tests/test_fuzz.py

Every case is also held to the memory budget (peak RSS at most `WC_FUZZ_RSS`, 512 MiB by default:
tests/fuzzing.py RSS_BUDGET, docs/security.md); families that build invalid input by construction also
require the finding that says so (a silent pass is a violation).
`WC_FUZZ_KEEP_GOING` logs contract violations to that file and carries on (instead of stopping at the
first); `WC_FUZZ_STATS` receives the number of cases tried per family; `WC_FUZZ_SECONDS` shares a wall-time
budget equally between the families (each runs batches of WC_FUZZ_EXAMPLES until its share is spent).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fuzzing import COUNTS, CPU_SECONDS, FAMILIES, PEAK_RSS, build_corpus, fuzz_one
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("WC_FUZZ_EXAMPLES", "3"))
RANDOM = bool(os.environ.get("WC_FUZZ_RANDOM"))
KEEP_GOING = os.environ.get("WC_FUZZ_KEEP_GOING")
STATS = os.environ.get("WC_FUZZ_STATS")
# Total wall seconds for the whole run, shared equally by the families (0 = no limit: EXAMPLES decides).
SECONDS = float(os.environ.get("WC_FUZZ_SECONDS", "0"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_corpus(tmp_path_factory.mktemp("fuzz-corpus") / "corpus")
    yield path
    if STATS:
        cpu = {k: round(v, 1) for k, v in CPU_SECONDS.items()}
        rss = {k: v >> 20 for k, v in PEAK_RSS.items()}
        doc = {"cases": dict(COUNTS), "cpu_seconds": cpu, "peak_rss_mib": rss}
        Path(STATS).write_text(json.dumps(doc, indent=1, sort_keys=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_contract_holds_under_mutation(family: str, corpus: Path, tmp_path: Path) -> None:
    stop = time.monotonic() + SECONDS / len(FAMILIES) if SECONDS else None

    @settings(
        max_examples=EXAMPLES,
        derandomize=not RANDOM,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each step is a subprocess
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        case, outcome = fuzz_one(data.draw, corpus, tmp_path / "case", family)
        report = f"[{family}] {case.notes} rc={outcome.rc} {outcome.cpu_seconds:.1f} CPU s: {outcome.violations}"
        if outcome.violations and KEEP_GOING:
            with open(KEEP_GOING, "a", encoding="utf-8") as fh:
                fh.write(report + "\n" + outcome.stderr[-1500:] + "\n")
            return
        assert not outcome.violations, report + "\n" + outcome.stderr[-3000:]

    if stop is None:
        check()
        return
    # A time-boxed run: batches of EXAMPLES (fresh seeds each with WC_FUZZ_RANDOM) until the share is spent.
    # (Stopping inside one hypothesis run would make its data generation look flaky.)
    while time.monotonic() < stop:
        check()
