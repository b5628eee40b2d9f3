"""Remote targets: `lint org/name` reads a Hub repo header-only through huggingface_hub, against a
loopback server speaking the Hub protocol (tests/hubserver.py), and must give the same findings as linting
the same directory on disk while the server serves only headers and JSON files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import read_index, shards, write_index
from hubserver import HubServer

from weightcheck.linting import lint

pytest.importorskip("huggingface_hub")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    server = HubServer().start()
    # huggingface_hub reads HF_ENDPOINT at import; weightcheck reads it again per call.
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()


def _view(result) -> list[tuple]:
    """Findings as users see them (code, severity, message, location, count); the remote run's notes differ."""
    return [
        (f.code, f.severity.label, f.message, json.dumps(f.location.as_dict(), sort_keys=True), f.count)
        for f in result.findings
    ]


def _header_budget(directory: Path) -> int:
    """What a header-only read must cost: JSON files whole, and per shard 8 bytes plus the header when the
    declared length fits the file (a lying length costs only its 8 bytes)."""
    total = 0
    for p in directory.iterdir():
        if p.suffix == ".json":
            total += p.stat().st_size
        elif p.suffix == ".safetensors":
            size = p.stat().st_size
            n = struct.unpack("<Q", p.read_bytes()[:8])[0] if size >= 8 else 0
            total += min(size, 8) + (n if 8 + n <= size and n <= 100_000_000 else 0)
    return total


def _damage(kind: str, ckpt: Path) -> None:
    files = shards(ckpt)
    if kind == "missing-shard":
        files[1].unlink()
    elif kind == "ghost-entry":
        index = read_index(ckpt)
        index["weight_map"]["model.layers.99.mlp.up_proj.weight"] = files[0].name
        write_index(ckpt, index)
    elif kind == "truncated-shard":
        data = files[-1].read_bytes()
        files[-1].write_bytes(data[: len(data) - 1000])
    elif kind == "lying-header-length":
        with open(files[0], "r+b") as fh:
            fh.write(struct.pack("<Q", 2_000_000_000))  # a 2 GB header: refused after 8 bytes
    elif kind == "header-past-end":
        with open(files[1], "r+b") as fh:
            fh.write(struct.pack("<Q", files[1].stat().st_size))


CASES = ["clean", "missing-shard", "ghost-entry", "truncated-shard", "lying-header-length", "header-past-end"]


@pytest.mark.parametrize("kind", CASES)
def test_remote_lint_equals_local_lint_reading_only_headers(hub: HubServer, make_ckpt, kind: str) -> None:
    ckpt = make_ckpt("llama")
    if kind != "clean":
        _damage(kind, ckpt)
    hub.add("acme/tiny-llama", ckpt)
    local = lint(ckpt)
    hub.reset_counts()
    remote = lint("acme/tiny-llama")
    assert not remote.nothing_checked, remote.notes
    assert _view(remote) == _view(local)
    assert remote.checked["shards"] == local.checked["shards"]
    assert remote.checked["header_bytes_read"] == local.checked["header_bytes_read"]
    # Only headers and JSON files left the server, each byte once; no tensor data.
    assert sum(hub.served.values()) == _header_budget(ckpt)
    if kind == "clean":
        assert not remote.findings
    else:
        assert remote.findings, kind


def test_cli_lint_repo_id_and_hf_uri_in_a_subprocess(hub: HubServer, make_ckpt, tmp_path: Path) -> None:
    """The console path: HF_ENDPOINT set in the environment before huggingface_hub is imported."""
    ckpt = make_ckpt("llama")
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    for p in ckpt.iterdir():
        (repo / "sub" / p.name).write_bytes(p.read_bytes())
    commit = hub.add("acme/nested", repo)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "weightcheck", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)

    proc = run("lint", f"hf://acme/nested@{commit}/sub", "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["checked"]["shards"] == len(shards(ckpt))
    assert any("header-only" in n for n in doc["summary"]["notes"])
    # --revision applies to a bare repo id; an unknown one is "nothing checked", not a traceback.
    assert run("lint", "acme/nested", "--revision", "no-such-branch").returncode == 3
    assert run("lint", "acme/absent").returncode == 3
    proc = run("explain-ignore", f"hf://acme/nested@{commit}/sub", "--format", "json")
    assert proc.returncode == 3 and "no quantization config" in proc.stdout  # read remotely, not "no such file"


def test_content_and_diff_on_a_remote_repo_need_download(hub: HubServer, make_ckpt) -> None:
    from weightcheck.diffing import diff

    ckpt = make_ckpt("llama")
    hub.add("acme/tiny-llama", ckpt)
    refused = lint("acme/tiny-llama", options={"content": True})
    assert refused.nothing_checked and "--download" in refused.notes[0]
    refused_diff = diff(ckpt, "acme/tiny-llama")
    assert refused_diff.nothing_checked and any("--download" in n for n in refused_diff.notes)
    assert hub.served.get(shards(ckpt)[0].name, 0) == 0  # refusing read nothing

    hub.reset_counts()
    fetched = lint("acme/tiny-llama", options={"content": True, "download": True})
    assert not fetched.nothing_checked
    assert sum(hub.served.values()) >= sum(p.stat().st_size for p in shards(ckpt))
    assert _view(fetched) == _view(lint(ckpt, options={"content": True}))
    # Now the complete snapshot is cached: it is preferred, and no request reaches the server.
    hub.reset_counts()
    again = diff(ckpt, "acme/tiny-llama")
    assert not again.nothing_checked and not again.findings
    assert hub.requests == []


def test_index_only_directory_notes_once_instead_of_wc201_per_shard(make_ckpt) -> None:
    """What `hf download --include '*.json'` leaves: the index is checked, not the absent shards."""
    ckpt = make_ckpt("llama")
    for p in shards(ckpt):
        p.unlink()
    result = lint(ckpt)
    assert not result.nothing_checked
    assert [f for f in result.findings if f.code in ("WC201", "WC106")] == []
    assert sum("index-only mode" in n for n in result.notes) == 1
    # The index is still checked against itself and the config: drop a layer's entries.
    index = read_index(ckpt)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if ".layers.2." not in k}
    write_index(ckpt, index)
    assert any(f.code.startswith("WC4") for f in lint(ckpt).findings)


def test_index_only_remote_repo_reads_json_only(hub: HubServer, make_ckpt) -> None:
    ckpt = make_ckpt("llama")
    for p in shards(ckpt):
        p.unlink()
    hub.add("acme/json-only", ckpt)
    result = lint("acme/json-only")
    assert _view(result) == _view(lint(ckpt))
    assert any("index-only mode" in n for n in result.notes)
