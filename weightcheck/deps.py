"""Optional dependencies: which extra each feature needs, and one clear error when it is missing.

The core (header-only and config-only lint) needs only click, rich and orjson. Reading tensor data
(`lint --content`, `diff`, `verify` against a checkpoint) needs the `content` extra; Hub repo ids need
`hub`. A command checks up front, so a missing package is one line and exit 2 — never a crash per tensor.
"""

from __future__ import annotations

from pathlib import Path

# extra name -> import names it provides (the pip names are in pyproject.toml's optional-dependencies).
EXTRAS: dict[str, tuple[str, ...]] = {
    "content": ("torch", "numpy", "safetensors", "xxhash"),
    "hub": ("huggingface_hub",),
    "quant": ("compressed_tensors",),
}


def install_command(extra: str) -> str:
    """The pip command that adds `extra` to *this* installation of weightcheck.

    No release is published on a registry, so `pip install 'weightcheck[extra]'` fails for everyone who
    installed from a checkout. pip records where a distribution came from in its `direct_url.json`
    (PEP 610): a local folder (editable or not) is reinstalled from that folder with the extra. Running from
    a source tree that is not installed (PYTHONPATH) names that tree; only a registry install keeps the
    registry spelling."""
    import json
    import shlex
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        raw = metadata.distribution("weightcheck").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        raw = None
    if raw:
        try:
            info = json.loads(raw)
        except ValueError:
            info = {}
        url = info.get("url", "") if isinstance(info, dict) else ""
        if isinstance(info, dict) and url.startswith("file://") and "dir_info" in info:
            folder = unquote(urlparse(url).path)
            editable = "-e " if info["dir_info"].get("editable") else ""
            return f"pip install {editable}{shlex.quote(f'{folder}[{extra}]')}"
    # No install record: with the checkout on PYTHONPATH (or as the working directory) the first distribution
    # found is its build's `weightcheck.egg-info`, which carries none; the running tree says what this is.
    tree = _source_tree()
    if tree is not None:
        return f"pip install -e {shlex.quote(f'{tree}[{extra}]')}"
    return f"pip install 'weightcheck[{extra}]'"


def _source_tree() -> Path | None:
    """The checkout this weightcheck runs from, or None when the package lives in site-packages (a wheel)."""
    tree = Path(__file__).resolve().parent.parent
    return tree if (tree / "pyproject.toml").is_file() else None


class MissingDependency(ImportError):
    """A feature's optional package is not installed. `str()` is the one-line message for the user."""

    def __init__(self, feature: str, missing: list[str], extra: str) -> None:
        self.feature, self.missing, self.extra = feature, missing, extra
        super().__init__(
            f"{feature} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"{install_command(extra)}"
        )


def installed(module: str) -> bool:
    import importlib.util  # here, not at the top: header-only and config-only lint never ask

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module with __spec__ None
        return False


def require(feature: str, extra: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise MissingDependency naming `extra` if any of `modules` (default: all of the extra's) is absent."""
    wanted = EXTRAS[extra] if modules is None else modules
    missing = [m for m in wanted if not installed(m)]
    if missing:
        raise MissingDependency(feature, missing, extra)


def require_verify_deps(records: Path, against: Path | None) -> None:
    """verify digests with xxh3 (the tap's default); re-hashing a checkpoint reference reads tensors (torch)."""
    if not records.exists():
        return  # exit 3 (nothing to check) says more than a missing package
    require("verify", "content", ("xxhash",))
    if against is not None and against.exists():
        try:
            is_checkpoint = against.suffix == ".safetensors" or (
                against.is_dir() and any(p.suffix == ".safetensors" for p in against.iterdir())
            )
        except OSError:
            return
        if is_checkpoint:
            require("verify against a checkpoint", "content", ("torch", "numpy"))
