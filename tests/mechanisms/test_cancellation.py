"""Cancellation safety (docs/design.md, Cancellation safety), proved against real servers.

The two windows of an acquire and of a release (*before the server ran the
command*, *after it ran, before the reply*) are proved once for every primitive
in ``test_contract.py``. Here: redis-py's own lock leaking in the second window,
every kind of cancellation while waiting, cancelled bodies, a randomized
cancellation storm (plus a hypothesis variant), and the CPython 3.11 gh-86296
pitfall, provoked for real.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio.lock import Lock as RedisPyLock
from support import timing
from support.leaks import assert_nothing_leaked, in_use_connections, listeners_gone, other_tasks
from support.locks import all_keys, cancel_once_the_key_exists, holds_on_server
from support.loops import LOOPS, run_on
from support.servers import assert_absent_and_stays
from support.timing import eventually

from aiolock import AsyncLock
from aiolock._keys import Keys
from aiolock.testing import FaultProxy, RedisServer

# --- helpers -------------------------------------------------------------------------------------


def asyncio_timeout(delay: float | None) -> AbstractAsyncContextManager[Any]:
    """``asyncio.timeout(delay)``, typed as a plain async context manager."""
    return asyncio.timeout(delay)


async def wait_for_other_task(known: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
    """Until a task not in ``known`` (and not the caller) is alive; return it."""
    found: list[asyncio.Task[Any]] = []

    async def new_task() -> bool:
        found[:] = await other_tasks() - known
        return bool(found)

    await eventually(new_task, "a new task (the renewal task)", timeout=3.0, every=0.002)
    return found[0]


# --- window 2: after the server ran the command, before the reply -------------------------------
#
# The two windows of AsyncLock and Redlock are proved in test_contract.py; here, the peer defect.


async def test_redis_py_lock_leaks_its_key_in_the_same_window(
    no_leaks: None, proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """The peer defect: redis-py's own Lock leaves its key behind when cancelled in window 2."""
    key = Keys(name, prefix="redispy:").lock
    token = uuid.uuid4().hex
    peer = RedisPyLock(proxied, key, timeout=5.0)
    await proxied.ping()  # a pooled connection through the proxy
    try:
        await cancel_once_the_key_exists([proxy], [admin], key, peer.acquire(token=token))
        assert await admin.get(key) == token, "redis-py's lock was expected to leak its key"
        await asyncio.sleep(0.05)
        assert await admin.get(key) == token
        assert 0 < await admin.pttl(key) <= 5000  # only the lease would ever free it
    finally:
        await admin.delete(key)
    await assert_nothing_leaked(proxied)


# --- every kind of cancellation, while waiting on another holder ----------------------------------


class _SiblingFailed(Exception):
    """Raised by a task-group sibling to make the group cancel the waiter."""


async def _by_asyncio_timeout(lock: AsyncLock, delay: float) -> None:
    async def acquire_in_time() -> None:
        async with asyncio_timeout(delay):
            await lock.acquire()
            pytest.fail("acquired a lock someone else holds")

    with pytest.raises(TimeoutError):
        await acquire_in_time()


async def _by_anyio_fail_after(lock: AsyncLock, delay: float) -> None:
    with pytest.raises(TimeoutError), anyio.fail_after(delay):
        async with lock:
            pytest.fail("acquired a lock someone else holds")


async def _by_anyio_move_on_after(lock: AsyncLock, delay: float) -> None:
    with anyio.move_on_after(delay) as scope:
        await lock.acquire()
        pytest.fail("acquired a lock someone else holds")
    assert scope.cancelled_caught


