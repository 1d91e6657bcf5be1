"""Who holds a name and who waits: ``aiolock.inspect``, ``identity=``, and the forced release.

Every primitive names its holdings and its waiting calls by an identity its
tokens carry (``host:pid:task-name`` by default), which ``inspect`` reads
on the server with the lease left, the acquisition time and the fence. A
forced release (what ``aiolock release --force`` does) frees a name by the
grant rule and leaves the old holder a mark it reads on its loss path.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as redis
from support.locks import all_keys
from support.timing import eventually, finish

import aiolock
from aiolock import (
    AsyncLock,
    Election,
    HolderInfo,
    LockInfo,
    LockLostError,
    MultiLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
    WaiterInfo,
)
from aiolock._inspect import force_release
from aiolock._scripts import FORCED_SUFFIX

#: The default identity's head: this host and this process.
HERE = f"{socket.gethostname()}:{os.getpid()}:"


async def _queued(client: redis.Redis, name: str, count: int) -> None:
    """Wait until ``count`` waiters stand in ``name``'s queue on the server."""

    async def enough() -> bool:
        info = await aiolock.inspect(client, name)
        return info is not None and len(info.waiters) >= count

    await eventually(enough, f"{count} waiters queued on the server")


async def _drop_marks(admin: redis.Redis, name: str) -> None:
    """Delete the marks a forced release left (they outlive the test by design)."""
    for key in await admin.keys(f"*{name}}}{FORCED_SUFFIX}*"):
        await admin.delete(key)


async def test_inspect_names_the_holder_by_host_pid_and_task_name_by_default(
    client: redis.Redis, name: str, no_leaks: None
) -> None:
    """A lock held by a task named "job-7": host:pid:job-7, its lease, when it acquired."""
    lock = AsyncLock(client, name, ttl=5.0)
    before = time.time()

    async def job() -> LockInfo | None:
        async with lock:
            return await aiolock.inspect(client, name)

    info = await asyncio.create_task(job(), name="job-7")
    after = time.time()
    assert info is not None
    assert (info.name, info.kind, info.waiters) == (name, "lock", [])
    [holder] = info.holders
    assert holder.identity == f"{HERE}job-7"
    assert holder.acquired_at is not None
    assert before - 0.002 <= holder.acquired_at <= after
    assert holder.remaining is not None
    assert 4.0 < holder.remaining <= 5.0
    assert holder.fence is None  # (no fencing)
    assert holder.role == "holder"
    assert await aiolock.inspect(client, name) is None  # free and unwaited


async def test_tasks_taking_turns_on_one_lock_are_each_named(
    client: redis.Redis, name: str, no_leaks: None
) -> None:
    """Tasks "t1", "t2", "t1" acquire in turn: each holding names its own task."""
    lock = AsyncLock(client, name, ttl=5.0)

    async def job() -> str | None:
        async with lock:
            info = await aiolock.inspect(client, name)
        return info.holders[0].identity if info else None

    seen = [await asyncio.create_task(job(), name=n) for n in ["t1", "t2", "t1", "t1"]]
    assert seen == [f"{HERE}t1", f"{HERE}t2", f"{HERE}t1", f"{HERE}t1"]


async def test_inspect_gives_the_identity_given_and_the_holder_s_fence(
    client: redis.Redis, name: str, no_leaks: None, admin: redis.Redis
) -> None:
    """identity= replaces the default (spaces and % survive); fencing=True shows lock.fence."""
    lock = AsyncLock(client, name, fencing=True, identity="billing worker 3 (100%)")
    assert lock.identity == "billing worker 3 (100%)"
    async with lock:
        info = await aiolock.inspect(client, name)
        assert info is not None
        assert info.holders[0].identity == "billing worker 3 (100%)"
        assert info.holders[0].fence == lock.fence
        assert lock.fence is not None
    await admin.delete(f"{lock.key}:fence")


