"""The public surface, pinned so that it never changes by accident (docs/design.md).

Changing a name here is a breaking change: it goes in the changelog, and this
file changes with it on purpose.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.metadata
import importlib.resources
import inspect
import re
import types

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._exceptions
import aiolock.backoff
import aiolock.otel
import aiolock.testing
from aiolock import (
    AcquireTimeout,
    AsyncLock,
    LockError,
    LockLostError,
    LockNotOwnedError,
    backoff,
)

AIOLOCK_ALL = [
    "AcquireTimeout",
    "AsyncLock",
    "Election",
    "HolderInfo",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "MultiLock",
    "ReadWriteLock",
    "Redlock",
    "Semaphore",
    "Term",
    "WaiterInfo",
    "__version__",
    "add_observer",
    "backoff",
    "guard",
    "inspect",
    "remove_observer",
]

BACKOFF_ALL = [
    "Backoff",
    "constant",
    "decorrelated",
    "exponential",
    "from_callable",
    "linear",
    "spin",
    "yield_then_sleep",
]

#: The keyword options of AsyncLock with fixed names (docs/design.md, The public contract).
LOCK_OPTIONS = [
    "ttl",
    "timeout",
    "blocking",
    "backoff",
    "auto_renew",
    "notify",
    "on_lost",
    "cancel_on_lost",
    "reentrant",
    "prefix",
    "fencing",
]

LOCK_METHODS = ["acquire", "release", "extend", "locked", "owned"]
LOCK_PROPERTIES = ["name", "key", "ttl", "timeout", "lost", "fence"]


def public_members(obj: type) -> list[str]:
    """The public attributes a class defines itself (not inherited from object)."""
    return [n for n in vars(obj) if not n.startswith("_")]


# --- __all__ --------------------------------------------------------------------------------------


def test_aiolock_all_is_pinned() -> None:
    """aiolock.__all__ is exactly the pinned list."""
    assert aiolock.__all__ == AIOLOCK_ALL


def test_the_family_has_its_fixed_names() -> None:
    """Semaphore and ReadWriteLock's sides have AsyncLock's methods, and the family's names."""
    for name in (*LOCK_METHODS, "limit", "lost", "statistics"):
        assert hasattr(aiolock.Semaphore, name), name
    for name in ("reader", "writer", "locked", "name", "key", "ttl"):
        assert hasattr(aiolock.ReadWriteLock, name), name
    rw = aiolock.ReadWriteLock(redis.Redis(), "x")  # makes nothing on a server
    for side in (rw.reader, rw.writer):
        for name in (*LOCK_METHODS, "lost", "kind", "lock", "name", "key", "ttl"):
            assert hasattr(side, name), name


def test_aiolock_all_is_sorted_and_unique() -> None:
    """aiolock.__all__ is sorted and has no duplicates."""
    assert aiolock.__all__ == sorted(set(aiolock.__all__))


def test_backoff_all_is_pinned_sorted_and_unique() -> None:
    """aiolock.backoff.__all__ is exactly the pinned list, sorted, no duplicates."""
    assert aiolock.backoff.__all__ == BACKOFF_ALL
    assert sorted(set(BACKOFF_ALL)) == BACKOFF_ALL


def test_testing_all_is_sorted_and_unique() -> None:
    """aiolock.testing.__all__ is sorted and has no duplicates."""
    assert aiolock.testing.__all__ == sorted(set(aiolock.testing.__all__))


@pytest.mark.parametrize(
    ("module", "name"),
    [("aiolock", n) for n in AIOLOCK_ALL]
    + [("aiolock.backoff", n) for n in BACKOFF_ALL]
    + [("aiolock.testing", n) for n in aiolock.testing.__all__]
    + [("aiolock.otel", n) for n in aiolock.otel.__all__],
)
def test_every_public_name_is_importable_and_documented(module: str, name: str) -> None:
    """Every name in __all__ imports with `from module import name` and has its own docstring."""
    namespace: dict[str, object] = {}
    exec(f"from {module} import {name}", namespace)  # noqa: S102 - the import statement is the test
    value = namespace[name]
    if name == "__version__":
        assert isinstance(value, str)
        return
    doc = inspect.getdoc(value)
    assert doc, f"{module}.{name} has no docstring"
    if isinstance(value, type) or callable(value):
        own = value.__doc__ or ""
        assert own.strip(), f"{module}.{name} only inherits its docstring"


@pytest.mark.parametrize(
    "cls",
    [AsyncLock, aiolock.Election, aiolock.Term, backoff.Backoff, aiolock.testing.RedisServer],
    ids=lambda c: c.__name__,
)
def test_public_methods_and_properties_are_documented(cls: type) -> None:
    """Every public method and property of the public classes has a docstring."""
    missing = [n for n in public_members(cls) if not (getattr(cls, n).__doc__ or "").strip()]
    assert missing == []


def test_modules_are_documented() -> None:
    """The package and its public modules have module docstrings."""
    for module in (aiolock, aiolock.backoff, aiolock.testing, aiolock._exceptions, aiolock.otel):
        assert (module.__doc__ or "").strip(), module.__name__


