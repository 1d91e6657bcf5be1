"""ReadWriteLock (docs/design.md): sharing, exclusion, writers not starved, dead holders.

What every primitive keeps (the cancellation windows, loss, renewal, the
observers, bad timeouts...) is proved once for all in ``test_contract.py``.
Here: what only a read-write lock does: readers share and a writer
excludes them, across processes; a writer behind a continuous stream of
readers gets in; a dead reader or writer frees the lock by its own lease;
a task cannot wait for itself across the two sides; kinds and arguments.
"""

from __future__ import annotations

import asyncio
import random
import time
from asyncio.subprocess import PIPE
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from support.checkout import start_python
from support.locks import all_keys, names
from support.timing import eventually

from aiolock import AsyncLock, LockError, ReadWriteLock, Semaphore
from aiolock.testing import RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

#: Slack for timing bounds on 2 loaded cores.
SLACK = 0.3


async def _no_keys(admin: redis.Redis, name: str) -> bool:
    return await admin.keys(all_keys(name)) == []


# --- sharing and exclusion -----------------------------------------------------------------------

WORKER = """
import asyncio, random, sys, time
import redis.asyncio as redis
from aiolock import ReadWriteLock
async def main(url, name, seconds):
    client = redis.Redis.from_url(url)
    rw = ReadWriteLock(client, name, ttl=5.0)
    readers, writers = name + ":readers", name + ":writers"
    stop = time.monotonic() + float(seconds)
    bad = shared = reads = writes = 0
    async def reader():
        nonlocal bad, shared, reads
        while time.monotonic() < stop:
            async with rw.reader:
                inside = await client.incr(readers)
                shared += inside > 1
                bad += int(await client.get(writers) or 0) != 0
                await asyncio.sleep(random.uniform(0, 0.01))
                await client.decr(readers)
                reads += 1
    async def writer():
        nonlocal bad, writes
        while time.monotonic() < stop:
            async with rw.writer:
                bad += await client.incr(writers) != 1
                bad += int(await client.get(readers) or 0) != 0
                await asyncio.sleep(random.uniform(0, 0.005))
                await client.decr(writers)
                writes += 1
            await asyncio.sleep(random.uniform(0, 0.02))
    await asyncio.gather(*(reader() for _ in range(6)), writer())
    print(bad, shared, reads, writes)
    await client.aclose()
asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_readers_share_and_writers_exclude_across_three_processes(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """3 processes x (6 readers + 1 writer) for 2 s: readers together, never with a writer.

    The witnesses are two counters on the server: a reader increments the
    readers' and reads the writers' (it must be 0); a writer increments the
    writers' (it must become 1) and reads the readers' (it must be 0).
    """
    processes = [await start_python(WORKER, server.url, name, "2", stdout=PIPE) for _ in range(3)]
    try:
        with anyio.fail_after(30):
            outputs = [await p.communicate() for p in processes]
        assert [p.returncode for p in processes] == [0] * 3
        results = [tuple(map(int, out.split())) for out, _ in outputs]
        assert all(bad == 0 for bad, _, _, _ in results), results
        assert sum(shared for _, shared, _, _ in results) > 0, "readers never shared"
        assert all(reads > 0 and writes > 0 for _, _, reads, writes in results), results
    finally:
        for p in processes:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await admin.delete(f"{name}:readers", f"{name}:writers")


async def test_a_writer_behind_a_continuous_stream_of_readers_gets_in_within_a_second(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """Readers overlap without a gap for 3 s; a writer that asks meanwhile gets in within 1 s.

    Once the writer waits, the readers that come after it wait behind it:
    the readers already in leave, and the writer's turn comes.
    """
    rw = ReadWriteLock(client, name, ttl=5.0)
    writer_rw = ReadWriteLock(other_client, name, ttl=5.0)
    stop = time.monotonic() + 3.0
    in_after_writer: list[float] = []

    async def reader() -> None:
        while time.monotonic() < stop:
            async with rw.reader:
                await asyncio.sleep(0.05)

    async def writer() -> float:
        await asyncio.sleep(0.5)  # the stream is going
        asked = time.monotonic()
        async with writer_rw.writer:
            got = time.monotonic()
            in_after_writer.append(got)
            await asyncio.sleep(0.01)
        return got - asked

    readers = [asyncio.create_task(reader()) for _ in range(8)]
    try:
        waited = await writer()
    finally:
        await asyncio.gather(*readers)
    assert waited <= 1.0, f"the writer waited {waited:.3f} s behind the readers"


async def test_readers_who_came_after_a_waiting_writer_wait_behind_it(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A reader holds; a writer waits; a later reader waits too, and goes in after the writer."""
    first = ReadWriteLock(client, name)
    later = ReadWriteLock(other_client, name)
    order: list[str] = []
    assert await first.reader.acquire()
    writing = asyncio.create_task(_hold(later.writer, order, "writer"))
    await eventually(lambda: _queued(admin, name, 1), "the writer queued")
    reading = asyncio.create_task(_hold(ReadWriteLock(other_client, name).reader, order, "reader"))
    await eventually(lambda: _queued(admin, name, 2), "the later reader queued")
    await first.reader.release()
    with anyio.fail_after(5):
        await asyncio.gather(writing, reading)
    assert order == ["writer", "reader"]


