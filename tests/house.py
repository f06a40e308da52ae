"""The house as a newcomer sees it: modules per folder, import cycles, arrows that run back up.

``python tests/house.py [ROOT]`` prints it for the checkout at ROOT (default: this one), so the shape
of any commit can be counted the same way (``git worktree add /tmp/old <commit>``, then point at it).
``tests/test_house.py`` holds this checkout to it: no cycle, no upward arrow, no library module that
imports a program's main.

Every import counts here, the ones inside functions too: an import put in a function to dodge a cycle
is still an arrow a reader must follow (``tests/test_layout.py`` checks the module-level graph, which
is what Python runs at import). Imports under ``if TYPE_CHECKING:`` are left out: they never run and
only name types. The root's lazy arrows (``cloudstore/__init__.py``'s ``open`` and ``aio``, PEP 562 so
that ``contract`` answers without an SDK) are documented and allowed (``LAZY_ROOT``).

The layers, lowest first (docs/design.md draws the same picture). A module may import its own layer
and any layer below; an arrow to a higher layer is an upward arrow::

    0 base       errors, clock, _version, runtime/        nothing of the store; usable by every program
    1 seam       generations, http_status                  one Backend, one error vocabulary
    2 backends   gcs, s3, local                            one each
    3 gate       gate/                                     the format record, the server check
    4 opening    settings                                  a URL and settings to a gated backend
    5 store      store/                                    the collections over the seam
    6 protocol   protocol/                                 one request in, one reply out
    7 libraries  api/, aio, bridge/, scheduling/, admin/, conformance/
    8 programs   driver, scheduler, */cli                  each a program's main; nothing imports them
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_layout import cycles  # noqa: E402 - the one Tarjan walker of the tests

ROOT = os.path.dirname(HERE)

#: Layer of a module, by its longest matching name prefix (module names below ``cloudstore``).
LAYERS: dict[str, int] = {
    "errors": 0, "clock": 0, "_version": 0, "runtime": 0,
    "generations": 1, "http_status": 1,
    "gcs": 2, "s3": 2, "local": 2,
    "gate": 3,
    "settings": 4,
    "store": 5,
    "protocol": 6,
    "api": 7, "aio": 7, "bridge": 7, "scheduling": 7, "admin": 7, "conformance": 7,
    "driver": 8, "scheduler": 8, "bridge.cli": 8, "admin.cli": 8, "conformance.cli": 8,
}
LAYER_NAMES = ("base", "seam", "backends", "gate", "opening", "store", "protocol", "libraries", "programs")
#: The flat layout's modules (0.6.0 and before, all side by side in cloudstore/) by the layer they hold,
#: so that ``python tests/house.py <an older checkout>`` counts its arrows by the same rule.
FLAT: dict[str, int] = {
    **dict.fromkeys(("metrics", "jsonlog", "wake", "config_schema", "strict_json", "racing"), 0),
    **dict.fromkeys(("store_format", "store_gate", "server_check"), 3),
    **dict.fromkeys(("space", "cache", "stored", "confirmed", "keys", "conversations", "packing", "heads",
                     "removal", "leases", "tools", "files", "jobs", "job_mark", "due_index", "claim_index"), 5),
    **dict.fromkeys(("validate", "service", "client"), 6),
}
#: The programs' mains (pyproject's [project.scripts]): no other module of the package imports one.
PROGRAMS = ("cloudstore.driver", "cloudstore.scheduler", "cloudstore.bridge.cli", "cloudstore.admin.cli",
            "cloudstore.conformance.cli")
#: The documented lazy arrows of the package root (cloudstore/__init__.py): PEP 562, on first use only.
LAZY_ROOT = {("cloudstore", "cloudstore.api"), ("cloudstore", "cloudstore.aio")}


def modules(root: str) -> dict[str, str]:
    """Every module of the package under ``root``: dotted name -> file."""
    found = {}
    package = os.path.join(root, "cloudstore")
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, name), root)[: -len(".py")].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = os.path.join(folder, name)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, wherever it stands (not under ``if TYPE_CHECKING:``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for part in node.orelse:
                if isinstance(part, (ast.Import, ast.ImportFrom)):
                    yield part
                else:
                    yield from _imports(part)
        else:
            yield from _imports(node)


def arrows(root: str = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere (the most specific module each import names)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = os.path.basename(path) == "__init__.py"
        names: set[str] = set()
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
                continue
            if node.level:
                base = module.split(".")
                if not is_package:
                    base.pop()
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                names.add(f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source)
        edges = set()
        for name in names:
            while name and name not in mods:  # `import a.b.c` of a module: its longest known prefix
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # its own parents run already
                edges.add(name)
        graph[module] = edges
    return graph


def layer(module: str) -> int | None:
    """The layer of ``module`` (None: the package root, which stands above the layers)."""
    rest = module.removeprefix("cloudstore").removeprefix(".")
    parts = rest.split(".") if rest else []
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return FLAT.get(rest)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Arrows from a module to one of a higher layer.

    The root stands above every layer (``open``, ``__version__``): its arrows all run down. It may
    reach the programs' libraries only lazily (``LAZY_ROOT``), which ``root_arrows`` checks."""
    found = []
    for module, edges in sorted(graph.items()):
        for target in sorted(edges):
            low, high = layer(module), layer(target)
            if low is not None and high is not None and high > low:
                found.append((module, target))
    return found


def root_arrows(root: str = ROOT) -> set[tuple[str, str]]:
    """The root's arrows that run at import (module level), beside ``_version``: none but the lazy ones may."""
    sys.path.insert(0, HERE)
    from test_layout import import_graph

    eager = {("cloudstore", t) for t in import_graph().get("cloudstore", set())}
    return eager - {("cloudstore", "cloudstore._version")}


def mains_imported(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Arrows into a program's main from any other module."""
    return [(m, t) for m, edges in sorted(graph.items()) for t in sorted(edges) if t in PROGRAMS and m != t]


def folders(root: str = ROOT) -> dict[str, int]:
    """Modules per folder of the package (``cloudstore/`` itself included), ``__init__`` counted."""
    count: dict[str, int] = {}
    for path in modules(root).values():
        folder = os.path.relpath(os.path.dirname(path), root) + "/"
        count[folder] = count.get(folder, 0) + 1
    return dict(sorted(count.items()))


def main(argv: list[str]) -> int:
    root = os.path.abspath(argv[0]) if argv else ROOT
    graph = arrows(root)
    print(f"house of {root}")
    print("modules per folder:")
    for folder, n in folders(root).items():
        print(f"  {n:3d}  {folder}")
    found = cycles(graph)
    print(f"import cycles (every import, functions' too): {len(found)}")
    for c in found:
        print("  " + " <-> ".join(c))
    up = upward(graph)
    print(f"arrows that run back up a layer: {len(up)}")
    for a, b in up:
        print(f"  {a} ({LAYER_NAMES[layer(a) or 0] if layer(a) is not None else 'root'}) -> "
              f"{b} ({LAYER_NAMES[layer(b) or 0]})")
    mains = mains_imported(graph)
    print(f"imports of a program's main: {len(mains)}")
    for a, b in mains:
        print(f"  {a} -> {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