async def test_inspect_lists_the_waiters_in_the_order_they_will_be_served(
    client: redis.Redis, other_client: redis.Redis, name: str, no_leaks: None
) -> None:
    """Three fair waiters queued one after the other: listed in that order, then served so."""
    holder = AsyncLock(client, name, ttl=5.0, identity="holder")
    assert await holder.acquire()
    served: list[str] = []
    waiters: list[asyncio.Task[None]] = []

    async def wait(who: str) -> None:
        lock = AsyncLock(other_client, name, ttl=5.0, fair=True, identity=who)
        async with lock:
            served.append(who)

    try:
        for number, who in enumerate(["w1", "w2", "w3"], 1):
            waiters.append(asyncio.create_task(wait(who)))
            await _queued(client, name, number)
        info = await aiolock.inspect(client, name)
        assert info is not None
        assert [h.identity for h in info.holders] == ["holder"]
        assert info.waiters == [WaiterInfo("w1"), WaiterInfo("w2"), WaiterInfo("w3")]
        await holder.release()
        await asyncio.gather(*waiters)
        assert served == ["w1", "w2", "w3"]
    finally:
        for task in waiters:
            await finish(task)


async def test_an_heir_s_acquired_at_is_when_its_acquire_call_began(
    client: redis.Redis, other_client: redis.Redis, name: str, no_leaks: None
) -> None:
    """The documented meaning: a holder that waited shows the start of its wait, not the grant."""
    holder = AsyncLock(client, name, ttl=5.0)
    assert await holder.acquire()
    heir = AsyncLock(other_client, name, ttl=5.0, fair=True, identity="heir")
    began = time.time()
    waiting = asyncio.create_task(heir.acquire())
    try:
        await _queued(client, name, 1)
        await asyncio.sleep(0.3)
        granted_after = time.time()
        await holder.release()
        assert await waiting
        info = await aiolock.inspect(client, name)
        assert info is not None
        [held] = info.holders
        assert held.identity == "heir"
        assert held.acquired_at is not None
        assert began - 0.002 <= held.acquired_at < granted_after - 0.25
        await heir.release()
    finally:
        await finish(waiting)


async def test_inspect_a_semaphore_s_permits_and_waiters(
    client: redis.Redis, other_client: redis.Redis, name: str, no_leaks: None
) -> None:
    """Two permits of two held by "a" and "b", "c" waiting: kind semaphore, roles permit."""
    a = Semaphore(client, name, 2, ttl=5.0, identity="a")
    b = Semaphore(other_client, name, 2, ttl=5.0, identity="b")
    c = Semaphore(other_client, name, 2, ttl=5.0, identity="c")
    assert await a.acquire()
    assert await b.acquire()
    waiting = asyncio.create_task(c.acquire())
    try:
        await _queued(client, name, 1)
        info = await aiolock.inspect(client, name)
        assert info is not None
        assert info.kind == "semaphore"
        assert sorted(h.identity for h in info.holders) == ["a", "b"]
        assert {h.role for h in info.holders} == {"permit"}
        assert all(h.fence is None and h.remaining and h.remaining <= 5.0 for h in info.holders)
        assert info.waiters == [WaiterInfo("c")]
        await a.release()
        assert await waiting
        await b.release()
        await c.release()
    finally:
        await finish(waiting)


async def test_inspect_a_read_write_lock_s_writer_readers_and_waiters(
    client: redis.Redis, other_client: redis.Redis, name: str, no_leaks: None
) -> None:
    """A writer "w" holds, reader "r" waits; then "r" and a second reader "r2" hold."""
    writer = ReadWriteLock(client, name, ttl=5.0, identity="w").writer
    reader = ReadWriteLock(other_client, name, ttl=5.0, identity="r").reader
    reader2 = ReadWriteLock(client, name, ttl=5.0, identity="r2").reader
    assert reader.identity == "r"
    assert await writer.acquire()
    waiting = asyncio.create_task(reader.acquire())
    try:
        await _queued(client, name, 1)
        info = await aiolock.inspect(client, name)
        assert info is not None
        assert info.kind == "rwlock"
        assert [(h.identity, h.role) for h in info.holders] == [("w", "writer")]
        assert info.waiters == [WaiterInfo("r")]
        await writer.release()
        assert await waiting
        assert await reader2.acquire()
        info = await aiolock.inspect(client, name)
        assert info is not None
        assert sorted((h.identity, h.role) for h in info.holders) == [
            ("r", "reader"),
            ("r2", "reader"),
        ]
        await reader.release()
        await reader2.release()
    finally:
        await finish(waiting)


