"""Remote checkpoints: a Hugging Face Hub repo read header-only over HTTP ranges.

`org/name[@revision]` and `hf://org/name[@revision][/subfolder]` name a repo. `HubSource` is the loader's
file source for it: one listing request (names and sizes, pinned to the commit it returns), each config
JSON fetched whole under a size cap, and per shard two ranged GETs (the 8-byte length, then the header).
The header goes through the same validator as a local file, with the listed file size as the bound: a
header length that runs past the file, or past the 100 MB cap, is a finding after 8 bytes.

All HTTP goes through `huggingface_hub` (its session, auth headers, URL scheme, errors), so `HF_TOKEN`,
`HF_ENDPOINT` and proxies behave as for every other Hub client. Nothing is written to disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from weightcheck.checkpoint import (
    INDEX_NAME,
    SHARD_RE,
    SINGLE_NAME,
    JsonDoc,
    PathRefusal,
    json_limit,
    parse_json_doc,
)
from weightcheck.lightclass import dataclass
from weightcheck.safetensors_header import HeaderProblem, HeaderReport, parse_header

# Concurrent requests per repo: headers are latency-bound, not bandwidth-bound.
MAX_WORKERS = 16
# Seconds without a byte before a request is abandoned (a stalled server must not hang lint).
TIMEOUT = 30.0
_NAME = r"[A-Za-z0-9][\w.-]*"
# Compiled on first use (`re`'s cache), not at import: the two cost several ms and a lint of a local path,
# the usual target, needs neither.
_REPO_ID = rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[\w./-]+))?$"
_HF_URI = rf"^hf://(?:models/)?(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>refs/pr/\d+|[\w.-]+))?(?P<sub>/.*)?$"


class HubError(Exception):
    """The repo could not be listed (not found, no access, no network): nothing can be checked."""


@dataclass(frozen=True)
class HubTarget:
    """A Hugging Face Hub repo (and revision, subfolder) named as a lint target."""

    repo_id: str
    revision: str | None = None
    subfolder: str = ""

    @property
    def uri(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        sub = f"/{self.subfolder}" if self.subfolder else ""
        return f"hf://{self.repo_id}{rev}{sub}"


def parse_target(spec: str, revision: str | None = None) -> HubTarget | None:
    """`org/name[@rev]` or `hf://org/name[@rev][/sub]` → a HubTarget; None for anything else (a path).

    An existing local path always wins over a repo id of the same spelling. `revision` (from
    `--revision`) applies when the spec names none."""
    # `Path("hf://x")` prints as "hf:/x" (CLI arguments arrive as Paths): accept any number of slashes.
    spec = re.sub(r"^hf:/+", "hf://", str(spec))
    m = re.match(_HF_URI, spec) if spec.startswith("hf://") else None
    if m is None:
        if Path(spec).exists() or local_looking(spec):
            return None
        m = re.match(_REPO_ID, spec)
        if m is None:
            return None
    sub = (m.groupdict().get("sub") or "").strip("/")
    parts = PurePosixPath(sub).parts if sub else ()
    if any(p in ("..", ".") for p in parts):
        return None
    return HubTarget(m.group("repo"), m.group("rev") or revision, "/".join(parts))


# File extensions of what weightcheck reads locally: `ck/config.json` is a path, never the repo "ck/config.json".
LOCAL_EXTENSIONS = (".json", ".safetensors", ".jsonl", ".toml")


def local_looking(spec: str) -> str | None:
    """Why `spec` is a local path even though it does not exist (a typo must say "no such file or directory",
    not leave the machine as a Hub request), or None when it may be a Hub repo id.

    Local-looking: it starts with `./`, `../`, `/` or `~` (or is `.`/`..`); it holds a backslash; its first
    component exists here (`ck/nope` while `ck/` exists); or it ends in a file extension weightcheck reads
    (.json, .safetensors, .jsonl, .toml). Only `hf://...` is always a repo."""
    if spec.startswith("hf:/"):
        return None
    if spec in (".", ".."):
        return f"it is {spec}"
    for prefix in ("./", "../", "/", "~"):
        if spec.startswith(prefix):
            return f"it starts with {prefix}"
    if "\\" in spec:
        return "it holds a backslash"
    first = spec.split("/", 1)[0]
    if "/" in spec and first and os.path.lexists(first):
        return f"{first!r} exists here"
    name = spec.split("@", 1)[0]
    if name.lower().endswith(LOCAL_EXTENSIONS):
        return f"it ends in {Path(name).suffix}"
    return None


def _endpoint() -> str | None:
    # huggingface_hub reads HF_ENDPOINT once at import; read it again so a late setting is honoured.
    value = os.environ.get("HF_ENDPOINT")
    return value.rstrip("/") if value else None


def _token() -> str | bool | None:
    return os.environ.get("HF_TOKEN") or None


def _cache_dir() -> str | None:
    # Like HF_ENDPOINT, huggingface_hub freezes HF_HUB_CACHE / HF_HOME at import; read them per call so the
    # cache weightcheck reads and downloads into is the one the environment names now.
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return cache
    home = os.environ.get("HF_HOME")
    return os.path.join(home, "hub") if home else None


class _RangeReader:
    """`read(n)` from the current offset of a remote file, one ranged GET per call, never past `size`."""

    def __init__(self, source: HubSource, name: str, size: int) -> None:
        self.source, self.name, self.size, self.pos = source, name, size, 0

    def read(self, n: int, /) -> bytes:
        n = max(0, min(n, self.size - self.pos))
        if n == 0:
            return b""
        data = self.source.read_range(self.name, self.pos, n)
        self.pos += len(data)
        return data


class HubSource:
    """A repo (at one commit, optionally a subfolder) as the checkpoint loader's file source."""

    def __init__(self, target: HubTarget, *, max_workers: int = MAX_WORKERS) -> None:
        try:
            from huggingface_hub import HfApi
        except ImportError as exc:  # pragma: no cover - the [hub] extra is missing
            from weightcheck.deps import install_command

            raise HubError(f"reading a Hub repo needs huggingface-hub: {install_command('hub')}") from exc
        self.target = target
        self.max_workers = max_workers
        self.api = HfApi(endpoint=_endpoint(), token=_token())
        self.bytes_received = 0
        self.requests = 0
        try:
            info = self.api.model_info(target.repo_id, revision=target.revision, files_metadata=True, timeout=TIMEOUT)
        except Exception as exc:  # RepositoryNotFound, RevisionNotFound, gated, offline, DNS...
            raise HubError(f"{target.uri}: cannot list the repo: {type(exc).__name__}: {_first_line(exc)}") from None
        self.commit: str = info.sha or target.revision or "main"
        prefix = f"{target.subfolder}/" if target.subfolder else ""
        # Every file under the root (relative name → size). Sizes come from the listing, so they bound
        # every read; a file without a size is listed but never read.
        self.sizes: dict[str, int | None] = {
            s.rfilename[len(prefix) :]: s.size for s in info.siblings or [] if s.rfilename.startswith(prefix)
        }
        sub = f"/{target.subfolder}" if target.subfolder else ""
        self.label = f"hf://{target.repo_id}@{self.commit}{sub}"
        # Checkpoint.root is a Path; only its text is ever shown for a remote repo.
        self.root = Path(self.label)

    # ---- FileSource ---------------------------------------------------------------------------------
    def entries(self) -> list[str]:
        top = {name.split("/", 1)[0] for name in self.sizes}  # a nested file shows its top directory
        return sorted(top)

    def read_json(self, name: str) -> JsonDoc:
        doc = JsonDoc(path=f"{self.label}/{name}")
        if name not in self.sizes:
            doc.exists, doc.error = False, "missing"
            return doc
        size = self.sizes[name]
        if size is None:
            doc.error = "the listing gives no size"
            return doc
        limit = json_limit(name)
        if size > limit:
            doc.error = f"{size} bytes, larger than the {limit}-byte limit"
            return doc
        try:
            raw = self.read_range(name, 0, size) if size else b""
        except OSError as exc:
            doc.error = f"cannot read: {exc}"
            return doc
        return parse_json_doc(doc, raw)

    def read_headers(self, names: list[str]) -> dict[str, HeaderReport | PathRefusal]:
        from concurrent.futures import ThreadPoolExecutor  # only for remote headers: keeps local lint's import light

        with ThreadPoolExecutor(max_workers=max(1, min(self.max_workers, len(names)))) as pool:
            opened = list(pool.map(self._open_shard, names))
        return dict(zip(names, opened, strict=True))

    # ---- reading -----------------------------------------------------------------------------------
    def _open_shard(self, name: str) -> HeaderReport | PathRefusal:
        refusal = _refuse_name(name)
        if refusal is not None:
            return refusal
        if name not in self.sizes:
            return PathRefusal(name, "file does not exist", "missing")
        size = self.sizes[name]
        if size is None:
            report = HeaderReport(path=f"{self.label}/{name}")
            report.problems.append(HeaderProblem("IoError", "the repo listing gives no size for this file"))
            return report
        return parse_header(_RangeReader(self, name, size), size, f"{self.label}/{name}")

    def url(self, name: str) -> str:
        from huggingface_hub import hf_hub_url

        path = f"{self.target.subfolder}/{name}" if self.target.subfolder else name
        return hf_hub_url(self.target.repo_id, path, revision=self.commit, endpoint=self.api.endpoint)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """Bytes [start, start+length) of one file. Reads at most `length` bytes even from a server that
        ignores Range (answers 200 with the whole file). Raises OSError on any failure."""
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = build_hf_headers(token=_token(), headers={"Range": f"bytes={start}-{start + length - 1}"})
        session: Any = get_session()
        self.requests += 1
        try:
            if hasattr(session, "stream"):  # huggingface_hub >= 1.0: an httpx.Client
                with session.stream("GET", self.url(name), headers=headers, timeout=TIMEOUT) as response:
                    hf_raise_for_status(response)
                    return self._take(response, response.iter_bytes(), start, length)
            response = session.get(self.url(name), headers=headers, timeout=TIMEOUT, stream=True)  # requests
            try:
                hf_raise_for_status(response)
                return self._take(response, response.iter_content(65536), start, length)
            finally:
                response.close()
        except OSError:
            raise
        except Exception as exc:  # HTTP errors, timeouts, connection resets
            raise OSError(f"{type(exc).__name__}: {_first_line(exc)}") from None

    def _take(self, response: Any, chunks: Any, start: int, length: int) -> bytes:
        # A 200 answer is the whole file from byte 0: skip to `start` (only ever 0 here in practice).
        skip = start if response.status_code == 200 else 0
        out = bytearray()
        for chunk in chunks:
            self.bytes_received += len(chunk)
            if skip:
                cut = min(skip, len(chunk))
                chunk, skip = chunk[cut:], skip - cut
            out += chunk[: length - len(out)]
            if len(out) >= length:
                break
        return bytes(out)


