"""Redlock over five independent real servers (docs/design.md, Beyond one server).

Nodes are killed, paused (SIGSTOP) and flushed on purpose; every test ends
with a leak check: no task left, no connection checked out, no key of the
test's name on a node that stayed reachable. A node that was paused is
flushed instead: a ``SET`` that was cut off while it was frozen still sits in
its socket and runs when it resumes (its key then expires with its lease),
which is the documented limit of any cleanup.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import re
import time
import uuid
from asyncio import timeout as asyncio_timeout
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.leaks import in_use_connections, other_tasks
from support.locks import LossRecorder, all_keys
from support.loops import LOOPS, run_on
from support.servers import started_servers
from support.timing import eventually

from aiolock import (
    AcquireTimeout,
    LockEvent,
    LockLostError,
    LockNotOwnedError,
    LockStatistics,
    Redlock,
    backoff,
)
from aiolock._keys import Keys
from aiolock.testing import RedisServer

#: Five nodes: a quorum of three, two failures tolerated.
N = 5
#: Scheduling slack for timing bounds (2 loaded cores, two loop flavours).
SLACK = 0.25
#: A quick retry policy for contention tests.
QUICK = backoff.exponential(base=0.001, factor=2.0, cap=0.02)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    """Five private servers for the module: the independent masters."""
    with started_servers(N) as started:
        yield started


def _str(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class Nodes:
    """The five servers of one test: clients, admin clients, faults, and the leak check."""

    def __init__(self, servers: list[RedisServer], name: str) -> None:
        self.servers = servers
        self.name = name
        self.admins: list[aioredis.Redis] = [
            aioredis.Redis.from_url(s.url, decode_responses=True, socket_timeout=2.0)
            for s in servers
        ]
        self.client_sets: list[list[aioredis.Redis]] = []
        #: Nodes that were paused: they may run a cut-off SET when resumed.
        self.tainted: set[int] = set()

    def clients(self) -> list[aioredis.Redis]:
        """A new set of five clients: one "process" of its own."""
        clients = [aioredis.Redis.from_url(s.url) for s in self.servers]
        self.client_sets.append(clients)
        return clients

    def key(self, prefix: str = "aiolock:") -> str:
        return Keys(self.name, prefix).lock

    def kill(self, *indexes: int) -> None:
        for i in indexes:
            self.servers[i].kill()

    def pause(self, *indexes: int) -> None:
        for i in indexes:
            self.tainted.add(i)
            self.servers[i].pause()

    def resume(self, *indexes: int) -> None:
        for i in indexes:
            self.servers[i].resume()

    def reachable(self) -> list[int]:
        return [i for i, s in enumerate(self.servers) if s.running and not s.paused]

    async def values(self, key: str | None = None) -> dict[int, str | None]:
        """The key's value on every reachable node."""
        k = key or self.key()
        return {i: _str(await self.admins[i].get(k)) for i in self.reachable()}

    async def holders(self, key: str | None = None) -> dict[int, str]:
        """The nodes (reachable) that have the key, with its value."""
        return {i: v for i, v in (await self.values(key)).items() if v is not None}

    async def leftovers(self) -> dict[int, list[str]]:
        """Keys of the test's name on reachable, untainted nodes."""
        found: dict[int, list[str]] = {}
        for i in self.reachable():
            if i in self.tainted:
                continue
            keys = await self.admins[i].keys(all_keys(self.name))
            if keys:
                found[i] = [_str(k) or "" for k in keys]
        return found

    async def flush(self, *indexes: int) -> None:
        for i in indexes:
            await self.admins[i].flushall()