def test_top_level_names_are_the_real_objects() -> None:
    """aiolock re-exports the implementing objects, and aiolock.backoff is the module."""
    assert isinstance(aiolock.backoff, types.ModuleType)
    assert aiolock.backoff is importlib.import_module("aiolock.backoff")
    assert aiolock.LockError is aiolock._exceptions.LockError
    assert aiolock.LockNotOwnedError is aiolock._exceptions.LockNotOwnedError
    assert aiolock.LockLostError is aiolock._exceptions.LockLostError
    assert aiolock.AcquireTimeout is aiolock._exceptions.AcquireTimeout
    assert AsyncLock.__module__.startswith("aiolock.")


def test_the_contract_imports_work_as_written() -> None:
    """The public contract's two import lines work as written."""
    namespace: dict[str, object] = {}
    exec(  # noqa: S102 - the import statements are the test
        "from aiolock import AsyncLock, backoff\n"
        "from aiolock import LockError, LockNotOwnedError, LockLostError, AcquireTimeout\n",
        namespace,
    )
    assert namespace["AsyncLock"] is AsyncLock


# --- AsyncLock ------------------------------------------------------------------------------------


def test_asynclock_is_final() -> None:
    """AsyncLock is @typing.final (not meant for subclassing)."""
    assert getattr(AsyncLock, "__final__", False) is True


def test_election_has_its_fixed_names() -> None:
    """Election is final and has lead(), run(), observe(), leader() and resign()."""
    assert getattr(aiolock.Election, "__final__", False) is True
    for name in ("lead", "run", "observe", "leader", "resign", "name", "key", "ttl", "identity"):
        assert hasattr(aiolock.Election, name), name
    assert list(inspect.signature(aiolock.Election).parameters) == [
        "client",
        "name",
        "ttl",
        "identity",
        "backoff",
        "prefix",
    ]


