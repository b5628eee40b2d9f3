"""Test helpers: run lint and pick findings by code; rewrite shards with the real safetensors writer."""

from __future__ import annotations

from pathlib import Path

from weightcheck.findings import Finding, Result
from weightcheck.linting import lint


def run(path: Path, **kw) -> Result:
    return lint(path, **kw)


def codes(result: Result) -> set[str]:
    return {f.code for f in result.findings}


def by_code(result: Result, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


def rewrite_shard(
    path: Path, drop: set[str] = frozenset(), add: dict | None = None, rename: dict | None = None
) -> None:
    """Rewrite one shard with safetensors' own writer, dropping/adding/renaming tensors."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {}
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        for key in fh.keys():
            if key in drop:
                continue
            tensors[(rename or {}).get(key, key)] = fh.get_tensor(key)
    tensors.update(add or {})
    save_file(tensors, str(path), metadata=meta)