@pytest.fixture
async def nodes(servers: list[RedisServer], name: str) -> AsyncIterator[Nodes]:
    """The five nodes, all up; after the test: no leaked task, connection or key."""
    for srv in servers:
        if srv.paused:
            srv.resume()
        if not srv.running:
            srv.restart()
    n = Nodes(servers, name)
    try:
        yield n
        assert await other_tasks() == set(), "a task outlived the test"
        for clients in n.client_sets:
            for c in clients:
                assert in_use_connections(c) == 0, "a connection was left checked out"
        assert await n.leftovers() == {}, "a key was left on a reachable node"
    finally:
        for srv in servers:
            if srv.paused:
                srv.resume()
            if not srv.running:
                srv.restart()
        for i in n.tainted:
            with_admin = aioredis.Redis.from_url(servers[i].url, socket_timeout=2.0)
            await with_admin.flushall()
            await with_admin.aclose()
        for clients in n.client_sets:
            for c in clients:
                await c.aclose()
        for a in n.admins:
            await a.aclose()


async def _expired(nodes: Nodes, timeout: float = 2.0) -> None:
    """Wait until no reachable node has the key (a lease running out)."""
    async with asyncio_timeout(timeout):
        while await nodes.holders():
            await asyncio.sleep(0.005)


# --- 1. the happy path ---------------------------------------------------------------------------


async def test_acquires_on_all_nodes_and_releases_from_all(nodes: Nodes) -> None:
    """All five up: one fresh token on every node while held; none anywhere after release."""
    lock = Redlock(nodes.clients(), nodes.name, ttl=5.0)
    assert lock.quorum == 3
    assert lock.node_timeout == pytest.approx(0.1)
    assert await lock.acquire()
    held = await nodes.holders()
    assert len(held) >= lock.quorum
    tokens = set(held.values())
    assert len(tokens) == 1
    token = tokens.pop()
    assert re.fullmatch(r"[0-9a-f]{44}:[^ ]+", token), token
    for i in held:
        assert 0 < await nodes.admins[i].pttl(lock.key) <= 5000
    assert await lock.owned()
    assert await lock.locked()
    assert not lock.lost
    await lock.release()
    assert await nodes.holders() == {}
    assert not await lock.locked()
    assert not await lock.owned()

    # The next acquisition gets a new token.
    async with lock:
        again = set((await nodes.holders()).values())
    assert again
    assert again != {token}


# --- 2. a minority down --------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_acquires_with_two_of_five_nodes_down(nodes: Nodes, fault: str) -> None:
    """Two nodes killed or paused: acquired on the other three; a paused node costs node_timeout."""
    limit = 0.1
    lock = Redlock(nodes.clients(), nodes.name, ttl=5.0, node_timeout=limit)
    async with lock:  # warm the connections
        pass
    getattr(nodes, fault)(3, 4)
    started = time.monotonic()
    assert await lock.acquire(timeout=2.0)
    took = time.monotonic() - started
    assert took < limit + SLACK, f"acquire took {took:.3f} s"
    if fault == "pause":
        assert took >= limit, "a paused node must be waited for (up to node_timeout), not skipped"
    held = await nodes.holders()
    assert sorted(held) == [0, 1, 2]
    assert len(set(held.values())) == 1
    assert await lock.owned()
    assert await lock.locked()
    started = time.monotonic()
    await lock.release()
    assert time.monotonic() - started < limit + SLACK
    assert await nodes.holders() == {}


async def test_renews_and_releases_with_two_nodes_down(nodes: Nodes) -> None:
    """Renewal with two nodes killed: a majority keeps renewing; the lock is never lost."""
    lock = Redlock(nodes.clients(), nodes.name, ttl=0.3, node_timeout=0.1)
    nodes.kill(3, 4)
    async with lock:
        await asyncio.sleep(0.8)  # well past the lease: renewed by the three
        assert not lock.lost
        assert await lock.owned()
        for i in (0, 1, 2):
            assert 0 < await nodes.admins[i].pttl(lock.key) <= 300
    assert await nodes.holders() == {}


