"""The modules of aiolock, and those of benchmarks/, import one another without a circle.

The package is layered: a module imports only modules on lower floors, so
that each can be read, and tested, knowing only what lies below it. A
circle of imports breaks that, whether Python minds at run time or not: an
import made only for the type checker (under ``if TYPE_CHECKING:``), or one
made inside a function to dodge a circular import at load time, still ties
the two modules together. So every import counts here, wherever it stands.

The check reads the source with :mod:`ast` and imports nothing: it needs no
server, and a circle is reported even when it would not fail at load time.
``aiolock/__init__.py`` takes part like any module: a module that imported
a name from the package itself (``from aiolock import AsyncLock``) would be
in a circle with it, since the package imports every public module.

The benchmarks are layered the same way (docs/benchmarks.md, How the
harness is laid out): the subjects and the runner at the bottom, the
benchmarks above them, the runner of them all on top.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from support.checkout import ROOT

PACKAGE = ROOT / "aiolock"
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Import:
    """One import of a module of the package by another, and where it stands."""

    module: str
    path: Path
    line: int
    target: str


def _module_of(package: Path, path: Path) -> str:
    """The dotted name of the module in ``path``: ``aiolock._lease``, ``aiolock`` for __init__."""
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]
) -> set[str]:
    """The modules among ``modules`` that ``node``, in ``module``, imports.

    ``from X import name`` imports the module ``X.name`` when there is one,
    else a name of ``X``: then the module ``X`` itself.
    """
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules} - {module}
    base = node.module or ""
    if node.level:
        # Level 1 is the package the module is in: the module itself if it is a package.
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join([*here, *([base] if base else [])])
    found: set[str] = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            found.add(f"{base}.{alias.name}")
        elif base in modules:
            found.add(base)
    return found - {module}


def import_graph(package: Path) -> dict[str, list[Import]]:
    """Every module of ``package`` with its imports of the package's other modules.

    An import counts wherever it stands: at the top, under ``if TYPE_CHECKING:``,
    inside a function. (An example in a docstring is a string, not an import.)
    """
    paths = {path: _module_of(package, path) for path in sorted(package.rglob("*.py"))}
    modules = set(paths.values())
    graph: dict[str, list[Import]] = {name: [] for name in modules}
    for path, module in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[module] += [
                    Import(module, path, node.lineno, target)
                    for target in sorted(_targets(node, module, is_package, modules))
                ]
    return graph


def _shortest_cycle(start: str, group: set[str], graph: dict[str, list[Import]]) -> list[Import]:
    """A shortest circle of imports from ``start`` back to it, within ``group`` (breadth first)."""
    came_by: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for module in frontier:
            for edge in graph[module]:
                if edge.target == start:
                    steps = [edge]
                    while steps[-1].module != start:
                        steps.append(came_by[steps[-1].module])
                    return steps[::-1]
                if edge.target in group and edge.target not in came_by:
                    came_by[edge.target] = edge
                    following.append(edge.target)
        frontier = following
    raise AssertionError(f"{start} is in no circle of {sorted(group)}")


def import_cycles(graph: dict[str, list[Import]]) -> list[list[Import]]:
    """One circle of imports for each group of modules that import one another.

    The groups are the strongly connected components of the graph (Tarjan's
    algorithm, without recursion); each is shown by a shortest circle through
    its first module in sorted order.
    """
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, iter(sorted({edge.target for edge in graph[root]})))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == order[module]:
                    group: set[str] = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif target not in order:
                order[target] = low[target] = len(order)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted({edge.target for edge in graph[target]}))))
            elif target in on_stack:
                low[module] = min(low[module], order[target])
    return [_shortest_cycle(min(group), group, graph) for group in sorted(groups, key=min)]


def _describe(cycle: list[Import], root: Path) -> str:
    """One line per import of the circle: ``aiolock/_a.py:12 imports aiolock._b``."""
    return "\n".join(
        f"  {edge.path.relative_to(root)}:{edge.line} imports {edge.target}" for edge in cycle
    )


# -- the package ---------------------------------------------------------------------------------


def test_the_modules_of_aiolock_import_one_another_without_a_circle() -> None:
    """No module of aiolock imports, directly or not, a module that imports it (type-only too)."""
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import circles in aiolock:\n" + "\n\n".join(
        _describe(cycle, ROOT) for cycle in cycles
    )


def test_the_graph_sees_the_package_imports() -> None:
    """The graph has every module, and edges of every form the package uses, so the check bites."""
    graph = import_graph(PACKAGE)
    targets = {module: {edge.target for edge in edges} for module, edges in graph.items()}
    assert {"aiolock", "aiolock._lock", "aiolock.backoff", "aiolock.testing"} <= set(graph)
    assert "aiolock._lock" in targets["aiolock"]  # from ._lock import AsyncLock
    assert "aiolock.backoff" in targets["aiolock"]  # from . import backoff
    assert "aiolock" not in targets["aiolock._contend"]  # from . import backoff as _backoff
    assert "aiolock.testing" in targets["aiolock._cli._server"]  # inside a function
    assert "aiolock._cli._main" in targets["aiolock._cli"]  # from ._main import main
    assert "aiolock._cli._codes" in targets["aiolock._cli._run"]  # from ._codes import EX_LOST
    assert "aiolock._lock" in targets["aiolock._cli._run"]  # from .._lock import AsyncLock
    # The aiolock.testing package: its modules, imported relatively, are in the graph too.
    assert {
        "aiolock.testing._base",
        "aiolock.testing._server",
        "aiolock.testing._cluster",
        "aiolock.testing.pytest_plugin",
    } <= set(graph)
    assert "aiolock.testing._server" in targets["aiolock.testing"]  # from ._server import ...
    assert "aiolock.testing._resp" in targets["aiolock.testing._server"]  # from . import _resp
    assert "aiolock.testing._replicated" in targets["aiolock.testing._sentinel"]
    assert "aiolock.testing._proxy" in targets["aiolock.testing.pytest_plugin"]


def floors(graph: dict[str, list[Import]]) -> dict[str, int]:
    """Each module's floor: one above the highest floor of what it imports (1: nothing)."""
    found: dict[str, int] = {}

    def floor(module: str) -> int:
        if module not in found:
            found[module] = 1 + max((floor(i.target) for i in graph[module]), default=0)
        return found[module]

    for module in graph:
        floor(module)
    return found


