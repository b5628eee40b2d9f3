"""Imports go one way: the import graph of weightcheck/ has no cycle, and each module imports only modules of
its own or a lower layer (docs/architecture.md explains the layers).

The graph is built with `ast` from the source (nothing is imported), and counts every import: top-level,
inside a function (a lazy import is still a dependency), and under `if TYPE_CHECKING:` (a type-only
dependency still couples the two modules). `from weightcheck.x import y` is an edge to `weightcheck.x.y`
when that is a module, else to `weightcheck.x`. A package's `__init__` is its own node (`weightcheck.rules`);
importing `weightcheck.rules.quant` is not an edge to `weightcheck.rules`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "weightcheck"

# Bottom to top. A module belongs to the first layer with an entry that is the module or a package above it
# (longest entry wins). Same-layer imports are allowed (the no-cycle check keeps them one-way); an import of
# a higher layer fails. Keep in step with docs/architecture.md.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base: no knowledge of files or rules",
        (
            "weightcheck.version",
            "weightcheck.lightclass",
            "weightcheck.findings",
            "weightcheck.safe_io",
            "weightcheck.deps",
            "weightcheck.progress",
            "weightcheck.skiplist",
            "weightcheck.userpattern",
            "weightcheck.names",
            "weightcheck.structure",
            "weightcheck.precommit",
            "weightcheck.posmix",
            "weightcheck.tritonlaunch",
            "weightcheck.lazyregex",
            "weightcheck.gcpause",
            "weightcheck._onepass",  # compiled (COMPILED below)
            "weightcheck._lintfast",  # compiled (COMPILED below)
            "weightcheck.native",
            "weightcheck.patternexpr",
            "weightcheck.compare.ulp",
            "weightcheck.compare.metrics",
            "weightcheck.quant.safe_regex",
            "weightcheck.rules.fixtexts",
        ),
    ),
    (
        "formats and knowledge: read files, names, configs, architectures; compare and digest tensors",
        (
            "weightcheck.safetensors_header",
            "weightcheck.checkpoint",
            "weightcheck.tensors",
            "weightcheck.hub",
            "weightcheck.dequant",
            "weightcheck.bnb",
            "weightcheck.gptq",
            "weightcheck.collapse",
            "weightcheck.layout",
            "weightcheck.digest",
            "weightcheck.devdigest",
            "weightcheck.fuseddigest",
            "weightcheck.manifest",
            "weightcheck.quant",
            "weightcheck.patterns",
            "weightcheck.arch",
            "weightcheck.compare",
            "weightcheck.tap",
            "weightcheck.rollouts.loading",
            "weightcheck.rollouts.readers",
            "weightcheck.runlogs",
            "weightcheck.foreign",
        ),
    ),
    (
        "execution: the data-reading engines and their Ray backend (no rules)",
        (
            "weightcheck.distributed",
            "weightcheck.scan",
        ),
    ),
    (
        "rules: the registry, the rules, selection, suppression and settings",
        (
            "weightcheck.rules",
            "weightcheck.triage",
            "weightcheck.settings",
        ),
    ),
    (
        "commands' engines: one per command, each returning a Result",
        (
            "weightcheck.linting",
            "weightcheck.fixes",
            "weightcheck.diffing",
            "weightcheck.verifying",
            "weightcheck.rollouts",
            "weightcheck.checkup",
        ),
    ),
    (
        "Python API",
        ("weightcheck.api",),
    ),
    (
        "front ends and adapters: CLI, reporters, trainer/engine integrations",
        (
            "weightcheck",
            "weightcheck.__main__",
            "weightcheck.cli",
            "weightcheck.launch",
            "weightcheck.frontend",
            "weightcheck.commands",
            "weightcheck.reporters",
            "weightcheck.integrations",
        ),
    ),
]

SKIPPED: tuple[str, ...] = ()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            anchor = here[: len(here) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        if name != "weightcheck" and not name.startswith("weightcheck."):
            continue
        while name not in known and "." in name:  # `weightcheck.x.attr` → the module `weightcheck.x`
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


# Compiled modules (no .py file to parse): built by setup.py, importing nothing of ours.
COMPILED = {"weightcheck._onepass", "weightcheck._lintfast"}  # weightcheck/_native/*.c


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) | COMPILED
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_targets(node, name, path.name == "__init__.py", known))
        deps.discard(name)
        graph[name] = deps
    return graph


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (entry length, layer)
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return best[1] if best is not None else None


def _skipped(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in SKIPPED)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _graph_without_skipped() -> dict[str, set[str]]:
    graph = import_graph()
    return {m: {d for d in deps if not _skipped(d)} for m, deps in graph.items() if not _skipped(m)}


def test_no_import_cycle() -> None:
    assert find_cycles(_graph_without_skipped()) == []


def test_every_module_has_a_layer() -> None:
    assert [m for m in _modules() if layer_of(m) is None and not _skipped(m)] == []


def _short(layer: int) -> str:
    return LAYERS[layer][0].split(":")[0]


def test_imports_go_down_the_layers() -> None:
    upward = []
    for module, deps in sorted(_graph_without_skipped().items()):
        own = layer_of(module)
        assert own is not None, module
        for dep in sorted(deps):
            theirs = layer_of(dep)
            assert theirs is not None, dep
            if theirs > own:
                upward.append(f"{module} ({_short(own)}) imports {dep} ({_short(theirs)})")
    assert upward == []


# ---- the checker itself can fail -------------------------------------------------------------------------
def test_the_cycle_finder_finds_a_cycle_and_passes_a_chain() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("weightcheck.diff", "from weightcheck.rules.diff import SKIPPED", {"weightcheck.rules.diff"}),
        ("weightcheck.diffing", "def f():\n    from weightcheck import safe_io", {"weightcheck.safe_io"}),
        ("weightcheck.cli", "from weightcheck import __version__", {"weightcheck"}),
        ("weightcheck.rules.quant", "from . import LintContext", {"weightcheck.rules"}),
        ("weightcheck.reporters", "from .machine import emit_json", {"weightcheck.reporters.machine"}),
        ("weightcheck.diffing", "import os\nfrom typing import Any", set()),
    ],
)
def test_imports_are_resolved_to_modules(module: str, source: str, expected: set[str]) -> None:
    known = set(_modules())
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_targets(node, module, module == "weightcheck.reporters", known))
    assert found == expected
