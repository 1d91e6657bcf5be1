"""Shared fixtures: real servers (DESIGN.md §8), clients, unique names, leak checks.

Every async test runs twice: on the default asyncio loop and on uvloop
(``pytest_asyncio_loop_factories``).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest
import redis.asyncio as redis

from aiolock.testing import RedisServer, find_server_binary, server_version


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every async test on the default asyncio loop and on uvloop."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if sys.platform != "win32":  # uvloop is a dev dependency wherever it exists
        import uvloop

        factories["uvloop"] = uvloop.new_event_loop
    return factories


def pytest_report_header(config: pytest.Config) -> str:
    """Name the server binary the suite runs against."""
    binary = find_server_binary()
    return f"aiolock server: {server_version(binary)} ({binary})"


@pytest.fixture(scope="session")
def server() -> Iterator[RedisServer]:
    """One real server shared by the session; tests use their own key names."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def private_server() -> Iterator[Callable[..., RedisServer]]:
    """Start servers of the test's own (to kill, pause or restart); all stopped after."""
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        srv = RedisServer(args=args)
        srv.start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[redis.Redis]:
    """The client the locks under test use."""
    c = redis.Redis.from_url(server.url)
    yield c
    await c.aclose()


@pytest.fixture
async def other_client(server: RedisServer) -> AsyncIterator[redis.Redis]:
    """A second client object: behaves like another process (its own local queue)."""
    c = redis.Redis.from_url(server.url)
    yield c
    await c.aclose()


@pytest.fixture
async def admin(server: RedisServer) -> AsyncIterator[redis.Redis]:
    """A separate client for assertions and fault injection, never used by a lock."""
    c = redis.Redis.from_url(server.url, decode_responses=True)
    yield c
    await c.aclose()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test (or loop variant) uses."""
    base = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:60]
    return f"{base}:{uuid.uuid4().hex[:8]}"


def is_listener(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is the release-notification listener of a client.

    Listeners outlive the waits that started them by a short linger, and end
    by themselves; :func:`no_leaks` checks that they do.
    """
    return task.get_name().startswith("aiolock-notify")


async def other_tasks() -> set[asyncio.Task[Any]]:
    """The tasks of this loop but the caller and listeners, after letting finished ones go."""
    for _ in range(3):
        await asyncio.sleep(0)
    me = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not me and not is_listener(t)}


async def listeners_gone(timeout: float = 3.0) -> bool:
    """Wait until no release-notification listener task runs; False if one still does."""
    deadline = time.monotonic() + timeout
    while any(is_listener(t) for t in asyncio.all_tasks()):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def in_use_connections(c: redis.Redis) -> int:
    """How many connections of ``c``'s pool are checked out."""
    return len(c.connection_pool._in_use_connections)


@pytest.fixture
async def no_leaks(client: redis.Redis, admin: redis.Redis, name: str) -> AsyncIterator[None]:
    """After the test: no task left running, no connection checked out, no key of ``name``."""
    yield
    assert await other_tasks() == set(), "a task outlived the test"
    assert await listeners_gone(), "a release-notification listener did not stop by itself"
    assert in_use_connections(client) == 0, "a connection was left checked out"
    assert await admin.keys(f"*{{{name}}}*") == [], "a key was left on the server"
