"""How each consumer of an `ignore` list matches its entries — one small unit per consumer.

Every matcher answers "does entry E cover name N?" the way that program's code does. Module-level
consumers (compressed-tensors, vLLM, SGLang, transformers) see module names (`model.layers.0.mlp.gate`);
the slime/miles online quantizers see parameter names (`model.layers.0.mlp.gate.weight`). Sources and
versions are in each docstring; `tests/test_matchers.py` checks them against the installed packages
(compressed-tensors, transformers; SGLang in the optional SGLang test group).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Container, Iterable

from weightcheck.lightclass import dataclass
from weightcheck.quant import safe_regex

# A pattern that fails to compile matches nothing here; WC303 reports it.


def _compiled(pattern: str) -> safe_regex.SafeRegex | None:
    # Linear-time evaluation (RE2) with Python `re` meaning; None also for a pattern that could only be
    # evaluated by backtracking without end (safe_regex.refusal says why; WC303 reports it).
    return safe_regex.compile_regex(pattern)


def regex_match(pattern: str, name: str) -> bool:
    """Python `re.match`: anchored at the start only (a prefix match), as every consumer uses it."""
    return safe_regex.match(pattern, name)


def ct_match(name: str, entry: str) -> bool:
    """compressed-tensors `match_name` (utils/match.py, unchanged since 0.11): `re:` → `re.match`, else
    exact equality. (Class-name entries are matched separately against module classes.)"""
    if entry.startswith("re:"):
        return regex_match(entry[3:], name)
    return entry == name


def vllm_ct_match(name: str, entry: str) -> bool:
    """vLLM compressed-tensors `should_ignore_layer`: exact or `re.match`; class names are not honoured.
    (Fused layers additionally need all shards to agree: see `fused_consistency`.)"""
    return ct_match(name, entry)


def sglang_ct_match(name: str, entry: str) -> bool:
    """SGLang >= 0.5.23 `check_equal_or_regex_match` (after sgl-project/sglang#32736): `re:` → `re.match`;
    a plain entry equals the name or is a dotted-path suffix of it; never a prefix."""
    if entry.startswith("re:"):
        return regex_match(entry[3:], name)
    return entry == name or name.endswith("." + entry)


def sglang_ct_substring_match(name: str, entry: str) -> bool:
    """SGLang ~Dec 2025 (#14572) to Jul 2026: plain entries matched as case-insensitive substrings, so a
    parent entry (`model.layers.0.mlp.experts.0`) swallowed its children and `mlp.gate` hit `gate_proj`."""
    if entry.startswith("re:"):
        return regex_match(entry[3:], name)
    return entry.lower() in name.lower()


def _sglang_module_path_match(ignored: str, prefix: str) -> bool:
    ignored = ignored.rstrip(".")
    prefix = prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or ("." + ignored + ".") in ("." + prefix + ".")


def sglang_fp8_match(name: str, entry: str) -> bool:
    """SGLang 0.5.23 FP8 `is_layer_skipped` / `_module_path_match`: exact, dotted prefix (a parent swallows
    its children) or a dotted component sequence; entries are tried with and without `model.`; an expert
    prefix is also skipped when it is a substring of an entry containing `experts`. No `re:` syntax."""
    base = entry.removeprefix("model.")
    variants = (base, "model." + base)
    if any(_sglang_module_path_match(v, name) for v in variants):
        return True
    return "experts" in name and any("experts" in v and name in v for v in variants)


def vllm_fp8_match(name: str, entry: str) -> bool:
    """vLLM `is_layer_skipped` (fp8, modelopt-fp8, ...): exact; for expert prefixes, the prefix being a
    substring of an entry containing `experts`."""
    if entry == name:
        return True
    return "experts" in name and "experts" in entry and name in entry


def transformers_match(name: str, entry: str) -> bool:
    """transformers `should_convert_module` (quantizers/quantizers_utils.py; `modules_to_not_convert`):
    `re.match(entry + r"\\.")`, `re.match(entry)` or `name.endswith(entry)`. Every entry is itself a
    start-anchored regex and `re:` has no meaning (so an `re:` entry matches nothing); no dot boundary on
    the suffix (`gate` also skips `shared_expert_gate`)."""
    return regex_match(entry + r"\.", name) or regex_match(entry, name) or name.endswith(entry)


def slime_int4_match(param: str, entry: str) -> bool:
    """slime/miles online INT4 quantizer (`quantizer_compressed_tensors.py`) on HF *parameter* names:
    `re:` → `re.match`; plain → equality or bare string prefix (no dot boundary)."""
    if entry.startswith("re:"):
        return regex_match(entry[3:], param)
    return param == entry or param.startswith(entry)


def miles_nvfp4_match(param: str, entry: str) -> bool:
    """miles online NVFP4 (`quantizer_nvfp4.py` `_is_ignored`) on parameter names, merging `ignore` and
    `exclude_modules`: `re:` → `re.match`; plain → equality or `entry + "."` prefix. It quantizes expert
    projections only, so it never packs a router, embedding or head (not `quantizes_online`)."""
    if entry.startswith("re:"):
        return regex_match(entry[3:], param)
    return param == entry or param.startswith(entry + ".")


def vllm_awq_match(name: str, entry: str) -> bool:
    """vLLM AWQ `is_layer_skipped_awq`: plain substring."""
    return entry in name


def vllm_bnb_match(name: str, entry: str) -> bool:
    """vLLM bitsandbytes `is_layer_skipped_bnb`: the entry equals one dotted component or is a dotted prefix."""
    components = name.split(".")
    return entry in components or name.startswith(entry + ".") or name == entry


_MLA_FUSED_TAILS = frozenset({"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"})


@functools.lru_cache(maxsize=4096)
def _modelopt_glob(entry: str) -> tuple[safe_regex.SafeRegex | None, str | None]:
    # SGLang escapes only "." and turns "*" into ".*"; other regex characters pass through. With no such
    # character, the glob's longest `*`-free piece must be a substring of whatever it matches: a cheap test
    # that skips the regex for almost every (name, entry) pair of a per-layer list.
    piece = None if set(entry) & set("^$+?{}[]\\|()") else max(entry.split("*"), key=len)
    return safe_regex.compile_regex(safe_regex.glob_to_regex(entry)), piece


def sglang_modelopt_match(name: str, entry: str) -> bool:
    """SGLang 0.5.23 ModelOpt `is_layer_excluded`: glob (`*`) full match on the whole prefix or on any single
    dotted component, also with a leading `language_model.` stripped; an entry whose last component is an
    MLA projection also matches the fused `fused_qkv_a_proj_with_mqa` (substring of the last component)."""
    candidates = [name]
    if name.startswith("language_model."):
        candidates.append(name.removeprefix("language_model."))
    pattern, piece = _modelopt_glob(entry)
    if pattern is not None and (piece is None or piece in name):
        for cand in candidates:
            if pattern.fullmatch(cand) or any(pattern.fullmatch(part) for part in cand.split(".")):
                return True
    tail = entry.rsplit(".", 1)[-1]
    return tail in _MLA_FUSED_TAILS and any(tail in cand.rsplit(".", 1)[-1] for cand in candidates)


def vllm_modelopt_match(name: str, entry: str) -> bool:
    """vLLM ModelOpt `is_layer_excluded`: exact, then substring (also with `language_model.` stripped),
    then `fnmatch` wildcards."""
    stripped = name.replace("language_model.", "", 1)
    return entry in (name, stripped) or entry in name or entry in stripped or fnmatch.fnmatchcase(name, entry)


@dataclass(frozen=True)
class Consumer:
    """One reader of an ignore list (a producer or engine version) and how it matches entries."""

    key: str
    label: str
    level: str  # "module" or "param"
    methods: frozenset[str]
    match: Callable[[str, str], bool]
    # Quantizes targets from the config itself (so an unignored router gets quantized by it).
    quantizes_online: bool = False
    def matches(self, name: str, entries: Iterable[str]) -> list[str]:
        return [e for e in entries if self.match(name, e)]


_CT = frozenset({"compressed-tensors"})
CONSUMERS: tuple[Consumer, ...] = (
    Consumer("ct", "compressed-tensors (producer, llm-compressor)", "module", _CT, ct_match),
    Consumer("vllm", "vLLM", "module", _CT, vllm_ct_match),
    Consumer("sglang", "SGLang >= 0.5.23", "module", _CT, sglang_ct_match),
    Consumer("sglang-substring", "SGLang 0.5.x before #32736 (substring era)", "module", _CT,
             sglang_ct_substring_match),
    Consumer("slime-int4", "slime/miles online INT4 quantizer (parameter names)", "param", _CT, slime_int4_match,
             quantizes_online=True),
    Consumer("vllm-fp8", "vLLM", "module", frozenset({"fp8"}), vllm_fp8_match),
    Consumer("sglang-fp8", "SGLang 0.5.23", "module", frozenset({"fp8"}), sglang_fp8_match),
    Consumer("transformers", "transformers (modules_to_not_convert)", "module",
             frozenset({"fp8", "awq", "gptq", "bitsandbytes", "mxfp4", "nvfp4", "mxfp8", "fbgemm_fp8", "eetq",
                        "auto-round"}), transformers_match),
    Consumer("vllm-awq", "vLLM AWQ", "module", frozenset({"awq"}), vllm_awq_match),
    Consumer("vllm-bnb", "vLLM bitsandbytes", "module", frozenset({"bitsandbytes"}), vllm_bnb_match),
    Consumer("vllm-modelopt", "vLLM ModelOpt", "module", frozenset({"modelopt"}), vllm_modelopt_match),
    Consumer("sglang-modelopt", "SGLang ModelOpt", "module", frozenset({"modelopt"}), sglang_modelopt_match),
    # miles' online NVFP4 (radixark/miles quantizer_nvfp4.py, every version to Aug 2026) packs only the
    # routed and shared experts' fc1/fc2; routers, embeddings, lm_head and attention pass through untouched.
    Consumer("miles-nvfp4", "miles online NVFP4 (parameter names)", "param", frozenset({"modelopt"}),
             miles_nvfp4_match),
)  # fmt: skip


def consumers_for(method: str, deployed: Iterable[str] | None = None) -> list[Consumer]:
    """Consumers of `method`; with `deployed` (config `consumers = [...]`), only those a team deploys to, by
    key or family (`sglang` = every SGLang matcher). The producer (`ct`) always stays: it wrote the list."""
    found = [c for c in CONSUMERS if method in c.methods]
    if deployed is None:
        return found
    wanted = set(deployed)
    return [c for c in found if c.key == "ct" or c.key in wanted or c.key.split("-")[0] in wanted]


def consumer_families() -> list[str]:
    """Names accepted by `consumers = [...]`: every consumer key and every family prefix."""
    return sorted({c.key for c in CONSUMERS} | {c.key.split("-")[0] for c in CONSUMERS})


def get_consumer(key: str) -> Consumer:
    for c in CONSUMERS:
        if c.key == key:
            return c
    raise KeyError(key)


FUSED_SHARDS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def fused_groups(modules: Iterable[str]) -> dict[str, list[str]]:
    """Group shard modules by the fused module an engine builds: `...self_attn.qkv_proj` → its q/k/v."""
    groups: dict[str, list[str]] = {}
    present = set(modules)
    for module in present:
        head, _, leaf = module.rpartition(".")
        for fused, shards in FUSED_SHARDS.items():
            if leaf in shards:
                key = f"{head}.{fused}" if head else fused
                members = [f"{head}.{s}" if head else s for s in shards]
                groups[key] = [m for m in members if m in present]
    return {k: v for k, v in groups.items() if len(v) > 1}


def fused_group_of(module: str, present: Container[str]) -> tuple[str, list[str]] | None:
    """The fused module `module` is a shard of, with its present shards (as `fused_groups` builds it)."""
    head, _, leaf = module.rpartition(".")
    for fused, shards in FUSED_SHARDS.items():
        if leaf in shards:
            members = [f"{head}.{s}" if head else s for s in shards]
            members = [m for m in members if m in present]
            return (f"{head}.{fused}" if head else fused, members) if len(members) > 1 else None
    return None


def regex_stem(pattern: str) -> str:
    """Strip the trailing "anything" of a regex (`.*`, `.+`, `\\.*`, `$`) to find what it means to name."""
    stem = pattern
    while True:
        for tail in (".*$", ".*", ".+", r"\.*", "$", "(.*)", "(\\..*)?"):
            if stem.endswith(tail) and not stem.endswith("\\" + tail):
                stem = stem[: -len(tail)]
                break
        else:
            return stem


def overreach(pattern: str, name: str) -> bool:
    """True when `pattern` matches `name` only by running into the middle of a dotted component:
    `re:model.layers.1.*` on `model.layers.12.mlp` (stem `model.layers.1` stops inside `12`), or
    `re:.*mlp.gate` on `mlp.gate_proj`. Patterns ending in `$` or a dot boundary never over-reach."""
    stem = regex_stem(pattern)
    if not stem or (stem.endswith(("\\.", ".")) and not stem.endswith(".*")):
        return False
    compiled = _compiled(stem)
    if compiled is None:
        return False
    if not compiled.match(name):
        return False
    # Over-reach means no match of the stem ends at a component boundary (a dot or the end). A boolean
    # question (no match positions), so that it can be answered in linear time.
    bounded = _compiled(f"(?:{stem})(?:\\.|$)")
    return bounded is None or not bounded.match(name)
