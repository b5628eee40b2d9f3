"""Engine facts read statically (ast) from an inference engine's model sources: SGLang's
`sglang/srt/models/*.py` and vLLM's `vllm/model_executor/models/*.py`, plus the producer side (transformers'
`modeling_<type>.py`: which modules are `nn.Linear`, so a compressed-tensors `Linear` target quantizes them).

Per architecture, for the engine class that serves it:
- `unquantized`: attributes the engine builds as a linear layer WITHOUT the quant config (`quant_config=None`,
  no `quant_config` at all, or a plain `nn.Linear`) in every place the class's sources build that attribute
  (the entry module and the engine model modules it imports, transitively). Those modules are never
  quantized by the engine whatever the checkpoint's ignore list says, so a checkpoint that stores them
  quantized cannot be loaded: the quantized companions have no parameter to go to. An attribute built both
  ways (a conditional `quant_config`, or quantized in one class and not in another) is in `mixed`, never
  in `unquantized`: nothing is claimed that the source does not say in every place.
- `fused`: every fused group (`packed_modules_mapping`, and `stacked_params_mapping` in `load_weights`).
- `weights_mapper`: the class's `hf_to_vllm_mapper` / `hf_to_sglang_mapper` (`WeightsMapper` prefixes,
  substrings and suffixes the engine rewrites in checkpoint names, and in ignore lists, before matching).
- `load_weights`: name substrings its `load_weights` skips (`if "x" in name: continue`) and the
  `name.replace(a, b)` rewrites it applies.
- `config_reads`: the config attributes the entry module reads (which layers the engine builds, and how,
  follows from these: `first_k_dense_replace`, `mlp_only_layers`, `decoder_sparse_step`, ...).

Read with ast so generating needs neither engine installed (a wheel's unzipped sources suffice) nor a GPU;
nothing here runs at lint time: lint reads the generated JSON.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Constructors that are linear layers in the engines (nn.Linear, ReplicatedLinear, ColumnParallelLinear,
# RowParallelLinear, QKVParallelLinear, MergedColumnParallelLinear, GateLinear, ...). LM heads are
# embeddings-like (ParallelLMHead) and left to WC310.
_LINEAR_SUFFIX = "Linear"
# Helper modules of the models folders (weight loaders, interface mixins, vision helpers shared by every VLM):
# following their imports would pull half the folder into every architecture's closure.
_NOT_BUILDING_BLOCKS = frozenset({"utils", "interfaces", "interfaces_base", "module_mapping", "vision", "registry",
                                  "adapters", "transformers", "config"})  # fmt: skip
# LinearBase subclasses take quant_config as their 6th positional parameter (input, output, bias,
# skip_bias_add, params_dtype, quant_config): more positionals than that may pass it unnamed.
_MAX_POSITIONAL_WITHOUT_QUANT = 5


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


class Sources:
    """The model modules of one engine (or transformers), parsed once."""

    def __init__(self, models_dir: Path, package: str) -> None:
        self.dir = models_dir
        self.package = package  # e.g. "sglang.srt.models": imports from it are followed
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            self._trees[module] = _parse(self.dir / f"{module}.py")
        return self._trees[module]

    def modules(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.py"))

    def imports(self, module: str) -> list[str]:
        """Engine model modules `module` imports from (absolute `package.x` or relative `.x`)."""
        tree = self.tree(module)
        out: list[str] = []
        if tree is None:
            return out
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            name = None
            if node.level == 1:
                name = node.module.split(".")[0]
            elif node.level == 0 and node.module.startswith(self.package + "."):
                name = node.module[len(self.package) + 1 :].split(".")[0]
            imports_class = any(a.name[:1].isupper() for a in node.names)
            if (name and name != module and name not in _NOT_BUILDING_BLOCKS and imports_class
                    and (self.dir / f"{name}.py").is_file()):  # fmt: skip
                out.append(name)
        return sorted(set(out))

    def closure(self, module: str) -> list[str]:
        """`module` and every engine model module it imports, transitively (its building blocks: SGLang's
        Qwen3-Next takes Qwen2-MoE's sparse block, Llama-4's VLM class takes the Llama-4 text class)."""
        seen = [module]
        todo = [module]
        while todo:
            for dep in self.imports(todo.pop()):
                if dep not in seen:
                    seen.append(dep)
                    todo.append(dep)
        return sorted(seen)

    def classes(self, modules: Iterable[str]) -> dict[str, ast.ClassDef]:
        out: dict[str, ast.ClassDef] = {}
        for m in modules:
            tree = self.tree(m)
            if tree is not None:
                for n in tree.body:
                    if isinstance(n, ast.ClassDef):
                        out.setdefault(n.name, n)
        return out


def _self_attr(target: ast.AST) -> str | None:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


def _calls(value: ast.AST) -> list[ast.Call] | None:
    """The constructor call(s) an assignment may take (both arms of `A(...) if c else B(...)`); None when
    the value is something else (a name, a helper's result: unknown)."""
    if isinstance(value, ast.Call):
        return [value]
    if isinstance(value, ast.IfExp):
        a, b = _calls(value.body), _calls(value.orelse)
        if isinstance(value.orelse, ast.Constant) and value.orelse.value is None:
            return a
        if isinstance(value.body, ast.Constant) and value.body.value is None:
            return b
        return None if a is None or b is None else a + b
    return None


def how_built(call: ast.Call) -> str:
    """'none' (a linear layer built without the quant config), 'quant' (with the quant config), or
    'other: ...' (not a linear layer, or a quant config that depends on something)."""
    ctor = ast.unparse(call.func)
    leaf = ctor.rsplit(".", 1)[-1]
    if not leaf.endswith(_LINEAR_SUFFIX):
        return f"other: {ctor}"
    if leaf == "Linear":  # torch.nn.Linear: engines never quantize it
        return "none"
    if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return f"other: {ctor}(**...)"
    kw = next((k for k in call.keywords if k.arg == "quant_config"), None)
    if kw is None:
        return "none" if len(call.args) <= _MAX_POSITIONAL_WITHOUT_QUANT else f"other: {ctor}(positional)"
    if isinstance(kw.value, ast.Constant) and kw.value.value is None:
        return "none"
    if isinstance(kw.value, ast.Name) and kw.value.id == "quant_config":
        return "quant"
    return f"other: quant_config={ast.unparse(kw.value)}"


def attribute_builds(trees: Iterable[ast.Module]) -> dict[str, set[str]]:
    """attribute name -> how every `self.<attr> = ...` in these modules builds it."""
    out: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                attr = _self_attr(target)
                if attr is None or (isinstance(value, ast.Constant) and value.value is None):
                    continue
                calls = _calls(value)
                hows = {how_built(c) for c in calls} if calls is not None else {f"other: {ast.unparse(value)[:60]}"}
                out.setdefault(attr, set()).update(hows)
    return out


def unquantized_and_mixed(builds: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """Attributes built unquantized everywhere, and attributes built unquantized somewhere but not
    everywhere (reported as unknown, never as unquantized)."""
    unquant = sorted(a for a, hows in builds.items() if hows == {"none"})
    mixed = sorted(a for a, hows in builds.items() if "none" in hows and hows != {"none"})
    return unquant, mixed


def _class_chain(cls_name: str, classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    chain: list[ast.ClassDef] = []
    cls = classes.get(cls_name)
    while cls is not None and cls not in chain:
        chain.append(cls)
        bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b).rsplit(".", 1)[-1] for b in cls.bases]
        cls = next((classes[b] for b in bases if b in classes), None)
    return chain


def fused_groups(chain: list[ast.ClassDef]) -> dict[str, list[str]]:
    """packed_modules_mapping and stacked_params_mapping of the class (first definition along its bases)."""
    packed: dict[str, list[str]] | None = None
    stacked: dict[str, list[str]] = {}
    for cls in chain:
        for node in ast.walk(cls):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id if isinstance(t, ast.Name) else _self_attr(t) for t in targets}
            value = _literal(node.value) if node.value is not None else None
            if "packed_modules_mapping" in names and packed is None and isinstance(value, dict):
                packed = {str(k): [str(s) for s in v] for k, v in value.items() if isinstance(v, (list, tuple))}
            if "stacked_params_mapping" in names and not stacked and isinstance(value, list):
                for item in value:
                    if isinstance(item, tuple) and len(item) >= 2 and all(isinstance(s, str) for s in item[:2]):
                        fused, shard = item[0].strip("."), item[1].strip(".")
                        stacked.setdefault(fused, [])
                        if shard not in stacked[fused]:
                            stacked[fused].append(shard)
    out = dict(packed or {})
    for fused, shards in stacked.items():
        out.setdefault(fused, shards)
    return {k: out[k] for k in sorted(out)}


