"""The contract as applications meet it, for every primitive (see ``support/contract.py``).

A lock is often acquired in one task and used in another: ``asyncio.wait_for``
runs ``acquire()`` in a task of its own on CPython 3.11, ``gather`` runs each
awaitable in one, a request hands its lock to a background job, a middleware
acquires while the endpoint runs in a task it started. A holding whose
acquiring task ended is *detached*: it stays held and renewed until it is
released (by any task), lost, capped by ``max_hold``, or unreachable (its lock
object garbage-collected: a ``ResourceWarning`` names it and its key expires).
A task started by the holder (it inherits the holder's context) shares the
holding for ``owned()``, ``extend()`` and ``release()``.

And the network: a reply lost to a connection reset (a load balancer restarting
between a command and its reply) never becomes a false answer. The proxy runs
the command on the server, drops its reply and resets the connection; the
client (redis-py's retries on) sends again. A release or a hand-over is never
sent twice blindly: a lost reply is followed by the question, and the answer
is the truth; an attempt or an extension that ran twice answers the same.
"""

from __future__ import annotations

import asyncio
import gc
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from support.contract import SLACK, Lock, Subject, is_lost
from support.leaks import other_tasks
from support.locks import kinds
from support.timing import eventually

from aiolock import LockEvent
from aiolock._multi_lease import MultiLease
from aiolock._quorum import QuorumLease
from aiolock._scripts import (
    EXTEND_MANY,
    HANDOVER,
    MULTI_ACQUIRE,
    MULTI_RELEASE,
    SEMAPHORE_HANDOVER,
    Script,
)
from aiolock._server_lease import ServerLease
from aiolock.testing import FaultProxy, RedisServer

#: The lease of these tests, and how long the "work" of a holder lasts: three leases.
TTL = 0.3
WORK = 3 * TTL


async def holds_throughout(subject: Subject, lock: Lock, seconds: float) -> None:
    """For ``seconds``: ``lock``'s own token holds its key on every server, never lapsing.

    The token is the one found at the start (the lock's own: ``owned()`` says
    so); no lease runs out in between.
    """
    assert await lock.owned()
    mine = await subject.holders(lock.key)
    assert () not in mine
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        await asyncio.sleep(0.03)
        now = await subject.holders(lock.key)
        assert all(set(m) <= set(n) for m, n in zip(mine, now, strict=True)), (
            f"the holding lapsed: {mine} -> {now}"
        )
    assert min(await subject.leases(lock.key)) > 0


async def ended_cleanly(subject: Subject, events: list[LockEvent], *locks: Lock) -> None:
    """``locks`` were never lost (no 'lost' event either), and nothing is left on the servers."""
    for lock in locks:
        assert not is_lost(lock)
        assert not [e for e in events if e.kind == "lost" and e.lock is lock], "a loss reported"
    assert await subject.keys_left() == []


# --- detached holdings ---------------------------------------------------------------------------


@pytest.mark.parametrize("helper", ["wait_for", "task"])
async def test_a_lock_acquired_in_a_helper_task_stays_held_while_the_caller_works(
    subject: Subject, events: list[LockEvent], helper: str
) -> None:
    """``await wait_for(lock.acquire(), 5)`` (or a task that acquires and ends): held 3 leases.

    On CPython 3.11 ``wait_for`` runs ``acquire()`` in a task of its own,
    which ends at once; from 3.12 on it runs in the caller (``task`` runs it
    in a helper on every version). Either way the holding is renewed while
    the caller works, owned() and extend() answer for it, and the caller's
    release() ends it.
    """
    lock = subject.make_lock(ttl=TTL)
    if helper == "wait_for":
        assert await asyncio.wait_for(lock.acquire(), 5)
    else:
        assert await asyncio.create_task(lock.acquire())
    await holds_throughout(subject, lock, WORK)
    assert await lock.owned()
    assert await lock.extend() is True
    assert not is_lost(lock)
    await lock.release()
    await ended_cleanly(subject, events, lock)


