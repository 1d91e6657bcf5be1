"""Shared fixtures: real servers (never mocks: docs/design.md), clients, unique names, leak checks.

Every async test runs twice: on the default asyncio loop and on uvloop
(``pytest_asyncio_loop_factories``).
"""

from __future__ import annotations

import os
import sys

if os.environ.get("AIOLOCK_TEST_HIDE_HIREDIS"):
    # Before anything imports redis: redis-py then uses its pure-Python parser, as
    # on an install without hiredis (tests/topologies/test_no_hiredis.py runs tests this way).
    sys.modules["hiredis"] = None  # type: ignore[assignment]

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import pytest
import redis.asyncio as redis
from redis.utils import HIREDIS_AVAILABLE
from support.leaks import in_use_connections, listeners_gone, other_tasks
from support.locks import all_keys
from support.loops import LOOPS
from support.servers import Own, connected

import aiolock
from aiolock import LockEvent
from aiolock.testing import FaultProxy, RedisServer, find_server_binary, server_version

#: The contract suite's fixtures (``subject``, ``contract_servers``), for every module, and
#: aiolock's own pytest plugin (``aiolock_server``, ``aiolock_proxy``, ...), which the fixtures
#: below build on. An installed aiolock registers the plugin by its entry point, named after
#: the module, so listing it here never registers it twice.
pytest_plugins = ["support.contract", "aiolock.testing.pytest_plugin"]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every async test on the default asyncio loop and on uvloop.

    A test marked ``one_loop`` (what it shows is the servers', not the
    loop's: a failover, a slot migration) runs on asyncio's only, unless
    ``AIOLOCK_TEST_BOTH_LOOPS=1`` (``make loops``).
    """
    if item.get_closest_marker("one_loop") and not os.environ.get("AIOLOCK_TEST_BOTH_LOOPS"):
        return {"asyncio": LOOPS["asyncio"]}
    return LOOPS


def pytest_report_header(config: pytest.Config) -> str:
    """Name the server binary the suite runs against, and whether hiredis is used."""
    binary = find_server_binary()
    hiredis = "hidden" if HIREDIS_AVAILABLE is False else "used"
    return f"aiolock server: {server_version(binary)} ({binary}); hiredis: {hiredis}"


@pytest.fixture(scope="session")
def server(aiolock_server: RedisServer) -> RedisServer:
    """One real server shared by the session (the plugin's); tests use their own key names."""
    return aiolock_server


@pytest.fixture
def private_server(
    aiolock_server_factory: Callable[..., RedisServer],
) -> Callable[..., RedisServer]:
    """Start servers of the test's own (to kill, pause or restart); all stopped after."""
    return aiolock_server_factory


def _session_client(name: str, doc: str, **options: Any) -> Any:
    """A fixture ``name``: a client of the session server with ``options``, closed after."""

    async def fixture(server: RedisServer) -> AsyncIterator[redis.Redis]:
        async with connected(server.url, **options) as c:
            yield c

    fixture.__doc__ = doc
    return pytest.fixture(name=name)(fixture)


client = _session_client("client", "The client the locks under test use.")
other_client = _session_client(
    "other_client", "A second client object: behaves like another process (its own local queue)."
)
admin = _session_client(
    "admin",
    "A separate client for assertions and fault injection, never used by a lock.",
    decode_responses=True,
)


@pytest.fixture
async def own(private_server: Callable[..., RedisServer]) -> AsyncIterator[Own]:
    """A private server of the test's own, with a lock client and an admin (closed after)."""
    srv = private_server()
    async with connected(srv.url) as c, connected(srv.url, decode_responses=True) as a:
        yield Own(srv, c, a)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test (or loop variant) uses."""
    base = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:60]
    return f"{base}:{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def no_leaks(client: redis.Redis, admin: redis.Redis, name: str) -> AsyncIterator[None]:
    """After the test: no task left running, no connection checked out, no key of ``name``."""
    yield
    assert await other_tasks() == set(), "a task outlived the test"
    assert await listeners_gone(), "a release-notification listener did not stop by itself"
    assert in_use_connections(client) == 0, "a connection was left checked out"
    assert await admin.keys(all_keys(name)) == [], "a key was left on the server"


@pytest.fixture
def start_proxy(
    aiolock_proxy_factory: Callable[[RedisServer], Awaitable[FaultProxy]],
) -> Callable[[RedisServer], Awaitable[FaultProxy]]:
    """Start fault-injecting TCP proxies in front of servers; all closed after the test."""
    return aiolock_proxy_factory


@pytest.fixture
def proxy(aiolock_proxy: FaultProxy) -> FaultProxy:
    """A fault-injecting TCP proxy in front of the session server."""
    return aiolock_proxy


@pytest.fixture
async def proxied(proxy: FaultProxy) -> AsyncIterator[redis.Redis]:
    """A client that talks to the session server through ``proxy``."""
    async with connected(proxy.url) as c:
        yield c


@pytest.fixture
def events() -> Iterator[list[LockEvent]]:
    """Every LockEvent of the test, in order (an observer registered for the test only)."""
    seen: list[LockEvent] = []
    aiolock.add_observer(seen.append)
    try:
        yield seen
    finally:
        aiolock.remove_observer(seen.append)
