"""Semaphore (docs/design.md): the limit, dead holders, cancellation, kinds, arguments.

What every primitive keeps (the cancellation windows, loss, renewal, the
observers, bad timeouts...) is proved once for all in ``test_contract.py``,
which runs over ``Semaphore`` with ``limit=1`` and ``limit=3`` too. Here:
what only a semaphore does: at most ``limit`` holders across processes,
and the limit reached; a killed holder's permit coming back by itself; a
storm of cancellations leaving every permit free; a name used by two kinds
of primitive; the arguments a semaphore refuses.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from asyncio.subprocess import PIPE
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from support.checkout import start_python
from support.locks import all_keys, holds_on_server, keys_of, names, names_value
from support.timing import eventually

from aiolock import AsyncLock, LockError, Semaphore, backoff
from aiolock.testing import RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

#: Slack for timing bounds on 2 loaded cores.
SLACK = 0.3


async def holders(admin: redis.Redis, sem: Semaphore) -> list[str]:
    """The tokens holding a permit on the server (expired ones included until met)."""
    return [str(t) for t in await admin.zrange(keys_of(sem).lock, 0, -1)]


# --- the limit -----------------------------------------------------------------------------------

WORKER = """
import asyncio, random, sys, time
import redis.asyncio as redis
from aiolock import Semaphore
async def main(url, name, limit, seconds):
    client = redis.Redis.from_url(url)
    sem = Semaphore(client, name, limit=int(limit), ttl=5.0)
    witness = name + ":inside"
    stop = time.monotonic() + float(seconds)
    most = 0
    over = 0
    held = 0
    async def task():
        nonlocal most, over, held
        while time.monotonic() < stop:
            async with sem:
                inside = await client.incr(witness)
                most = max(most, inside)
                over += inside > int(limit)
                await asyncio.sleep(random.uniform(0, 0.01))
                await client.decr(witness)
                held += 1
    await asyncio.gather(*(task() for _ in range(10)))
    print(most, over, held)
    await client.aclose()
asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_the_limit_is_reached_and_never_exceeded_across_four_processes(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """4 processes x 10 tasks for 2 s on a limit of 3: 3 inside at times, never 4.

    The witness is a counter every holder increments on entry and
    decrements on exit (on the same server): the value its increment
    returns is how many are inside.
    """
    limit = 3
    processes = [
        await start_python(WORKER, server.url, name, str(limit), "2", stdout=PIPE) for _ in range(4)
    ]
    try:
        with anyio.fail_after(30):
            outputs = [await p.communicate() for p in processes]
        assert [p.returncode for p in processes] == [0] * 4
        results = [tuple(map(int, out.split())) for out, _ in outputs]
        assert all(over == 0 for _, over, _ in results), results
        assert max(most for most, _, _ in results) == limit, results
        assert all(held > 0 for _, _, held in results), results
    finally:
        for p in processes:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await admin.delete(f"{name}:inside")


async def test_a_release_grants_the_freed_permit_to_the_first_waiter(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Two permits held; four waiters on separate clients are served in the order they queued."""
    first, second = Semaphore(client, name, limit=2), Semaphore(client, name, limit=2)
    assert await first.acquire()
    assert await second.acquire()
    assert await first.locked()
    clients = [redis.Redis.from_url(server.url) for _ in range(4)]
    served: list[int] = []

    async def wait_then_hold(index: int) -> None:
        async with Semaphore(clients[index], name, limit=2):
            served.append(index)
            await asyncio.sleep(0.01)

    tasks: list[asyncio.Task[None]] = []
    try:
        for index in (2, 0, 3, 1):
            tasks.append(asyncio.create_task(wait_then_hold(index)))
            await eventually(
                functools.partial(_queue_is, admin, first, len(tasks)),
                "the waiter queued",
            )
        await first.release()
        with anyio.fail_after(5):
            await asyncio.gather(*tasks)
        assert served == [2, 0, 3, 1]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await second.release()
        for c in clients:
            await c.aclose()


async def _queue_is(admin: redis.Redis, sem: Semaphore, length: int) -> bool:
    return await admin.llen(keys_of(sem).queue) == length


async def test_with_one_permit_the_tasks_of_one_client_wait_locally_and_take_turns(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Five tasks of one client on a semaphore of one permit: one entry on the server, in order.

    Only the first of them stands in the server's queue; each release hands
    the permit straight to the next of them. With ``fair=True`` each has an
    entry of its own, in the order the entries reached the server: each call
    is let reach it before the next is made (on a loaded machine a call may
    wait for a new connection while the next finds a free one).
    """
    holder = Semaphore(other_client, name, limit=1)
    assert await holder.acquire()
    served: list[int] = []

    async def take(index: int, fair: bool) -> None:
        async with Semaphore(client, name, limit=1, fair=fair):
            served.append(index)
            await asyncio.sleep(0.005)

    for fair, entries in ((False, 1), (True, 5)):
        served.clear()
        tasks = []
        for index in range(5):
            tasks.append(asyncio.create_task(take(index, fair)))
            await asyncio.sleep(0.02)
            if fair:  # in the server's queue before the next calls (its own entry, its place)
                await eventually(
                    functools.partial(_queue_is, admin, holder, index + 1),
                    f"{index + 1} entries queued",
                )
        await eventually(
            functools.partial(_queue_is, admin, holder, entries), f"{entries} entries queued"
        )
        await asyncio.sleep(0.05)
        assert await admin.llen(keys_of(holder).queue) == entries
        await holder.release()
        with anyio.fail_after(5):
            await asyncio.gather(*tasks)
        assert served == [0, 1, 2, 3, 4]
        assert await holder.acquire()
    await holder.release()


async def test_locked_says_whether_every_permit_is_taken(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """`locked()` asks the server: False while a permit is free, True once all are taken."""
    a = Semaphore(client, name, limit=2)
    b = Semaphore(other_client, name, limit=2)
    assert not await a.locked()
    async with a:
        assert not await a.locked()
        assert await a.owned()
        assert not await b.owned()
        async with b:
            assert await a.locked()
            assert await b.locked()
            assert not await Semaphore(other_client, name, limit=2).acquire(blocking=False)
        assert not await a.locked()
    assert not await a.locked()


# --- dead holders and cancellation ---------------------------------------------------------------

HOLDER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import Semaphore
async def main(url, name, ttl):
    sem = Semaphore(redis.Redis.from_url(url), name, limit=1, ttl=float(ttl))
    await sem.acquire()
    print("held", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_sigkilled_holders_permit_comes_back_after_its_lease(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A holder killed with its permit: the waiter gets it as the lease ends, not before."""
    ttl = 1.5
    holder = await start_python(HOLDER, server.url, name, str(ttl), stdout=PIPE)
    try:
        assert holder.stdout is not None
        with anyio.fail_after(10):
            assert await holder.stdout.readline() == b"held\n"
        holder.kill()
        await holder.wait()
        killed = time.monotonic()
        sem = Semaphore(client, name, limit=1, ttl=ttl)
        assert await sem.acquire(timeout=ttl + 2)
        waited = time.monotonic() - killed
        assert waited <= ttl + SLACK, f"the permit came back after {waited:.3f} s"
        assert waited >= 0.5, "the permit came back long before its lease ended"
        await sem.release()
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1, 2])
async def test_hundreds_of_random_cancellations_leave_every_permit_free(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str, limit: int
) -> None:
    """300 acquisitions on 3 clients, each cancelled at a random moment: no permit, no key left.

    Cancelled before, during or after its attempt, while queued, as it is
    granted (by a release, or handed over locally with one permit), or
    while holding: afterwards every permit is free at once.
    """
    clients = [client, *(redis.Redis.from_url(server.url) for _ in range(2))]
    rng = random.Random(1234)

    async def one(index: int) -> None:
        sem = Semaphore(clients[index % 3], name, limit=limit, ttl=5.0)
        async with sem:
            await asyncio.sleep(rng.uniform(0, 0.005))

    try:
        for _ in range(3):
            tasks = [asyncio.create_task(one(i)) for i in range(100)]
            for task in tasks:
                await asyncio.sleep(rng.uniform(0, 0.002))
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await eventually(
            lambda: _no_keys(admin, name), "every key of the semaphore is gone", timeout=5.0
        )
        sems = [Semaphore(c, name, limit=limit) for c in clients[:limit]]
        for sem in sems:
            assert await sem.acquire(blocking=False), "a permit was left taken"
        for sem in sems:
            await sem.release()
    finally:
        for c in clients[1:]:
            await c.aclose()


async def _no_keys(admin: redis.Redis, name: str) -> bool:
    return await admin.keys(all_keys(name)) == []


async def test_renewal_keeps_a_permit_past_several_leases(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """ttl 0.4 s, held 1.6 s: the permit is still ours, and the other waiter still out."""
    sem = Semaphore(client, name, limit=1, ttl=0.4)
    other = Semaphore(other_client, name, limit=1, ttl=0.4, backoff=backoff.constant(0.05))
    async with sem:
        assert not await other.acquire(timeout=1.6)
        assert not sem.lost
        assert await sem.owned()
        assert len(await holders(admin, sem)) == 1


# --- kinds and arguments -------------------------------------------------------------------------


async def test_a_name_used_by_two_kinds_raises_lock_error_naming_the_holder(
    client: redis.Redis, name: str
) -> None:
    """A semaphore on a lock's name, and a lock on a semaphore's name: LockError, not WRONGTYPE.

    A semaphore's commands find a lock's key at once. A lock's first
    commands do not look at the key's kind (a bare ``SET NX`` finds it
    taken; the script reads its ``PTTL``): ``acquire(blocking=False)``
    answers False (the key is held), and a waiting ``acquire()`` raises at
    its next attempt, here at its deadline. Each kind queues apart, so a
    lock waiter is never granted a permit.
    """
    async with AsyncLock(client, name):
        with pytest.raises(LockError, match="in use by an AsyncLock"):
            await Semaphore(client, name, limit=2).acquire(timeout=0.2)
    async with Semaphore(client, name, limit=2):
        lock = AsyncLock(client, name)
        with pytest.raises(LockError, match="in use by a Semaphore"):
            await lock.acquire(timeout=0.2)
        assert not await lock.acquire(blocking=False)


@pytest.mark.parametrize("limit", [True, 1.5, "2", None, 2.0])
def test_a_limit_that_is_not_an_int_is_a_type_error(client: redis.Redis, limit: object) -> None:
    """`limit` must be an int (a bool is not one)."""
    with pytest.raises(TypeError, match=names_value("limit", limit)):
        Semaphore(client, "x", limit=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0, -1, -(10**20)])
def test_a_limit_below_one_is_a_value_error(client: redis.Redis, limit: int) -> None:
    """`limit` must be at least 1."""
    with pytest.raises(ValueError, match=names_value("limit", limit)):
        Semaphore(client, "x", limit=limit)


@pytest.mark.parametrize(
    "option", ["reentrant", "fencing", "replicas", "replica_timeout", "replica_fsync"]
)
def test_the_options_a_semaphore_refuses_are_type_errors_naming_them(
    client: redis.Redis, option: str
) -> None:
    """`reentrant`, `fencing` and the replica options are refused by name, with the reason."""
    options: dict[str, Any] = {option: True}
    with pytest.raises(TypeError, match=names(option, "Semaphore")):
        Semaphore(client, "x", limit=2, **options)


def test_an_unknown_option_is_a_type_error_naming_it(client: redis.Redis) -> None:
    """Any other keyword is refused as Python refuses it."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'permits'"):
        Semaphore(client, "x", limit=2, permits=3)  # type: ignore[arg-type]


def test_limit_and_repr(client: redis.Redis, name: str) -> None:
    """`limit` is the int given; the repr names the semaphore, its key and its limit."""
    sem = Semaphore(client, name, limit=4, ttl=2.0)
    assert sem.limit == 4
    assert sem.name == name
    assert sem.key == keys_of(sem).lock
    assert "limit=4" in repr(sem)
    assert repr(name) in repr(sem)


async def test_the_key_lives_as_long_as_its_longest_permit_after_a_release(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (found by the contract suite): a release re-sets the key's expiry.

    A permit of 10 s and one of 1 s: the key lives 10 s; once the long one
    is released, it lives as long as the short one, not the released one.
    """
    long = Semaphore(client, name, limit=2, ttl=10.0, auto_renew=False)
    short = Semaphore(client, name, limit=2, ttl=1.0, auto_renew=False)
    assert await long.acquire()
    assert await short.acquire()
    assert 9000 < await admin.pttl(keys_of(long).lock) <= 10_000
    await long.release()
    assert 0 < await admin.pttl(keys_of(long).lock) <= 1000
    await short.release()
    assert await admin.exists(keys_of(long).lock) == 0


async def test_a_semaphore_waiting_behind_a_lock_of_its_client_is_not_handed_the_lock(
    client: redis.Redis, name: str
) -> None:
    """Regression (review): a lock and a semaphore of one permit on one client wait apart.

    The semaphore's task goes to the server at once (it does not wait in the
    lock's local queue to be handed the lock's key), and finds the lock's key.
    """
    async with AsyncLock(client, name):
        with pytest.raises(LockError, match="in use by an AsyncLock"):
            await Semaphore(client, name, limit=1).acquire(timeout=1.0)


@pytest.mark.parametrize("limit", [1, 2])
async def test_a_grant_to_a_waiter_that_does_not_renew_gives_it_its_whole_lease(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, limit: int
) -> None:
    """Regression (review): with auto_renew=False a granted permit lasts ttl, not 2 s."""
    holders = [Semaphore(client, name, limit=limit) for _ in range(limit)]
    for holder in holders:
        assert await holder.acquire()
    waiter = Semaphore(other_client, name, limit=limit, ttl=5.0, auto_renew=False)
    waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
    await eventually(functools.partial(_queue_is, admin, waiter, 1), "the waiter queued")
    await holders[0].release()
    with anyio.fail_after(2):
        assert await waiting
    await asyncio.sleep(2.3)  # past a first lease of one entry life (2 s)
    assert not waiter.lost
    assert await holds_on_server(waiter)
    await waiter.release()
    for holder in holders[1:]:
        await holder.release()


async def test_a_caller_with_a_smaller_limit_can_be_granted_past_it(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Two limits on one name: the caller with limit=1 holds while another permit is held.

    The limit is each caller's own: a release by a caller with ``limit=3``
    grants free permits (up to 3) to whoever is queued, a ``limit=1`` waiter
    included, while the releaser's other permit is still held. So the extra
    holder need not be the caller with the larger limit (as docs/production.md
    says); the one rule is one limit per name.
    """
    large = [Semaphore(client, name, 3) for _ in range(2)]
    for sem in large:
        assert await sem.acquire()
    small = Semaphore(other_client, name, 1)
    waiting = asyncio.create_task(small.acquire(timeout=5.0))
    await eventually(functools.partial(_queue_is, admin, small, 1), "the limit=1 caller queued")
    await large[0].release()  # limit 3: one permit of 3 is held, so it grants the queued one
    assert await waiting
    assert len(await holders(admin, small)) == 2, "the limit=1 caller holds with another"
    await small.release()
    await large[1].release()
    assert await admin.exists(large[1].key) == 0


async def test_extending_a_permit_to_a_shorter_lease_shortens_the_sets_life(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """extend(ttl=1) of the only 10 s permit leaves the set 1 s to live, not 10.

    Renewal only ever lengthens the set's life (O(1)); a shorter lease looks
    for the longest one left instead, and here that is the new one.
    """
    sem = Semaphore(client, name, limit=3, ttl=10.0, auto_renew=False)
    other = Semaphore(client, name, limit=3, ttl=3.0, auto_renew=False)
    async with sem:
        assert 9000 < await admin.pttl(f"aiolock:{{{name}}}") <= 10_000
        async with other:
            await sem.extend(ttl=1.0)
            assert 2000 < await admin.pttl(f"aiolock:{{{name}}}") <= 3000  # the other's lease
        await sem.extend(ttl=1.0)
        assert 0 < await admin.pttl(f"aiolock:{{{name}}}") <= 1000
