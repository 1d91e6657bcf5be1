"""AsyncLock on a Sentinel-managed master, across a failover (docs/design.md, Beyond one server).

A real group: one master, one replica, three sentinels
(``aiolock.testing.SentinelGroup``, failing over in about 3 s). The client is
``redis.asyncio.sentinel.Sentinel(...).master_for(...)``, a plain
``redis.asyncio.Redis`` whose pool asks the sentinels where the master is.

The two tests show the difference ``replicas`` makes in the scenario of the
article 基于redis的分布式锁详解: replication is asynchronous, so

(a) without ``replicas`` a lock granted just before the master dies can be
    missing on the promoted replica: another client gets it too, and the
    first holder learns of the loss only at its next renewal;
(b) with ``replicas=1`` an acquisition counts only once the replica has it,
    so it survives the failover, and the holder's renewals carry on against
    the new master.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import cast

import pytest
import redis.asyncio as redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError

from aiolock import AsyncLock
from aiolock.testing import RedisServer, SentinelGroup

#: The servers' behaviour, not the loop's: on asyncio's loop only (see conftest.py).
pytestmark = pytest.mark.one_loop

#: Lease of the locks: longer than a failover (about 3 s), so renewals can ride it out.
TTL = 10.0


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    """A fresh group per test: each test kills its master."""
    with SentinelGroup(replicas=1, sentinels=3) as servers:
        yield servers


@pytest.fixture
async def sentinel(group: SentinelGroup) -> AsyncIterator[Sentinel]:
    """A Sentinel client of the group."""
    s = Sentinel(group.sentinel_addresses, socket_timeout=0.5)  # type: ignore[no-untyped-call]
    yield s
    for c in s.sentinels:
        await c.aclose()


async def master_client(sentinel: Sentinel, group: SentinelGroup) -> redis.Redis:
    """A client of whatever server the sentinels say is the master."""
    return cast("redis.Redis", sentinel.master_for(group.service_name, socket_timeout=0.5))


async def promoted(sentinel: Sentinel, group: SentinelGroup, old: tuple[str, int]) -> None:
    """Wait until the sentinels name a master other than ``old`` (at most 20 s)."""
    deadline = time.monotonic() + 20.0
    while True:
        try:
            now = await sentinel.discover_master(group.service_name)
        except RedisError:
            now = old
        if tuple(now) != tuple(old):
            return
        assert time.monotonic() < deadline, "no failover within 20 s"
        await asyncio.sleep(0.1)


def is_lost(lock: AsyncLock) -> bool:
    """``lock.lost``, read through a call (so that type checkers do not narrow it)."""
    return lock.lost


def replica_of(group: SentinelGroup) -> RedisServer:
    """The one replica."""
    [replica] = [s for s in group.servers if s is not group.current_master()]
    return replica


async def test_without_replicas_a_fresh_lock_can_vanish_in_a_failover(
    group: SentinelGroup, sentinel: Sentinel, name: str
) -> None:
    """(a) Without ``replicas``, a lock the replica never received is gone after the failover.

    The replica is paused while the lock is taken, so the key reaches only the
    master; the master dies and the replica is promoted without it. Another
    client then gets the same lock while the first still thinks it holds it:
    two holders, until the first one's next renewal finds the key is not its
    own and declares the loss (within ``ttl/3``). This is documented, not a
    defect: replication is asynchronous.
    """
    first_client = await master_client(sentinel, group)
    second_client = await master_client(sentinel, group)
    lost = asyncio.Event()
    first = AsyncLock(first_client, name, ttl=TTL, on_lost=lambda _: lost.set())
    second = AsyncLock(second_client, name, ttl=TTL)
    try:
        old = await sentinel.discover_master(group.service_name)
        master = group.current_master()
        replica = replica_of(group)
        await first_client.ping()  # connected: the acquisition below is one round trip
        raw = redis.Redis.from_url(master.url)
        try:
            # Freeze the replica and cut its link, so that nothing written from now on
            # reaches it (a frozen replica still reads what the kernel buffered, and a
            # live one reconnects at once); take the lock; kill the master.
            replica.pause()
            await raw.client_kill_filter(_type="replica")
            assert await first.acquire(timeout=2.0)  # granted: nothing waits for the replica
            master.kill()
        finally:
            replica.resume()
            await raw.aclose()
        await promoted(sentinel, group, old)
        assert await second.acquire(timeout=10.0), "the promoted replica should not have the key"
        assert not lost.is_set(), "no renewal has run yet: the first holder cannot know"
        # Two holders now. The first learns it at its next renewal.
        await asyncio.wait_for(lost.wait(), TTL / 3 + 5.0)
        assert is_lost(first)
        await second.release()
    finally:
        for lock in (first, second):
            if lock.statistics().held:
                with contextlib.suppress(Exception):  # the lost one raises; the test spoke
                    await lock.release()
        await first_client.aclose()
        await second_client.aclose()


async def test_with_replicas_the_lock_survives_the_failover(
    group: SentinelGroup, sentinel: Sentinel, name: str
) -> None:
    """(b) With ``replicas=1`` a granted lock is on the replica, and survives the failover.

    While the replica is paused no acquisition succeeds (and no key is left);
    once it is back, the acquisition is acknowledged. After the master is
    killed and the replica promoted, the holder still owns the key on the new
    master, its renewals carry on there (the lease is reset), nobody else can
    take the lock, and it releases normally.
    """
    holder_client = await master_client(sentinel, group)
    other_client = await master_client(sentinel, group)
    holder = AsyncLock(holder_client, name, ttl=TTL, replicas=1, replica_timeout=0.2)
    other = AsyncLock(other_client, name, ttl=TTL)
    try:
        replica = replica_of(group)
        replica.pause()
        try:
            assert not await holder.acquire(timeout=0.5)
            assert not await holder.locked()
        finally:
            replica.resume()
        assert await holder.acquire(timeout=5.0)
        assert await holder.owned()
        old = await sentinel.discover_master(group.service_name)
        group.current_master().kill()
        await promoted(sentinel, group, old)
        assert await holder.owned(), "the acknowledged lock is missing on the promoted replica"
        assert not await other.acquire(timeout=0.5)
        # A renewal against the new master resets the lease: the PTTL goes up.
        before = await other_client.pttl(holder.key)
        deadline = time.monotonic() + TTL / 3 + 5.0
        while True:
            pttl = await other_client.pttl(holder.key)
            if pttl > before + 500:
                break
            assert time.monotonic() < deadline, f"no renewal on the new master (PTTL {pttl})"
            await asyncio.sleep(0.1)
        assert not holder.lost
        await holder.release()
        assert await other.acquire(timeout=2.0)
        await other.release()
    finally:
        for lock in (holder, other):
            if lock.statistics().held:
                await lock.release()
        await holder_client.aclose()
        await other_client.aclose()