async def test_inspect_an_election_s_leader_and_candidates(
    client: redis.Redis, other_client: redis.Redis, name: str, admin: redis.Redis
) -> None:
    """The leader "cand-1" with its term's fence, "cand-2" waiting: kind election."""
    first = Election(client, name, ttl=5.0, identity="cand-1")
    second = Election(other_client, name, ttl=5.0, identity="cand-2")

    async def stand() -> None:
        async with second.lead():
            pass

    async with first.lead() as term:
        waiting = asyncio.create_task(stand())
        try:
            await _queued(client, name, 1)
            info = await aiolock.inspect(client, name)
            assert info is not None
            assert info.kind == "election"
            assert [(h.identity, h.fence) for h in info.holders] == [("cand-1", term.fence)]
            assert info.waiters == [WaiterInfo("cand-2")]
        finally:
            await finish(waiting)
    await admin.delete(*await admin.keys(all_keys(name)))


async def test_inspect_names_a_multilock_s_and_a_redlock_s_holder(
    client: redis.Redis, name: str, no_leaks: None
) -> None:
    """Each name of a MultiLock, and a Redlock's key on a node, show the identity given."""
    multi = MultiLock(client, [f"{name}:a", f"{name}:b"], identity="multi")
    async with multi:
        for part in ("a", "b"):
            info = await aiolock.inspect(client, f"{name}:{part}")
            assert info is not None
            assert (info.kind, info.holders[0].identity) == ("lock", "multi")
    red = Redlock([client], name, ttl=5.0, identity="red")
    async with red:
        info = await aiolock.inspect(client, name)
        assert info is not None
        assert info.holders[0].identity == "red"


PRIMITIVES: dict[str, Callable[[redis.Redis, str, Any], Any]] = {
    "AsyncLock": lambda c, n, i: AsyncLock(c, n, identity=i),
    "Semaphore": lambda c, n, i: Semaphore(c, n, 2, identity=i),
    "ReadWriteLock": lambda c, n, i: ReadWriteLock(c, n, identity=i),
    "Redlock": lambda c, n, i: Redlock([c], n, identity=i),
    "MultiLock": lambda c, n, i: MultiLock(c, [n], identity=i),
    "Election": lambda c, n, i: Election(c, n, identity=i),
}


@pytest.mark.parametrize("kind", PRIMITIVES)
@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        (5, TypeError, "must be a str"),
        (b"me", TypeError, "must be a str"),
        ("", ValueError, "must not be empty"),
        ("x" * 257, ValueError, "must be at most 256"),
        ("a\nb", ValueError, "must be printable"),
    ],
)
def test_a_bad_identity_is_refused_naming_the_argument(
    client: redis.Redis, kind: str, value: object, error: type[Exception], says: str
) -> None:
    """identity= that is not a str of 1 to 256 printable characters: TypeError/ValueError."""
    with pytest.raises(error, match=f"identity {says}"):
        PRIMITIVES[kind](client, "bad-identity", value)


@pytest.mark.parametrize("kind", PRIMITIVES)
def test_a_good_identity_is_kept(client: redis.Redis, kind: str) -> None:
    """256 characters, unicode and spaces are an identity."""
    made = PRIMITIVES[kind](client, "good-identity", "é " + "x" * 254)
    assert made.identity == "é " + "x" * 254


