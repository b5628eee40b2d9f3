"""Architecture patterns: declarative TOML files in `patterns/`, validated at load.

A pattern says, per model family, which modules every decoder layer holds (dense and MoE variants, MTP
extras), their kinds (linear, router, embedding, norm...), weight shapes as expressions over config.json,
and engine facts (does SGLang's class declare `packed_modules_mapping`, does vLLM build the router with
the quant config). `*` in a module name stands for an expert index. See `patterns/README.md`.

Expressions (`num_attention_heads * head_dim`, `layer >= first_k_dense_replace`) are evaluated by a tiny
whitelisted evaluator over config values — never `eval`.

Why one ~1,300-line module: the pattern schema, its safe expression evaluator, loading (generated, hand-written
overlays, task-head and base classes), expansion against a config and coverage checks are one data model, each a
section below; the generator that writes the data lives outside the package (tools/archgen).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from functools import cache, lru_cache
from pathlib import Path

from weightcheck.lightclass import dataclass, field
from weightcheck.patternexpr import PatternError, evaluate_node
from weightcheck.patternexpr import names as expr_tree_names
from weightcheck.patternexpr import parse as parse_expression

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from typing import Any, NamedTuple, overload
else:
    from weightcheck.lightclass import NamedTuple

# `experts`: stacked 3-D expert parameters (gpt-oss `mlp.experts.gate_up_proj` [E, ...]), not a Linear.
KINDS = {"linear", "router", "embedding", "norm", "conv", "other", "experts"}
_MODULE_KEYS = {"kind", "shape", "bias", "params", "optional", "when", "quantized_by", "fused", "dtype"}
_FAMILY_KEYS = {
    "name", "description", "model_types", "architectures", "layer_prefix", "num_layers", "mtp_layers",
    "experts", "moe_layers", "allowed_prefixes", "root_aliases",
}  # fmt: skip
_ENGINE_KEYS = {"sglang_class", "sglang_packed_modules_mapping", "sglang_separate_lm_head", "vllm_class"}
_SECTIONS = {"family", "defaults", "engines", "globals", "layer", "dense_layer", "moe_layer", "mtp_layer",
             "provenance"}  # fmt: skip


# ---- expressions (weightcheck.patternexpr) -----------------------------------------------------------


def expr_names(text: str) -> frozenset[str]:
    """The names (config keys, `layer`) a pattern expression reads."""
    return expr_tree_names(parse_expression(str(text)))


def evaluate(text: str | int | bool, env: dict[str, Any]) -> Any:
    """Evaluate a pattern expression; unknown names raise KeyError (the caller decides what that means)."""
    if isinstance(text, (int, bool)):
        return text
    return evaluate_node(parse_expression(str(text)), env)


# ---- schema ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleSpec:
    """One module entry of a pattern: its name under the layer (or global), kind, shape and params."""

    name: str  # relative to the layer (or absolute for globals); `*` = expert index
    kind: str
    shape: tuple[str, ...] = ()
    bias: str | bool = False
    params: tuple[str, ...] = ("weight",)
    optional: bool = False
    when: str | None = None
    quantized_by: tuple[str, ...] = ()
    dtype: str | None = None

    @property
    def is_expert(self) -> bool:
        return "*" in self.name.split(".")


@dataclass
class Pattern:
    """An architecture pattern: the modules a family implies, with its detection keys."""

    name: str
    path: str
    model_types: list[str]
    architectures: list[str]
    layer_prefix: str
    num_layers: str = "num_hidden_layers"
    mtp_layers: str | None = None
    experts: str | None = None
    moe_layers: str | None = None
    allowed_prefixes: list[str] = field(default_factory=list)
    # Other spellings of the language-model root in checkpoints (Qwen2.5-VL on the Hub: `model.` where
    # transformers >= 4.52 says `model.language_model.`); the one the checkpoint uses is picked.
    root_aliases: list[str] = field(default_factory=list)
    description: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    engines: dict[str, Any] = field(default_factory=dict)
    globals: list[ModuleSpec] = field(default_factory=list)
    layer: list[ModuleSpec] = field(default_factory=list)
    dense_layer: list[ModuleSpec] = field(default_factory=list)
    moe_layer: list[ModuleSpec] = field(default_factory=list)
    mtp_layer: list[ModuleSpec] = field(default_factory=list)
    # Generated patterns: the config values the pattern was checked against (provenance.validated; see
    # `outside_coverage`). None for hand-written files (they borrow their model_type's generated domain).
    validated: dict[str, Any] | None = None
    # Generated patterns: the config class's defaults of the keys its expressions use, for a config.json
    # that leaves them out (save_pretrained writes only what differs from the defaults).
    class_defaults: dict[str, Any] = field(default_factory=dict)
    # The config class's attribute_map (alias -> attribute): config.json may use either spelling.
    aliases: dict[str, str] = field(default_factory=dict)
    # Generated patterns: (hand-written pattern name, its domain) when a hand-written pattern overrides this
    # model_type; the generator validated it on the same probes.
    handwritten_domain: tuple[str, dict[str, Any]] | None = None
    # Set by `fit_to_config` for one config only: the exact modules transformers' class writes for it (a
    # config outside `validated`, transformers installed) ...
    exact: list[ExpectedModule] | None = None
    # ... or, without transformers, why the pattern cannot vouch for this config: its WC410/WC501 findings
    # are then warnings, never errors.
    unvalidated: tuple[str, ...] = ()
    # Set by `detect_pattern` when a wrapper model_type with no pattern of its own (a VLM such as Kimi-K2.5's
    # `kimi_k25`) borrows its text_config's: the wrapper's model_type. Its checkpoints keep the language model
    # under a root of the wrapper's choosing (`borrowed`).
    borrowed_by: str | None = None
    # Set by `for_architecture` when config.json's `architectures` names a task-head or base class of the
    # model_type (a reward model's `LlamaForSequenceClassification`, an embedding model's `Qwen3Model`): that
    # class. Its head is not the causal LM's, so `tie_word_embeddings` says nothing about what is stored.
    task_class: str | None = None
    # ... and the head modules that class adds (`score`, `classifier`, `qa_outputs`), as the table records them.
    task_heads: tuple[str, ...] = ()


def _module(section: str, name: str, spec: Any, where: str) -> ModuleSpec:
    if not isinstance(spec, dict):
        raise PatternError(f"{where}: [{section}] {name!r} must be a table")
    unknown = set(spec) - _MODULE_KEYS
    if unknown:
        raise PatternError(f"{where}: [{section}] {name!r} has unknown keys {sorted(unknown)}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise PatternError(f"{where}: [{section}] {name!r} kind {kind!r} is not one of {sorted(KINDS)}")
    shape = spec.get("shape", [])
    if not isinstance(shape, list) or not all(isinstance(s, (str, int)) for s in shape):
        raise PatternError(f"{where}: [{section}] {name!r} shape must be a list of expressions")
    for expr in (*shape, spec.get("when") or "1", spec.get("bias") if isinstance(spec.get("bias"), str) else "1"):
        try:
            parse_expression(str(expr))
        except PatternError as exc:
            raise PatternError(f"{where}: [{section}] {name!r}: {exc}") from None
    params = spec.get("params", ["weight"])
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise PatternError(f"{where}: [{section}] {name!r} params must be a list of strings")
    return ModuleSpec(
        name=name,
        kind=kind,
        shape=tuple(str(s) for s in shape),
        bias=spec.get("bias", False),
        params=tuple(params),
        optional=bool(spec.get("optional", False)),
        when=spec.get("when"),
        quantized_by=tuple(spec.get("quantized_by", [])),
        dtype=spec.get("dtype"),
    )


def parse_pattern(doc: dict[str, Any], where: str) -> Pattern:
    unknown = set(doc) - _SECTIONS
    if unknown:
        raise PatternError(f"{where}: unknown sections {sorted(unknown)}")
    fam = doc.get("family")
    if not isinstance(fam, dict):
        raise PatternError(f"{where}: missing [family] table")
    bad = set(fam) - _FAMILY_KEYS
    if bad:
        raise PatternError(f"{where}: [family] has unknown keys {sorted(bad)}")
    for key in ("name", "layer_prefix"):
        if not isinstance(fam.get(key), str) or not fam[key]:
            raise PatternError(f"{where}: [family] {key} is required")
    if not fam.get("model_types") and not fam.get("architectures"):
        raise PatternError(f"{where}: [family] needs model_types or architectures to be detectable")
    for key in ("moe_layers",):
        if fam.get(key) is not None:
            parse_expression(str(fam[key]))
    engines = doc.get("engines", {})
    if set(engines) - _ENGINE_KEYS:
        raise PatternError(f"{where}: [engines] has unknown keys {sorted(set(engines) - _ENGINE_KEYS)}")
    pattern = Pattern(
        name=fam["name"],
        path=where,
        model_types=list(fam.get("model_types", [])),
        architectures=list(fam.get("architectures", [])),
        layer_prefix=fam["layer_prefix"],
        num_layers=fam.get("num_layers", "num_hidden_layers"),
        mtp_layers=fam.get("mtp_layers"),
        experts=fam.get("experts"),
        moe_layers=fam.get("moe_layers"),
        allowed_prefixes=list(fam.get("allowed_prefixes", [])),
        root_aliases=list(fam.get("root_aliases", [])),
        description=fam.get("description", ""),
        defaults=dict(doc.get("defaults", {})),
        engines=dict(engines),
    )
    for section in ("globals", "layer", "dense_layer", "moe_layer", "mtp_layer"):
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise PatternError(f"{where}: [{section}] must be a table")
        setattr(pattern, section, [_module(section, n, s, where) for n, s in table.items()])
    class_defaults = (doc.get("provenance") or {}).get("class_defaults")
    if isinstance(class_defaults, dict):
        pattern.class_defaults = class_defaults
    aliases = (doc.get("provenance") or {}).get("aliases")
    if isinstance(aliases, dict):
        pattern.aliases = {str(k): str(v) for k, v in aliases.items()}
    validated = (doc.get("provenance") or {}).get("validated")
    if isinstance(validated, dict):
        pattern.validated = validated
    hand = (doc.get("provenance") or {}).get("validated_handwritten")
    if isinstance(hand, dict) and isinstance(hand.get("domain"), dict) and isinstance(hand.get("pattern"), str):
        pattern.handwritten_domain = (hand["pattern"], hand["domain"])
    if pattern.moe_layer and not pattern.experts:
        raise PatternError(f"{where}: [moe_layer] needs [family] experts (the config key of the expert count)")
    return pattern


def load_pattern_file(path: str | Path) -> Pattern:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text) if path.suffix == ".json" else toml_loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError too
        raise PatternError(f"{path}: {exc}") from None
    return parse_pattern(doc, str(path))


def toml_loads(text: str) -> dict[str, Any]:
    """`tomllib.loads`, imported on first use (see `_shipped_doc`)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads(text)


