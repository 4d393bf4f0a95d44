"""The layout's dependency rules, checked on the source (every import, lazy ones included):

1. the core (``onnxslim_kit/``) never imports a pass or a pass helper — only the registry finds
   passes, by name, at run time;
2. a pass (``passes/<name>/`` or ``passes/<name>.py``) never imports another pass;
3. the shared packages (``passes/_common``, ``passes/_quant``) never import a pass;
4. modules under a ``maths/`` folder are numpy-only: no onnx, onnx-graphsurgeon, ONNX Runtime,
   and no project module outside a ``maths/`` folder;
5. no import cycle among the modules of ``onnxslim_kit/`` and ``passes/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PASSES = "onnxslim_kit.passes"
GRAPH_LIBRARIES = ("onnx", "onnx_graphsurgeon", "onnxruntime")


def _module_name(path: Path) -> tuple:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "passes":
        parts = PASSES.split(".") + parts[1:]
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _modules() -> dict:
    found = {}
    for folder in ("onnxslim_kit", "passes"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name, is_package = _module_name(path)
            found[name] = (path, is_package)
    return found


MODULES = _modules()


def _imported_names(name: str) -> set:
    """Every dotted name an import statement of module ``name`` refers to (absolute)."""
    path, is_package = MODULES[name]
    package = name if is_package else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _project_imports(name: str) -> set:
    """The project modules ``name`` imports (a ``from pkg import symbol`` counts as ``pkg``)."""
    found = set()
    for target in _imported_names(name):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def _owner(module: str) -> str | None:
    """The pass a module belongs to (``fuse`` for ``onnxslim_kit.passes.fuse.cleanup``), the
    shared package (``_common``), or None for the core and ``onnxslim_kit.passes`` itself."""
    if not module.startswith(PASSES + "."):
        return None
    return module[len(PASSES) + 1:].split(".")[0]


GRAPH = {name: _project_imports(name) for name in MODULES}


def test_the_layout_has_one_package_per_pass_and_shared_helpers_apart():
    owners = {_owner(name) for name in MODULES} - {None}
    assert {"_common", "_quant", "fuse", "prune", "int8", "dynamic", "fp16", "int4", "svd",
            "cluster", "compact"} <= owners
    flat_helpers = [p.name for p in (ROOT / "passes").glob("_*.py") if p.name != "__init__.py"]
    assert not flat_helpers, f"helpers belong to a pass or a shared package: {flat_helpers}"


def test_the_core_never_imports_a_pass():
    bad = sorted(f"{name} → {target}" for name, targets in GRAPH.items() if _owner(name) is None
                 for target in targets if _owner(target) is not None)
    assert not bad, bad


def test_a_pass_never_imports_another_pass():
    bad = sorted(f"{name} → {target}" for name, targets in GRAPH.items()
                 for target in targets
                 if (owner := _owner(name)) and not owner.startswith("_")
                 and (other := _owner(target)) and not other.startswith("_") and other != owner)
    assert not bad, bad


def test_shared_packages_never_import_a_pass():
    bad = sorted(f"{name} → {target}" for name, targets in GRAPH.items()
                 for target in targets
                 if (owner := _owner(name)) and owner.startswith("_")
                 and (other := _owner(target)) and not other.startswith("_"))
    assert not bad, bad


def _is_maths(module: str) -> bool:
    return ".maths" in module


def test_maths_modules_are_numpy_only():
    maths = [name for name in MODULES if _is_maths(name)]
    assert maths, "no maths/ modules found"
    bad = []
    for name in maths:
        for imported in _imported_names(name):
            top = imported.split(".")[0]
            if top in GRAPH_LIBRARIES:
                bad.append(f"{name} imports {imported}")
        bad.extend(f"{name} imports {target}" for target in GRAPH[name] if not _is_maths(target))
    assert not bad, bad


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in graph:
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
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert _cycles(graph) == expected