async def test_locks_acquired_by_gather_stay_held(
    subject: Subject, events: list[LockEvent]
) -> None:
    """``await gather(a.acquire(), b.acquire())``: both held and renewed until released."""
    a = subject.make_lock(f"{subject.name}:a", ttl=TTL)
    b = subject.make_lock(f"{subject.name}:b", ttl=TTL)
    assert list(await asyncio.gather(a.acquire(), b.acquire())) == [True, True]
    await asyncio.gather(holds_throughout(subject, a, WORK), holds_throughout(subject, b, WORK))
    await asyncio.gather(a.release(), b.release())
    await ended_cleanly(subject, events, a, b)


async def test_a_background_job_keeps_the_lock_its_request_acquired_until_it_releases(
    subject: Subject, events: list[LockEvent]
) -> None:
    """A request acquires, starts a job and returns; the job works 3 leases, then releases.

    Meanwhile nobody else gets the lock: a waiter in another "process" gets
    it only after the job's release, and the job's release() raises nothing.
    """
    lock = subject.make_lock(ttl=TTL)
    released_at: list[float] = []

    async def job() -> None:
        await holds_throughout(subject, lock, WORK)
        released_at.append(time.monotonic())
        await lock.release()

    async def request() -> asyncio.Task[None]:
        assert await lock.acquire()
        return asyncio.create_task(job())

    running = await asyncio.create_task(request())  # the request's task ends here
    others = subject.make_holder(process=1, leave=0, ttl=TTL)
    # A waiter elsewhere: it gets every permit only once the job gave its permit back.
    waited = time.monotonic()
    assert await asyncio.wait_for(others.acquire(), WORK + 5)
    got_at = time.monotonic()
    await running
    assert released_at, "the job did not release"
    assert got_at >= released_at[0], f"taken {released_at[0] - got_at:.3f} s before the release"
    assert got_at - waited >= WORK - SLACK
    await others.release()
    await ended_cleanly(subject, events, lock)


async def test_a_task_started_by_the_holder_shares_its_holding(
    subject: Subject, events: list[LockEvent]
) -> None:
    """The middleware/endpoint split: a task the holder starts sees the holding as its own.

    owned() is True in it, extend() extends the holder's lease, lost and fence
    read the holder's; a task started before the acquisition is not the
    holder's (owned() False without a round trip, extend() raises).
    """
    lock = subject.make_lock(ttl=1.0, auto_renew=False)
    before = asyncio.Event()
    answers: dict[str, Any] = {}

    async def started_before() -> None:
        await before.wait()
        answers["before"] = await lock.owned()

    earlier = asyncio.create_task(started_before())
    async with lock:

        async def endpoint() -> None:
            answers["owned"] = await lock.owned()
            await subject.set_lease(lock.key, 300)
            answers["extended"] = await lock.extend()
            answers["lost"] = lock.lost
            answers["fence"] = lock.fence

        await asyncio.create_task(endpoint())
        assert min(await subject.leases(lock.key)) > 800, "the endpoint's extend() missed"
        before.set()
        await earlier
        assert answers == {
            "owned": True,
            "extended": True,
            "lost": False,
            "fence": lock.fence,
            "before": False,
        }
    await ended_cleanly(subject, events, lock)


async def test_a_forgotten_lock_warns_and_its_key_expires(subject: Subject) -> None:
    """Acquired in a task that ends, never released, dropped: a ResourceWarning names it.

    Its renewal stops (no task left), and the server expires the key with
    its lease.
    """
    with pytest.warns(ResourceWarning, match=rf"lock {re.escape(repr(subject.shown))} was never"):
        await forget_a_lock(subject)
    assert await other_tasks() == set(), "a renewal outlived its lock"

    async def expired() -> bool:
        return await subject.keys_left() == []

    await eventually(expired, "the forgotten key to expire", timeout=TTL + 1.0)


async def forget_a_lock(subject: Subject) -> None:
    """A task acquires a lock and ends, keeping no reference to it; then a collection runs."""

    async def forget() -> None:
        lock = subject.make_lock(ttl=TTL)
        assert await lock.acquire()

    await asyncio.create_task(forget())
    await asyncio.sleep(0)
    gc.collect()


# --- lost replies ----------------------------------------------------------------------------


