"""Fault injection: real servers killed, paused and cut off while the lock is used.

Each test injects one fault into a workload on real servers and checks it with
three checkers, defined at the top of this file:

* :class:`MutualExclusion` counts the holders inside the critical section;
* :class:`Register` is a value that holders increment by read-modify-write
  with random pauses and no check at all; its lost updates are what a plain
  lock cannot prevent under pauses (Jepsen's lost-update check);
* :class:`FencedRegister` is the same value guarded by ``lock.fence``: it
  rejects an older holding once a newer one has touched it, and must lose no
  update under any fault.

The faults: a server SIGKILLed and restarted with empty data (during holds,
during waits); a server SIGSTOPped past the lease, then SIGCONTed; a holder
whose event loop is blocked past its lease (its own loop in a thread, like
another process); a holder whose network is black-holed; the pub/sub
connection reset while hundreds of coroutines wait. Cancellation storms are in
test_cancellation.py; single-holder loss timings are in test_renewal.py.

Lost updates of the plain register are allowed where README's "Guarantees and
their limits" allow them (pauses, data loss): the tests report them in their
assertion messages and on stdout (``pytest -s``), and force at least one
where that can be done deterministically, to show that the fence is what
saves the data.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support import timing
from support.leaks import in_use_connections, listeners_gone, other_tasks
from support.locks import all_keys, keys_of
from support.timing import Answers, Lateness, eventually

import aiolock
from aiolock import AsyncLock, LockError, LockLostError, backoff
from aiolock._keys import Keys
from aiolock._scripts import ACQUIRE, HANDOVER, RELEASE
from aiolock.testing import FaultProxy, RedisServer

T = TypeVar("T")

#: Scheduling slack for timing bounds: a loop running a dozen workers on 2 busy cores.
SLACK = 0.2
#: The random pause between the read and the write of a read-modify-write.
PAUSE = (0.001, 0.004)
#: How long a worker waits before it tries again after an error.
RETRY = 0.01
#: How many holdings a workload completes before a fault, and again after it.
PHASE = 15


def learning_bound(ttl: float) -> float:
    """How soon after a restart with empty data a holder must know that its lock is gone.

    One renewal period (ttl/3), plus one retry (ttl/10): the first command on
    a pooled connection to the dead server fails (redis-py finds out that the
    connection is closed only by using it), and the watchdog retries it.
    """
    return ttl / 3 + ttl / 10 + SLACK


async def connect_time(url: str) -> float:
    """How long a new connection to ``url`` takes to answer a ``PING`` now (seconds).

    A holder learns of a restart on a new connection: on a loaded machine
    that connection takes longer than the slack of :func:`learning_bound`,
    and a bound measured on the spot adds it.
    """
    client = redis.Redis.from_url(url)
    try:
        started = time.monotonic()
        await client.ping()
        return time.monotonic() - started
    finally:
        await client.aclose()


# --- checkers ------------------------------------------------------------------------------------


class MutualExclusion:
    """Counts the holders inside the critical section; thread-safe.

    ``overlaps`` counts entries that found another holder inside, ``pairs``
    says who (the newcomer, then who was inside), ``most`` is the largest
    number inside at once, and :attr:`overlap_span` how long holders overlapped.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._inside: list[object] = []
        self.most = 0
        self.entries = 0
        self.overlaps = 0
        self.pairs: list[tuple[object, object]] = []
        self._first_overlap: float | None = None
        self._last_overlap: float | None = None

    @property
    def inside(self) -> int:
        """How many holders are inside now."""
        with self._guard:
            return len(self._inside)

    @contextlib.contextmanager
    def held(self, who: object) -> Iterator[None]:
        """Be inside the critical section for the ``with`` block, as ``who``."""
        with self._guard:
            self.pairs.extend((who, other) for other in self._inside)
            self._inside.append(who)
            self.entries += 1
            self.most = max(self.most, len(self._inside))
            if len(self._inside) > 1:
                self.overlaps += 1
                if self._first_overlap is None:
                    self._first_overlap = time.monotonic()
        try:
            yield
        finally:
            with self._guard:
                if len(self._inside) > 1:
                    self._last_overlap = time.monotonic()
                self._inside.remove(who)

    @property
    def overlap_span(self) -> float:
        """Seconds from the first moment two holders were inside to the last (0 if never).

        One fault makes one such stretch: how long the stale holder stayed in
        after another got in.
        """
        with self._guard:
            if self._first_overlap is None or self._last_overlap is None:
                return 0.0
            return self._last_overlap - self._first_overlap


class Register:
    """An integer that holders increment by read-modify-write, with no check at all.

    This is the resource a plain lock protects. Every write is meant as "the
    value read, plus one", so ``lost`` (writes minus the value) counts the
    increments that another writer overwrote: the lost updates. Thread-safe.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.value = 0
        self.writes = 0

    def read(self) -> int:
        """The current value."""
        with self._changed:
            return self.value

    def write(self, value: int) -> None:
        """Store ``value`` (meant as a value read, plus one)."""
        with self._changed:
            self.value = value
            self.writes += 1
            self._changed.notify_all()

    def wait_for_writes(self, count: int, timeout: float = 5.0) -> bool:
        """Block the calling thread until ``count`` writes were made; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self.writes >= count, timeout)

    @property
    def lost(self) -> int:
        """How many increments were overwritten."""
        with self._changed:
            return self.writes - self.value


class StaleFence(Exception):
    """An operation came with a fence lower than one the resource has already seen."""


