"""Cancellation safety (DESIGN.md §5 and §5b), proved against real servers.

The two windows of an acquire have deterministic tests: *before the server ran
the command* (``CLIENT PAUSE ... WRITE`` holds it back) and *after the server ran
it, before the reply* (a :class:`FaultProxy` holds the reply back). Then every
kind of cancellation, cancelled releases and bodies, a seeded cancellation storm
(plus a hypothesis variant), the timeout bound, and the CPython 3.11 gh-86296
pitfall, provoked for real.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from conftest import in_use_connections, listeners_gone, other_tasks
from faultproxy import FaultProxy
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio.lock import Lock as RedisPyLock

from aiolock import AcquireTimeout, AsyncLock, LockError
from aiolock.testing import RedisServer

_new_uvloop: Callable[[], asyncio.AbstractEventLoop] | None
try:
    from uvloop import new_event_loop as _new_uvloop
except ImportError:  # pragma: no cover - uvloop is a dev dependency
    _new_uvloop = None

# --- helpers -------------------------------------------------------------------------------------

#: How long a helper polls the server for a state before it gives up.
_POLL_LIMIT = 3.0
#: Between two polls of the server.
_POLL_EVERY = 0.002


def _seed() -> int:
    """A fresh seed, or the one in ``AIOLOCK_TEST_SEED`` to replay a failure."""
    given_seed = os.environ.get("AIOLOCK_TEST_SEED")
    return int(given_seed) if given_seed else random.randrange(2**32)


def asyncio_timeout(delay: float | None) -> AbstractAsyncContextManager[Any]:
    """``asyncio.timeout(delay)``, typed as a plain async context manager."""
    return asyncio.timeout(delay)


async def wait_until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` after a few seconds."""
    deadline = time.monotonic() + _POLL_LIMIT
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        await asyncio.sleep(_POLL_EVERY)


async def blocked_client_ids(admin: redis.Redis) -> set[str]:
    """The ids of the clients the server holds blocked (``CLIENT LIST`` flag ``b``)."""
    return {c["id"] for c in await admin.client_list() if "b" in c["flags"]}


async def wait_for_paused_client(admin: redis.Redis) -> None:
    """Until a client's command is held back by ``CLIENT PAUSE``.

    Measured on valkey 8.1: ``INFO clients`` shows ``blocked_clients: 1`` and
    ``paused_reason: client_pause`` (``CLIENT LIST`` shows the client with flag
    ``b`` and ``cmd=evalsha``).
    """

    async def paused_one() -> bool:
        info = await admin.info("clients")
        return int(info["blocked_clients"]) > 0 and info["paused_reason"] == "client_pause"

    await wait_until(paused_one, "a client blocked by CLIENT PAUSE")


async def wait_for_key(admin: redis.Redis, key: str) -> None:
    """Until ``key`` exists on the server."""

    async def exists() -> bool:
        return bool(await admin.exists(key))

    await wait_until(exists, f"the key {key!r} to appear")


async def assert_absent_and_stays(admin: redis.Redis, key: str) -> None:
    """``key`` does not exist, and still does not a moment later."""
    assert await admin.exists(key) == 0, f"{key!r} was left on the server"
    await asyncio.sleep(0.05)
    assert await admin.exists(key) == 0, f"{key!r} appeared after the cancellation"


async def wait_for_other_task(known: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
    """Until a task not in ``known`` (and not the caller) is alive; return it."""
    deadline = time.monotonic() + _POLL_LIMIT
    while True:
        extra = await other_tasks() - known
        if extra:
            return extra.pop()
        if time.monotonic() > deadline:
            pytest.fail("gave up waiting for a new task (the renewal task)")
        await asyncio.sleep(_POLL_EVERY)


async def assert_nothing_leaked(*clients: redis.Redis) -> None:
    """No task besides the caller, no connection checked out on any of ``clients``."""
    assert await other_tasks() == set(), "a task outlived its lock"
    for c in clients:
        assert in_use_connections(c) == 0, "a connection was left checked out"


async def finish(task: asyncio.Future[Any]) -> None:
    """Cleanup after a failed test: cancel ``task`` if it still runs, and await it."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def loop_factories() -> list[Callable[[], asyncio.AbstractEventLoop]]:
    """The event loops the suite runs on: asyncio's default, and uvloop."""
    factories: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
    if _new_uvloop is not None:
        factories.append(_new_uvloop)
    return factories


def run_on(
    factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]
) -> None:
    """Run ``main`` to completion on a fresh loop from ``factory``, then close the loop.

    Like ``asyncio.run``: tasks still running at the end (a notification
    listener in its linger) are cancelled before the loop closes.
    """
    loop = factory()
    try:
        loop.run_until_complete(main)
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@dataclass
class _OwnServer:
    """A private server of the test's own (to pause), with a lock client and an admin."""

    client: redis.Redis
    admin: redis.Redis


