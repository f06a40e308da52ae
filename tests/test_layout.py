"""The package's layout: no import cycle among cloudstore's modules, no test machinery installed.

Imports are read with ``ast`` (nothing is imported), at module level only:
an import inside a function runs when it is called, so it may be lazy on
purpose (``cloudstore/__init__.py`` is), and one under ``if TYPE_CHECKING:``
never runs. Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``
first, so those count as imported too.

``python tests/test_layout.py`` prints the graph's cycles and each module's imports.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "cloudstore")

#: What the installed package must never import: test runners, emulators, the tests' own modules.
TEST_MACHINERY = ("pytest", "_pytest", "moto", "emulators", "cloudstore.emulators", "support", "faults", "sim")


def modules() -> dict[str, str]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(folder, name), ROOT)[: -len(".py")].split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = os.path.join(folder, name)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements run when the module is imported (class bodies run too; functions do not)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(part)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _module_level(node.body)


def imported_names(module: str, path: str) -> set[str]:
    """Absolute dotted names a module imports at module level (``from X import Y`` gives X and X.Y)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    names: set[str] = set()
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = module.split(".")
            if not is_package:
                base.pop()
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names.add(source)
        names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def _with_parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports at module level (parent packages included, itself not)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        edges = {p for name in imported_names(module, path) for p in _with_parents(name) if p in mods}
        # A module's own parent packages are running already when it is imported: no edge.
        graph[module] = edges - set(_with_parents(module))
    return graph


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph with each subpackage (``cloudstore.bridge``, ...) one node, so that two
    subpackages importing each other count as a cycle even when no single module closes it."""
    packages = sorted(m for m, path in modules().items() if path.endswith("__init__.py") and m != "cloudstore")

    def node(module: str) -> str:
        return next((p for p in packages if module == p or module.startswith(p + ".")), module)

    collapsed: dict[str, set[str]] = {}
    for module, edges in graph.items():
        collapsed.setdefault(node(module), set()).update(node(e) for e in edges if node(e) != node(module))
    return collapsed


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_sees_the_package():
    graph = import_graph()
    assert "cloudstore" in graph and "cloudstore.conformance.cli" in graph and "cloudstore.bridge.server" in graph
    assert "cloudstore.conformance.runner" in graph["cloudstore.conformance.cli"]


def test_the_walker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_cloudstore_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_among_cloudstore_subpackages():
    assert cycles(package_graph(import_graph())) == []


def test_the_bridge_does_not_import_the_conformance_suite():
    for module, edges in import_graph().items():
        if module.startswith("cloudstore.bridge"):
            assert not any(e.startswith("cloudstore.conformance") for e in edges), (module, edges)


def test_no_test_machinery_in_the_installed_package():
    mods = modules()
    assert "cloudstore.emulators" not in mods, "the emulators are test machinery: tests/emulators.py"
    for module, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        # Every import, lazy ones included: none of these is installed with the package.
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
        bad = sorted(n for n in names if any(n == t or n.startswith(t + ".") for t in TEST_MACHINERY))
        assert not bad, f"{module} imports {bad}"


if __name__ == "__main__":
    g = import_graph()
    for c in cycles(g):
        print("cycle:", " ".join(c))
    for c in cycles(package_graph(g)):
        print("cycle between subpackages:", " ".join(c))
    for m in sorted(g):
        print(m, "->", " ".join(sorted(g[m])))