# ---- the parsed twin of the shipped hand-written TOML files --------------------------------------------
# patterns/generated/handwritten.json holds, for each shipped TOML file, its exact text and the document
# tomllib parses from it (written by `python -m tools.archgen.twins`; tests/test_pattern_twins.py fails when
# it is stale). A file whose text is exactly the twin's takes the twin's document; any other text (an edited
# checkout, a file the twin does not know) is parsed as TOML, so the TOML files stay the only source. Why:
# importing tomllib (and the datetime, string and typing modules it imports) was ~8 ms of a ~0.15 s
# config-only lint, and the JSON parse of the twin is a fraction of a millisecond.
HANDWRITTEN_TWIN = "handwritten.json"


@lru_cache(maxsize=1)
def _handwritten_twins() -> dict[str, Any]:
    folder = _pattern_dir()
    if folder is None:
        return {}
    try:
        doc = json.loads((folder / "generated" / HANDWRITTEN_TWIN).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):  # no twin, or a broken one: the TOML files are read
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    return files if isinstance(files, dict) else {}


def _twin_doc(file: Path, text: str) -> dict[str, Any] | None:
    """The twin's parsed document of shipped TOML `file` when its text is exactly `text`, else None."""
    twin = _handwritten_twins().get(file.name)
    if isinstance(twin, dict) and twin.get("toml") == text and isinstance(twin.get("doc"), dict):
        return twin["doc"]
    return None


def _shipped_doc(path: str | Path) -> dict[str, Any]:
    """The parsed document of a shipped hand-written TOML file (the twin's, or the file parsed)."""
    file = Path(path)
    text = file.read_text(encoding="utf-8")
    found = _twin_doc(file, text)
    return found if found is not None else toml_loads(text)


def _pattern_dir() -> Path | None:
    return find_pattern_dir(Path(__file__).resolve().parent)


def find_pattern_dir(here: Path) -> Path | None:
    """The shipped patterns folder of the weightcheck package in folder `here`. Source checkout: patterns/ at
    the repository root. Installed: packaged as weightcheck._patterns."""
    local = here.parent / "patterns"
    if local.is_dir():
        return local
    # An installed copy on disk (a wheel, `pip install .`) has the package folder itself: read it directly.
    # importlib.resources pulls in zipfile, tempfile, shutil, lzma and bz2, ~10 ms of a config-only lint; it
    # stays for the copies it exists for (a zip import, a custom loader).
    packaged = here / "_patterns"
    if packaged.is_dir():
        return packaged
    from importlib import resources

    try:
        return Path(str(resources.files("weightcheck._patterns")))
    except (ModuleNotFoundError, TypeError):
        return None


@lru_cache(maxsize=1)
def builtin_patterns() -> dict[str, Pattern]:
    """Every pattern shipped in patterns/, validated (a malformed file raises PatternError)."""
    out: dict[str, Pattern] = {}
    for name, head in builtin_families().items():
        pattern = builtin_pattern(name)
        if pattern.name != name:  # the [family] table read alone disagrees with the whole file: never shipped
            raise PatternError(f"{head.path}: [family] name {pattern.name!r} read as {name!r} from the table alone")
        out[name] = pattern
    return out


class FamilyHead(NamedTuple):
    """What detection needs from a hand-written pattern: its `[family]` table's names, without the rest."""

    path: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]


_NEXT_TABLE = re.compile(r"^\[(?!family\])", re.MULTILINE)


