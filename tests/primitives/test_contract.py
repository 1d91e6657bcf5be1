"""The contract every lock primitive keeps, written once (docs/design.md).

Each test runs once per primitive: :class:`~aiolock.AsyncLock` on one server,
:class:`~aiolock.Redlock` over three independent servers,
:class:`~aiolock.Semaphore` with ``limit=1`` and ``limit=3``, and
the two sides of a :class:`~aiolock.ReadWriteLock`: its ``reader`` and its
``writer``. A primitive added later gets the whole suite by adding one entry
to :data:`PRIMITIVES`, one branch to :meth:`Subject.make_lock`, and, if its
key is not a lock's string, one to each method of the admin view
(:meth:`Subject.holders`, :meth:`Subject.leases`, :meth:`Subject.take_away`,
:meth:`Subject.set_lease`). The tests speak of what a primitive holds in
those words only (the holders' tokens, their remaining lease, whether the key
is there), never of a key's type; "held elsewhere" means every permit held
elsewhere, or for a reader the writer (:meth:`Subject.make_holder`).

What is proved here: the two cancellation windows of an acquire (before the
server ran the command: ``CLIENT PAUSE WRITE``; after it ran, before the
reply: a :class:`FaultProxy` holding replies) and of a release; loss
(``lost``, ``on_lost``, ``cancel_on_lost``, ``LockLostError`` on exit, the
body's own exception kept with the loss as a note); renewal past the lease;
release from another task; re-entrance (a semaphore and a read-write lock
refuse it); bad arguments; the observer events. Leases are taken away on
purpose (``PEXPIRE key 1``, ``DEL``, an overwrite, or their sorted-set and
hash forms), never slept out. What only one primitive does stays in its own
file.

AsyncLock and Redlock run on both event loops; the semaphores and the
read-write lock's sides, on the same engine, on the asyncio loop only (the
suite's time budget): their uvloop variants are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import anyio
import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.checkout import ROOT
from support.contract import ASYNCIO_ONLY, INF, NAN, SLACK, Holder, Lock, Subject, is_lost
from support.leaks import assert_nothing_leaked, connections_made
from support.locks import (
    CALLBACK_KINDS,
    LossRecorder,
    cancel_once_the_key_exists,
    kinds,
    names,
    names_value,
    the_miss,
)
from support.servers import blocked_client_ids, user_without_channels
from support.timing import Answers, eventually, finish

from aiolock import (
    AcquireTimeout,
    LockError,
    LockEvent,
    LockLostError,
    LockNotOwnedError,
    Redlock,
    _checks,
    backoff,
)
from aiolock._checks import MAX_MS, MAX_SECONDS
from aiolock._multi_lease import MultiLease
from aiolock._rwlock import RWSide
from aiolock._server_lease import ServerLease
from aiolock._server_state import ENTRY_CAP
from aiolock._wire import MIN_ALLOWANCE
from aiolock.testing import FaultProxy, RedisServer

T = TypeVar("T")

# --- holding -------------------------------------------------------------------------------------


async def test_async_with_holds_the_lock_and_releases_it(subject: Subject) -> None:
    """`async with` returns the lock, holds its key on every server, and deletes it on exit.

    locked() says whether every permit is taken: a lock's one at once, a
    semaphore's once the others are taken elsewhere too.
    """
    lock = subject.make_lock()
    assert not await lock.locked()
    async with lock as entered:
        assert entered is lock
        assert await subject.held_everywhere(lock.key)
        assert await lock.locked() is (subject.limit == 1)
        assert await lock.owned()
        others = subject.make_holder(leave=1)
        assert await others.acquire()
        assert await lock.locked()
        await others.release()
    assert await subject.keys_left() == []
    assert not await lock.locked()
    assert not await lock.owned()


async def test_renewal_keeps_the_lock_past_its_ttl(subject: Subject) -> None:
    """Renewal keeps a ttl=0.3 lock 1.2 s: same token everywhere, owned, not lost, PTTL renewed."""
    lock = subject.make_lock(ttl=0.3)
    async with lock:
        tokens = await subject.holders(lock.key)
        assert () not in tokens
        assert len(set(tokens)) == 1
        held_until = time.monotonic() + 1.2
        lowest = 300
        while time.monotonic() < held_until:
            await asyncio.sleep(0.02)
            lowest = min(lowest, *await subject.leases(lock.key))
            assert await subject.holders(lock.key) == tokens, "the key changed hands while held"
        assert lowest > 0, f"the key ran out of lease while held (lowest PTTL {lowest} ms)"
        assert await lock.owned()
        assert not is_lost(lock)
        assert min(await subject.leases(lock.key)) > 150, "the lease was not refreshed near the end"
    assert await subject.keys_left() == []


async def test_extend_resets_the_lease_on_every_server(subject: Subject) -> None:
    """extend() sets the PTTL back to ttl, extend(ttl=5) to 5 s, on every server; returns True."""
    lock = subject.make_lock(ttl=1.0, auto_renew=False)
    async with lock:
        await subject.set_lease(lock.key, 200)
        assert await lock.extend() is True
        assert all(900 < pttl <= 1000 for pttl in await subject.leases(lock.key))
        assert await lock.extend(ttl=5.0) is True
        assert all(4000 < pttl <= 5000 for pttl in await subject.leases(lock.key))
        assert not is_lost(lock)


async def test_extend_takes_its_lease_by_keyword_only(subject: Subject) -> None:
    """extend(5.0) (redis-py's "add 5 s") and replace_ttl= are TypeErrors that say so; nothing sent.

    The holder's lease is left as it was, and the lock stays held.
    """
    lock = subject.make_lock(ttl=1.0, auto_renew=False)
    async with lock:
        await subject.set_lease(lock.key, 800)
        calls: list[Callable[[], Awaitable[bool]]] = [
            lambda: lock.extend(5.0),  # type: ignore[arg-type]
            lambda: lock.extend(additional_time=5.0),  # type: ignore[arg-type]
            lambda: lock.extend(5.0, replace_ttl=True),  # type: ignore[arg-type]
        ]
        for call in calls:
            with pytest.raises(TypeError, match=r"additional_time.*adds.*resets.*extend\(ttl="):
                await call()
        with pytest.raises(TypeError, match=r"replace_ttl.*always replaces.*extend\(ttl="):
            await lock.extend(ttl=5.0, replace_ttl=True)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="unexpected keyword argument 'seconds'"):
            await lock.extend(seconds=5.0)  # type: ignore[arg-type]
        assert all(0 < pttl <= 800 for pttl in await subject.leases(lock.key))
        assert not is_lost(lock)
        assert await lock.owned()


async def test_extend_sets_the_lease_later_renewals_ask_for(subject: Subject) -> None:
    """After extend(ttl=0.9) on a ttl=0.3 lock, renewals keep a 0.9 s lease, not 0.3 s."""
    lock = subject.make_lock(ttl=0.3)
    async with lock:
        assert await lock.extend(ttl=0.9)
        await asyncio.sleep(0.8)  # two renewals of the new lease (every 0.3 s)
        assert min(await subject.leases(lock.key)) > 400, "a renewal went back to 0.3 s"
        assert not is_lost(lock)


async def test_extend_of_a_lock_not_held_raises_and_makes_no_key(subject: Subject) -> None:
    """extend() of a never-held, released or lost lock raises LockNotOwnedError, makes no key."""
    lock = subject.make_lock(ttl=5.0)
    with pytest.raises(LockNotOwnedError):
        await lock.extend()
    assert await subject.keys_left() == []
    async with lock:
        pass
    with pytest.raises(LockNotOwnedError):
        await lock.extend()
    assert await subject.keys_left() == []
    assert await lock.acquire()
    await subject.take_away(lock.key, "PEXPIRE 1")
    await eventually(_none_left(subject), "the key to expire")
    with pytest.raises(LockLostError, match="no longer held by this holder"):
        await lock.extend()
    assert is_lost(lock)
    with pytest.raises(LockLostError):
        await lock.extend()
    assert await subject.keys_left() == [], "extend() recreated a lost key"
    with pytest.raises(LockLostError):
        await lock.release()


def _none_left(subject: Subject) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await subject.keys_left() == []

    return check


async def test_release_or_extend_when_never_held_raises_not_owned(subject: Subject) -> None:
    """release() and extend() of a lock never acquired raise LockNotOwnedError."""
    lock = subject.make_lock()
    with pytest.raises(LockNotOwnedError):
        await lock.release()
    with pytest.raises(LockNotOwnedError):
        await lock.extend()
    assert not await lock.owned()


async def test_a_user_without_channel_rights_takes_and_releases_without_error(
    subject: Subject,
) -> None:
    """Regression: a least-privilege user (no channel rights) locks and unlocks.

    The release announcement is refused to such a user on every server; a
    release that deleted the key must still return normally, and a waiter of
    that user must still get the lock (it polls).
    """
    async with user_without_channels(subject.admins) as (user, password):
        urls = [f"redis://{user}:{password}@{s.host}:{s.port}" for s in subject.servers]
        restricted = subject.connect(urls)
        lock = subject.make_lock(clients=restricted, ttl=2.0)
        async with lock:
            assert await subject.held_everywhere(lock.key)
        assert await subject.keys_left() == []
        holder = subject.make_holder(ttl=2.0)
        assert await holder.acquire()
        waiter = subject.make_lock(clients=restricted, ttl=2.0, backoff=backoff.constant(0.05))
        waiting = asyncio.ensure_future(waiter.acquire(timeout=5.0))
        await asyncio.sleep(0.2)
        await holder.release()
        assert await waiting
        await waiter.release()
        assert await subject.keys_left() == []


# --- timeouts ------------------------------------------------------------------------------------


async def test_acquire_timeout_returns_false_in_time(subject: Subject) -> None:
    """acquire(timeout=0.3) on a lock held elsewhere is False after 0.3 s, not much later."""
    holder = subject.make_holder(ttl=30.0)
    assert await holder.acquire()
    holder_tokens = await subject.holders(holder.key)
    lock = subject.make_lock()
    started = time.monotonic()
    acquired = await lock.acquire(timeout=0.3)
    elapsed = time.monotonic() - started
    assert acquired is False
    assert 0.3 <= elapsed < 0.4, f"acquire(timeout=0.3) took {elapsed:.3f} s"
    assert await subject.holders(holder.key) == holder_tokens
    await holder.release()


async def test_async_with_timeout_raises_acquire_timeout(subject: Subject) -> None:
    """async with a timeout raises AcquireTimeout (a TimeoutError and a LockError); body not run."""
    holder = subject.make_holder(ttl=30.0)
    assert await holder.acquire()
    holder_tokens = await subject.holders(holder.key)
    body_ran = False
    started = time.monotonic()
    with pytest.raises(TimeoutError) as caught:  # the builtin is enough to catch it
        async with subject.make_lock(timeout=0.1):
            body_ran = True
    elapsed = time.monotonic() - started
    assert type(caught.value) is AcquireTimeout
    assert isinstance(caught.value, LockError)
    assert 0.1 <= elapsed < 0.25, f"async with (timeout=0.1) took {elapsed:.3f} s"
    with pytest.raises(TimeoutError):
        async with subject.make_lock(blocking=False):
            body_ran = True
    assert not body_ran
    assert await holder.owned()
    assert await subject.holders(holder.key) == holder_tokens
    await holder.release()


# --- a slow link, a server that stops answering ---------------------------------------------------


async def slow_clients(
    subject: Subject, start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]], each_way: float
) -> tuple[list[FaultProxy], list[redis.Redis]]:
    """Fresh clients (never connected) reaching every server through a proxy of its own."""
    proxies = [await start_proxy(s) for s in subject.servers]
    for p in proxies:
        p.set_latency(each_way)
    return proxies, subject.connect([p.url for p in proxies])


@pytest.mark.parametrize("each_way", [0.05, 0.1])
async def test_a_free_lock_is_acquired_over_a_slow_link(
    subject: Subject,
    start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]],
    each_way: float,
) -> None:
    """Regression: 50 ms and 100 ms each way, a free lock is taken with no wait.

    Before, the attempt in flight was cut off 0.1 s past the deadline, so
    ``acquire(blocking=False)`` and ``acquire(timeout=0.05)`` on a lock that
    nobody held returned False ("held by someone") from a fresh client
    (whose first command also sets up its connection: about four round
    trips). Now the attempt is awaited as long as the link needs, and a
    lock that is held is still reported held, in about a round trip or two.
    """
    rtt = 2 * each_way
    for how in ({"blocking": False}, {"timeout": 0.05}):
        _, slow = await slow_clients(subject, start_proxy, each_way)
        lock = subject.make_lock(clients=slow, ttl=10.0, node_timeout=10 * rtt)
        started = time.monotonic()
        assert await lock.acquire(**how), f"a free lock was not acquired with {how}"
        took = time.monotonic() - started
        assert took >= rtt, f"took {took:.3f} s: the link was not slow"
        await lock.release()
    holder = subject.make_holder(ttl=10.0)
    assert await holder.acquire()
    for how in ({"blocking": False}, {"timeout": 0.05}):
        _, slow = await slow_clients(subject, start_proxy, each_way)
        lock = subject.make_lock(clients=slow, ttl=10.0, node_timeout=10 * rtt)
        assert await lock.acquire(**how) is False, f"a held lock was acquired with {how}"
        # Warm now: a held lock is answered in a round trip or two (the attempt and its PTTL).
        started = time.monotonic()
        assert await lock.acquire(**how) is False
        took = time.monotonic() - started
        assert took < 2 * rtt + SLACK, f"a held lock took {took:.3f} s to be reported with {how}"
    await holder.release()


#: How long past its deadline each fault lets an ``acquire()`` run, by primitive (ttl
#: 1 s), besides the link's allowance (:func:`link_allowance`): AsyncLock: one cleanup
#: budget of min(ttl, 1 s). Redlock (node_timeout ttl/3): the attempt in flight at the
#: deadline, then its cleanup, each within node_timeout.
NO_ANSWER_OVERRUN = {"AsyncLock": 1.0, "Redlock": 2 * 1.0 / 3}
NO_ANSWER_OVERRUN.update(dict.fromkeys(ASYNCIO_ONLY, NO_ANSWER_OVERRUN["AsyncLock"]))


def link_allowance(lock: Lock) -> float:
    """How long past its deadline ``lock`` awaits an attempt in flight (0 for Redlock).

    The wire's estimate from the round trips it saw: 0.1 s on a quiet
    loopback, more when the machine was loaded as the client connected (a
    client's first round trip includes its connection's set-up).
    """
    if isinstance(lock, Redlock):
        return 0.0  # its attempts are cut off at node_timeout instead
    lease = lock._lease
    assert isinstance(lease, ServerLease | MultiLease), lease
    wire = lease.wire
    return wire.allowance if wire.allowance is not None else MIN_ALLOWANCE


@pytest.mark.parametrize("fault", ["black hole", "SIGSTOP"])
async def test_a_server_that_stops_answering_mid_wait_is_told_within_the_bound(
    subject: Subject,
    start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]],
    fault: str,
) -> None:
    """Regression: no answer at the deadline is redis-py's TimeoutError, in time.

    The lock is held elsewhere; 0.2 s into ``acquire(timeout=1.0)`` the
    server(s) stop answering: every byte dropped by a proxy, or the server
    processes SIGSTOPped. Before, ``acquire(timeout=0.5)`` returned False
    ("held") after 2.6 s: the undo and the marker's removal each took the
    whole cleanup bound. Now the call's cleanup shares one budget, and the
    answer says that the server did not answer. (Found on the way: raising
    the waiting marker again during a long pause was not cut off, and held
    the call up for seconds.)
    """
    holder = subject.make_holder(ttl=30.0)
    assert await holder.acquire()
    if fault == "black hole":
        proxies, clients = await slow_clients(subject, start_proxy, 0.0)
    else:
        proxies, clients = [], subject.connect()
    # The wait to the deadline outlives the refresh period of the waiter's queue entry
    # (0.7 of min(ttl, 2 s)): it refreshes the entry into the silent server (that, too,
    # must not hold the call up).
    waiter = subject.make_lock(clients=clients, ttl=1.0, backoff=backoff.constant(5))
    assert await waiter.acquire(blocking=False) is False  # connected, the link measured
    stopped: list[RedisServer] = []
    try:
        started = time.monotonic()
        task = asyncio.ensure_future(waiter.acquire(timeout=1.0))
        await asyncio.sleep(0.2)
        if fault == "black hole":
            for p in proxies:
                p.black_hole()
        else:
            for srv in subject.servers:
                srv.pause()
                stopped.append(srv)
        allowance = link_allowance(waiter)  # no round trip is observed from here on
        faulted = time.monotonic() - started
        assert faulted < 0.8, f"the fault came late ({faulted:.3f} s)"
        assert not task.done()
        with pytest.raises(RedisTimeoutError, match="did not answer within"):
            await task
        took = time.monotonic() - started
        bound = 1.0 + allowance + NO_ANSWER_OVERRUN[subject.kind]
        assert 1.0 <= took <= bound + SLACK, (
            f"acquire(timeout=1.0) took {took:.3f} s (the link's allowance {allowance:.3f} s)"
        )
    finally:
        for srv in stopped:
            srv.resume()
    assert await holder.owned()
    await holder.release()
    # Whatever the stopped servers ran late, and the queue entry the call had no time to
    # take out, expire by themselves: within the entry's cap (a grant to it included).
    await eventually(_none_left(subject), "the waiter's keys to expire", timeout=ENTRY_CAP + SLACK)


# --- a waiter killed mid-backoff -----------------------------------------------------------------

#: A waiter in a process of its own: 30 s backoff steps; says "waiting" just before it waits.
DEAD_WAITER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import AsyncLock, MultiLock, ReadWriteLock, Redlock, Semaphore, backoff
async def main(kind, name, *urls):
    clients = [redis.Redis.from_url(u) for u in urls]
    if kind == "AsyncLock":
        lock = AsyncLock(clients[0], name, ttl=10.0, backoff=backoff.constant(30))
    elif kind.startswith("Semaphore"):
        limit = int(kind.removeprefix("Semaphore") or 1)
        lock = Semaphore(clients[0], name, limit, ttl=10.0, backoff=backoff.constant(30))
    elif kind in ("Reader", "Writer"):
        rw = ReadWriteLock(clients[0], name, ttl=10.0, backoff=backoff.constant(30))
        lock = rw.reader if kind == "Reader" else rw.writer
    elif kind == "MultiLock":
        names = [name, name + ":second"]
        lock = MultiLock(clients[0], names, ttl=10.0, backoff=backoff.constant(30))
    else:
        lock = Redlock(clients, name, ttl=10.0, node_timeout=1.0, backoff=backoff.constant(30))
    print("waiting", flush=True)
    await lock.acquire()
asyncio.run(main(*sys.argv[1:]))
"""


async def acquisitions_in(locks: list[Lock], seconds: float) -> int:
    """How many acquire/release cycles ``locks`` (one coroutine each) complete in ``seconds``.

    An attempt still unanswered as the window ends raises ``TimeoutError``
    (no verdict: a loaded machine answers late); its coroutine stops there,
    having completed what it counted.
    """
    done = 0
    end = time.monotonic() + seconds

    async def cycle(lock: Lock) -> None:
        nonlocal done
        while time.monotonic() < end:
            try:
                acquired = await lock.acquire(timeout=max(0.0, end - time.monotonic()))
            except RedisTimeoutError:
                if time.monotonic() < end:
                    raise  # (only an attempt past its deadline may go unanswered)
                return
            if acquired:
                await lock.release()
                done += 1

    await asyncio.gather(*(cycle(lock) for lock in locks))
    return done


async def test_a_waiter_killed_mid_backoff_delays_the_others_two_seconds_at_most(
    subject: Subject,
) -> None:
    """Regression: SIGKILL a waiter in a 30 s step; nothing of it outlives 2 s.

    The holder releases as the waiter dies. What the waiter left on the
    server (its queue entry, where the primitive has a queue) is gone within
    ``min(ttl, 2 s)`` + 1 s of the release, and then 10 coroutines of
    another process get at least half the acquisitions per second that 10
    coroutines get on a name the waiter never saw, measured in turns (in the
    best of up to eight pairs of 0.5 s windows: a loaded machine slows both
    alike). Before, its waiting marker lived for the whole step (30 s), and
    that process's local runs kept yielding to the dead waiter (1,934
    acquisitions/s fell to ~400).
    """
    workers = [subject.make_lock(ttl=10.0) for _ in range(10)]
    untouched = f"untouched:{os.urandom(8).hex()}"  # (not matched by the test's key pattern)
    control = [subject.make_lock(untouched, ttl=10.0) for _ in range(10)]
    baseline = await acquisitions_in(workers, 0.5)
    assert baseline > 0
    assert await acquisitions_in(control, 0.5) > 0
    # Every permit (a reader's: the writer), taken by this process.
    holder = Holder([subject.excluder(w) for w in workers[: subject.limit]])
    assert await holder.acquire()
    waiter = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DEAD_WAITER,
        subject.kind,
        subject.name,
        *(s.url for s in subject.servers),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert waiter.stdout is not None
        line = await asyncio.wait_for(waiter.stdout.readline(), 10)
        assert line == b"waiting\n"
        await asyncio.sleep(0.5)  # its first attempt failed; it is in its 30 s step
        if subject.queues:
            assert await subject.queued(workers[0]), "the waiter did not queue"
        waiter.kill()
        await waiter.wait()
    finally:
        if waiter.returncode is None:
            waiter.kill()
            await waiter.wait()
        await holder.release()
    released = time.monotonic()
    await eventually(_none_left(subject), "the dead waiter's keys to expire", timeout=3.0 + SLACK)
    assert time.monotonic() - released <= min(10.0, ENTRY_CAP) + 1.0
    # The dead waiter's effect was lasting (its marker lived 30 s): in one of up to eight
    # pairs of windows (8 s) the name must reach half of what the untouched name reaches
    # next to it, so that seconds of load on the machine are not taken for it.
    pairs: list[tuple[int, int]] = []
    while len(pairs) < 8 and not any(2 * mine >= theirs for mine, theirs in pairs):
        pairs.append((await acquisitions_in(workers, 0.5), await acquisitions_in(control, 0.5)))
    assert any(2 * mine >= theirs for mine, theirs in pairs), (
        f"(this name, an untouched name) in 0.5 s windows after the death: {pairs}; "
        f"{baseline} on this name before"
    )


# --- ownership inside a process ------------------------------------------------------------------


async def test_release_from_another_task_is_a_hand_off(subject: Subject) -> None:
    """release() from another task ends the current holding; `async with` then exits quietly."""
    lock = subject.make_lock()
    assert await lock.acquire()
    await asyncio.create_task(lock.release())
    assert await subject.keys_left() == []
    assert not await lock.locked()
    assert not await lock.owned()
    with pytest.raises(LockNotOwnedError):
        await lock.release()

    async with lock:
        assert await lock.owned()
        await asyncio.create_task(lock.release())
        assert not await lock.locked()
    assert await lock.acquire(timeout=0)  # the releasing task did end our holding
    await lock.release()


async def test_owned_and_extend_answer_for_the_holder_its_tasks_or_a_detached_holding(
    subject: Subject,
) -> None:
    """A task that is not the holder's: owned() False, extend() raises, lease untouched.

    "Not the holder's": neither the acquiring task nor a task it started (one
    that does not inherit its context). Once the acquiring task has ended,
    its holding is detached: owned() is True in every task, and any task's
    extend() extends it.
    """
    lock = subject.make_lock(ttl=1.0, auto_renew=False)

    def elsewhere(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task of a fresh context: not started by the holder."""
        return asyncio.create_task(coro, context=contextvars.Context())

    assert await lock.acquire()
    await subject.set_lease(lock.key, 800)
    assert not await elsewhere(lock.owned())
    with pytest.raises(LockNotOwnedError, match="not held by this task"):
        await elsewhere(lock.extend(ttl=5.0))
    assert all(0 < pttl <= 800 for pttl in await subject.leases(lock.key)), "lease touched"
    assert await lock.owned()
    assert await lock.extend() is True
    await lock.release()

    assert await asyncio.create_task(lock.acquire())  # the acquiring task ends at once
    assert await lock.owned()
    assert await elsewhere(lock.owned())
    await subject.set_lease(lock.key, 800)
    assert await elsewhere(lock.extend(ttl=5.0)) is True
    assert all(4000 < pttl <= 5000 for pttl in await subject.leases(lock.key))
    assert not is_lost(lock)
    await lock.release()  # from yet another task than the one that acquired
    assert await subject.keys_left() == []


async def test_reacquire_without_reentrant_raises_at_once(subject: Subject) -> None:
    """A task re-acquiring a non-reentrant lock it holds gets LockError at once, still holding."""
    lock = subject.make_lock()
    async with lock:
        started = time.monotonic()
        with anyio.fail_after(1), pytest.raises(LockError, match="already held"):
            await lock.acquire()
        with anyio.fail_after(1), pytest.raises(LockError):
            async with lock:
                pass
        assert time.monotonic() - started < 0.1
        assert await lock.owned()
    assert not await lock.locked()


async def test_reentrant_counts_depth(subject: Subject) -> None:
    """With reentrant=True a task re-enters; the key stays until the last release; others wait.

    A semaphore and a read-write lock refuse the option (each acquire() is a
    holding of its own): a TypeError naming it and the primitive, and nothing
    sent.
    """
    if subject.semaphore or subject.side:
        refuser = "ReadWriteLock" if subject.side else "Semaphore"
        with pytest.raises(TypeError, match=names("reentrant", refuser)):
            subject.make_lock(reentrant=True)
        await assert_nothing_sent(subject)
        return
    lock = subject.make_lock(reentrant=True)
    assert await lock.acquire()
    tokens = await subject.holders(lock.key)
    assert () not in tokens
    assert await lock.acquire()
    async with lock, lock:
        assert await subject.holders(lock.key) == tokens
    waiter = asyncio.create_task(lock.acquire())
    await lock.release()  # depth 2 -> 1
    assert await subject.holders(lock.key) == tokens
    assert await lock.owned()
    done, _ = await asyncio.wait({waiter}, timeout=0.2)
    assert not done, "another task got a lock still held re-entrantly"
    await lock.release()  # depth 1 -> 0: the lock goes to the waiter
    with anyio.fail_after(2):
        assert await waiter
    after = await subject.holders(lock.key)
    assert () not in after
    assert set(after).isdisjoint(tokens)
    await asyncio.create_task(lock.release())  # a hand-off ends the waiter's holding
    assert not await lock.locked()
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_tasks_sharing_one_object_are_served_in_arrival_order(subject: Subject) -> None:
    """Five tasks queued on one held lock object acquire it in the order they arrived."""
    if subject.kind == "Reader":
        # Readers share: the five tasks would hold the reader side alongside the first, not
        # queue behind it; and readers let in behind a writer come in together, in no order.
        pytest.skip("tasks of one reader object hold together: there is no turn to order")
    lock = subject.make_lock(backoff=backoff.exponential(base=0.001, factor=2.0, cap=0.02))
    order: list[int] = []

    async def take(i: int) -> None:
        async with lock:
            order.append(i)

    others = subject.make_holder(leave=1)  # a semaphore's other permits, held elsewhere
    assert await others.acquire()
    async with lock:
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(take(i)))
            await asyncio.sleep(0.01)
        assert order == []
    with anyio.fail_after(3):
        await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    await others.release()


# --- cancellation window 1: before the server ran the command ------------------------------------


@pytest.mark.parametrize("form", ["acquire", "async with"])
async def test_cancel_before_the_server_ran_the_acquire_leaves_no_key(
    subject: Subject, form: str
) -> None:
    """Cancelled while CLIENT PAUSE WRITE holds the acquire back: no key, now or later."""
    lock = subject.make_lock()
    for c in subject.process(0):
        await c.ping()  # the pool has a connection: the first command is not a connect
    entered = asyncio.Event()

    async def use_lock() -> None:
        if form == "acquire":
            await lock.acquire()
            entered.set()
        else:
            async with lock:
                entered.set()

    await subject.cancel_while_paused(use_lock())
    assert not entered.is_set()
    await subject.assert_absent_and_stays(lock.key)
    # The local queue is free again: the same object acquires at once.
    assert await lock.acquire(blocking=False)
    await lock.release()


# --- cancellation window 2: after the server ran the command, before the reply -------------------


async def test_cancel_after_the_server_ran_the_acquire_undoes_it(
    subject: Subject, start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]]
) -> None:
    """Cancelled after the servers granted the lock but before the reply: the key is undone."""
    proxies = [await start_proxy(s) for s in subject.servers]
    clients = subject.connect([p.url for p in proxies])
    lock = subject.make_lock(clients=clients)
    assert await lock.acquire()  # scripts loaded, a pooled connection through each proxy
    await lock.release()
    await cancel_once_the_key_exists(proxies, subject.admins, lock.key, lock.acquire())
    await subject.assert_absent_and_stays(lock.key)
    await assert_nothing_leaked(*clients)
    assert await lock.acquire(blocking=False)  # nothing stuck locally either
    await lock.release()


# --- a cancelled release still completes ---------------------------------------------------------


def start_cancellable(
    how: str, work: Callable[[], Awaitable[None]]
) -> tuple[asyncio.Task[None], list[Callable[[], None]]]:
    """Run ``work`` in a task under the cancellation ``how``; the list gets its trigger.

    ``Task.cancel`` makes the task raise CancelledError; ``asyncio.timeout``
    and ``anyio.move_on_after`` absorb their own cancellation.
    """
    trigger: list[Callable[[], None]] = []

    def cancel_task() -> None:
        task.cancel()

    async def run() -> None:
        if how == "Task.cancel":
            trigger.append(cancel_task)
            await work()
        elif how == "asyncio.timeout":

            async def in_timeout() -> None:
                async with asyncio.timeout(None) as timeout:
                    loop = asyncio.get_running_loop()
                    trigger.append(lambda: timeout.reschedule(loop.time()))
                    await work()

            with pytest.raises(TimeoutError):
                await in_timeout()
        else:
            with anyio.move_on_after(None) as scope:
                trigger.append(scope.cancel)
                await work()
            assert scope.cancelled_caught

    task = asyncio.create_task(run())
    return task, trigger


@pytest.mark.parametrize("how", ["Task.cancel", "asyncio.timeout", "anyio.move_on_after"])
@pytest.mark.parametrize("form", ["release()", "async with exit"])
async def test_cancelled_release_still_completes(
    subject: Subject, events: list[LockEvent], form: str, how: str
) -> None:
    """A release cancelled while the servers hold it back completes; one 'released' event."""
    lock = subject.make_lock(ttl=10.0)
    may_leave = asyncio.Event()

    async def hold_then_leave() -> None:
        async with lock:
            await may_leave.wait()

    async def release() -> None:
        await lock.release()  # from another task: a hand-off, allowed (as with asyncio.Lock)

    if form == "release()":
        assert await lock.acquire()
        await subject.pause()  # WRITE: the release is held back
        task, trigger = start_cancellable(how, release)
    else:
        task, trigger = start_cancellable(how, hold_then_leave)
        await subject.wait_until_held(lock.key)
        await subject.pause()
        may_leave.set()
    try:
        await subject.wait_until_paused()
        first = [await blocked_client_ids(a) for a in subject.admins]
        trigger[0]()
        if not subject.quorum:
            # Cancelling closed that connection, so the server dropped the held-back command
            # (measured: a paused command of a closed connection never runs). Only a release
            # sent again, on another connection, can still delete the key. (Redlock lets its
            # node calls finish within node_timeout instead.)

            async def sent_again() -> bool:
                now = await blocked_client_ids(subject.admins[0])
                return bool(now) and not now & first[0]

            await eventually(sent_again, "the cancelled release to be sent again", timeout=3.0)
        await subject.unpause()
        if how == "Task.cancel":
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await task
    finally:
        await subject.unpause()
        await finish(task)
    await subject.assert_absent_and_stays(lock.key)
    with pytest.raises(LockNotOwnedError):
        await lock.release()
    assert kinds(events, subject.shown) == ["acquired", "released"]


# --- loss ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["PEXPIRE 1", "DEL", "overwrite"])
@pytest.mark.parametrize("kind", CALLBACK_KINDS)
async def test_loss_is_reported_and_raised_on_exit(subject: Subject, kind: str, how: str) -> None:
    """A lease taken away: lost is set, on_lost runs to its end once, exit raises LockLostError."""
    losses = LossRecorder()
    lock = subject.make_lock(ttl=0.3, on_lost=losses.callback(kind))

    async def body() -> None:
        async with lock:
            await subject.take_away(lock.key, how)
            await losses.wait(timeout=2.0)
            assert is_lost(lock)
            assert not await lock.owned()

    with pytest.raises(LockLostError) as caught:
        await body()
    assert isinstance(caught.value, LockNotOwnedError)
    assert isinstance(caught.value, LockError)
    assert losses.locks == [lock]
    assert is_lost(lock)
    # another holder's key is never touched
    someone_else = ("someone else",) if how == "overwrite" else ()
    assert await subject.holders(lock.key) == [someone_else] * len(subject.servers)
    await subject.delete(lock.key)


async def test_cancel_on_lost_cancels_the_body_at_once(subject: Subject) -> None:
    """cancel_on_lost=True: the body awaiting after a loss is cancelled at once; LockLostError."""
    lock = subject.make_lock(ttl=0.3, cancel_on_lost=True)
    taken: list[float] = []
    finished: list[bool] = []

    async def body() -> None:
        async with lock:
            await subject.take_away(lock.key, "DEL")
            taken.append(time.monotonic())
            await asyncio.sleep(10)
            finished.append(True)

    started = time.monotonic()
    with pytest.raises(LockLostError):
        await body()
    after_loss = time.monotonic() - taken[0]
    assert finished == []
    assert after_loss < 0.3, f"the body ran {after_loss:.3f} s after the loss"
    assert time.monotonic() - started < 0.3 + SLACK
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0, "the loss left a cancellation behind"
    await asyncio.sleep(0)  # the test task itself is not cancelled
    assert is_lost(lock)


@pytest.mark.parametrize("await_loss", [True, False], ids=["loss-declared", "loss-at-exit"])
async def test_body_exception_wins_and_carries_the_loss_as_note(
    subject: Subject, await_loss: bool
) -> None:
    """The body's own exception propagates from a lost lock, with the loss attached as a note."""
    losses = LossRecorder()
    lock = subject.make_lock(ttl=0.3, on_lost=losses.function)

    async def body() -> None:
        async with lock:
            await subject.take_away(lock.key, "DEL")
            if await_loss:
                await losses.wait(timeout=1.0)
            raise ValueError("body failed")

    with pytest.raises(ValueError, match="body failed") as caught:
        await body()
    assert str(caught.value) == "body failed"
    notes: list[str] = getattr(caught.value, "__notes__", [])
    if await_loss:
        assert any("aiolock" in note and "lost" in note for note in notes), notes
    else:  # found by the release at exit: the note is its LockLostError's message
        said = f"aiolock: lock {subject.shown!r} was no longer held"
        assert any(note.startswith(said) for note in notes), notes
    assert is_lost(lock)


# --- the cap on one holding (max_hold) ------------------------------------------------------------


def contender(subject: Subject, lock: Lock) -> Lock:
    """What waits, in another "process", while ``lock`` holds: a reader's is a writer.

    Redlock's waiters poll (no messages across independent masters): this
    one every 20 ms, so that its own backoff does not hide when the lock came free.
    """
    options: dict[str, Any] = {"backoff": backoff.constant(0.02)} if subject.quorum else {}
    other = subject.make_lock(process=1, **options)
    if subject.kind == "Reader":
        assert isinstance(other, RWSide)
        return other.lock.writer
    return other


async def test_max_hold_frees_a_hung_holders_lock_within_the_cap_and_a_renewal(
    subject: Subject,
) -> None:
    """A holder that hangs with renewal on loses the lock at max_hold; a waiter elsewhere gets it.

    ttl=0.3, max_hold=0.6: renewals go on (the key outlives its first
    lease), the holding is declared lost at the cap (``lost``, ``on_lost``,
    a reason naming max_hold), and a waiter on other clients holds within
    the cap plus one renewal period (0.1 s) of the acquisition.
    """
    others = subject.make_holder(leave=1)  # a semaphore's other permits, held elsewhere
    assert await others.acquire()
    losses = LossRecorder()
    lock = subject.make_lock(ttl=0.3, max_hold=0.6, on_lost=losses.function)
    assert lock.max_hold == 0.6
    acquired = asyncio.Event()
    hang = asyncio.Event()  # never set

    async def hung_holder() -> None:
        async with lock:
            acquired.set()
            await hang.wait()

    holder = asyncio.create_task(hung_holder())
    await acquired.wait()
    started = time.monotonic()
    waiter = contender(subject, lock)
    try:
        with anyio.fail_after(3):
            assert await waiter.acquire(timeout=2.0)
        took = time.monotonic() - started
        assert took < 0.6 + 0.1 + SLACK, f"the waiter held {took:.3f} s after the acquisition"
        assert took > 0.45, f"the waiter held after {took:.3f} s: the lease was not renewed"
        lost_at = await losses.wait(timeout=1.0)
        assert lost_at - started < 0.6 + SLACK
        assert losses.locks == [lock]
        assert "max_hold" in loss_reason(lock)
        assert not holder.done(), "the hung body was not meant to be cancelled"
    finally:
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
    await waiter.release()
    await others.release()
    assert await subject.keys_left() == []


def loss_reason(lock: Lock) -> str:
    """The loss reason of the lock's latest holding (what the WARNING and the error say)."""
    holding = lock._last
    assert holding is not None
    return holding.loss_reason


async def test_max_hold_with_cancel_on_lost_cancels_the_body_and_raises(subject: Subject) -> None:
    """cancel_on_lost=True and max_hold=0.5: the body is cancelled at the cap; LockLostError."""
    lock = subject.make_lock(ttl=0.3, max_hold=0.5, cancel_on_lost=True)
    entered = time.monotonic()  # (set again as the body starts)

    async def body() -> None:
        nonlocal entered
        async with lock:
            entered = time.monotonic()
            await asyncio.sleep(10)

    # The cap counts from when the acquisition was sent: after `asked`, before `entered`
    # (on a loaded machine the reply may come a while after the send).
    asked = time.monotonic()
    with pytest.raises(LockLostError, match=r"max_hold=0\.5 s"):
        await body()
    done = time.monotonic()
    assert done - asked > 0.45, f"cancelled {done - asked:.3f} s after the acquisition was asked"
    assert done - entered < 0.5 + SLACK, f"the body was cancelled after {done - entered:.3f} s"
    await eventually(_none_left(subject), "the key freed at the cap")


async def test_renewal_and_extend_never_carry_the_lease_past_max_hold(subject: Subject) -> None:
    """No PTTL seen while held reaches past acquisition + max_hold; extend() is cut to it too."""
    lock = subject.make_lock(ttl=0.3, max_hold=0.7)

    async def watch_the_lease() -> None:
        async with lock:
            started = time.monotonic()
            while time.monotonic() - started < 0.9:
                before = time.monotonic()
                leases = await subject.leases(lock.key)
                if leases and min(leases) > 0:
                    end = before - started + max(leases) / 1000
                    assert end <= 0.7 + 0.05, f"a lease reached {end:.3f} s past the acquisition"
                await asyncio.sleep(0.02)

    with pytest.raises(LockLostError):
        await watch_the_lease()
    fixed = subject.make_lock(ttl=1.0, max_hold=1.5, auto_renew=False)
    async with fixed:
        started = time.monotonic()
        await asyncio.sleep(0.2)
        assert await fixed.extend(ttl=5.0) is True
        left = max(await subject.leases(fixed.key)) / 1000
        assert left <= 1.5 - (time.monotonic() - started) + 0.02, left
        assert left > 1.0, left
    assert await subject.keys_left() == []


# --- bad arguments -------------------------------------------------------------------------------


async def assert_nothing_sent(subject: Subject) -> None:
    """The failed call made no client connect and left no key of the test's name."""
    for clients in subject.client_sets:
        assert all(connections_made(c) == 0 for c in clients), "a bad argument made a connection"
    assert await subject.keys_left() == []


@pytest.mark.parametrize(
    ("bad_name", "error"),
    [("", ValueError), (42, TypeError), (5, TypeError), (b"x", TypeError), (None, TypeError)],
    ids=["empty", "int", "5", "bytes", "None"],
)
async def test_bad_name(subject: Subject, bad_name: object, error: type[Exception]) -> None:
    """An empty name is a ValueError; a name that is not a str is a TypeError; both name it."""
    with pytest.raises(error, match=names_value("name", bad_name)):
        subject.make_lock(bad_name)
    await assert_nothing_sent(subject)


class NegativeBackoff(backoff.Backoff):
    """A user policy whose delays are negative."""

    def delays(self) -> Iterator[float]:
        while True:
            yield -1


class LaterNanBackoff(backoff.Backoff):
    """A user policy that goes bad at its third delay."""

    def delays(self) -> Iterator[float]:
        yield 0.01
        yield 0.02
        while True:
            yield NAN


def _later_nan(attempt: int) -> float:
    return NAN if attempt >= 3 else 0.01 * attempt


def _returns_x(attempt: int) -> Any:
    return "x"


def _option_cases() -> Iterator[Any]:
    """(option, value, error, shown in the message) for the options every primitive takes."""
    for value, error in [
        (0, ValueError),
        (-1, ValueError),
        (-1.0, ValueError),
        (0.0, ValueError),
        (-0.5, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (-INF, ValueError),
        (0.0001, ValueError),
        ("10", TypeError),
        ("1", TypeError),
        (True, TypeError),
        (None, TypeError),
    ]:
        yield pytest.param("ttl", value, error, repr(value), id=f"ttl={value!r}")
    for value, error in [
        (-1, ValueError),
        (-0.001, ValueError),
        (-INF, ValueError),
        (NAN, ValueError),
        ("5", TypeError),
        ("x", TypeError),
        (True, TypeError),
    ]:
        yield pytest.param("timeout", value, error, repr(value), id=f"timeout={value!r}")
    for option in ["blocking", "auto_renew", "cancel_on_lost", "reentrant"]:
        for value in [1, 0, "yes", "y", None]:
            yield pytest.param(option, value, TypeError, repr(value), id=f"{option}={value!r}")
    for value in [42, 5, "fast", 0.5]:
        yield pytest.param("backoff", value, TypeError, repr(value), id=f"backoff={value!r}")
    for label, policy, error, shown in [
        ("lambda:-1.0", lambda n: -1.0, ValueError, "-1.0"),
        ("lambda:nan", lambda n: NAN, ValueError, "nan"),
        ("lambda:inf", lambda n: INF, ValueError, "inf"),
        ("returns-x", _returns_x, TypeError, "'x'"),
        ("from_callable:-1.0", backoff.from_callable(lambda n: -1.0), ValueError, "-1.0"),
        ("nan-at-3rd", _later_nan, ValueError, "nan"),
        ("subclass:-1", NegativeBackoff(), ValueError, "-1"),
        ("subclass:nan-at-3rd", LaterNanBackoff(), ValueError, "nan"),
    ]:
        yield pytest.param("backoff", policy, error, shown, id=f"backoff={label}")
    for value in [42, 5, "callback"]:
        yield pytest.param("on_lost", value, TypeError, repr(value), id=f"on_lost={value!r}")
    for value in [None, 3, 5, b"app:"]:
        yield pytest.param("prefix", value, TypeError, repr(value), id=f"prefix={value!r}")
    for value, error in [
        (0, ValueError),
        (-1, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (9.5, ValueError),  # below the default ttl (10 s): the first lease alone outlasts it
        ("20", TypeError),
        (True, TypeError),
    ]:
        yield pytest.param("max_hold", value, error, repr(value), id=f"max_hold={value!r}")


@pytest.mark.parametrize(("option", "value", "error", "shown"), list(_option_cases()))
async def test_bad_option_fails_at_construction(
    subject: Subject, option: str, value: object, error: type[Exception], shown: str
) -> None:
    """Each bad keyword option raises at construction, naming the option and the bad value.

    A semaphore and a read-write lock refuse ``reentrant`` whatever its
    value: a TypeError naming the option and the Semaphore (ReadWriteLock).
    """
    kwargs: dict[str, Any] = {option: value}
    if subject.semaphore and option == "reentrant":
        shown = "Semaphore"
    if subject.side and option == "reentrant":
        shown = "ReadWriteLock"
    with pytest.raises(error, match=names(option, shown)):
        subject.make_lock(**kwargs)
    await assert_nothing_sent(subject)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1, ValueError), (-0.5, ValueError), (NAN, ValueError), ("5", TypeError), (True, TypeError)],
    ids=["-1", "-0.5", "nan", "str", "True"],
)
async def test_acquire_rejects_a_bad_timeout_and_stays_usable(
    subject: Subject, timeout: object, error: type[Exception]
) -> None:
    """acquire(timeout=bad) raises naming timeout, sends nothing, and the lock still works."""
    lock = subject.make_lock()
    with pytest.raises(error, match=names_value("timeout", timeout)):
        await lock.acquire(timeout=timeout)  # type: ignore[arg-type]
    await assert_nothing_sent(subject)
    assert await lock.acquire(timeout=0) is True
    await lock.release()


@pytest.mark.parametrize("blocking", ["no", 1, 0.0])
async def test_acquire_rejects_a_non_bool_blocking(subject: Subject, blocking: object) -> None:
    """acquire(blocking=non-bool) is a TypeError naming blocking; nothing is sent."""
    lock = subject.make_lock()
    with pytest.raises(TypeError, match=names_value("blocking", blocking)):
        await lock.acquire(blocking=blocking)  # type: ignore[arg-type]
    await assert_nothing_sent(subject)
    assert await lock.acquire(blocking=False) is True
    await lock.release()


async def test_acquire_rejects_a_timeout_with_blocking_false(subject: Subject) -> None:
    """acquire(blocking=False, timeout=1) is a ValueError (documented), and nothing is sent."""
    lock = subject.make_lock()
    with pytest.raises(ValueError, match=r"(?s)(?=.*\btimeout\b)(?=.*\bblocking=False\b)"):
        await lock.acquire(blocking=False, timeout=1)
    await assert_nothing_sent(subject)
    assert not await lock.locked()


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (-1.0, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (0.0001, ValueError),
        ("10", TypeError),
        (True, TypeError),
    ],
    ids=["0", "-1", "-1.0", "nan", "inf", "0.0001", "str", "True"],
)
async def test_extend_rejects_a_bad_ttl_and_keeps_the_lease(
    subject: Subject, ttl: object, error: type[Exception]
) -> None:
    """extend(ttl=bad) raises naming ttl and its value; the holding and its lease are untouched."""
    lock = subject.make_lock(ttl=10.0)
    assert await lock.acquire()
    await subject.set_lease(lock.key, 7000)
    with pytest.raises(error, match=names_value("ttl", ttl)):
        await lock.extend(ttl=ttl)  # type: ignore[arg-type]
    for pttl in await subject.leases(lock.key):
        assert 5000 < pttl <= 7000, "a rejected extend changed the lease"
    assert not is_lost(lock)
    assert await lock.owned()
    await lock.release()


