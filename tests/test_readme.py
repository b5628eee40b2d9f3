"""The README runs as written (issue #19): its code blocks, run verbatim in a copy of the repository, its JSON
example and sample_configs/README.md's expected codes against real runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(?P<reason>.+?)\s*-->")
EXPECTED_EXIT = re.compile(r"#.*\bexit (\d)\b")

# Blocks the test cannot run (network, an engine or cluster, the suite itself), by their first line. Each
# carries a `<!-- readme-test: reason -->` line above it; adding one means adding it here, on purpose.
NOT_RUN = {
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/weightcheck lint "
    "sample_configs/tiny-glm4-moe-w4a16-router-packed",
    ".venv/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu    # CPU-only machines",
    "bash scripts/test.sh",
    "/path/to/sglang-env/bin/pip install -e '/path/to/weightcheck[sglang]'",
    ".venv/bin/pip install -q -e '.[hub]'",
    ".venv/bin/pip install -q -e '.[content,ray]'",
    "weightcheck rollout /path/to/dump_details          # rollout_data/, train_data/ of --dump-details",
}


@dataclass
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based
    skip_reason: str | None

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks(path: Path = README) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = MARKER.search(lines[i - 1]) if i else None
        out.append(Block(fence.group(1), "\n".join(lines[i + 1 : end]), i + 1, marker and marker.group("reason")))
        i = end + 1
    return out


def test_blocks_not_run_are_few_and_stated() -> None:
    found = blocks()
    skipped = {b.first_line: b.skip_reason for b in found if b.skip_reason}
    assert set(skipped) == NOT_RUN, "a README block gained or lost its readme-test marker"
    assert all(len(reason) > 10 for reason in skipped.values()), skipped  # each says why
    runnable = [b for b in found if b.lang in ("bash", "python") and not b.skip_reason]
    assert len(runnable) >= 2 and len(skipped) <= 7  # the demo and the API example run


def _offline_venv(root: Path) -> Path:
    """`.venv` as the README's first command leaves it (weightcheck from this copy, editable), made without
    the network: a real venv whose site-packages reach the copy and the test environment's packages."""
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    ours += [p for p in site.getsitepackages() if p not in ours]
    (Path(purelib) / "weightcheck-readme-test.pth").write_text("\n".join([str(root), *ours]) + "\n")
    script = venv / "bin" / "weightcheck"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom weightcheck.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return venv


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme") / "weightcheck"
    skip = shutil.ignore_patterns(".git", ".venv", ".venv-*", "__pycache__", "*.egg-info", "wc-records", "bench-out")
    shutil.copytree(REPO, root, ignore=skip)
    _offline_venv(root)
    return root


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", WEIGHTCHECK_PROGRESS_INTERVAL="3600")
    return env


def test_first_command_lints_the_sample_with_the_core_and_exits_1_as_stated(copy: Path) -> None:
    first = next(b for b in blocks() if b.first_line.startswith("python3 -m venv .venv"))
    lint_part = first.first_line.split(" && ")[-1]  # the venv exists already (made offline above)
    proc = subprocess.run(lint_part, shell=True, cwd=copy, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "WC308" in proc.stdout, proc.stdout + proc.stderr
    assert "exits\n1 on purpose" in README.read_text() or "exits 1 on purpose" in README.read_text()


def _instrumented(text: str, rc_file: Path) -> tuple[str, list[tuple[str, int]]]:
    """The block's lines verbatim, each followed by a line recording its exit status; and what the README
    says each line exits with (`# exit N` in its comment, else 0)."""
    script, expected = [], []
    for line in text.splitlines():
        script.append(line)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = EXPECTED_EXIT.search(line)
        expected.append((line, int(match.group(1)) if match else 0))
        script.append(f'echo "$?" >> {rc_file}')
    return "\n".join(script) + "\n", expected


def test_readme_blocks_run_verbatim(copy: Path) -> None:
    runnable = [b for b in blocks() if b.lang in ("bash", "python") and not b.skip_reason]
    for block in runnable:
        if block.lang == "bash":
            rc_file = copy / ".readme-rc"
            rc_file.unlink(missing_ok=True)
            script, expected = _instrumented(block.text, rc_file)
            proc = subprocess.run(["bash", "-c", script], cwd=copy, env=_env(), capture_output=True, text=True,
                                  timeout=900)  # fmt: skip
            codes = [int(x) for x in rc_file.read_text().split()] if rc_file.exists() else []
            got = list(zip([line for line, _ in expected], codes, strict=False))
            assert codes == [rc for _, rc in expected], (f"README line {block.line}", got, proc.stdout[-3000:],
                                                          proc.stderr[-3000:])  # fmt: skip
        else:  # python: with the .venv's interpreter, from the repository root like the shell blocks
            proc = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c", block.text], cwd=copy, env=_env(),
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            assert proc.returncode == 0, (f"README line {block.line}", proc.stdout[-3000:], proc.stderr[-3000:])


# ---- the JSON example and the samples' expected codes (issue #19 item 13) --------------------------------


def _run_json(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "weightcheck", *args, "--format", "json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return json.loads(proc.stdout)


def test_json_example_is_a_real_run() -> None:
    example = json.loads(next(b.text for b in blocks() if b.lang == "json"))
    real = _run_json("lint", example["target"])
    assert {k: v for k, v in example.items() if k != "findings"} == {k: v for k, v in real.items() if k != "findings"}
    assert len(example["findings"]) == len(real["findings"])
    for shown, actual in zip(example["findings"], real["findings"], strict=True):
        assert set(shown) <= set(actual)
        for key, value in shown.items():
            if key == "message":  # shortened with "..."
                assert actual["message"].startswith(value.removesuffix("...")), (value, actual["message"])
            else:
                assert actual[key] == value, (key, value, actual[key])


def _sample_rows() -> list[tuple[str, str]]:
    rows = []
    for line in (REPO / "sample_configs" / "README.md").read_text(encoding="utf-8").splitlines():
        # Cells split on " | " only: a regex in a cell (`($|\\..*)`) holds a bare "|".
        cells = [c.strip() for c in re.split(r"\s\|\s", line.strip().removeprefix("| ").removesuffix(" |"))]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0] != "`sample`":
            rows.append((cells[0].strip("`"), cells[2]))
    return rows


def test_sample_readme_expected_codes_are_what_lint_reports() -> None:
    rows = _sample_rows()
    shipped = {p.name for p in (REPO / "sample_configs").iterdir() if p.is_dir()}
    assert {name.split("/")[0] for name, _ in rows} == shipped  # every sample documented
    for name, expected in rows:
        top_level = re.sub(r"\([^)]*\)", "", expected)
        codes = set(re.findall(r"WC\d{3}", top_level))
        assert codes or expected == "clean", (name, expected)
        doc = _run_json("lint", f"sample_configs/{name}")
        assert {f["code"] for f in doc["findings"]} == codes, (name, expected, doc["findings"])
