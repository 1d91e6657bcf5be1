"""Release notifications, local coalescing and statistics() on real servers (docs/design.md).

A release publishes on ``<key>:released``; a waiter that failed an attempt
subscribes (one shared, reference-counted pub/sub connection per client) and
sleeps until a message or its backoff step, whichever comes first. Waiters of
one client object queue locally: only the head talks to the server, and a
release wakes one of them. ``statistics()`` describes that local view.

The waiters here use a 5 s backoff step, so "woken within 1 s" can only come
from a notification (the ``notify=False`` counterpart shows the bound can tell).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis.asyncio as redis
from support.leaks import listeners_gone
from support.locks import holds_on_server, keys_of
from support.servers import calls, connected
from support.timing import eventually

from aiolock import AsyncLock, LockNotOwnedError, LockStatistics, backoff
from aiolock._notify import LINGER, grant_tag, listeners_of
from aiolock._queue import LOCAL_RUN
from aiolock._server_lease import ServerLease
from aiolock.testing import FaultProxy, RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

T = TypeVar("T")

#: The backoff step of the waiters: anything much faster came from a notification.
LONG_STEP = 5.0
#: How soon a notified waiter must hold the lock (generous: CI has 2 loaded cores).
WAKE_BOUND = 1.0
#: How long a channel nobody waits on may stay subscribed (its LINGER, noticed within
#: another LINGER, plus scheduling).
UNSUBSCRIBE_BOUND = 2 * LINGER + 1.0
#: How long EVALSHA traffic must pause before a waiter counts as asleep in its step.
QUIET = 0.15


# --- helpers -------------------------------------------------------------------------------------


class Tasks:
    """The tasks a test starts; whatever is still running at teardown is cancelled."""

    def __init__(self) -> None:
        self._started: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self._started.append(task)
        return task

    async def cancel_all(self) -> None:
        for task in self._started:
            task.cancel()
        await asyncio.gather(*self._started, return_exceptions=True)


@pytest.fixture
async def tasks() -> AsyncIterator[Tasks]:
    """Start tasks that cannot outlive the test, even when it fails."""
    started = Tasks()
    yield started
    await started.cancel_all()


def channel_of(lock: AsyncLock) -> str:
    """The channel a release of ``lock`` is announced on."""
    return keys_of(lock).channel


async def numsub(admin: redis.Redis, channel: str) -> int:
    """How many connections the server has subscribed to ``channel``."""
    [(_, count)] = await admin.pubsub_numsub(channel)
    return int(count)


async def lock_commands(admin: redis.Redis) -> int:
    """How many lock commands the server has run: EVALSHA (scripts), SET and PTTL."""
    stats = await admin.info("commandstats")
    names = ("evalsha", "set", "pttl")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names)


async def attempts(admin: redis.Redis) -> int:
    """How many acquire attempts the server has run: each runs one SET (bare or in a script)."""
    entry = (await admin.info("commandstats")).get("cmdstat_set")
    return int(entry["calls"]) if entry else 0


async def subscribe_calls(admin: redis.Redis) -> int:
    """How many SUBSCRIBE commands the server has run."""
    entry = (await admin.info("commandstats")).get("cmdstat_subscribe")
    return int(entry["calls"]) if entry else 0


async def pubsub_clients(admin: redis.Redis) -> dict[str, int]:
    """The server's pub/sub connections: client id -> number of channels subscribed."""
    return {c["id"]: int(c["sub"]) for c in await admin.client_list(_type="pubsub")}


async def subscribed(admin: redis.Redis, lock: AsyncLock, count: int = 1) -> None:
    """Wait until ``count`` connections are subscribed to ``lock``'s channel."""

    async def check() -> bool:
        return await numsub(admin, channel_of(lock)) == count

    await eventually(check, f"NUMSUB {channel_of(lock)} == {count}")


async def unsubscribed(admin: redis.Redis, lock: AsyncLock) -> None:
    """Wait until nobody is subscribed to ``lock``'s channel (within the linger bound)."""

    async def check() -> bool:
        return await numsub(admin, channel_of(lock)) == 0

    await eventually(check, f"{channel_of(lock)} unsubscribed", UNSUBSCRIBE_BOUND)