# --- durations the server can store --------------------------------------------------------------

#: The next float above the longest duration aiolock sends to the server.
ABOVE_MAX = math.nextafter(MAX_SECONDS, math.inf)


def names_the_limit(arg: str, value: object) -> str:
    """A ``match=`` pattern: names ``arg``, shows ``repr(value)`` and the limit in seconds."""
    return names_value(arg, value) + rf"(?=.*{re.escape(f'{MAX_SECONDS:g}')} s\b)"


async def test_the_longest_ttl_holds_on_the_server_and_a_longer_one_is_refused(
    subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ttl=MAX_SECONDS acquires, extends, releases; just above it fails at once.

    Taken with the warning about a ttl above a day, once per process: not again
    for the extend below.
    """
    for value in (ABOVE_MAX, 1e16):
        with pytest.raises(ValueError, match=names_the_limit("ttl", value)):
            subject.make_lock(ttl=value)
    await assert_nothing_sent(subject)
    monkeypatch.setattr(_checks, "_long_ttl_warned", False)
    with pytest.warns(UserWarning, match=r"^ttl=\d+ is in seconds"):
        lock = subject.make_lock(ttl=MAX_SECONDS)
    # timeout has no limit: it never reaches the server (any finite one is a deadline here).
    assert await lock.acquire(timeout=1e300)
    for pttl in await subject.leases(lock.key):
        assert MAX_MS - 60_000 < pttl <= MAX_MS, pttl
    with pytest.raises(ValueError, match=names_the_limit("ttl", ABOVE_MAX)):
        await lock.extend(ttl=ABOVE_MAX)
    await lock.extend(ttl=MAX_SECONDS)
    for pttl in await subject.leases(lock.key):
        assert MAX_MS - 60_000 < pttl <= MAX_MS, pttl
    assert await lock.owned()
    await lock.release()
    assert await subject.keys_left() == []


class TooLongLaterBackoff(backoff.Backoff):
    """A user policy that pauses longer than the server can keep at its third delay."""

    def delays(self) -> Iterator[float]:
        yield 0.01
        yield 0.02
        while True:
            yield ABOVE_MAX


@pytest.mark.parametrize(
    ("policy", "shown"),
    [
        (lambda attempt: 1e16, 1e16),
        (backoff.from_callable(lambda attempt: ABOVE_MAX), ABOVE_MAX),
        (TooLongLaterBackoff(), ABOVE_MAX),
    ],
    ids=["lambda:1e16", "from_callable:above", "subclass:above-at-3rd"],
)
async def test_a_backoff_pausing_longer_than_the_server_keeps_fails_at_construction(
    subject: Subject, policy: object, shown: float
) -> None:
    """A user backoff's delay above MAX_SECONDS is a ValueError naming the limit."""
    with pytest.raises(ValueError, match=names_the_limit("backoff", shown)):
        subject.make_lock(backoff=policy)
    await assert_nothing_sent(subject)


class TooLongAfterTheProbeBackoff(backoff.Backoff):
    """A user policy that passes the construction probe, then pauses too long."""

    def delays(self) -> Iterator[float]:
        yield from [0.01] * (backoff._PROBE + 2)
        while True:
            yield ABOVE_MAX


async def test_a_delay_too_long_after_the_probe_fails_the_acquire_that_draws_it(
    subject: Subject,
) -> None:
    """A delay above MAX_SECONDS drawn while waiting raises ValueError, cleanly."""
    holder = subject.make_holder()
    assert await holder.acquire()
    waiter = subject.make_lock(backoff=TooLongAfterTheProbeBackoff(), **subject.polling)
    try:
        with pytest.raises(ValueError, match=names_the_limit("backoff delay", ABOVE_MAX)):
            await waiter.acquire(timeout=2.0)
        assert set(await subject.keys_left()) == subject.holding_keys(holder.key)
    finally:
        await holder.release()
    assert await waiter.acquire(blocking=False)
    await waiter.release()


# --- observer events -----------------------------------------------------------------------------


async def test_an_uncontended_holding_is_acquired_then_released(
    subject: Subject, events: list[LockEvent]
) -> None:
    """acquire/release give 'acquired' (not contended, with the wait) and 'released' (held time)."""
    lock = subject.make_lock(ttl=5.0)
    async with lock:
        await asyncio.sleep(0.05)
    acquired, released = (e for e in events if e.name == subject.shown)
    assert acquired.kind == "acquired"
    assert acquired.lock is lock
    assert acquired.contended is False
    assert acquired.waited is not None
    assert 0 <= acquired.waited < 1.0
    assert acquired.held is None
    assert released.kind == "released"
    assert released.lock is lock
    assert released.held is not None
    assert 0.05 <= released.held < 2.0


async def test_renewals_by_the_watchdog_and_by_extend_are_reported(
    subject: Subject, events: list[LockEvent]
) -> None:
    """Each lease reset is a 'renewed' event: the watchdog's and an explicit extend()'s."""
    name = subject.shown
    lock = subject.make_lock(ttl=0.3)
    async with lock:
        await eventually(lambda: "renewed" in kinds(events, name), "a renewal")
        before = kinds(events, name).count("renewed")
        await lock.extend()
        assert kinds(events, name).count("renewed") == before + 1
    seen = [e for e in events if e.name == name]
    assert seen[0].kind == "acquired"
    assert seen[0].lock is lock
    assert seen[0].contended is False
    assert seen[-1].kind == "released"
    assert seen[-1].held is not None
    assert seen[-1].held >= 0.1
    assert set(kinds(events, name)) == {"acquired", "renewed", "released"}


@pytest.mark.parametrize("how", ["timeout", "blocking=False"])
async def test_not_acquiring_in_time_is_reported(
    subject: Subject, events: list[LockEvent], how: str
) -> None:
    """acquire() returning False gives one 'not_acquired' event with its wait, contended.

    (On a loaded machine an attempt's answer may come after the deadline and
    the link's allowance: then acquire() truly cannot say whether it was
    taken, and raises. That is accepted only when a server's answer to a
    ``PING`` meanwhile took 0.2 s or more too.)
    """
    holder = subject.make_holder(ttl=5.0)
    assert await holder.acquire()
    try:
        lock = subject.make_lock(ttl=5.0)
        async with Answers(*(s.url for s in subject.servers)) as answers:
            try:
                if how == "timeout":
                    assert not await lock.acquire(timeout=0.2)
                else:
                    assert not await lock.acquire(blocking=False)
            except RedisTimeoutError as exc:
                slowest = answers.slowest()
                if slowest < 0.2:
                    raise
                pytest.skip(f"a PING took {slowest:.3f} s meanwhile: {exc}")
    finally:
        await holder.release()
    miss = the_miss(events, lock)
    assert miss.contended is True
    assert miss.waited is not None
    if how == "timeout":
        assert 0.2 <= miss.waited < 1.0
    else:
        assert miss.waited < 0.5


async def test_a_cancelled_acquire_is_not_acquired_with_the_cancellation(
    subject: Subject, events: list[LockEvent]
) -> None:
    """asyncio.timeout around async with: one 'not_acquired' whose error is the cancellation.

    It says it was contended: an attempt found the holder within the 0.2 s
    (unless no attempt was answered in time, which a ``PING`` to the
    servers taking 0.1 s or more meanwhile shows: a loaded machine).
    """
    holder = subject.make_holder(ttl=5.0)
    assert await holder.acquire()
    lock = subject.make_lock(ttl=5.0)
    try:
        async with Answers(*(s.url for s in subject.servers)) as answers:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2), lock:
                    pass
    finally:
        await holder.release()
    miss = the_miss(events, lock)
    assert isinstance(miss.error, asyncio.CancelledError)
    assert miss.contended is True or answers.slowest() >= 0.1, (miss, answers.slowest())
    assert miss.waited is not None
    assert miss.waited >= 0.15