async def _by_anyio_task_group(lock: AsyncLock, delay: float) -> None:
    got: list[bool] = []

    async def waiter() -> None:
        got.append(await lock.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(delay)
        tg.cancel_scope.cancel()
    assert got == []


async def _by_asyncio_task_group(lock: AsyncLock, delay: float) -> None:
    got: list[bool] = []

    async def waiter() -> None:
        async with lock:
            got.append(True)

    async def sibling() -> None:
        await asyncio.sleep(delay)
        raise _SiblingFailed

    async def group() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(waiter())
            tg.create_task(sibling())

    with pytest.RaisesGroup(_SiblingFailed):  # only the sibling's error, no CancelledError
        await group()
    assert got == []


async def _by_task_cancel(lock: AsyncLock, delay: float) -> None:
    task = asyncio.create_task(lock.acquire())
    await asyncio.sleep(delay)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


_KINDS: dict[str, Callable[[AsyncLock, float], Awaitable[None]]] = {
    "asyncio.timeout": _by_asyncio_timeout,
    "anyio.fail_after": _by_anyio_fail_after,
    "anyio.move_on_after": _by_anyio_move_on_after,
    "anyio task group": _by_anyio_task_group,
    "asyncio.TaskGroup sibling": _by_asyncio_task_group,
    "Task.cancel": _by_task_cancel,
}


@pytest.mark.parametrize("kind", list(_KINDS))
async def test_every_kind_of_cancellation_while_waiting_leaks_nothing(
    no_leaks: None,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    kind: str,
) -> None:
    """Each cancellation kind at random points of a contended wait: no leak, holder intact."""
    holder = AsyncLock(other_client, name, ttl=30.0)
    assert await holder.acquire()
    holder_token = await admin.get(holder.key)
    waiter = AsyncLock(client, name)
    draw = timing.draw()
    rng = random.Random(draw)
    delays = [0.0, 0.0005, *(rng.uniform(0, 0.02) for _ in range(6))]
    for delay in delays:
        why = f"kind={kind} delay={delay:.4f} draw={draw}"
        await _KINDS[kind](waiter, delay)
        assert await admin.get(holder.key) == holder_token, why
        assert await admin.pttl(holder.key) > 25_000, why
        assert not await waiter.owned(), why
        await assert_nothing_leaked(client, other_client)
    await holder.release()
    # Nothing of the waiter is stuck in its local queue: it gets the lock at once.
    assert await waiter.acquire(timeout=1.0)
    await waiter.release()


# --- cancelled release, cancelled body -----------------------------------------------------------


async def _cancel_body_by_task_cancel(
    lock: AsyncLock, in_body: Callable[[Callable[[], None]], None]
) -> asyncio.Task[None]:
    def cancel() -> None:
        task.cancel()

    async def body() -> None:
        async with lock:
            in_body(cancel)
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    return task


async def _cancel_body_by_asyncio_timeout(
    lock: AsyncLock, in_body: Callable[[Callable[[], None]], None]
) -> asyncio.Task[None]:
    async def held_forever() -> None:
        async with asyncio_timeout(None) as timeout, lock:
            loop = asyncio.get_running_loop()
            in_body(lambda: timeout.reschedule(loop.time()))
            await asyncio.Event().wait()

    async def body() -> None:
        with pytest.raises(TimeoutError):
            await held_forever()

    return asyncio.create_task(body())


async def _cancel_body_by_anyio_scope(
    lock: AsyncLock, in_body: Callable[[Callable[[], None]], None]
) -> asyncio.Task[None]:
    async def body() -> None:
        with anyio.CancelScope() as scope:
            async with lock:
                in_body(scope.cancel)
                await anyio.sleep_forever()
        assert scope.cancelled_caught

    return asyncio.create_task(body())


_BODY_KINDS = {
    "Task.cancel": _cancel_body_by_task_cancel,
    "asyncio.timeout": _cancel_body_by_asyncio_timeout,
    "anyio cancel scope": _cancel_body_by_anyio_scope,
}


@pytest.mark.parametrize("kind", list(_BODY_KINDS))
async def test_cancelling_the_body_releases_the_lock(
    no_leaks: None, client: redis.Redis, admin: redis.Redis, name: str, kind: str
) -> None:
    """Cancelling the body of ``async with`` releases the lock and ends its renewal task."""
    lock = AsyncLock(client, name, ttl=0.3)  # renewal starts after ttl/3 = 0.1 s
    cancel_it: list[Callable[[], None]] = []
    task = await _BODY_KINDS[kind](lock, cancel_it.append)
    # The body first: a task of redis-py's alive while the SET is in flight (a loaded
    # machine makes that window long) must not be taken for the renewal task.
    await eventually(lambda: cancel_it, "the body is entered", timeout=3.0, every=0.002)
    renewal = await wait_for_other_task({task})
    assert cancel_it, "the body was not entered"
    assert await admin.exists(lock.key) == 1
    cancel_it[0]()
    if kind == "Task.cancel":
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        await task  # the scope or timeout absorbed its own cancellation
    assert renewal.done()
    await assert_absent_and_stays(admin, lock.key)
    await assert_nothing_leaked(client)


# --- a cancellation storm ------------------------------------------------------------------------


@dataclass
class _Storm:
    """What the workers of a storm observed."""

    active: int = 0
    most_active: int = 0
    held: int = 0
    acquire_cut: int = 0
    body_cut: int = 0
    errors: list[BaseException] = field(default_factory=list)

    def enter(self) -> None:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        self.held += 1

    def leave(self) -> None:
        self.active -= 1

    async def hold(self, seconds: float) -> None:
        """Be inside the critical section for ``seconds``."""
        self.enter()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.leave()


async def _storm_cycle(
    storm: _Storm, lock: AsyncLock, acquire_cut: float, body_cut: float, hold: float, form: str
) -> None:
    """One acquire/hold/release cycle with ``asyncio.timeout`` around acquire and body."""
    if form == "async with":  # one timeout around acquire, body and release
        try:
            async with asyncio_timeout(acquire_cut + body_cut), lock:
                await storm.hold(hold)
        except TimeoutError:
            storm.body_cut += 1
        return
    try:
        async with asyncio_timeout(acquire_cut):
            acquired = await lock.acquire()
    except TimeoutError:
        storm.acquire_cut += 1
        return
    assert acquired, "acquire without a timeout returned False"
    try:
        async with asyncio_timeout(body_cut):
            await storm.hold(hold)
    except TimeoutError:
        storm.body_cut += 1
    finally:
        await lock.release()


async def _run_storm(
    clients: list[redis.Redis],
    name: str,
    plans: list[list[tuple[float, float, float, str]]],
    shared_every: int = 2,
) -> _Storm:
    """Run one worker per plan (cycles of cut/cut/hold/form), over ``clients``."""
    storm = _Storm()
    shared = [AsyncLock(c, name) for c in clients]

    async def worker(index: int, plan: list[tuple[float, float, float, str]]) -> None:
        c = clients[index % len(clients)]
        # Some workers share one lock object per client (as a module-level lock), others own one.
        lock = shared[index % len(clients)] if index % shared_every == 0 else AsyncLock(c, name)
        try:
            for acquire_cut, body_cut, hold, form in plan:
                await _storm_cycle(storm, lock, acquire_cut, body_cut, hold, form)
        except Exception as exc:  # reported by the test, with the draw
            storm.errors.append(exc)

    async with anyio.create_task_group() as tg:
        for index, plan in enumerate(plans):
            tg.start_soon(worker, index, plan)
    return storm


def _storm_plans(
    rng: random.Random, workers: int, cycles: int
) -> list[list[tuple[float, float, float, str]]]:
    return [
        [
            (
                rng.uniform(0, 0.02),
                rng.uniform(0, 0.02),
                rng.uniform(0, 0.002),
                rng.choice(["acquire", "async with"]),
            )
            for _ in range(cycles)
        ]
        for _ in range(workers)
    ]


async def _assert_storm_clean(
    storm: _Storm, clients: list[redis.Redis], admin: redis.Redis, name: str, why: str
) -> None:
    assert storm.errors == [], f"{why}: workers failed: {storm.errors!r}"
    assert storm.most_active <= 1, f"{why}: {storm.most_active} holders at once"
    assert storm.active == 0, why
    assert await admin.keys(all_keys(name)) == [], f"{why}: a key was left behind"
    assert await other_tasks() == set(), f"{why}: a task outlived the storm"
    assert await listeners_gone(), f"{why}: a notification listener did not stop by itself"
    for c in clients:
        assert in_use_connections(c) == 0, f"{why}: a connection was left checked out"


async def test_cancellation_storm_keeps_mutual_exclusion_and_leaks_nothing(
    no_leaks: None, client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """60 tasks over 2 clients, random timeouts around acquire and body: no overlap, no leak."""
    draw = timing.draw()
    plans = _storm_plans(random.Random(draw), workers=60, cycles=15)
    started = time.monotonic()
    async with asyncio_timeout(10.0):
        storm = await _run_storm([client, other_client], name, plans)
    elapsed = time.monotonic() - started
    why = f"draw={draw} (replay with AIOLOCK_TEST_DRAW={draw}), {storm}"
    await _assert_storm_clean(storm, [client, other_client], admin, name, why)
    assert storm.held > 0, f"{why}: nobody ever held the lock: the storm proved nothing"
    assert storm.acquire_cut + storm.body_cut > 0, f"{why}: nothing was ever cancelled"
    assert elapsed < 3.0, f"{why}: the storm took {elapsed:.2f} s"


_cut = st.floats(min_value=0.0, max_value=0.02, allow_nan=False)
_cycle = st.tuples(_cut, _cut, st.floats(0.0, 0.002), st.sampled_from(["acquire", "async with"]))


@settings(max_examples=15, deadline=None, database=None)
@given(plans=st.lists(st.lists(_cycle, min_size=1, max_size=3), min_size=2, max_size=8))
def test_cancellation_storm_hypothesis(
    server: RedisServer, plans: list[list[tuple[float, float, float, str]]]
) -> None:
    """Hypothesis draws the cancel delays of a small storm: no overlap, no leak, both loops."""

    async def main() -> None:
        name = f"hypothesis_storm:{uuid.uuid4().hex[:8]}"
        clients = [redis.Redis.from_url(server.url) for _ in range(2)]
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            async with asyncio_timeout(5.0):
                storm = await _run_storm(clients, name, plans)
            await _assert_storm_clean(storm, clients, admin, name, f"plans={plans}, {storm}")
        finally:
            for c in (*clients, admin):
                await c.aclose()

    for factory in LOOPS.values():
        run_on(factory, main())


# --- the timeout bound --------------------------------------------------------------------------


# --- a swallowed cancellation is honoured (CPython gh-86296) ------------------------------------


async def _steps_until_done(work: Awaitable[Any]) -> int:
    """How many ``sleep(0)`` steps the caller takes until ``work`` (run as a task) is done."""
    task = asyncio.ensure_future(work)
    steps = 0
    while not task.done():
        await asyncio.sleep(0)
        steps += 1
    await task
    return steps


@dataclass
class _Outcome:
    """How a task that was cancelled after some loop steps ended."""

    accepted: bool  # Task.cancel() returned True: the task had not finished yet
    cancelled: bool  # the task raised CancelledError
    result: Any = None  # what it returned otherwise
    cancelling: int = 0  # Task.cancelling() once it ended (Python 3.11+)


async def _cancel_after_steps(work: Awaitable[Any], steps: int) -> _Outcome:
    """Run ``work`` as a task, cancel it after ``steps`` loop steps, say how it ended."""
    task = asyncio.ensure_future(work)
    for _ in range(steps):
        await asyncio.sleep(0)
    accepted = task.cancel()
    try:
        result = await task
    except asyncio.CancelledError:
        return _Outcome(accepted, cancelled=True)
    outcome = _Outcome(accepted, cancelled=False, result=result)
    outcome.cancelling = task.cancelling()
    return outcome


async def test_swallowed_cancellation_is_honoured(
    no_leaks: None, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """gh-86296: cancelled while the reply arrives, acquire raises CancelledError, never True."""
    # The pitfall is real on this stack: a plain redis-py call swallows the cancellation.
    probe = Keys(name, prefix="probe:").lock
    await client.set(probe, "x")
    span = await _steps_until_done(client.set(probe, "x")) + 4
    swallowed = 0
    for i in range(60):
        probed = await _cancel_after_steps(client.set(probe, "x"), i % span)
        if probed.accepted and not probed.cancelled:  # returned although cancelled
            swallowed += 1
    await client.delete(probe)
    if sys.version_info < (3, 12):
        assert swallowed > 0, "could not provoke gh-86296 with plain redis-py calls"

    lock = AsyncLock(client, name)
    assert await lock.acquire()  # warm up: the script is loaded, the pool has a connection
    await lock.release()
    span = await _steps_until_done(lock.acquire()) + 6
    await lock.release()
    outcomes: dict[str, int] = {}
    for i in range(200):
        got = await _cancel_after_steps(lock.acquire(), i % span)
        why = f"iteration {i}, cancelled after {i % span} steps (span {span}), {outcomes}"
        if got.cancelled:
            assert await admin.exists(lock.key) == 0, f"{why}: cancelled, but the key is left"
            outcome = "cancelled"
        else:
            assert not got.accepted, f"{why}: returned {got.result!r} although cancelled"
            assert got.cancelling == 0, f"{why}: returned with a cancellation pending"
            assert got.result is True, why
            assert await holds_on_server(lock), why
            await lock.release()  # a hand-off from the finished task
            outcome = "acquired before the cancel"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        await assert_nothing_leaked(client)
    assert outcomes.get("cancelled", 0) > 0, outcomes