class FencedRegister:
    """The same register, guarded by fencing tokens (``lock.fence``); thread-safe.

    It remembers the highest fence it has seen, on reads and writes alike, and
    rejects an operation with a lower one. A holding reads and writes with its
    own fence (an equal fence is the same holding, as fences are unique per
    acquisition), so its write is accepted only if no newer holding (higher
    fence) has touched the value since; an older holding can do nothing once
    a newer one has. With fences that strictly increase per acquisition this
    loses no update, whatever the lock does: ``lost`` must stay 0.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self.value = 0
        self.highest = 0
        self.accepted = 0
        self.accepted_fences: list[int] = []
        self.rejected = 0

    def _admit(self, fence: int) -> None:
        if fence < self.highest:
            self.rejected += 1
            raise StaleFence(f"fence {fence} is older than {self.highest}")
        self.highest = fence

    def read(self, fence: int) -> int:
        """The current value, for the holding with ``fence``.

        Raises:
            StaleFence: a newer holding has touched the value.
        """
        with self._guard:
            self._admit(fence)
            return self.value

    def write(self, fence: int, value: int) -> None:
        """Store ``value`` for the holding with ``fence``.

        Raises:
            StaleFence: a newer holding has touched the value.
        """
        with self._guard:
            self._admit(fence)
            self.value = value
            self.accepted += 1
            self.accepted_fences.append(fence)

    @property
    def lost(self) -> int:
        """How many accepted increments were overwritten (must be 0)."""
        with self._guard:
            return self.accepted - self.value


def fence_of(lock: AsyncLock) -> int:
    """``lock.fence`` of a lock made with ``fencing=True`` and held by the caller."""
    fence = lock.fence
    assert fence is not None, "a fenced lock without a fence"
    return fence


def foreign_errors(errors: list[BaseException]) -> list[BaseException]:
    """The errors that are neither redis-py's nor aiolock's, or that have no message."""
    return [e for e in errors if not isinstance(e, RedisError | LockError) or not str(e).strip()]


@dataclass
class Workload:
    """Holders doing read-modify-write cycles on both registers, and what they saw.

    Attributes:
        holdings: completed entries into the body of ``async with``.
        lost_at_exit: exits that raised :class:`LockLostError`.
        losses: ``(lock, time.monotonic())`` each time ``on_lost`` ran.
        errors: every exception that reached a worker (losses included).
    """

    rng: random.Random
    mutex: MutualExclusion = field(default_factory=MutualExclusion)
    plain: Register = field(default_factory=Register)
    fenced: FencedRegister = field(default_factory=FencedRegister)
    holdings: int = 0
    lost_at_exit: int = 0
    losses: list[tuple[AsyncLock, float]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stopping: bool = False
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def on_lost(self, lock: AsyncLock) -> None:
        """The ``on_lost`` callback of every lock of the workload."""
        self.losses.append((lock, time.monotonic()))

    async def cycle(self, lock: AsyncLock, pause: float | None = None) -> None:
        """One read-modify-write of both registers, with a random pause in between."""
        fence = fence_of(lock)
        value = self.plain.read()
        try:
            seen: int | None = self.fenced.read(fence)
        except StaleFence:
            seen = None
        await asyncio.sleep(self.rng.uniform(*PAUSE) if pause is None else pause)
        self.plain.write(value + 1)
        if seen is not None:
            with contextlib.suppress(StaleFence):
                self.fenced.write(fence, seen + 1)

    async def hold(self, lock: AsyncLock, body: Callable[[], Awaitable[None]]) -> bool:
        """``async with lock: await body()``; record what happens; True if it went well.

        The body is the critical section that :attr:`mutex` watches.
        """
        try:
            async with lock:
                self.holdings += 1
                with self.mutex.held(lock):
                    await body()
        except LockLostError as exc:
            self.lost_at_exit += 1
            self.errors.append(exc)
        except Exception as exc:
            self.errors.append(exc)
            await asyncio.sleep(RETRY)
        else:
            return True
        return False

    async def work(self, lock: AsyncLock) -> None:
        """Cycle until stopped; wait while :attr:`gate` is closed (cleared)."""
        while not self.stopping:
            await self.gate.wait()
            await self.hold(lock, lambda: self.cycle(lock))

    async def let_in(
        self, lock: AsyncLock, body: Callable[[], Awaitable[None]]
    ) -> asyncio.Task[bool]:
        """Start ``hold(lock, body)`` and return its task once it holds.

        Between processes waiters are not served in order, so a newcomer could
        wait long for a busy lock: the workers pause at their next acquisition
        until it is in, then go on (and wait for it).
        """
        entered = asyncio.Event()

        async def enter_then_body() -> None:
            entered.set()
            await body()

        self.gate.clear()
        holder = asyncio.create_task(self.hold(lock, enter_then_body))
        try:
            await asyncio.wait_for(entered.wait(), 5.0)
        except BaseException:
            await cancel_all([holder])
            raise
        finally:
            self.gate.set()
        return holder

    async def cycle_until_cancelled(self, lock: AsyncLock) -> None:
        """Cycle without end in one holding: a long holder (use ``cancel_on_lost``)."""
        while True:
            await self.cycle(lock)

    async def reach(self, holdings: int, timeout: float = 5.0) -> None:
        """Wait until the workload has completed ``holdings`` entries."""
        await eventually(lambda: self.holdings >= holdings, f"{holdings} holdings", timeout)

    def figures(self) -> str:
        """The checkers' counts, for assertion messages and the report."""
        mutex = self.mutex
        kinds = sorted({type(e).__name__ for e in self.errors})
        return (
            f"holdings={self.holdings} lost-updates plain={self.plain.lost} "
            f"fenced={self.fenced.lost} (fenced accepted={self.fenced.accepted} "
            f"rejected={self.fenced.rejected}) overlaps={mutex.overlaps} most={mutex.most} "
            f"overlap-span={mutex.overlap_span * 1000:.1f}ms losses={len(self.losses)} "
            f"lost-at-exit={self.lost_at_exit} errors={len(self.errors)} {kinds}"
        )


def report(what: str, workload: Workload) -> str:
    """Print the figures of ``workload`` (seen with ``pytest -s``) and return them."""
    line = f"{what}: {workload.figures()}"
    print(f"\n[faults] {line}")
    return line


# --- helpers -------------------------------------------------------------------------------------


def fence_key(lock: AsyncLock) -> str:
    """The fencing counter of ``lock`` (the one key a released fenced lock leaves)."""
    return keys_of(lock).fence


async def fences_ran_a_while(admin: redis.Redis, lock: AsyncLock) -> None:
    """Start the fencing counter of ``lock`` high, as on a server that has run a while.

    Higher than any number of acquisitions a test makes: if fences went back
    after a restart (the counter dies with the server), the new holders'
    fences could not catch up with the stale holder's within the test, and
    the fenced register would reject every one of them.
    """
    await admin.set(fence_key(lock), 10**12)


async def stop_all(workload: Workload, tasks: list[asyncio.Task[None]], timeout: float) -> None:
    """Stop the workers and wait for them; cancel (and fail) if they do not stop in time."""
    workload.stopping = True
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert not pending, f"{len(pending)} workers did not stop within {timeout} s"
    for task in done:
        task.result()  # a worker that crashed fails the test


async def ends_within(task: asyncio.Future[Any], bound: float, what: str) -> None:
    """``task`` ends within ``bound`` seconds, and whatever it raised is ours or redis-py's."""
    done, _ = await asyncio.wait({task}, timeout=bound)
    assert done, f"still {what} {bound:.1f} s later"
    error = task.exception()
    assert error is None or foreign_errors([error]) == [], repr(error)


async def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cleanup after a failed test: cancel what still runs and wait for it."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def assert_clean(admin: redis.Redis, pattern: str, *clients: redis.Redis) -> None:
    """No task besides the caller, no listener, no connection checked out, no key."""
    assert await other_tasks() == set(), "a task outlived the test"
    assert await listeners_gone(), "a release-notification listener did not stop by itself"
    for c in clients:
        assert in_use_connections(c) == 0, "a connection was left checked out"
    assert await admin.keys(pattern) == [], "a key was left on the server"


@dataclass
class Scene:
    """A private server under a random workload: three clients ("processes"), an admin, a name."""

    server: RedisServer
    clients: list[redis.Redis]
    admin: redis.Redis
    name: str
    draw: int
    work: Workload

    def new_lock(self, c: redis.Redis, ttl: float, **options: Any) -> AsyncLock:
        """A fenced lock of the workload, cancelled at its loss, which the workload records."""
        return AsyncLock(
            c,
            self.name,
            ttl=ttl,
            timeout=5.0,
            fencing=True,
            cancel_on_lost=True,
            on_lost=self.work.on_lost,
            **options,
        )

    def verdict(self, what: str, lost: AsyncLock) -> str:
        """Report the figures; only ``lost`` was lost, and every error is ours or redis-py's."""
        figures = report(f"{what} (draw {self.draw})", self.work)
        assert foreign_errors(self.work.errors) == [], figures
        assert [lock for lock, _ in self.work.losses] == [lost], figures
        return figures

    async def assert_clean(self, fenced: AsyncLock) -> None:
        """Drop the fencing counter (meant to stay); then nothing at all is left."""
        await self.admin.delete(fence_key(fenced))
        await assert_clean(self.admin, all_keys(self.name), *self.clients)