async def quiet(admin: redis.Redis, since: int | None = None, at_least: int = 0) -> None:
    """Wait until ``at_least`` EVALSHA ran after the count ``since``, then none for a while.

    A waiter with a long step is then asleep in it (past the retry a confirmed
    subscription triggers). ``since`` defaults to the count now.
    """
    last = await lock_commands(admin)
    first = last if since is None else since
    settled_since = time.monotonic()
    deadline = settled_since + 3.0
    while last - first < at_least or time.monotonic() - settled_since < QUIET:
        if time.monotonic() >= deadline:
            pytest.fail("lock traffic did not settle")
        await asyncio.sleep(0.01)
        now = await lock_commands(admin)
        if now != last:
            last, settled_since = now, time.monotonic()


async def waiting(lock: AsyncLock, count: int) -> None:
    """Wait until ``count`` local tasks wait for ``lock`` (as its statistics() say)."""
    await eventually(
        lambda: lock.statistics().tasks_waiting == count, f"{count} waiting for {lock.name}"
    )


async def asleep_on_notification(
    admin: redis.Redis, lock: AsyncLock, task: asyncio.Task[Any]
) -> None:
    """Wait until ``task``, acquiring ``lock``, is subscribed and asleep in its backoff step."""
    await subscribed(admin, lock)
    await quiet(admin)
    assert not task.done(), "the waiter stopped waiting"


async def done_within(task: asyncio.Task[T], bound: float, what: str) -> T:
    """``task``'s result, failing the test if it is not done within ``bound`` seconds."""
    done, _ = await asyncio.wait({task}, timeout=bound)
    assert done, f"{what}: not within {bound} s"
    return task.result()


class ClientFaults:
    """Client-side network faults of one client object (the server stays real).

    Attributes:
        connecting: set while new connections may open; clear it and every new
            one (such as a reconnecting listener's) hangs, as behind a partition,
            while the connections already open go on.
        script_reply_delay: seconds each script reply (EVALSHA) spends "on the
            wire" after it arrived, so that a release message on the pub/sub
            connection overtakes the reply to the release that sent it.
    """

    def __init__(self) -> None:
        self.connecting = asyncio.Event()
        self.connecting.set()
        self.script_reply_delay = 0.0


def faulty_client(server: RedisServer) -> tuple[redis.Redis, ClientFaults]:
    """A client of ``server`` whose connections suffer the returned :class:`ClientFaults`."""
    faults = ClientFaults()

    class FaultyConnection(redis.Connection):
        script_sent = False

        async def connect(self) -> None:
            if not self.is_connected:
                await faults.connecting.wait()
            await super().connect()  # type: ignore[no-untyped-call]

        async def send_command(self, *args: Any, **kwargs: Any) -> None:
            self.script_sent = str(args[0]).upper() == "EVALSHA"
            await super().send_command(*args, **kwargs)

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            response = await super().read_response(*args, **kwargs)
            if self.script_sent and faults.script_reply_delay:
                await asyncio.sleep(faults.script_reply_delay)
            return response

    pool = redis.ConnectionPool(
        connection_class=FaultyConnection, host=server.host, port=server.port
    )
    return redis.Redis.from_pool(pool), faults


#: A client of the session server with faults to switch on, and its switches.
Faulty = tuple[redis.Redis, ClientFaults]


@pytest.fixture
async def faulty(server: RedisServer, tasks: Tasks) -> AsyncIterator[Faulty]:
    """A :func:`faulty_client`; after the test, its tasks end and its listener stops."""
    c, faults = faulty_client(server)
    try:
        yield c, faults
    finally:
        faults.connecting.set()
        await tasks.cancel_all()
        assert await listeners_gone(), "the listener went on after its waiter left"
        await c.aclose()


async def hold(c: redis.Redis, lock_name: str, **options: Any) -> AsyncLock:
    """Acquire ``lock_name`` through ``c`` (another client object: another "process")."""
    holder = AsyncLock(c, lock_name, **options)
    assert await holder.acquire(timeout=2.0)
    return holder