# --- 3. a majority down -------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_refuses_within_its_timeout_with_three_of_five_down(nodes: Nodes, fault: str) -> None:
    """Three nodes killed or paused: acquire(timeout=0.5) is False in time; nothing is left.

    ``False``: the live nodes answered, and no majority granted it. Their
    limit leaves room for a loaded machine: if they too missed it at the
    deadline, the answer would be a late node's ``TimeoutError`` instead.
    """
    limit = 0.25
    lock = Redlock(nodes.clients(), nodes.name, ttl=5.0, node_timeout=limit)
    getattr(nodes, fault)(2, 3, 4)
    started = time.monotonic()
    assert await lock.acquire(timeout=0.5) is False
    took = time.monotonic() - started
    # An attempt in flight at the deadline is finished and cleaned up: 2 node limits.
    assert 0.5 <= took < 0.5 + 2 * limit + SLACK, f"acquire(timeout=0.5) took {took:.3f} s"
    assert await nodes.holders() == {}

    timed = Redlock(nodes.clients(), nodes.name, ttl=5.0, node_timeout=limit, timeout=0.2)
    started = time.monotonic()
    with pytest.raises(AcquireTimeout):
        async with timed:
            pytest.fail("entered a lock held on a minority only")
    took = time.monotonic() - started
    assert 0.2 <= took < 0.2 + 2 * limit + SLACK, f"async with (timeout=0.2) took {took:.3f} s"

    started = time.monotonic()
    assert await lock.acquire(blocking=False) is False
    assert time.monotonic() - started < 2 * limit + SLACK
    assert await nodes.holders() == {}


async def test_every_node_down_raises_redis_error(nodes: Nodes) -> None:
    """All nodes killed: acquire raises redis-py's ConnectionError (after cleanup), at once."""
    lock = Redlock(nodes.clients(), nodes.name, node_timeout=0.2)
    nodes.kill(0, 1, 2, 3, 4)
    started = time.monotonic()
    with pytest.raises(RedisError):
        await lock.acquire(timeout=5.0)
    assert time.monotonic() - started < 0.4 + SLACK  # one attempt and its cleanup
    with pytest.raises(RedisError):
        async with lock:
            pytest.fail("entered with every node down")


async def test_every_node_paused_raises_redis_timeout(nodes: Nodes) -> None:
    """All nodes paused and no timeout: late attempts are retried for one lease, then TimeoutError.

    Every node missing ``node_timeout`` is often only a busy event loop, so an
    attempt like that is retried; with no timeout to end the wait, the
    waiter gives up after one ``ttl`` of such attempts, raising redis-py's
    ``TimeoutError``. No hang.
    """
    lock = Redlock(nodes.clients(), nodes.name, ttl=0.5, node_timeout=0.1)
    async with lock:  # warm the connections
        pass
    nodes.pause(0, 1, 2, 3, 4)
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError, match="node_timeout"):
        await lock.acquire()
    took = time.monotonic() - started
    # One lease of attempts (each: the node limit, then the cleanup's), then the last one.
    assert 0.5 <= took < 0.5 + 0.2 + 0.5 + SLACK, f"took {took:.3f} s"


async def test_some_nodes_down_and_the_rest_late_is_not_an_error(nodes: Nodes) -> None:
    """Three nodes killed, two paused (late): ``acquire(timeout=0.4)`` says "no answer".

    Regression test for a flake of the fresh-clone run: under load the live
    nodes missed ``node_timeout``, every node had failed, and the refused
    connections' ``ConnectionError`` was raised from ``acquire`` although
    the late nodes were up. A late node is no verdict: the attempt is
    retried, and at the deadline the answer is redis-py's ``TimeoutError``
    of a late node (not ``False``: nobody was seen holding it).
    """
    lock = Redlock(nodes.clients(), nodes.name, node_timeout=0.1)
    async with lock:  # warm the connections
        pass
    nodes.kill(0, 1, 2)
    nodes.pause(3, 4)
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError, match="did not answer within node_timeout"):
        await lock.acquire(timeout=0.4)
    took = time.monotonic() - started
    assert 0.4 <= took < 0.4 + 0.2 + SLACK, f"took {took:.3f} s"