async def test_a_release_that_finds_the_key_gone_reports_a_loss_not_a_release(
    subject: Subject, events: list[LockEvent]
) -> None:
    """release() after the key was taken over: 'lost' (and LockLostError), no 'released'."""
    lock = subject.make_lock(ttl=5.0)
    assert await lock.acquire()
    await subject.take_away(lock.key, "overwrite")
    with pytest.raises(LockLostError):
        await lock.release()
    await subject.delete(lock.key)
    assert kinds(events, subject.shown) == ["acquired", "lost"]


async def test_every_acquire_reports_once_and_every_holding_ends_once(
    subject: Subject, events: list[LockEvent]
) -> None:
    """Mixed traffic with timeouts and a takeover: one outcome per call, one end per holding."""
    # Process 1 holds what excludes process 0's: the same lock, or a reader's writer (readers
    # alone never wait, so their mixed traffic has writers in it).
    locks = [subject.make_lock(process=p, ttl=0.5, timeout=0.05) for p in (0, 1)]
    locks[1] = subject.excluder(locks[1])
    calls = 0
    unanswered: list[str] = []

    async def worker(lock: Lock, rounds: int) -> None:
        nonlocal calls
        for _ in range(rounds):
            calls += 1
            try:
                got = await lock.acquire()
            except (RedisTimeoutError, RedisConnectionError) as exc:
                # A loaded machine: an attempt got no answer by the 0.05 s deadline plus
                # the link's allowance, or a new connection was still being made then
                # (nothing sent). Reported too (an outcome with its error).
                unanswered.append(str(exc))
                continue
            if got:
                await asyncio.sleep(0.01)
                with contextlib.suppress(LockLostError):
                    await lock.release()

    async def takeover() -> None:
        await asyncio.sleep(0.1)
        await subject.take_away(locks[0].key, "overwrite", lease_ms=50)

    # Six workers per permit: contention, so some calls time out.
    workers = 6 * subject.limit
    await asyncio.gather(*(worker(locks[i % 2], 15) for i in range(workers)), takeover())
    seen = [e for e in events if e.name == subject.shown]
    outcomes = [e for e in seen if e.kind in ("acquired", "not_acquired")]
    assert len(outcomes) == calls
    assert all(
        "did not answer within" in message or "no connection to the server within" in message
        for message in unanswered
    ), unanswered
    assert sum(1 for e in outcomes if e.error is not None) == len(unanswered)
    acquired = sum(1 for e in seen if e.kind == "acquired")
    ended = sum(1 for e in seen if e.kind in ("released", "lost"))
    assert acquired == ended
    assert any(e.kind == "not_acquired" for e in seen)
    await eventually(_none_left(subject), "the takeover's key to expire")