#: A module's path in the floor table, between backquotes: _lease.py, _cli/_main.py.
FLOOR_TABLE_PATH = r"`([\w./]+)\.py`"


def module_named(path: str) -> str:
    """The module that a path of the floor table names: ``_cli/_main`` is ``aiolock._cli._main``.

    A subpackage's ``__init__`` is the subpackage itself: ``_cli/__init__`` is ``aiolock._cli``.
    """
    parts = path.split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["aiolock", *parts])


def test_a_row_of_the_floor_table_names_modules_by_their_paths() -> None:
    """A path in the floor table maps to its module, in a subpackage or at the top."""
    assert module_named("_lease") == "aiolock._lease"
    assert module_named("_cli/_main") == "aiolock._cli._main"
    assert module_named("_cli/__init__") == "aiolock._cli"
    assert re.findall(FLOOR_TABLE_PATH, "`_cli/__init__.py`, `_cli/_run.py`, `otel.py`") == [
        "_cli/__init__",
        "_cli/_run",
        "otel",
    ]


def test_the_floors_of_the_internals_page_are_those_of_the_imports() -> None:
    """docs/internals.md gives every module of the package its floor, as the imports make it.

    The package itself, ``__main__`` and the ``testing`` package (which stands
    apart, in a table of its own) are not in the table; every other module
    is, once, on the floor it is on. A module of a subpackage is named by its
    path (``_cli/_run.py``), the subpackage by its ``__init__``
    (``_cli/__init__.py``).
    """
    graph = import_graph(PACKAGE)
    assert not import_cycles(graph)
    computed = floors(graph)
    page = (ROOT / "docs" / "internals.md").read_text()
    table = page[page.index("| floor | module | owns |") :].split("\n\n", 1)[0].splitlines()[2:]
    documented: dict[str, int] = {}
    for row in table:
        floor, modules = (cell.strip() for cell in row.strip("|").split("|")[:2])
        for path in re.findall(FLOOR_TABLE_PATH, modules):
            module = module_named(path)
            assert module not in documented, f"{path}.py is in the table twice"
            documented[module] = int(floor)
    expected = {
        module: floor
        for module, floor in computed.items()
        if module not in {"aiolock", "aiolock.__main__"}
        and module != "aiolock.testing"
        and not module.startswith("aiolock.testing.")
    }
    assert documented == expected


