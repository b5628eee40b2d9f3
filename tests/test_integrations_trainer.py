"""The adapters with only their documented lines, in a two-rank megatron-core trainer (gloo; PP = 2, then
EP = 2), against stand-ins of slime, miles and verl that keep the module layout, class and method names and
call order of each framework's source at the commit the adapter cites (tests/standins/README.md). The
engine is a tapped SGLang-style module (tests/test_tap.py) hosted by rank 0.

What is checked: the layer and expert counts and ranks come from the trainer (megatron-core's parallel
state, the model's TransformerConfig), so a stage or EP rank that drops its offset is named once (WC725 /
WC726), never as a WC721 per tensor; rank 0 alone checks; slime's colocated path (`HfWeightIteratorDirect`
converting with its own module's `convert_to_hf`) writes its parts and is never called wrong when clean; a
monitor that sees no send says so once and calls no sync wrong."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("safetensors")

sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))

import adapter_trainer as trainer

OFFSET_BUGS = {"pp": "pp_offset", "ep": "ep_offset"}
DISTRIBUTED = [("slime", "distributed"), ("miles", "distributed"), ("verl", "export")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Both trainer layouts, every scenario (each layout is one pair of processes: megatron-core's import
    costs ~30 s a process on 2 cores)."""
    root = tmp_path_factory.mktemp("adapters")
    done: dict[str, Path] = {}

    def run(parallel: str) -> Path:
        if parallel not in done:
            trainer.write_checkpoint(root / parallel / "checkpoint")
            scenarios = [(fw, path, OFFSET_BUGS[parallel]) for fw, path in DISTRIBUTED]
            scenarios.append(("slime", "tensor", None))
            if parallel == "pp":
                scenarios += [("miles", "tensor", None), ("slime", "unseen", None)]
            trainer.run_all(root, parallel, scenarios)
            done[parallel] = root / parallel
        return done[parallel]

    return run


def _result(folder: Path) -> dict[str, Any]:
    doc = json.loads((folder / "result.json").read_text())
    doc["codes"] = [[code for code, _ in findings] for _, findings in doc["results"]]
    doc["others"] = [json.loads(p.read_text()) for p in sorted(folder.glob("result-rank*.json"))]
    return doc


@pytest.mark.parametrize(("parallel", "code", "rank"), [("pp", "WC725", "pp_rank 1"), ("ep", "WC726", "ep_rank 1")])
@pytest.mark.parametrize(("framework", "path"), DISTRIBUTED)
def test_offset_bug_named_once(runs: Any, parallel: str, code: str, rank: str, framework: str, path: str) -> None:
    doc = _result(runs(parallel) / f"{framework}-{path}-{OFFSET_BUGS[parallel]}")
    assert [version for version, _ in doc["results"]] == ["1", "2", "3"]
    first, second, third = doc["results"]
    assert first[1] == [] and second[1] == [], doc["results"]  # clean: against the checkpoint, then the parts
    shifts = [message for c, message in third[1] if c == code]
    assert len(shifts) == 1, third[1]
    assert f"from {rank} shifted by −2" in shifts[0] and "without its offset 2" in shifts[0], shifts[0]
    assert "WC721" not in doc["codes"][2], third[1]  # the parts were relabelled, not reported as disagreeing
    # One rank checks: the other reported nothing.
    assert [other["results"] for other in doc["others"]] == [0]
    assert not [m for level, m in doc["others"][0]["logs"] if level == "ERROR"]


@pytest.mark.parametrize(("parallel", "framework"), [("pp", "slime"), ("pp", "miles"), ("ep", "slime")])
def test_colocated_path_writes_its_parts_and_passes_clean(runs: Any, parallel: str, framework: str) -> None:
    folder = runs(parallel) / f"{framework}-tensor-clean"
    doc = _result(folder)
    assert doc["codes"] == [[], [], []], doc["results"]
    assert not [m for level, m in doc["logs"] if level in ("ERROR", "WARNING")], doc["logs"]
    # Every rank converts the whole model: the checker rank's part describes it, once per sync.
    assert doc["parts"] == [f"manifests/{v}/manifest-pp0-ep0.json" for v in (1, 2, 3)]
    part = json.loads((folder / "records" / "manifests" / "3" / "manifest-pp0-ep0.json").read_text())
    assert part["trainer"]["num_layers"] == trainer.NUM_LAYERS
    assert part["trainer"]["num_experts"] == trainer.NUM_EXPERTS
    assert part["trainer"]["pp_rank"] is None  # a gathered stream names no sending rank


def test_unobserved_sends_are_said_once_and_never_called_wrong(runs: Any) -> None:
    doc = _result(runs("pp") / "slime-unseen-clean")
    # Sync 1 is checked against the checkpoint (that needs no part); syncs 2 and 3 had no part to check against.
    assert doc["codes"] == [[]], doc["results"]
    assert doc["parts"] == []
    warnings = [m for level, m in doc["logs"] if level == "WARNING"]
    assert sum("not observed" in m for m in warnings) == 1, doc["logs"]
    assert not [m for level, m in doc["logs"] if level == "ERROR"]
    assert not any("is wrong" in m for _, m in doc["logs"])
