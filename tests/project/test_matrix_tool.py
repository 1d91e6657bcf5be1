"""The version matrix (``make matrix``, ``.ci/matrix.py``) and what the package says it supports.

The matrix itself takes half an hour and fetches servers and clients, so the
suite does not run it. It checks instead that what the project states agrees
with it: the tables of docs/reliability.md (written by ``make matrix`` with ``--readme``)
cover every server, client and Python the tool tests, each cell of its
default run passed, and the floors in ``pyproject.toml`` (``requires-python``,
``redis>=``, the Python classifiers) are the oldest releases it tests. And
that a module whose pytest was killed is still counted, from its log, and
that it finds each test module it runs.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from types import ModuleType

import pytest
from support.checkout import ROOT


def _load_matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location("matrix", ROOT / ".ci" / "matrix.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("matrix", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


matrix = _load_matrix()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
README = matrix.TABLES_PAGE.read_text()  # (the tables' page: the README held them once)


def _tables() -> list[list[list[str]]]:
    """The Markdown tables between the page's matrix markers, as rows of cells."""
    start = README.index(matrix.README_BEGIN) + len(matrix.README_BEGIN)
    block = README[start : README.index(matrix.README_END)]
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*block.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                current.append([cell.strip() for cell in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _tested_pythons() -> dict[str, str]:
    """The Python table: each CPython release the matrix ran, and its cell."""
    return {row[0].removeprefix("CPython "): row[1] for row in _tables()[1][1:]}


@pytest.mark.parametrize("module", matrix.MODULES)
def test_each_module_of_the_matrix_is_one_test_file(module: str) -> None:
    """The matrix finds each test module it runs by name, in its kind's folder of tests/."""
    path = matrix.module_path(module)
    assert (ROOT / path).is_file(), path
    assert re.fullmatch(rf"tests/\w+/{module}\.py", path), path


def test_the_readme_shows_both_tables_of_a_matrix_run() -> None:
    """Between the markers: a commit stamp, the server x redis-py table, the Python table."""
    start = README.index(matrix.README_BEGIN) + len(matrix.README_BEGIN)
    block = README[start : README.index(matrix.README_END)]
    assert re.search(r"Run at commit [0-9a-f]{7,}", block), block[:200]
    assert len(_tables()) == 2


def test_the_readme_table_covers_every_server_and_client_the_tool_tests() -> None:
    """A column per redis-py of ``CLIENTS``, a row per server of ``SERVERS``, in order."""
    servers_by_clients = _tables()[0]
    head, rows = servers_by_clients[0], servers_by_clients[1:]
    assert head == ["server", *(f"redis-py {c}" for c in matrix.CLIENTS)]
    assert len(rows) == len(matrix.SERVERS)
    for row, key in zip(rows, matrix.SERVERS, strict=True):
        name, _, release = key.partition("-")
        assert row[0].startswith(f"{name.capitalize()} {release}."), (row[0], key)
        assert row[0].endswith(f"({matrix.SOURCES[key]})"), row[0]


def test_every_cell_of_the_default_run_passed() -> None:
    """Each server with the newest client, the newest server with each client: all pass."""
    rows = {row[0].split(" (")[0]: row[1:] for row in _tables()[0][1:]}
    keys = dict(zip(rows, matrix.SERVERS, strict=True))
    for shown, cells in rows.items():
        for client, cell in zip(matrix.CLIENTS, cells, strict=True):
            if (keys[shown], client) in matrix.cells(matrix.SERVERS, matrix.CLIENTS, False):
                assert cell.startswith("pass ("), f"{shown} with redis-py {client}: {cell}"


def test_the_python_table_covers_every_python_the_package_claims() -> None:
    """A row per tested CPython, each passed; they are the classifiers' versions, no more."""
    shown = _tested_pythons()
    # The one that ran the matrix, and the others it looks for.
    assert set(matrix.PYTHONS) <= set(shown)
    assert len(shown) == len(matrix.PYTHONS) + 1
    for release, cell in shown.items():
        assert cell.startswith("pass ("), f"CPython {release}: {cell}"
    claimed = {
        c.removeprefix("Programming Language :: Python :: ")
        for c in PYPROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert claimed == set(shown)


def test_the_stated_floors_are_the_oldest_releases_tested() -> None:
    """requires-python, redis>=, and the README's floors: the matrix's oldest of each."""
    oldest_python = min(_tested_pythons(), key=lambda v: tuple(map(int, v.split("."))))
    assert PYPROJECT["requires-python"] == f">={oldest_python}"
    (redis_dep,) = [d for d in PYPROJECT["dependencies"] if d.startswith("redis")]
    assert redis_dep == f"redis[hiredis]>={_minor(matrix.CLIENTS[0])}"
    floors = README[README.index("**Floors**") :].split("\n\n", 1)[0]
    assert f"CPython {oldest_python}" in floors
    assert f"redis-py {_minor(matrix.CLIENTS[0])}" in floors
    for vendor in ("redis", "valkey"):
        oldest = next(k for k in matrix.SERVERS if k.startswith(vendor))
        assert f"{vendor.capitalize()} {oldest.partition('-')[2]}" in floors, (vendor, floors)


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "tests/primitives/test_contract.py::t[asyncio-Semaphore-black hole] PASSED [ 1%]\n"
            "tests/primitives/test_contract.py::t[asyncio-Semaphore-black hole] ERROR [ 1%]\n"
            "tests/primitives/test_contract.py::u[uvloop] FAILED [ 2%]\n"
            "tests/primitives/test_contract.py::v SKIPPED (needs WAITAOF) [ 3%]\n"
            "tests/primitives/test_contract.py::w PASSED [ 4%]++++++ Timeout ++++++\n",
            (1, 1, 1, 1),
        ),
        ("Timeout before any test ended\n", (0, 0, 0, 0)),
    ],
)
def test_a_killed_module_is_counted_from_its_log(log: str, expected: tuple[int, ...]) -> None:
    """Its verbose lines count; a test's worst line wins (a teardown ERROR after PASSED)."""
    outcome = matrix.from_log("test_contract", log, 1.0)
    got = (outcome.passed, outcome.failed, outcome.errors, outcome.skipped)
    assert got == expected
    assert all(p.startswith(("FAILED ", "ERROR ")) for p in outcome.problems)