async def test_every_node_paused_with_a_timeout_says_no_answer(nodes: Nodes) -> None:
    """All nodes paused, ``acquire(timeout=0.4)``: "no answer" by the timeout, not False."""
    lock = Redlock(nodes.clients(), nodes.name, node_timeout=0.1)
    async with lock:  # warm the connections
        pass
    nodes.pause(0, 1, 2, 3, 4)
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError, match="did not answer within node_timeout"):
        await lock.acquire(timeout=0.4)
    took = time.monotonic() - started
    assert 0.4 <= took < 0.4 + 0.2 + SLACK, f"took {took:.3f} s"


# --- 4. a failed attempt leaves nothing ----------------------------------------------------------


@pytest.mark.parametrize("third", ["held", "killed"])
async def test_failed_attempt_leaves_no_key_on_any_reachable_node(nodes: Nodes, third: str) -> None:
    """Two nodes hold another token and a third is held or down: our SETs on the rest are undone."""
    foreign = "someone-else"
    for i in (0, 1):
        await nodes.admins[i].set(nodes.key(), foreign, px=30_000)
    if third == "held":
        await nodes.admins[2].set(nodes.key(), foreign, px=30_000)
    else:
        nodes.kill(2)
    lock = Redlock(nodes.clients(), nodes.name, ttl=30.0, node_timeout=0.2)
    # One attempt: its SET surely succeeded on nodes 3 and 4 (free and up).
    assert await lock.acquire(blocking=False) is False
    expected = {0: foreign, 1: foreign} | ({2: foreign} if third == "held" else {})
    assert await nodes.holders() == expected
    # Many attempts, with jittered pauses between them.
    lock2 = Redlock(nodes.clients(), nodes.name, ttl=30.0, backoff=QUICK, node_timeout=0.2)
    assert await lock2.acquire(timeout=0.3) is False
    assert await nodes.holders() == expected
    for i in expected:
        assert await nodes.admins[i].delete(nodes.key()) == 1


# --- 5. validity -------------------------------------------------------------------------------


