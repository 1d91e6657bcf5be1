"""Process-local state belongs to its event loop and its process.

A script that calls ``asyncio.run`` twice with one client, or a child forked
after its parent's loop ended with a lock held, must start clean: the local
queue of the old loop (its holder task, its waiters' futures) is of no use
to the new one. Before the fix, such a client's ``acquire(timeout=2)``
returned False after 2 s, every time, for the rest of the process.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis
from support.servers import started_servers

from aiolock import AsyncLock, Redlock
from aiolock.testing import RedisServer

#: How long an acquire of a free lock may take here (it takes milliseconds).
QUICK = 1.0


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    """Three private servers: one for AsyncLock, all three for Redlock."""
    with started_servers(3) as started:
        yield started


def lock_maker(
    kind: str, servers: list[RedisServer]
) -> tuple[list[aioredis.Redis], Callable[[str], AsyncLock | Redlock]]:
    """Clients (kept across loops) and a factory of the primitive on them."""
    if kind == "AsyncLock":
        clients = [aioredis.Redis.from_url(servers[0].url)]
        return clients, lambda name: AsyncLock(clients[0], name, ttl=5.0)
    clients = [aioredis.Redis.from_url(s.url) for s in servers]
    return clients, lambda name: Redlock(clients, name, ttl=5.0)


def expire_everywhere(servers: list[RedisServer], key: str) -> None:
    """Let the lease of ``key`` run out now on every server (PEXPIRE 1), and wait for it."""
    for server in servers:
        with redis.Redis.from_url(server.url) as admin:
            admin.pexpire(key, 1)
    time.sleep(0.05)


async def close_all(clients: list[aioredis.Redis]) -> None:
    """Close the clients' connections (the client objects stay usable)."""
    for c in clients:
        await c.aclose()


async def take_once(lock: AsyncLock | Redlock, clients: list[aioredis.Redis]) -> tuple[bool, float]:
    """Acquire (timeout 2 s) and release ``lock``; whether it was acquired, and how long it took."""
    started = time.monotonic()
    ok = await lock.acquire(timeout=2.0)
    took = time.monotonic() - started
    if ok:
        await lock.release()
    await close_all(clients)
    return ok, took


@pytest.mark.parametrize("kind", ["AsyncLock", "Redlock"])
@pytest.mark.parametrize("same_object", [True, False], ids=["same-object", "new-object"])
def test_a_second_asyncio_run_acquires_after_the_first_ended_holding_the_lock(
    servers: list[RedisServer], kind: str, same_object: bool, request: pytest.FixtureRequest
) -> None:
    """Regression: a new event loop does not inherit the old loop's holder.

    The first ``asyncio.run`` acquires and ends without releasing: as its
    loop shuts down, a ResourceWarning says the lock was never released (its
    renewal stops there). Once the lease is over on the server, the second
    acquires at once, through the same lock object or a new one on the same
    clients.
    """
    name = f"loops-{kind}-{same_object}-{request.node.name[-20:]}"
    clients, make = lock_maker(kind, servers)
    first = make(name)

    async def hold_and_leave() -> None:
        assert await first.acquire()
        await close_all(clients)

    never_released = rf"lock {re.escape(repr(name))} was never released.*shut down"
    with pytest.warns(ResourceWarning, match=never_released):
        asyncio.run(hold_and_leave())
    expire_everywhere(servers, first.key)
    again = first if same_object else make(name)

    ok, took = asyncio.run(take_once(again, clients))
    assert ok, "the second loop could not take a free lock"
    assert took < QUICK, took


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_with_a_clean_local_queue(servers: list[RedisServer]) -> None:
    """Regression: a child forked after its parent's loop held a lock acquires at once.

    The parent's loop ended with the lock held (a ResourceWarning says so);
    its lease then ran out. The child inherits the client and the lock
    object and takes the lock in a loop of its own, within a second.
    """
    clients, make = lock_maker("AsyncLock", servers)
    lock = make("forked-child")

    async def hold_and_leave() -> None:
        assert await lock.acquire()
        await close_all(clients)

    with pytest.warns(ResourceWarning, match="'forked-child' was never released"):
        asyncio.run(hold_and_leave())
    expire_everywhere(servers, lock.key)

    async def take() -> int:
        ok, took = await take_once(lock, clients)
        return 0 if ok and took < QUICK else 1

    pid = os.fork()
    if pid == 0:  # the child: report by exit status only
        code = 2
        try:
            code = asyncio.run(take())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child could not take the free lock"