def _refuse_name(name: str) -> PathRefusal | None:
    """The path checks the local loader makes, on a name that will become part of a URL."""
    if not name or "\x00" in name:
        return PathRefusal(name, "empty or NUL-containing file name", "escapes")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", name):
        return PathRefusal(name, "absolute path in a checkpoint reference", "absolute")
    if ".." in re.split(r"[\\/]", name):
        return PathRefusal(name, "path climbs out of the checkpoint directory", "escapes")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


# ---- the local cache ----------------------------------------------------------------------------------
def _in_hf_cache(repo_id: str) -> bool:
    """Is `models--org--name` in the Hugging Face cache? (Found without huggingface_hub, by its layout.)"""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
        )
        cache = os.path.join(home, "hub")
    return os.path.isdir(os.path.join(cache, "models--" + repo_id.replace("/", "--")))


def cached_snapshot(target: HubTarget) -> Path | None:
    """The target's snapshot in the local Hugging Face cache, if one is there. Never downloads."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        if _in_hf_cache(target.repo_id):
            from weightcheck.deps import MissingDependency

            # Saying "no such file" would hide the real cause: the repo is cached, the hub extra is missing.
            feature = f"linting the cached Hub repo {target.repo_id!r}"
            raise MissingDependency(feature, ["huggingface-hub"], "hub") from None
        return None
    try:
        root = Path(
            snapshot_download(
                target.repo_id, revision=target.revision, local_files_only=True, cache_dir=_cache_dir()
            )
        )
    except Exception:  # not cached (LocalEntryNotFoundError), bad id, unreadable cache
        return None
    root = root / target.subfolder if target.subfolder else root
    return root if root.is_dir() else None


def snapshot_complete(root: Path) -> bool:
    """Every weight file the checkpoint names is in the cached snapshot (not just the `*.json` files)."""
    from weightcheck.checkpoint import _read_json

    index = root / INDEX_NAME
    if index.is_file():
        doc = _read_json(index.parent, index.name, json_limit(index.name))
        weight_map = doc.data.get("weight_map") if isinstance(doc.data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            return False
        shards = {v for v in weight_map.values() if isinstance(v, str)}
        return all((root / s).is_file() for s in shards)
    if (root / SINGLE_NAME).is_file():
        return True
    return any(SHARD_RE.match(p.name) for p in root.glob("*.safetensors"))


def download(target: HubTarget) -> Path:
    """`--download`: fetch the repo (weights included) into the Hugging Face cache; the local path."""
    from huggingface_hub import snapshot_download

    try:
        root = Path(
            snapshot_download(
                target.repo_id,
                revision=target.revision,
                cache_dir=_cache_dir(),
                endpoint=_endpoint(),
                token=_token(),
                allow_patterns=[f"{target.subfolder}/*"] if target.subfolder else None,
            )
        )
    except Exception as exc:
        raise HubError(f"{target.uri}: download failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return root / target.subfolder if target.subfolder else root


@dataclass
class Resolved:
    """What a target names: a local path, or a remote source read header-only."""

    path: Path | None = None
    source: HubSource | None = None
    note: str | None = None


def resolve(spec: str | os.PathLike[str], *, needs_data: bool, download_ok: bool, revision: str | None = None,
            what: str = "this command") -> Resolved:  # fmt: skip
    """Resolve a command's target. A local path is itself. A repo id: a complete snapshot in the local
    cache first (no network); else, when data is needed, a download if allowed (`--download`) or a
    refusal; else the repo read header-only over HTTP. Raises HubError with a user-facing message."""
    text = os.fspath(spec)
    target = parse_target(text, revision)
    if target is None:
        return Resolved(path=Path(text))
    if not re.match(r"^hf:/", text):
        # Not `hf://`: the spec was also a local candidate, and none exists. Every message says both were tried.
        try:
            return _resolve_repo(text, target, needs_data=needs_data, download_ok=download_ok, what=what)
        except HubError as exc:
            raise HubError(
                f"{text}: no such local file or directory, and as the Hub repo {target.uri}: "
                f"{str(exc).removeprefix(f'{text}: ').removeprefix(f'{target.uri}: ')}"
            ) from None
    return _resolve_repo(text, target, needs_data=needs_data, download_ok=download_ok, what=what)


def _resolve_repo(text: str, target: HubTarget, *, needs_data: bool, download_ok: bool, what: str) -> Resolved:
    """`resolve` for a spec that names a Hub repo."""
    cached = cached_snapshot(target)
    if cached is not None and snapshot_complete(cached):
        return Resolved(path=cached, note=f"{text}: using the cached snapshot {cached}")
    if needs_data:
        if not download_ok:
            raise HubError(
                f"{text}: {what} reads tensor data, and the repo is not fully in the local Hugging Face cache; "
                "pass --download to fetch it into the cache first (or `hf download` it)"
            )
        root = download(target)
        return Resolved(path=root, note=f"{text}: downloaded into the cache at {root}")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        if cached is not None:  # offline: a partial snapshot is all there is
            return Resolved(path=cached, note=f"{text}: HF_HUB_OFFLINE is set; using the partial cached snapshot")
        raise HubError(f"{text}: HF_HUB_OFFLINE is set and the repo is not in the local Hugging Face cache")
    source = HubSource(target)
    return Resolved(source=source, note=f"{text}: read header-only from {source.label}")


def apply_revision(target: Path, revision: str | None) -> Path:
    """`target` with `revision` applied when it is a Hub repo id naming no revision of its own (`--revision`
    on diff and verify, `revision=` in the API)."""
    if not revision or target.exists():
        return target
    hub = parse_target(str(target), revision)
    return Path(hub.uri) if hub is not None else target
