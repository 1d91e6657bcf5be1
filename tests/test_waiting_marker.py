"""The waiting marker: a local run of hand-overs sees waiters elsewhere that poll.

A process whose tasks take a lock in turn hands it from task to task without
a pause (one script per hand-over). After ``LOCAL_RUN`` it must let waiters
in other processes go first. Notified waiters are seen on the release channel
(``PUBSUB NUMSUB``); waiters that poll (``notify=False``, or a pub/sub
connection that is cut) raise the lock's waiting marker, ``<key>:waiting``,
for as long as they mean to pause plus ``MARK_SLACK``. The yielding process
then waits until the poller's announced next attempt (at most ``YIELD_CAP``).

Regression tests for a defect the fault suite found: such a poller was
invisible to the local run and starved for as long as the run went on.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from support import all_keys, calls, eventually, keys_of

from aiolock import AsyncLock, backoff
from aiolock._queue import LOCAL_RUN, MARK_CAP, MARK_SLACK, YIELD_CAP, YIELD_WAIT, yield_wait
from aiolock.testing import RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

#: Slack for timing bounds on 2 loaded cores.
SLACK = 0.25

ROOT = Path(__file__).resolve().parent.parent


def marker_of(lock: AsyncLock) -> str:
    """The key of ``lock``'s waiting marker."""
    return keys_of(lock).marker


class Run:
    """Three tasks of one process that take a lock in turn, without pause, until stopped."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.stop = False
        self.holdings = 0
        self._tasks = [asyncio.create_task(self._take_turns(client, name)) for _ in range(3)]

    async def _take_turns(self, client: redis.Redis, name: str) -> None:
        lock = AsyncLock(client, name, ttl=5.0)
        while not self.stop:
            async with lock:
                self.holdings += 1
                await asyncio.sleep(0.001)

    async def aclose(self) -> None:
        """Stop the tasks (they finish their turn) and wait for them."""
        self.stop = True
        done, pending = await asyncio.wait(self._tasks, timeout=5.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        assert not pending, "a task of the run did not stop"
        for task in done:
            task.result()


@pytest.fixture
async def run(client: redis.Redis, name: str) -> AsyncIterator[Run]:
    """A local run on ``client`` (the other process is ``other_client``)."""
    started = Run(client, name)
    await asyncio.sleep(0.05)
    yield started
    await started.aclose()


@pytest.mark.parametrize("step", [0.02, 0.1, 0.3])
async def test_a_polling_waiter_elsewhere_gets_in_from_a_local_run(
    run: Run, other_client: redis.Redis, name: str, step: float
) -> None:
    """A ``notify=False`` waiter elsewhere gets the lock within a run and one of its pauses.

    The run yields once it has lasted ``LOCAL_RUN`` and sees the marker; the
    next local task then waits until the poller's next attempt. Without the
    marker the poller starves for the whole 2 s timeout.
    """
    poller = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(step))
    started = time.monotonic()
    got_it = await poller.acquire(timeout=2.0)
    waited = time.monotonic() - started
    if got_it:
        await poller.release()
    assert got_it, f"the polling waiter (step {step} s) did not get the lock in 2 s"
    # One run, then at most two of the poller's pauses (it may just miss the yield),
    # each within the wait the run grants it.
    bound = LOCAL_RUN + 2 * (step + SLACK)
    assert waited <= bound, f"the poller waited {waited:.3f} s (step {step} s, bound {bound} s)"
    holdings = run.holdings
    await asyncio.sleep(0.1)
    assert run.holdings > holdings, "the run did not go on after the poller"


async def test_the_run_goes_on_when_the_poller_gives_up(
    run: Run, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A poller that gave up takes its marker down, and the run stops yielding to it.

    While the marker is up, every yield idles the lock up to the poller's next
    attempt; once the poller is gone the run hands over without pause again.
    """
    poller = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(0.3))
    assert await poller.acquire(timeout=2.0)
    await poller.release()
    # Now a poller that gives up at once: its marker comes down as it leaves.
    quitter = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(0.3))
    if await quitter.acquire(timeout=0.01):  # the run may just have yielded
        await quitter.release()
    assert await admin.exists(marker_of(quitter)) == 0, "the marker outlived its waiter"
    before, since = run.holdings, time.monotonic()
    await asyncio.sleep(0.5)
    rate = (run.holdings - before) / (time.monotonic() - since)
    # Three tasks on one loop hand over in about a round trip: hundreds per second. A
    # run that went on yielding to a ghost would idle up to YIELD_CAP per LOCAL_RUN.
    assert rate > 100, f"{rate:.0f} holdings/s after the poller left"