async def waiter_behind(
    holder_client: redis.Redis, c: redis.Redis, lock_name: str, tasks: Tasks, **acquire: Any
) -> tuple[AsyncLock, AsyncLock, asyncio.Task[bool]]:
    """A holder on ``holder_client``, and on ``c`` a slow-backoff lock a task is acquiring.

    Returns ``(holder, lock, waiter)``; ``acquire`` goes to ``lock.acquire``.
    """
    holder = await hold(holder_client, lock_name)
    lock = AsyncLock(c, lock_name, backoff=backoff.constant(LONG_STEP))
    return holder, lock, tasks.start(lock.acquire(**acquire))


# --- 1. a release wakes a waiter at once ---------------------------------------------------------


async def test_release_wakes_a_waiter_on_another_client(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A release wakes a waiter asleep in a 5 s backoff step: it holds within 1 s."""
    holder, lock, waiter = await waiter_behind(other_client, client, name, tasks)
    await asleep_on_notification(admin, lock, waiter)
    await holder.release()
    assert await done_within(waiter, WAKE_BOUND, "the notified waiter holds")
    assert await holds_on_server(lock)
    await lock.release()


async def test_without_notify_the_waiter_sleeps_its_step(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """With notify=False the same waiter does not get the lock within 1 s of the release."""
    holder = await hold(other_client, name)
    lock = AsyncLock(client, name, backoff=backoff.constant(LONG_STEP), notify=False)
    before = await lock_commands(admin)
    waiter = tasks.start(lock.acquire())
    await quiet(admin, since=before, at_least=1)  # its first attempt failed; it sleeps 5 s
    assert await numsub(admin, channel_of(lock)) == 0
    await holder.release()
    done, _ = await asyncio.wait({waiter}, timeout=WAKE_BOUND)
    assert not done, "a waiter without notifications was woken before its step"
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not await lock.locked()


# --- 2. an expiring holder sends no message ------------------------------------------------------


async def test_expired_holder_is_replaced_at_its_pttl(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A subscribed waiter with a 5 s step takes a lock left to expire when its lease ends."""
    ttl = 0.5
    holder = await hold(other_client, name, ttl=ttl, auto_renew=False)
    lease_start = time.monotonic()
    lock = AsyncLock(client, name, backoff=backoff.constant(LONG_STEP))
    waiter = tasks.start(lock.acquire())
    await subscribed(admin, lock)  # it waits on the notification path; no message will come
    assert await done_within(waiter, ttl + WAKE_BOUND, "the waiter holds after the lease")
    elapsed = time.monotonic() - lease_start
    assert ttl - 0.05 <= elapsed < ttl + 0.5, elapsed
    await lock.release()
    with pytest.raises(LockNotOwnedError):  # its lease ran out; the new key was not touched
        await holder.release()


# --- 3. broken notifications do not strand waiters -----------------------------------------------


async def test_waiter_polls_while_notifications_are_down(
    faulty: Faulty, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """With its pub/sub connection killed and reconnects stuck, a waiter still polls its way in."""
    step = 0.2
    c, faults = faulty
    before = set(await pubsub_clients(admin))
    holder = await hold(other_client, name)
    lock = AsyncLock(c, name, backoff=backoff.constant(step))
    waiter = tasks.start(lock.acquire())
    await subscribed(admin, lock)
    faults.connecting.clear()  # from now on the listener's reconnections hang
    [listener] = set(await pubsub_clients(admin)) - before
    assert await admin.client_kill_filter(_id=listener) == 1
    await asyncio.sleep(2 * step)  # the waiter polls meanwhile
    assert not waiter.done()
    assert await numsub(admin, channel_of(lock)) == 0
    await holder.release()  # nobody hears it
    # The listener's connection attempt hangs for seconds (its bound is 2 s): a waiter
    # that relied on the listener, even on its failures, would not be in within a step.
    assert await done_within(waiter, step + 0.5, "the polling waiter holds")
    assert await numsub(admin, channel_of(lock)) == 0, "a notification got through"
    await lock.release()


async def test_a_broken_connection_wakes_waiters_to_poll(
    faulty: Faulty, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """When the pub/sub connection breaks, a waiter asleep in a 5 s step tries again at once."""
    c, faults = faulty
    before = set(await pubsub_clients(admin))
    holder, lock, waiter = await waiter_behind(other_client, c, name, tasks)
    await asleep_on_notification(admin, lock, waiter)
    faults.connecting.clear()  # no reconnection (and no confirmation) comes to its rescue
    await admin.delete(lock.key)  # freed without a message: as if a release was missed
    [listener] = set(await pubsub_clients(admin)) - before
    assert await admin.client_kill_filter(_id=listener) == 1
    assert await done_within(waiter, WAKE_BOUND, "the waiter woken by the break holds")
    await lock.release()
    with pytest.raises(LockNotOwnedError):
        await holder.release()


async def test_listener_resubscribes_after_its_connection_is_killed(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """After CLIENT KILL the listener reconnects and resubscribes; a release wakes at once again."""
    before = await pubsub_clients(admin)
    holder, lock, waiter = await waiter_behind(other_client, client, name, tasks)
    await asleep_on_notification(admin, lock, waiter)
    [killed] = set(await pubsub_clients(admin)) - set(before)
    assert await admin.client_kill_filter(_id=killed) == 1
    assert await numsub(admin, channel_of(lock)) == 0

    await subscribed(admin, lock)  # by itself, while the waiter still waits
    [listener] = set(await pubsub_clients(admin)) - set(before)
    assert listener != killed
    await quiet(admin)
    assert not waiter.done()
    await holder.release()
    assert await done_within(waiter, WAKE_BOUND, "the waiter holds after the resubscription")
    await lock.release()


async def test_waiters_keep_working_across_a_server_restart(
    private_server: Callable[..., RedisServer], name: str, tasks: Tasks
) -> None:
    """A restart (no data kept) wakes the waiter, which takes the lock; notifications resume."""
    srv = private_server()
    # Clients made from host and port retry a command on a fresh connection (redis-py's
    # default Retry); from_url() ones do not, and their first command after the restart
    # would raise ConnectionError, which acquire() propagates as documented.
    mine = redis.Redis(host=srv.host, port=srv.port)
    theirs = redis.Redis(host=srv.host, port=srv.port)
    admin = redis.Redis(host=srv.host, port=srv.port, decode_responses=True)
    try:
        holder, lock, waiter = await waiter_behind(theirs, mine, name, tasks)
        await asleep_on_notification(admin, lock, waiter)
        srv.restart()  # the key is gone with the old process; no release message was sent
        assert await done_within(waiter, WAKE_BOUND, "the waiter holds after the restart")
        await lock.release()
        with pytest.raises(LockNotOwnedError):
            await holder.release()

        holder = await hold(theirs, name)
        waiter = tasks.start(lock.acquire())
        await asleep_on_notification(admin, lock, waiter)
        await holder.release()
        assert await done_within(waiter, WAKE_BOUND, "a notified waiter holds after the restart")
        await lock.release()
        await unsubscribed(admin, lock)
    finally:
        await tasks.cancel_all()
        for c in (mine, theirs, admin):
            await c.aclose()


# --- 4. local coalescing: only the head talks, one release wakes one ---------------------------


async def test_only_the_head_of_the_local_queue_polls(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """Ten local waiters polling every 50 ms send about as many attempts as one would.

    They poll (``notify=False``): notified waiters in the queue on the server
    send no attempt at all while they wait (``test_server_queue.py``).
    """
    step, window = 0.05, 0.5
    holder = await hold(other_client, name)
    probe = AsyncLock(client, name)

    async def take() -> None:
        async with AsyncLock(client, name, backoff=backoff.constant(step), notify=False):
            pass

    takers = [tasks.start(take()) for _ in range(10)]
    await waiting(probe, 10)
    before = await attempts(admin)
    await asyncio.sleep(window)
    sent = await attempts(admin) - before
    # One poller: about window / step = 10 attempts; ten pollers would send about 100.
    assert 3 <= sent <= 25, sent
    assert probe.statistics().tasks_waiting == 10
    await holder.release()
    for taker in takers:
        await done_within(taker, 2.0, "the local queue drains")


async def test_one_release_wakes_one_local_waiter(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A release lets one of ten local waiters in; the others go on waiting and send nothing."""
    holder = await hold(other_client, name)
    inside = 0
    most_inside = 0
    entered = 0
    leave = asyncio.Event()

    async def use() -> None:
        nonlocal inside, most_inside, entered
        async with AsyncLock(client, name, backoff=backoff.constant(LONG_STEP)):
            inside += 1
            entered += 1
            most_inside = max(most_inside, inside)
            await leave.wait()
            inside -= 1

    probe = AsyncLock(client, name)
    users = [tasks.start(use()) for _ in range(10)]
    await waiting(probe, 10)
    await asleep_on_notification(admin, probe, users[0])
    before = await attempts(admin)
    await holder.release()
    await eventually(lambda: entered == 1, "one local waiter holds", WAKE_BOUND)
    await asyncio.sleep(0.2)  # room for any wrongly woken waiter to show up
    assert entered == 1
    stats = probe.statistics()
    assert stats.held
    assert stats.tasks_waiting == 9
    # The head's one attempt (two at most); ten woken waiters would send ten or more.
    assert await attempts(admin) - before <= 2

    leave.set()
    for user in users:
        await done_within(user, 2.0, "the local queue drains")
    assert entered == 10
    assert most_inside == 1


async def test_a_local_run_yielding_to_a_lingering_listener_does_not_idle_the_lock(
    server: RedisServer, other_client: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A local run that yields to a listener that takes nothing still serves its next waiter.

    After LOCAL_RUN a releaser with local waiters lets other processes go first if
    any listens on the channel. A waiter that has just given up elsewhere still
    listens (its subscription lingers) but takes nothing: the next local waiter must
    not then sleep its whole 5 s step with the lock free, even when the release
    message reaches this process before the reply to the release does.
    """
    mine, faults = faulty_client(server)
    third = redis.Redis.from_url(server.url)
    try:
        holder = await hold(other_client, name)
        first = AsyncLock(mine, name, backoff=backoff.constant(LONG_STEP))
        second = AsyncLock(mine, name, backoff=backoff.constant(LONG_STEP))
        released: list[float] = []

        async def run_long() -> None:
            async with first:  # taken after a notification: this process listens too
                await asyncio.sleep(LOCAL_RUN + 0.03)
                faults.script_reply_delay = 0.03
            released.append(time.monotonic())

        async def take() -> float:
            async with second:
                return time.monotonic()

        runner = tasks.start(run_long())
        await waiting(first, 1)
        taker = tasks.start(take())
        await waiting(first, 2)
        gone = AsyncLock(third, name, backoff=backoff.constant(LONG_STEP))
        assert not await gone.acquire(timeout=0.2)  # gives up; its subscription lingers
        await holder.release()
        await done_within(runner, WAKE_BOUND, "the first local waiter's run")
        taken = await done_within(taker, WAKE_BOUND, "the next local waiter holds")
        assert taken - released[0] < WAKE_BOUND
    finally:
        await tasks.cancel_all()
        await third.aclose()
        await mine.aclose()


async def test_a_notify_false_lock_hands_over_despite_its_own_client_listening(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    tasks: Tasks,
) -> None:
    """Regression (review of the lease engine): the releaser's own listener is counted whatever its
    ``notify``: a ``notify=False`` lock hands over to its next local task, not yielding to
    a subscriber that is its own client (another lock object on the same key listens).
    """
    holder = await hold(other_client, name)
    listening = AsyncLock(client, name)  # notify=True: subscribes while it waits
    quiet = AsyncLock(client, name, notify=False)

    async def hold_a_while() -> None:
        async with listening:
            await asyncio.sleep(LOCAL_RUN + 0.02)  # the local run may yield from here on

    async def take() -> None:
        async with quiet:
            await asyncio.sleep(0.001)

    runner = tasks.start(hold_a_while())
    await waiting(listening, 1)
    takers = [tasks.start(take()), tasks.start(take())]
    await waiting(listening, 3)
    await admin.config_resetstat()
    await holder.release()
    await done_within(runner, WAKE_BOUND, "the listening lock's run")
    for taker in takers:
        await done_within(taker, WAKE_BOUND, "a quiet task's turn")
    # Publishes: the holder elsewhere's release, and the last quiet task's release. A
    # hand-over between the quiet tasks that yielded to this client's own listener would
    # have published (and deleted the key) once more.
    assert await calls(admin, "publish") == 2


# --- 5. FIFO among local waiters -----------------------------------------------------------------


async def test_local_waiters_behind_a_remote_holder_are_served_in_order(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """Six tasks queued one by one behind a holder on another client get the lock in order."""
    holder = await hold(other_client, name)
    probe = AsyncLock(client, name)
    order: list[int] = []

    async def take(i: int) -> None:
        async with AsyncLock(client, name, backoff=backoff.constant(LONG_STEP)):
            order.append(i)

    takers = []
    for i in range(6):
        takers.append(tasks.start(take(i)))
        await waiting(probe, i + 1)
    await subscribed(admin, probe)
    await holder.release()
    for taker in takers:
        await done_within(taker, 2.0, "the local queue drains")
    assert order == list(range(6))


# --- 6. one shared, reference-counted subscription -----------------------------------------------


async def test_one_shared_connection_subscribes_each_channel_once(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """Waiters on two names share one pub/sub connection; each channel is dropped when unused."""
    before = set(await pubsub_clients(admin))
    names = [name, f"{name}:b"]
    holders = [await hold(other_client, n) for n in names]
    probes = [AsyncLock(client, n) for n in names]

    async def take(lock_name: str) -> None:
        async with AsyncLock(client, lock_name, backoff=backoff.constant(LONG_STEP)):
            pass

    waiters = {n: [tasks.start(take(n)) for _ in range(3)] for n in names}
    for probe in probes:
        await waiting(probe, 3)
        await subscribed(admin, probe)  # 1, not 3: one subscription per channel and client
    new = {i: n for i, n in (await pubsub_clients(admin)).items() if i not in before}
    # One connection, both channels, and our process's grant channel of each.
    assert list(new.values()) == [4], new
    [listener] = new

    await holders[0].release()
    for waiter in waiters[names[0]]:
        await done_within(waiter, WAKE_BOUND, "the first name's waiters hold in turn")
    await unsubscribed(admin, probes[0])
    assert await numsub(admin, channel_of(probes[1])) == 1
    new = {i: n for i, n in (await pubsub_clients(admin)).items() if i not in before}
    assert new == {listener: 2}, new  # the same connection, one channel (and its grants) left

    await holders[1].release()
    for waiter in waiters[names[1]]:
        await done_within(waiter, WAKE_BOUND, "the second name's waiters hold in turn")
    await unsubscribed(admin, probes[1])

    async def closed() -> bool:
        return listener not in await pubsub_clients(admin)

    await eventually(closed, "the pub/sub connection closed", UNSUBSCRIBE_BOUND)
    assert await listeners_gone(UNSUBSCRIBE_BOUND)


async def test_a_channel_lingers_for_the_next_waiter(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A waiter that comes back within LINGER finds its channel still subscribed: no SUBSCRIBE."""
    lock = AsyncLock(client, name, backoff=backoff.constant(LONG_STEP))
    holder = await hold(other_client, name)
    waiter = tasks.start(lock.acquire())
    await asleep_on_notification(admin, lock, waiter)
    subscribes = await subscribe_calls(admin)
    await holder.release()
    assert await done_within(waiter, WAKE_BOUND, "the notified waiter holds")
    await lock.release()
    holder = await hold(other_client, name)  # at once: well within the linger
    before = await lock_commands(admin)
    waiter = tasks.start(lock.acquire())
    await quiet(admin, since=before, at_least=1)
    assert await numsub(admin, channel_of(lock)) == 1
    await holder.release()
    assert await done_within(waiter, WAKE_BOUND, "the second waiter holds")
    await lock.release()
    assert await subscribe_calls(admin) == subscribes
    await unsubscribed(admin, lock)


# --- 7. statistics() ------------------------------------------------------------------------------


async def test_statistics_describe_the_local_view(
    client: redis.Redis, other_client: redis.Redis, name: str, tasks: Tasks
) -> None:
    """statistics() gives held, owner and tasks_waiting per client, shared by its lock objects."""
    idle = LockStatistics(held=False, owner=None, tasks_waiting=0)
    lock = AsyncLock(client, name)
    twin = AsyncLock(client, name)  # same client and name: the same view
    theirs = AsyncLock(other_client, name)  # another client object: a view of its own
    assert lock.statistics() == idle

    assert await lock.acquire()
    me = asyncio.current_task()
    held = LockStatistics(held=True, owner=me, tasks_waiting=0)
    assert lock.statistics() == held
    assert twin.statistics() == held
    assert theirs.statistics() == idle

    remote = tasks.start(theirs.acquire())  # contends on the server
    await waiting(theirs, 1)
    assert theirs.statistics() == LockStatistics(held=False, owner=None, tasks_waiting=1)
    assert lock.statistics() == held
    remote.cancel()  # out of the way of the local hand-offs below
    with pytest.raises(asyncio.CancelledError):
        await remote
    assert theirs.statistics() == idle

    local = [tasks.start(twin.acquire()) for _ in range(2)]  # wait in the local queue
    await waiting(lock, 2)
    assert lock.statistics() == LockStatistics(held=True, owner=me, tasks_waiting=2)
    assert theirs.statistics() == idle

    await lock.release()  # the next local waiter takes it, as the view shows
    await done_within(local[0], WAKE_BOUND, "the next local waiter holds")
    # local[0]'s task ended with its acquire(): the holding goes on, detached, and
    # names no owner (aiolock keeps nothing of an ended task).
    assert twin.statistics() == LockStatistics(held=True, owner=None, tasks_waiting=1)
    await twin.release()  # a hand-off: ends local[0]'s holding
    await done_within(local[1], WAKE_BOUND, "the last local waiter holds")
    assert lock.statistics() == LockStatistics(held=True, owner=None, tasks_waiting=0)
    await twin.release()
    assert lock.statistics() == idle
    assert twin.statistics() == idle


async def test_statistics_is_synchronous_and_sends_nothing(server: RedisServer, name: str) -> None:
    """statistics() is a plain method that opens no connection and sends no command."""
    fresh = redis.Redis.from_url(server.url)
    try:
        lock = AsyncLock(fresh, name)
        assert not inspect.iscoroutinefunction(AsyncLock.statistics)
        stats = lock.statistics()
        assert isinstance(stats, LockStatistics)
        pool = fresh.connection_pool
        assert not pool._available_connections
        assert not pool._in_use_connections
    finally:
        await fresh.aclose()


# --- 8. cancelling a waiter asleep on a notification ---------------------------------------------


async def test_cancelled_notified_waiter_leaves_nothing(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A cancelled waiter asleep on a notification unsubscribes after LINGER and leaves no task."""
    holder, lock, waiter = await waiter_behind(other_client, client, name, tasks)
    await asleep_on_notification(admin, lock, waiter)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert lock.statistics() == LockStatistics(held=False, owner=None, tasks_waiting=0)
    await unsubscribed(admin, lock)
    assert await listeners_gone(UNSUBSCRIBE_BOUND)
    assert await holder.owned()
    await holder.release()


async def test_waiter_that_times_out_gives_its_subscription_back(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """A subscribed waiter that gives up at its timeout unsubscribes after LINGER; no task left."""
    holder, lock, waiter = await waiter_behind(other_client, client, name, tasks, timeout=0.5)
    await subscribed(admin, lock)
    assert await done_within(waiter, 0.5 + WAKE_BOUND, "the waiter gives up") is False
    assert lock.statistics() == LockStatistics(held=False, owner=None, tasks_waiting=0)
    # Nothing is published meanwhile (the holder still holds): the linger alone must end it.
    await unsubscribed(admin, lock)
    assert await listeners_gone(UNSUBSCRIBE_BOUND)
    await holder.release()


async def test_cancelled_head_hands_the_wait_to_the_next_local_waiter(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, tasks: Tasks
) -> None:
    """When the notified head is cancelled, the next local waiter takes over and is woken."""
    holder, lock, head = await waiter_behind(other_client, client, name, tasks)
    await waiting(lock, 1)
    second = tasks.start(lock.acquire())
    await waiting(lock, 2)
    await asleep_on_notification(admin, lock, head)
    head.cancel()
    with pytest.raises(asyncio.CancelledError):
        await head
    await waiting(lock, 1)
    await asleep_on_notification(admin, lock, second)
    await holder.release()
    assert await done_within(second, WAKE_BOUND, "the new head holds")
    assert lock.statistics() == LockStatistics(
        held=True, owner=None, tasks_waiting=0
    )  # (second ended: detached)
    await lock.release()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_channel_asked_for_again_while_its_unsubscribe_is_in_flight_stays_live(
    server: RedisServer,
    start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]],
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """20 re-contentions right after the channel was dropped: every hand-off within its bound.

    The listener drops a channel nobody waited on for LINGER and sends
    UNSUBSCRIBE; a waiter that subscribes again before that reply is back
    must keep its new channel. Here every pub/sub reply comes 0.1 s late
    (the proxy), and each round starts its waiter the moment the channel is
    dropped. The regression: the late reply was taken for "the server
    dropped it", the new channel forgotten, and its grant thrown away; the
    waiter learned of it at its next entry refresh (1.0-1.4 s), in 5 of 80
    hand-offs on a 20 ms link and 6 of 6 at this delay. The bound, 0.1 s and
    the link (0.25 s: a loopback round trip, and scheduling on two loaded
    cores), is a fifth of that.
    """
    if type(asyncio.get_running_loop()).__module__.startswith("uvloop"):
        pytest.skip("the listener's bookkeeping is the same on both loops: asyncio's only (30 s)")
    late = 0.1
    proxy = await start_proxy(server)
    proxy.delay_pubsub_replies(late)
    async with connected(proxy.url) as waiting:
        lock = AsyncLock(waiting, name, backoff=backoff.constant(LONG_STEP))
        holder = AsyncLock(other_client, name)
        channel = channel_of(lock).encode()
        took: list[float] = []
        for _ in range(20):
            assert await holder.acquire()
            await eventually(
                lambda: _dropped(waiting, channel), "the channel to be dropped", timeout=3.0
            )
            waiter = asyncio.create_task(lock.acquire())
            await eventually(lambda: _granted_channel_subscribed(admin, lock), "a subscription")
            released = time.monotonic()
            await holder.release()
            assert await asyncio.wait_for(waiter, 5.0)
            took.append(time.monotonic() - released)
            await lock.release()
    # The link: a loopback round trip, and room for scheduling on two loaded cores.
    link = 0.25
    slow = [round(t, 3) for t in took if t > late + link]
    assert not slow, f"hand-offs past {late} s + the link: {slow} (of {len(took)})"


async def _dropped(client: redis.Redis, channel: bytes) -> bool:
    """Whether ``client``'s listener no longer serves ``channel`` (it dropped it)."""
    return all(channel not in listener._channels for listener in listeners_of(client).values())


async def _granted_channel_subscribed(admin: redis.Redis, lock: AsyncLock) -> bool:
    """Whether the server has a subscriber on the grant channel of ``lock``'s process."""
    lease = lock._lease
    assert isinstance(lease, ServerLease)
    tag = grant_tag(lease.wire.client, channel_of(lock))
    return await numsub(admin, f"{channel_of(lock)}:{tag}") == 1