# -- the benchmarks ------------------------------------------------------------------------------


def test_the_modules_of_the_benchmarks_import_one_another_without_a_circle() -> None:
    """No module of benchmarks/ imports, directly or not, a module that imports it."""
    cycles = import_cycles(import_graph(BENCHMARKS))
    assert not cycles, "import circles in benchmarks/:\n" + "\n\n".join(
        _describe(cycle, ROOT) for cycle in cycles
    )


def test_the_graph_sees_the_benchmarks_imports() -> None:
    """The graph has every benchmark and both forms of import they use, so the check bites."""
    graph = import_graph(BENCHMARKS)
    targets = {module: {edge.target for edge in edges} for module, edges in graph.items()}
    names = (
        *("contention", "family", "handoff", "multi"),
        *("redlock", "scale", "seckill", "soak", "waiting"),
    )
    assert {f"benchmarks.{name}" for name in names} <= set(graph)
    assert "benchmarks._subjects" in targets["benchmarks.family"]  # from ._subjects import
    assert "benchmarks._seckill_app" in targets["benchmarks.seckill"]  # from benchmarks.… import


# -- the check itself, on a package made for it ----------------------------------------------------


def _write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return package


def test_a_circle_through_a_type_checking_import_is_found(tmp_path: Path) -> None:
    """A circle closed only under ``if TYPE_CHECKING:`` is reported, import by import."""
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "from ._top import Top\n",
            "_top.py": "from ._middle import Middle\n\nclass Top(Middle): ...\n",
            "_middle.py": "from . import _bottom\n\nclass Middle: ...\n",
            "_bottom.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from pkg._top import Top
                """,
            "_apart.py": "import pkg._bottom\n",
        },
    )
    cycles = import_cycles(import_graph(package))
    assert [[(e.path.name, e.line, e.target) for e in cycle] for cycle in cycles] == [
        [
            ("_bottom.py", 4, "pkg._top"),
            ("_top.py", 1, "pkg._middle"),
            ("_middle.py", 1, "pkg._bottom"),
        ]
    ]
    assert _describe(cycles[0], tmp_path).splitlines()[0] == "  pkg/_bottom.py:4 imports pkg._top"


def test_a_module_that_imports_from_the_package_is_in_a_circle_with_it(tmp_path: Path) -> None:
    """``from pkg import name`` in a module the package imports closes a circle."""
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "from ._a import A\nfrom ._b import b\n",
            "_a.py": "class A: ...\n",
            "_b.py": "def b() -> None:\n    from pkg import A\n",
        },
    )
    cycles = import_cycles(import_graph(package))
    assert [{e.target for e in cycle} for cycle in cycles] == [{"pkg", "pkg._b"}]


def test_layered_modules_make_no_circle(tmp_path: Path) -> None:
    """Imports that only go down the floors, relative or absolute, make no circle."""
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "from ._high import High\nfrom . import low\n",
            "_high.py": "from .low import Low\nimport pkg.low\n\nclass High(Low): ...\n",
            "low.py": "import os\n\nclass Low: ...\n",
        },
    )
    assert import_cycles(import_graph(package)) == []