async def test_a_forced_release_serves_the_next_waiter_at_once_and_the_holder_learns_why(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Forced: the waiter holds within 0.5 s; lost, on_lost and release() say who forced it."""
    lost: list[bool] = []
    stuck = AsyncLock(
        client, name, ttl=1.5, identity="stuck-job", on_lost=lambda lock: lost.append(lock.lost)
    )
    assert await stuck.acquire()
    heir = AsyncLock(other_client, name, ttl=5.0, fair=True, identity="next-job")
    waiting = asyncio.create_task(heir.acquire())
    try:
        await _queued(client, name, 1)
        forced_at = time.monotonic()
        done = await force_release(admin, name, "ops@console")
        assert (done.kind, done.holders, done.granted) == ("lock", ["stuck-job"], 1)
        assert await waiting
        assert time.monotonic() - forced_at < 0.5
        info = await aiolock.inspect(admin, name)
        assert info is not None
        assert info.holders[0].identity == "next-job"
        await eventually(lambda: lost == [True], "the holder's renewal reports the loss")
        assert stuck.lost
        with pytest.raises(LockLostError, match="released by force by ops@console"):
            await stuck.release()
        await heir.release()
    finally:
        await finish(waiting)
        await _drop_marks(admin, name)


async def test_a_forced_release_found_at_release_names_the_forcer(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Forced before any renewal: the holder's release() raises, naming the forcer."""
    lock = AsyncLock(client, name, ttl=30.0)
    assert await lock.acquire()
    done = await force_release(admin, name, "ops@console")
    assert done.holders == [f"{HERE}{asyncio.current_task().get_name()}"]  # type: ignore[union-attr]
    assert done.granted == 0
    assert await admin.exists(lock.key) == 0
    with pytest.raises(LockLostError, match="released by force by ops@console"):
        await lock.release()
    await _drop_marks(admin, name)


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
async def test_a_forced_release_of_a_semaphore_or_read_write_lock(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, kind: str
) -> None:
    """Every holder is taken and told; the first waiter is granted at once."""
    holders: list[Any]
    if kind == "semaphore":
        holders = [Semaphore(client, name, 2, identity=i) for i in ("h1", "h2")]
        waiter: Any = Semaphore(other_client, name, 2, identity="w")
    else:
        holders = [ReadWriteLock(client, name, identity=i).reader for i in ("h1", "h2")]
        waiter = ReadWriteLock(other_client, name, identity="w").writer
    for holder in holders:
        assert await holder.acquire()
    if kind == "semaphore":
        extra = Semaphore(client, name, 2, identity="h3")
        waiting_first = asyncio.create_task(extra.acquire())  # (the limit is full)
        await _queued(client, name, 1)
    waiting = asyncio.create_task(waiter.acquire())
    try:
        await _queued(client, name, 2 if kind == "semaphore" else 1)
        done = await force_release(admin, name, "ops")
        assert (done.kind, sorted(done.holders)) == (kind, ["h1", "h2"])
        assert await asyncio.wait_for(waiting, 0.5)
        assert done.granted == (2 if kind == "semaphore" else 1)
        for holder in holders:
            with pytest.raises(LockLostError, match="released by force by ops"):
                await holder.release()
        await waiter.release()
        if kind == "semaphore":
            assert await waiting_first
            await extra.release()
    finally:
        await finish(waiting)
        if kind == "semaphore":
            await finish(waiting_first)
        await _drop_marks(admin, name)
    assert await admin.keys(all_keys(name)) == []


async def test_forcing_a_free_name_changes_nothing(admin: redis.Redis, name: str) -> None:
    """Nobody holds it: no kind, nobody taken, nothing granted, no key written."""
    done = await force_release(admin, name, "ops")
    assert (done.kind, done.holders, done.granted) == (None, [], 0)
    assert await admin.keys(all_keys(name)) == []


def test_the_info_classes_are_frozen() -> None:
    """LockInfo, HolderInfo and WaiterInfo are values: frozen, compared by value."""
    holder = HolderInfo("me", 1.0, 2.0, None)
    assert holder.role == "holder"
    with pytest.raises(AttributeError):
        holder.identity = "you"  # type: ignore[misc]
    assert LockInfo("n", "lock", [holder], []) == LockInfo("n", "lock", [holder], [])
