"""The shape of tsm_core, read from its source: no import cycles, no flat room,
planners that reach no launcher, and no import of the checkout's folder names.

The import graph has an edge for every ``import`` statement of a module, those
inside functions included (a function-local import that dodges a cycle is still a
cycle in the design), with relative imports resolved. ``from P import name`` points
at the module ``P.name`` where there is one, else at ``P``. Imports under ``if
TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "tsm_core"
# Modules allowed directly in tsm_core/; everything else sits in a subpackage.
TOP_MODULES = {"__init__.py", "arrays.py"}
PLANNER_NAMES = {"model", "plan", "cost"}
LAUNCHER_NAMES = {"launch", "api"}
# Folders of the checkout whose Python code must import the installed names
# (tsm_apps, tsm_datasets), never the folder names apps / datasets.
CODE_FOLDERS = ("tsm_core", "apps", "datasets", "tests", "benchmarks", "dev", "docs")


# ---------------------------------------------------------------- the graph


def modules_of(pkg_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``pkg_dir``."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_names(name: str, path: Path) -> list[tuple[list[str], int]]:
    """What module ``name`` imports: (candidates, line) per imported name, with
    relative imports made absolute. The first candidate that is a module is the one
    imported: ``from P import x`` gives ``[P.x, P]``, ``import a.b`` gives ``[a.b, a]``."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                out.append(([".".join(parts[:i]) for i in range(len(parts), 0, -1)], node.lineno))
            continue
        if node.level:
            base = package.split(".")
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        for alias in node.names:
            out.append(([f"{prefix}.{alias.name}", prefix], node.lineno))
    return out


def import_graph(pkg_dir: Path) -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    """Edges among the modules of ``pkg_dir``, and the line of each edge's first import."""
    mods = modules_of(pkg_dir)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    where: dict[tuple[str, str], int] = {}
    for m, path in mods.items():
        for candidates, line in imported_names(m, path):
            target = next((c for c in candidates if c in mods), None)
            if target is None or target == m:
                continue
            graph[m].add(target)
            where.setdefault((m, target), line)
    return graph, where


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, iteratively; only those that hold a cycle."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        comps.append(sorted(comp))
    return comps


def shortest_cycle(graph: dict[str, set[str]], nodes: list[str]) -> list[str]:
    """A shortest cycle through the component ``nodes`` (first and last equal)."""
    inside = set(nodes)
    best = None
    for start in nodes:
        prev = {start: None}
        queue = deque([start])
        found = None
        while queue and found is None:
            v = queue.popleft()
            for w in sorted(graph[v] & inside):
                if w == start:
                    found = v
                    break
                if w not in prev:
                    prev[w] = v
                    queue.append(w)
        if found is None:
            continue
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycle = path[::-1] + [start]
        if best is None or len(cycle) < len(best):
            best = cycle
    return best


def describe(cycle: list[str], where: dict[tuple[str, str], int]) -> str:
    return " -> ".join(cycle) + "  (" + ", ".join(
        f"{a} line {where[(a, b)]}" for a, b in zip(cycle, cycle[1:])) + ")"


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module reachable from ``start``, with the module it was reached from."""
    prev = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return prev


# ---------------------------------------------------------------- the graph builder, on a known case


def test_graph_builder_finds_a_hidden_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "model.py").write_text("from . import helper\n")
    (pkg / "sub" / "helper.py").write_text("import os\nfrom ..other import thing\n")
    (pkg / "other.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.sub import launch\n"
        "def thing():\n    from pkg.sub.model import x\n    return x\n")
    (pkg / "sub" / "launch.py").write_text("from pkg.sub.model import y\n")
    graph, where = import_graph(pkg)
    assert graph["pkg.sub.model"] == {"pkg.sub.helper"}
    assert graph["pkg.sub.helper"] == {"pkg.other"}
    assert graph["pkg.other"] == {"pkg.sub.model"}  # function-level import counts; TYPE_CHECKING not
    (comp,) = strongly_connected(graph)
    assert comp == ["pkg.other", "pkg.sub.helper", "pkg.sub.model"]
    cycle = shortest_cycle(graph, comp)
    assert len(cycle) == 4 and cycle[0] == cycle[-1]
    assert "pkg.sub.model line 1" in describe(cycle, where)


# ---------------------------------------------------------------- tsm_core


@pytest.fixture(scope="module")
def core_graph():
    return import_graph(CORE)


def test_no_import_cycle_in_tsm_core(core_graph):
    graph, where = core_graph
    cycles = [f"{len(comp)} modules in a cycle: {', '.join(comp)}\n    for instance "
              + describe(shortest_cycle(graph, comp), where) for comp in strongly_connected(graph)]
    assert not cycles, "import cycles among tsm_core's modules:\n  " + "\n  ".join(cycles)


def test_no_flat_room():
    loose = sorted(p.name for p in CORE.glob("*.py") if p.name not in TOP_MODULES)
    assert not loose, f"modules directly in tsm_core/ (each belongs in a subpackage): {loose}"


def test_every_code_folder_is_a_package():
    # setup.py finds packages by their __init__.py: a folder without one would be
    # left out of the wheel.
    for top in (CORE, ROOT / "apps", ROOT / "datasets"):
        for d in [top, *(p for p in top.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)]:
            if any(d.glob("*.py")):
                assert (d / "__init__.py").exists(), f"{d.relative_to(ROOT)} has modules but no __init__.py"


def _planners(graph):
    return sorted(m for m in graph if m.rpartition(".")[2] in PLANNER_NAMES)


def test_planners_import_no_launcher(core_graph):
    graph, where = core_graph
    planners = _planners(graph)
    assert planners, "no planner module (model.py, plan.py, cost.py) found in tsm_core"
    bad = []
    for p in planners:
        for target in sorted(graph[p]):
            if target.rpartition(".")[2] in LAUNCHER_NAMES:
                bad.append(f"{p} imports {target} (line {where[(p, target)]})")
        # nor through another module: a family's launcher or API (runtime/launch.py is
        # the driver's launch helper, not a family launcher).
        prev = reachable(graph, p)
        for target in sorted(set(prev) - graph[p] - {p}):
            parts = target.split(".")
            if len(parts) < 3 or parts[1] == "runtime" or parts[-1] not in LAUNCHER_NAMES:
                continue
            chain = [target]
            while chain[-1] != p:
                chain.append(prev[chain[-1]])
            bad.append(f"{p} reaches {target}: " + " -> ".join(chain[::-1]))
    assert not bad, "planners that reach a launcher:\n  " + "\n  ".join(bad)


def test_no_import_of_checkout_folder_names():
    bad = []
    for folder in CODE_FOLDERS:
        base = ROOT / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module] if node.level == 0 and node.module else []
                else:
                    names = [a.name for a in node.names]
                for n in names:
                    if n.split(".")[0] in ("apps", "datasets"):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {n}")
    assert not bad, "imports of the folder names (use tsm_apps / tsm_datasets):\n  " + "\n  ".join(bad)
