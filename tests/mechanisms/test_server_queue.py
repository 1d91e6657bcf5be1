"""The queue on the server (docs/server-queue.md): order, grants, dead and cancelled waiters.

A waiter on another client object (another process) that must wait stands
in the lock's queue on the server; a release hands the lock straight to the
first live waiter, which a message wakes. These tests prove the order of
service (between client objects, between processes, and with ``fair=True``
between every task), the bound a SIGKILLed queued waiter puts on the next,
that giving up in every window leaves no entry and no key and never leaves
the lock held by nobody, that mixed default and fair locks never overlap,
and what one hand-off costs the server.
"""

from __future__ import annotations

import asyncio
import signal
import time

import anyio
import pytest
import redis.asyncio as redis
from support.checkout import start_python
from support.locks import all_keys, holds_on_server, keys_of
from support.servers import calls, wait_for_paused_client
from support.timing import eventually

from aiolock import AsyncLock, _queue, backoff
from aiolock._server_state import ENTRY_CAP, REFRESH_SHARE
from aiolock.testing import RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

#: Slack for timing bounds on 2 loaded cores.
SLACK = 0.3


async def queued(admin: redis.Redis, lock: AsyncLock) -> list[str]:
    """The tokens in ``lock``'s queue on the server, first first."""
    return [str(t) for t in await admin.lrange(keys_of(lock).queue, 0, -1)]


async def queue_length(admin: redis.Redis, lock: AsyncLock, length: int) -> bool:
    """Whether ``lock``'s queue holds ``length`` tokens."""
    return await admin.llen(keys_of(lock).queue) == length