@lru_cache(maxsize=1)
def builtin_families() -> dict[str, FamilyHead]:
    """family name -> its model_types/architectures, for every shipped hand-written pattern (file order).

    Detection asks only these; it reads only the `[family]` table of each file (it comes first in every
    shipped file, and `tests/test_pattern_template.py` keeps it so), then parses the one file it picks. Parsing
    every TOML file was ~30 ms of a ~100 ms config-only lint. A file whose head does not read alone is
    parsed whole. Duplicate family names raise PatternError, as `builtin_patterns` always did."""
    folder = _pattern_dir()
    out: dict[str, FamilyHead] = {}
    if folder is None:
        return out
    for file in sorted(folder.glob("*.toml")):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PatternError(f"{file}: {exc}") from None
        twin = _twin_doc(file, text)
        if twin is not None:
            fam = twin.get("family")
        else:
            nxt = _NEXT_TABLE.search(text)
            try:
                fam = toml_loads(text[: nxt.start()] if nxt else text).get("family")
            except ValueError:
                fam = None
        if not isinstance(fam, dict) or not isinstance(fam.get("name"), str):
            fam = load_pattern_file(file)  # not a shipped shape: the whole file, with its own error
            fam = {"name": fam.name, "model_types": fam.model_types, "architectures": fam.architectures}
        name = fam["name"]
        if name in out:
            raise PatternError(f"{file}: family {name!r} already defined in {out[name].path}")
        types, archs = fam.get("model_types") or [], fam.get("architectures") or []
        out[name] = FamilyHead(
            str(file),
            tuple(t for t in types if isinstance(t, str)) if isinstance(types, list) else (),
            tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else (),
        )
    return out


