"""The lint path stays light: header-only and config-only lint import no torch, transformers,
compressed-tensors or safetensors, even where they are installed (every llm-compressor user's
environment, and this test environment). Importing compressed-tensors alone costs seconds.

Each lint runs in a fresh interpreter through the real console entry point (`weightcheck.cli.main`), and
the module set is read after it finished.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "sample_configs"
HEAVY = ("torch", "transformers", "compressed_tensors", "safetensors")

PROBE = f"""
import json, sys
sys.argv = ["weightcheck", *json.loads(sys.argv[1])]
code = None
try:
    from weightcheck.cli import main
    main()
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
sys.stderr.write("\\nPROBE " + json.dumps({{"heavy": heavy, "exit": code}}) + "\\n")
"""


def lint_modules(*args: str, cwd: Path | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(["lint", *args, "--format", "json"])],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert line, proc.stderr
    out = json.loads(line[-1][len("PROBE ") :])
    out["report"] = json.loads(proc.stdout)
    return out


def test_heavy_packages_are_installed_here() -> None:
    # The assertions below only mean something where the heavy packages could have been imported.
    import importlib.util

    missing = [m for m in HEAVY if importlib.util.find_spec(m) is None]
    assert not missing, f"test environment lacks {missing}"


@pytest.mark.parametrize(
    "sample",
    [
        "tiny-glm4-moe-w4a16-router-packed",  # header-only, compressed-tensors W4A16 checkpoint
        "tiny-qwen3-moe-lost-shard",  # header-only, unquantized, broken shards
        "qwen3-30b-a3b-fp8-block",  # config-only, HF FP8, 145-entry modules_to_not_convert
        "glm-4.5-air-w4a16-router-not-ignored",  # config-only, compressed-tensors
        "glm-4.7-w4a16-layer-regex-overreach",  # config-only, compressed-tensors with regexes
    ],
)
def test_lint_imports_nothing_heavy(sample: str) -> None:
    out = lint_modules(str(SAMPLES / sample))
    assert out["exit"] in (0, 1)
    assert out["report"]["summary"]["checked"]["rules"] > 0
    assert out["heavy"] == [], f"lint of {sample} imported {out['heavy']}"


def test_validate_with_compressed_tensors_asks_the_package(tmp_path: Path) -> None:
    """The opt-in really imports compressed-tensors (so the check above is not vacuous) and gives the
    package's own verdict on a config the mirror also rejects."""
    config = json.loads((SAMPLES / "glm-4.5-air-w4a16-recommended" / "config.json").read_text())
    group = next(iter(config["quantization_config"]["config_groups"].values()))
    group["weights"]["pytorch_dtype"] = "fp4"  # QuantizationArgs forbids extra keys
    (tmp_path / "config.json").write_text(json.dumps(config))

    mirror = lint_modules(str(tmp_path))
    real = lint_modules(str(tmp_path), "--validate-with", "compressed-tensors")
    # Run from inside the target folder: its own settings file applies there.
    (tmp_path / "pyproject.toml").write_text('[tool.weightcheck]\nvalidate-with = "compressed-tensors"\n')
    from_settings = lint_modules(".", cwd=tmp_path)
    assert mirror["heavy"] == []
    assert "compressed_tensors" in real["heavy"] and "compressed_tensors" in from_settings["heavy"]
    for out in (mirror, real, from_settings):
        wc301 = [f for f in out["report"]["findings"] if f["code"] == "WC301"]
        assert wc301 and "pytorch_dtype" in wc301[0]["message"], out["report"]["findings"]
