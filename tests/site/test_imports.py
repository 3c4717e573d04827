"""The project's import graph keeps its layers: no cycle, a core that imports no app, apps that
import only the core of ``ankusa_site``, and ``queues``/``limits`` that never reach ``commands``.

The graph is read from the source (``ast``), not from ``sys.modules``: an import inside a function
is an edge as much as one at the top of a module (it runs sooner or later, and a cycle through it
is a cycle a reader has to follow). Only imports under ``if TYPE_CHECKING:`` are left out: they
never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ankusa_site", "commands", "queues", "limits")
APPS = ("commands", "queues", "limits")
CORE = "ankusa_site.core"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool):
    """(imported name, line) for every import in ``tree`` but those under ``if TYPE_CHECKING:``.

    A package's ``__init__`` runs before any of its modules, but it is an edge only where it is
    imported itself (``import a``, ``from a import name``), not wherever one of its modules is:
    otherwise every module of a package whose ``__init__`` imports one of them would be a cycle."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno  # a submodule, or else a name in ``base``
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {project module it imports: line of the first such import}."""
    modules = project_modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, line in _imports(tree, module, path.name == "__init__.py"):
            if name not in modules:  # ``from a.b import c`` where c is a name in a.b, not a module
                name = name.rpartition(".")[0]
            if name in modules and name != module:
                edges.setdefault(name, line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (as a path back to its start) per strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
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
                    components.append(sorted(component))
    return [_a_cycle(graph, set(component)) for component in components]


def _a_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child not in component:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in a strongly connected component: {sorted(component)}")


def _described(graph, path: list[str]) -> str:
    return (
        " -> ".join(
            f"{module} (line {graph[module][after]})" for module, after in zip(path, path[1:], strict=False)
        )
        + f" -> {path[-1]}"
    )


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_project_has_no_import_cycle():
    graph = import_graph()
    found = [_described(graph, cycle) for cycle in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_core_imports_no_app_and_nothing_of_the_shell():
    graph = import_graph()
    wrong = [
        f"{module} line {line} imports {imported}"
        for module, edges in graph.items()
        if _within(module, CORE)
        for imported, line in edges.items()
        if not _within(imported, CORE) and imported != "ankusa_site"
    ]
    assert not wrong, "\n".join(wrong)


def test_apps_import_only_the_core_of_the_site():
    graph = import_graph()
    wrong = [
        f"{module} line {line} imports {imported}"
        for module, edges in graph.items()
        if any(_within(module, app) for app in APPS)
        for imported, line in edges.items()
        if _within(imported, "ankusa_site") and not _within(imported, CORE) and imported != "ankusa_site"
    ]
    assert not wrong, "\n".join(wrong)


def test_queues_and_limits_never_import_commands():
    graph = import_graph()
    wrong = [
        f"{module} line {line} imports {imported}"
        for module, edges in graph.items()
        if _within(module, "queues") or _within(module, "limits")
        for imported, line in edges.items()
        if _within(imported, "commands")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_walk_sees_function_level_imports_and_skips_type_checking_ones():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import commands.models\n"
        "if TYPE_CHECKING:\n"
        "    from queues.fifo import Item\n"
        "def f():\n"
        "    from limits import gcra\n"
        "    from . import sibling\n"
    )
    names = {name for name, _ in _imports(tree, "ankusa_site.core.logs", is_package=False)}
    assert names == {"typing.TYPE_CHECKING", "commands.models", "limits.gcra", "ankusa_site.core.sibling"}
    assert not any(name.startswith("queues") for name in names)


def test_a_cycle_is_reported_with_its_path():
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert _described(graph, ["a", "b", "c", "a"]) == "a (line 3) -> b (line 5) -> c (line 7) -> a"