@lru_cache(maxsize=64)
def builtin_pattern(name: str) -> Pattern:
    """One shipped hand-written pattern by family name (KeyError if none), parsed and validated once."""
    path = builtin_families()[name].path
    try:
        doc = _handwritten_doc(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PatternError(f"{path}: {exc}") from None
    return parse_pattern(doc, path)


# ---- generated patterns (patterns/generated/, from scripts/generate_patterns.py) -------------------
# Loaded lazily: start-up reads only the small index, and a pattern file is parsed the first time its
# model_type is asked for, so lint's start-up does not grow with the number of architectures.


@lru_cache(maxsize=1)
def generated_index() -> dict[str, Any]:
    folder = _pattern_dir()
    path = folder / "generated" / "index.json" if folder is not None else None
    if path is None or not path.is_file():
        return {"model_types": {}, "architectures": {}}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PatternError(f"{path}: {exc}") from None
    return doc if isinstance(doc, dict) else {"model_types": {}, "architectures": {}}


@cache
def _generated_doc(file: str) -> tuple[dict[str, Any], str]:
    """(the parsed JSON of a generated pattern file, its path). Callers copy before changing it."""
    folder = _pattern_dir()
    assert folder is not None
    path = folder / "generated" / Path(file).name  # index entries are bare file names
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PatternError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise PatternError(f"{path}: not a JSON object")
    return doc, str(path)


@cache
def generated_pattern(file: str) -> Pattern:
    doc, path = _generated_doc(file)
    pattern = parse_pattern(doc, path)
    facts = _sglang_facts(pattern.model_types[0]) if pattern.model_types else {}
    if facts.get("sglang_class"):
        pattern.engines.setdefault("sglang_class", facts["sglang_class"])
        pattern.engines.setdefault("sglang_packed_modules_mapping", bool(facts.get("packed_modules_mapping")))
    return pattern


def _sglang_facts(model_type: str) -> dict[str, Any]:
    """What the installed SGLang's registered class for `model_type` declares (its class, packed modules,
    routers, the routed-expert layouts its load_weights reads): the `registry` half of
    patterns/generated/sglang/<model_type>.json, generated in the SGLang environment
    (`scripts/generate_patterns.py --sglang`). {} when unknown."""
    found = engine_source_facts("sglang", model_type).get("registry")
    return found if isinstance(found, dict) else {}


def sglang_packed_names(model_type: str) -> list[str]:
    """The fused names the installed SGLang's class for `model_type` lists in its packed_modules_mapping (the
    registry record; 0.5.23's Qwen2.5-VL: `gate_up_proj` only); [] when it declares none or is unknown."""
    mapping = _sglang_facts(model_type).get("packed_modules_mapping")
    return [k for k in mapping if isinstance(k, str)] if isinstance(mapping, dict) else []


# ---- hand-written overlays ---------------------------------------------------------------------------
# A hand-written TOML for a model_type that also has a generated file is an overlay on it (patterns/README.md,
# "Hand-written patterns are overlays"): the generated file is the base, and the TOML adds or replaces named
# entries. `[family]`, `[defaults]` and `[engines]` keys set in the TOML win key by key; a module the TOML
# names (in any module section) replaces the generated module of that name whole, in whichever section
# either puts it; generated modules the TOML does not name stay as generated. When the TOML moves the
# language-model root (`layer_prefix`), the generated globals under the old root move with it.

_MODULE_SECTIONS = ("globals", "layer", "dense_layer", "moe_layer", "mtp_layer")
_LAYER_SECTIONS = _MODULE_SECTIONS[1:]


def overlay_doc(generated: dict[str, Any], hand: dict[str, Any]) -> dict[str, Any]:
    """The pattern document of hand-written `hand` laid over `generated` (both as parsed from their files)."""
    base = _json_copy(generated)  # the parsed documents are cached: the overlay never shares their containers
    top = _json_copy(hand)
    gen_family, hand_family = base.get("family") or {}, top.get("family") or {}
    out: dict[str, Any] = {"family": {**gen_family, **hand_family}}
    for section in ("defaults", "engines"):
        merged = {**(base.get(section) or {}), **(top.get(section) or {})}
        if merged:
            out[section] = merged
    old_root = str(gen_family.get("layer_prefix", "")).rpartition(".")[0]
    new_root = str(out["family"].get("layer_prefix", "")).rpartition(".")[0]
    gen_globals = dict(base.get("globals") or {})
    if old_root and new_root and old_root != new_root:
        gen_globals = {(new_root + n[len(old_root) :] if n.startswith(old_root + ".") else n): spec
                       for n, spec in gen_globals.items()}  # fmt: skip
    named_globals = set(top.get("globals") or {})
    named_layer = {n for section in _LAYER_SECTIONS for n in (top.get(section) or {})}
    survivors: list[dict[str, Any]] = []
    for section in _MODULE_SECTIONS:
        table = gen_globals if section == "globals" else dict(base.get(section) or {})
        named = named_globals if section == "globals" else named_layer
        kept = {n: spec for n, spec in table.items() if n not in named}
        survivors += [spec for spec in kept.values() if isinstance(spec, dict)]
        kept.update(top.get(section) or {})
        if kept:
            out[section] = kept
    # The generated file's class defaults (what save_pretrained leaves out of config.json) serve only the
    # generated modules that survive, and never a key the TOML gives its own default for.
    names: set[str] = set()
    for spec in survivors:
        for expr in (spec.get("when"), spec.get("bias"), *(spec.get("shape") or [])):
            if isinstance(expr, str):
                names |= expr_names(expr)
    for key in ("moe_layers", "experts", "num_layers", "mtp_layers"):
        if key not in hand_family and isinstance(gen_family.get(key), str):
            names |= expr_names(gen_family[key])
    class_defaults = (base.get("provenance") or {}).get("class_defaults") or {}
    own = set(out.get("defaults") or {})
    out["provenance"] = {"class_defaults": {k: v for k, v in class_defaults.items() if k in names and k not in own}}
    aliases = (base.get("provenance") or {}).get("aliases")
    if isinstance(aliases, dict):
        out["provenance"]["aliases"] = aliases
    return out


def _json_copy(value: Any) -> Any:
    """A deep copy of parsed JSON or TOML (dicts, lists, tuples; the leaves are immutable), without the `copy`
    module (and the `weakref` it imports) on lint's start-up path."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(item) for item in value)
    return value


@lru_cache(maxsize=64)
def _handwritten_doc(path: str) -> dict[str, Any]:
    return _shipped_doc(path)


def overlaid(name: str, model_type: Any = None) -> Pattern:
    """Built-in hand-written pattern `name` over the generated file of `model_type` when it is one of the
    pattern's model_types (else of the first of them that has one); the TOML alone when none has."""
    hand = builtin_families()[name]
    return _overlaid(name, model_type if model_type in hand.model_types else None)


@cache
def _overlaid(name: str, model_type: str | None) -> Pattern:
    hand = builtin_families()[name]  # the head: the TOML is parsed once, below or by builtin_pattern
    for t in (model_type, *hand.model_types):
        file = generated_index().get("model_types", {}).get(t) if isinstance(t, str) else None
        if file:
            break
    else:
        return builtin_pattern(name)
    generated, _ = _generated_doc(file)
    doc = overlay_doc(generated, _handwritten_doc(hand.path))
    pattern = parse_pattern(doc, hand.path)
    base = generated_pattern(file)
    for key, value in base.engines.items():  # the SGLang facts read into the generated pattern
        pattern.engines.setdefault(key, value)
    return pattern


def sglang_routed_experts(model_type: str) -> tuple[str, dict[str, Any]] | None:
    """(SGLang class, its `routed_experts` facts) for a generated MoE model_type: which routed-expert layouts
    its `load_weights` was seen to read (tools.archgen.sglang_probe). None when unknown."""
    facts = _sglang_facts(model_type)
    routed = facts.get("routed_experts")
    if not facts.get("sglang_class") or not isinstance(routed, dict) or not isinstance(routed.get("layouts"), list):
        return None
    return str(facts["sglang_class"]), routed


ENGINE_SOURCES = ("sglang", "vllm")


@cache
def engine_source_facts(engine: str, model_type: str) -> dict[str, Any]:
    """What `engine`'s model class for `model_type` builds, read from its sources
    (patterns/generated/<engine>/<model_type>.json, tools.archgen.engine_sources); {} when unknown."""
    folder = _pattern_dir()
    if folder is None or engine not in ENGINE_SOURCES or not re.fullmatch(r"[a-z0-9_]+", model_type):
        return {}  # model_type comes from an untrusted config.json: never a path
    path = folder / "generated" / engine / f"{model_type}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def engine_unquantized_leaves(engine: str, model_type: str) -> dict[str, str]:
    """module name leaf -> the engine attribute it belongs to, for every module `engine` builds without the
    quant config: the attributes themselves, and the checkpoint shards of an unquantized fused attribute
    (SGLang's OLMo builds `qkv_proj` without it, so `q_proj`/`k_proj`/`v_proj` are unquantized there)."""
    facts = engine_source_facts(engine, model_type)
    attrs = [a for a in facts.get("unquantized") or [] if isinstance(a, str)]
    out = {a: a for a in attrs}
    fused = facts.get("fused") if isinstance(facts.get("fused"), dict) else {}
    for group, shards in fused.items():
        if isinstance(group, str) and group.rsplit(".", 1)[-1] in attrs and isinstance(shards, list):
            for shard in shards:
                if isinstance(shard, str):
                    out.setdefault(shard.rsplit(".", 1)[-1], group.rsplit(".", 1)[-1])
    return out


@lru_cache(maxsize=1)
def _producer_linear() -> dict[str, Any]:
    folder = _pattern_dir()
    path = folder / "generated" / "producer" / "transformers_linear.json" if folder is not None else None
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return {}
    types = doc.get("model_types") if isinstance(doc, dict) else None
    return types if isinstance(types, dict) else {}


def producer_linear_leaves(model_type: str) -> dict[str, str]:
    """Router/other-kind module leaves that transformers builds as an `nn.Linear` (subclass) for
    `model_type`: a compressed-tensors `Linear` target quantizes them (Llama-4's `router`, Qwen3-Next's
    `shared_expert_gate`)."""
    found = _producer_linear().get(model_type)
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def sglang_registered_model_types() -> list[str]:
    """Generated model_types whose architecture SGLang registers too (the covered set)."""
    return [t for t in generated_model_types() if _sglang_facts(t).get("sglang_class")]


def generated_model_types() -> list[str]:
    return sorted(generated_index().get("model_types", {}))


def _generated_for(model_type: Any) -> Pattern | None:
    file = generated_index().get("model_types", {}).get(model_type) if isinstance(model_type, str) else None
    return generated_pattern(file) if file else None


def architectures_of(config: dict[str, Any]) -> list[str]:
    """config.json's `architectures` class names (a list of strings, as transformers writes it); anything else
    (a string, a number, null: an untrusted file) counts as none."""
    value = config.get("architectures")
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


def detect_pattern(config: dict[str, Any]) -> Pattern | None:
    """Pick a pattern: hand-written by the top-level `model_type`, generated by it, hand-written by the
    `text_config` model_type, generated by it, then by `architectures`. A VLM wrapper's own pattern (its
    vision and projector prefixes, its language-model root) beats a text-only pattern borrowed through
    its text_config. Then fitted to the class `architectures` names when it is a task-head or base class
    (`for_architecture`)."""
    found = detect_causal_pattern(config)
    return for_architecture(found, config) if found is not None else None


def detect_causal_pattern(config: dict[str, Any]) -> Pattern | None:
    """`detect_pattern` before it is fitted to the class `architectures` names: the model_type's causal LM."""
    patterns = builtin_families()
    top = config.get("model_type")
    texts = [config[sub].get("model_type") for sub in ("text_config", "llm_config")
             if isinstance(config.get(sub), dict)]  # fmt: skip
    for t in (top, *texts):
        if not t:
            continue
        found = None
        for name, p in patterns.items():
            if t in p.model_types:
                found = overlaid(name, t)
                break
        if found is None:
            found = _generated_for(t)
        if found is not None:
            return found if t == top or not isinstance(top, str) or not top else borrowed(found, top)
    archs = architectures_of(config)
    for name, p in patterns.items():
        if any(a in p.architectures for a in archs):
            return overlaid(name, None)
    by_arch = generated_index().get("architectures", {})
    for a in archs:
        if a in by_arch:
            return generated_pattern(by_arch[a])
    return None


# ---- task-head and base classes (patterns/generated/task_heads.json, tools/archgen/task_heads.py) ----------
# Suffixes of the classes that hold another head than the causal LM's (or none), as transformers and remote code
# name them: a class so named that the generated table does not know is checked without the LM head, and the
# pattern cannot vouch for the rest (its findings on missing weights and shapes are warnings).
TASK_CLASS_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                       "RewardModel")  # fmt: skip  (`RewardModel`: also `ForRewardModel`, `ForProcessRewardModel`)


@lru_cache(maxsize=1)
def task_heads_index() -> dict[str, Any]:
    """model_type -> {class name -> {"kind", "from_root", "root", "drops", "heads"}} (empty when absent)."""
    folder = _pattern_dir()
    path = folder / "generated" / "task_heads.json" if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PatternError(f"{path}: {exc}") from None
    types = doc.get("model_types") if isinstance(doc, dict) else None
    return types if isinstance(types, dict) else {}


