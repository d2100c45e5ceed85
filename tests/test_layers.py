"""The import contract: each layer imports only itself and the layers below it, no module imports
itself back through others (no cycles, of any length), and no code reaches into another module's private
names.

    model → hooking → interventions → tasks → eval → analyses → report → runtime → plugins → cli

(``mechkit.errors`` sits under everything, ``mechkit.io`` writes files for every layer above it).
Imports inside functions count: a lazy import is still a dependency. So do imports under
``if TYPE_CHECKING:`` and any other import made only for annotations: a module that names another in
its signatures depends on it as much as one that calls it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"mechkit": ROOT / "mechkit", "mechkit.plugins": ROOT / "plugins", "mechkit.cli": ROOT / "cli"}

LAYERS = [
    ["mechkit.errors", "mechkit.lazy"],
    ["mechkit.io"],
    ["mechkit.model"],
    ["mechkit.hooking"],
    ["mechkit.interventions"],
    ["mechkit.tasks"],
    ["mechkit.eval"],
    ["mechkit.heads", "mechkit.patching", "mechkit.actvec", "mechkit.taskarith", "mechkit.pruning", "mechkit.compose",
     "mechkit.adapt", "mechkit.taskselect"],  # the analyses
    ["mechkit.report"],
    ["mechkit.options", "mechkit.executors", "mechkit.plugin", "mechkit.plugin_key", "mechkit.registry", "mechkit.runner"],
    ["mechkit.plugins"],
    ["mechkit.cli"],
]
TOP_LEVEL_ALLOWED = {"__init__", "errors", "lazy", "plugin", "plugin_key", "registry", "runner"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _layer(module: str) -> int | None:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, is_package: bool) -> list[tuple[str, list[str], bool]]:
    """``(imported module, names taken from it, under TYPE_CHECKING)`` for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, list[str], bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, typing_only)
                continue
            visit_stmt(child, typing_only)

    def visit_stmt(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend((a.name, [], typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [a.name for a in node.names], typing_only))
        else:
            visit(node, typing_only)

    visit(tree, False)
    return out


def _resolve(target: str, names: list[str], modules: dict[str, Path]) -> list[str]:
    """The project modules an import reaches: ``from pkg import sub`` reaches ``pkg.sub`` too."""
    if not target.startswith("mechkit"):
        return []
    reached = [target] if target in modules else []
    reached += [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    return reached


def _graph() -> dict[str, set[str]]:
    """Every import edge between project modules, annotation-only imports included."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        for target, names, _ in _imports(path, module, path.name == "__init__.py"):
            edges.update(t for t in _resolve(target, names, modules) if t != module)
    return graph


def test_every_module_has_a_layer():
    unplaced = [m for m in _modules() if m != "mechkit" and _layer(m) is None]
    assert not unplaced, f"add these modules to a layer in LAYERS: {unplaced}"


def test_only_entry_points_sit_outside_a_subpackage():
    loose = sorted(p.stem for p in (ROOT / "mechkit").glob("*.py") if p.stem not in TOP_LEVEL_ALLOWED)
    assert not loose, f"move these modules into a subpackage: {loose}"


def test_layers_import_only_downwards():
    upward = []
    for module, targets in _graph().items():
        if module == "mechkit":
            continue  # the package facade: lazy attributes for the public API
        for target in targets:
            if target != "mechkit" and _layer(target) > _layer(module):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that reach up a layer:\n" + "\n".join(sorted(upward))


def test_typing_imports_are_seen():
    """The graph keeps imports made only for annotations (a guard for the two tests above and below)."""
    typing_only = [(m, t) for m, p in _modules().items() for t, _, typing in _imports(p, m, p.name == "__init__.py")
                   if typing and t.startswith("mechkit")]
    assert typing_only, "no TYPE_CHECKING import found: the parser no longer sees them"
    graph = _graph()
    assert all(t in graph[m] or t not in graph for m, t in typing_only)


def test_no_import_cycles():
    graph = _graph()
    graph.pop("mechkit", None)
    for targets in graph.values():
        targets.discard("mechkit")
    # A module's package __init__ re-exporting it is not a cycle of ideas: drop edges from a
    # package to its own submodules before looking for cycles.
    for module, targets in graph.items():
        for t in list(targets):
            if t.startswith(module + "."):
                targets.discard(t)
    cycles, state, stack = [], {}, []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("folder", ["mechkit", "plugins", "cli", "tests", "bench", "examples"])
def test_no_private_names_imported_from_other_modules(folder):
    modules = _modules()
    reach_ins = []
    for path in (ROOT / folder).rglob("*.py"):
        module = next((m for m, p in modules.items() if p == path), path.stem)
        for target, names, _ in _imports(path, module, path.name == "__init__.py"):
            if target.startswith("mechkit") and target != module:
                reach_ins += [f"{path.relative_to(ROOT)}: {target}.{n}" for n in names
                              if n.startswith("_") and not n.startswith("__")]
    assert not reach_ins, "private names imported across modules:\n" + "\n".join(reach_ins)


def test_the_model_layer_keeps_few_modules_at_its_top():
    """``mechkit/model/`` answers its questions in subpackages; at most eight modules sit directly in it."""
    top = sorted(p.stem for p in (ROOT / "mechkit" / "model").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 8, f"{len(top)} modules directly in mechkit/model (at most 8): {top}"


def test_no_backend_file_imports_another():
    """One backend per file behind ``base``: a backend reaches the others only through the registry of
    servers (``remotes``), never by importing their files (support modules beside them are shared)."""
    package = "mechkit.model.backends"
    backends = {f"{package}.{name}" for name in ("nnsight_backend", "ndif", "simulation")}
    graph = _graph()
    crossing = sorted(f"{m} -> {t}" for m in backends for t in graph[m] if t in backends)
    assert not crossing, "backend files importing each other:\n" + "\n".join(crossing)