async def _hold(side: Any, order: list[str], label: str) -> None:
    async with side:
        order.append(label)
        await asyncio.sleep(0.02)


async def _queued(admin: redis.Redis, name: str, length: int) -> bool:
    return await admin.llen(f"aiolock:{{{name}}}:queue:rw") == length


async def test_locked_tells_each_side(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """`rw.locked()`: anyone holds; `reader.locked()`: a reader; `writer.locked()`: the writer."""
    rw = ReadWriteLock(client, name)
    other = ReadWriteLock(other_client, name)
    assert not await rw.locked()
    async with rw.reader:
        assert await rw.locked()
        assert await rw.reader.locked()
        assert not await rw.writer.locked()
        assert await other.reader.acquire(blocking=False)
        await other.reader.release()
        assert not await other.writer.acquire(blocking=False)
        assert await rw.reader.owned()
    async with rw.writer:
        assert await rw.writer.locked()
        assert not await rw.reader.locked()
        assert not await other.reader.acquire(blocking=False)
    assert not await rw.locked()


async def test_a_task_asking_for_the_other_side_raises_instead_of_waiting_for_itself(
    client: redis.Redis, name: str
) -> None:
    """Holding the reader side, the writer side raises LockError at once; and the other way."""
    rw = ReadWriteLock(client, name)
    async with rw.reader:
        with pytest.raises(LockError, match="holds its reader side"):
            await rw.writer.acquire()
    async with rw.writer:
        with pytest.raises(LockError, match="holds its writer side"):
            await rw.reader.acquire(timeout=1.0)
    # Another task may: it waits as any other holder would.
    async with rw.reader:
        other = asyncio.create_task(rw.writer.acquire(timeout=0.2))
        assert not await other


# --- dead holders and cancellation ---------------------------------------------------------------

HOLDER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import ReadWriteLock
async def main(url, name, side, ttl):
    rw = ReadWriteLock(redis.Redis.from_url(url), name, ttl=float(ttl))
    await getattr(rw, side).acquire()
    print("held", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("side", ["reader", "writer"])
async def test_a_sigkilled_holder_frees_the_lock_after_its_lease(
    server: RedisServer, client: redis.Redis, name: str, side: str
) -> None:
    """A reader or the writer killed while holding: a writer gets in as the lease ends.

    A dead reader does not keep the lock from the other readers meanwhile.
    """
    ttl = 1.5
    holder = await start_python(HOLDER, server.url, name, side, str(ttl), stdout=PIPE)
    try:
        assert holder.stdout is not None
        with anyio.fail_after(10):
            assert await holder.stdout.readline() == b"held\n"
        holder.kill()
        await holder.wait()
        killed = time.monotonic()
        rw = ReadWriteLock(client, name, ttl=ttl)
        if side == "reader":
            assert await rw.reader.acquire(blocking=False), "a dead reader kept out a reader"
            await rw.reader.release()
        assert await rw.writer.acquire(timeout=ttl + 2)
        waited = time.monotonic() - killed
        assert waited <= ttl + SLACK, f"the lock came back after {waited:.3f} s"
        assert waited >= 0.5, "the lock came back long before the lease ended"
        await rw.writer.release()
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


@pytest.mark.slow
async def test_hundreds_of_random_cancellations_leave_the_lock_free_and_no_key(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """300 acquisitions of both sides on 3 clients, each cancelled at random: nothing left."""
    clients = [client, *(redis.Redis.from_url(server.url) for _ in range(2))]
    rng = random.Random(4321)

    async def one(index: int) -> None:
        rw = ReadWriteLock(clients[index % 3], name, ttl=5.0)
        side = rw.writer if index % 4 == 0 else rw.reader
        async with side:
            await asyncio.sleep(rng.uniform(0, 0.005))

    try:
        for _ in range(3):
            tasks = [asyncio.create_task(one(i)) for i in range(100)]
            for task in tasks:
                await asyncio.sleep(rng.uniform(0, 0.002))
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await eventually(lambda: _no_keys(admin, name), "every key of the lock is gone", 5.0)
        rw = ReadWriteLock(clients[1], name)
        assert await rw.writer.acquire(blocking=False), "the lock was left held"
        await rw.writer.release()
    finally:
        for c in clients[1:]:
            await c.aclose()


async def test_renewal_keeps_a_read_lock_past_several_leases(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """ttl 0.4 s, read-held 1.6 s: still ours, and a writer still out."""
    rw = ReadWriteLock(client, name, ttl=0.4)
    other = ReadWriteLock(other_client, name, ttl=0.4)
    async with rw.reader:
        assert not await other.writer.acquire(timeout=1.6)
        assert not rw.reader.lost
        assert await rw.reader.owned()


# --- kinds and arguments -------------------------------------------------------------------------


async def test_a_name_used_by_another_kind_raises_lock_error_naming_it(
    client: redis.Redis, name: str
) -> None:
    """A read-write lock on a lock's or a semaphore's name, and they on its: LockError."""
    async with AsyncLock(client, name):
        with pytest.raises(LockError, match="in use by an AsyncLock"):
            await ReadWriteLock(client, name).reader.acquire(timeout=0.2)
    async with Semaphore(client, name, limit=2):
        with pytest.raises(LockError, match="in use by a Semaphore"):
            await ReadWriteLock(client, name).writer.acquire(timeout=0.2)
    async with ReadWriteLock(client, name).reader:
        with pytest.raises(LockError, match="in use by a ReadWriteLock"):
            await Semaphore(client, name, limit=2).acquire(timeout=0.2)
        with pytest.raises(LockError, match="in use by a ReadWriteLock"):
            await AsyncLock(client, name).acquire(timeout=0.2)


@pytest.mark.parametrize(
    "option", ["reentrant", "fencing", "replicas", "replica_timeout", "replica_fsync"]
)
def test_the_options_a_read_write_lock_refuses_are_type_errors_naming_them(
    client: redis.Redis, option: str
) -> None:
    """`reentrant`, `fencing` and the replica options are refused by name, with the reason."""
    options: dict[str, Any] = {option: True}
    with pytest.raises(TypeError, match=names(option, "ReadWriteLock")):
        ReadWriteLock(client, "x", **options)


def test_an_unknown_option_is_a_type_error_naming_it(client: redis.Redis) -> None:
    """Any other keyword is refused as Python refuses it."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'readers'"):
        ReadWriteLock(client, "x", readers=3)  # type: ignore[arg-type]


def test_sides_names_and_repr(client: redis.Redis, name: str) -> None:
    """Both sides share the name and key; each says which it is."""
    rw = ReadWriteLock(client, name, ttl=2.0)
    assert rw.name == rw.reader.name == rw.writer.name == name
    assert rw.key == rw.reader.key == rw.writer.key == f"aiolock:{{{name}}}"
    assert rw.reader.kind == "reader"
    assert rw.writer.kind == "writer"
    assert rw.reader.lock is rw
    assert "reader" in repr(rw.reader)
    assert "writer" in repr(rw.writer)
    assert rw.ttl == 2.0


async def test_the_key_lives_as_long_as_its_longest_holding_after_a_release(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A reader of 10 s and one of 1 s: once the long one leaves, the key lives 1 s at most."""
    long = ReadWriteLock(client, name, ttl=10.0, auto_renew=False)
    short = ReadWriteLock(client, name, ttl=1.0, auto_renew=False)
    key = f"aiolock:{{{name}}}"
    assert await long.reader.acquire()
    assert await short.reader.acquire()
    assert 9000 < await admin.pttl(key) <= 10_000
    await long.reader.release()
    assert 0 < await admin.pttl(key) <= 1000
    await short.reader.release()
    assert await admin.exists(key) == 0


async def test_a_dead_writer_queued_first_keeps_readers_out_one_lease_at_most(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (review): a dead writer queued first does not keep readers out past a lease.

    A reader holds; a writer's token sits at the head of the queue with an
    entry that expires at once (its process died); two readers queue behind
    it. They get in once the first reader's lease as they saw it ends, at
    the latest (they look then, and their attempt drops the dead writer).
    """
    ttl = 1.5
    holder = ReadWriteLock(client, name, ttl=ttl)
    assert await holder.reader.acquire()
    queue = f"aiolock:{{{name}}}:queue:rw"
    dead = "0" * 32
    await admin.rpush(queue, dead)
    await admin.set(f"{queue}:{dead}", "2000w 1", px=300)
    readers = [ReadWriteLock(other_client, name, ttl=ttl).reader for _ in range(2)]
    started = time.monotonic()
    waits = [asyncio.create_task(r.acquire(timeout=8.0)) for r in readers]
    try:
        with anyio.fail_after(8):
            assert await asyncio.gather(*waits) == [True, True]
        waited = time.monotonic() - started
        assert waited <= ttl + SLACK, f"the readers waited {waited:.3f} s"
        assert await holder.reader.owned()
    finally:
        for r in readers:
            if r.statistics().held:
                await r.release()
        await holder.reader.release()
        await admin.delete(queue)


async def test_extending_a_holding_to_a_shorter_lease_shortens_the_keys_life(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (review): extend(ttl=1) of a 10 s reader leaves the key 1 s to live, not 10."""
    rw = ReadWriteLock(client, name, ttl=10.0, auto_renew=False)
    async with rw.reader:
        assert 9000 < await admin.pttl(f"aiolock:{{{name}}}") <= 10_000
        await rw.reader.extend(ttl=1.0)
        assert 0 < await admin.pttl(f"aiolock:{{{name}}}") <= 1000


async def test_dead_readers_are_dropped_from_the_index_a_few_at_a_time(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """40 readers died holding: a writer gets in when their leases end, and nothing is left.

    The holders' ends are counted in the index (``key:ends``), never by
    reading every holder; each script drops at most 16 ended ones, so the
    writer's attempt, its release and the next reader's clear them all.
    """
    key = f"aiolock:{{{name}}}"
    index = key + ":ends"
    seconds, micros = await admin.time()
    ends = seconds * 1000 + micros // 1000 + 300
    for i in range(40):  # what 40 readers that died leave (their leases end in 0.3 s)
        await admin.hset(key, f"dead{i:02d}", f"r{ends}")
        await admin.zadd(index, {f"dead{i:02d}": ends})
    await admin.pexpireat(key, ends)
    await admin.pexpireat(index, ends)
    await admin.persist(key)  # (as if a live holder kept the keys: only the ends tell)
    await admin.persist(index)
    rw = ReadWriteLock(client, name, ttl=2.0)
    assert not await rw.writer.acquire(timeout=0.05)  # the readers still hold
    started = time.monotonic()
    assert await rw.writer.acquire(timeout=2.0)
    assert time.monotonic() - started < 0.5
    assert await admin.zcard(index) == 40 - 16 + 1  # 16 dropped, the writer added
    await rw.writer.release()
    async with rw.reader:
        pass
    assert await admin.keys(all_keys(name)) == []