@pytest.fixture
async def proxies(
    subject: Subject, start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]]
) -> list[FaultProxy]:
    """A fault proxy in front of each of the subject's servers."""
    return [await start_proxy(s) for s in subject.servers]


def through(subject: Subject, proxies: list[FaultProxy]) -> list[redis.Redis]:
    """A "process" whose clients reach the servers through ``proxies``, retrying as redis-py can.

    ``retry`` as ``redis.Redis()`` has it by default: a command whose
    connection failed is sent again.
    """
    return subject.connect([p.url for p in proxies], retry=Retry(NoBackoff(), 3))


def node_lease(lock: Lock) -> ServerLease:
    """The one-server lease of ``lock`` (a Redlock's first node's: they run the same scripts)."""
    lease: Any = lock._lease
    if isinstance(lease, QuorumLease):
        return lease._nodes[0]
    assert isinstance(lease, ServerLease)
    return lease


#: A MultiLock's scripts in the roles of a one-server lease's (it gives back with its release).
MULTI_SCRIPTS = {
    "_ACQUIRE": MULTI_ACQUIRE,
    "_RELEASE": MULTI_RELEASE,
    "_LEAVE": MULTI_RELEASE,
    "_EXTEND": EXTEND_MANY,
}


def script_of(lock: Lock, role: str) -> Script:
    """The script ``lock``'s lease runs in ``role`` (``"_RELEASE"``...), a MultiLock's too."""
    if isinstance(lock._lease, MultiLease):
        return MULTI_SCRIPTS[role]
    script: Script = getattr(node_lease(lock), role)
    return script


def sha(script: Script) -> bytes:
    """The bytes that name ``script`` in an ``EVALSHA``."""
    return script.sha.encode()


async def warm_lock(subject: Subject, proxies: list[FaultProxy], **options: Any) -> Lock:
    """The subject's lock through ``proxies`` (``ttl=5``), after one acquire, extend, release.

    Its scripts are loaded and its connections made: a reply dropped next is
    the reply of the command the test means.
    """
    lock = subject.make_lock(clients=through(subject, proxies), **{"ttl": 5.0, **options})
    assert await lock.acquire()
    assert await lock.extend()
    await lock.release()
    return lock


def drop(proxies: list[FaultProxy], pattern: bytes) -> None:
    """Lose the reply of the next command carrying ``pattern``, on every proxy."""
    for p in proxies:
        p.drop_reply(pattern)


def dropped(proxies: list[FaultProxy]) -> int:
    """How many replies the proxies dropped."""
    return sum(p.replies_dropped for p in proxies)