def weights_mapper(chain: list[ast.ClassDef]) -> dict[str, Any] | None:
    """`hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={...}, ...)` (or SGLang's hf_to_sglang_mapper)."""
    for cls in chain:
        for node in cls.body:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if not any(n.startswith("hf_to_") and n.endswith("_mapper") for n in names):
                continue
            out: dict[str, Any] = {}
            for kw in node.value.keywords:
                if kw.arg is None:
                    continue
                value = _literal(kw.value)
                out[kw.arg] = value if value is not None else f"<not a literal: {ast.unparse(kw.value)[:80]}>"
            return out
    return None


def load_weights_rewrites(chain: list[ast.ClassDef]) -> dict[str, list[str]]:
    """What `load_weights` does to checkpoint names before matching: substrings it skips
    (`if "rotary_emb.inv_freq" in name: continue`) and literal `name.replace(a, b)` rewrites."""
    skips: list[str] = []
    renames: list[str] = []
    for cls in chain:
        fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "load_weights"), None)
        if fn is None:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.If) and any(isinstance(s, ast.Continue) for s in node.body):
                for cmp in ast.walk(node.test):
                    if (isinstance(cmp, ast.Compare) and isinstance(cmp.left, ast.Constant)
                            and isinstance(cmp.left.value, str) and isinstance(cmp.ops[0], ast.In)):  # fmt: skip
                        skips.append(cmp.left.value)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                    and len(node.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                                    for a in node.args)):  # fmt: skip
                renames.append(f"{node.args[0].value} -> {node.args[1].value}")  # type: ignore[attr-defined]
        break  # the first load_weights along the bases is the one that runs
    return {"skips": sorted(set(skips)), "renames": sorted(set(renames))}