@pytest.fixture
async def scene(private_server: Callable[..., RedisServer], name: str) -> AsyncIterator[Scene]:
    """A private server (resumed after the test if paused) under a randomized workload."""
    srv = private_server()
    clients = [redis.Redis.from_url(srv.url) for _ in range(3)]
    admin = redis.Redis.from_url(srv.url, decode_responses=True)
    draw = timing.draw()
    try:
        yield Scene(srv, clients, admin, name, draw, Workload(random.Random(draw)))
    finally:
        if srv.paused:
            srv.resume()
        for c in (*clients, admin):
            await c.aclose()


async def through_a_fault(
    scene: Scene,
    long_lock: AsyncLock,
    fault: Callable[[], Awaitable[None]],
    after_loss: Callable[[], None] = lambda: None,
) -> None:
    """Nine workers run a phase; ``long_lock`` gets in and holds on; ``fault`` strikes.

    The long holder's exit must report the loss within twice its lease; then
    ``after_loss`` runs, the workers run one more phase, and they stop.
    """
    work = scene.work
    workers = [
        asyncio.create_task(work.work(scene.new_lock(c, long_lock.ttl)))
        for c in scene.clients
        for _ in range(3)
    ]
    long_holder: asyncio.Task[bool] | None = None
    try:
        await work.reach(PHASE)
        long_holder = await work.let_in(long_lock, lambda: work.cycle_until_cancelled(long_lock))
        await fault()
        assert not await asyncio.wait_for(long_holder, 2 * long_lock.ttl), (
            "the long holder's exit did not report the loss"
        )
        after_loss()
        await work.reach(work.holdings + PHASE)
        await stop_all(work, workers, timeout=5.0)
    finally:
        await cancel_all([*workers, *([long_holder] if long_holder else [])])


class LoopThread:
    """An event loop of its own in a thread: another "process" whose loop a test can block.

    The loop is of the same kind as the test's (asyncio or uvloop). Blocking
    it (``time.sleep``, a ``threading.Event`` wait) stops its holders, not the
    test's loop. Coroutines run there must make and close their own clients.
    """

    def __init__(self) -> None:
        self._loop = type(asyncio.get_running_loop())()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faults-other-loop")
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the thread's loop and wait for its result from the caller's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def close(self) -> None:
        """Stop and close the thread's loop."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        assert not self._thread.is_alive(), "the other loop's thread did not stop"
        self._loop.close()


async def thread_event(event: threading.Event, timeout: float = 5.0) -> None:
    """Wait for a ``threading.Event`` without blocking the caller's loop."""
    assert await asyncio.to_thread(event.wait, timeout), "the other loop did not get there"


# --- 1. SIGKILL and restart with empty data, during holds ---------------------------------------


async def test_restart_while_holding_breaks_exclusion_for_one_renewal_period_at_most(
    scene: Scene,
) -> None:
    """SIGKILL and restart (empty data) under a holder: it learns of the loss within one renewal.

    After a server restart the holder learns of the loss from the server,
    at its first renewal after the restart or at that renewal's one retry
    (a pooled connection to the dead server fails once): at most one failed
    renewal after the restart, and the loss is "the key was gone", not a
    lease run out. On an idle machine that is within one renewal period
    (ttl/3, plus one retry of ttl/10: see :func:`learning_bound`); on a
    loaded one the same two renewals take longer, so the time is bounded by
    the holder's own lease, the loop's measured lateness and a new
    connection's time added. With ``cancel_on_lost=True`` its body is gone
    by then. The restarted server hands the lock to another holder at once,
    so two holders overlap, but no longer than the holder took to learn.
    The fenced register loses no update (the plain one does, and the count
    is reported), and it goes on accepting the holders after the restart:
    their fences are still higher than the stale holder's, although the
    counter died with the server. The workload goes on after the restart;
    every error that reaches a caller is redis-py's or aiolock's, with a
    message; no key, task or connection leaks.
    """
    ttl = 0.9
    srv, admin, work = scene.server, scene.admin, scene.work
    long_lock = scene.new_lock(scene.clients[0], ttl)
    await fences_ran_a_while(admin, long_lock)
    restarted: list[float] = []
    connecting: list[float] = []  # how long a new connection took then
    accepted: list[int] = []  # from here on, only holders after the restart

    async def restart() -> None:
        await asyncio.to_thread(srv.restart)
        restarted.append(time.monotonic())
        await admin.connection_pool.disconnect()  # its connection died with the old server
        connecting.append(await connect_time(srv.url))

    seen: list[tuple[str, float, str]] = []  # the long lock's renewals and loss

    def observe(event: aiolock.LockEvent) -> None:
        if event.lock is long_lock and event.kind in ("renewed", "renewal_failed", "lost"):
            seen.append((event.kind, time.monotonic(), event.reason or str(event.error or "")))

    aiolock.add_observer(observe)
    try:
        async with Lateness() as late:
            await through_a_fault(
                scene, long_lock, restart, after_loss=lambda: accepted.append(work.fenced.accepted)
            )
    finally:
        aiolock.remove_observer(observe)
    figures = scene.verdict("restart while holding", long_lock)
    learned = work.losses[0][1] - restarted[0]
    after = [
        (kind, round(at - restarted[0], 3), why) for kind, at, why in seen if at >= restarted[0]
    ]
    story = f"after the restart: {after}; {figures}"
    assert [kind for kind, _, _ in after][-1:] == ["lost"], story
    assert [kind for kind, _, _ in after].count("renewal_failed") <= 1, story
    assert after[-1][2].startswith("the key was gone"), story  # a renewal found it
    # How long that took: one renewal period and a retry on an idle machine; the load
    # (the loop's timers late, summed, and a new connection's time then) adds to it.
    late_by = late.between(restarted[0], work.losses[0][1])
    bound = learning_bound(ttl) + late_by + connecting[0]
    if learned > bound:
        # (Still the first renewal or its retry, as asserted above: slower, not later.)
        assert learned <= ttl + late_by + connecting[0], f"learned {learned:.3f} s after; {story}"
    assert work.mutex.overlap_span <= learned + SLACK + late_by, figures
    assert work.fenced.lost == 0, figures
    assert work.fenced.accepted - accepted[0] >= PHASE, f"fences went back; {figures}"
    assert await admin.get(fence_key(long_lock)) is not None, "the fencing counter is gone"
    await scene.assert_clean(long_lock)