async def test_a_release_whose_reply_is_lost_is_a_release(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """The release ran, its reply was lost: release() returns, no loss is reported, no key left."""
    lock = await warm_lock(subject, proxies)
    assert await lock.acquire()
    drop(proxies, sha(script_of(lock, "_RELEASE")))
    await lock.release()
    assert dropped(proxies) == len(proxies)
    await ended_cleanly(subject, events, lock)


async def test_a_grant_whose_reply_is_lost_reaches_the_waiter(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """A release that granted a waiter elsewhere lost its reply: no loss, the waiter holds."""
    lock = await warm_lock(subject, proxies)
    assert await lock.acquire()
    others = subject.make_holder(process=1, leave=subject.limit - 1, ttl=5.0)
    # Every other permit taken elsewhere first, so the waiter below waits for ours.
    spare = subject.make_holder(process=2, leave=1, ttl=5.0) if subject.limit > 1 else None
    if spare is not None:
        assert await spare.acquire()
    waiter = asyncio.create_task(others.acquire())
    await asyncio.sleep(0.2)  # queued (or polling, on a quorum)
    assert not waiter.done()
    drop(proxies, sha(script_of(lock, "_RELEASE")))
    released = time.monotonic()
    await lock.release()
    assert await asyncio.wait_for(waiter, 3.0)
    assert time.monotonic() - released < 1.0
    await others.release()
    if spare is not None:
        await spare.release()
    await ended_cleanly(subject, events, lock)


async def test_an_attempt_whose_reply_is_lost_is_recognised_as_ours(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """The first attempt took the lock and lost its reply: sent again, it is ours, at once.

    Not a caller queued behind itself: acquire() returns True well within a
    lease, the caller owns the lock, and its release leaves nothing.
    """
    lock = await warm_lock(subject, proxies)
    bare = not isinstance(lock._lease, MultiLease) and node_lease(lock).bare_first
    drop(proxies, b"NX" if bare else sha(script_of(lock, "_ACQUIRE")))
    started = time.monotonic()
    assert await lock.acquire(timeout=3.0)
    assert time.monotonic() - started < 1.0
    assert dropped(proxies) == len(proxies)
    assert await lock.owned()
    await lock.release()
    await ended_cleanly(subject, events, lock)


async def test_an_extend_whose_reply_is_lost_still_extends(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """extend() ran twice (its first reply lost): True, the lease reset, nothing lost."""
    lock = await warm_lock(subject, proxies, auto_renew=False)
    assert await lock.acquire()
    await subject.set_lease(lock.key, 1000)
    drop(proxies, sha(script_of(lock, "_EXTEND")))
    assert await lock.extend() is True
    assert dropped(proxies) == len(proxies)
    assert min(await subject.leases(lock.key)) > 4000
    await lock.release()
    await ended_cleanly(subject, events, lock)


async def test_a_leave_whose_reply_is_lost_leaves_nothing(
    subject: Subject, proxies: list[FaultProxy]
) -> None:
    """A waiter gives up (its deadline) and its leave's reply is lost: no entry, no key left."""
    lock = await warm_lock(subject, proxies)
    holder = subject.make_holder(process=1, ttl=5.0)
    assert await holder.acquire()
    # A quorum does not queue: its waiter's cleanup is the release script (a delete).
    leave = script_of(lock, "_RELEASE" if subject.quorum else "_LEAVE")
    drop(proxies, sha(leave))
    assert not await lock.acquire(timeout=0.3)
    await holder.release()
    assert await subject.keys_left() == []


async def test_a_hand_over_whose_reply_is_lost_strands_no_token(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """Two tasks of one object: the hand-over between them lost its reply; the next holds at once.

    The hand-over swapped the tokens; run again it finds the next holder's
    and says so. Before, the release raised and the next task waited a whole
    lease for a token nobody knew. (Only a lock and a semaphore of one permit
    hand over within a process; the others release, and the next contends.)
    """
    if subject.kind in ("Semaphore3", "Reader"):
        pytest.skip(f"two tasks share a {subject.kind}: neither waits for the other")
    lock = await warm_lock(subject, proxies)
    await take_turns(lock, [])  # a hand-over already: its script is loaded
    hands_over = subject.kind in ("AsyncLock", "Semaphore")
    if hands_over:
        drop(proxies, sha(SEMAPHORE_HANDOVER if subject.semaphore else HANDOVER))
    else:
        drop(proxies, sha(script_of(lock, "_RELEASE")))
    order: list[tuple[str, float]] = []
    await asyncio.wait_for(take_turns(lock, order), 3.0)
    assert [who for who, _ in order] == ["first", "second"]
    assert order[1][1] - order[0][1] < 0.5, "the next task waited for a lease"
    assert dropped(proxies) == len(proxies)
    assert "lost" not in kinds(events, subject.shown)
    assert await subject.keys_left() == []


async def take_turns(lock: Lock, order: list[tuple[str, float]]) -> None:
    """Two tasks take ``lock`` in turn; the second waits in the first's local queue.

    ``order`` gets who held it when: the first's release, as it leaves, is
    the hand-over to the second.
    """
    leave = asyncio.Event()

    async def take(who: str) -> None:
        async with lock:
            order.append((who, time.monotonic()))
            if who == "first":
                await leave.wait()

    first = asyncio.create_task(take("first"))
    await eventually(lambda: bool(order), "the first to hold")
    second = asyncio.create_task(take("second"))
    await eventually(lambda: lock.statistics().tasks_waiting >= 1, "the second to wait")
    leave.set()
    await asyncio.gather(first, second)