async def test_waiters_on_separate_clients_are_served_in_the_order_they_queued(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Five client objects queue one after another; the releases serve them in that order.

    Each hand-off is a grant: the key goes from holder to heir without ever
    being free, so no waiter could take it out of turn.
    """
    holder = AsyncLock(client, name)
    assert await holder.acquire()
    clients = [redis.Redis.from_url(server.url) for _ in range(5)]
    served: list[int] = []

    async def wait_then_hold(index: int) -> None:
        async with AsyncLock(clients[index], name):
            served.append(index)
            await asyncio.sleep(0.005)

    tasks = []
    try:
        for index in (3, 0, 4, 1, 2):
            tasks.append(asyncio.create_task(wait_then_hold(index)))
            await eventually(lambda: queue_length(admin, holder, len(tasks)), "the waiter queued")
        await holder.release()
        with anyio.fail_after(5):
            await asyncio.gather(*tasks)
        assert served == [3, 0, 4, 1, 2]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.aclose()


WAITER_PROCESS = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import AsyncLock
async def main(url, name, me):
    client = redis.Redis.from_url(url)
    async with AsyncLock(client, name, fair=sys.argv[4] == "fair"):
        await client.rpush(name + ":served", me)
    await client.aclose()
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


@pytest.mark.parametrize("mode", ["default", "fair"])
async def test_waiters_in_separate_processes_are_served_in_queue_order(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str, mode: str
) -> None:
    """Four processes queue one after another; each takes the lock in its turn."""
    holder = AsyncLock(client, name)
    assert await holder.acquire()
    processes = []
    try:
        for me in ("p2", "p0", "p3", "p1"):
            processes.append(await start_python(WAITER_PROCESS, server.url, name, me, mode))
            await eventually(
                lambda: queue_length(admin, holder, len(processes)),
                "the process queued",
                timeout=10,
            )
        await holder.release()
        with anyio.fail_after(10):
            codes = [await p.wait() for p in processes]
        assert codes == [0, 0, 0, 0]
        assert await admin.lrange(f"{name}:served", 0, -1) == ["p2", "p0", "p3", "p1"]
    finally:
        for p in processes:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await admin.delete(f"{name}:served")


async def test_fair_serves_every_task_of_one_client_in_call_order(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """With fair=True each task queues on the server itself: call order across tasks.

    Tasks of one client alternate with tasks of another; they are served
    in the order they called ``acquire()``, not a local run first.
    """
    holder = AsyncLock(client, name, fair=True)
    assert await holder.acquire()
    served: list[int] = []

    async def wait_then_hold(index: int, c: redis.Redis) -> None:
        async with AsyncLock(c, name, fair=True):
            served.append(index)
            await asyncio.sleep(0.002)

    tasks = []
    try:
        for index in range(6):
            c = client if index % 2 == 0 else other_client
            tasks.append(asyncio.create_task(wait_then_hold(index, c)))
            await eventually(lambda: queue_length(admin, holder, len(tasks)), "the task queued")
        await holder.release()
        with anyio.fail_after(5):
            await asyncio.gather(*tasks)
        assert served == list(range(6))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_without_fair_one_client_runs_its_tasks_before_handing_to_the_queue(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default: only the first local task queues on the server; the others follow it locally.

    The other client's waiter, queued behind that first task, gets the lock
    after the local run. (LOCAL_RUN is 5 s here: on a loaded machine the
    other client's queueing could take longer than its 0.1 s, and the run
    would rightly yield to it first.)
    """
    monkeypatch.setattr(_queue, "LOCAL_RUN", 5.0)
    holder = AsyncLock(client, name)
    assert await holder.acquire()
    served: list[str] = []

    async def wait_then_hold(label: str, c: redis.Redis) -> None:
        async with AsyncLock(c, name):
            served.append(label)

    tasks = [asyncio.create_task(wait_then_hold("local-1", client))]
    try:
        # The holder's own client: its tasks wait locally behind the holder.
        tasks.append(asyncio.create_task(wait_then_hold("local-2", client)))
        tasks.append(asyncio.create_task(wait_then_hold("other", other_client)))
        await eventually(lambda: queue_length(admin, holder, 1), "the other client queued")
        await holder.release()
        with anyio.fail_after(5):
            await asyncio.gather(*tasks)
        assert served == ["local-1", "local-2", "other"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _end_dead_waiter_test(
    dead: asyncio.subprocess.Process, waiting: asyncio.Task[bool] | None, holder: AsyncLock
) -> None:
    """Kill the doomed (or stopped) process if alive, stop the next waiter, free the holder."""
    if dead.returncode is None:
        dead.kill()
        await dead.wait()
    if waiting is not None:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    if holder.statistics().held:
        await holder.release()


DEAD_WAITER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import AsyncLock
async def main(url, name, ttl):
    client = redis.Redis.from_url(url, client_name="doomed:" + name)
    lock = AsyncLock(client, name, ttl=float(ttl))
    await lock.acquire()
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


async def _gone_from_server(admin: redis.Redis, name: str) -> bool:
    """Whether the server has closed every connection of :data:`DEAD_WAITER` on ``name``."""
    return all(c.get("name") != f"doomed:{name}" for c in await admin.client_list())


@pytest.mark.parametrize("ttl", [10.0, 1.0])
async def test_a_sigkilled_queued_waiter_delays_the_next_by_its_entry_life_at_most(
    server: RedisServer,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    ttl: float,
) -> None:
    """A waiter killed at the head of the queue holds up the next by at most min(ttl, 2 s).

    The holder releases right after the kill: the dead waiter's entry is
    still alive, so it is granted the lock, for a first lease of one entry
    life only. Nobody listens on the dead process's grant channel any more,
    so the grant goes out on the lock's channel: the next waiter hears it
    and takes the lock as that first lease ends.

    The release waits until the server has closed the dead process's
    connections (``CLIENT LIST``): the bound holds from then. A release in
    the moment before (the server has not yet read the closed sockets; on a
    loaded machine that can take a while) tells the grant on the dead
    process's channel, and the next waiter learns of it when the lease it
    last saw ends (docs/failure-modes.md, "A queued waiter dies").
    """
    holder = AsyncLock(client, name, ttl=ttl)
    assert await holder.acquire()
    dead = await start_python(DEAD_WAITER, server.url, name, str(ttl))
    nxt = AsyncLock(other_client, name, ttl=ttl)
    waiting: asyncio.Task[bool] | None = None
    try:
        await eventually(lambda: queue_length(admin, holder, 1), "the doomed waiter queued", 10)
        waiting = asyncio.create_task(nxt.acquire(timeout=10))
        await eventually(lambda: queue_length(admin, holder, 2), "the next waiter queued")
        assert not await _gone_from_server(admin, name)
        dead.kill()
        await dead.wait()
        await eventually(lambda: _gone_from_server(admin, name), "the server saw the death")
        released = time.monotonic()
        await holder.release()
        with anyio.fail_after(10):
            assert await waiting
        delay = time.monotonic() - released
        assert delay <= min(ttl, ENTRY_CAP) + SLACK, f"the next waited {delay:.3f} s"
    finally:
        await _end_dead_waiter_test(dead, waiting, holder)
        if nxt.statistics().held:
            await nxt.release()


DEAD_CROWD = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import AsyncLock
async def main(url, name, count):
    client = redis.Redis.from_url(url)
    await asyncio.gather(
        *(AsyncLock(client, name, ttl=10.0, fair=True).acquire() for _ in range(int(count)))
    )
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


async def test_the_kept_waiters_of_a_sigkilled_process_are_passed_over_an_entry_life_later(
    server: RedisServer,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """20 waiters of one killed process: once its keeper's mark expired, none is granted.

    All but one of its entries name its keeper, whose mark it no longer
    sets: ENTRY_CAP after the kill they are dead (the one it refreshed
    itself too), and the release goes past all 20 to the next waiter at
    once, deleting their entries on its way.
    """
    holder = AsyncLock(client, name, ttl=10.0)
    assert await holder.acquire()
    dead = await start_python(DEAD_CROWD, server.url, name, "20")
    nxt = AsyncLock(other_client, name, ttl=10.0)
    waiting: asyncio.Task[bool] | None = None
    try:
        await eventually(lambda: queue_length(admin, holder, 20), "the doomed waiters queued", 10)
        queue = keys_of(holder).queue
        assert len(await admin.keys(f"{queue}:@*")) == 1, "their keeper's mark"
        waiting = asyncio.create_task(nxt.acquire(timeout=10))
        await eventually(lambda: queue_length(admin, holder, 21), "the next waiter queued")
        dead.kill()
        await dead.wait()
        await asyncio.sleep(ENTRY_CAP + 0.1)
        assert await admin.keys(f"{queue}:@*") == [], "the mark outlived its process"
        released = time.monotonic()
        await holder.release()
        with anyio.fail_after(5):
            assert await waiting
        delay = time.monotonic() - released
        assert delay <= SLACK, f"the next waited {delay:.3f} s: a dead waiter was granted"
        assert await admin.keys(all_keys(name)) == [nxt.key], "a dead waiter's entry was left"
        await nxt.release()
    finally:
        await _end_dead_waiter_test(dead, waiting, holder)


async def test_a_stopped_queued_waiter_delays_the_next_by_the_lease_it_last_saw_at_most(
    server: RedisServer,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """A waiter whose process is stopped (SIGSTOP) at the head of the queue: the bound is ttl.

    Its pub/sub connection stays open, so its grant goes to its own grant
    channel and no other process hears of it: the next waiter looks at the
    lock when the holder's lease it last saw ends (at most ``ttl`` after the
    release), and takes it once the stopped heir's first lease has run out.
    """
    ttl = 3.0
    holder = AsyncLock(client, name, ttl=ttl)
    assert await holder.acquire()
    stopped = await start_python(DEAD_WAITER, server.url, name, str(ttl))
    nxt = AsyncLock(other_client, name, ttl=ttl)
    waiting: asyncio.Task[bool] | None = None
    try:
        await eventually(lambda: queue_length(admin, holder, 1), "the stopped waiter queued", 10)
        waiting = asyncio.create_task(nxt.acquire(timeout=10))
        await eventually(lambda: queue_length(admin, holder, 2), "the next waiter queued")
        stopped.send_signal(signal.SIGSTOP)
        released = time.monotonic()
        await holder.release()
        with anyio.fail_after(10):
            assert await waiting
        delay = time.monotonic() - released
        # It was granted (the first lease ran out first), and the next looked in time.
        assert min(ttl, ENTRY_CAP) - SLACK <= delay <= ttl + SLACK, f"the next waited {delay:.3f} s"
        await nxt.release()
    finally:
        await _end_dead_waiter_test(stopped, waiting, holder)


async def test_a_grant_that_reaches_a_cancelled_waiter_goes_on_to_the_next(
    client: redis.Redis,
    other_client: redis.Redis,
    server: RedisServer,
    admin: redis.Redis,
    name: str,
) -> None:
    """The lock granted to a waiter that is cancelled before it knows goes to the next waiter.

    The first waiter polls (``notify=False``, a long step), so it has not
    seen its grant when it is cancelled: its leaving passes the lock on.
    Never is the lock left held by nobody.
    """
    third = redis.Redis.from_url(server.url)
    holder = AsyncLock(third, name)
    assert await holder.acquire()
    first = AsyncLock(client, name, notify=False, backoff=backoff.constant(30))
    second = AsyncLock(other_client, name)
    waiting_first = asyncio.create_task(first.acquire())
    waiting_second: asyncio.Task[bool] | None = None
    try:
        await eventually(lambda: queue_length(admin, holder, 1), "the first waiter queued")
        token_first = (await queued(admin, holder))[0]
        waiting_second = asyncio.create_task(second.acquire(timeout=5))
        await eventually(lambda: queue_length(admin, holder, 2), "the second waiter queued")
        await holder.release()
        assert await admin.get(holder.key) == token_first, "the release did not grant the first"
        waiting_first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting_first
        with anyio.fail_after(2):
            assert await waiting_second
        assert await holds_on_server(second)
        await second.release()
        assert await admin.keys(all_keys(name)) == []
    finally:
        for task in (waiting_first, waiting_second):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if holder.statistics().held:
            await holder.release()
        await third.aclose()


async def test_cancelled_during_a_refresh_leaves_no_entry(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A waiter cancelled while its refresh is held back by the server leaves nothing queued."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    # ttl 0.5 s: the entry lives 0.5 s and is refreshed every 0.35 s.
    waiter = AsyncLock(client, name, ttl=0.5, backoff=backoff.constant(30))
    waiting = asyncio.create_task(waiter.acquire())
    try:
        await eventually(lambda: queue_length(admin, holder, 1), "the waiter queued")
        await admin.config_resetstat()
        await eventually(lambda: _ran(admin, "pexpire"), "a refresh", timeout=2)
        await cancel_while_paused(admin, waiting)
        assert await queued(admin, holder) == []
        assert await admin.keys(f"{keys_of(holder).queue}:*") == []
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await holder.release()


async def cancel_while_paused(
    admin: redis.Redis, task: asyncio.Task[bool], *, paused: bool = False
) -> None:
    """Hold writes back (``CLIENT PAUSE WRITE``), cancel ``task`` once its command waits, resume.

    ``paused``: the pause was started already (before ``task`` sent anything).
    """
    if not paused:
        await admin.client_pause(3000, all=False)
    try:
        await wait_for_paused_client(admin)
        task.cancel()
    finally:
        await admin.client_unpause()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _ran(admin: redis.Redis, command: str) -> bool:
    return await calls(admin, command) > 0


async def test_a_fair_first_attempt_cancelled_in_flight_leaves_no_key_and_no_entry(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """fair=True attempts with the script first; cancelled while held back there: nothing left."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, fair=True)
    await admin.client_pause(3000, all=False)
    waiting = asyncio.create_task(waiter.acquire())
    await cancel_while_paused(admin, waiting, paused=True)
    assert await queued(admin, holder) == []
    await holder.release()
    assert await admin.keys(all_keys(name)) == []


async def test_a_restart_that_loses_the_queue_strands_no_waiter(
    private_server: object, name: str
) -> None:
    """The server restarts empty while waiters are queued: they notice and all get the lock.

    The holder's key and the whole queue are gone; each waiter finds its
    entry gone at its next refresh, and attempts again.
    """
    from collections.abc import Callable

    assert callable(private_server)
    start: Callable[..., RedisServer] = private_server
    srv = start()
    clients = [redis.Redis.from_url(srv.url) for _ in range(4)]
    admin = redis.Redis.from_url(srv.url, decode_responses=True)
    try:
        holder = AsyncLock(clients[0], name, ttl=10.0)
        assert await holder.acquire()
        got: list[int] = []

        async def wait_then_hold(index: int) -> None:
            lock = AsyncLock(clients[index], name, ttl=10.0)
            while True:  # as an application would: the restart breaks the connections
                try:
                    assert await lock.acquire(timeout=15)
                    break
                except redis.ConnectionError:
                    await asyncio.sleep(0.05)
            got.append(index)
            await lock.release()

        tasks = [asyncio.create_task(wait_then_hold(i)) for i in (1, 2, 3)]
        await eventually(lambda: queue_length(admin, holder, 3), "the waiters queued")
        srv.restart()
        started = time.monotonic()
        with anyio.fail_after(10):
            await asyncio.gather(*tasks)
        assert sorted(got) == [1, 2, 3]
        # Each waiter's refresh is due within 0.7 of its entry's life (2 s).
        assert time.monotonic() - started <= ENTRY_CAP + 1.0
        with pytest.raises(Exception):  # noqa: B017, PT011 - lost: the key is gone
            await holder.release()
        async with redis.Redis.from_url(srv.url) as after:
            assert await after.keys("*") == []
    finally:
        await admin.aclose()
        for c in clients:
            await c.aclose()


@pytest.mark.parametrize("waiters", [1, 2])
async def test_one_hand_off_between_clients_costs_the_server_twelve_commands(
    server: RedisServer,
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    waiters: int,
) -> None:
    """A release to a queued waiter, and the releaser queueing again: at most 12 commands.

    Counted by ``INFO commandstats``, the commands scripts run included: the
    release grants (EVALSHA, GET, LPOP, GETDEL, SET, PEXPIRE, PUBLISH: 7) and
    the releaser, which knows the lock is taken, queues with its script first
    (EVALSHA, PTTL, SET, RPUSH: 4, and a PEXPIRE when it makes the queue anew,
    as with one waiter). Nothing else is sent: the heir was woken by the
    message, and nobody polls. This is the steady state of clients that take
    turns (as in ``benchmarks.handoff``): each has waited before, so its
    subscription to the lock's channel is still there.
    """
    third = redis.Redis.from_url(server.url)
    a = AsyncLock(client, name)
    b = AsyncLock(other_client, name)
    c = AsyncLock(third, name)
    tasks: list[asyncio.Task[bool]] = []
    try:
        assert await b.acquire()
        tasks.append(asyncio.create_task(a.acquire()))
        await eventually(lambda: queue_length(admin, a, 1), "a queued")
        await asyncio.sleep(0.05)  # a's subscription is confirmed and settled
        await b.release()
        with anyio.fail_after(2):
            assert await tasks.pop()
        tasks.append(asyncio.create_task(b.acquire()))
        await eventually(lambda: queue_length(admin, a, 1), "b queued")
        if waiters == 2:
            tasks.append(asyncio.create_task(c.acquire()))
            await eventually(lambda: queue_length(admin, a, 2), "c queued")
        await asyncio.sleep(0.05)
        await admin.config_resetstat()
        started = time.monotonic()
        # The hand-off measured: a releases to b, and queues again at once.
        await a.release()
        again = asyncio.create_task(a.acquire())
        with anyio.fail_after(2):
            assert await tasks.pop(0)
        tasks.append(again)
        await eventually(lambda: queue_length(admin, a, waiters), "a queued again")
        stats = await admin.info("commandstats")
        took = time.monotonic() - started
        # Not the lock's: this test's own questions, and the handshake of a new connection
        # (by command: "config|resetstat" from Redis 7.0 on, "config" before).
        ours = {"config", "info", "llen", "client", "hello"}
        counted = {
            key.removeprefix("cmdstat_"): int(value["calls"])
            for key, value in stats.items()
            if key.removeprefix("cmdstat_").split("|")[0] not in ours
        }
        expected = 12 if waiters == 1 else 11
        # A waiter refreshes its entry once per REFRESH_SHARE of its life: a window that
        # lasted that long (a loaded machine) may hold a refresh of each (its PEXPIRE, or
        # its keeper's script and what that runs), which is no hand-off's cost.
        if took >= REFRESH_SHARE * ENTRY_CAP:
            assert expected <= sum(counted.values()) <= expected + 3 * waiters, (
                f"{took:.2f} s: {sorted(counted.items())}"
            )
        else:
            assert sum(counted.values()) == expected, sorted(counted.items())
        await b.release()
        for lock in (c, a) if waiters == 2 else (a,):
            with anyio.fail_after(2):
                assert await tasks.pop(0)
            await lock.release()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await third.aclose()


MIXED_WORKER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import AsyncLock
async def main(url, name, fair, seconds):
    client = redis.Redis.from_url(url)
    loop = asyncio.get_running_loop()
    end = loop.time() + float(seconds)
    overlaps = 0
    holdings = 0
    async def worker():
        nonlocal overlaps, holdings
        lock = AsyncLock(client, name, ttl=5.0, fair=fair == "fair")
        while loop.time() < end:
            async with lock:
                inside = await client.incr(name + ":inside")
                if inside != 1:
                    overlaps += 1
                await asyncio.sleep(0.001)
                await client.decr(name + ":inside")
                holdings += 1
    await asyncio.gather(*(worker() for _ in range(3)))
    print(holdings, overlaps)
    await client.aclose()
asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_default_and_fair_locks_mixed_on_one_name_never_overlap(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """Four processes, two default and two fair, three coroutines each, for 2 s: no overlap.

    The witness is a counter each holder increments on entry and decrements
    on exit; it must read 1 inside every holding.
    """
    processes = [
        await start_python(
            MIXED_WORKER, server.url, name, mode, "2", stdout=asyncio.subprocess.PIPE
        )
        for mode in ("default", "fair", "default", "fair")
    ]
    try:
        with anyio.fail_after(30):
            outputs = [await p.communicate() for p in processes]
        assert [p.returncode for p in processes] == [0, 0, 0, 0]
        results = [tuple(map(int, out.split())) for out, _ in outputs]
        assert all(overlaps == 0 for _, overlaps in results), results
        assert all(holdings > 0 for holdings, _ in results), results
    finally:
        for p in processes:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await admin.delete(f"{name}:inside")


async def test_a_grant_of_an_older_entry_is_not_taken_for_the_grant_of_the_current_one(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (found by the soak): a grant message names the entry it granted.

    A waiter that missed its grant (messages held back past the lease) and
    queued again must not take that old message, when it comes, for the
    grant of its new entry: it would believe it holds a lock held by
    another. Here the old message is published by hand: the waiter's token,
    with the number of an earlier attempt.
    """
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=5.0)
    waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
    try:
        await eventually(lambda: queue_length(admin, holder, 1), "the waiter queued")
        (token,) = await queued(admin, holder)
        entry = str(await admin.get(f"{keys_of(holder).queue}:{token}"))
        ms, number, tag = entry.split()
        assert int(number) > 1  # the bare SET was attempt 1; the script that queued, later
        # An older entry's grant, and one that names no entry at all (the format before
        # this fix, which the waiter took for its grant); on the waiter's grant channel
        # and on the lock's.
        channels = (f"{keys_of(holder).channel}:{tag}", keys_of(holder).channel)

        async def subscribed() -> bool:  # (queued first; its subscription may come after)
            counts = await admin.pubsub_numsub(*channels)
            return all(count >= 1 for _, count in counts)

        await eventually(subscribed, "the waiter subscribed to both channels")
        for stale in (f"g {token} {ms} 0 {int(number) - 1}", f"g {token} {ms} 0"):
            for channel in channels:
                assert await admin.publish(channel, stale) >= 1
        await asyncio.sleep(0.3)
        assert not waiting.done(), "the waiter took an old grant for its own"
        assert await holder.owned()  # the test's own task holds it
        await holder.release()
        with anyio.fail_after(2):
            assert await waiting
        assert await holds_on_server(waiter)
        await waiter.release()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        if holder.statistics().held:
            await holder.release()


async def test_a_grant_reaches_the_heirs_process_alone_unless_nobody_listens_there(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A grant goes out on the heir's grant channel, not on the lock's (no other process wakes).

    The heir's client connects unlike ``client`` (another name), so it has
    a listener, and a grant channel, of its own, as another process would.
    A grant to an entry whose grant channel nobody listens to (its process
    died) goes out on the lock's channel instead, where the next in line
    hears how long the dead heir's first lease runs.
    """
    holder = AsyncLock(client, name)
    assert await holder.acquire()
    heir_client = redis.Redis.from_url(server.url, client_name="heir")
    watcher = admin.pubsub()
    await watcher.subscribe(keys_of(holder).channel)
    heard: list[str] = []

    async def listen() -> None:
        async for message in watcher.listen():
            if message["type"] == "message":
                heard.append(message["data"])  # noqa: PERF401 - read while it runs

    listening = asyncio.create_task(listen())
    heir = AsyncLock(heir_client, name)
    waiting = asyncio.create_task(heir.acquire(timeout=5.0))
    try:
        await eventually(lambda: queue_length(admin, holder, 1), "the heir queued")
        (token,) = await queued(admin, holder)
        _, _, tag = str(await admin.get(f"{keys_of(holder).queue}:{token}")).split()
        grants = f"{keys_of(holder).channel}:{tag}"
        assert (await admin.pubsub_numsub(grants))[0][1] == 1
        await holder.release()
        with anyio.fail_after(2):
            assert await waiting
        await asyncio.sleep(0.1)
        assert heard == [], "a grant to a listening heir went out on the lock's channel"

        # An entry whose grant channel nobody listens to: the grant goes to everyone.
        dead = "0" * 32
        await admin.rpush(keys_of(holder).queue, dead)
        await admin.set(f"{keys_of(holder).queue}:{dead}", "2000 1 deadbeef", px=5000)
        await heir.release()
        await eventually(lambda: _heard(heard), "the grant went out on the lock's channel")
        assert heard == [f"g {dead} 2000 0 1"]
        assert await admin.get(keys_of(holder).lock) == dead
    finally:
        waiting.cancel()
        listening.cancel()
        await asyncio.gather(waiting, listening, return_exceptions=True)
        await watcher.aclose()  # type: ignore[no-untyped-call]
        await heir_client.aclose()
        await admin.delete(keys_of(holder).lock, keys_of(holder).queue)


async def _heard(heard: list[str]) -> bool:
    return bool(heard)


async def test_a_grant_to_a_waiter_that_does_not_renew_gives_it_its_whole_lease(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (review): with auto_renew=False a granted lock lasts ttl, not min(ttl, 2 s).

    A grant's first lease is one entry life because the heir renews it; a
    waiter that will not renew asks for its whole lease instead.
    """
    holder = AsyncLock(client, name)
    assert await holder.acquire()
    waiter = AsyncLock(other_client, name, ttl=5.0, auto_renew=False)
    waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
    await eventually(lambda: queue_length(admin, holder, 1), "the waiter queued")
    await holder.release()
    with anyio.fail_after(2):
        assert await waiting
    assert 4000 < await admin.pttl(keys_of(holder).lock) <= 5000
    await asyncio.sleep(2.3)  # past a first lease of one entry life (2 s)
    assert not waiter.lost
    assert await holds_on_server(waiter)
    await waiter.release()


async def test_a_fair_lock_tells_its_holding_and_its_waiters_in_statistics(
    client: redis.Redis, name: str
) -> None:
    """Regression (review): fair=True gives every call a queue of its own; statistics sees them."""
    lock = AsyncLock(client, name, fair=True)
    assert lock.statistics().held is False
    assert await lock.acquire()
    me = asyncio.current_task()
    other = AsyncLock(client, name, fair=True)
    waiting = asyncio.create_task(other.acquire(timeout=5.0))
    try:
        await eventually(lambda: _waits(lock, 1), "the other call waits")
        stats = lock.statistics()
        assert stats.held is True
        assert stats.owner is me
        await lock.release()
        with anyio.fail_after(2):
            assert await waiting
        assert lock.statistics().tasks_waiting == 0
        assert other.statistics().held is True
        await other.release()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        if lock.statistics().held:
            await lock.release()


async def _waits(lock: AsyncLock, count: int) -> bool:
    return lock.statistics().tasks_waiting == count