def num_labels(config: dict[str, Any]) -> int:
    """transformers' `PretrainedConfig.num_labels`: the length of `id2label` (what config.json stores), else an
    explicit `num_labels`, else its default 2."""
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    value = config.get("num_labels")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 2


def decoder_root(pattern: Pattern) -> str:
    """The first component of the pattern's layer prefix, the root the decoder lives under (`model` for
    `model.layers`)."""
    return pattern.layer_prefix.split(".", 1)[0]


def _task_table(config: dict[str, Any]) -> dict[str, Any] | None:
    """task_heads.json's classes of config.json's model_type (None when it records none)."""
    model_type = config.get("model_type")
    table = task_heads_index().get(model_type) if isinstance(model_type, str) else None
    return table if isinstance(table, dict) else None


def moved_name(name: str, old: str, new: str) -> str:
    """`name` with the root `old` replaced by `new` ("" drops it); a name outside `old` unchanged."""
    if name.startswith(old + "."):
        rest = name[len(old) + 1 :]
        return f"{new}.{rest}" if new else rest
    return name


def for_architecture(pattern: Pattern, config: dict[str, Any]) -> Pattern:
    """`pattern` (the causal LM's) fitted to the class config.json's `architectures` names, when that is a
    task-head or base class of its model_type: the decoder under the root that class saves it (`Qwen3Model`:
    no `model.`; most `*ForQuestionAnswering`: `transformer.`), the LM head dropped and the class's own head
    added (`score` [num_labels, hidden_size] for sequence classification), as transformers' classes were
    found to save them (tests/test_task_heads.py). A task class the table does not know (remote code's
    `Qwen2ForRewardModel`) only loses the LM head, and the pattern says it cannot vouch for the rest."""
    from weightcheck.lightclass import replace

    archs = architectures_of(config)
    if not archs or archs[0] in pattern.architectures or pattern.borrowed_by is not None:
        return pattern
    cls = archs[0]
    table = _task_table(config)
    entry = table.get(cls) if table is not None else None
    old_root = decoder_root(pattern)
    if isinstance(entry, dict) and entry.get("from_root") == old_root and isinstance(entry.get("root"), str):
        new_root = entry["root"]
        drops = {d for d in entry.get("drops") or [] if isinstance(d, str)}
        heads = [
            ModuleSpec(
                name=str(module), kind="linear",
                shape=tuple(str(d) for d in (spec.get("shapes") or {}).get("weight") or ()),
                bias="bias" in (spec.get("params") or ()),
            )
            for module, spec in sorted((entry.get("heads") or {}).items()) if isinstance(spec, dict)
        ]  # fmt: skip
        moved = _moved(pattern, old_root, new_root)
        return replace(
            moved,
            architectures=[cls],
            globals=[*(g for g in moved.globals if g.name not in drops), *heads],
            class_defaults={**pattern.class_defaults, "num_labels": num_labels(config)},
            task_class=cls,
            task_heads=tuple(h.name for h in heads),
        )
    if not cls.endswith(TASK_CLASS_SUFFIXES):
        return pattern
    leaves = {"lm_head", *(g.name for g in pattern.globals if g.when and "tie_word_embeddings" in g.when)}
    return replace(
        pattern,
        architectures=[cls],
        globals=[g for g in pattern.globals if g.name not in leaves],
        task_class=cls,
        unvalidated=(*pattern.unvalidated, f"architectures names {cls}, a class whose head weightcheck does not "
                     f"know (checked as {pattern.name!r} without the LM head)"),
    )  # fmt: skip


def _moved(pattern: Pattern, old_root: str, new_root: str) -> Pattern:
    """`pattern` with every name under `old_root` moved under `new_root` ("" drops it: `model.layers` → `layers`)."""
    from weightcheck.lightclass import replace

    if old_root == new_root:
        return pattern
    exact = pattern.exact  # the model class's own names (fit_to_config), moved with the rest
    return replace(
        pattern,
        layer_prefix=moved_name(pattern.layer_prefix, old_root, new_root),
        allowed_prefixes=[moved_name(p, old_root, new_root) for p in pattern.allowed_prefixes],
        root_aliases=[moved_name(p, old_root, new_root) for p in pattern.root_aliases],
        globals=[replace(g, name=moved_name(g.name, old_root, new_root)) for g in pattern.globals],
        exact=None if exact is None else [m._replace(name=moved_name(m.name, old_root, new_root)) for m in exact],
    )


def backbone_class(pattern: Pattern, config: dict[str, Any]) -> str | None:
    """The model_type's base class that saves the decoder without `pattern`'s root (`Qwen3Model`: `layers.N...`
    where the causal LM has `model.layers.N...`), as task_heads.json records it; None when it knows none."""
    table = _task_table(config)
    root = decoder_root(pattern)
    return next((c for c, e in (table or {}).items() if isinstance(e, dict) and e.get("kind") == "base-model"
                 and e.get("root") == "" and e.get("from_root") == root), None)  # fmt: skip


def base_layout(pattern: Pattern, config: dict[str, Any], names: Iterable[str]) -> tuple[Pattern, str | None]:
    """A checkpoint of a causal-LM config whose tensors are named as the model_type's base class saves them (no
    `model.` root: Qwen3-Embedding's `embed_tokens.weight`, `layers.0...`, saved from `Qwen3Model` under
    `"architectures": ["Qwen3ForCausalLM"]`): the pattern with its decoder moved to that root, and a note.
    transformers' from_pretrained adds the root when it loads such a file into the causal class (tested), so the
    weights are not missing; the LM head stays required where the config unties it. Unchanged otherwise."""
    if pattern.task_class is not None or pattern.borrowed_by is not None:
        return pattern, None
    old_root = decoder_root(pattern)
    layers = moved_name(pattern.layer_prefix, old_root, "") + "."
    under_root = old_root + "."
    found = False
    for name in names:  # the usual checkpoint answers at its first name, before the table is read
        if name.startswith(under_root):
            return pattern, None
        found = found or name.startswith(layers)
    base = backbone_class(pattern, config) if found else None
    if base is None:
        return pattern, None
    return _moved(pattern, old_root, ""), (
        f"tensors are named as {base} saves them (no `{old_root}.` root) under a config for "
        f"{', '.join(architectures_of(config)) or 'the causal LM'}: "
        f"checked under that root (transformers' from_pretrained adds `{old_root}.` when it loads them)"
    )


def borrowed(pattern: Pattern, wrapper: str) -> Pattern:
    """`pattern` (a text model's) as lint applies it to a checkpoint of `wrapper`, a model_type with no pattern
    of its own whose text_config is `pattern`'s. The wrapper's checkpoints keep the language model under a
    root of their own: `language_model.model.layers` with the head at `language_model.lm_head` (the original
    Kimi-K2.5 and LLaVA layouts; moonshotai/Kimi-K2.5's released names) or `model.language_model.layers` with
    the head at `lm_head` (transformers >= 4.52's VLM layout). Both become root aliases, picked from the
    checkpoint's names (or, config-only, from the ignore list's plain entries: `expand_runs`); the pattern
    was never checked against the wrapper's class, so it vouches for nothing (`unvalidated`): its missing-
    weight and shape findings are warnings."""
    from weightcheck.lightclass import replace

    canonical = pattern.layer_prefix.rsplit(".", 1)[0]
    aliases = [f"language_model.{canonical}"]
    if canonical == "model":
        aliases.append("model.language_model")
    why = f"model_type {wrapper!r} borrows {pattern.name!r} through its text_config"
    return replace(
        pattern,
        root_aliases=[*pattern.root_aliases, *(a for a in aliases if a not in pattern.root_aliases)],
        borrowed_by=wrapper,
        unvalidated=(*pattern.unvalidated, why),
    )