@pytest.fixture
async def own(private_server: Callable[..., RedisServer]) -> AsyncIterator[_OwnServer]:
    """A private server, so that pausing it cannot disturb anything else; checked after."""
    srv = private_server()
    client = redis.Redis.from_url(srv.url)
    admin = redis.Redis.from_url(srv.url, decode_responses=True)
    await client.ping()  # the pool has a connection: the first command is not a connect
    try:
        yield _OwnServer(client, admin)
        assert await admin.keys("*") == [], "a key was left on the server"
        await assert_nothing_leaked(client)
    finally:
        await client.aclose()
        await admin.aclose()


@pytest.fixture
async def proxy(server: RedisServer) -> AsyncIterator[FaultProxy]:
    """A fault-injecting TCP proxy in front of the session server."""
    p = await FaultProxy(server.host, server.port).start()
    yield p
    await p.aclose()


@pytest.fixture
async def proxied(proxy: FaultProxy) -> AsyncIterator[redis.Redis]:
    """A client that talks to the session server through ``proxy``."""
    c = redis.Redis.from_url(proxy.url)
    yield c
    await c.aclose()


# --- window 1: before the server ran the command ------------------------------------------------


@pytest.mark.parametrize("form", ["acquire", "async with"])
async def test_cancel_while_server_holds_the_set_back_leaves_no_key(
    own: _OwnServer, name: str, form: str
) -> None:
    """Cancelled while CLIENT PAUSE WRITE holds the acquire back: no key, now or later."""
    lock = AsyncLock(own.client, name)
    entered = asyncio.Event()

    async def use_lock() -> None:
        if form == "acquire":
            await lock.acquire()
            entered.set()
        else:
            async with lock:
                entered.set()

    await own.admin.client_pause(5000, all=False)  # WRITE: EVAL/EVALSHA are held back
    task = asyncio.create_task(use_lock())
    try:
        await wait_for_paused_client(own.admin)
        task.cancel()
        await own.admin.client_unpause()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await own.admin.client_unpause()
        await finish(task)
    assert not entered.is_set()

    async def none_blocked() -> bool:
        return not await blocked_client_ids(own.admin)

    await wait_until(none_blocked, "the paused command to be dropped or run")
    await assert_absent_and_stays(own.admin, lock.key)
    await assert_nothing_leaked(own.client)
    # The local queue is free again: the same object acquires at once.
    assert await lock.acquire(blocking=False)
    await lock.release()


# --- window 2: after the server ran the command, before the reply -------------------------------


async def _cancel_once_the_key_exists(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, key: str, acquire: Awaitable[Any]
) -> None:
    """Hold replies, run ``acquire`` until the server has the key, cancel it.

    The caller has used ``proxied`` once, so its pool has a connection (which
    the proxy then holds) and the server knows the lock's scripts.
    """
    assert proxy.connections > 0
    proxy.hold_replies()
    task = asyncio.ensure_future(acquire)
    try:
        await wait_for_key(admin, key)
        assert not task.done(), "the reply was not held back"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        proxy.release_replies()
        await finish(task)