async def test_a_waiter_raises_the_marker_for_its_pause_and_takes_it_down_with_the_lock(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """While a waiter pauses its marker is up, lasting its pause plus ``MARK_SLACK``.

    The waiter that gets the lock deletes its marker in the same script.
    """
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    step = 0.4
    waiter = AsyncLock(client, name, ttl=5.0, notify=False, backoff=backoff.constant(step))
    waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
    try:
        await eventually(lambda: admin.exists(marker_of(waiter)), "the marker is up")
        pttl = await admin.pttl(marker_of(waiter))
        assert 0 < pttl <= (step + MARK_SLACK) * 1000 + 1, pttl
        assert pttl > MARK_SLACK * 1000, f"the marker ends before the waiter's next attempt: {pttl}"
        await holder.release()
        assert await asyncio.wait_for(waiting, step + SLACK)
        assert await admin.keys(all_keys(name)) == [waiter.key], "the marker outlived the wait"
    finally:
        waiting.cancel()
        if waiter.statistics().held:
            await waiter.release()
        if holder.statistics().held:
            await holder.release()


DEAD_WAITER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import AsyncLock, backoff
async def main(url, name):
    lock = AsyncLock(redis.Redis.from_url(url), name, ttl=10.0, backoff=backoff.constant(30))
    await lock.acquire()
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize("notify", [True, False])
async def test_a_dead_waiters_marker_is_gone_within_two_seconds_whatever_its_step(
    server: RedisServer,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    notify: bool,
) -> None:
    """Regression (issue 17): a waiter SIGKILLed in a 30 s step leaves its marker at most 2 s.

    Before, the marker lived for the whole step (30 s), and a process handing
    the lock from task to task yielded to the dead waiter all that time.
    """
    holder = AsyncLock(other_client, name, ttl=10.0)
    assert await holder.acquire()
    waiter = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DEAD_WAITER.replace("backoff.constant(30)", f"backoff.constant(30), notify={notify}"),
        server.url,
        name,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        marker = keys_of(holder).marker
        await eventually(lambda: admin.exists(marker), "the waiter's marker is up", timeout=10)
        assert await admin.pttl(marker) <= MARK_CAP * 1000, "the marker outlives MARK_CAP"
        waiter.kill()
        await waiter.wait()
        killed = time.monotonic()

        async def gone() -> bool:
            return await admin.exists(marker) == 0

        await eventually(gone, "the marker is gone", timeout=4)
        assert time.monotonic() - killed <= MARK_CAP + SLACK
    finally:
        if waiter.returncode is None:
            waiter.kill()
            await waiter.wait()
        await holder.release()


async def test_a_live_waiter_with_a_long_step_keeps_its_marker_without_waking(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Issue 17: a waiter pausing 5 s sets its marker again (max 2 s each) and tries nothing more.

    It still gets the lock at the release (a notification).
    """
    holder = AsyncLock(other_client, name, ttl=10.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=10.0, backoff=backoff.constant(5.0))
    waiting = asyncio.create_task(waiter.acquire(timeout=10.0))
    try:
        marker = marker_of(waiter)
        await eventually(lambda: admin.exists(marker), "the marker is up")
        # Its subscription's confirmation wakes it for one more attempt at once; then
        # it pauses for its 5 s step.
        await asyncio.sleep(0.3)
        await admin.config_resetstat()
        for _ in range(6):  # 3 s: past a marker that was not set again
            await asyncio.sleep(0.5)
            pttl = await admin.pttl(marker)
            assert 0 < pttl <= MARK_CAP * 1000, pttl
        assert await calls(admin, "evalsha") == 0, "the waiter tried again before its step"
        released = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(waiting, 5.0)
        assert time.monotonic() - released < 1.0
        await waiter.release()
        assert await admin.keys(all_keys(name)) == []
    finally:
        waiting.cancel()
        if holder.statistics().held:
            await holder.release()


@pytest.mark.parametrize("notify", [True, False])
async def test_short_pauses_set_no_marker_of_their_own(
    server: RedisServer, other_client: redis.Redis, name: str, notify: bool
) -> None:
    """A pause shorter than the marker's life sends nothing: the attempt raised the marker.

    Regression (issue 17): a loop timer may fire a little early (uvloop
    counts whole milliseconds); the end of each 50 ms pause was then taken
    for a pause going on, and the marker was set again (one ``SET`` per
    pause). Cut off at the pause's end, that ``SET`` also cost the
    connection, and with it the next attempt's round trips.
    """
    sent: list[tuple[Any, ...]] = []

    class Recording(redis.Connection):
        def pack_command(self, *args: Any) -> Any:
            sent.append(args)
            return super().pack_command(*args)

    holder = AsyncLock(other_client, name, ttl=10.0)
    assert await holder.acquire()
    pool = redis.ConnectionPool(connection_class=Recording, host=server.host, port=server.port)
    async with redis.Redis.from_pool(pool) as recorded:
        waiter = AsyncLock(recorded, name, ttl=10.0, backoff=backoff.constant(0.05), notify=notify)
        assert await waiter.acquire(timeout=0.6) is False
    await holder.release()
    marker = marker_of(waiter)
    scripted = [c for c in sent if str(c[0]).upper() == "EVALSHA"]
    assert len(scripted) >= 5, "the waiter did not pause and try again"
    marks = [c for c in sent if str(c[0]).upper() == "SET" and marker in map(str, c)]
    assert marks == [], f"{len(marks)} pauses of {len(scripted)} set the marker again"


async def test_a_marker_never_outlasts_the_waiters_timeout_by_more_than_the_slack(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A waiter with 0.2 s left announces no pause beyond its deadline."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=5.0, notify=False, backoff=backoff.constant(5.0))
    waiting = asyncio.create_task(waiter.acquire(timeout=0.2))
    try:
        await eventually(lambda: admin.exists(marker_of(waiter)), "the marker is up")
        pttl = await admin.pttl(marker_of(waiter))
        assert 0 < pttl <= (0.2 + MARK_SLACK) * 1000 + 1, pttl
        assert not await waiting
    finally:
        await holder.release()


@pytest.mark.parametrize("fencing", [False, True])
@pytest.mark.parametrize("how", ["blocking=False", "timeout=0"])
async def test_an_attempt_that_will_not_wait_raises_no_marker(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    fencing: bool,
    how: str,
) -> None:
    """Only a waiter raises the marker: a single attempt that fails leaves nothing."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    try:
        lock = AsyncLock(client, name, fencing=fencing)
        got = await (
            lock.acquire(blocking=False) if how == "blocking=False" else lock.acquire(timeout=0)
        )
        assert not got
        assert await admin.exists(marker_of(lock)) == 0
    finally:
        await holder.release()
    if fencing:
        await admin.delete(keys_of(holder).fence)


@pytest.mark.parametrize("ending", ["timeout", "cancel", "anyio scope"])
async def test_a_waiter_that_gives_up_takes_its_marker_down(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, ending: str
) -> None:
    """Timed out, cancelled or cut off by a cancel scope: the marker goes with the waiter.

    (``no_leaks`` checks that no key of the lock is left.)
    """
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=5.0, backoff=backoff.constant(0.05))
    try:
        if ending == "timeout":
            assert not await waiter.acquire(timeout=0.3)
        elif ending == "cancel":
            waiting = asyncio.create_task(waiter.acquire())
            await eventually(lambda: admin.exists(marker_of(waiter)), "the marker is up")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        else:
            with anyio.move_on_after(0.3):
                await waiter.acquire()
        assert await admin.exists(marker_of(waiter)) == 0, f"the marker outlived the {ending}"
    finally:
        await holder.release()


async def test_another_waiters_marker_is_left_up(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    server: RedisServer,
    name: str,
) -> None:
    """A waiter deletes the marker only if it was the last to raise it.

    Two pollers on two clients: the first one leaving must not take down the
    marker the second raised after it.
    """
    third = redis.Redis.from_url(server.url)
    holder = AsyncLock(third, name, ttl=5.0)
    assert await holder.acquire()
    first = AsyncLock(client, name, ttl=5.0, notify=False, backoff=backoff.constant(5.0))
    second = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(5.0))
    leaving = asyncio.create_task(first.acquire())
    staying: asyncio.Task[bool] | None = None
    try:
        marker = marker_of(first)
        await eventually(lambda: admin.exists(marker), "the first marker is up")
        firsts = await admin.get(marker)
        staying = asyncio.create_task(second.acquire(timeout=5.0))
        await eventually(
            lambda: _changed(admin, marker, firsts), "the second waiter raised the marker"
        )
        seconds = await admin.get(marker)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert await admin.get(marker) == seconds, "a leaving waiter took another's marker"
        await holder.release()
        assert await staying
        await second.release()
    finally:
        for task in (leaving, staying):
            if task is not None:
                task.cancel()
        if holder.statistics().held:
            await holder.release()
        await third.aclose()


async def _changed(admin: redis.Redis, key: str, before: object) -> bool:
    value = await admin.get(key)
    return value is not None and value != before


def test_the_yield_wait_follows_the_marker_within_its_bounds() -> None:
    """No marker: the short wait for notified waiters; with one, the poller's next attempt."""
    assert yield_wait(-2) == YIELD_WAIT
    assert yield_wait(-1) == YIELD_WAIT
    # A marker about to lapse: the poller is late already; try soon.
    assert yield_wait(0) == YIELD_WAIT
    assert yield_wait(int(MARK_SLACK * 1000)) == pytest.approx(0.02)
    assert yield_wait(int((MARK_SLACK + 0.1) * 1000)) == pytest.approx(0.12)
    assert yield_wait(int((MARK_SLACK + 10) * 1000)) == YIELD_CAP