def config_reads(tree: ast.Module | None) -> list[str]:
    """`config.X`, `self.config.X` and `getattr(config, "X", ...)` in the module."""
    out: set[str] = set()
    if tree is None:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            base = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
            if base in ("config", "text_config", "hf_config", "hf_text_config"):
                out.add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):  # fmt: skip
            base_node = node.args[0]
            base = base_node.id if isinstance(base_node, ast.Name) else getattr(base_node, "attr", "")
            if base in ("config", "text_config", "hf_config", "hf_text_config"):
                out.add(node.args[1].value)
    return sorted(a for a in out if not a.startswith("_"))


def class_facts(src: Sources, module: str, cls_name: str, rel_prefix: str) -> dict[str, Any]:
    """Everything above for one engine class defined in `module`."""
    closure = src.closure(module)
    trees = [t for t in (src.tree(m) for m in closure) if t is not None]
    classes = src.classes([module, *[m for m in closure if m != module]])
    chain = _class_chain(cls_name, classes)
    unquant, mixed = unquantized_and_mixed(attribute_builds(trees))
    return {
        "module": f"{rel_prefix}/{module}.py",
        "sources": [f"{rel_prefix}/{m}.py" for m in closure],
        "unquantized": unquant,
        "mixed": mixed,
        "fused": fused_groups(chain),
        "weights_mapper": weights_mapper(chain),
        "load_weights": load_weights_rewrites(chain),
        "config_reads": config_reads(src.tree(module)),
    }


# ---- vLLM ---------------------------------------------------------------------------------------------


def vllm_registry(src: Sources) -> dict[str, tuple[str, str]]:
    """architecture -> (module, class) from vLLM's models/registry.py (`_..._MODELS = {...}` literals)."""
    tree = src.tree("registry")
    out: dict[str, tuple[str, str]] = {}
    if tree is None:
        return out
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target: ast.AST | None = node.target
        else:
            target = node.targets[0] if isinstance(node, ast.Assign) else None
        if not (isinstance(target, ast.Name) and target.id.endswith("_MODELS") and isinstance(node.value, ast.Dict)):
            continue
        for k, v in zip(node.value.keys, node.value.values, strict=True):
            key, val = _literal(k) if k is not None else None, _literal(v)
            if isinstance(key, str) and isinstance(val, tuple) and len(val) == 2:
                out.setdefault(key, (str(val[0]), str(val[1])))
    return out


def generate_vllm(models_dir: Path, version: str, index_path: Path) -> dict[str, str]:
    """patterns/generated/vllm/<model_type>.json for every generated model_type (vLLM sources unzipped from
    the pinned wheel; `models_dir` is its vllm/model_executor/models)."""
    from tools.archgen.generate import dump

    src = Sources(models_dir, "vllm.model_executor.models")
    registry = vllm_registry(src)
    index = json.loads(index_path.read_text())
    files: dict[str, str] = {}
    for model_type, file in sorted(index["model_types"].items()):
        archs = json.loads((index_path.parent / file).read_text())["family"]["architectures"]
        hit = next((a for a in archs if a in registry), None)
        doc: dict[str, Any] = {"vllm": version, "model_type": model_type, "vllm_class": None}
        if hit is not None:
            module, cls = registry[hit]
            doc["vllm_class"] = cls
            doc["architecture"] = hit
            doc.update(class_facts(src, module, cls, "vllm/model_executor/models"))
        files[f"vllm/{model_type}.json"] = dump(doc)
    return files


# ---- the producer side: transformers' module classes ----------------------------------------------


def _is_linear_class(name: str, classes: dict[str, ast.ClassDef], seen: frozenset[str] = frozenset()) -> bool:
    if name in ("Linear", "nn.Linear", "torch.nn.Linear"):
        return True
    cls = classes.get(name.rsplit(".", 1)[-1])
    if cls is None or cls.name in seen:
        return False
    return any(_is_linear_class(ast.unparse(b), classes, seen | {cls.name}) for b in cls.bases)


