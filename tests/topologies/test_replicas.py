"""``replicas=n``: an acquisition counts only once ``n`` replicas acknowledged it (docs/design.md).

After the acquire script, ``WAIT n timeout`` runs on the same connection (one
pipeline), so it waits for that very write. Without the acknowledgement in
time the attempt fails: the key is released and the waiter goes on (or times
out). With ``replica_fsync=True`` it is ``WAITAOF 0 n timeout``. Real servers:
a master and a replica (``aiolock.testing.ReplicatedServer``); the replica is
paused with SIGSTOP to withhold its acknowledgement.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as redis
from support.locks import CriticalSection, all_keys, keys_of
from support.servers import has

from aiolock import AcquireTimeout, AsyncLock, LockError
from aiolock.testing import RedisServer, ReplicatedServer

#: Slack for timing bounds on 2 loaded cores.
SLACK = 0.3


@pytest.fixture(scope="module")
def group() -> Iterator[ReplicatedServer]:
    """A master with one replica, shared by the module; each test uses its own names."""
    with ReplicatedServer(replicas=1) as servers:
        yield servers


@pytest.fixture
def replica(group: ReplicatedServer) -> Iterator[RedisServer]:
    """The replica, resumed after the test whatever happened."""
    yield group.replicas[0]
    if group.replicas[0].paused:
        group.replicas[0].resume()


@pytest.fixture
async def master(group: ReplicatedServer) -> AsyncIterator[redis.Redis]:
    """A client of the master, for the locks under test."""
    c = redis.Redis.from_url(group.url)
    yield c
    await c.aclose()


@pytest.fixture
async def on_master(group: ReplicatedServer, name: str) -> AsyncIterator[redis.Redis]:
    """A client of the master for assertions; after the test, no key of ``name`` is left."""
    c = redis.Redis.from_url(group.url, decode_responses=True)
    yield c
    assert await c.keys(all_keys(name)) == [], "a key was left on the master"
    await c.aclose()


@pytest.fixture
async def on_replica(replica: RedisServer) -> AsyncIterator[redis.Redis]:
    """A client of the replica (read only)."""
    c = redis.Redis.from_url(replica.url, decode_responses=True)
    yield c
    await c.aclose()


async def test_an_acknowledged_acquisition_is_on_the_replica_when_acquire_returns(
    master: redis.Redis, on_master: redis.Redis, on_replica: redis.Redis, name: str
) -> None:
    """``replicas=1``: when ``acquire()`` returns True the replica already has our token."""
    lock = AsyncLock(master, name, replicas=1)
    assert await lock.acquire(timeout=2.0)
    try:
        token = await on_master.get(lock.key)
        assert token is not None
        assert await on_replica.get(lock.key) == token
    finally:
        await lock.release()


async def test_without_the_replica_the_attempt_fails_and_leaves_no_key(
    master: redis.Redis,
    on_master: redis.Redis,
    on_replica: redis.Redis,
    replica: RedisServer,
    name: str,
) -> None:
    """While the replica is paused, ``replicas=1`` never reports the lock held, and leaves no key.

    ``acquire(timeout=0.6)`` keeps trying (each attempt waits ``replica_timeout``
    for the acknowledgement, then releases) and returns False within its
    timeout; ``blocking=False`` makes one attempt; ``async with`` raises
    ``AcquireTimeout``. Once the replica is back, the replica holds no key
    either, and the next acquisition succeeds.
    """
    lock = AsyncLock(master, name, replicas=1, replica_timeout=0.1)
    replica.pause()
    try:
        started = time.monotonic()
        assert not await lock.acquire(timeout=0.6)
        took = time.monotonic() - started
        assert 0.5 <= took <= 0.6 + SLACK, took
        assert await on_master.exists(lock.key) == 0, "an unacknowledged key was left"
        assert not await lock.acquire(blocking=False)
        assert await on_master.exists(lock.key) == 0
        with pytest.raises(AcquireTimeout):
            async with AsyncLock(master, name, replicas=1, replica_timeout=0.1, timeout=0.3):
                pass
        assert await on_master.exists(lock.key) == 0
    finally:
        replica.resume()
    assert await lock.acquire(timeout=2.0)
    await lock.release()
    await asyncio.sleep(0.05)  # replication of the release
    assert await on_replica.exists(lock.key) == 0


async def test_a_waiter_goes_on_and_gets_the_lock_once_the_replica_is_back(
    master: redis.Redis, on_master: redis.Redis, replica: RedisServer, name: str
) -> None:
    """A waiter that cannot get acknowledgements keeps trying, and wins once the replica is up."""
    lock = AsyncLock(master, name, replicas=1, replica_timeout=0.05)
    replica.pause()
    waiting = asyncio.create_task(lock.acquire(timeout=5.0))
    try:
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the waiter gave up (or got an unacknowledged lock)"
        # Each attempt's key is on the master while its WAIT runs, then released.
        assert not lock.statistics().held
    finally:
        replica.resume()
    assert await asyncio.wait_for(waiting, 3.0)
    await lock.release()


async def test_a_local_hand_over_does_not_bypass_the_acknowledgement(
    master: redis.Redis, on_master: redis.Redis, replica: RedisServer, name: str
) -> None:
    """A task waiting in the same process gets the lock only if the replica acknowledges it.

    Without ``replicas`` a release hands the lock straight to the next local
    task (one script, no ``WAIT``); with it, that task must acquire on the
    server itself, so it cannot get the lock while the replica is paused.
    """
    holder = AsyncLock(master, name, replicas=1, replica_timeout=0.05)
    heir = AsyncLock(master, name, replicas=1, replica_timeout=0.05)
    assert await holder.acquire(timeout=2.0)
    waiting = asyncio.create_task(heir.acquire(timeout=0.6))
    await asyncio.sleep(0.05)
    assert heir.statistics().tasks_waiting == 1
    replica.pause()
    try:
        await holder.release()
        assert not await waiting, "the heir got a lock the replica never acknowledged"
        assert await on_master.exists(holder.key) == 0
    finally:
        replica.resume()


async def test_local_tasks_with_replicas_take_turns(
    master: redis.Redis, on_master: redis.Redis, name: str
) -> None:
    """Twenty tasks of one process with ``replicas=1`` each hold the lock, one at a time."""
    section = CriticalSection()

    async def use() -> None:
        async with AsyncLock(master, name, replicas=1, timeout=10.0):
            await section.stay()

    await asyncio.wait_for(asyncio.gather(*(use() for _ in range(20))), 15.0)
    assert (section.holdings, section.overlaps) == (20, 0)


async def test_fencing_with_replicas(
    master: redis.Redis, on_master: redis.Redis, on_replica: redis.Redis, name: str
) -> None:
    """``fencing=True`` with ``replicas=1``: the fence is minted and replicated with the lock."""
    lock = AsyncLock(master, name, replicas=1, fencing=True)
    assert await lock.acquire(timeout=2.0)
    first = lock.fence
    await lock.release()
    assert await lock.acquire(timeout=2.0)
    try:
        assert first is not None
        assert lock.fence is not None
        assert lock.fence > first
        assert await on_replica.get(keys_of(lock).fence) == str(lock.fence)
    finally:
        await lock.release()
        await on_master.delete(keys_of(lock).fence)


async def test_replica_fsync_needs_the_replicas_append_only_file(name: str) -> None:
    """``replica_fsync=True`` waits for ``WAITAOF``: granted when the replica writes an AOF.

    With ``appendonly yes`` on the replica the acquisition is acknowledged;
    with the default ``appendonly no`` it never is, so the attempt fails
    cleanly and leaves no key. On a server without ``WAITAOF`` (Redis before
    7.2, in ``make matrix``) the attempt is a ``LockError`` naming it, and
    leaves no key.
    """
    with ReplicatedServer(replicas=1, args=["--appendonly", "yes"]) as aof:
        c = redis.Redis.from_url(aof.url)
        try:
            lock = AsyncLock(c, name, replicas=1, replica_fsync=True)
            if not has("WAITAOF"):
                with pytest.raises(LockError, match=r"needs the WAITAOF command.*7\.2"):
                    await lock.acquire(timeout=2.0)
                assert await c.exists(lock.key) == 0
                return
            assert await lock.acquire(timeout=2.0)
            await lock.release()
        finally:
            await c.aclose()
    with ReplicatedServer(replicas=1) as plain:
        c = redis.Redis.from_url(plain.url)
        try:
            lock = AsyncLock(c, name, replicas=1, replica_fsync=True, replica_timeout=0.05)
            assert not await lock.acquire(timeout=0.3)
            assert await c.exists(lock.key) == 0
        finally:
            await c.aclose()


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"replicas": -1}, ValueError, "replicas must be >= 0, got -1"),
        ({"replicas": True}, TypeError, "replicas must be an int, got True"),
        ({"replicas": "1"}, TypeError, "replicas must be an int, got '1'"),
        ({"replicas": 1.0}, TypeError, "replicas must be an int, got 1.0"),
        ({"replica_timeout": 0}, ValueError, "replica_timeout must be a finite number"),
        ({"replica_timeout": float("nan")}, ValueError, "replica_timeout must not be NaN"),
        ({"replica_timeout": "1"}, TypeError, "replica_timeout must be a number"),
        ({"replica_fsync": 1}, TypeError, "replica_fsync must be True or False"),
    ],
)
def test_bad_replica_options_name_the_argument(
    options: dict[str, object], error: type[Exception], words: str
) -> None:
    """Bad ``replicas``/``replica_timeout``/``replica_fsync`` fail at construction, naming them."""
    c = redis.Redis()
    with pytest.raises(error) as raised:
        AsyncLock(c, "name", **options)  # type: ignore[arg-type]
    assert words in str(raised.value)


def test_replicas_on_a_cluster_client_is_refused() -> None:
    """``replicas`` with a ``RedisCluster`` client fails at construction (no connection made)."""
    cluster = redis.RedisCluster(host="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="replicas=1 is not available with a RedisCluster"):
        AsyncLock(cluster, "name", replicas=1)
