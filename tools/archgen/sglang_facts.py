"""The SGLang half of the generated architecture knowledge: what SGLang's model class for each generated
architecture declares, read from the installed SGLang's model sources (`sglang/srt/models/*.py`).

Per architecture: the SGLang class (the `EntryClass` of the module that defines it, as `ModelRegistry`
registers it), `packed_modules_mapping` (fused modules whose shards an ignore list may name),
`stacked_params_mapping` (checkpoint shard names → fused parameters in `load_weights`), whether it builds
expert parameter mappings, and how each router (`self.gate` / `self.router`) is built: with the quant
config (a `*Linear` given `quant_config=quant_config`, so the engine quantizes it unless ignored) or
without it (`quant_config=None`, never quantized by the engine).

Read statically (ast), so generating it does not import 200 model modules; the SGLang group's test
checks the registry agrees (every class named here is in `ModelRegistry`).

For MoE architectures, `routed_experts` says which routed-expert checkpoint layouts the class really reads:
found by running its `load_weights` on CPU (tools.archgen.sglang_probe), not by reading its source.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from tools.archgen.generate import GENERATED_DIR, dump

_ROUTER_ATTRS = ("gate", "router")


def _models_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "srt" / "models"


def _entry_classes(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            value = node.value
            elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return [e.id for e in elts if isinstance(e, ast.Name)]
    return []


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _class_facts(tree: ast.Module, cls_name: str, classes: dict[str, ast.ClassDef]) -> dict[str, Any]:
    cls = classes.get(cls_name)
    facts: dict[str, Any] = {"packed_modules_mapping": None, "stacked_params_mapping": None,
                             "expert_params_mapping": False}  # fmt: skip
    seen: set[str] = set()
    while cls is not None and cls.name not in seen:  # the class, then bases defined in the same module
        seen.add(cls.name)
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    name = target.id if isinstance(target, ast.Name) else None
                    if name == "packed_modules_mapping" and facts["packed_modules_mapping"] is None:
                        facts["packed_modules_mapping"] = _literal(node.value)
                    if name == "stacked_params_mapping" and facts["stacked_params_mapping"] is None:
                        value = _literal(node.value)
                        if isinstance(value, list):
                            facts["stacked_params_mapping"] = [list(v) for v in value if isinstance(v, tuple)]
            if isinstance(node, ast.Call) and "expert_params_mapping" in ast.unparse(node.func):
                facts["expert_params_mapping"] = True
            if isinstance(node, ast.Name) and node.id == "expert_params_mapping":
                facts["expert_params_mapping"] = True
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        cls = next((classes[b] for b in bases if b in classes), None)
    return facts


def _routers(tree: ast.Module) -> dict[str, str]:
    """`self.gate = X(..., quant_config=Y)` anywhere in the module: how routers are built."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        for target in node.targets:
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and target.attr in _ROUTER_ATTRS):  # fmt: skip
                continue
            ctor = ast.unparse(node.value.func)
            kw = next((k for k in node.value.keywords if k.arg == "quant_config"), None)
            if kw is None or (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                how = "none"
            elif isinstance(kw.value, ast.Name) and kw.value.id == "quant_config" and ctor.endswith("Linear"):
                how = "quant_config"
            else:
                how = f"conditional: {ast.unparse(kw.value)}"
            previous = out.get(target.attr)
            out[target.attr] = how if previous in (None, how) else f"{previous}; {how}"
    return out


def _probe(model_type: str, layer_prefix: str, sglang_class: str) -> dict[str, Any]:
    from tools.archgen.sglang_probe import probe

    try:
        return probe(model_type, layer_prefix, sglang_class)
    except Exception as exc:  # recorded, so a class that stops building shows up as stale data
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        # set reprs in messages follow hash randomization: sort their items so the data is reproducible
        first = re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m[1].split(", "))) + "}", first)
        return {"probe_error": f"{type(exc).__name__}: {first}"}


def generate_sglang(index_path: Path = GENERATED_DIR / "index.json") -> dict[str, str]:
    from importlib.metadata import version

    index = json.loads(index_path.read_text())
    models = _models_dir()
    by_class: dict[str, tuple[str, ast.Module, dict[str, ast.ClassDef]]] = {}
    for file in sorted(models.glob("*.py")):
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        for name in _entry_classes(tree):
            by_class.setdefault(name, (file.name, tree, classes))
    out: dict[str, Any] = {"sglang": version("sglang"), "model_types": {}}
    for model_type, file in sorted(index["model_types"].items()):
        doc = json.loads((index_path.parent / file).read_text())
        archs = doc["family"]["architectures"]
        hit = next((a for a in archs if a in by_class), None)
        if hit is None:
            out["model_types"][model_type] = {"sglang_class": None}
            continue
        module_file, tree, classes = by_class[hit]
        facts = {"sglang_class": hit, "module": f"sglang/srt/models/{module_file}"}
        facts.update(_class_facts(tree, hit, classes))
        facts["routers"] = _routers(tree)
        if doc["family"].get("experts"):
            facts["routed_experts"] = _probe(model_type, doc["family"]["layer_prefix"], hit)
        out["model_types"][model_type] = facts
    return registry_files(out, index_path.parent)


def registry_files(out: dict[str, Any], generated_dir: Path) -> dict[str, str]:
    """One file per architecture: each model_type's facts go into patterns/generated/sglang/<model_type>.json
    as its `registry` half (with the SGLang version they were read from), next to the source facts
    (tools.archgen.engine_sources, which keeps this half when it rewrites the file)."""
    files: dict[str, str] = {}
    for model_type, facts in out["model_types"].items():
        path = generated_dir / "sglang" / f"{model_type}.json"
        fresh = {"sglang": out["sglang"], "model_type": model_type, "sglang_class": facts.get("sglang_class")}
        doc = json.loads(path.read_text()) if path.is_file() else fresh
        doc["registry"] = {"sglang": out["sglang"], **facts}
        files[f"sglang/{model_type}.json"] = dump(doc)
    return files


def registry_doc(generated_dir: Path) -> dict[str, Any]:
    """The registry halves of every per-architecture SGLang file, as {"sglang": version, "model_types":
    {model_type: facts}} (the README's covered list is built from it)."""
    out: dict[str, Any] = {"sglang": None, "model_types": {}}
    for path in sorted((generated_dir / "sglang").glob("*.json")):
        registry = json.loads(path.read_text()).get("registry")
        if isinstance(registry, dict):
            facts = dict(registry)
            out["sglang"] = facts.pop("sglang", out["sglang"])
            out["model_types"][path.stem] = facts
    return out


def sglang_source_files(index_path: Path = GENERATED_DIR / "index.json") -> dict[str, str]:
    """patterns/generated/sglang/<model_type>.json from the installed SGLang's model sources (ast only):
    which modules each class builds unquantized, its fused groups, name mappers and load_weights rewrites
    (tools.archgen.engine_sources)."""
    from importlib.metadata import version

    from tools.archgen.engine_sources import generate_sglang_sources

    return generate_sglang_sources(_models_dir(), version("sglang"), index_path)