async def test_kill_and_restart_while_many_wait_strands_no_waiter(
    scene: Scene,
) -> None:
    """SIGKILL while 30 coroutines on 3 clients wait, 0.3 s down, then restart with empty data.

    A waiter's attempt on the dead server raises redis-py's ConnectionError
    (with a message) at once instead of hanging, and no local queue stays
    wedged behind a failed head: after the restart every waiter gets the
    lock, none of them from the dead server. The holder at the kill learns
    of the loss within one renewal period of the restart (see
    :func:`learning_bound`), so it overlaps the next holder for that long at
    most, and the waiters never overlap each other. The fenced register
    loses nothing and accepts every waiter's update (the fences did not go
    back). No key, task or connection leaks.
    """
    ttl = 0.9
    srv, clients, admin, work = scene.server, scene.clients, scene.admin, scene.work

    def new_lock(c: redis.Redis) -> AsyncLock:
        return scene.new_lock(c, ttl, backoff=backoff.constant(0.05))

    holder_lock = new_lock(clients[0])
    await fences_ran_a_while(admin, holder_lock)
    holder: asyncio.Task[bool] | None = None
    waiters: list[asyncio.Task[None]] = []
    got_it: list[float] = []
    waiter_fences: list[int] = []

    async def wait_once(lock: AsyncLock) -> None:
        async def body() -> None:
            got_it.append(time.monotonic())
            waiter_fences.append(fence_of(lock))
            await work.cycle(lock)

        deadline = time.monotonic() + 10.0
        while not await work.hold(lock, body):
            assert time.monotonic() < deadline, "a waiter never got the lock"

    async with Lateness() as late:
        try:
            holder = await work.let_in(holder_lock, lambda: work.cycle_until_cancelled(holder_lock))
            waiters = [
                asyncio.create_task(wait_once(new_lock(c))) for c in clients for _ in range(10)
            ]
            await eventually(
                lambda: (
                    sum(AsyncLock(c, scene.name).statistics().tasks_waiting for c in clients) == 30
                ),
                "30 waiters",
            )
            await asyncio.sleep(0.1)  # the heads of clients 1 and 2 settle into their wait
            errors_before = len(work.errors)
            killed = time.monotonic()
            srv.kill()
            await eventually(lambda: len(work.errors) > errors_before, "a waiter's error")
            first_error = time.monotonic() - killed
            await asyncio.sleep(0.3)
            restarting = time.monotonic()
            await asyncio.to_thread(srv.restart)
            up = time.monotonic()
            await admin.connection_pool.disconnect()  # its connection died with the old server
            connecting = await connect_time(srv.url)
            done, _ = await asyncio.wait(waiters, timeout=5.0)
            assert len(done) == len(waiters), f"{len(waiters) - len(done)} waiters stranded"
            for task in done:
                task.result()
            assert not await asyncio.wait_for(holder, 2 * ttl), (
                "the holder's exit did not report the loss"
            )
        finally:
            await cancel_all([*([holder] if holder else []), *waiters])
    figures = scene.verdict("kill and restart while waiting", holder_lock)
    assert first_error < 0.5, f"the first waiter's error came {first_error:.3f} s after"
    assert len(got_it) == 30, figures
    assert min(got_it) >= restarting, "a waiter got the lock while the server was dead"
    learned = work.losses[0][1] - up
    # The load of the machine meanwhile (the loop's timers late, summed, and a new
    # connection's time then) adds to the bound.
    bound = learning_bound(ttl) + late.between(up, work.losses[0][1]) + connecting
    assert learned <= bound, f"learned {learned:.3f} s after (bound {bound:.3f} s); {figures}"
    assert all(holder_lock in pair for pair in work.mutex.pairs), "two waiters overlapped"
    assert work.mutex.overlap_span <= bound, figures
    assert work.fenced.lost == 0, figures
    rejected = set(waiter_fences) - set(work.fenced.accepted_fences)
    assert not rejected, f"fences went back: {len(rejected)} waiters rejected; {figures}"
    await scene.assert_clean(holder_lock)


# --- 3. SIGSTOP of the server past the lease, then SIGCONT --------------------------------------


async def test_server_paused_past_the_lease_never_lets_two_bodies_overlap(
    scene: Scene,
) -> None:
    """SIGSTOP of the server for twice the lease under a holder and waiters, then SIGCONT.

    A holder that is cut off declares the loss no later than the server can
    expire its lease: its ``on_lost`` runs by its lease end, while the server
    is still stopped, so with ``cancel_on_lost=True`` its body is gone before
    anyone else can get the lock. No two bodies overlap, and even the plain
    register loses no update. The commands that queued up in the stopped
    server (the holder's renewal, the waiters' attempts, whose replies come
    back after their lease) leave no lock behind, and the waiters carry on.
    Errors are redis-py's or aiolock's, with a message; no key, task or
    connection leaks.
    """
    ttl = 0.3
    srv, work = scene.server, scene.work
    long_lock = scene.new_lock(scene.clients[0], ttl)
    paused: list[float] = []

    async def pause_past_the_lease() -> None:
        srv.pause()
        paused.append(time.monotonic())
        try:
            await asyncio.sleep(2 * ttl)
        finally:
            srv.resume()
        paused.append(time.monotonic())

    async with Lateness() as late:
        await through_a_fault(scene, long_lock, pause_past_the_lease)
    figures = scene.verdict("server paused past the lease", long_lock)
    lost_at = work.losses[0][1]
    bound = ttl + SLACK + late.between(paused[0], lost_at)  # the machine's load adds to it
    assert lost_at <= paused[0] + bound, f"lost {lost_at - paused[0]:.3f} s into the pause"
    assert lost_at < paused[1], "the loss was declared only after the server came back"
    assert work.mutex.overlaps == 0, figures
    assert work.plain.lost == 0, figures
    assert work.fenced.lost == 0, figures
    await scene.assert_clean(long_lock)


# --- 4. the holder's event loop blocked past its lease ------------------------------------------


@dataclass
class PausingHolder:
    """What a holder whose loop blocks saw, one entry per holding."""

    outcomes: list[str] = field(default_factory=list)
    exit_after_unblock: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


async def pausing_holder(
    url: str, name: str, ttl: float, blocks: list[float], work: Workload
) -> PausingHolder:
    """Hold ``name`` once per item of ``blocks``, each time blocking this loop in the middle.

    Meant for a :class:`LoopThread`: it makes and closes its own client. A
    block is a ``time.sleep`` between the read and the write of a cycle (a GC
    pause, a CPU-bound step); a block past the lease then also waits until
    somebody else has written, so the stale write surely follows a newer one.
    """
    c = redis.Redis.from_url(url)
    seen = PausingHolder()
    lock = AsyncLock(c, name, ttl=ttl, timeout=5.0, fencing=True)
    try:
        for block in blocks:
            unblocked = time.monotonic()
            try:
                async with lock:
                    with work.mutex.held(lock):
                        fence = fence_of(lock)
                        value = work.plain.read()
                        writes = work.plain.writes
                        try:
                            fenced: int | None = work.fenced.read(fence)
                        except StaleFence:
                            fenced = None
                        time.sleep(block)  # the loop is blocked: no renewal can run
                        if block > ttl:
                            assert work.plain.wait_for_writes(writes + 1), "nobody took over"
                        unblocked = time.monotonic()
                        work.plain.write(value + 1)
                        if fenced is not None:
                            with contextlib.suppress(StaleFence):
                                work.fenced.write(fence, fenced + 1)
            except LockLostError as exc:
                seen.errors.append(exc)
                seen.outcomes.append("lost")
            else:
                seen.outcomes.append("held")
            seen.exit_after_unblock.append(time.monotonic() - unblocked)
            await asyncio.sleep(work.rng.uniform(*PAUSE))
        assert await other_tasks() == set(), "a task outlived the other loop's holdings"
        assert await listeners_gone(), "the other loop's listener did not stop"
        assert in_use_connections(c) == 0, "the other loop left a connection checked out"
    finally:
        await c.aclose()
    return seen