def test_asynclock_init_signature() -> None:
    """AsyncLock(client, name, *, <the contract's options>): the names and their kinds."""
    parameters = inspect.signature(AsyncLock.__init__).parameters
    positional = [
        n
        for n, p in parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"
    ]
    assert positional == ["client", "name"]
    keyword_only = [n for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert set(LOCK_OPTIONS) <= set(keyword_only)
    assert all(parameters[n].default is not inspect.Parameter.empty for n in keyword_only)


def test_asynclock_defaults() -> None:
    """The documented defaults: auto_renew and notify on, timeout None (wait forever)."""
    parameters = inspect.signature(AsyncLock.__init__).parameters
    assert parameters["auto_renew"].default is True
    assert parameters["notify"].default is True
    assert parameters["timeout"].default is None
    assert parameters["blocking"].default is True
    assert parameters["prefix"].default == "aiolock:"
    for flag in ("cancel_on_lost", "reentrant", "fencing"):
        assert parameters[flag].default is False


def test_asynclock_has_the_replicas_option() -> None:
    """The contract fixes `replicas` (WAIT acknowledgement) among AsyncLock's keyword options."""
    parameters = inspect.signature(AsyncLock.__init__).parameters
    assert "replicas" in parameters
    assert parameters["replicas"].kind is inspect.Parameter.KEYWORD_ONLY


def test_redlock_is_exported() -> None:
    """The contract names aiolock.Redlock([a, b, c], name, ttl=...) with AsyncLock's methods."""
    redlock = getattr(aiolock, "Redlock", None)
    assert redlock is not None
    for method in (*LOCK_METHODS, "__aenter__", "__aexit__"):
        assert hasattr(redlock, method), method


@pytest.mark.parametrize("method", LOCK_METHODS)
def test_asynclock_methods_are_coroutine_functions(method: str) -> None:
    """acquire/release/extend/locked/owned exist and are awaited (coroutine functions)."""
    assert inspect.iscoroutinefunction(getattr(AsyncLock, method))


def test_asynclock_is_an_async_context_manager() -> None:
    """`async with lock:` is supported: __aenter__ and __aexit__ are coroutine functions."""
    assert inspect.iscoroutinefunction(AsyncLock.__aenter__)
    assert inspect.iscoroutinefunction(AsyncLock.__aexit__)


@pytest.mark.parametrize("prop", LOCK_PROPERTIES)
def test_asynclock_properties(prop: str) -> None:
    """name, key, ttl, timeout, lost and fence are read-only properties."""
    attribute = inspect.getattr_static(AsyncLock, prop)
    assert isinstance(attribute, property)
    assert attribute.fset is None


def test_acquire_signature() -> None:
    """acquire(blocking=None, timeout=<unset>): both names fixed by the contract, with defaults."""
    parameters = inspect.signature(AsyncLock.acquire).parameters
    assert list(parameters)[1:] == ["blocking", "timeout"]
    assert parameters["blocking"].default is None
    assert parameters["timeout"].default is not inspect.Parameter.empty


def test_extend_signature() -> None:
    """extend(*, ttl=None) -> bool: the lease only by keyword, defaulting to the lock's.

    The catch-alls ``*additional_time`` and ``**redis_py`` exist only to
    refuse redis-py's ``extend(additional_time, replace_ttl=...)`` with a
    TypeError that says how it maps (tested in test_contract.py).
    """
    signature = inspect.signature(AsyncLock.extend)
    parameters = signature.parameters
    assert list(parameters)[1:] == ["additional_time", "ttl", "redis_py"]
    assert parameters["additional_time"].kind is inspect.Parameter.VAR_POSITIONAL
    assert parameters["ttl"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["ttl"].default is None
    assert parameters["redis_py"].kind is inspect.Parameter.VAR_KEYWORD
    assert signature.return_annotation in (bool, "bool")


@pytest.mark.parametrize("method", ["release", "locked", "owned"])
def test_methods_without_arguments(method: str) -> None:
    """release(), locked() and owned() take no arguments."""
    assert list(inspect.signature(getattr(AsyncLock, method)).parameters) == ["self"]


@pytest.mark.parametrize("cls", [AsyncLock, aiolock.Election], ids=lambda c: c.__name__)
def test_docstring_has_the_semantics_paragraphs_in_order(cls: type) -> None:
    """AsyncLock's and Election's docstrings end with the five semantics paragraphs, in order."""
    doc = inspect.getdoc(cls) or ""
    headings = ["Ownership", "Fairness", "Cancellation", "Expiry", "Raises"]
    positions = []
    for heading in headings:
        found = re.search(rf"^\*\*{heading}\.\*\*\s+\S", doc, flags=re.MULTILINE)
        assert found, f"no **{heading}.** paragraph"
        positions.append(found.start())
    assert positions == sorted(positions)
    last_paragraph = doc[positions[-1] :]
    assert "\n\n" not in last_paragraph.strip(), "Raises is not the last paragraph"
    paragraphs = [doc[a:b] for a, b in zip(positions, [*positions[1:], len(doc)], strict=True)]
    assert all(len(p.split()) >= 15 for p in paragraphs), "a semantics paragraph is a stub"


# --- exceptions -----------------------------------------------------------------------------------


def test_exception_tree() -> None:
    """The public contract: all derive from LockError; AcquireTimeout is also a TimeoutError."""
    assert LockError.__bases__ == (Exception,)
    assert LockNotOwnedError.__bases__ == (LockError,)
    assert LockLostError.__bases__ == (LockNotOwnedError,)
    assert AcquireTimeout.__bases__ == (LockError, TimeoutError)
    assert issubclass(AcquireTimeout, TimeoutError)
    assert not issubclass(LockError, TimeoutError)


def _tree_from_docstring() -> dict[str, str]:
    """Child -> parent, as drawn in the literal block of the _exceptions module docstring."""
    lines = (aiolock._exceptions.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("::")) + 1
    block: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            if block:
                break
            continue
        block.append(line)
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in block:
        found = re.match(r"^(?P<indent>\s*(?:(?:│\s*)*[├└]──\s*)?)(?P<name>[A-Z]\w+)\b", line)
        if not found:
            continue
        depth = len(found["indent"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[found["name"]] = stack[-1][1]
        stack.append((depth, found["name"]))
    return parents


def test_exception_tree_matches_the_module_docstring() -> None:
    """The tree drawn in aiolock._exceptions' docstring is the real class hierarchy."""
    drawn = _tree_from_docstring()
    assert drawn == {
        "LockError": "Exception",
        "LockNotOwnedError": "LockError",
        "LockLostError": "LockNotOwnedError",
        "AcquireTimeout": "LockError",
    }
    for child, parent in drawn.items():
        child_cls = getattr(aiolock, child)
        parent_cls = getattr(aiolock, parent, None) or getattr(builtins, parent)
        assert parent_cls in child_cls.__bases__, (child, parent)
    assert "TimeoutError" in (aiolock._exceptions.__doc__ or "")


def test_exceptions_are_documented_and_exported() -> None:
    """Each exception has its own docstring and is in aiolock.__all__."""
    for cls in (LockError, LockNotOwnedError, LockLostError, AcquireTimeout):
        assert (cls.__doc__ or "").strip()
        assert cls.__name__ in aiolock.__all__
    assert set(aiolock._exceptions.__all__) <= set(aiolock.__all__)


# --- packaging ------------------------------------------------------------------------------------


def test_version_matches_the_installed_distribution() -> None:
    """aiolock.__version__ is a str equal to the installed distribution's version."""
    assert isinstance(aiolock.__version__, str)
    assert aiolock.__version__ == importlib.metadata.version("aiolock-redis")
    pep440 = r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?"
    assert re.fullmatch(pep440, aiolock.__version__)


def test_package_ships_py_typed() -> None:
    """The package ships the PEP 561 marker py.typed."""
    marker = importlib.resources.files("aiolock") / "py.typed"
    assert marker.is_file()