async def test_attempt_whose_elapsed_eats_the_validity_is_refused(
    nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    """One node paused, node_timeout ~ ttl: four nodes grant it, but no validity is left."""
    caplog.set_level(logging.DEBUG, logger="aiolock")
    nodes.pause(4)
    # ttl 0.1 s leaves 0.097 s after the drift allowance; every attempt waits 0.099 s
    # for the paused node.
    lock = Redlock(nodes.clients(), nodes.name, ttl=0.1, node_timeout=0.099)
    assert await lock.acquire(timeout=0.3) is False
    assert await nodes.holders() == {}, "the refused attempts were not cleaned up"
    assert any("a majority granted it but" in r.getMessage() for r in caplog.records), (
        "no attempt was refused for lack of validity"
    )
    # The same nodes with a lease that leaves validity: acquired.
    roomy = Redlock(nodes.clients(), nodes.name, ttl=1.0, node_timeout=0.099)
    assert await roomy.acquire(timeout=1.0)
    assert sorted(await nodes.holders()) == [0, 1, 2, 3]
    await roomy.release()
    assert await nodes.holders() == {}


async def test_lease_is_counted_from_before_sending_minus_drift(nodes: Nodes) -> None:
    """The holder's lease ends ttl - drift after the attempt was sent: `lost` flips right then."""
    ttl = 0.3
    counted = ttl - (ttl * 0.01 + 0.002)
    lock = Redlock(nodes.clients(), nodes.name, ttl=ttl, auto_renew=False, node_timeout=0.1)
    started = time.monotonic()
    assert await lock.acquire()
    acquired = time.monotonic()
    # Whatever the scheduling: not lost before `started + counted`, lost after `acquired + counted`.
    while True:
        before = time.monotonic()
        lost = lock.lost
        after = time.monotonic()
        if after < started + counted:
            assert not lost, f"lost {started + counted - after:.4f} s before the counted lease end"
        if before >= acquired + counted:
            assert lost, "the holder counted a longer lease than ttl - drift"
            break
        await asyncio.sleep(0.002)
    with pytest.raises(LockLostError):
        await lock.release()
    await _expired(nodes)


# --- 6. mutual exclusion -------------------------------------------------------------------------


async def test_mutual_exclusion_across_client_sets_and_tasks(nodes: Nodes) -> None:
    """Three "processes" (client sets) x four tasks contend: never two holders at once."""
    locks = [
        Redlock(nodes.clients(), nodes.name, ttl=2.0, backoff=QUICK, node_timeout=0.2)
        for _ in range(3)
    ]
    inside = 0
    most = 0
    entries = 0

    async def worker(lock: Redlock, rounds: int) -> None:
        nonlocal inside, most, entries
        for _ in range(rounds):
            async with lock:
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(random.uniform(0, 0.002))
                assert inside == 1
                inside -= 1
                entries += 1

    async with asyncio_timeout(20.0), anyio.create_task_group() as tg:
        for lock in locks:
            for _ in range(4):
                tg.start_soon(worker, lock, 5)
    assert most == 1
    assert entries == 3 * 4 * 5
    assert await nodes.holders() == {}


async def test_an_acquiring_task_that_ends_holding_leaves_the_holding_renewed(
    nodes: Nodes,
) -> None:
    """A task acquires and ends holding: the holding goes on, renewed, until any task releases.

    Another task of the same object waits meanwhile (three leases and more),
    and gets the lock once the holding is released.
    """
    losses = LossRecorder()
    lock = Redlock(nodes.clients(), nodes.name, ttl=0.3, on_lost=losses.function, node_timeout=0.1)

    async def forgetful() -> None:
        assert await lock.acquire()

    await asyncio.create_task(forgetful())
    assert not await lock.acquire(timeout=1.0), "the detached holding lapsed"
    assert await lock.owned()
    await lock.release()
    started = time.monotonic()
    assert await lock.acquire(timeout=3.0)
    assert time.monotonic() - started < SLACK
    assert losses.locks == []
    await lock.release()
    await _expired(nodes)


# --- 7. renewal and loss -----------------------------------------------------------------------


async def test_minority_losing_the_key_is_not_a_loss(nodes: Nodes) -> None:
    """Two nodes flushed while held: the other three keep renewing; no loss."""
    losses = LossRecorder()
    lock = Redlock(nodes.clients(), nodes.name, ttl=0.3, on_lost=losses.function, node_timeout=0.1)
    async with lock:
        await nodes.flush(3, 4)
        await asyncio.sleep(0.5)
        assert not lock.lost
        assert sorted(await nodes.holders()) == [0, 1, 2]
    assert losses.locks == []


@pytest.mark.parametrize("fault", ["flushall", "restart"])
async def test_majority_losing_the_key_is_a_loss(nodes: Nodes, fault: str) -> None:
    """Three nodes flushed or restarted: loss declared, on_lost runs, LockLostError on exit."""
    losses = LossRecorder()
    lock = Redlock(nodes.clients(), nodes.name, ttl=0.3, on_lost=losses.function, node_timeout=0.1)

    async def body() -> None:
        async with lock:
            if fault == "flushall":
                await nodes.flush(0, 1, 2)
            else:
                for i in (0, 1, 2):
                    nodes.servers[i].restart()
            await losses.wait(timeout=3.0)
            assert lock.lost

    with pytest.raises(LockLostError):
        await body()
    assert losses.locks == [lock]
    assert lock.lost
    assert not await lock.owned()
    for i in (3, 4):  # the minority keeps our key until its lease ends
        await nodes.admins[i].delete(lock.key)


async def test_release_after_majority_loss_raises_lock_lost(nodes: Nodes) -> None:
    """No renewal: three nodes flushed; release finds the majority gone: LockLostError, on_lost."""
    losses = LossRecorder()
    lock = Redlock(nodes.clients(), nodes.name, ttl=10.0, auto_renew=False, on_lost=losses.function)
    assert await lock.acquire()
    await nodes.flush(0, 1, 2)
    with pytest.raises(LockLostError, match="majority"):
        await lock.release()
    assert losses.locks == [lock]
    assert await nodes.holders() == {}, "our key on the minority was deleted too"


async def test_release_without_a_verdict_raises_the_node_error(nodes: Nodes) -> None:
    """Two deleted, two nodes down, one not ours: no majority either way: redis-py's error."""
    lock = Redlock(nodes.clients(), nodes.name, ttl=10.0, auto_renew=False, node_timeout=0.2)
    assert await lock.acquire()
    await nodes.flush(2)
    nodes.kill(3, 4)
    with pytest.raises(RedisError):
        await lock.release()
    assert await nodes.holders() == {}
    with pytest.raises(LockNotOwnedError):  # the holding ended anyway
        await lock.release()


async def test_extend_after_a_majority_lost_the_key_raises(nodes: Nodes) -> None:
    """A majority flushed: extend() raises LockNotOwnedError, the lock is lost, release raises."""
    lock = Redlock(nodes.clients(), nodes.name, ttl=1.0, auto_renew=False)
    assert await lock.acquire()
    await nodes.flush(0, 1, 2)
    with pytest.raises(LockNotOwnedError):
        await lock.extend()
    assert lock.lost
    with pytest.raises(LockLostError):
        await lock.release()
    await nodes.flush(3, 4)


# --- 8. cancellation -----------------------------------------------------------------------------


async def test_cancel_while_set_is_in_flight_clears_every_node(nodes: Nodes) -> None:
    """Cancelled while a paused node holds up the SET: cleared from all live nodes first."""
    limit = 0.2
    lock = Redlock(nodes.clients(), nodes.name, ttl=10.0, node_timeout=limit)
    async with lock:  # warm the connections
        pass
    nodes.pause(4)
    task = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0.05)
    assert len(await nodes.holders()) == 4, "the SETs on the live nodes should have landed"
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    took = time.monotonic() - started
    assert took < 2 * limit + SLACK
    assert await nodes.holders() == {}, "cancellation propagated before the cleanup"