async def test_blocked_loop_loses_updates_that_only_the_fence_keeps(
    server: RedisServer,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """A holder whose own event loop blocks past its lease (in its own thread, like a process).

    The others get the lock once the lease has run out on the server and
    carry on; the blocked holder learns of the loss as soon as its loop runs
    again (``LockLostError`` at its exit at once, no server needed), and it
    never touches the new holder's key: no other holding is lost. Its write
    after a block past the lease overwrites what the others wrote meanwhile:
    the plain register loses updates (at least one per such block, forced),
    the fenced one rejects the stale write and loses none. Short blocks
    (under a renewal period) lose nothing. No key, task or connection leaks.
    """
    ttl = 0.2
    draw = timing.draw()
    work = Workload(random.Random(draw))
    short = [work.rng.uniform(0.0, ttl / 4) for _ in range(4)]
    blocks = [*short[:2], 2 * ttl, *short[2:]]
    work.rng.shuffle(blocks)
    other_loop = LoopThread()
    locks = [
        AsyncLock(c, name, ttl=ttl, timeout=5.0, fencing=True, on_lost=work.on_lost)
        for c in (client, other_client)
        for _ in range(2)
    ]
    workers = [asyncio.create_task(work.work(lock)) for lock in locks]
    try:
        try:
            async with Answers(server.url) as answers, Lateness() as lateness:
                await work.reach(PHASE)
                seen = await other_loop.run(pausing_holder(server.url, name, ttl, blocks, work))
                await stop_all(work, workers, timeout=5.0)
        finally:
            await cancel_all(workers)
            other_loop.close()
        figures = report(f"loop blocked past the lease (draw {draw})", work)
        expected = ["lost" if block > ttl else "held" for block in blocks]
        assert seen.outcomes == expected, f"blocks {blocks}: {seen.outcomes}; {figures}"
        assert max(seen.exit_after_unblock) < SLACK, seen.exit_after_unblock
        assert foreign_errors([*work.errors, *seen.errors]) == [], figures
        # The others renew every ttl/3: one of them loses its lease only when this
        # loop or the server stood still for the other two thirds. A machine loaded
        # that much shows it in a PING or in a late timer; short of that, a loss is
        # the blocked holder's doing (it touched a key it no longer owned).
        stood = max(answers.slowest(), lateness.most())
        stalled = stood > ttl / 3
        figures += f"; longest stand-still {stood * 1000:.0f} ms"
        assert work.losses == [] or stalled, f"another holder lost its lock; {figures}"
        assert work.lost_at_exit == 0 or stalled, figures
        assert work.plain.lost >= 1, figures
        assert work.fenced.lost == 0, figures
        assert work.fenced.rejected >= 1, figures
        assert in_use_connections(other_client) == 0, "a connection was left checked out"
    finally:
        await admin.delete(Keys(name).fence)


# --- 5. the holder's network black-holed ---------------------------------------------------------


async def test_black_holed_holder_is_out_before_the_next_one_is_in(
    proxy: FaultProxy,
    proxied: redis.Redis,
    no_leaks: None,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """The holder's network is black-holed while it holds: its renewals get no answer.

    A holder that is cut off declares the loss no later than the server can
    expire its lease, so with ``cancel_on_lost=True`` its body is cancelled
    as the next holder (on another client) gets in: the two overlap by
    scheduling noise at most, never by a renewal period, and it leaves
    ``async with`` with ``LockLostError`` without the server. The fenced
    register loses no update. Once the network heals, the cut-off client
    holds the lock again at once (no connection is left poisoned by a
    command cut off in the black hole). Errors are redis-py's or aiolock's,
    with a message; no key, task or connection leaks.
    """
    ttl = 0.6
    draw = timing.draw()
    work = Workload(random.Random(draw))
    cut = proxied

    def new_lock(c: redis.Redis) -> AsyncLock:
        return AsyncLock(
            c, name, ttl=ttl, timeout=5.0, fencing=True, cancel_on_lost=True, on_lost=work.on_lost
        )

    victim = new_lock(cut)
    workers = [
        asyncio.create_task(work.work(new_lock(c))) for c in (client, other_client) for _ in (1, 2)
    ]
    holder: asyncio.Task[bool] | None = None
    try:
        try:
            await work.reach(PHASE)
            holder = await work.let_in(victim, lambda: work.cycle_until_cancelled(victim))
            proxy.black_hole()
            cut_off = time.monotonic()
            assert not await asyncio.wait_for(holder, ttl + 2.0), "the exit reported no loss"
            left = time.monotonic() - cut_off
            after = work.holdings
            await work.reach(after + PHASE)
            proxy.pass_through()
            healed = time.monotonic()
            again = await work.let_in(victim, lambda: work.cycle(victim))
            assert await asyncio.wait_for(again, 2.0), "the healed client could not hold again"
            back_in = time.monotonic() - healed
            await stop_all(work, workers, timeout=5.0)
        finally:
            await cancel_all([*workers, *([holder] if holder else [])])
        figures = report(f"holder black-holed (draw {draw})", work)
        assert foreign_errors(work.errors) == [], figures
        assert [lock for lock, _ in work.losses] == [victim], figures
        assert left <= ttl + SLACK, f"the cut-off holder left {left:.3f} s after the cut"
        assert work.mutex.overlap_span < ttl / 3, figures
        assert work.fenced.lost == 0, figures
        assert back_in < 1.0, f"the healed client held again only after {back_in:.3f} s"
        assert in_use_connections(cut) == 0, "the cut-off client left a connection checked out"
        assert in_use_connections(other_client) == 0, "a connection was left checked out"
    finally:
        await admin.delete(Keys(name).fence)


# --- 6. the pub/sub connection reset while hundreds wait -----------------------------------------


def notifications_through(proxy: FaultProxy, server: RedisServer) -> redis.Redis:
    """A client whose commands go straight to ``server``, and its release-notification
    listener through ``proxy``, so that a fault of the proxy hits the pub/sub connection only.

    The listener makes its connection with the pool's connection class and
    arguments, but without a socket timeout (it waits for messages): that is
    how the connection class below tells it apart.
    """

    class Routed(redis.Connection):
        def __init__(self, **kwargs: Any) -> None:
            if kwargs.get("socket_timeout", 0) is None:
                kwargs.update(host=proxy.host, port=proxy.port)
            super().__init__(**kwargs)

    pool = redis.ConnectionPool(
        connection_class=Routed, host=server.host, port=server.port, socket_timeout=5.0
    )
    return redis.Redis.from_pool(pool)


async def numsub(admin: redis.Redis, channels: list[str]) -> list[int]:
    """How many connections the server has subscribed to each of ``channels``."""
    return [int(count) for _, count in await admin.pubsub_numsub(*channels)]


async def attempts(admin: redis.Redis) -> int:
    """How many SET commands the server has run: one per acquire attempt or hand-over."""
    entry = (await admin.info("commandstats")).get("cmdstat_set")
    return int(entry["calls"]) if entry else 0


async def test_pubsub_reset_while_hundreds_wait_strands_nobody(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """The pub/sub connection is reset (RST) while 200 coroutines of its client wait on 100 locks.

    Nobody is stranded: the releases sent while the pub/sub connection was
    down (nobody heard them) and those sent after it came back both get
    their waiters in within a second, although each waiter's backoff step is
    5 s, because the listener reconnects, subscribes every channel again on
    one connection, and makes every waiter try again. The waiters do not
    fall back to polling (a handful of attempts per lock), no error reaches
    them, no two holders of a lock overlap, and afterwards the listener ends
    by itself: no key, task or connection leaks.
    """
    locks_count, step = 100, 5.0
    proxy = await FaultProxy(server.host, server.port).start()
    waiting_client = notifications_through(proxy, server)
    names = [f"{name}-{i}" for i in range(locks_count)]
    holders = [AsyncLock(client, n, ttl=10.0) for n in names]
    channels = [keys_of(h).channel for h in holders]
    got_it: dict[int, list[float]] = {i: [] for i in range(locks_count)}
    errors: list[BaseException] = []
    mutex = [MutualExclusion() for _ in range(locks_count)]

    async def wait_for(i: int) -> None:
        lock = AsyncLock(waiting_client, names[i], backoff=backoff.constant(step), timeout=10.0)
        try:
            async with lock:
                with mutex[i].held(lock):
                    got_it[i].append(time.monotonic())
                    await asyncio.sleep(0.001)
        except Exception as exc:
            errors.append(exc)

    async def subscribed(some: list[str]) -> None:
        deadline = time.monotonic() + 5.0
        while await numsub(admin, some) != [1] * len(some):
            assert time.monotonic() < deadline, "the waiters' channels are not all subscribed"
            await asyncio.sleep(0.01)

    async def listener_ids() -> set[str]:
        return {c["id"] for c in await admin.client_list(_type="pubsub")}

    waiters: list[asyncio.Task[None]] = []
    try:
        others = await listener_ids()  # pub/sub connections that are not ours
        for h in holders:
            assert await h.acquire(blocking=False)
        waiters = [asyncio.create_task(wait_for(i)) for i in range(locks_count) for _ in (1, 2)]
        await subscribed(channels)
        await asyncio.sleep(0.2)  # every head is asleep in its 5 s step
        assert all(not got for got in got_it.values())
        [listener] = await listener_ids() - others
        before = await attempts(admin)

        await proxy.reset_all()
        reset = time.monotonic()
        half = locks_count // 2
        for h in holders[:half]:  # released while nobody listens: no message reaches them
            await h.release()
        await subscribed(channels[half:])
        resubscribed = time.monotonic()
        assert listener not in await listener_ids(), "the reset did not hit the listener"
        for h in holders[half:]:
            await h.release()
        done, _ = await asyncio.wait(waiters, timeout=3.0)
        assert len(done) == len(waiters), f"{len(waiters) - len(done)} waiters stranded"
        sent = await attempts(admin) - before

        assert errors == [], errors
        assert all(len(got) == 2 for got in got_it.values()), "a waiter never held its lock"
        first_half = max(max(got_it[i]) for i in range(half)) - reset
        second_half = max(max(got_it[i]) for i in range(half, locks_count)) - resubscribed
        print(
            f"\n[faults] pub/sub reset under 200 waiters: all in {first_half:.3f} s after the "
            f"reset (releases unheard) and {second_half:.3f} s after the resubscription "
            f"(releases heard); {sent} attempts for {2 * locks_count} holdings"
        )
        assert first_half < 1.0, f"the unheard releases took {first_half:.3f} s to be noticed"
        assert second_half < 1.0, f"the heard releases took {second_half:.3f} s"
        assert all(m.overlaps == 0 for m in mutex), "two holders of one lock overlapped"
        assert sent <= 4 * 2 * locks_count, f"{sent} attempts for 200 holdings: a polling storm"
        assert await listeners_gone(), "the listener did not stop by itself"
        assert in_use_connections(waiting_client) == 0
        assert await admin.keys(f"*{{{name}-*") == [], "a key was left on the server"
    finally:
        await cancel_all(waiters)
        for h in holders:
            if h.statistics().held:
                await h.release()
        await waiting_client.aclose()
        await proxy.aclose()


# --- 7. a stale writer, forced: only the fence stops it -----------------------------------------


async def stale_writer(
    url: str, name: str, ttl: float, work: Workload, read: threading.Event, *, block: bool
) -> BaseException | None:
    """Hold ``name``, read both registers, wait until someone else wrote, write: a stale writer.

    It checks neither ``lock.lost`` nor uses ``cancel_on_lost``: it stands
    for a holder paused between its check and its write. With ``block`` the
    wait blocks this event loop (run it in a :class:`LoopThread`). Makes and
    closes its own client; returns the exception its ``async with`` raised.
    """
    c = redis.Redis.from_url(url)
    lock = AsyncLock(c, name, ttl=ttl, fencing=True, timeout=2.0)
    try:
        async with lock:
            fence = fence_of(lock)
            value = work.plain.read()
            writes = work.plain.writes
            seen = work.fenced.read(fence)
            read.set()
            if block:
                assert work.plain.wait_for_writes(writes + 1), "nobody took over"
            else:
                assert await asyncio.to_thread(work.plain.wait_for_writes, writes + 1), "nobody"
            work.plain.write(value + 1)
            with contextlib.suppress(StaleFence):
                work.fenced.write(fence, seen + 1)
    except Exception as exc:
        return exc
    finally:
        await c.aclose()
    return None


@pytest.mark.parametrize("fault", ["server paused", "network black-holed", "loop blocked"])
async def test_a_stale_writer_is_stopped_by_the_fence_only(
    private_server: Callable[..., RedisServer], fault: str
) -> None:
    """A holder cut off from its lock by the fault writes after the next holder has written.

    It read, was paused or cut off past its lease, and wrote without looking
    at ``lock.lost``. The plain register loses the next holder's update
    (exactly one lost update), the fenced register rejects the stale write
    (none lost). The stale holder's exit raises ``LockLostError`` (with a
    message), and the next holder keeps its lock (its key untouched) and
    releases it normally.
    """
    ttl = 0.3
    srv = private_server()
    work = Workload(random.Random(timing.draw()))
    name = f"stale:{uuid.uuid4().hex[:8]}"
    read = threading.Event()
    proxy = await FaultProxy(srv.host, srv.port).start()
    fresh = redis.Redis.from_url(srv.url)
    admin = redis.Redis.from_url(srv.url, decode_responses=True)
    other_loop = LoopThread() if fault == "loop blocked" else None
    url = proxy.url if fault == "network black-holed" else srv.url
    writer = stale_writer(url, name, ttl, work, read, block=other_loop is not None)
    stale: asyncio.Future[BaseException | None] = asyncio.ensure_future(
        writer if other_loop is None else other_loop.run(writer)
    )
    nxt = AsyncLock(fresh, name, ttl=5.0, fencing=True)
    try:
        await thread_event(read)
        if fault == "server paused":
            srv.pause()
            try:
                await asyncio.sleep(ttl + 0.1)  # the stale holder's lease runs out meanwhile
            finally:
                srv.resume()
        elif fault == "network black-holed":
            proxy.black_hole()
        assert await nxt.acquire(timeout=2.0), "the next holder did not get the lock"
        fence = fence_of(nxt)
        value, seen = work.plain.read(), work.fenced.read(fence)
        work.plain.write(value + 1)
        work.fenced.write(fence, seen + 1)
        error = await asyncio.wait_for(stale, 3.0)
        token = await admin.get(nxt.key)
        assert await nxt.owned(), "the stale holder took the next holder's lock"
        await nxt.release()
        print(
            f"\n[faults] stale writer ({fault}): lost updates plain={work.plain.lost} "
            f"fenced={work.fenced.lost}, fenced rejected={work.fenced.rejected}"
        )
        assert isinstance(error, LockLostError), repr(error)
        assert str(error), "a LockLostError without a message"
        assert token is not None
        assert work.plain.lost == 1, "the stale write did not overwrite the newer one"
        assert work.fenced.lost == 0, "the fenced register lost an update"
        assert work.fenced.rejected == 1, "the fenced register did not reject the stale write"
        await admin.delete(fence_key(nxt))
        await assert_clean(admin, all_keys(name), fresh)
    finally:
        await cancel_all([stale])
        if other_loop is not None:
            other_loop.close()
        if srv.paused:
            srv.resume()
        for c in (fresh, admin):
            await c.aclose()
        await proxy.aclose()


# --- defects found by this suite -----------------------------------------------------------------


async def test_fences_keep_increasing_across_a_restart_with_empty_data(
    private_server: Callable[..., RedisServer],
) -> None:
    """A holding taken after a restart with empty data gets a fence above every earlier one.

    Regression (found by this suite; fixed in a312de8): the counter
    died with the server, and fences started over at 1. The holder from
    before the restart learns of the loss only at its next renewal (test 1);
    until then it still writes with its fence. A next holder with the same
    fence passes a fenced resource's check (which must let a holding read,
    then write, with one fence), and the resource loses an update: fencing
    failed exactly when the lock did.
    """
    srv = private_server()
    work = Workload(random.Random(timing.draw()))
    name = f"fence-restart:{uuid.uuid4().hex[:8]}"
    stale_client = redis.Redis.from_url(srv.url)
    fresh = redis.Redis.from_url(srv.url)
    admin = redis.Redis.from_url(srv.url, decode_responses=True)
    stale = AsyncLock(stale_client, name, ttl=5.0, fencing=True)
    nxt = AsyncLock(fresh, name, ttl=5.0, fencing=True)
    try:
        assert await stale.acquire(blocking=False)
        old = fence_of(stale)
        value, seen = work.plain.read(), work.fenced.read(old)
        await asyncio.to_thread(srv.restart)
        await fresh.connection_pool.disconnect()  # its connection died with the old server
        assert await nxt.acquire(timeout=1.0)
        new = fence_of(nxt)
        with contextlib.suppress(StaleFence):  # the next holder's read-modify-write...
            nxt_value = work.fenced.read(new)
            work.plain.write(work.plain.read() + 1)
            work.fenced.write(new, nxt_value + 1)
        work.plain.write(value + 1)  # ...then the stale holder's write
        with contextlib.suppress(StaleFence):
            work.fenced.write(old, seen + 1)
        assert new > old, (
            f"fence {new} after the restart, {old} before it: the fenced register lost "
            f"{work.fenced.lost} update(s)"
        )
        assert work.fenced.lost == 0
        await nxt.release()
        await stale_client.connection_pool.disconnect()  # its connection died with the server
        with pytest.raises(LockLostError):
            await stale.release()
        await admin.delete(fence_key(nxt))
        await assert_clean(admin, all_keys(name), stale_client, fresh)
    finally:
        for lock in (nxt, stale):
            if lock.statistics().held:
                with contextlib.suppress(LockError, RedisError):
                    await lock.release()
        for c in (stale_client, fresh, admin):
            await c.aclose()


async def careful_writer(
    url: str, name: str, ttl: float, work: Workload, read: threading.Event
) -> tuple[bool, BaseException | None]:
    """Like :func:`stale_writer` with ``block``, but it looks at ``lock.lost`` before writing.

    Returns what ``lock.lost`` said at that look, and what its exit raised.
    """
    c = redis.Redis.from_url(url)
    lock = AsyncLock(c, name, ttl=ttl, timeout=2.0)
    looked = False
    try:
        async with lock:
            value = work.plain.read()
            writes = work.plain.writes
            read.set()
            time.sleep(ttl)  # the loop is blocked past the lease...
            assert work.plain.wait_for_writes(writes + 1), "nobody took over"  # ...and longer
            looked = lock.lost
            if not looked:
                work.plain.write(value + 1)
    except Exception as exc:
        return looked, exc
    finally:
        await c.aclose()
    return looked, None


async def test_a_careful_writer_sees_the_loss_as_soon_as_its_loop_runs(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """After its loop was blocked past the lease, a holder sees ``lock.lost`` at its first look.

    README: "aiolock tells the holder as soon as it can run again". So a
    holder that checks ``lock.lost`` right before it writes never overwrites
    the update of the holder that got the lock meanwhile (in another
    process: here another event loop), and the plain register loses nothing.
    Regression (found by this suite; fixed in a312de8): ``lost``
    said False until the watchdog task had run, 2-3 loop steps later.
    """
    ttl = 0.2
    work = Workload(random.Random(timing.draw()))
    read = threading.Event()
    other_loop = LoopThread()
    careful = asyncio.ensure_future(
        other_loop.run(careful_writer(server.url, name, ttl, work, read))
    )
    nxt = AsyncLock(client, name, ttl=5.0)
    try:
        await thread_event(read)
        assert await nxt.acquire(timeout=2.0)
        work.plain.write(work.plain.read() + 1)
        looked, error = await asyncio.wait_for(careful, 3.0)
        await nxt.release()
        assert isinstance(error, LockLostError), repr(error)
        assert looked, f"lock.lost said False; the plain register lost {work.plain.lost} update"
        assert work.plain.lost == 0
    finally:
        await cancel_all([careful])
        other_loop.close()
        if nxt.statistics().held:
            await nxt.release()


async def test_a_waiter_cut_off_from_notifications_is_not_starved_by_a_local_run(
    server: RedisServer, client: redis.Redis, name: str, no_leaks: None
) -> None:
    """A waiter whose pub/sub connection is black-holed still gets the lock from a local run.

    Regression test for a defect this suite found: a local run of hand-overs
    yielded to other processes only if ``PUBSUB NUMSUB`` showed a subscriber
    besides its own, so a waiter that could not subscribe (or polled with
    ``notify=False``) was invisible and starved for as long as the run went
    on. Waiters now raise a short-lived waiting marker that the hand-over
    script counts too.

    README (Fairness): once a run of local hand-overs "has lasted 100 ms and
    another process is waiting, the releaser lets it go first". Here the
    other process cannot subscribe (its pub/sub connection is black-holed),
    so it polls; it must still get in, well within its 1 s timeout, while
    three tasks of the holder's process take the lock in turn without pause.
    """
    proxy = await FaultProxy(server.host, server.port).start()
    proxy.black_hole()
    polling = notifications_through(proxy, server)
    stop = False

    async def take_turns() -> None:
        lock = AsyncLock(client, name, ttl=5.0)
        while not stop:
            async with lock:
                await asyncio.sleep(0.001)

    turns = [asyncio.create_task(take_turns()) for _ in range(3)]
    try:
        await asyncio.sleep(0.05)
        waiter = AsyncLock(polling, name, ttl=5.0, backoff=backoff.constant(0.02))
        started = time.monotonic()
        got_it = await waiter.acquire(timeout=1.0)
        waited = time.monotonic() - started
        if got_it:
            await waiter.release()
        stop = True
        await asyncio.wait_for(asyncio.gather(*turns), 2.0)
        assert got_it, f"the polling waiter did not get the lock in {waited:.3f} s"
    finally:
        stop = True
        await cancel_all(turns)
        await polling.aclose()
        await proxy.aclose()


async def test_a_release_into_a_black_hole_ends_by_the_lease(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Leaving ``async with`` while the network is black-holed takes no longer than the lease.

    Regression test for a defect this suite found: ``release()`` was bounded
    only by redis-py's socket timeout (5 s by default, none at all with
    ``socket_timeout=None``), not by the lease.

    The key expires at the lease end whatever happens, so a release still
    unanswered then is moot; waiting on (here for redis-py's 5 s socket
    timeout) only stalls the caller, a request handler say, 16 leases long.
    Whatever it raises is redis-py's or aiolock's, with a message.
    """
    ttl = 0.3
    cut = proxied
    lock = AsyncLock(cut, name, ttl=ttl)

    async def hold_then_leave() -> None:
        async with lock:
            proxy.black_hole()  # the body is done; the release goes into the black hole

    leaving = asyncio.ensure_future(hold_then_leave())
    try:
        await ends_within(leaving, ttl + 2 * SLACK, "leaving `async with`")
    finally:
        await cancel_all([leaving])
        await asyncio.sleep(ttl)  # the key the release could not delete expires


async def test_a_hand_over_into_a_black_hole_ends_by_the_lease(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Releasing to a local waiter while the network is black-holed ends by the lease too.

    Regression test for a defect found while fixing the plain release: the
    hand-over path of ``release()`` (taken when a task of the same process
    waits) was bounded only by redis-py's socket timeout, not by the lease.
    The waiter is then told to take back the token the hand-over may have
    given it and to contend on the server itself, and, cut off as well,
    gives up at its own timeout. Whatever either raises is redis-py's
    or aiolock's, with a message.
    """
    ttl = 0.3
    cut = proxied
    lock = AsyncLock(cut, name, ttl=ttl)
    heir = AsyncLock(cut, name, ttl=ttl)

    async def hold_then_leave() -> None:
        async with lock:
            await eventually(lambda: lock.statistics().tasks_waiting == 1, "the heir waits")
            proxy.black_hole()  # the body is done; the hand-over goes into the black hole

    leaving = asyncio.ensure_future(hold_then_leave())
    await eventually(lambda: lock.statistics().held, "the lock is held")
    waiting = asyncio.ensure_future(heir.acquire(timeout=2 * ttl))
    try:
        await ends_within(leaving, ttl + 2 * SLACK, "leaving `async with`")
        # The heir's own timeout, then the bounded undo of its last attempt.
        await ends_within(waiting, 2 * ttl + ttl + 2 * SLACK, "the heir giving up by its timeout")
        assert waiting.exception() is not None or waiting.result() is False
    finally:
        await cancel_all([leaving, waiting])
        await asyncio.sleep(ttl)  # the key the release could not delete expires


async def test_a_hand_over_cut_off_at_the_lease_end_is_taken_back_by_the_heir(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """A hand-over that ran on the server but whose reply was held: the heir deletes its key.

    Regression test (found in review): the releaser used to undo the heir's token
    itself after the cut-off, which could keep it past the lease for one more
    cleanup bound (the black-hole test above flaked on it). The heir now gets
    the token back with an Undo ticket and deletes it before it contends, so
    the key it was given does not outlive the cut-off by its own 5 s lease.
    """
    ttl = 0.3
    cut = proxied
    lock = AsyncLock(cut, name, ttl=ttl)
    heir = AsyncLock(cut, name, ttl=5.0)
    # Loaded beforehand: a first EVALSHA would only get NOSCRIPT (held back), and never run.
    for script in (ACQUIRE, HANDOVER, RELEASE):
        await admin.script_load(script.text)

    async def hold_then_leave() -> None:
        async with lock:
            await eventually(lambda: lock.statistics().tasks_waiting == 1, "the heir waits")
            proxy.hold_replies()  # the hand-over runs on the server; its reply is held back

    leaving = asyncio.ensure_future(hold_then_leave())
    await eventually(lambda: lock.statistics().held, "the lock is held")
    waiting = asyncio.ensure_future(heir.acquire(timeout=10.0))
    try:
        done, _ = await asyncio.wait({leaving}, timeout=ttl + 2 * SLACK)
        assert done, f"still leaving `async with` {ttl + 2 * SLACK:.1f} s later (ttl {ttl} s)"
        assert isinstance(leaving.exception(), RedisError), repr(leaving.exception())
        # The server ran the hand-over: the key held the token it gave the heir, with the
        # heir's 5 s lease. The heir deletes it (its reply held back, but run by the
        # server), then takes the lock on a fresh connection: long before those 5 s.
        finished, _ = await asyncio.wait({waiting}, timeout=2.0)
        assert finished, "the heir waited on: the handed token kept the key after the cut-off"
        assert waiting.result() is True
        proxy.release_replies()
        await heir.release()
    finally:
        await cancel_all([leaving, waiting])


async def test_a_dead_server_is_an_error_at_once_or_no_answer_by_the_deadline(
    private_server: Callable[..., RedisServer], name: str
) -> None:
    """The server killed: never ``False`` ("held"), and never past the documented bound.

    A client made with ``Redis.from_url`` (no retries) gets redis-py's
    ``ConnectionError`` at once. One made with ``Redis(host=..., port=...)``
    retries for about 3.6 s: its attempt at ``acquire(timeout=0.5)`` is cut
    off at the deadline plus the link's allowance (0.1 s on loopback), its
    undo gets the call's one cleanup budget (``min(ttl, 1 s)``), and the
    call raises redis-py's ``TimeoutError`` ("did not answer"): 1.6 s, the
    figure docs/failure-modes.md gives. Before, it returned ``False``.
    """
    srv = private_server()
    plain = redis.Redis.from_url(srv.url)
    retrying = redis.Redis(host=srv.host, port=srv.port)
    try:
        locks = [AsyncLock(c, name, ttl=10.0) for c in (plain, retrying)]
        for lock in locks:  # warm: the link is known
            assert await lock.acquire()
            await lock.release()
        srv.stop()
        started = time.monotonic()
        with pytest.raises(RedisConnectionError):
            await locks[0].acquire(timeout=0.5)
        assert time.monotonic() - started < 0.5
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError, match=r"did not answer within 0\.6\d* s"):
            await locks[1].acquire(timeout=0.5)
        took = time.monotonic() - started
        assert 0.6 <= took <= 0.5 + 0.1 + 1.0 + SLACK, f"acquire(timeout=0.5) took {took:.3f} s"
    finally:
        await plain.aclose()
        await retrying.aclose()