async def test_cancel_after_server_ran_the_set_undoes_it(
    no_leaks: None, proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Cancelled after the server granted the lock but before the reply: the key is undone."""
    lock = AsyncLock(proxied, name)
    assert await lock.acquire()  # scripts loaded, a pooled connection through the proxy
    await lock.release()
    await _cancel_once_the_key_exists(proxy, proxied, admin, lock.key, lock.acquire())
    await assert_absent_and_stays(admin, lock.key)
    await assert_nothing_leaked(proxied)
    assert await lock.acquire(blocking=False)  # nothing stuck locally either
    await lock.release()


async def test_redis_py_lock_leaks_its_key_in_the_same_window(
    no_leaks: None, proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """The peer defect: redis-py's own Lock leaves its key behind when cancelled in window 2."""
    key = f"redispy:{{{name}}}"
    token = uuid.uuid4().hex
    peer = RedisPyLock(proxied, key, timeout=5.0)
    await proxied.ping()  # a pooled connection through the proxy
    try:
        await _cancel_once_the_key_exists(proxy, proxied, admin, key, peer.acquire(token=token))
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
    seed = _seed()
    rng = random.Random(seed)
    delays = [0.0, 0.0005, *(rng.uniform(0, 0.02) for _ in range(6))]
    for delay in delays:
        why = f"kind={kind} delay={delay:.4f} seed={seed}"
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


@pytest.mark.parametrize("form", ["release()", "async with exit"])
async def test_cancelled_release_still_completes(own: _OwnServer, name: str, form: str) -> None:
    """A release cancelled while the server holds it back is sent again and completes."""
    lock = AsyncLock(own.client, name)
    may_leave = asyncio.Event()

    async def hold_then_leave() -> None:
        async with lock:
            await may_leave.wait()

    if form == "release()":
        assert await lock.acquire()
        await own.admin.client_pause(5000, all=False)  # WRITE: the release script is held back
        task = asyncio.create_task(lock.release())  # a hand-off: allowed (DESIGN.md §6)
    else:
        task = asyncio.create_task(hold_then_leave())
        await wait_for_key(own.admin, lock.key)
        await own.admin.client_pause(5000, all=False)
        may_leave.set()
    try:
        await wait_for_paused_client(own.admin)
        first = await blocked_client_ids(own.admin)
        task.cancel()
        # Cancelling closed that connection, so the server dropped the held-back command
        # (measured: a paused command of a closed connection never runs). Only a release
        # sent again, on another connection, can still delete the key.

        async def sent_again() -> bool:
            now = await blocked_client_ids(own.admin)
            return bool(now) and not now & first

        await wait_until(sent_again, "the cancelled release to be sent again")
        await own.admin.client_unpause()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await own.admin.client_unpause()
        await finish(task)
    await assert_absent_and_stays(own.admin, lock.key)
    await assert_nothing_leaked(own.client)


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


async def _storm_cycle(
    storm: _Storm, lock: AsyncLock, acquire_cut: float, body_cut: float, hold: float, form: str
) -> None:
    """One acquire/hold/release cycle with ``asyncio.timeout`` around acquire and body."""
    if form == "async with":  # one timeout around acquire, body and release
        try:
            async with asyncio_timeout(acquire_cut + body_cut), lock:
                storm.enter()
                try:
                    await asyncio.sleep(hold)
                finally:
                    storm.leave()
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
            storm.enter()
            try:
                await asyncio.sleep(hold)
            finally:
                storm.leave()
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
        # Some workers share one lock object per client (DESIGN.md §6), others have their own.
        lock = shared[index % len(clients)] if index % shared_every == 0 else AsyncLock(c, name)
        try:
            for acquire_cut, body_cut, hold, form in plan:
                await _storm_cycle(storm, lock, acquire_cut, body_cut, hold, form)
        except Exception as exc:  # reported by the test, with the seed
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
    assert await admin.keys(f"*{{{name}}}*") == [], f"{why}: a key was left behind"
    assert await other_tasks() == set(), f"{why}: a task outlived the storm"
    assert await listeners_gone(), f"{why}: a notification listener did not stop by itself"
    for c in clients:
        assert in_use_connections(c) == 0, f"{why}: a connection was left checked out"


async def test_cancellation_storm_keeps_mutual_exclusion_and_leaks_nothing(
    no_leaks: None, client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """60 tasks over 2 clients, random timeouts around acquire and body: no overlap, no leak."""
    seed = _seed()
    plans = _storm_plans(random.Random(seed), workers=60, cycles=15)
    started = time.monotonic()
    async with asyncio_timeout(10.0):
        storm = await _run_storm([client, other_client], name, plans)
    elapsed = time.monotonic() - started
    why = f"seed={seed} (replay with AIOLOCK_TEST_SEED={seed}), {storm}"
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

    for factory in loop_factories():
        run_on(factory, main())


# --- the timeout bound --------------------------------------------------------------------------


async def test_acquire_timeout_is_kept(
    no_leaks: None,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """acquire(timeout=0.3) on a held lock returns False after 0.3 s and not much later."""
    holder = AsyncLock(other_client, name, ttl=30.0)
    assert await holder.acquire()
    holder_token = await admin.get(holder.key)
    lock = AsyncLock(client, name)
    started = time.monotonic()
    acquired = await lock.acquire(timeout=0.3)
    elapsed = time.monotonic() - started
    assert acquired is False
    assert 0.3 <= elapsed < 0.45, f"acquire(timeout=0.3) took {elapsed:.3f} s"
    assert await admin.get(holder.key) == holder_token
    await holder.release()


async def test_async_with_timeout_raises_acquire_timeout(
    no_leaks: None,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """async with a timeout raises AcquireTimeout, which is a TimeoutError and a LockError."""
    holder = AsyncLock(other_client, name, ttl=30.0)
    assert await holder.acquire()
    holder_token = await admin.get(holder.key)
    lock = AsyncLock(client, name, timeout=0.1)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:  # the builtin is enough to catch it
        async with lock:
            pytest.fail("entered a lock someone else holds")
    elapsed = time.monotonic() - started
    assert type(info.value) is AcquireTimeout
    assert isinstance(info.value, LockError)
    assert 0.1 <= elapsed < 0.25, f"async with (timeout=0.1) took {elapsed:.3f} s"
    assert await admin.get(holder.key) == holder_token
    await holder.release()


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
    probe = f"probe:{{{name}}}"
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
            assert await lock.owned(), why
            await lock.release()  # a hand-off from the finished task
            outcome = "acquired before the cancel"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        await assert_nothing_leaked(client)
    assert outcomes.get("cancelled", 0) > 0, outcomes