def transformers_linear_attributes(modeling: Path) -> dict[str, str]:
    """attribute -> class, for attributes a transformers modeling file builds as an `nn.Linear` or a
    subclass of it (Llama-4's `Llama4Router(nn.Linear)`) in every place it builds them: exactly the
    modules compressed-tensors' `Linear` target matches (it walks the class's MRO)."""
    tree = _parse(modeling)
    if tree is None:
        return {}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    builds: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        attr = _self_attr(node.targets[0])
        if attr is None or (isinstance(node.value, ast.Constant) and node.value.value is None):
            continue
        calls = _calls(node.value)
        ctors = {ast.unparse(c.func) for c in calls} if calls else {"?"}
        builds.setdefault(attr, set()).update(ctors)
    out = {}
    for attr, ctors in sorted(builds.items()):
        if all(_is_linear_class(c, classes) for c in ctors):
            out[attr] = " | ".join(sorted(c.rsplit(".", 1)[-1] for c in ctors))
    return out


# ---- SGLang ---------------------------------------------------------------------------------------------


def sglang_entry_classes(src: Sources) -> dict[str, str]:
    """class -> module for every `EntryClass` of SGLang's models folder (what ModelRegistry registers)."""
    out: dict[str, str] = {}
    for module in src.modules():
        tree = src.tree(module)
        if tree is None:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
            ):
                value = node.value
                elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                for e in elts:
                    if isinstance(e, ast.Name):
                        out.setdefault(e.id, module)
    return out


def generate_sglang_sources(models_dir: Path, version: str, index_path: Path) -> dict[str, str]:
    """patterns/generated/sglang/<model_type>.json: the source facts above for SGLang's class of each
    generated model_type (the class its `registry` half names: the first of the type's architectures SGLang has)."""
    from tools.archgen.generate import dump

    src = Sources(models_dir, "sglang.srt.models")
    entries = sglang_entry_classes(src)
    index = json.loads(index_path.read_text())
    files: dict[str, str] = {}
    for model_type, file in sorted(index["model_types"].items()):
        archs = json.loads((index_path.parent / file).read_text())["family"]["architectures"]
        hit = next((a for a in archs if a in entries), None)
        doc: dict[str, Any] = {"sglang": version, "model_type": model_type, "sglang_class": hit}
        if hit is not None:
            doc.update(class_facts(src, entries[hit], hit, "sglang/srt/models"))
        # the other SGLang half in the same per-architecture file, from the installed SGLang (`--sglang`,
        # tools.archgen.sglang_facts): kept as it is
        existing = index_path.parent / "sglang" / f"{model_type}.json"
        registry = json.loads(existing.read_text()).get("registry") if existing.is_file() else None
        if registry is not None:
            doc["registry"] = registry
        files[f"sglang/{model_type}.json"] = dump(doc)
    return files


# ---- transformers (the producer's module classes) ----------------------------------------------------


def generate_producer_linear(index_path: Path) -> dict[str, str]:
    """patterns/generated/producer/transformers_linear.json: per generated model_type, the router/other-kind
    modules of its pattern whose transformers attribute is an `nn.Linear` (subclass), read from the
    installed transformers' modeling file. A compressed-tensors `Linear` target quantizes exactly those on
    top of the pattern's `linear` modules (Qwen3-Next's `shared_expert_gate`, Llama-4's `router`), while
    routers built as a plain nn.Module with a weight (Mixtral's, DeepSeek's TopK routers) are left alone."""
    import importlib.util
    from importlib.metadata import version

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    from tools.archgen.generate import dump

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("transformers is not installed")
    root = Path(next(iter(spec.submodule_search_locations))) / "models"
    index = json.loads(index_path.read_text())
    out: dict[str, Any] = {"transformers": version("transformers"), "model_types": {}}
    for model_type, file in sorted(index["model_types"].items()):
        doc = json.loads((index_path.parent / file).read_text())
        leaves: set[str] = set()
        for section, specs in doc.items():
            if section in ("family", "defaults", "provenance") or not isinstance(specs, dict):
                continue
            for name, mspec in specs.items():
                if isinstance(mspec, dict) and mspec.get("kind") in ("router", "other"):
                    leaves.add(name.rsplit(".", 1)[-1])
        folder = model_type_to_module_name(model_type)  # llama4_text -> llama4, ...
        modeling = root / folder / f"modeling_{folder}.py"
        linear = transformers_linear_attributes(modeling) if modeling.is_file() else {}
        hits = {leaf: linear[leaf] for leaf in sorted(leaves) if leaf in linear}
        if hits:
            out["model_types"][model_type] = hits
    return {"producer/transformers_linear.json": dump(out)}