@settings(max_examples=12, deadline=None, database=None)
@given(
    delay=st.floats(0.0, 0.12),
    hold=st.floats(0.0, 0.01),
    how=st.sampled_from(["Task.cancel", "asyncio.timeout", "anyio.move_on_after"]),
    paused=st.booleans(),
    contended=st.booleans(),
)
def test_cancellation_at_random_points_leaves_nothing(
    servers: list[RedisServer], delay: float, hold: float, how: str, paused: bool, contended: bool
) -> None:
    """Hypothesis draws when `async with` is cancelled: no key, task or connection is left."""

    async def main() -> None:
        name = f"hypothesis:{uuid.uuid4().hex[:8]}"
        mine = [aioredis.Redis.from_url(s.url) for s in servers]
        theirs = [aioredis.Redis.from_url(s.url) for s in servers]
        admins = [aioredis.Redis.from_url(s.url, decode_responses=True) for s in servers]
        live = range(N - 1) if paused else range(N)
        try:
            lock = Redlock(mine, name, ttl=1.0, node_timeout=0.05, backoff=QUICK)
            other = Redlock(theirs, name, ttl=1.0, node_timeout=0.1)
            if paused:
                servers[N - 1].pause()
            releaser: asyncio.Task[None] | None = None
            if contended:
                assert await other.acquire()

                async def release_soon() -> None:
                    await asyncio.sleep(hold * 3)
                    await other.release()

                releaser = asyncio.create_task(release_soon())

            async def use() -> None:
                try:
                    async with lock:
                        await asyncio.sleep(hold)
                except RedisError:  # a loaded machine: every node was late for an attempt
                    pass

            if how == "Task.cancel":
                task = asyncio.create_task(use())
                await asyncio.sleep(delay)
                task.cancel()
                await asyncio.wait([task])
            elif how == "asyncio.timeout":
                try:
                    async with asyncio_timeout(delay):
                        await use()
                except TimeoutError:
                    pass
            else:
                with anyio.move_on_after(delay):
                    await use()
            if releaser is not None:
                await releaser
            why = f"delay={delay} hold={hold} how={how} paused={paused} contended={contended}"
            assert await other_tasks() == set(), why
            for c in (*mine, *theirs):
                assert in_use_connections(c) == 0, why
            for i in live:
                assert await admins[i].keys(all_keys(name)) == [], f"node {i}: {why}"
        finally:
            if servers[N - 1].paused:
                servers[N - 1].resume()
            await admins[N - 1].delete(Keys(name).lock)  # a SET that ran on resume
            for c in (*mine, *theirs, *admins):
                await c.aclose()

    for factory in LOOPS.values():
        run_on(factory, main())


