"""`weightcheck rollout` on untrusted and torch-free inputs: hostile pickles are refused, never run; bad
files are findings, never tracebacks; a JSONL-only folder is read without importing torch."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from weightcheck.findings import Result
from weightcheck.rollouts import check_rollout
from weightcheck.rollouts.loading import DumpRefused, load_dump


def codes(result: Result) -> set[str]:
    return {f.code for f in result.findings}


class _Payload:
    """A pickle that would run a shell command when unpickled with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    dump = tmp_path / "0.pt"
    torch.save({"rollout_id": 0, "samples": [{"tokens": [1], "hook": _Payload(marker)}]}, dump)
    result = check_rollout(dump)
    (finding,) = result.findings
    assert finding.code == "WC800" and ("posix.system" in finding.message or "os.system" in finding.message)
    assert not marker.exists()
    # A legacy (non-zip) pickle is refused by the restricted unpickler just the same.
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps({"samples": [_Payload(marker)]}))
    with pytest.raises(DumpRefused):
        load_dump(legacy)
    assert not marker.exists()


def test_damaged_and_odd_files_are_findings(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"rollout_id": 0, "samples": [{"tokens": [1, 2], "response_length": 1, "reward": 1.0}]}, good)
    raw = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"\x00not a torch file" * 10)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    os.mkfifo(tmp_path / "fifo.pt")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.pt"
    torch.save({"samples": []}, outside)
    (tmp_path / "escape.pt").symlink_to(outside)
    result = check_rollout(tmp_path)
    bad = {f.location.file for f in result.findings if f.code == "WC800"}
    assert {"truncated.pt", "garbage.pt", "list.pt", "fifo.pt"} <= bad
    assert any("escape.pt: skipped" in n for n in result.notes)
    assert result.checked["responses"] == 1


def test_size_budget(tmp_path: Path) -> None:
    dump = tmp_path / "0.pt"
    torch.save({"rollout_id": 0, "samples": [{"tokens": list(range(1000))}]}, dump)
    with pytest.raises(DumpRefused, match="larger than"):
        load_dump(dump, limit=100)


def relax_jsonl(rollout_world: dict[str, Any], path: Path) -> Path:
    """Relax's rollout_result/train/{id}.jsonl: one `_sample_to_summary_record` per line
    (redai-infra/Relax@2765d18a `relax/utils/training/train_dump_utils.py`), written with json.dumps."""
    path.mkdir(parents=True)
    lines = []
    for i, s in enumerate(rollout_world["clean"].samples):
        prompt_length = len(s["tokens"]) - s["response_length"]
        record = {
            "rollout_id": 0,
            "sample_index": i,
            "prompt": s["prompt"],
            "response": s["response"],
            "reward": s["reward"],
            "prompt_length": prompt_length,
            "response_length": s["response_length"],
            "total_length": len(s["tokens"]),
            "response_token_ids": s["tokens"][prompt_length:],
            "status": s["status"],
            "group_index": s["group_index"],
            "response_rollout_log_probs": s["rollout_log_probs"],
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    out = path / "0.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return path


def test_relax_jsonl_is_read_without_torch(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    root = relax_jsonl(rollout_world, tmp_path / "rollout_result" / "train")
    code = (
        "import sys, json; from weightcheck.rollouts import check_rollout; from pathlib import Path; "
        f"r = check_rollout(Path({str(root)!r})); "
        "print(json.dumps({'codes': [f.code for f in r.findings], 'checked': r.checked, "
        "'torch': 'torch' in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {
        "codes": [],
        "checked": {**out["checked"], "responses": len(rollout_world["clean"].samples)},
        "torch": False,
    }
    assert out["checked"]["nll_tokens"] > 0 and out["checked"]["rewards"] == len(rollout_world["clean"].samples)
    # The re-templated prompts' signature is seen in the JSONL alone.
    with (root / "0.jsonl").open("a") as fh:
        bad = rollout_world["retemplated"].samples[0]
        fh.write(json.dumps({"sample_index": 99, "prompt": bad["prompt"], "response": "", "response_length": 0}) + "\n")
    fh_result = check_rollout(root)
    assert {"WC806", "WC807"} <= codes(fh_result)


def test_rules_listing_is_light() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from weightcheck.cli import main; sys.argv=['weightcheck','rules']; "
            "import contextlib\ntry:\n    main()\nexcept SystemExit: pass\nassert 'torch' not in sys.modules",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WC802" in proc.stdout and "step1-kl-elevated" in proc.stdout and "WC850" in proc.stdout


def test_pt_dumps_without_torch_are_one_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from weightcheck import deps

    torch.save({"rollout_id": 0, "samples": []}, tmp_path / "0.pt")
    monkeypatch.setattr(deps, "installed", lambda module: module != "torch")
    with pytest.raises(deps.MissingDependency, match=r"\[content\]"):
        check_rollout(tmp_path)


def miles_parquet(rollout_world: dict[str, Any], root: Path, samples: list[dict[str, Any]]) -> Path:
    """miles's dashboard_columns sidecar: the schema of `save_dashboard_columns` (radixark/miles@31f1ca96
    `miles/ray/rollout/debug_data.py`). miles writes it with polars; pyarrow writes the same parquet schema."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("sample_index", pa.int32()),
            ("response_length", pa.int32()),
            ("total_length", pa.int32()),
            ("tokens", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("rollout_log_probs", pa.list_(pa.float32())),
        ]
    )
    rows = [
        dict(
            sample_index=s["index"],
            response_length=s["response_length"],
            total_length=len(s["tokens"]),
            tokens=s["tokens"],
            loss_mask=s["loss_mask"],
            rollout_log_probs=s["rollout_log_probs"],
        )
        for s in samples
    ]
    (root / "dashboard_columns").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), root / "dashboard_columns" / "rollout_0.parquet")
    return root


def test_miles_parquet_sidecar(rollout_world: dict[str, Any], tmp_path: Path) -> None:
    clean = miles_parquet(rollout_world, tmp_path / "clean", rollout_world["clean"].samples)
    result = check_rollout(clean)
    assert result.findings == [] and result.checked["nll_tokens"] > 0
    bad = miles_parquet(rollout_world, tmp_path / "bad", rollout_world["retemplated"].samples)
    assert "WC805" in codes(check_rollout(bad))  # the template signature from the torch-free sidecar alone
    # Beside the .pt rollout dump it mirrors, the sidecar is not read twice.
    (bad / "rollout_data").mkdir()
    torch.save(
        dict(rollout_id=0, metadata={}, samples=rollout_world["retemplated"].samples), bad / "rollout_data" / "0.pt"
    )
    both = check_rollout(bad)
    assert [f.code for f in both.findings].count("WC805") == 1


@pytest.mark.parametrize(
    ("prompt", "doubled"),
    [
        ("<s>[INST] What is 2+2? [/INST]", False),  # Mistral / Llama-2 opening
        ("<s>[INST] a [/INST] b</s><s>[INST] c [/INST]", False),  # their multi-turn form
        ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", False),
        ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>", False),
        ("<s><s>[INST] What is 2+2? [/INST]", True),
        ("<|begin_of_text|><|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ", True),
        ("<|im_start|>user\n<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_end|>\n", True),
    ],
)
def test_double_template_markers(prompt: str, doubled: bool) -> None:
    from weightcheck.rollouts.checks import double_template

    assert (double_template(prompt) is not None) is doubled