def resolve_pattern(choice: str | None, config: dict[str, Any]) -> Pattern | None:
    """`--pattern NAME|FILE` overrides detection (NAME: a hand-written family, or a generated model_type,
    also as `gen_<model_type>`). Unknown names/files raise PatternError."""
    if not choice:
        return detect_pattern(config)
    if choice.endswith((".toml", ".json")) or "/" in choice:
        return load_pattern_file(choice)
    patterns = builtin_families()
    if choice in patterns:
        return overlaid(choice, config.get("model_type"))
    found = _generated_for(choice.removeprefix("gen_"))
    if found is None:
        raise PatternError(f"no pattern {choice!r}; shipped: {', '.join(sorted(patterns))} and generated "
                           f"{', '.join(generated_model_types())}")  # fmt: skip
    return found


# ---- expansion against a config --------------------------------------------------------------------


class ExpectedModule(NamedTuple):
    # A NamedTuple: DeepSeek-V3 expands to ~47k of these.
    name: str  # full module name, e.g. model.layers.3.mlp.experts.7.down_proj
    spec: ModuleSpec
    layer: int | None
    expert: int | None
    shape: tuple[int, ...] | None  # expected `weight` shape, when computable
    params: tuple[str, ...]  # required params
    optional_params: tuple[str, ...]


class ExpectedRun(NamedTuple):
    """The pattern's expectation one name template at a time: the modules one pattern entry implies in one
    layer (or globally). A run with `experts` is every expert of an expert entry in that layer, `name`
    holding `*` where the expert id goes (`model.layers.3.mlp.experts.*.down_proj`); a run without is one
    module (`expert` its id when it has one, e.g. from `Pattern.exact`). `expand_runs` returns them;
    `modules()` gives the `ExpectedModule`s `expand` returns, `names()` only their names."""

    name: str
    spec: ModuleSpec
    layer: int | None
    expert: int | None
    experts: range | None
    shape: tuple[int, ...] | None
    params: tuple[str, ...]
    optional_params: tuple[str, ...]

    def names(self, suffix: str = "") -> Sequence[str]:
        """The run's module names (each + `suffix`: `.weight` makes its parameter names), in order; made when
        read (`RunNames`) for an expert run: config-only lint reads a few of Qwen3-30B-A3B's 18k."""
        if self.experts is None:
            return [self.name + suffix]
        return RunNames(self.name, self.experts, suffix)

    def modules(self) -> list[ExpectedModule]:
        if self.experts is None:
            return [ExpectedModule(self.name, self.spec, self.layer, self.expert, self.shape, self.params,
                                   self.optional_params)]  # fmt: skip
        make, spec, layer, shape, params, optional = ExpectedModule._make, self.spec, self.layer, *self[5:]
        pieces = self.name.split("*")
        return [make((str(e).join(pieces), spec, layer, e, shape, params, optional)) for e in self.experts]


class RunNames(Sequence[str]):
    """The names of an expert run, `name` with each id of `experts` in place of its `*` (then `suffix`), each
    made when read: a list of them would cost a string per expert before any rule asks."""

    __slots__ = ("_experts", "_pieces", "_suffix")

    def __init__(self, name: str, experts: range, suffix: str = "") -> None:
        self._pieces = name.split("*")  # `str.join` over the pieces == `name.replace("*", id)`
        self._experts, self._suffix = experts, suffix

    def __len__(self) -> int:
        return len(self._experts)

    if TYPE_CHECKING:

        @overload
        def __getitem__(self, index: int) -> str: ...
        @overload
        def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return str(self._experts[index]).join(self._pieces) + self._suffix

    def __iter__(self) -> Iterator[str]:
        pieces, suffix = self._pieces, self._suffix
        if suffix:
            return (str(e).join(pieces) + suffix for e in self._experts)
        return (str(e).join(pieces) for e in self._experts)

    def __repr__(self) -> str:
        return f"RunNames({'*'.join(self._pieces)!r}, {self._experts!r}, {self._suffix!r})"


