"""The errors a reset connection sends to the caller are redis-py's, on both event loops.

Found by the soak (``benchmarks/soak.py``): on uvloop, a command sent on a
pooled connection that the server (here, a proxy) has reset fails inside
redis-py with a bare ``RuntimeError("unable to perform operation on
<TCPTransport closed=True ...>")``, which redis-py does not translate (it only
translates ``OSError``). Callers who catch ``redis.exceptions.RedisError``
around ``async with lock`` would miss it. aiolock turns exactly that error into
``redis.exceptions.ConnectionError`` (with the original as its cause).

A server that cannot be reached at all does not stretch a deadline either:
an attempt still waiting for a connection at its deadline is abandoned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolock import AsyncLock
from aiolock._keys import Keys
from aiolock.testing import FaultProxy, RedisServer, free_port


async def _after_reset(
    server: RedisServer, name: str, action: Callable[[AsyncLock], Awaitable[object]]
) -> BaseException | None:
    """Run ``action`` on a lock whose client's pooled connection was just reset; its error."""
    async with FaultProxy(server.host, server.port) as proxy:
        client = redis.Redis.from_url(proxy.url)
        try:
            lock = AsyncLock(client, name, ttl=5.0, timeout=1.0)
            async with lock:  # one pooled connection, idle afterwards
                pass
            await proxy.reset_all()
            await asyncio.sleep(0.05)  # the loop sees the reset and closes the transport
            try:
                await action(lock)
            except Exception as exc:
                return exc
            return None
        finally:
            await client.aclose()


async def _enter(lock: AsyncLock) -> None:
    async with lock:
        pass


async def _locked(lock: AsyncLock) -> None:
    await lock.locked()


@pytest.mark.parametrize("action", [_enter, _locked], ids=["async-with", "locked"])
async def test_reset_connection_raises_redis_connection_error(
    server: RedisServer, name: str, action: Callable[[AsyncLock], Awaitable[object]]
) -> None:
    """A command on a connection reset under it raises redis-py's ConnectionError, never a bare
    RuntimeError (uvloop's closed-transport error is translated), and no key is left behind.
    """
    error = await _after_reset(server, name, action)
    assert error is not None, "the reset connection was used without an error"
    assert isinstance(error, RedisConnectionError), f"{type(error).__qualname__}: {error}"
    assert str(error), "the error has no message"
    admin = redis.Redis.from_url(server.url)
    try:
        assert await admin.exists(Keys(name).lock) == 0
    finally:
        await admin.aclose()


@pytest.mark.parametrize("timeout", [0.2, 1.0])
async def test_acquire_against_a_closed_port_ends_within_its_timeout(timeout: float) -> None:
    """Nothing listens: acquire(timeout=t) raises redis-py's ConnectionError within t + 0.5 s.

    The client is the README's ``redis.Redis(port=...)``, whose default retry
    policy keeps reconnecting for seconds (5.0-5.2 s before, whatever the
    timeout). An attempt that is still waiting for a connection at the
    deadline cannot have reached the server: it is abandoned there, and
    there is nothing to undo.
    """
    client = redis.Redis(port=free_port())
    try:
        lock = AsyncLock(client, "nobody-listens")
        started = time.monotonic()
        with pytest.raises(RedisConnectionError):
            await lock.acquire(timeout=timeout)
        took = time.monotonic() - started
        assert took < timeout + 0.5, f"took {took:.2f} s"
        assert not lock.lost
    finally:
        await client.aclose()
