"""Many holdings and many waiters on one client with a bounded pool.

A service holds a lock per entity and has many tasks waiting, all on one
client. aiolock's commands of one client take at most half of its pool's
connections (at most 50); the rest wait in the process, renewals first. A
pool exhausted anyway (by other code on the client) is back-pressure: the
command waits for a connection within its caller's deadline, and redis-py's
``MaxConnectionsError`` never reaches a waiting task.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import tracemalloc
import unittest.mock
import weakref
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection as RedisConnection
from redis.exceptions import MaxConnectionsError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.leaks import connections_made, other_tasks
from support.locks import all_keys, keys_of
from support.servers import calls, connected
from support.timing import Lateness, eventually

from aiolock import AsyncLock, LockError, ReadWriteLock, Semaphore, _identity, _packing
from aiolock._gate import Gate
from aiolock._packing import packed
from aiolock._scripts import EXTEND_MANY, KEEP
from aiolock.testing import FaultProxy, RedisServer

pytestmark = pytest.mark.timeout(60)


async def test_hundreds_held_on_a_pool_of_four_are_renewed_and_none_is_lost(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """300 locks held through five renewal periods on ``max_connections=4``.

    Before batching, each holding renewed with its own call and connection:
    on a small pool renewals failed with ``MaxConnectionsError`` and locks
    were declared lost. (A lease of 1.5 s: a renewal that fails once on a
    loaded machine has a second of retries left, as a service's would.)
    """
    lost: list[object] = []
    async with connected(server.url, max_connections=4) as client:
        locks = [AsyncLock(client, f"{name}:{i}", ttl=1.5, on_lost=lost.append) for i in range(300)]
        acquired = await asyncio.gather(*(lock.acquire(timeout=10) for lock in locks))
        assert all(acquired)
        await asyncio.sleep(2.5)  # five renewal periods of 0.5 s
        assert lost == []
        assert await admin.exists(*(lock.key for lock in locks)) == len(locks)
        assert connections_made(client) <= 4
        await asyncio.gather(*(lock.release() for lock in locks))
    assert await admin.keys(all_keys(name)) == []
    assert await other_tasks() == set()


@pytest.mark.parametrize("flushed", [False, True], ids=["scripts-loaded", "scripts-flushed"])
async def test_a_crowd_of_releases_waits_in_line_with_its_holdings_renewed(
    proxy: FaultProxy, admin: redis.Redis, name: str, flushed: bool
) -> None:
    """A hundred holdings released at once through one slot of a slow link: all succeed.

    A pool of two leaves aiolock one slot; at 20 ms a command the hundred
    releases take two seconds in line, over three leases of 0.6 s. Each
    release waits for its turn with its holding still renewed, so no lease
    runs out in line: no error, no loss, no key left. With the scripts
    flushed from the server, each release meets ``NOSCRIPT`` on its turn;
    the load and the second try go first in line (behind the crowd, every
    release would wait its turn three times, the last two unrenewed).
    """
    lost: list[object] = []
    async with connected(proxy.url, max_connections=2) as client:
        locks = [AsyncLock(client, f"{name}:{i}", ttl=0.6, on_lost=lost.append) for i in range(100)]
        assert all(await asyncio.gather(*(lock.acquire(timeout=5) for lock in locks)))
        assert connections_made(client) == 1
        proxy.set_latency(0.01)  # each way
        await asyncio.sleep(0.3)  # a renewal through the slow link
        if flushed:
            await admin.script_flush()
        else:
            async with AsyncLock(client, f"{name}:warm"):
                pass  # the release script loaded
        started = time.monotonic()
        outcomes = await asyncio.gather(*(lock.release() for lock in locks), return_exceptions=True)
        took = time.monotonic() - started
        assert [o for o in outcomes if o is not None] == []
        assert took > 1.2, took  # (the line was longer than two leases)
        assert lost == []
    assert await admin.keys(all_keys(name)) == []
    assert await other_tasks() == set()


async def test_a_release_cancelled_while_in_line_still_releases(
    proxy: FaultProxy, admin: redis.Redis, name: str
) -> None:
    """A release cancelled while it waits in line for its turn still frees the key, then raises.

    Twenty releases through one slot at 40 ms a command: the last is
    cancelled while the others go first. It goes on, frees the key, and
    ends in ``CancelledError``; nothing is lost or left.
    """
    lost: list[object] = []
    async with connected(proxy.url, max_connections=2) as client:
        locks = [AsyncLock(client, f"{name}:{i}", ttl=2.0, on_lost=lost.append) for i in range(20)]
        assert all(await asyncio.gather(*(lock.acquire(timeout=5) for lock in locks)))
        async with AsyncLock(client, f"{name}:warm"):
            pass  # the release script loaded
        proxy.set_latency(0.02)  # each way
        others = asyncio.gather(*(lock.release() for lock in locks[:-1]))
        await asyncio.sleep(0)
        last = asyncio.create_task(locks[-1].release())
        await asyncio.sleep(0.1)  # in line, behind the others
        assert not last.done()
        last.cancel()
        with pytest.raises(asyncio.CancelledError):
            await last
        assert await admin.exists(locks[-1].key) == 0
        await others
        assert lost == []
    assert await admin.keys(all_keys(name)) == []
    assert await other_tasks() == set()


async def test_holdings_keep_nothing_of_the_tasks_that_acquired_them(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Locks acquired by ``gather``'s tasks: held and renewed, their ended tasks collected.

    An ended task keeps its coroutine, context and result; a thousand
    holdings keeping theirs cost a kilobyte each. A loss is a failure,
    unless this loop stood still for half a second or more in all while the
    renewals were due (a loaded machine, or the full collection below in a
    worker process grown large): then the lease may truly have run out.
    """
    # (A lease of 1.5 s: renewed twice, with room for a late renewal on a loaded machine.)
    locks = [AsyncLock(client, f"{name}:{i}", ttl=1.5) for i in range(100)]
    tasks = [asyncio.ensure_future(lock.acquire()) for lock in locks]
    assert all(await asyncio.gather(*tasks))
    refs = [weakref.ref(task) for task in tasks]
    del tasks
    async with Lateness() as late:
        start = time.monotonic()
        await asyncio.sleep(0.01)  # (the loop's own handles that name the tasks have run)
        gc.collect()
        # A connection opened by a task keeps a copy of its context (asyncio's reader
        # callback), and so that task: one per connection, none per holding.
        assert len([ref for ref in refs if ref() is not None]) <= connections_made(client)
        await asyncio.sleep(1.7)  # past the first lease: renewed
    lost = sum(lock.lost for lock in locks)
    stood_still = late.between(start, time.monotonic())
    assert not lost or stood_still >= 0.5, f"{lost} lost; the loop stood still {stood_still:.3f} s"
    if lost:  # (truly: nothing more to see here)
        for lock in locks:
            with contextlib.suppress(LockError):
                await lock.release()
        pytest.skip(f"{lost} lost while the loop stood still {stood_still:.3f} s in all")
    assert await admin.exists(*(lock.key for lock in locks)) == len(locks)
    stats = locks[0].statistics()
    assert stats.held
    assert stats.owner is None
    await asyncio.gather(*(lock.release() for lock in locks))
    assert await admin.keys(all_keys(name)) == []


@pytest.mark.one_loop  # (what a holding keeps: the same on both loops)
async def test_a_held_lock_costs_the_client_a_few_kilobytes_at_most(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """1,000 held locks cost under 3 KB each, the lock objects and their names included.

    About 2.8 KB here: this test's long names make long keys, and each
    holding still has its own timer for its first renewal (1.9 KB in the
    scale benchmark, renewed, short names). The bound fails a holding that
    keeps per-lock copies of what every lock of a kind shares (bound
    scripts did: 8 KB here), or what it needs only to release or to wait
    (its bound release script, its fence's and channel's names: 3.2 KB).
    The encoded default identities of the acquiring tasks are left out:
    they are kept per task name in one cache of the process, at most
    ``DEFAULTS_MOST`` names whatever the number of locks, and this test's
    1,000 acquiring tasks would fill it from whatever the tests before left.
    """
    # The pool's connections, as many as aiolock uses at once (the client's, not the locks').
    warm = [AsyncLock(client, f"{name}:warm:{i}", ttl=10.0) for i in range(200)]
    await asyncio.gather(*(lock.acquire() for lock in warm))
    await asyncio.gather(*(lock.release() for lock in warm))
    del warm
    count = 1000
    _identity.DEFAULTS.clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        locks = [AsyncLock(client, f"{name}:{i}", ttl=10.0) for i in range(count)]
        assert all(await asyncio.gather(*(lock.acquire(timeout=10) for lock in locks)))
        _identity.DEFAULTS.clear()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    try:
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert grown / count < 3000, f"{grown / count:.0f} B per held lock"
    finally:
        await asyncio.gather(*(lock.release() for lock in locks))
    assert await admin.keys(all_keys(name)) == []


@pytest.mark.one_loop  # (the server's work: the same on both loops)
async def test_a_batch_renews_with_one_read_and_one_write_per_holding(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """100 holdings renewed together: one MGET of all, a PEXPIRE each, one EXISTS, no GET.

    Each holding's renewal used to run its own GET, PEXPIRE and a PEXPIRE of
    its queue, present or not: 300 commands where 102 do. A queue is kept
    only where one exists: with a waiter queued behind one of them, the
    renewal extends that queue to the lease plus its slack (the waiter keeps
    its place however long the lock is held).
    """
    locks = [AsyncLock(client, f"{name}:{i}", ttl=3.0) for i in range(100)]
    assert all(await asyncio.gather(*(lock.acquire(timeout=10) for lock in locks)))
    try:
        await admin.script_load(EXTEND_MANY.text)  # (no NOSCRIPT in the count)
        await admin.config_resetstat()

        async def renewed_once() -> bool:
            return await calls(admin, "pexpire") >= 100

        await eventually(renewed_once, "every holding renewed", timeout=5)
        batches = await calls(admin, "evalsha")
        assert 1 <= batches <= 3, batches  # (acquired within a twelfth of the lease: one)
        assert await calls(admin, "mget") == batches
        assert await calls(admin, "exists") == batches
        assert await calls(admin, "pexpire") == 100  # (no queue: none kept)
        assert await calls(admin, "get") == 0
        # A waiter queues behind the first: its queue lives for the holder's lease plus
        # the slack (5.5 s at most), and each renewal sets it so again.
        queue = keys_of(locks[0]).queue
        behind = AsyncLock(other_client, f"{name}:0", ttl=3.0, fair=True)
        waiter = asyncio.create_task(behind.acquire(timeout=10))

        async def queued() -> bool:
            return bool(await admin.llen(queue) == 1)

        await eventually(queued, "the waiter queued", timeout=5)
        await admin.config_resetstat()
        await asyncio.sleep(2.5)  # two renewal periods and more
        # Kept: at most one renewal period (1 s) ago; else 2.5 s would have gone by.
        assert await admin.pttl(queue) > 5500 - 1100 - 100
        assert await calls(admin, "exists") >= 2
        assert await admin.lrange(queue, 0, -1) != []
    finally:
        await asyncio.gather(*(lock.release() for lock in locks))
    assert await waiter is True
    await behind.release()


async def test_holdings_that_ask_different_leases_renew_together(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A batch whose members ask different leases renews each with its own.

    Five holdings of ``ttl=3`` and one capped by ``max_hold=3.2``, whose
    renewal at 1 s asks only what is left of its cap (2.2 s): after it, each
    key's lease is its own (one call per lease asked).
    """
    lost: list[object] = []
    plain = [AsyncLock(client, f"{name}:{i}", ttl=3.0, on_lost=lost.append) for i in range(5)]
    capped = AsyncLock(client, f"{name}:capped", ttl=3.0, max_hold=3.2, on_lost=lost.append)
    assert all(await asyncio.gather(*(lock.acquire(timeout=5) for lock in [*plain, capped])))
    try:
        await asyncio.sleep(1.3)  # past the first renewal (1 s), before the second
        assert lost == []
        leases = [await admin.pttl(lock.key) for lock in plain]
        assert all(2300 < left <= 3000 for left in leases), leases
        left = await admin.pttl(capped.key)
        assert 0 < left <= 2200, left  # (renewed with the others' 3 s: 2.7 s or more)
    finally:
        await asyncio.gather(*(lock.release() for lock in plain))
        with contextlib.suppress(LockError):
            await capped.release()
    assert await admin.keys(all_keys(name)) == []


def _waiting_side(client: redis.Redis, name: str, kind: str, ttl: float) -> Any:
    """A primitive of ``kind`` whose every task stands in the queue on the server."""
    if kind == "semaphore":  # (fair: one permit's tasks would wait in the process)
        return Semaphore(client, name, 1, ttl=ttl, fair=True)
    if kind == "fair":
        return AsyncLock(client, name, ttl=ttl, fair=True)
    return ReadWriteLock(client, name, ttl=ttl).writer


@pytest.mark.one_loop  # (the keeper's bookkeeping: the same on both loops)
@pytest.mark.parametrize("kind", ["semaphore", "fair", "rw"])
async def test_the_waiters_of_one_client_are_kept_together(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, kind: str
) -> None:
    """200 queued tasks of one client: one KEEP per refresh period for all; then all get in.

    Each used to refresh its own entry: 200 commands every 1.4 s. Now the
    first refreshes its own, and the others' entries name the client's
    keeper, whose one script sets its mark and looks at all of them. The
    lock then passes through every one of them, kept or not, one at a time.
    """
    holder = _waiting_side(other_client, name, kind, 30.0)
    assert await holder.acquire()
    inside = {"now": 0, "bad": 0, "done": 0}

    async def wait_then_hold() -> None:
        async with _waiting_side(client, name, kind, 30.0):
            inside["now"] += 1
            inside["bad"] += inside["now"] > 1
            await asyncio.sleep(0.001)
            inside["now"] -= 1
            inside["done"] += 1

    waiting = [asyncio.create_task(wait_then_hold()) for _ in range(200)]
    try:
        queue = keys_of(holder).queue

        async def all_queued() -> bool:
            return bool(await admin.llen(queue) == len(waiting))

        await eventually(all_queued, "every task queued", timeout=10)
        await admin.script_load(KEEP.text)  # (no NOSCRIPT in the count)
        await asyncio.sleep(0.5)  # (a subscription's confirmation may wake one more attempt)
        await admin.config_resetstat()
        await asyncio.sleep(2.9)  # two refresh periods and more
        keeps = await calls(admin, "mget")
        assert 2 <= keeps <= 3, keeps
        assert await calls(admin, "evalsha") == keeps, "a waiter attempted, or kept alone"
        own = await calls(admin, "pexpire")  # the first waiter's own entry, refreshed
        assert own <= 3, own
        stats = await admin.info("commandstats")
        total = sum(
            int(v["calls"])
            for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat")
        )
        # (200 waiters alone sent 400 in two periods.)
        assert total <= 3 * keeps + own, stats
        (mark,) = await admin.keys(f"{queue}:@*")
        assert 0 < await admin.pttl(mark) <= 2000
        keeper = str(mark).rsplit("@", 1)[1]
        entries = [str(k) for k in await admin.keys(f"{queue}:*") if "@" not in str(k)]
        named = [str(await admin.get(k)).endswith(f" {keeper}") for k in entries]
        # All but the first (which may have become kept when it attempted again).
        assert len(entries) == 200
        assert sum(named) in (199, 200), sum(named)
        assert not any(task.done() for task in waiting)
    finally:
        await holder.release()
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), 20)
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
    assert (inside["done"], inside["bad"]) == (200, 0)
    assert await admin.keys(all_keys(name)) == [], "the keeper's mark outlived its waiters"


@pytest.mark.parametrize("kind", ["semaphore", "fair", "rw"])
async def test_kept_waiters_cancelled_together_leave_nothing(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, kind: str
) -> None:
    """50 queued tasks of one client cancelled by one anyio scope: no entry, mark or task left.

    An anyio scope cancels every await of the cancelled calls, their
    cleanup's too: each still forgets itself in its keeper, and the last
    deletes the mark.
    """
    holder = _waiting_side(other_client, name, kind, 30.0)
    assert await holder.acquire()
    queue = keys_of(holder).queue
    with anyio.move_on_after(10) as scope:
        async with anyio.create_task_group() as group:
            for _ in range(50):
                group.start_soon(_waiting_side(client, name, kind, 30.0).acquire)

            async def all_queued() -> bool:
                return bool(await admin.llen(queue) == 50)

            await eventually(all_queued, "every task queued", timeout=8)
            assert len(await admin.keys(f"{queue}:@*")) == 1
            group.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert await other_tasks() == set()
    await holder.release()
    assert await admin.keys(all_keys(name)) == [], "an entry or the mark was left"


@pytest.mark.parametrize("kind", ["semaphore", "fair", "rw"])
async def test_hundreds_of_waiters_on_a_pool_of_six_cycle_without_an_error(
    server: RedisServer, admin: redis.Redis, name: str, kind: str
) -> None:
    """200 tasks on ``max_connections=6`` take turns: no error, the limit kept, nothing left."""
    inside: dict[str, int] = {"now": 0, "most": 0, "writers": 0, "bad": 0}
    errors: list[BaseException] = []
    async with connected(server.url, max_connections=6) as client:
        if kind == "semaphore":
            sem = Semaphore(client, name, limit=3, ttl=2.0)
            limit = 3
        elif kind == "fair":
            lock = AsyncLock(client, name, ttl=2.0, fair=True)
            limit = 1
        else:
            rw = ReadWriteLock(client, name, ttl=2.0)
            limit = 200

        async def one(i: int) -> None:
            writer = kind == "rw" and i % 10 == 0
            primitive: Any = (
                sem
                if kind == "semaphore"
                else lock
                if kind == "fair"
                else rw.writer
                if writer
                else rw.reader
            )
            try:
                async with primitive:
                    inside["now"] += 1
                    inside["writers"] += writer
                    inside["most"] = max(inside["most"], inside["now"])
                    if inside["now"] > limit or (inside["writers"] and inside["now"] > 1):
                        inside["bad"] += 1
                    await asyncio.sleep(0.001)
                    inside["now"] -= 1
                    inside["writers"] -= writer
            except Exception as exc:
                errors.append(exc)

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(200))), 45)
        assert connections_made(client) <= 6
    assert errors == []
    assert inside["bad"] == 0
    assert 1 <= inside["most"] <= limit
    assert await admin.keys(all_keys(name)) == []


async def test_an_exhausted_pool_is_back_pressure_within_the_deadline(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """Other code holds every connection: acquire waits, then ends at its deadline.

    No ``MaxConnectionsError``: the attempt waits for a connection, as long
    as its ``timeout`` lets it (plus the grace a first attempt has), then
    raises redis-py's ``TimeoutError`` saying that nothing was sent; and it
    gets a connection once the other code lets go.
    """
    async with connected(server.url, max_connections=2) as client:
        lock = AsyncLock(client, name, ttl=2.0)
        # Two connections taken by blocking reads of other code on the same client.
        blockers = [asyncio.ensure_future(client.blpop([f"{name}:never"], 1.2)) for _ in range(2)]
        await asyncio.sleep(0.1)
        with pytest.raises(MaxConnectionsError):
            await client.get("x")  # the pool is full, as redis-py says

        started = time.monotonic()
        outcome: object
        try:
            outcome = await lock.acquire(timeout=0.4)
        except Exception as exc:
            outcome = exc
        took = time.monotonic() - started
        assert isinstance(outcome, RedisTimeoutError), outcome
        assert "no connection of the client's pool came free" in str(outcome)
        assert "nothing was sent" in str(outcome)
        assert 0.3 <= took <= 0.9, took
        assert not await admin.exists(lock.key)

        # Back-pressure, not failure: the attempt goes through once a connection is free.
        started = time.monotonic()
        assert await lock.acquire(timeout=3)
        assert time.monotonic() - started < 2.0
        await lock.release()
        await asyncio.gather(*blockers)
    assert await admin.keys(all_keys(name)) == []


async def served(arrivals: list[tuple[str, bool]]) -> list[str]:
    """The order in which a full one-slot gate serves ``(label, urgent)`` entries, one per step."""
    gate = Gate(1)
    order: list[str] = []
    await gate.enter()

    async def wait(label: str, urgent: bool) -> None:
        await gate.enter(urgent)
        order.append(label)
        gate.leave()

    tasks = []
    for label, urgent in arrivals:
        tasks.append(asyncio.ensure_future(wait(label, urgent)))
        await asyncio.sleep(0)
    assert gate.waiting == len(arrivals)
    gate.leave()
    await asyncio.gather(*tasks)
    return order


async def test_a_renewal_goes_first_in_line_for_a_slot() -> None:
    """The client's slots are full: an urgent entry (a renewal) is served before the rest."""
    order = await served([(f"attempt {i}", False) for i in range(3)] + [("renewal", True)])
    assert order == ["renewal", "attempt 0", "attempt 1", "attempt 2"]


async def test_renewals_in_line_for_a_slot_go_in_the_order_they_came() -> None:
    """Urgent entries are first come, first served among themselves: the oldest ends first."""
    order = await served([("attempt", False)] + [(f"renewal {i}", True) for i in range(3)])
    assert order == ["renewal 0", "renewal 1", "renewal 2", "attempt"]


async def test_a_cancelled_wait_for_a_slot_gives_no_slot_away() -> None:
    """A command cancelled while it waits for a slot leaves the line; the slots stay counted."""
    gate = Gate(1)
    await gate.enter()
    waiting = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.waiting == 0
    gate.leave()
    await asyncio.wait_for(gate.enter(), 1)  # the one slot is free again
    gate.leave()


async def test_a_wait_cancelled_as_its_slot_is_passed_over_ends_cancelled() -> None:
    """Cancelled, then passed over by a slot given back before it runs: a plain cancellation.

    Releasing 10,000 locks at once let leases end while releases waited for a
    slot: the cut-off cancelled a waiting release, another command gave its
    slot back before that release ran again (and skipped it, being
    cancelled), and the release raised ``ValueError`` from the line instead.
    """
    gate = Gate(1)
    await gate.enter()
    waiting = asyncio.ensure_future(gate.enter())
    behind = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0)
    waiting.cancel()
    gate.leave()  # before `waiting` runs again: its slot goes to the next in line
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(behind, 1)
    assert gate.waiting == 0
    gate.leave()
    await asyncio.wait_for(gate.enter(), 1)  # the one slot is free again
    gate.leave()


@given(
    st.lists(
        st.one_of(
            st.text(max_size=40),
            st.binary(max_size=40),
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
        ),
        max_size=12,
    ),
    st.sampled_from(["EVALSHA", "SET", "SCRIPT LOAD", "CLIENT SETINFO"]),
    st.booleans(),
)
def test_commands_are_packed_as_redis_py_packs_them(
    args: list[Any], command: str, with_hiredis: bool
) -> None:
    """aiolock's packing (hiredis's, or one join without it) gives redis-py's bytes."""
    whole = (command, *args)
    packer = _packing.HIREDIS_PACK if with_hiredis else None  # (None without hiredis)
    with unittest.mock.patch.object(_packing, "HIREDIS_PACK", packer):
        ours = packed(whole, "utf-8", "strict")
    assert ours is not None
    assert b"".join(ours) == b"".join(RedisConnection().pack_command(*whole))


def test_what_it_cannot_pack_is_left_to_redis_py() -> None:
    """A float, or a command name that is not a str, is redis-py's to encode."""
    assert packed(("SET", "k", 1.5), "utf-8", "strict") is None
    assert packed((b"SET", "k", "v"), "utf-8", "strict") is None
