"""Hostile-input fuzzing: mutate real artefacts, run the CLI in a jail of instruments, check the contract.

The corpus is made by the real writers: transformers `save_pretrained` (a sharded Llama, a Qwen3-MoE), an
llm-compressor-style quantization config validated by compressed-tensors, tap records written by
`weightcheck.tap` while a small engine loads the checkpoint, and trainer manifest parts written by
`weightcheck.manifest.write_manifest`. Each case copies the corpus, applies one mutation, runs
`weightcheck lint|diff|verify|explain-ignore --format json` in a subprocess (tests/fuzz_child.py: an
address-space limit and an audit hook on every `open`) and checks the contract:

- exit code 0, 1 or 3 (never 2 = internal error), a JSON document on stdout, no traceback;
- finished within the time limit and the memory limit;
- nothing opened outside the target (honeypot files beside it, /etc/passwd, /proc/self/environ);
- nothing written: no open for writing (besides /dev/null and the child's private TMPDIR, which must be
  empty again afterwards) and the case directory is byte-for-byte unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck.safe_io import MAX_INDEX_ENTRIES
from weightcheck.safetensors_header import MAX_HEADER_TENSORS

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "fuzz_child.py"
ALLOWED_EXIT = {0, 1, 3}
# Address-space cap: torch's import maps ~1.5 GB of virtual memory on its own.
MEM_LIMIT = int(os.environ.get("WC_FUZZ_MEM", str(3 * 1024**3)))
# A hang is judged in CPU seconds (the child's RLIMIT_CPU); the wall-clock limit is only a backstop for a
# process blocked without using CPU (a FIFO opened for reading), generous because the machine may be loaded.
CPU_LIMIT_S = int(os.environ.get("WC_FUZZ_CPU", "60"))
TIMEOUT_S = float(os.environ.get("WC_FUZZ_TIMEOUT", "600"))
FORBIDDEN_SYSTEM = ["/etc/passwd", "/proc/self/environ"]
# The memory budget of docs/security.md: peak resident memory of one command on the corpus, whatever the
# mutation (counts in the input are capped before they cost memory). torch's import is ~250 MB of it.
RSS_BUDGET = int(os.environ.get("WC_FUZZ_RSS", str(512 * 1024**2)))
# ... plus this much per tensor name a mutation adds that weightcheck really holds (below its caps): memory
# may grow with the real content, never with a count it refuses.
RSS_PER_NAME = 4 * 1024

FAMILIES = (
    "header-bytes",
    "header-json",
    "tensor-names",
    "index-json",
    "config-json",
    "quant-config",
    "filesystem",
    "records",
    "manifests",
    "json-keys",
    "unencodable-names",
    "counts",
    "record-counts",
    "record-lines",
)
COUNTS: Counter[str] = Counter()
CPU_SECONDS: Counter[str] = Counter()
PEAK_RSS: Counter[str] = Counter()  # the largest peak RSS (bytes) of any case, per family


# ---- corpus ------------------------------------------------------------------------------------------------


def build_corpus(dest: Path) -> Path:
    """ckpt/ (Llama, sharded), moe/ (Qwen3-MoE, quantization_config), records/, manifest/ — real writers."""
    import torch
    from conftest import build_llama, build_qwen3_moe

    from weightcheck import tap
    from weightcheck.manifest import write_manifest

    dest.mkdir(parents=True, exist_ok=True)
    ckpt = build_llama(dest / "ckpt")
    moe = build_qwen3_moe(dest / "moe")
    _add_quant_config(moe)
    stream = _read_stream(ckpt)

    class Engine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 4})()
            self._keys = {}
            for name, tensor in stream:
                key = name.replace(".", "__")
                self._keys[name] = key
                self.register_parameter(key, torch.nn.Parameter(torch.zeros_like(tensor), requires_grad=False))

        def named_parameters(self, *a: Any, **k: Any):  # type: ignore[override]
            for name, key in self._keys.items():
                yield name, getattr(self, key)

        def load_weights(self, weights: Any) -> None:
            params = dict(self.named_parameters())
            for name, tensor in weights:
                if name in params:
                    params[name].data.copy_(tensor)

    records = dest / "records"
    tap.configure(records, digest_threads=1, keep_tensors=True)
    tap.install(Engine)
    try:
        tap.set_engine_hooks(tap.EngineHooks(rank_info=lambda: {"tp_rank": 0, "tp_size": 1, "pp_rank": 0}))
        with tap.sync("step-1", source="fuzz"):
            Engine().load_weights(iter(stream))
    finally:
        tap.uninstall(Engine)
        tap.configure(None)
        tap.set_engine_hooks(tap.EngineHooks())
    half = len(stream) // 2
    (dest / "manifest").mkdir()
    write_manifest(dest / "manifest" / "part-0.json", stream[:half], pp_rank=0)
    write_manifest(dest / "manifest" / "part-1.json", stream[half:], pp_rank=1)
    return dest


def _read_stream(path: Path) -> list[tuple[str, Any]]:
    from safetensors import safe_open

    out = []
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as fh:
            out.extend((key, fh.get_tensor(key)) for key in fh.keys())
    return out


def _add_quant_config(path: Path) -> None:
    """A compressed-tensors quantization_config as llm-compressor writes it, built by CT's own model."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, preset_name_to_scheme

    scheme: QuantizationScheme = preset_name_to_scheme("W4A16", ["Linear"])
    qcfg = QuantizationConfig(
        config_groups={"group_0": scheme}, ignore=["lm_head", "re:.*mlp.gate$"], quant_method="compressed-tensors"
    )
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = qcfg.model_dump(mode="json", exclude_none=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


# ---- hostile values ------------------------------------------------------------------------------------------


class Raw(str):
    """JSON text written verbatim (numbers json.dumps cannot spell: 1e400, 5000-digit integers)."""


HOSTILE_VALUES: list[Any] = [
    0, -1, 1, 2, 5, 7, 1000, 10**6, 10**9, 10**12, 10**18, 2**63, 2**64 + 1, -(10**12),
    Raw("1e400"), Raw("-1e400"), Raw("1" + "0" * 5000), Raw("-" + "9" * 400), 1.5, -0.0, Raw("NaN"),
    "a", "", "10", "\u0663", "1e9", "x" * 10000, None, True, False, [], {}, [1, 2], [5, "a"],
    [10**12], {"a": 1}, ["re:(.+)+!"], "re:(.+)+!", "*" * 5000,
]  # fmt: skip
HUGE_DIGITS = "7" * 5000


def dumps(doc: Any) -> str:
    raws: dict[str, str] = {}

    def enc(obj: Any) -> Any:
        if isinstance(obj, Raw):
            key = f"__raw_{len(raws)}__"
            raws[key] = str(obj)
            return key
        if isinstance(obj, dict):
            return {enc(k) if isinstance(k, Raw) else k: enc(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [enc(v) for v in obj]
        return obj

    text = json.dumps(enc(doc), allow_nan=True)
    for key, raw in raws.items():
        text = text.replace(f'"{key}"', raw)
    return text


def paths_of(doc: Any, prefix: tuple = (), limit: int = 4000) -> list[tuple]:
    """Every key path in a JSON document (capped), so a mutation can land anywhere."""
    out: list[tuple] = []
    stack = [(prefix, doc)]
    while stack and len(out) < limit:
        path, node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((*path, k))
                stack.append(((*path, k), v))
        elif isinstance(node, list):
            for i, v in enumerate(node[:50]):
                out.append((*path, i))
                stack.append(((*path, i), v))
    return out


def set_path(doc: Any, path: tuple, value: Any) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


# ---- a case ----------------------------------------------------------------------------------------------------


@dataclass
class Case:
    root: Path  # the case directory: target trees + honeypot
    family: str
    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Set by a mutation whose input is invalid by construction: the report must hold a finding with one of
    # these codes (a silent pass, or a silently truncated "clean" check, is a violation).
    expect: frozenset[str] = frozenset()
    # Tensor names (header or index entries) the mutation added, as far as weightcheck reads them (its caps):
    # each raises the memory budget by RSS_PER_NAME.
    extra_names: int = 0

    @property
    def rss_budget(self) -> int:
        return RSS_BUDGET + RSS_PER_NAME * self.extra_names

    @property
    def honeypot(self) -> Path:
        return self.root / "honeypot"


def new_case(corpus: Path, work: Path, family: str, parts: tuple[str, ...]) -> Case:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for part in parts:
        shutil.copytree(corpus / part, work / part, symlinks=True)
    pot = work / "honeypot"
    pot.mkdir()
    # Valid-looking files of every kind, so that following a link to them would really be "read".
    shutil.copy(corpus / "ckpt" / "config.json", pot / "config.json")
    shutil.copy(next((corpus / "ckpt").glob("*.safetensors")), pot / "secret.safetensors")
    shutil.copy(next((corpus / "records").rglob("*.jsonl")), pot / "secret.jsonl")
    shutil.copy(corpus / "manifest" / "part-0.json", pot / "secret.json")
    (pot / "sync-00000").mkdir()
    shutil.copy(next((corpus / "records").rglob("*.jsonl")), pot / "sync-00000" / "secret.jsonl")
    return Case(root=work, family=family)


def snapshot(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "special"
    return out


@dataclass
class Outcome:
    rc: int | None
    seconds: float
    cpu_seconds: float
    stdout: str
    stderr: str
    violations: list[str]
    peak_rss: int = 0  # bytes, from the child's own getrusage at exit (0 when it was killed)


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


def run_case(case: Case, timeout: float = TIMEOUT_S, mem: int = MEM_LIMIT, cpu: int = CPU_LIMIT_S) -> Outcome:
    audit = case.root.parent / f"{case.root.name}.audit"
    audit.unlink(missing_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix="wcfuzz-tmp-"))
    before = snapshot(case.root)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(tmpdir),
        "NO_COLOR": "1",
        "HF_HUB_OFFLINE": "1",
    }
    forbidden = [str(case.honeypot), *FORBIDDEN_SYSTEM]
    cmd = [sys.executable, str(CHILD), str(audit), str(mem), str(cpu), json.dumps(forbidden), "--", *case.argv]
    started = time.monotonic()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    violations: list[str] = []
    try:
        proc = subprocess.run(
            cmd, cwd=case.root, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        rc, out, err = proc.returncode, _text(proc.stdout), _text(proc.stderr)
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, _text(exc.stdout), _text(exc.stderr)
        violations.append(f"hang: no exit within {timeout:.0f} s")
    seconds = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (usage.ru_utime + usage.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    if rc is not None and rc in (-signal.SIGXCPU, -signal.SIGKILL):
        violations.append(f"hang: killed after {cpu_seconds:.0f} CPU seconds (limit {cpu})")
    elif rc is not None and rc not in ALLOWED_EXIT:
        violations.append(f"exit code {rc} (allowed: {sorted(ALLOWED_EXIT)})")
    if "Traceback (most recent call last)" in err or "internal error" in err:
        violations.append("traceback/internal error on stderr: " + err.strip().splitlines()[-1][:300])
    if "MemoryError" in err:
        violations.append("memory blow-up (MemoryError under the address-space limit)")
    if rc is not None and rc in ALLOWED_EXIT:
        try:
            doc = json.loads(out)
            report = case.argv[0] in ("lint", "diff", "verify")  # explain-ignore prints its own JSON shape
            if not isinstance(doc, dict) or (report and ("findings" not in doc or "schema_version" not in doc)):
                violations.append("stdout is JSON but not a weightcheck report")
            codes = {f.get("code") for f in doc.get("findings", []) if isinstance(f, dict)}
            if case.expect and not codes & case.expect:
                violations.append(
                    f"silent pass: rc={rc}, no {'/'.join(sorted(case.expect))} finding (codes: {sorted(codes)})"
                )
        except ValueError:
            violations.append(f"stdout is not JSON: {out[:200]!r}")
    log = audit.read_text() if audit.exists() else ""
    peak_rss = 0
    for line in sorted(set(log.splitlines())):
        kind, _, path = line.partition(" ")
        if kind == "MAXRSS":
            peak_rss = max(peak_rss, int(path) * 1024)  # Linux reports kilobytes
        elif kind == "OUTSIDE":
            violations.append(f"opened outside the target: {path}")
        elif kind == "WRITE" and path != "/dev/null" and not path.startswith(str(tmpdir)):
            violations.append(f"opened for writing: {path}")
    # torch creates an empty inductor cache folder on import; only files count as writes.
    leftovers = [p for p in tmpdir.rglob("*") if not p.is_dir()]
    if leftovers:
        violations.append(f"left files in TMPDIR: {[p.name for p in leftovers][:5]}")
    shutil.rmtree(tmpdir, ignore_errors=True)
    after = snapshot(case.root)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        violations.append(f"case directory changed: {changed[:5]}")
    if rc is not None and rc in ALLOWED_EXIT and not peak_rss:
        violations.append("no MAXRSS line from the child: memory was not measured")
    if peak_rss > case.rss_budget:
        violations.append(f"memory: peak RSS {peak_rss >> 20} MiB over the {case.rss_budget >> 20} MiB budget")
    audit.unlink(missing_ok=True)
    return Outcome(rc, seconds, cpu_seconds, out, err, violations, peak_rss)


# ---- mutations ----------------------------------------------------------------------------------------------------
# Each takes `draw` (hypothesis `data.draw`) and a Case whose trees are fresh copies, mutates them, sets argv.

Draw = Callable[..., Any]


def _st():
    from hypothesis import strategies as st

    return st


def _pick(draw: Draw, seq: list[Any] | tuple[Any, ...], label: str = "") -> Any:
    return draw(_st().sampled_from(list(seq)), label=label) if label else draw(_st().sampled_from(list(seq)))


def hostile_value(draw: Draw) -> Any:
    st = _st()
    return draw(
        st.one_of(
            st.sampled_from(HOSTILE_VALUES),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.text(max_size=20),
            st.lists(st.integers(min_value=-5, max_value=10**13), max_size=4),
        ),
        label="value",
    )


def read_shard(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_shard(path: Path, header_text: str, data: bytes) -> None:
    blob = header_text.encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _shards(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


def _target_command(draw: Draw, case: Case, tree: str) -> None:
    """lint the mutated tree, or diff it against the pristine copy (either side), or explain-ignore it."""
    how = _pick(draw, ["lint", "lint", "lint-content", "diff", "diff-rev", "explain-ignore"], "command")
    if how == "lint":
        case.argv = ["lint", tree, "--format", "json"]
    elif how == "lint-content":
        case.argv = ["lint", tree, "--content", "--format", "json"]
    elif how == "explain-ignore":
        case.argv = ["explain-ignore", tree, "--format", "json"]
    else:
        pristine = f"{tree}-pristine"  # copied by fuzz_one before the mutation
        a, b = (pristine, tree) if how == "diff" else (tree, pristine)
        case.argv = ["diff", a, b, "--format", "json"]
    case.notes.append(" ".join(case.argv))


def mut_header_bytes(draw: Draw, case: Case, tree: str) -> None:
    st = _st()
    shard = _pick(draw, _shards(case.root / tree), "shard")
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    kind = _pick(draw, ["length", "flip", "splice", "truncate", "extend"], "kind")
    if kind == "length":
        value = draw(st.sampled_from([0, 1, 7, n - 1, n + 1, 2**63, 2**64 - 1, 100_000_001, len(raw)]), label="len")
        raw[:8] = struct.pack("<Q", value % 2**64)
    elif kind == "flip":
        for _ in range(draw(st.integers(1, 16), label="flips")):
            pos = draw(st.integers(0, 8 + n - 1), label="pos")
            raw[pos] = draw(st.integers(0, 255), label="byte")
    elif kind == "splice":
        pos = draw(st.integers(8, 8 + n - 1), label="pos")
        chunk = draw(st.sampled_from([b"{", b"}", b"[", b'"', b"\\", b"\xff\xfe", b"\x00", b"[" * 3000]), label="chunk")
        raw[pos:pos] = chunk
        raw[:8] = struct.pack("<Q", n + len(chunk))
    elif kind == "truncate":
        del raw[draw(st.integers(0, len(raw) - 1), label="cut") :]
    else:
        raw += b"\x00" * draw(st.integers(1, 4096), label="extra")
    shard.write_bytes(bytes(raw))
    case.notes.append(f"{kind} {shard.name}")


def mut_header_json(draw: Draw, case: Case, tree: str) -> None:
    shard = _pick(draw, _shards(case.root / tree), "shard")
    header, data = read_shard(shard)
    kind = _pick(draw, ["field", "metadata", "duplicate", "deep", "many"], "kind")
    if kind == "field":
        path = _pick(draw, paths_of(header), "path")
        set_path(header, path, hostile_value(draw))
        text = dumps(header)
    elif kind == "metadata":
        header["__metadata__"] = hostile_value(draw)
        text = dumps(header)
    elif kind == "duplicate":
        name = next(k for k in header if k != "__metadata__")
        text = dumps(header)[:-1] + f', "{name}": ' + json.dumps(header[name]) + "}"
    elif kind == "deep":
        text = dumps(header)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    else:  # many tiny entries: a header that claims lots of tensors cheaply
        count = _pick(draw, [5_000, 50_000], "count")
        case.extra_names = count
        extra = {f"model.layers.{i}.mlp.experts.{i}.w.weight": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                 for i in range(count)}  # fmt: skip
        text = dumps({**header, **extra})
    write_shard(shard, text, data)
    case.notes.append(f"{kind} {shard.name}")


def mut_tensor_names(draw: Draw, case: Case, tree: str) -> None:
    st = _st()
    shard = _pick(draw, _shards(case.root / tree), "shard")
    header, data = read_shard(shard)
    names = [k for k in header if k != "__metadata__"]
    victim = _pick(draw, names, "victim")
    digits = _pick(draw, [HUGE_DIGITS, "9" * 30, "\u0663", "-1", "01", "1" * 4301], "digits")
    new = _pick(draw, [
        re.sub(r"layers\.\d+", f"layers.{digits}", victim),
        f"model.layers.0.mlp.experts.{digits}.gate_proj.weight",
        f"model.layers.{digits}.mlp.experts.{digits}.down_proj.weight",
        victim + "." * draw(st.integers(0, 3)),
        "",
        "x" * 100_000,
    ], "new")  # fmt: skip
    header[new] = header.pop(victim)
    write_shard(shard, dumps(header), data)
    index = case.root / tree / "model.safetensors.index.json"
    if index.exists() and draw(st.booleans(), label="index-too"):
        doc = json.loads(index.read_text())
        doc["weight_map"][new] = doc["weight_map"].pop(victim, shard.name)
        index.write_text(dumps(doc))
    case.notes.append(f"{victim} -> {new[:60]}")


def mut_index_json(draw: Draw, case: Case, tree: str) -> None:
    st = _st()
    index = case.root / tree / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    kind = _pick(draw, ["field", "total_size", "ghosts", "shard-names", "escape", "dir-symlink", "weight_map"], "kind")
    if kind == "field":
        set_path(doc, _pick(draw, paths_of(doc), "path"), hostile_value(draw))
    elif kind == "total_size":
        doc.setdefault("metadata", {})["total_size"] = hostile_value(draw)
    elif kind == "ghosts":
        count = _pick(draw, [1000, 100_000, 1_000_000], "count")
        case.extra_names = min(count, MAX_INDEX_ENTRIES)
        shard = next(iter(doc["weight_map"].values()))
        doc["weight_map"].update({f"model.layers.{i}.mlp.experts.{i}.up_proj.weight": shard for i in range(count)})
    elif kind == "shard-names":
        count = _pick(draw, [1000, 100_000], "count")
        case.extra_names = count
        doc["weight_map"].update({f"ghost.{i}.weight": f"model-{i:05d}-of-99999.safetensors" for i in range(count)})
    elif kind == "escape":
        name = next(iter(doc["weight_map"]))
        doc["weight_map"][name] = _pick(draw, [
            "../honeypot/secret.safetensors", "/etc/passwd", str(case.honeypot / "secret.safetensors"),
            "./../honeypot/secret.safetensors", "..\\honeypot\\secret.safetensors", "\x00", "",
            "sub/../../honeypot/secret.safetensors",
        ], "target")  # fmt: skip
    elif kind == "dir-symlink":
        (case.root / tree / "sub").symlink_to("../honeypot", target_is_directory=True)
        name = next(iter(doc["weight_map"]))
        doc["weight_map"][name] = "sub/secret.safetensors"
        if draw(st.booleans(), label="negative-total"):
            doc.setdefault("metadata", {})["total_size"] = -1
    else:
        doc["weight_map"] = hostile_value(draw)
    index.write_text(dumps(doc))
    case.notes.append(kind)


CONFIG_KEYS = [
    "num_hidden_layers", "num_experts", "n_routed_experts", "num_local_experts", "moe_intermediate_size",
    "mlp_only_layers", "decoder_sparse_step", "first_k_dense_replace", "moe_layer_freq", "head_dim",
    "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size", "vocab_size",
    "tie_word_embeddings", "num_nextn_predict_layers", "architectures", "model_type", "text_config",
    "torch_dtype", "dtype", "n_shared_experts", "shared_expert_intermediate_size", "layer_types",
    "quantization_config", "max_position_embeddings", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "kv_lora_rank", "q_lora_rank", "num_experts_per_tok",
]  # fmt: skip


def mut_config_json(draw: Draw, case: Case, tree: str) -> None:
    st = _st()
    path = case.root / tree / _pick(draw, ["config.json", "config.json", "generation_config.json"], "file")
    doc = json.loads(path.read_text()) if path.exists() else {}
    for _ in range(draw(st.integers(1, 4), label="edits")):
        how = _pick(draw, ["known", "existing", "combo"], "how")
        if how == "known" or not doc:
            doc[_pick(draw, CONFIG_KEYS, "key")] = hostile_value(draw)
        elif how == "existing":
            set_path(doc, _pick(draw, paths_of(doc), "path"), hostile_value(draw))
        else:  # each count "plausible", the product not
            doc.update(num_hidden_layers=1000, num_experts=1000, n_routed_experts=1000, num_local_experts=1000)
    if draw(st.booleans(), label="as-text"):
        path.write_text(dumps(doc))
    else:
        path.write_text(_pick(draw, ["", "{", "[]", "null", "1e400", '"x"', "[" * 100_000, "\ufeff{}"], "text"))
    case.notes.append(path.name)


QUANT_KEYS = ["ignore", "targets", "exclude_modules", "modules_to_not_convert", "block_structure",
              "weight_block_size", "quant_method", "config_groups", "format", "kv_cache_scheme", "group_size",
              "bits", "num_bits", "strategy", "quant_algo"]  # fmt: skip
EVIL_ENTRIES = [
    "re:(.+)+!", "re:(a|aa)+$", "re:(.*)*x", "re:a{99999999999}", "re:(", "re:" + "(a*)*" * 20, "*" * 5000,
    "model.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*x", "re:.*mlp\\.gate$", "lm_head", "",
    "re:" + "a" * 100_000, "re:(?=a)", "re:\\1", "re:[", "re:(?i)MLP.GATE", "re:\\d+\u0663",
    "re:" + "(x+x+)+y", "re:(?P<a>.)(?P=a)", 5, None, ["nested"], {"a": 1},
]  # fmt: skip


def mut_quant_config(draw: Draw, case: Case, tree: str) -> None:
    st = _st()
    path = case.root / tree / "config.json"
    doc = json.loads(path.read_text())
    qc = doc.setdefault("quantization_config", {})
    kind = _pick(draw, ["ignore", "field", "method", "hf_quant_config", "existing"], "kind")
    if kind == "ignore":
        key = _pick(draw, ["ignore", "exclude_modules", "modules_to_not_convert"], "key")
        entries = draw(st.lists(st.sampled_from(EVIL_ENTRIES), min_size=1, max_size=5), label="entries")
        qc[key] = entries if draw(st.booleans(), label="as-list") else entries[0]
    elif kind == "field":
        qc[_pick(draw, QUANT_KEYS, "key")] = draw(st.one_of(st.sampled_from(EVIL_ENTRIES), st.just(None)).flatmap(
            lambda e: st.sampled_from([e, hostile_value(draw)])), label="v")  # fmt: skip
    elif kind == "method":
        qc["quant_method"] = _pick(draw, ["fp8", "modelopt", "awq", "gptq", "bitsandbytes", "compressed-tensors",
                                          "mxfp4", "nope", 5], "method")  # fmt: skip
        qc[_pick(draw, QUANT_KEYS, "key")] = _pick(draw, EVIL_ENTRIES + HOSTILE_VALUES, "v")
        if qc["quant_method"] == "fp8":
            qc["weight_block_size"] = _pick(draw, [[128, 128], ["\u0663", 1], [0, 0], [-1], 5, [10**30, 1]], "bs")
    elif kind == "hf_quant_config":
        (case.root / tree / "hf_quant_config.json").write_text(dumps({
            "producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "FP8", "exclude_modules": draw(
                st.lists(st.sampled_from(EVIL_ENTRIES), min_size=1, max_size=4), label="excl")},
        }))  # fmt: skip
    else:
        paths = paths_of(qc)
        if paths:
            set_path(qc, _pick(draw, paths, "path"), _pick(draw, EVIL_ENTRIES + HOSTILE_VALUES, "v"))
    path.write_text(dumps(doc))
    case.notes.append(kind)


def _replace_with(draw: Draw, case: Case, victim: Path) -> str:
    """Turn `victim` into a symlink (honeypot, system file, loop, dangling), a FIFO or a directory."""
    kind = _pick(draw, ["honeypot", "passwd", "environ", "loop", "self-loop", "fifo", "dir", "dangling",
                        "honeypot-relative"], "fs-kind")  # fmt: skip
    is_dir = victim.is_dir() and not victim.is_symlink()
    if is_dir:
        shutil.rmtree(victim)
    elif os.path.lexists(victim):
        victim.unlink()
    pot_file = case.honeypot / (
        "sync-00000" if is_dir else {".safetensors": "secret.safetensors", ".jsonl": "secret.jsonl"}.get(
            victim.suffix, "secret.json" if victim.name != "config.json" else "config.json"))  # fmt: skip
    if kind == "honeypot":
        victim.symlink_to(pot_file)
    elif kind == "honeypot-relative":
        victim.symlink_to(os.path.relpath(pot_file, victim.parent))
    elif kind == "passwd":
        victim.symlink_to("/etc/passwd")
    elif kind == "environ":
        victim.symlink_to("/proc/self/environ")
    elif kind == "loop":
        other = victim.parent / (victim.name + ".loop")
        victim.symlink_to(other.name)
        other.symlink_to(victim.name)
    elif kind == "self-loop":
        victim.symlink_to(victim.name)
    elif kind == "fifo":
        os.mkfifo(victim)
    elif kind == "dir":
        victim.mkdir()
    else:
        victim.symlink_to("does-not-exist")
    return kind


def mut_filesystem(draw: Draw, case: Case, tree: str) -> None:
    base = case.root / tree
    candidates = [base / "config.json", base / "model.safetensors.index.json", base / "generation_config.json",
                  base / "hf_quant_config.json", base / "pyproject.toml", *_shards(base),
                  base / "extra.safetensors"]  # fmt: skip
    victim = _pick(draw, candidates, "victim")
    kind = _replace_with(draw, case, victim)
    case.notes.append(f"{victim.name} -> {kind}")


def mut_records(draw: Draw, case: Case, _tree: str) -> None:
    st = _st()
    records = case.root / "records"
    files = sorted(records.rglob("*.jsonl"))
    kind = _pick(draw, ["line", "line", "names", "fs-record", "fs-sync", "tensors-file", "truncate", "garbage"],
                 "kind")  # fmt: skip
    target = _pick(draw, files, "file")
    if kind in ("line", "names"):
        lines = target.read_text().splitlines()
        i = draw(st.integers(0, len(lines) - 1), label="line")
        doc = json.loads(lines[i])
        if kind == "line":
            keys = [p for p in paths_of(doc)] + [("tp_size",), ("experts_local",), ("tp_rank",), ("pp_size",),
                                                 ("ep_size",), ("experts_written",), ("shape",)]  # fmt: skip
            set_path(doc, _pick(draw, keys, "path"), hostile_value(draw))
        else:
            name = doc.get("name") if isinstance(doc.get("name"), str) else "model.layers.0.mlp.gate_proj.weight"
            doc["name"] = _pick(draw, [re.sub(r"layers\.\d+", f"layers.{HUGE_DIGITS}", name),
                                       f"model.layers.0.mlp.experts.{HUGE_DIGITS}.up_proj.weight",
                                       "model.layers.\u0663.mlp.up_proj.weight", "x" * 100_000], "name")  # fmt: skip
        lines[i] = dumps(doc)
        target.write_text("\n".join(lines) + "\n")
    elif kind == "fs-record":
        _replace_with(draw, case, target)
    elif kind == "fs-sync":
        _replace_with(draw, case, target.parent)
    elif kind == "tensors-file":
        kept = [p for p in target.parent.iterdir() if p.suffix == ".safetensors"]
        if kept:
            _replace_with(draw, case, _pick(draw, kept, "kept"))
        else:
            _replace_with(draw, case, target)
    elif kind == "truncate":
        raw = target.read_bytes()
        target.write_bytes(raw[: draw(st.integers(0, len(raw)), label="cut")])
    else:
        target.write_bytes(_pick(draw, [b"\xff\xfe", b"{}\n" * 10, b"[" * 100_000, b"\n" * 10**6, b"null"], "g"))
    case.notes.append(f"{kind} {target.name}")
    against = _pick(draw, ["ckpt", "manifest", None], "against")
    case.argv = ["verify", "records", "--format", "json"] + (["--against", against] if against else [])


def mut_manifests(draw: Draw, case: Case, _tree: str) -> None:
    st = _st()
    parts = sorted((case.root / "manifest").glob("*.json"))
    kind = _pick(draw, ["field", "trainer", "names", "fs-part", "fs-folder", "fifo-against"], "kind")
    target = _pick(draw, parts, "part")
    against = "manifest"
    if kind in ("field", "trainer", "names"):
        doc = json.loads(target.read_text())
        if kind == "field":
            set_path(doc, _pick(draw, paths_of(doc), "path"), hostile_value(draw))
        elif kind == "trainer":
            key = _pick(draw, ["num_layers", "pp_size", "pp_rank", "ep_size", "ep_rank", "vp_size", "num_experts",
                               "first_stage_layers", "last_stage_layers", "layout", "tp_size"], "key")  # fmt: skip
            doc.setdefault("trainer", {})[key] = hostile_value(draw) if draw(st.booleans()) else 10**12
        else:
            tensors = doc["tensors"]
            name = _pick(draw, sorted(tensors), "name")
            tensors[re.sub(r"layers\.\d+", f"layers.{_pick(draw, [HUGE_DIGITS, '1' * 4301], 'd')}", name)] = (
                tensors.pop(name))
        target.write_text(dumps(doc))
    elif kind == "fs-part":
        _replace_with(draw, case, target)
    elif kind == "fs-folder":
        _replace_with(draw, case, case.root / "manifest")
    else:
        os.mkfifo(case.root / "pipe.json")
        against = "pipe.json"
    if draw(st.booleans(), label="single-part") and kind not in ("fs-folder", "fifo-against"):
        against = f"manifest/{target.name}"
    case.notes.append(f"{kind} {target.name}")
    case.argv = ["verify", "records", "--against", against, "--format", "json"]


# ---- families that found issue #19: duplicate keys, unencodable names, counts, record files and lines -------


def _splice_key(text: str, key: str, value_json: str) -> str:
    """`text` (a JSON object) with one more `"key": value` pair at its end: a duplicate when key exists."""
    return text.rstrip()[:-1] + f", {json.dumps(key)}: {value_json}}}"


def mut_json_keys(draw: Draw, case: Case, tree: str) -> None:
    """A key written twice, anywhere in a header or an index: a dict keeps the last one silently, the
    safetensors (serde) reader refuses the file. Every case must be a finding."""
    base = case.root / tree
    where = _pick(draw, ["metadata", "tensor", "entry-field", "metadata-field", "index-top", "index-entry"], "where")
    if where.startswith("index"):
        index = base / "model.safetensors.index.json"
        doc = json.loads(index.read_text())
        if where == "index-top":
            text = _splice_key(dumps(doc), "weight_map", dumps(doc["weight_map"]))
        else:
            name, shard = next(iter(doc["weight_map"].items()))
            wm = _splice_key(dumps(doc["weight_map"]), name, json.dumps(shard))
            text = dumps({**doc, "weight_map": "__WM__"}).replace('"__WM__"', wm)
        index.write_text(text)
        case.expect = frozenset({"WC207"})
    else:
        shard = _pick(draw, _shards(base), "shard")
        header, data = read_shard(shard)
        header.setdefault("__metadata__", {"format": "pt"})
        text = dumps(header)
        if where == "metadata":  # the same __metadata__ twice (same or other content)
            meta = _pick(draw, [header["__metadata__"], {"format": "pt", "x": "y"}, {}], "meta")
            text = _splice_key(text, "__metadata__", json.dumps(meta))
        elif where == "tensor":
            name = _pick(draw, [k for k in header if k != "__metadata__"], "name")
            text = _splice_key(text, name, json.dumps(header[name]))
        elif where == "entry-field":  # {"dtype": "F32", ..., "dtype": "F32"} inside one entry
            name = _pick(draw, [k for k in header if k != "__metadata__"], "name")
            field_ = _pick(draw, ["dtype", "shape", "data_offsets"], "field")
            entry = _splice_key(json.dumps(header[name]), field_, json.dumps(header[name][field_]))
            text = text.replace(f"{json.dumps(name)}: {json.dumps(header[name])}", f"{json.dumps(name)}: {entry}")
        else:
            meta = _splice_key(json.dumps(header["__metadata__"]), "format", '"pt"')
            text = text.replace(json.dumps(header["__metadata__"]), meta, 1)
        write_shard(shard, text, data)
        case.expect = frozenset({"WC102"})
    case.argv = ["lint", tree, "--format", "json"]
    case.notes.append(where)


SURROGATES = ["\\ud800", "\\udfff", "model.layers.0.\\udc80.weight", "\\ud83d", "x\\ud800y"]


def mut_unencodable_names(draw: Draw, case: Case, tree: str) -> None:
    """A name spelled with a lone UTF-16 surrogate escape (valid JSON text, but no UTF-8 string): in a
    header, an index, a record or a manifest. Each must be a finding, never an encoding traceback."""
    where = _pick(draw, ["header", "index-key", "index-value", "record", "manifest", "shard-file", "record-file"],
                  "where")  # fmt: skip
    bad = _pick(draw, SURROGATES, "name")
    if where in ("shard-file", "record-file"):  # a file name that is not UTF-8 (os.listdir: lone surrogates)
        victim = (_pick(draw, _shards(case.root / tree), "shard") if where == "shard-file"
                  else next((case.root / "records").rglob("*.jsonl")))  # fmt: skip
        raw = os.fsencode(victim.name)
        new = _pick(draw, [b"\xff" + raw, raw.replace(b"model", b"mod\xe9l"), b"\xed\xa0\x80" + raw], "bytes")
        os.rename(os.fsencode(victim), os.fsencode(victim.parent) + b"/" + new)
        # A renamed shard leaves index entries without a file (WC201) and a file outside the index (WC105).
        case.expect = frozenset({"WC105", "WC201"}) if where == "shard-file" else frozenset()
        case.argv = ["lint", tree, "--format", "json"] if where == "shard-file" else ["verify", "records", "--format",
                                                                                    "json"]  # fmt: skip
    elif where == "header":
        shard = _pick(draw, _shards(case.root / tree), "shard")
        header, data = read_shard(shard)
        victim = _pick(draw, [k for k in header if k != "__metadata__"], "victim")
        text = dumps(header).replace(json.dumps(victim), f'"{bad}"', 1)
        write_shard(shard, text, data)
        case.expect = frozenset({"WC102"})
        case.argv = ["lint", tree, "--format", "json"]
    elif where.startswith("index"):
        index = case.root / tree / "model.safetensors.index.json"
        text = index.read_text()
        doc = json.loads(text)
        name, shard = next(iter(doc["weight_map"].items()))
        old = json.dumps(name) if where == "index-key" else json.dumps(shard)
        index.write_text(text.replace(old, f'"{bad}"', 1))
        case.expect = frozenset({"WC207"})
        case.argv = ["lint", tree, "--format", "json"]
    elif where == "record":
        target = next((case.root / "records").rglob("*.jsonl"))
        lines = target.read_text().splitlines()
        i = next(k for k, line in enumerate(lines) if '"t":"tensor"' in line)
        doc = json.loads(lines[i])
        lines[i] = lines[i].replace(json.dumps(doc["name"]), f'"{bad}"', 1)
        target.write_text("\n".join(lines) + "\n")
        case.expect = frozenset({"WC720"})
        case.argv = ["verify", "records", "--format", "json"]
    else:
        part = _pick(draw, sorted((case.root / "manifest").glob("*.json")), "part")
        doc = json.loads(part.read_text())
        name = next(iter(doc["tensors"]))
        part.write_text(part.read_text().replace(json.dumps(name), f'"{bad}"', 1))
        case.expect = frozenset({"WC721"})
        case.argv = ["verify", "records", "--against", "manifest", "--format", "json"]
    case.notes.append(f"{where} {bad}")


def mut_counts(draw: Draw, case: Case, tree: str) -> None:
    """Counts and lengths that cost memory or time in proportion: index entries, header entries, one very
    long tensor name (in the header, the index, or both). Memory must stay within the budget."""
    st = _st()
    base = case.root / tree
    kind = _pick(draw, ["index-entries", "long-name", "header-entries"], "kind")
    index = base / "model.safetensors.index.json"
    if kind == "index-entries":
        count = _pick(draw, [200_000, 500_000, 1_000_000, 3_000_000], "count")
        case.extra_names = min(count, MAX_INDEX_ENTRIES)
        doc = json.loads(index.read_text())
        shard = next(iter(doc["weight_map"].values()))
        doc["weight_map"].update({f"model.layers.{i}.mlp.experts.{i}.up_proj.weight": shard for i in range(count)})
        index.write_text(json.dumps(doc))
        case.expect = frozenset({"WC202", "WC207"})  # ghost entries, or the entry cap
    elif kind == "long-name":
        length = _pick(draw, [5_000, 100_000, 1_000_000, 10_000_000], "length")
        shard = _pick(draw, _shards(base), "shard")
        header, data = read_shard(shard)
        victim = _pick(draw, [k for k in header if k != "__metadata__"], "victim")
        new = "model.layers.0." + "a" * length + ".weight"
        header[new] = header.pop(victim)
        write_shard(shard, json.dumps(header), data)
        if draw(st.booleans(), label="index-too"):
            doc = json.loads(index.read_text())
            doc["weight_map"][new] = doc["weight_map"].pop(victim, shard.name)
            index.write_text(json.dumps(doc))
        case.expect = frozenset({"WC102"})
    else:
        count = _pick(draw, [100_000, 400_000], "count")  # under and over the per-header cap
        case.extra_names = min(count, MAX_HEADER_TENSORS)
        shard = _pick(draw, _shards(base), "shard")
        header, data = read_shard(shard)
        header.update({f"model.layers.{i}.mlp.experts.{i}.w.weight": {"dtype": "F32", "shape": [0],
                       "data_offsets": [0, 0]} for i in range(count)})  # fmt: skip
        write_shard(shard, json.dumps(header), data)
        case.expect = frozenset({"WC102", "WC203"})  # the cap, or names missing from the index
    how = _pick(draw, ["lint", "lint", "lint-content", "explain-ignore"], "command")
    case.argv = {"lint": ["lint", tree], "lint-content": ["lint", tree, "--content"],
                 "explain-ignore": ["explain-ignore", tree]}[how] + ["--format", "json"]  # fmt: skip
    if how == "explain-ignore":
        case.expect = frozenset()  # explain-ignore reports patterns, not checkpoint findings
    case.notes.append(f"{kind} {' '.join(case.argv)}")


def _copy_sync(src: Path, dest: Path, seq: int | None = None) -> None:
    """A copy of a sync folder's records (without the kept tensors: 10^4 copies of those would make the
    harness's before/after snapshot hash gigabytes), renumbered to sync `seq`."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.jsonl"):
        text = re.sub(r'"tensors_file":"[^"]*"', '"tensors_file":null', f.read_text(), count=1)
        if seq is not None:
            text = text.replace('"sync":{"seq":0,', f'"sync":{{"seq":{seq},', 1)
        (dest / f.name).write_text(text)


def mut_record_counts(draw: Draw, case: Case, _tree: str) -> None:
    """Thousands of sync folders, or thousands of rank files in one sync (copies of a real record). Memory
    and time must stay bounded; the same rank recorded many times is a finding."""
    records = case.root / "records"
    sync0 = records / "sync-00000"
    kind = _pick(draw, ["sync-dirs", "rank-files"], "kind")
    count = _pick(draw, [1_000, 3_000, 10_000], "count")
    if kind == "sync-dirs":
        for i in range(1, count):
            _copy_sync(sync0, records / f"sync-{i:05d}", seq=i)
        case.expect = frozenset()  # many clean syncs are clean; the bound is on memory and time
    else:
        record = next(sync0.glob("*.jsonl"))
        for i in range(1, count):
            text = record.read_text().replace(f'"tensors_file":"{record.stem}.safetensors"', '"tensors_file":null')
            (sync0 / f"tp0-pp0-ep0.host{i}.{i}.jsonl").write_text(text)
        case.expect = frozenset({"WC720", "WC734"})  # one rank recorded thousands of times
    against = _pick(draw, ["ckpt", "manifest", None], "against")
    case.argv = ["verify", "records", "--format", "json"] + (["--against", against] if against else [])
    case.notes.append(f"{kind} {count}")


def mut_record_lines(draw: Draw, case: Case, _tree: str) -> None:
    """A line of a record duplicated, two lines swapped, or a line moved: the file no longer is what the
    tap wrote, and verify must say so."""
    st = _st()
    target = next((case.root / "records").rglob("*.jsonl"))
    lines = target.read_text().splitlines()
    body = list(range(1, len(lines) - 1))  # neither the header nor the end line
    kind = _pick(draw, ["duplicate", "swap", "move"], "kind")
    types = [json.loads(lines[i])["t"] for i in body]
    want = _pick(draw, sorted(set(types)), "type")
    same = [i for i, t in zip(body, types, strict=True) if t == want]
    if kind == "duplicate":
        i = _pick(draw, same, "line")
        lines.insert(i + draw(st.integers(0, 1), label="after"), lines[i])
    elif kind == "swap":
        if len(same) < 2:
            same = body
        i, j = draw(st.lists(st.sampled_from(same), min_size=2, max_size=2, unique=True), label="pair")
        lines[i], lines[j] = lines[j], lines[i]
    else:
        i = _pick(draw, body, "from")
        line = lines.pop(i)
        j = _pick(draw, [k for k in body if k != i], "to")
        lines.insert(j, line)
    if lines == target.read_text().splitlines():  # two identical lines swapped: nothing changed
        lines.insert(1, lines[1])
    target.write_text("\n".join(lines) + "\n")
    case.expect = frozenset({"WC720"})
    against = _pick(draw, ["ckpt", "manifest", None], "against")
    case.argv = ["verify", "records", "--format", "json"] + (["--against", against] if against else [])
    case.notes.append(f"{kind} {want}")


MUTATORS: dict[str, tuple[Callable[[Draw, Case, str], None], tuple[str, ...]]] = {
    "header-bytes": (mut_header_bytes, ("ckpt", "moe")),
    "header-json": (mut_header_json, ("ckpt", "moe")),
    "tensor-names": (mut_tensor_names, ("ckpt", "moe")),
    "index-json": (mut_index_json, ("ckpt", "moe")),
    "config-json": (mut_config_json, ("ckpt", "moe")),
    "quant-config": (mut_quant_config, ("moe",)),
    "filesystem": (mut_filesystem, ("ckpt", "moe")),
    "records": (mut_records, ("records", "ckpt", "manifest")),
    "manifests": (mut_manifests, ("records", "manifest")),
    "json-keys": (mut_json_keys, ("ckpt", "moe")),
    "unencodable-names": (mut_unencodable_names, ("ckpt", "moe", "records", "manifest")),
    "counts": (mut_counts, ("ckpt", "moe")),
    "record-counts": (mut_record_counts, ("records", "ckpt", "manifest")),
    "record-lines": (mut_record_lines, ("records", "ckpt", "manifest")),
}
# Families whose cases are judged as a whole (their own argv, no diff against a pristine copy).
OWN_ARGV = ("records", "manifests", "json-keys", "unencodable-names", "counts", "record-counts", "record-lines")


def fuzz_one(draw: Draw, corpus: Path, work: Path, family: str) -> tuple[Case, Outcome]:
    mutate, trees = MUTATORS[family]
    multi = family in ("records", "manifests", "record-counts", "record-lines")
    tree = _pick(draw, list(trees[:2]) if not multi else [trees[0]], "tree")
    parts = trees if multi or family == "unencodable-names" else (tree,)
    case = new_case(corpus, work, family, parts)
    if family not in OWN_ARGV:
        shutil.copytree(corpus / tree, case.root / f"{tree}-pristine", symlinks=True)
        _target_command(draw, case, tree)
    mutate(draw, case, tree)
    if family in OWN_ARGV:
        case.notes.append(" ".join(case.argv))
    COUNTS[family] += 1
    outcome = run_case(case)
    CPU_SECONDS[family] += outcome.cpu_seconds
    PEAK_RSS[family] = max(PEAK_RSS[family], outcome.peak_rss)
    return case, outcome