def config_env(pattern: Pattern, config: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    env.update({k: v for k, v in config.items() if not isinstance(v, dict)})
    for alias, attribute in pattern.aliases.items():
        if attribute not in env and alias in env:
            env[attribute] = env[alias]
        elif alias not in env and attribute in env:
            env[alias] = env[attribute]
    for key, default in pattern.class_defaults.items():
        env.setdefault(key, default)
    for key, default in pattern.defaults.items():
        if env.get(key) is None:
            try:
                env[key] = evaluate(default, env) if isinstance(default, str) else default
            except (KeyError, *_BAD_VALUE):
                continue
    return env


def _count(expr: str | None, env: dict[str, Any], kind: str) -> int:
    """A layer/expert count from the config; implausible values (hostile config.json) count as 0."""
    from weightcheck.structure import MAX_PLAUSIBLE

    if not expr:
        return 0
    try:
        value = evaluate(expr, env)
    except (KeyError, *_BAD_VALUE):
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_PLAUSIBLE[kind]:
        return 0
    return value


# What a hostile config value makes an expression raise (besides KeyError for a missing key).
_BAD_VALUE = (TypeError, ValueError, ZeroDivisionError, OverflowError, RecursionError)

# Expected-module budgets (see `expand`): DeepSeek-V3 / Kimi-K2 expand to ~75k modules.
EXPANSION_FLOOR = 200_000
EXPANSION_CONFIG_ONLY = 500_000


def layer_root(pattern: Pattern, names: Iterable[str] | None) -> str:
    """The language-model root (`model` in `model.layers`) as this checkpoint (or, config-only, its ignore
    list) spells it."""
    canonical = pattern.layer_prefix.rsplit(".", 1)[0]
    if names is None or not pattern.root_aliases:
        return canonical
    leaf = pattern.layer_prefix.rsplit(".", 1)[-1]
    present = {canonical: 0, **dict.fromkeys(pattern.root_aliases, 0)}
    for name in names:
        for root in present:
            if name.startswith(f"{root}.{leaf}."):
                present[root] += 1
    best = max(present, key=lambda r: present[r])
    return best if present[best] else canonical


def expand(
    pattern: Pattern, config: dict[str, Any], names: Iterable[str] | None = None
) -> tuple[list[ExpectedModule], list[str]]:
    """All modules the config implies, with expected shapes. Also returns notes on what could not be
    evaluated (a missing config key). `names` (the checkpoint's tensors) picks a root alias."""
    runs, notes = expand_runs(pattern, config, names)
    return [m for run in runs for m in run.modules()], notes


def _rerooted(pattern: Pattern, root: str, runs: list[Any]) -> list[Any]:
    """`runs` (or modules) with the language-model root spelled `root`. For a borrowed pattern whose root
    gained a wrapper's prefix (`language_model.model`), the names outside the root (the head) move under
    that prefix too (`language_model.lm_head`)."""
    canonical = pattern.layer_prefix.rsplit(".", 1)[0]
    if root == canonical:
        return runs
    outside = root[: -len(canonical)] if pattern.borrowed_by and root.endswith("." + canonical) else ""
    under = canonical + "."
    return [m._replace(name=root + m.name[len(canonical) :]) if m.name.startswith(under)
            else m._replace(name=outside + m.name) if outside else m
            for m in runs]  # fmt: skip


def expand_runs(
    pattern: Pattern, config: dict[str, Any], names: Iterable[str] | None = None,
    root_hints: Iterable[str] | None = None,
) -> tuple[list[ExpectedRun], list[str]]:  # fmt: skip
    """`expand` before the expert ids are filled in: one `ExpectedRun` per pattern entry and layer (all the
    experts of an expert entry in one run), in `expand`'s order; the same notes. Callers that reason per
    name template (an ignore list over 19k expert modules) read the runs and never build the names.
    `root_hints` (config-only: the ignore list's plain entries) pick a root alias when there are no names."""
    notes: list[str] = []
    if names is not None and not isinstance(names, (list, tuple, dict, set, frozenset)):
        names = list(names)
    root = layer_root(pattern, names if names is not None else root_hints)
    if pattern.exact is not None:
        exact = _rerooted(pattern, root, list(pattern.exact))
        return [ExpectedRun(m.name, m.spec, m.layer, m.expert, None, m.shape, m.params, m.optional_params)
                for m in exact], notes  # fmt: skip
    env = config_env(pattern, config)
    n_layers = _count(pattern.num_layers, env, "layers")
    n_mtp = _count(pattern.mtp_layers, env, "mtp")
    n_experts = _count(pattern.experts, env, "experts")
    out: list[ExpectedRun] = []
    # Budget, checked before allocating: counts that are each plausible can multiply into billions of
    # modules (1,000 layers x 1,000 experts). Expand no more than the checkpoint could possibly hold.
    budget = max(EXPANSION_FLOOR, 4 * len(names)) if names is not None else EXPANSION_CONFIG_ONLY
    sections = (pattern.layer, pattern.moe_layer, pattern.dense_layer, pattern.mtp_layer)
    per_layer = sum(len(s) for s in sections)
    per_expert = sum(1 for s in sections for spec in s if spec.is_expert)
    claimed = (n_layers + n_mtp) * (per_layer + per_expert * n_experts)
    if claimed > budget:
        notes.append(
            f"config describes {n_layers + n_mtp} layers x {n_experts} experts (~{claimed} modules), more than "
            f"{'the checkpoint could hold' if names is not None else 'a config-only check expands'} "
            f"(budget {budget}): per-layer expectations skipped"
        )
        n_layers = n_mtp = n_experts = 0

    # Shapes, params and `when` rarely depend on the layer: evaluate them once per spec unless they do.
    resolved: dict[int, tuple[bool, tuple[int, ...] | None, tuple[str, ...], tuple[str, ...]] | None] = {}

    def resolve(
        spec: ModuleSpec, layer_env: dict[str, Any]
    ) -> tuple[bool, tuple[int, ...] | None, tuple[str, ...], tuple[str, ...]]:
        if spec.when:
            try:
                if not evaluate(spec.when, layer_env):
                    return False, None, (), ()
            except KeyError as exc:
                notes.append(f"{spec.name}: config lacks {exc.args[0]!r}; assumed present")
            except (IndexError, *_BAD_VALUE) as exc:  # layer_types shorter than the layers; `mlp_only_layers: 5`
                notes.append(f"{spec.name}: {spec.when!r} does not evaluate on this config ({exc}); assumed present")
        shape: tuple[int, ...] | None = None
        if spec.shape:
            try:
                shape = tuple(int(evaluate(s, layer_env)) for s in spec.shape)
            except (KeyError, *_BAD_VALUE):
                shape = None
        params = [p for p in spec.params if not p.endswith("?")]
        optional = [p[:-1] for p in spec.params if p.endswith("?")]
        if spec.bias:
            try:
                has_bias = evaluate(spec.bias, layer_env) if isinstance(spec.bias, str) else bool(spec.bias)
            except (KeyError, *_BAD_VALUE):
                has_bias = None
            if has_bias:
                params.append("bias")
            elif has_bias is None:
                optional.append("bias")
        return True, shape, tuple(params), tuple(optional)

    def resolved_for(
        spec: ModuleSpec, layer_env: dict[str, Any]
    ) -> tuple[bool, tuple[int, ...] | None, tuple[str, ...], tuple[str, ...]]:
        key = id(spec)
        got = resolved.get(key)
        if got is None:
            got = resolve(spec, layer_env)
            exprs = (spec.when or "", str(spec.bias), *spec.shape)
            if not any("layer" in e for e in exprs):
                resolved[key] = got
        return got

    def add(spec: ModuleSpec, full: str, layer_env: dict[str, Any], layer: int | None, experts: range | None) -> None:
        included, shape, params, optional = resolved_for(spec, layer_env)
        if included:
            out.append(ExpectedRun(full, spec, layer, None, experts, shape, params, optional))

    for spec in pattern.globals:
        add(spec, spec.name, env, None, None)
    for layer in range(n_layers + n_mtp):
        lenv = {**env, "layer": layer}
        is_mtp = layer >= n_layers
        try:
            is_moe = bool(pattern.moe_layers) and bool(evaluate(pattern.moe_layers, lenv)) and n_experts > 0
        except KeyError as exc:
            notes.append(f"moe_layers: config lacks {exc.args[0]!r}")
            is_moe = n_experts > 0
        except _BAD_VALUE as exc:  # `decoder_sparse_step: 0` or `"a"`, `mlp_only_layers: 5`
            if layer == 0:
                notes.append(f"moe_layers: not computable from the config ({exc}); every layer assumed MoE")
            is_moe = n_experts > 0
        sections = [pattern.layer, pattern.moe_layer if is_moe else pattern.dense_layer]
        if is_mtp:
            sections.append(pattern.mtp_layer)
        prefix = f"{pattern.layer_prefix}.{layer}"
        for section in sections:
            for spec in section:
                if spec.is_expert:
                    # One run for all the experts (~19k modules for Qwen3-30B-A3B, ~47k for DeepSeek-V3).
                    if n_experts:
                        add(spec, f"{prefix}.{spec.name}", lenv, layer, range(n_experts))
                else:
                    add(spec, f"{prefix}.{spec.name}", lenv, layer, None)
    return _rerooted(pattern, root, out), sorted(set(notes))


# ---- coverage: the configs a generated pattern was validated on --------------------------------------
# The generator checks each pattern against transformers' model class on configs that vary every config key
# the model's __init__ reads (tools.archgen.generate.validate_domain) and records, per key that changes
# what is written, the values the pattern was found right for (`provenance.validated`). A config with a
# value outside them is outside coverage: the pattern cannot vouch for it (`fit_to_config`).

ORACLE_ENV = "WEIGHTCHECK_ARCH_ORACLE"  # "0": never build expectations from transformers (the torch-free path)


def normalize_value(value: Any, n_layers: Any) -> Any:
    """The form a validated value is recorded and compared in: layer lists as which layers they select
    (`all`, `none`, or the list itself), anything else as its JSON text."""
    ints = isinstance(value, list) and value and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    if ints and isinstance(n_layers, int) and sorted(set(value)) == list(range(n_layers)):
        return "<all layers>"
    if isinstance(value, list) and not value:
        return "<none>"
    return json.dumps(value, sort_keys=True)


def outside_coverage(domain: dict[str, Any], text: dict[str, Any], borrowed: bool = False) -> list[str]:
    """`key=value` for each config key whose value the pattern was not validated on (empty: covered).
    `borrowed`: a hand-written pattern using its model_type's generated domain; the switches fitted into
    the generated file are not in the hand-written one, so only the generator's own variants' values
    (`base`) count, and no `any_int`."""
    out: list[str] = []
    n_layers = text.get("num_hidden_layers")
    for key, entry in sorted(domain.items()):
        if not isinstance(entry, dict):
            continue
        if key not in text and isinstance(entry.get("default_raw"), list):
            # a per-layer list the config class derives at load from other keys (ERNIE-4.5's mlp_layer_types
            # from moe_layer_interval/start/end): its value for this config is not in the file
            out.append(f"{key} (absent; derived by the config class)")
            continue
        if entry.get("absent_only"):
            # a key the model reads only when the config carries it (Phi-MoE's head_dim), and the pattern was
            # found wrong for when it is set: covered only while the config leaves it out
            if text.get(key) is not None:
                shown = json.dumps(text[key])
                out.append(f"{key}={shown if len(shown) <= 60 else shown[:57] + '...'} (read only when set)")
            continue
        if key not in text and entry.get("derived"):
            # a layer-placement key the config class computes from others when absent (ERNIE-4.5-MoE's
            # moe_layer_end_index: the last layer): its value for this config is not in the file
            out.append(f"{key} (absent; derived by the config class)")
            continue
        value = text.get(key, entry.get("default_raw"))
        if value in (entry.get("rewritten") or []) and not isinstance(value, bool):
            out.append(f"{key}={json.dumps(value)} (rewritten by the config class)")  # -1: "to the last layer"
            continue
        if borrowed:
            entry = {k: v for k, v in entry.items() if k in ("elements", "default_raw")} | {
                "values": entry.get("base", entry.get("values", []))}
        if entry.get("any_int") and isinstance(value, int) and not isinstance(value, bool):
            continue  # validated over several values: an int the pattern's expressions take in
        # `null` is not an int: covered only where it was validated (in `values` below). An optional rank
        # switched off (Kimi Linear's `q_lora_rank: null`: q_proj on its MLA layers) the generator found the
        # pattern wrong for is recorded `any_int` with no values: outside coverage.
        if entry.get("any_layer_list") and isinstance(value, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in value
        ):
            continue  # validated on no layers, all layers and every other one: placement by membership
        if "elements" in entry:  # per-layer kinds (`layer_types`): any mix of the validated kinds
            if value is None or (isinstance(value, list) and set(map(str, value)) <= set(entry["elements"])):
                continue
        elif normalize_value(value, n_layers) in entry.get("values", []):
            continue
        shown = json.dumps(value)
        out.append(f"{key}={shown if len(shown) <= 60 else shown[:57] + '...'}")
    return out


def domain_of(pattern: Pattern, text: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """(validated domain, borrowed) for this pattern: its own; for a hand-written pattern, the domain the
    generator validated it on (its model_type's generated file); else that file's domain, borrowed."""
    if pattern.validated is not None:
        return pattern.validated, False
    borrowed: dict[str, Any] | None = None
    for model_type in (text.get("model_type"), *pattern.model_types):
        try:
            found = _generated_for(model_type)
        except PatternError:
            found = None
        if found is None:
            continue
        if found.handwritten_domain is not None and found.handwritten_domain[0] == pattern.name:
            return found.handwritten_domain[1], False
        if borrowed is None and found.validated is not None:
            borrowed = found.validated
    return borrowed, borrowed is not None


def fit_to_config(pattern: Pattern, config: dict[str, Any], text: dict[str, Any]) -> tuple[Pattern, list[str]]:
    """The pattern to lint this config with, and notes. Inside coverage: the pattern itself. Outside: the
    exact modules transformers' model class writes for the config (built on the meta device) when
    transformers is installed, else the pattern marked unvalidated (its WC410/WC501 findings become
    warnings): never an error the pattern cannot stand behind."""
    import os

    from weightcheck.lightclass import replace

    if pattern.borrowed_by is not None:  # checked against the text model's class only: the wrapper's is unknown
        return pattern, [
            f"model_type {pattern.borrowed_by!r} has no pattern of its own: its language model is checked with "
            f"{pattern.name!r} (its text_config's), under the root the checkpoint uses; missing weights and "
            "shape mismatches are reported as warnings, not errors"
        ]
    if pattern.task_class is not None and pattern.unvalidated:  # a task class the table does not know (no oracle)
        return pattern, [f"{pattern.unvalidated[-1]}: missing weights and shape mismatches are reported as "
                         "warnings, not errors"]  # fmt: skip
    # A task class the table knows is a transformers class: outside coverage, the oracle builds that class.
    domain, borrowed = domain_of(pattern, text)
    if not domain:
        return pattern, []
    outside = outside_coverage(domain, text, borrowed=borrowed)
    if not outside:
        return pattern, []
    note = (f"config outside what pattern {pattern.name!r} was validated on ({', '.join(outside[:6])}"
            f"{', ...' if len(outside) > 6 else ''})")  # fmt: skip
    from weightcheck.deps import installed

    if os.environ.get(ORACLE_ENV, "1") != "0" and installed("transformers") and installed("torch"):
        from weightcheck.arch.oracle import OracleError

        try:
            exact = oracle_expected(pattern, config)
        except OracleError as exc:
            note += f"; transformers could not build the model class for it ({exc})"
        else:
            return replace(pattern, exact=exact), [
                note + ": expected names and shapes built from transformers' model class on the meta device"
            ]
    note += ": missing weights and shape mismatches the pattern predicts are reported as warnings, not errors"
    return replace(pattern, unvalidated=tuple(outside)), [note]


def oracle_expected(pattern: Pattern, config: dict[str, Any]) -> list[ExpectedModule]:
    """The modules transformers' class writes for `config`, with the pattern's kinds (routers, experts,
    engine facts) where the pattern names the module, else the kind of the instantiated class."""
    from weightcheck.arch.oracle import expected_tensors
    from weightcheck.names import split_expert_module, under_prefix

    shapes, kinds = expected_tensors(config, pattern.task_class)
    allowed = tuple(pattern.allowed_prefixes)
    specs: dict[str, ModuleSpec] = {}
    for section in (pattern.layer, pattern.moe_layer, pattern.dense_layer, pattern.mtp_layer, pattern.globals):
        for spec in section:
            specs.setdefault(spec.name, spec)
    modules: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        if allowed and name.startswith(allowed):
            continue
        module, _, param = name.rpartition(".")
        modules.setdefault(module, {})[param] = shape
    out: list[ExpectedModule] = []
    for module, params in sorted(modules.items()):
        layer = expert = None
        template = module
        in_layer = under_prefix(module, pattern.layer_prefix)
        if in_layer:
            layer, template = int(in_layer[0]), in_layer[1]
            e = split_expert_module(template)
            if e:
                expert = int(e[1])
                template = f"{e[0]}.*" + (f".{e[2]}" if e[2] else "")
        base = specs.get(template)
        weight = params.get("weight")
        spec = ModuleSpec(
            name=template,
            kind=base.kind if base is not None else kinds.get(module, "other"),
            shape=tuple(str(d) for d in weight) if weight is not None else (),
            params=tuple(sorted(params)),
            quantized_by=base.quantized_by if base is not None else (),
            dtype=base.dtype if base is not None else None,
        )
        out.append(ExpectedModule(module, spec, layer, expert, weight, tuple(sorted(params)), ()))
    return out