# --- 9. arguments and misuse ---------------------------------------------------------------------


def _fresh(url: str = "redis://127.0.0.1:1") -> aioredis.Redis:
    return aioredis.Redis.from_url(url)


def _five() -> list[aioredis.Redis]:
    return [_fresh(f"redis://127.0.0.1:{port}") for port in range(1, N + 1)]


@pytest.mark.parametrize(
    ("make", "error", "names"),
    [
        (lambda: Redlock(_fresh(), "n"), TypeError, "clients"),  # type: ignore[arg-type]
        (lambda: Redlock([], "n"), ValueError, "clients"),
        (lambda: Redlock("abc", "n"), TypeError, "clients"),  # type: ignore[arg-type]
        (lambda: Redlock([_fresh(), object()], "n"), TypeError, r"clients\[1\]"),  # type: ignore[list-item]
        (lambda: Redlock([redis.Redis()], "n"), TypeError, r"clients\[0\].*synchronous"),  # type: ignore[list-item]
        (lambda: Redlock([c := _fresh(), c], "n"), ValueError, r"clients\[1\].*clients\[0\]"),
        (lambda: Redlock([_fresh(), _fresh()], "n"), ValueError, r"clients\[1\].*same server"),
        (lambda: Redlock(_five(), "n", ttl=0.005), ValueError, "ttl"),
        (lambda: Redlock(_five(), "n", node_timeout=0), ValueError, "node_timeout"),
        (lambda: Redlock(_five(), "n", node_timeout=-0.1), ValueError, "node_timeout"),
        (lambda: Redlock(_five(), "n", node_timeout=float("nan")), ValueError, "node_timeout"),
        (lambda: Redlock(_five(), "n", ttl=1.0, node_timeout=1.0), ValueError, "node_timeout"),
        (lambda: Redlock(_five(), "n", node_timeout="x"), TypeError, "node_timeout"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_name_the_argument(
    make: Callable[[], object], error: type[Exception], names: str
) -> None:
    """Bad clients and node_timeout fail at construction with an error naming the argument.

    The options every primitive takes (name, ttl, timeout, the bools, backoff,
    on_lost, prefix) are checked for Redlock too in test_contract.py.
    """
    with pytest.raises(error, match=names):
        make()


def test_defaults_and_facts() -> None:
    """Quorum is a majority; node_timeout defaults to min(0.1, ttl/10); the key as AsyncLock's."""
    assert Redlock([_fresh()], "n").quorum == 1
    assert Redlock(_five()[:2], "n").quorum == 2
    assert Redlock(_five()[:4], "n").quorum == 3
    lock = Redlock(_five(), "orders:42", ttl=0.2, prefix="p:", timeout=1.5)
    assert lock.quorum == 3
    assert lock.node_timeout == pytest.approx(0.02)
    assert Redlock(_five(), "n").node_timeout == pytest.approx(0.1)
    assert lock.key == "p:{orders:42}"
    assert lock.name == "orders:42"
    assert lock.ttl == 0.2
    assert lock.timeout == 1.5
    assert not lock.lost
    assert "orders:42" in repr(lock)


async def test_extend_not_above_node_timeout_is_refused(nodes: Nodes) -> None:
    """extend(ttl) not above node_timeout is a ValueError naming node_timeout; nothing is left.

    Misuse every primitive shares (not held, bad acquire/extend arguments) is
    proved in test_contract.py.
    """
    lock = Redlock(nodes.clients(), nodes.name, ttl=1.0, node_timeout=0.1)
    async with lock:
        with pytest.raises(ValueError, match="node_timeout"):
            await lock.extend(ttl=0.1)
    assert await nodes.holders() == {}


def test_public_surface_is_documented() -> None:
    """Redlock is final, mirrors AsyncLock's signatures, and documents every public name."""
    assert getattr(Redlock, "__final__", False) is True
    parameters = inspect.signature(Redlock.__init__).parameters
    assert [n for n in parameters if n != "self"][:2] == ["clients", "name"]
    for option in (
        "ttl",
        "timeout",
        "blocking",
        "backoff",
        "auto_renew",
        "on_lost",
        "cancel_on_lost",
        "reentrant",
        "prefix",
        "node_timeout",
        "max_hold",
    ):
        assert parameters[option].kind is inspect.Parameter.KEYWORD_ONLY, option
    assert "notify" not in parameters
    for method in ("acquire", "release", "extend", "locked", "owned", "__aenter__", "__aexit__"):
        assert inspect.iscoroutinefunction(getattr(Redlock, method)), method
    assert list(inspect.signature(Redlock.acquire).parameters)[1:] == ["blocking", "timeout"]
    assert list(inspect.signature(Redlock.extend).parameters)[1:] == [
        "additional_time",
        "ttl",
        "redis_py",
    ]
    missing = [
        n
        for n in vars(Redlock)
        if not n.startswith("_") and not (getattr(Redlock, n).__doc__ or "").strip()
    ]
    assert missing == []
    doc = inspect.getdoc(Redlock) or ""
    positions = []
    for heading in ("Ownership", "Fairness", "Cancellation", "Expiry", "Raises"):
        found = re.search(rf"^\*\*{heading}\.\*\*\s+\S", doc, flags=re.MULTILINE)
        assert found, f"no **{heading}.** paragraph"
        positions.append(found.start())
    assert positions == sorted(positions)
    for phrase in ("pause", "clock", "fencing", "2k"):
        assert phrase in doc, phrase


async def test_a_name_that_would_break_a_cluster_hash_tag_is_accepted(nodes: Nodes) -> None:
    """Regression (review of the lease engine): Redlock's nodes are independent servers, so a name
    starting with ``}`` or a prefix with ``{}`` is accepted as before the engine."""
    for name, prefix in (("}" + nodes.name, "aiolock:"), (nodes.name, "aiolock{}:")):
        lock = Redlock(nodes.clients(), name, ttl=2.0, prefix=prefix)
        async with lock:
            assert len(await nodes.holders(lock.key)) == N
        assert await nodes.holders(lock.key) == {}


async def test_a_win_over_a_node_held_elsewhere_is_reported_as_contended(
    nodes: Nodes, events: list[LockEvent]
) -> None:
    """Regression (review of the lease engine): an attempt that wins a majority while one node holds
    another holder's key still counts as contended in the ``acquired`` event."""
    await nodes.admins[0].set(nodes.key(), "foreign", px=5000)
    lock = Redlock(nodes.clients(), nodes.name, ttl=2.0)
    async with lock:
        pass
    acquired = [e for e in events if e.kind == "acquired" and e.lock is lock]
    assert [e.contended for e in acquired] == [True]
    await nodes.admins[0].delete(nodes.key())


async def test_statistics_and_fence_describe_a_redlock_object(nodes: Nodes) -> None:
    """Redlock's statistics() count the tasks waiting through the object; its fence is None."""
    lock = Redlock(nodes.clients(), nodes.name, ttl=2.0)
    assert lock.statistics() == LockStatistics(held=False, owner=None, tasks_waiting=0)
    async with lock:
        me = asyncio.current_task()
        assert lock.fence is None
        waiter = asyncio.ensure_future(lock.acquire(timeout=5.0))
        await eventually(lambda: lock.statistics().tasks_waiting == 1, "one task waits")
        assert lock.statistics() == LockStatistics(held=True, owner=me, tasks_waiting=1)
    assert await waiter
    await lock.release()
    assert lock.statistics() == LockStatistics(held=False, owner=None, tasks_waiting=0)
