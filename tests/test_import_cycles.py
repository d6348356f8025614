"""The package's import graph has no cycles (TYPE_CHECKING imports count too).

A cycle means two modules cannot be read, tested or replaced apart; the
round-2 work enters through client/, codec/ and server/, so they must stay
layered.  ``from pkg import sub`` counts as an edge to the submodule when
``sub`` is a module and to the package otherwise.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import tidings

ROOT = Path(tidings.__file__).parent


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        mods[name] = path
    return mods


@cache
def _package_graph() -> dict[str, set[str]]:
    """The package's graph, built once: parsing every module is the file's whole cost,
    and the tests only read it."""
    return _graph(_modules())


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in mods else base)
            for target in targets:
                while target and target not in mods:
                    target = target.rsplit(".", 1)[0] if "." in target else ""
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_type_checking_imports() -> None:
    graph = _package_graph()
    # consumers depend on the Session protocol, not on the client classes
    assert "tidings.client._async.session" in graph["tidings.client._async.consumer"]


def test_tidings_has_no_import_cycles() -> None:
    assert _cycles(_package_graph()) == []


def test_client_classes_are_not_imported_by_their_helpers() -> None:
    graph = _package_graph()
    helpers = ["consumer", "publisher", "txpublisher", "transactions", "session"]
    for side in ("_async", "_sync"):
        for helper in helpers:
            deps = graph[f"tidings.client.{side}.{helper}"]
            assert f"tidings.client.{side}.client" not in deps, (side, helper)
    shared = ["base", "api", "cursor", "batching", "txbuffer", "txcontext"]
    for module in shared:
        deps = graph[f"tidings.client.{module}"]
        io_side = ("tidings.client._async", "tidings.client._sync")
        assert not any(d.startswith(io_side) for d in deps), module
