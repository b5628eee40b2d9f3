"""Derive architecture patterns from the real definitions: transformers (and SGLang where installed).

For each architecture, a tiny model is built from its own config class in two variants of dimensions (A,
B), saved with transformers' `save_pretrained` (so names are what the real writer puts on disk, after its
key conversions), and read back header-only. From the two:

- the language-model layer container and the module templates of its layers, with expert indices as `*`;
- each module's kind from the instantiated module class (Embedding, *Norm, Linear, a router: the MoE
  block's gate/router whatever its class, i.e. a 2-D weight whose rows are the experts; fused 3-D expert
  parameters as kind `experts`);
- weight shapes as expressions over config keys, kept only when the expression reproduces the shape in
  both variants (else the shape is left out: WC501 does not guess);
- which layers carry a module (hybrid attention, dense-then-MoE), as an expression over the config kept
  only when it reproduces the layer sets of both variants (else the module is marked optional);
- vision towers and projectors as allowed prefixes.

Run `python scripts/generate_patterns.py` (writes `patterns/generated/`); `--check` compares instead.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.archgen.tiny import EXPERT_KEYS, build
from weightcheck.names import split_expert, split_layer

# Decoder architectures transformers provides and SGLang 0.5.23 registers (by their transformers
# architecture class; the SGLang group's test checks each against SGLang's ModelRegistry).
ARCHITECTURES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "gemma", "gemma2",
    "gemma3_text", "gemma3", "deepseek_v2", "deepseek_v3", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "gpt_oss",
    "llama4_text", "granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "olmo", "olmo2", "olmo3",
    "olmoe", "phi", "phi3", "phimoe", "starcoder2", "stablelm", "cohere", "cohere2", "exaone4", "ernie4_5",
    "ernie4_5_moe", "hunyuan_v1_dense", "hunyuan_v1_moe", "minicpm3", "jamba", "bamba", "nemotron",
    "persimmon", "seed_oss", "smollm3", "arcee", "apertus", "lfm2", "minimax_m2",
    "qwen3_5", "qwen3_5_moe", "ministral", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    "glm4v", "glm4v_moe", "mllama", "gpt_neox", "llama4", "nemotron_h", "kimi_linear", "falcon_h1",
)  # fmt: skip

# Provided by transformers and registered by SGLang, but not generated: why, recorded in index.json's
# `skipped` and listed in the README next to the covered ones.
SKIPPED: dict[str, str] = {
    "dbrx": "layers are `transformer.blocks.N` (not `.layers.N`), dimensions live in `attn_config`/`ffn_config` "
    "sub-configs under their own names (d_model, n_layers, ffn_hidden_size), and experts are 2-D "
    "`ffn.experts.mlp.w1/v1/w2` [num_experts * ffn_hidden_size, d_model] concatenations: neither the "
    "generator's layer model nor lint's expert model reads that layout; lint infers what it can (WC427)",
}

GENERATED_DIR = Path(__file__).resolve().parent.parent.parent / "patterns" / "generated"
_ROUTER_LEAVES = ("gate", "router", "gate_network", "wg")


@dataclass
class Observation:
    """One variant: what save_pretrained wrote, the config as lint reads it, and module classes."""

    config: dict[str, Any]  # the merged text config (as Checkpoint.text_config() builds it)
    top: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    classes: dict[str, str]  # on-disk module name -> class name of the module that owns it
    linear: set[str] = field(default_factory=set)
    embedding: set[str] = field(default_factory=set)
    tied: list[list[str]] = field(default_factory=list)
    skipped_on_load: list[str] = field(default_factory=list)  # the class's _keys_to_ignore_on_load_unexpected


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    from weightcheck.checkpoint import text_config_of

    return text_config_of(cfg)


def observe(model_type: str, variant: str) -> Observation:
    import torch
    from safetensors import safe_open

    model = build(model_type, variant)
    modules = dict(model.named_modules())
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, max_shard_size="10MB")
        top = json.loads((Path(tmp) / "config.json").read_text())
        shapes: dict[str, tuple[int, ...]] = {}
        for file in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as fh:
                for key in fh.keys():
                    shapes[key] = tuple(fh.get_slice(key).get_shape())
    obs = Observation(config=_text_config(top), top=top, shapes=shapes, classes={})
    for name in shapes:
        module_name = name.rsplit(".", 1)[0]
        owner = _owner(module_name, modules)
        if owner is not None:
            obs.classes[module_name] = type(owner).__name__
            if isinstance(owner, torch.nn.Linear):
                obs.linear.add(module_name)
            elif isinstance(owner, torch.nn.Embedding):
                obs.embedding.add(module_name)
    obs.skipped_on_load = [str(p) for p in (getattr(type(model), "_keys_to_ignore_on_load_unexpected", None) or [])]
    tied = getattr(model, "_tied_weights_keys", None)
    if isinstance(tied, dict):
        obs.tied = [[k, v] for k, v in sorted(tied.items())]
    return obs


# `^` or `(^|\.)`, then a literal name with escaped dots containing `mtp`, then an optional `\.` and `.*`
_NAME = r"(?:[A-Za-z0-9_]|\\\.)"
_MTP_PREFIX = re.compile(rf"^(?:\^|\(\^\|\\\.\))?(?P<lit>{_NAME}*mtp{_NAME}*?)(?:\\\.)?(?:\.\*)?$")


def mtp_prefixes(skipped_on_load: list[str]) -> list[str]:
    """Name prefixes of the MTP/NextN weights a release ships and transformers skips on load, from the model
    class's own `_keys_to_ignore_on_load_unexpected` (Qwen3-Next `^mtp.*`, MiMo `^model\\.mtp\\.`). Only
    patterns that are a literal prefix are taken; layer-number forms (`model\\.layers\\.61.*`, the
    full-size model's index) say nothing about a checkpoint of another depth and stay in the provenance."""
    out = []
    for pattern in skipped_on_load:
        m = _MTP_PREFIX.match(pattern)
        if m is None or m["lit"] == pattern:  # a bare `mtp` (ERNIE) is searched anywhere: not a prefix
            continue
        lit = m["lit"].replace("\\.", ".").rstrip(".")
        if lit.split(".")[-1] != "mtp":  # `mtp_layers`, `mtp_block`: other layouts, left to the provenance
            continue
        out.append(lit + ".")
    return sorted(set(out))


def _owner(module_name: str, modules: dict[str, Any]) -> Any:
    """The in-memory module behind an on-disk module name (per-expert names map to the fused experts)."""
    if module_name in modules:
        return modules[module_name]
    got = split_expert(module_name + ".")
    if got:
        return modules.get(got[0])
    return None


# ---- expressions ----------------------------------------------------------------------------------


# Config keys that only carry values the weights do not depend on (token ids, epsilons, rope settings...):
# never a name a shape or layer condition may use, and not probed by validate_domain. Matched by substring.
# A key wrongly listed here would be caught by the conformance oracle (tests/test_arch_oracle.py), which
# varies every key the model reads.
VALUE_ONLY = (
    "token_id", "eps", "dropout", "initializer_range", "rope", "max_position_embeddings", "use_cache",
    "output_", "return_dict", "dtype", "aux_loss", "scaling_factor", "sliding_window", "architectures",
    "model_type", "transformers_version", "tie_word_embeddings", "norm_topk", "router_jitter", "logit",
    "_implementation", "chunk_size_feed_forward", "problem_type", "temperature", "pretraining_tp",
    "init_", "_std", "hidden_act", "activation", "torchscript", "_name_or_path", "use_bidirectional",
)  # fmt: skip

# Names a layer condition may be keyed on: layer-placement switches (a key merely <= the layer count, such as
# bos_token_id or conv_kernel, matched the three variants by coincidence: issue #18).
_LAYER_KEY_HINTS = (
    "layer", "moe", "expert", "dense", "interval", "period", "offset", "step", "freq", "replace", "type",
    "block", "pattern", "sparse", "nextn", "every", "start", "end",
)  # fmt: skip


def value_only(key: str) -> bool:
    return any(h in key for h in VALUE_ONLY)


def _int_vars(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Config keys whose value the variants change (the only names a derived expression may use)."""
    out = []
    for k, va in a.items():
        vb = b.get(k)
        if value_only(k):
            continue
        if (isinstance(va, int) and isinstance(vb, int) and not isinstance(va, bool) and not isinstance(vb, bool)
                and va > 0 and vb > 0 and va != vb):  # fmt: skip
            out.append(k)
    pref = ("hidden_size", "intermediate_size", "vocab_size", "head_dim", "num_attention_heads",
            "num_key_value_heads", "moe_intermediate_size", *EXPERT_KEYS)  # fmt: skip
    return sorted(out, key=lambda k: (pref.index(k) if k in pref else len(pref), k))


def _candidates(keys: list[str], a: dict[str, Any], b: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(value in A, value in B) -> the simplest expression producing both."""
    table: dict[tuple[int, int], str] = {}

    def put(expr: str, va: int, vb: int) -> None:
        table.setdefault((va, vb), expr)

    for k in keys:
        put(k, a[k], b[k])
    for k in keys:
        for c in (2, 3, 4):
            put(f"{c} * {k}", c * a[k], c * b[k])
        if a[k] % 2 == 0 and b[k] % 2 == 0:
            put(f"{k} // 2", a[k] // 2, b[k] // 2)
    for k1, k2 in itertools.combinations_with_replacement(keys, 2):
        put(f"{k1} * {k2}", a[k1] * a[k2], b[k1] * b[k2])
    for k1, k2 in itertools.combinations(keys, 2):
        put(f"{k1} + {k2}", a[k1] + a[k2], b[k1] + b[k2])
        if a[k2] and b[k2] and a[k1] % a[k2] == 0 and b[k1] % b[k2] == 0:
            put(f"{k1} // {k2}", a[k1] // a[k2], b[k1] // b[k2])
    for k1, k2 in itertools.combinations_with_replacement(keys, 2):
        put(f"2 * {k1} * {k2}", 2 * a[k1] * a[k2], 2 * b[k1] * b[k2])
    for k1, k2, k3 in itertools.permutations(keys, 3):  # kv heads * (hidden // heads): head_dim not stored
        if a[k2] % a[k3] == 0 and b[k2] % b[k3] == 0:
            put(f"{k1} * ({k2} // {k3})", a[k1] * (a[k2] // a[k3]), b[k1] * (b[k2] // b[k3]))
    for k1 in keys:
        for k2, k3 in itertools.combinations(keys, 2):
            put(f"{k1} * ({k2} + {k3})", a[k1] * (a[k2] + a[k3]), b[k1] * (b[k2] + b[k3]))
        for k2 in keys:
            for k3 in keys:
                if len({k1, k2, k3}) == 3 and k2 < k3:
                    continue
                put(f"{k1} * {k2} + {k3}", a[k1] * a[k2] + a[k3], b[k1] * b[k2] + b[k3])
    return table


def _when_candidates(cfg: dict[str, Any], n_layers: int, reads: set[str] | None = None) -> list[str]:
    out: list[str] = []
    for k, v in sorted(cfg.items()):
        if value_only(k) or not any(h in k for h in _LAYER_KEY_HINTS):
            continue
        if reads is not None and k not in reads:  # a key the model never reads cannot place its modules
            continue
        if isinstance(v, list) and len(v) == n_layers and all(isinstance(x, (str, int, bool)) for x in v):
            for value in dict.fromkeys(v):
                out.append(f"{k}[layer] == {json.dumps(value)}")
        elif isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            out += [f"layer in {k}", f"layer not in {k}"]
        elif isinstance(v, int) and not isinstance(v, bool) and 0 < v <= n_layers + 1:
            out += [f"layer >= {k}", f"layer < {k}", f"(layer + 1) % {k} == 0"]
            out += [f"layer % {k} == {j}" for j in range(v)]
    return out


def _layers_where(expr: str, cfg: dict[str, Any], n: int) -> frozenset[int] | None:
    from weightcheck.patterns import evaluate

    try:
        return frozenset(i for i in range(n) if evaluate(expr, {**cfg, "layer": i}))
    except Exception:  # a candidate over a config value of the wrong type
        return None


# ---- derivation -----------------------------------------------------------------------------------


def _split(shapes: dict[str, tuple[int, ...]], text_layers: int) -> tuple[str, dict[int, dict[str, tuple]]]:
    """The language-model layer container (layer count == text num_hidden_layers) and per-layer tails."""
    by_prefix: dict[str, dict[int, dict[str, tuple]]] = {}
    for name, shape in shapes.items():
        split = split_layer(name)
        if split:
            by_prefix.setdefault(split[0], {}).setdefault(split[1], {})[split[2]] = shape
    fits = [p for p, layers in by_prefix.items() if len(layers) == text_layers and not _is_vision(p)]
    if not fits:
        raise ValueError(f"no layer container with {text_layers} layers among {sorted(by_prefix)}")
    prefix = max(fits, key=lambda p: sum(len(t) for t in by_prefix[p].values()))
    return prefix, by_prefix[prefix]


_VISION_HINTS = ("visual", "vision", "image", "audio", "projector", "mm_", "patch", "merger")


def _is_vision(name: str) -> bool:
    return any(h in name for h in _VISION_HINTS)


def _template(rest: str) -> tuple[str, int | None]:
    got = split_expert(rest)
    if not got:
        return rest, None
    return f"{got[0]}.*.{got[2]}", int(got[1])


def _kind(module: str, obs: Observation, shape: tuple[int, ...] | None, n_experts: int | None, per_expert: bool) -> str:
    leaf = module.rsplit(".", 1)[-1]
    cls = obs.classes.get(module, "")
    if per_expert:
        return "linear"
    if module in obs.embedding or "Embedding" in cls:
        return "embedding"
    if "Norm" in cls or "norm" in leaf.lower() or leaf.startswith("ln"):
        return "norm"
    if "Conv" in cls or "conv" in leaf.lower():
        return "conv"
    if leaf == "shared_expert_gate" or leaf.endswith("shared_expert_gate"):
        return "router"
    parent = module.rsplit(".", 2)[-2] if module.count(".") else ""
    if shape is not None and len(shape) == 2 and n_experts and shape[0] == n_experts and (
        leaf in _ROUTER_LEAVES or parent in _ROUTER_LEAVES or "Router" in cls or "Gate" in cls or "TopK" in cls
    ):  # the MoE block's gate/router whatever its class (GraniteMoE: `router.layer`, a Linear)
        return "router"
    if module in obs.linear:
        return "linear"
    if leaf == "experts":
        return "experts"
    if shape is not None and len(shape) == 2:
        return "linear" if "lm_head" in module or "proj" in leaf else "other"
    return "other"


def _output_heads(obs: Observation) -> set[str]:
    """On-disk module names of the output embedding, from the model's `_tied_weights_keys`. save_pretrained
    may rename the head (transformers 5 loads GPT-NeoX's `embed_out` as `lm_head` and saves it back), so a
    tied key not on disk is found as the other stored tensor of its embedding's shape outside the embedding's
    own tree."""
    heads: set[str] = set()
    for key, target in obs.tied:
        if key in obs.shapes:
            heads.add(key.rsplit(".", 1)[0])
            continue
        shape, tree = obs.shapes.get(target), target.split(".", 1)[0]
        for name, s in obs.shapes.items():
            if shape and s == shape and name != target and name.endswith(".weight") and name.split(".")[0] != tree:
                heads.add(name.rsplit(".", 1)[0])
    return heads


def derive(model_type: str) -> dict[str, Any]:
    a, b, c = observe(model_type, "A"), observe(model_type, "B"), observe(model_type, "C")
    la, lb, lc = (o.config["num_hidden_layers"] for o in (a, b, c))
    prefix, layers_a = _split(a.shapes, la)
    prefix_b, layers_b = _split(b.shapes, lb)
    prefix_c, layers_c = _split(c.shapes, lc)
    if not prefix == prefix_b == prefix_c:
        raise ValueError(f"layer container differs between variants: {prefix} vs {prefix_b}")
    root = prefix.rsplit(".", 1)[0]
    keys = _int_vars(a.config, b.config)
    table = _candidates(keys, a.config, b.config)
    inferred: list[str] = []

    expert_key = None
    counts: dict[str, tuple[int, int]] = {}
    for which, layers in (("A", layers_a), ("B", layers_b)):
        ids = {e for tails in layers.values() for r in tails if (e := _template(r)[1]) is not None}
        fused = [s[0] for tails in layers.values() for r, s in tails.items() if _template(r)[1] is None and len(s) == 3]
        n = (max(ids) + 1) if ids else (fused[0] if fused else None)
        counts[which] = n  # type: ignore[assignment]
    if counts["A"]:
        for k in EXPERT_KEYS:
            if a.config.get(k) == counts["A"] and b.config.get(k) == counts["B"]:
                expert_key = k
                break
        if expert_key is None and any(_template(r)[1] is not None for t in layers_a.values() for r in t):
            raise ValueError(f"no config key holds the expert count {counts}")
    stacked = set()  # modules holding 3-D parameters whose leading dim is the expert count
    if expert_key:
        for tails in layers_a.values():
            for r, s in tails.items():
                if len(s) == 3 and s[0] == a.config[expert_key] and _template(r)[1] is None:
                    stacked.add(r.rpartition(".")[0])

    def shape_expr(sa: tuple[int, ...], sb: tuple[int, ...], sc: tuple[int, ...] | None) -> list[str] | None:
        """Derived from A and B, kept only when it also gives C's shape."""
        from weightcheck.patterns import evaluate

        if sc is None or not len(sa) == len(sb) == len(sc):
            return None
        out = []
        for va, vb, vc in zip(sa, sb, sc, strict=True):
            if va == vb == vc == 1:
                out.append("1")
                continue
            expr = table.get((va, vb))
            try:
                if expr is None or evaluate(expr, c.config) != vc:
                    return None
            except Exception:
                return None
            out.append(expr)
        return out

    # ---- layer modules
    def modules_of(layers: dict[int, dict[str, tuple]]) -> dict[str, dict[str, Any]]:
        mods: dict[str, dict[str, Any]] = {}
        for idx, tails in sorted(layers.items()):
            for rest, shape in tails.items():
                tmpl, expert = _template(rest)
                module, _, param = tmpl.rpartition(".")
                entry = mods.setdefault(module, {"layers": set(), "params": {}, "expert": expert is not None})
                entry["layers"].add(idx)
                entry["params"].setdefault(param, {})[idx] = shape
        return mods

    mods_a, mods_b, mods_c = modules_of(layers_a), modules_of(layers_b), modules_of(layers_c)
    layer_specs: dict[str, dict[str, Any]] = {}
    from tools.archgen.tiny import tiny_config

    whens = _when_candidates(a.config, la, traced_reads(tiny_config(model_type, "A")))
    for module in sorted(set(mods_a) | set(mods_b)):
        ea, eb = mods_a.get(module), mods_b.get(module)
        if ea is None or eb is None:
            inferred.append(f"{module}: present in one variant only; optional")
            layer_specs[module] = {"kind": "other", "optional": True}
            continue
        spec: dict[str, Any] = {}
        full = f"{prefix}.0.{module}"
        sample_a = next(iter(ea["params"].get("weight", {}).values()), None)
        spec["kind"] = _kind(full.replace("*", "0"), a, sample_a, counts["A"], ea["expert"])
        if module in stacked:
            spec["kind"] = "experts"
        if spec["kind"] in ("other", "linear") and not ea["expert"] and module not in stacked:
            # classes are recorded per concrete name: look up the module in any layer that has it
            idx = min(ea["layers"])
            sample = next(iter(ea["params"].get("weight", {}).values()), None)
            spec["kind"] = _kind(f"{prefix}.{idx}.{module}", a, sample, counts["A"], False)
        params = sorted(set(ea["params"]) & set(eb["params"]))
        if params != ["weight"]:
            required = [p for p in params if set(ea["params"][p]) == ea["layers"]]
            spec["params"] = required + [f"{p}?" for p in params if p not in required]
        # bias as its own param entry is fine; shapes of `weight` when derivable and layer-independent
        ec = mods_c.get(module)
        wa, wb = ea["params"].get("weight"), eb["params"].get("weight")
        wc = ec["params"].get("weight") if ec else None
        if wa and wb and wc and all(len(set(w.values())) == 1 for w in (wa, wb, wc)):
            expr = shape_expr(next(iter(wa.values())), next(iter(wb.values())), next(iter(wc.values())))
            if expr is not None:
                spec["shape"] = expr
            else:
                inferred.append(f"{module}: weight shape not expressible over the config; not checked")
        if ea["layers"] != set(range(la)) or eb["layers"] != set(range(lb)):
            when = next((w for w in whens if _layers_where(w, a.config, la) == frozenset(ea["layers"])
                         and _layers_where(w, b.config, lb) == frozenset(eb["layers"])
                         and ec is not None and _layers_where(w, c.config, lc) == frozenset(ec["layers"])),
                        None)  # fmt: skip
            if when is None:
                spec["optional"] = True
                inferred.append(f"{module}: layers {sorted(ea['layers'])} of {la}: no config expression; optional")
            else:
                spec["when"] = when
        layer_specs[module] = spec

    # ---- globals and vision prefixes
    globals_: dict[str, dict[str, Any]] = {}
    allowed: set[str] = set()
    heads = _output_heads(a)
    for name in sorted(set(a.shapes) & set(b.shapes) & set(c.shapes)):
        if name.startswith(prefix + "."):
            continue
        module, _, param = name.rpartition(".")
        leaf = module.rsplit(".", 1)[-1]
        # the head sits beside the text root (`lm_head`, `language_model.lm_head`, GPT-NeoX `embed_out`)
        is_head = (leaf == "lm_head" or module in heads) and module.count(".") <= root.count(".")
        in_text = name.startswith(root + ".") or is_head
        if not in_text or _is_vision(module):
            parts = name.split(".")
            allowed.add(".".join(parts[: 2 if parts[0] == "model" and len(parts) > 2 else 1]) + ".")
            continue
        spec = globals_.setdefault(module, {"kind": _kind(module, a, a.shapes.get(f"{module}.weight"), None, False),
                                            "params": []})  # fmt: skip
        spec["params"].append(param)
        if param == "weight":
            expr = shape_expr(a.shapes[name], b.shapes[name], c.shapes[name])
            if expr is not None:
                spec["shape"] = expr
        if is_head:
            spec["when"] = "not tie_word_embeddings"
            if spec["kind"] == "other":  # an nn.Linear in memory, renamed on save (GPT-NeoX lm_head -> embed_out)
                spec["kind"] = "linear"
    for spec in globals_.values():
        if spec["params"] == ["weight"]:
            del spec["params"]
    for module in set(a.shapes) ^ set(b.shapes):
        if not module.startswith(prefix + "."):
            inferred.append(f"{module}: stored in one variant only")

    text_type = a.config.get("model_type")
    family: dict[str, Any] = {
        "name": f"gen_{model_type}",
        "description": f"generated from transformers {_version('transformers')} "
        f"({', '.join(a.top.get('architectures') or [])})",
        "model_types": [model_type],
        "architectures": list(a.top.get("architectures") or []),
        "layer_prefix": prefix,
    }
    if expert_key:
        family["experts"] = expert_key
    mtp = mtp_prefixes(a.skipped_on_load)
    allowed |= set(mtp)
    if allowed:
        family["allowed_prefixes"] = sorted(allowed)
    doc: dict[str, Any] = {
        "family": family,
        "defaults": {"tie_word_embeddings": False},
        "globals": globals_,
        "layer": layer_specs,
        "provenance": {
            "generator": "scripts/generate_patterns.py",
            "transformers": _version("transformers"),
            "text_model_type": text_type,
            "notes": sorted(set(inferred)),
            "tied_weights": a.tied,
            **({"skipped_on_load": a.skipped_on_load} if a.skipped_on_load else {}),
            **({"mtp_prefixes": mtp} if mtp else {}),
        },
    }
    fit_switches(model_type, doc, [a, b, c])
    doc["provenance"]["class_defaults"] = class_defaults(model_type, doc)
    aliases = config_aliases(model_type)
    if aliases:
        doc["provenance"]["aliases"] = aliases
    doc["provenance"]["validated"] = validate_domain(model_type, doc, [a, b, c])
    # A hand-written pattern for the same model_type is laid over this file at lint time: the overlay is
    # validated on the same probes, so its own coverage is known too (weightcheck.patterns.domain_of).
    from weightcheck.patterns import _handwritten_doc, builtin_patterns, overlay_doc, parse_pattern

    for hand in builtin_patterns().values():
        if model_type in hand.model_types:
            overlay = parse_pattern(overlay_doc(doc, _handwritten_doc(hand.path)), hand.path)
            doc["provenance"]["validated_handwritten"] = {
                "pattern": hand.name, "domain": validate_domain(model_type, overlay, [a, b, c])}  # fmt: skip
            break
    return doc


# ---- validated domain ------------------------------------------------------------------------------


def traced_reads(config: Any) -> set[str]:
    """Config attribute names the model class reads while it is built (on the meta device): the keys that
    can decide what it writes. transformers' configs resolve `attribute_map` aliases in __getattribute__,
    which is where the reads are recorded."""
    from transformers.configuration_utils import PreTrainedConfig

    from weightcheck.arch.oracle import meta_model

    reads: set[str] = set()
    original = PreTrainedConfig.__getattribute__

    def spy(self: Any, key: str) -> Any:
        reads.add(key)
        aliases = original(self, "attribute_map")
        if key in aliases:
            reads.add(aliases[key])
        return original(self, key)

    PreTrainedConfig.__getattribute__ = spy  # type: ignore[method-assign]
    try:
        meta_model(config)
    finally:
        PreTrainedConfig.__getattribute__ = original  # type: ignore[method-assign]
    return reads


def _sub_config(value: Any) -> bool:
    """A nested model config (vision tower, audio): not the language model's switches."""
    return isinstance(value, dict) and "model_type" in value


def _probe_values(key: str, value: Any, n_layers: int, elements: list[str]) -> list[Any]:
    """Other values of a config key to try (issue #18: flags flipped, counts and steps changed, optional
    ranks switched off, per-layer lists re-mixed)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        # `q_lora_rank: null` (DeepSeek-V2-Lite) switches a sub-module off: optional ranks are probed with null.
        # Downwards too (value - 1, and 0): an end index at the last layer (ERNIE-4.5-MoE's
        # moe_layer_end_index, resolved to num_hidden_layers - 1) changes nothing when raised, only lowered
        # (issue #18). A value the config class or the model rejects is skipped by the callers.
        down = [v for v in (value - 1, 0) if v >= 0 and v not in (value, value + 1, 2 * value + 3)]
        return [value + 1, 2 * value + 3, *dict.fromkeys(down), *([None] if "rank" in key or "lora" in key else [])]
    if isinstance(value, float):
        return [value * 2 + 0.5]
    if value is None:
        return [8, 16]
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return [[], list(range(n_layers)), list(range(1, n_layers, 2))]
    if isinstance(value, list) and elements and all(isinstance(x, str) for x in value) and len(value) == n_layers:
        mixes = [[elements[i % len(elements)] for i in range(n_layers)]]
        mixes.append(list(reversed(mixes[0])))
        return [m for m in mixes if m != value]
    return []


def _with(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(config))
    sub = out.get("text_config")
    if isinstance(sub, dict) and (key in sub or key not in out):
        sub[key] = value
    else:
        out[key] = value
    return out


def validate_domain(model_type: str, doc: dict[str, Any] | Any, observations: list[Observation]) -> dict[str, Any]:
    """For every config key the model reads (value-only keys aside), the values the pattern `doc` was found
    right for, by building transformers' class for them on the meta device and comparing (oracle
    `conformance`). A key whose probed values change nothing written is left out; an int key whose probes
    all conform is `any_int`; otherwise only the conforming values are recorded, and lint treats any other
    value as outside coverage (weightcheck.patterns.fit_to_config)."""
    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.conformance import conformance
    from weightcheck.arch.oracle import build_config, expected_tensors, full_config_dict
    from weightcheck.patterns import normalize_value, parse_pattern

    pattern = parse_pattern(doc, f"{model_type}.json") if isinstance(doc, dict) else doc
    base_cfg = tiny_config(model_type, "A")
    # read at A or B: a hybrid's attention layer may exist at one depth only (Kimi Linear's MLA at B)
    reads = traced_reads(base_cfg) | traced_reads(tiny_config(model_type, "B"))
    full = full_config_dict(base_cfg)
    text = _text_config(full)
    n_layers = int(text["num_hidden_layers"])
    base_shapes, _ = expected_tensors(full)
    # Probes are checked at a second size too (B: other head and layer counts), so a fit that only holds at
    # A's sizes (StableLM's per-head QK norms, a hybrid's attention layer A happens not to have) fails.
    full_b = full_config_dict(tiny_config(model_type, "B"))
    base_shapes_b, _ = expected_tensors(full_b)
    cls_default = _text_config(full_config_dict(type(base_cfg)()))
    domain: dict[str, Any] = {}
    for key in sorted(reads & set(text)):
        value = text[key]
        if value_only(key) or _sub_config(value) or key == "num_hidden_layers":
            continue
        seen = [o.config.get(key, cls_default.get(key)) for o in observations]
        varied_int = all(isinstance(v, int) and not isinstance(v, bool) for v in seen) and len(set(seen)) > 1
        if varied_int:  # a dimension the A/B/C variants vary: its expressions were fitted over it ...
            if "rank" in key or "lora" in key:  # ... except switching it off (`q_lora_rank: null`), at A and B
                for probe_base in (full, full_b):
                    try:
                        cfg = full_config_dict(build_config(_with(probe_base, key, None)))
                        shapes, _ = expected_tensors(cfg)
                    except Exception:
                        continue
                    if conformance(pattern, cfg, shapes):
                        domain[key] = {"default_raw": cls_default.get(key), "any_int": True, "values": [],
                                       "base": []}  # fmt: skip
            continue
        elements = sorted({x for v in seen if isinstance(v, list) for x in v if isinstance(x, str)})
        changed = conforming = tried = int_tried = 0
        good: list[Any] = []
        for probe in _probe_values(key, value, n_layers, elements):
            try:
                cfg = full_config_dict(build_config(_with(full, key, probe)))
                shapes, _ = expected_tensors(cfg)
            except Exception:  # the config class rejects the value: nothing learned
                continue
            tried += 1
            int_tried += isinstance(probe, int) and not isinstance(probe, bool)
            ok = not conformance(pattern, cfg, shapes)
            differs = shapes != base_shapes
            if not isinstance(probe, list):
                try:
                    cfg_b = full_config_dict(build_config(_with(full_b, key, probe)))
                    shapes_b, _ = expected_tensors(cfg_b)
                except Exception:
                    pass
                else:
                    differs = differs or shapes_b != base_shapes_b
                    ok = ok and not conformance(pattern, cfg_b, shapes_b)
            if differs:
                changed += 1
            if ok:
                conforming += 1
                good.append(probe)
        if tried and not changed:
            continue  # nothing it was set to changed what is written: not structural
        entry: dict[str, Any] = {"default_raw": cls_default.get(key)}
        ints = [g for g in good if isinstance(g, int) and not isinstance(g, bool)]
        if isinstance(value, (int, type(None))) and not isinstance(value, bool) and len(ints) == int_tried >= 2:
            entry["any_int"] = True
        if elements and isinstance(value, list) and all(isinstance(x, str) for x in value) and tried == conforming:
            entry["elements"] = elements
        int_list = isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
        if int_list and tried >= 2 and tried == conforming:
            # a layer list (Llama-4's moe_layers) whose probes (none, all, every other layer) all conform: the
            # pattern places layers by membership, so any list of layer numbers is inside coverage
            entry["any_layer_list"] = True
        values = {normalize_value(v, o.config.get("num_hidden_layers"))
                  for v, o in zip(seen, observations, strict=True)}  # fmt: skip
        entry["base"] = sorted(values)  # the generated variants' own values: what hand-written patterns may use
        values |= {normalize_value(g, n_layers) for g in good}
        entry["values"] = sorted(values)
        domain[key] = entry
    # Keys the model reads only when config.json carries them (a getattr with a fallback: Phi-MoE's attention
    # reads `head_dim`, which its config class does not declare, so microsoft/Phi-tiny-MoE-instruct's
    # head_dim 128 != hidden_size / heads gave false WC501 errors). Each is probed with a value its fallback
    # would not give; where the pattern is wrong for it, a config that sets the key is outside coverage.
    for key in sorted(reads - set(text) - _FRAMEWORK_READS):
        if key.startswith("_") or value_only(key):
            continue
        heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
        probe = 2 * (hidden // heads) if isinstance(heads, int) and isinstance(hidden, int) and heads else 16
        try:
            cfg = full_config_dict(build_config(_with(full, key, probe)))
            shapes, _ = expected_tensors(cfg)
        except Exception:  # the class rejects it: nothing learned
            continue
        if shapes != base_shapes and conformance(pattern, cfg, shapes):
            domain[key] = {"absent_only": True}
    for key in sorted(_placement_keys(pattern) & reads & set(text)):
        flags = _class_rewrites(key, full, full_b)
        if flags:
            entry = domain.setdefault(key, {"default_raw": cls_default.get(key), "any_int": True, "values": [],
                                            "base": []})  # fmt: skip
            entry.update(flags)
    if any(isinstance(text.get(k), dict) for k in domain):
        # an opaque structured key (Kimi Linear's `linear_attn_config` lists layer numbers) was only seen with
        # the variants' depths: other depths are outside coverage
        domain["num_hidden_layers"] = {"default_raw": cls_default.get("num_hidden_layers"),
                                       "values": sorted({json.dumps(o.config["num_hidden_layers"])
                                                         for o in observations})}  # fmt: skip
    return domain


def _placement_keys(pattern: Any) -> set[str]:
    """Config keys the pattern's layer conditions name (which layers hold which modules)."""
    from weightcheck.patterns import expr_names

    exprs = [pattern.moe_layers] + [spec.when for section in (pattern.layer, pattern.dense_layer,
                                                               pattern.moe_layer, pattern.mtp_layer)
                                    for spec in section]  # fmt: skip
    return {n for e in exprs if isinstance(e, str) for n in expr_names(e)} - {"layer"}


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    out = json.loads(json.dumps(config))
    for table in (out, out.get("text_config")):
        if isinstance(table, dict):
            table.pop(key, None)
    return out


def _class_rewrites(key: str, full: dict[str, Any], full_b: dict[str, Any]) -> dict[str, Any]:
    """How the config class rewrites a layer-placement key at load, which lint (reading config.json as text)
    cannot: `derived` when, left out, its value follows other keys (ERNIE-4.5-MoE's moe_layer_end_index is
    num_hidden_layers - 1 at A and at B); `rewritten` the sentinel values it replaces (-1: "to the last
    layer"). Such a config is outside coverage (weightcheck.patterns.outside_coverage), never linted with a
    condition evaluated on the raw value."""
    from weightcheck.arch.oracle import build_config, full_config_dict

    flags: dict[str, Any] = {}
    try:
        at_a = _text_config(full_config_dict(build_config(_without(full, key)))).get(key)
        at_b = _text_config(full_config_dict(build_config(_without(full_b, key)))).get(key)
    except Exception:
        at_a = at_b = None
    if at_a != at_b:
        flags["derived"] = True
    try:
        got = _text_config(full_config_dict(build_config(_with(full, key, -1)))).get(key)
    except Exception:  # the class rejects -1: a config holding it cannot be built, nothing to cover
        got = -1
    if got != -1:
        flags["rewritten"] = [-1]
    return flags


# ---- fitting over structural switches ---------------------------------------------------------------
# The A/B/C variants differ only in dimensions. Flags (`attention_bias`, `mlp_bias`, `use_qk_norm`), optional
# ranks set to null (`q_lora_rank`: q_proj instead of q_a_proj/q_b_proj/q_a_layernorm) and counts left at
# their default (`n_shared_experts`: shared-expert width) are fitted here: each is probed on the meta device,
# and a condition or shape factor is added only when the result then conforms on the probe and on every
# config that conformed before. What still does not conform stays outside the validated domain.

_PROBLEM = re.compile(r"^(?P<what>missing|unexpected) (?P<name>\S+)$")
_SHAPE_PROBLEM = re.compile(r"^shape (?P<name>\S+): pattern \[(?P<want>[^\]]*)\], model \[(?P<got>[^\]]*)\]$")


def _switch(key: str, base: Any, probe: Any) -> tuple[str, str] | None:
    """(condition true for the probe, condition true for the base) over one config key, or None."""
    if isinstance(base, bool) and isinstance(probe, bool):
        return (key, f"not {key}") if probe else (f"not {key}", key)
    if probe is None and base is not None:
        return f"{key} == None", f"{key} != None"
    return None


def _and(a: str | None, b: str) -> str:
    return b if not a else f"({a}) and ({b})"


def _spec_for(doc: dict[str, Any], name: str, prefix: str) -> tuple[dict[str, Any], str, str | None]:
    """(section table, key in it, expert-free template) for a tensor's module."""
    module = name.rsplit(".", 1)[0]
    split = split_layer(name)
    if split and split[0] == prefix:
        template, _ = _template(split[2])
        return doc["layer"], template.rsplit(".", 1)[0], str(split[1])
    return doc["globals"], module, None


def _fix(doc: dict[str, Any], key: str, base: Any, probe: Any, cfg: dict[str, Any],
         shapes: dict[str, tuple[int, ...]], kinds: dict[str, str], problems: list[str]) -> None:  # fmt: skip
    from weightcheck.patterns import evaluate

    prefix = doc["family"]["layer_prefix"]
    switch = _switch(key, base, probe)
    text = _text_config(cfg)
    touched: set[tuple[int, str]] = set()
    for problem in problems:
        shape = _SHAPE_PROBLEM.match(problem)
        if shape:  # a width that is a multiple of the probed count (shared experts x n_shared_experts)
            table, module, _ = _spec_for(doc, shape["name"], prefix)
            spec = table.get(module)
            got = [int(x) for x in shape["got"].split(",")]
            if spec is None or "shape" not in spec or len(spec["shape"]) != len(got):
                continue
            for i, expr in enumerate(spec["shape"]):
                for cand in (f"{expr} * {key}", f"({expr}) * {key}"):
                    try:
                        if evaluate(cand, {**text, "layer": 0}) == got[i] and cand != expr:
                            spec["shape"][i] = cand
                            break
                    except Exception:
                        continue
            continue
        m = _PROBLEM.match(problem)
        if m is None or switch is None:
            continue
        on, off = switch
        table, module, _ = _spec_for(doc, m["name"], prefix)
        param = m["name"].rsplit(".", 1)[1]
        if (id(table), module) in touched:
            continue
        spec = table.get(module)
        if m["what"] == "unexpected" and spec is not None and param == "bias" and not spec.get("bias"):
            spec["bias"] = on
            spec["params"] = [p for p in spec.get("params", ["weight"]) if p.rstrip("?") != "bias"] or ["weight"]
            if spec["params"] == ["weight"]:
                del spec["params"]
        elif m["what"] == "missing" and spec is not None and param == "bias" and "bias" in spec.get("params", []):
            spec["bias"] = off
            spec["params"] = [p for p in spec["params"] if p != "bias"]
            if spec["params"] == ["weight"]:
                del spec["params"]
        elif m["what"] == "missing" and spec is not None and param == "weight":
            spec["when"] = _and(spec.get("when"), off)
        elif m["what"] == "unexpected" and spec is None:
            full = m["name"].rsplit(".", 1)[0]
            params = sorted({n.rsplit(".", 1)[1] for n in shapes if n.rsplit(".", 1)[0] == full})
            new: dict[str, Any] = {"kind": kinds.get(full, "other"), "when": on}
            if params != ["weight"]:
                new["params"] = params
            table[module] = new
        else:
            continue
        touched.add((id(table), module))


# ---- layer placement refitted over probes --------------------------------------------------------------
# `derive` keys a module's layers on one config key, chosen from three dimension variants in which every
# placement key sits at its default: ERNIE-4.5-MoE's `layer >= moe_layer_interval` held only because the
# interval and the start index are both 1. When a probe of a placement key moves modules between layers, the
# condition is searched again over every case seen so far (variants and conforming probes): conjunctions of
# up to three single-key conditions (or the negation of one, for the dense layers between MoE ones), the
# existing condition's parts tried first. The result is kept only if the whole pattern then conforms.

_MAX_CONJUNCTS = 3


def _conjuncts(expr: str) -> list[str]:
    import ast

    tree = ast.parse(expr, mode="eval").body
    if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And):
        return [ast.unparse(v) for v in tree.values]
    return [expr]


def _placement_atoms(text: dict[str, Any], n_layers: int, reads: set[str], existing: list[str]) -> list[str]:
    atoms = [c for e in existing for c in (e, *_conjuncts(e))]
    atoms += _when_candidates(text, n_layers, reads)
    for k, v in sorted(text.items()):  # inclusive bounds (`layer <= moe_layer_end_index`), 0 allowed
        if value_only(k) or not any(h in k for h in _LAYER_KEY_HINTS) or k not in reads:
            continue
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= n_layers + 1:
            atoms += [f"layer <= {k}", f"layer > {k}", f"layer >= {k}"]
    return list(dict.fromkeys(atoms))


def _mask(expr: str, env: dict[str, Any], n: int) -> int | None:
    from weightcheck.patterns import evaluate

    out = 0
    try:
        for i in range(n):
            if evaluate(expr, {**env, "layer": i}):
                out |= 1 << i
    except Exception:  # a candidate over a config value of the wrong type
        return None
    return out


def _fit_when(atoms: list[str], envs: list[tuple[dict[str, Any], int]], targets: list[int]) -> str | None:
    """The first conjunction of atoms (or its negation) giving `targets` (a layer bitmask per case); "" when
    every case holds the module on every layer; None when nothing fits."""
    fulls = [(1 << n) - 1 for _, n in envs]
    if targets == fulls:
        return ""
    masks: dict[str, list[int]] = {}
    for atom in atoms:
        got = [_mask(atom, env, n) for env, n in envs]
        if all(g is not None for g in got):
            masks[atom] = got  # type: ignore[assignment]
    usable = list(masks)
    for size in range(1, _MAX_CONJUNCTS + 1):
        for combo in itertools.combinations(usable, size):
            both = list(fulls)
            for atom in combo:
                both = [b & m for b, m in zip(both, masks[atom], strict=True)]
            text = combo[0] if size == 1 else " and ".join(f"({a})" for a in combo)
            if both == targets:
                return text
            if [f ^ b for f, b in zip(fulls, both, strict=True)] == targets:
                return f"not ({text})"
    return None


def _refit_placement(doc: dict[str, Any], cases: list[tuple[dict[str, Any], dict[str, tuple[int, ...]]]],
                     kinds: dict[str, str], defaults: dict[str, Any], reads: set[str], key: str) -> None:  # fmt: skip
    """Refit (in place) the `when` of every layer module whose layers the conditions no longer predict on
    `cases`; a module the last case writes and the pattern lacks is added with its fitted condition."""
    prefix = doc["family"]["layer_prefix"]
    envs: list[tuple[dict[str, Any], int]] = []
    layer_sets: list[dict[str, int]] = []
    params_of: dict[str, set[str]] = {}
    concrete: dict[str, str] = {}
    for cfg, shapes in cases:
        text = _text_config(cfg)
        env = {k: v for k, v in {**defaults, **text}.items() if not isinstance(v, dict)}
        envs.append((env, int(env["num_hidden_layers"])))
        sets: dict[str, int] = {}
        for name in shapes:
            split = split_layer(name)
            if split is None or split[0] != prefix:
                continue
            _, idx, rest = split
            tmpl, _ = _template(rest)
            module, _, param = tmpl.rpartition(".")
            sets[module] = sets.get(module, 0) | (1 << idx)
            params_of.setdefault(module, set()).add(param)
            concrete.setdefault(module, f"{prefix}.{idx}.{rest.rpartition('.')[0]}")
        layer_sets.append(sets)
    table = doc["layer"]
    for module in sorted(set(table) | {m for s in layer_sets for m in s}):
        spec = table.get(module)
        if spec is not None and spec.get("optional"):
            continue
        targets = [s.get(module, 0) for s in layer_sets]
        when = spec.get("when") if spec is not None else None
        predicted = [((1 << n) - 1) if not when else _mask(when, env, n) for env, n in envs]
        if spec is not None and predicted == targets:
            continue
        # conditions over the first variant's values and the probe's (`layer % k == j` for each j below k)
        atoms = [a for env, n in (envs[0], envs[-1]) for a in _placement_atoms(env, n, reads, [when] if when else [])]
        atoms = list(dict.fromkeys(atoms))
        fitted = _fit_when(atoms, envs, targets)
        if fitted is None:
            continue  # outside coverage: the conformance check rejects the trial
        if spec is None:
            params = sorted(params_of.get(module, {"weight"}))
            kind = "linear" if "*" in module.split(".") else kinds.get(concrete.get(module, ""), "other")
            spec = table[module] = {"kind": kind, **({"params": params} if params != ["weight"] else {})}
            doc["provenance"]["notes"] = sorted({*doc["provenance"].get("notes", []),
                                                 f"{module}: added from a probe of {key}; weight shape not derived"})
        if fitted:
            spec["when"] = fitted
        else:
            spec.pop("when", None)


def class_defaults(model_type: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The config class's default of every key the pattern's expressions name: save_pretrained leaves a key
    out of config.json when it equals the default, and lint must read it as that default (not as missing:
    `q_lora_rank == None` would be unknowable)."""
    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.oracle import full_config_dict
    from weightcheck.patterns import expr_names

    names: set[str] = set()
    switches: set[str] = set()  # names a `when` or `bias` reads: a derived key left out there is "assumed present"
    for table in (doc["globals"], doc["layer"]):
        for spec in table.values():
            switches.update(*(expr_names(e) for e in (spec.get("when"), spec.get("bias")) if isinstance(e, str)))
            names.update(*(expr_names(e) for e in spec.get("shape", []) if isinstance(e, str)))
    names |= switches
    top_config = type(tiny_config(model_type, "A"))()
    top = full_config_dict(top_config)
    default = _text_config(top)
    declared = _declared_defaults(type(top_config.get_text_config()))
    found = {k: default[k] for k in sorted(names) if k in default and not isinstance(default[k], dict)
             and k not in ("layer", "tie_word_embeddings")
             # A value the class derives from other keys (MiniCPM3's head_dim = qk_rope_head_dim, Nemotron's
             # head_dim = hidden_size // num_attention_heads) is not a default: read as one, a config.json that
             # leaves it out at other sizes gave false WC501 shape errors. Left out, the shape is not checked.
             and (k in switches or declared.get(k, _UNDECLARED) is not None)}  # fmt: skip
    # Whether lm_head is stored: transformers ties by `tie_word_embeddings` of the config of the model that owns
    # lm_head (the top-level class: a VLM's own default, not its text_config's), and a config.json that leaves
    # the key out means that class's default (True for Gemma, Cohere, StarCoder2, SmolLM3, LFM2, MiniCPM3...).
    # Read as the old fixed False, a clean google/gemma-2b-it checkpoint (no lm_head) failed with WC410.
    if isinstance(top.get("tie_word_embeddings"), bool):
        found["tie_word_embeddings"] = top["tie_word_embeddings"]
    return found


_UNDECLARED = object()

# What transformers' own machinery reads from every config while a model is built (plans, sub-configs, the
# generic expert-count probes of its MoE utilities): not the model's structural switches.
_FRAMEWORK_READS = frozenset({
    "auto_map", "base_model_ep_plan", "base_model_fsdp_plan", "base_model_pp_plan", "base_model_tp_plan",
    "decoder", "generator", "get_text_config", "gradient_checkpointing", "is_heterogeneous", "moe_num_experts",
    "n_routed_experts", "name_or_path", "num_experts", "num_local_experts", "quantization_config", "sub_configs",
    "text_config", "text_encoder", "to_dict", "vision_config", "audio_config",
})  # fmt: skip


def _declared_defaults(config_class: Any) -> dict[str, Any]:
    """The defaults a config class declares (dataclass fields, or its __init__'s keywords), before its
    post-init derives others: a key missing here or declared None and set afterwards is derived."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(config_class):
        return {f.name: f.default for f in dataclasses.fields(config_class) if f.default is not dataclasses.MISSING}
    params = inspect.signature(config_class.__init__).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def config_aliases(model_type: str) -> dict[str, str]:
    """The text config class's `attribute_map` (alias -> attribute): a config.json may spell a key either way
    (Qwen3-VL-30B-A3B's text_config says `num_experts`, the class's attribute is `num_local_experts`), and
    lint reads the pattern's names through it."""
    from tools.archgen.tiny import tiny_config

    mapping = getattr(type(tiny_config(model_type, "A").get_text_config()), "attribute_map", None) or {}
    return {str(k): str(v) for k, v in sorted(mapping.items()) if isinstance(k, str) and isinstance(v, str)}


def fit_switches(model_type: str, doc: dict[str, Any], observations: list[Observation]) -> None:
    """Refine `doc` in place over probed structural switches (see above)."""
    import copy

    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.conformance import conformance
    from weightcheck.arch.oracle import build_config, expected_tensors, full_config_dict
    from weightcheck.patterns import parse_pattern

    base_cfg = tiny_config(model_type, "A")
    # read at A or B: a hybrid's attention layer may exist at one depth only (Kimi Linear's MLA at B)
    reads = traced_reads(base_cfg) | traced_reads(tiny_config(model_type, "B"))
    full = full_config_dict(base_cfg)
    text = _text_config(full)
    n_layers = int(text["num_hidden_layers"])
    cls_default = _text_config(full_config_dict(type(base_cfg)()))
    cases: list[tuple[dict[str, Any], dict[str, tuple[int, ...]]]] = [(o.top, o.shapes) for o in observations]

    def conforms(d: dict[str, Any], more: list[tuple[dict[str, Any], dict[str, tuple[int, ...]]]]) -> bool:
        pattern = parse_pattern(d, f"{model_type}.json")
        return all(not conformance(pattern, c, s) for c, s in more)

    for key in sorted(reads & set(text)):
        value = text[key]
        if value_only(key) or _sub_config(value) or key == "num_hidden_layers":
            continue
        placement = any(h in key for h in _LAYER_KEY_HINTS)
        for probe in _probe_values(key, value, n_layers, []):
            if isinstance(probe, list) and not placement:
                continue  # a list that places no layers: outside coverage when it differs
            try:
                cfg = full_config_dict(build_config(_with(full, key, probe)))
                shapes, kinds = expected_tensors(cfg)
            except Exception:
                continue
            problems = conformance(parse_pattern(doc, f"{model_type}.json"), cfg, shapes)
            if not problems:
                cases.append((cfg, shapes))
                continue
            trials = []
            if not isinstance(probe, list):
                trial = copy.deepcopy(doc)
                _fix(trial, key, value, probe, cfg, shapes, kinds, problems)
                trials.append(trial)
            if placement and any(_PROBLEM.match(p) for p in problems):
                # which layers hold a module moved: refit its condition over every case so far (issue #18:
                # MoE placement by interval, start and end index; Llama-4's `moe_layers` list)
                trial = copy.deepcopy(doc)
                _refit_placement(trial, [*cases, (cfg, shapes)], kinds, cls_default, reads, key)
                trials.append(trial)
            for trial in trials:
                if trial != doc and conforms(trial, [*cases, (cfg, shapes)]):
                    doc.clear()
                    doc.update(trial)
                    cases.append((cfg, shapes))
                    break


def _version(pkg: str) -> str:
    from importlib.metadata import version

    return version(pkg)


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def generate(model_types: tuple[str, ...] = ARCHITECTURES, out: Path = GENERATED_DIR) -> dict[str, str]:
    """Derive every pattern; returns {file name: text} (index.json included). Failures raise."""
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    files: dict[str, str] = {}
    index: dict[str, Any] = {"transformers": _version("transformers"), "model_types": {}, "architectures": {}}
    failed: dict[str, str] = {}
    for mt in model_types:
        try:
            doc = derive(mt)
        except Exception as exc:  # reported in the index, so a new failure shows up as stale data
            failed[mt] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        name = f"{mt}.json"
        files[name] = dump(doc)
        index["model_types"][mt] = name
        for arch in doc["family"]["architectures"]:
            index["architectures"].setdefault(arch, name)
    index["failed"] = failed
    index["skipped"] = dict(sorted(SKIPPED.items()))
    files["index.json"] = dump(index)
    from tools.archgen.twins import TWIN_NAME, twin_text

    files[TWIN_NAME] = twin_text(out.parent)  # the hand-written TOMLs' parsed twin lives beside them
    return files


README_START, README_END = "<!-- generated: model types (scripts/generate_patterns.py) -->", "<!-- end generated -->"


def coverage_markdown(index: dict[str, Any], sglang: dict[str, Any]) -> str:
    """The README's list of covered model_types, from the generated index and the SGLang half."""
    facts = sglang.get("model_types", {})
    both = sorted(t for t in index["model_types"] if (facts.get(t) or {}).get("sglang_class"))
    only = sorted(t for t in index["model_types"] if t not in both)
    lines = [
        README_START,
        f"Generated from transformers {index.get('transformers')} and SGLang {sglang.get('sglang')}: "
        f"**{len(both)} model_types** that both provide: " + ", ".join(f"`{t}`" for t in both) + ".",
        "",
        "Also generated (transformers only; SGLang 0.5.23 registers no class of theirs): "
        + ", ".join(f"`{t}`" for t in only) + ".",
        "",
        "Not generated (both provide them; why: `patterns/generated/index.json` `skipped`): "
        + (", ".join(f"`{t}`" for t in sorted(index.get("skipped") or {})) or "none") + ".",
        README_END,
    ]
    return "\n".join(lines)


def readme_with_coverage(readme: str, index: dict[str, Any], sglang: dict[str, Any]) -> str:
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < 0:
        raise ValueError("README.md lacks the generated model-types markers")
    return readme[:start] + coverage_markdown(index, sglang) + readme[end + len(README_END) :]
