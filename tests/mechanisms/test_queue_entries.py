"""Entries in the queue on the server: a waiter elsewhere is seen, and leaves nothing behind.

A waiter that must wait for a lock held elsewhere stands in the lock's queue
on the server (docs/server-queue.md): its token in the list ``<key>:queue`` and its
*entry* ``<key>:queue:<token>``, which lives ``min(ttl, ENTRY_CAP)`` and is
refreshed while the waiter lives. A process whose tasks take the lock in turn
hands it from task to task; after ``LOCAL_RUN`` it hands it to the queue's
first live waiter instead, whether that waiter is notified or polls.

These tests were the waiting marker's (the key the queue replaced): a poller
elsewhere was invisible to a local run and starved (found by the fault
suite), and a dead waiter's marker outlived it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis.asyncio as redis
from support.checkout import ROOT
from support.locks import all_keys, keys_of
from support.servers import calls
from support.timing import eventually

from aiolock import AsyncLock, backoff
from aiolock._keys import keys_for
from aiolock._queue import LOCAL_RUN
from aiolock._scripts import KEEP, KEEPER_MARK_MS, RELEASE
from aiolock._server_state import ENTRY_CAP
from aiolock.testing import RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

#: Slack for timing bounds on 2 loaded cores.
SLACK = 0.25


async def entries_of(admin: redis.Redis, lock: AsyncLock) -> list[str]:
    """The queue entries of ``lock``'s key on the server (their key names)."""
    return sorted(str(k) for k in await admin.keys(f"{keys_of(lock).queue}:*"))


async def queued(admin: redis.Redis, lock: AsyncLock) -> list[str]:
    """The tokens in ``lock``'s queue on the server, first first."""
    return [str(t) for t in await admin.lrange(keys_of(lock).queue, 0, -1)]


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

    The run hands the lock to the queue once it has lasted ``LOCAL_RUN``; the
    poller finds it granted at its next attempt. Without that the poller
    starves for the whole 2 s timeout.
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
    """A poller that gave up leaves the queue, and the run stops yielding to it.

    A grant to a waiter that gave up would idle the lock for its first lease;
    once the poller is gone the run hands over without pause again.
    """
    poller = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(0.3))
    assert await poller.acquire(timeout=2.0)
    await poller.release()
    # Now a poller that gives up at once: its entry goes as it leaves.
    quitter = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(0.3))
    if await quitter.acquire(timeout=0.01):  # the run may just have yielded
        await quitter.release()
    assert await entries_of(admin, quitter) == [], "the entry outlived its waiter"
    assert await queued(admin, quitter) == [], "the token outlived its waiter"
    before, since = run.holdings, time.monotonic()
    await asyncio.sleep(0.5)
    rate = (run.holdings - before) / (time.monotonic() - since)
    # Three tasks on one loop hand over in about a round trip: hundreds per second. A
    # run that went on granting to a ghost would idle up to ENTRY_CAP per LOCAL_RUN.
    assert rate > 100, f"{rate:.0f} holdings/s after the poller left"


async def test_a_waiter_stands_in_the_queue_and_leaves_it_with_the_lock(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """While a waiter waits, its token is queued and its entry lives at most one entry life.

    The waiter that gets the lock takes its entry out in the same script.
    """
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    step = 0.4
    waiter = AsyncLock(client, name, ttl=5.0, notify=False, backoff=backoff.constant(step))
    waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
    try:
        await eventually(lambda: entries_of(admin, waiter), "the entry is up")
        (entry,) = await entries_of(admin, waiter)
        pttl = await admin.pttl(entry)
        assert 0 < pttl <= ENTRY_CAP * 1000, pttl
        # (The entry's key is the queue's, ':', then the token, which has ':' in it.)
        assert await queued(admin, waiter) == [entry.removeprefix(f"{keys_of(waiter).queue}:")]
        await holder.release()
        assert await asyncio.wait_for(waiting, step + SLACK)
        assert await admin.keys(all_keys(name)) == [waiter.key], "the entry outlived the wait"
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
async def test_a_dead_waiters_entry_is_gone_within_two_seconds_whatever_its_step(
    server: RedisServer,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    notify: bool,
) -> None:
    """Regression: a waiter SIGKILLed in a 30 s step leaves its entry at most 2 s.

    Before the queue, its marker lived for the whole step (30 s), and a
    process handing the lock from task to task yielded to the dead waiter all
    that time.
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
        await eventually(lambda: entries_of(admin, holder), "the waiter's entry is up", timeout=10)
        (entry,) = await entries_of(admin, holder)
        assert await admin.pttl(entry) <= ENTRY_CAP * 1000, "the entry outlives ENTRY_CAP"
        waiter.kill()
        await waiter.wait()
        killed = time.monotonic()

        async def gone() -> bool:
            return await admin.exists(entry) == 0

        await eventually(gone, "the entry is gone", timeout=4)
        assert time.monotonic() - killed <= ENTRY_CAP + SLACK
    finally:
        if waiter.returncode is None:
            waiter.kill()
            await waiter.wait()
        await holder.release()


async def test_a_live_waiter_keeps_its_entry_without_waking(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A notified waiter refreshes its entry (max 2 s each) and attempts nothing more.

    Its backoff step (5 s) does not matter: it waits for its grant, and gets
    the lock at the release (a message). The holder does not renew (its lease
    outlasts the test), so every script counted is the waiter's: a renewal
    of the holder's, due 3.3 s after it acquired, fell in the window on a
    loaded machine.
    """
    holder = AsyncLock(other_client, name, ttl=10.0, auto_renew=False)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=10.0, backoff=backoff.constant(5.0))
    waiting = asyncio.create_task(waiter.acquire(timeout=10.0))
    try:
        await eventually(lambda: entries_of(admin, waiter), "the entry is up")
        (entry,) = await entries_of(admin, waiter)
        # Its subscription's confirmation may wake it for one more attempt at once.
        await asyncio.sleep(0.3)
        await admin.config_resetstat()
        for _ in range(6):  # 3 s: past an entry that was not refreshed
            await asyncio.sleep(0.5)
            pttl = await admin.pttl(entry)
            assert 0 < pttl <= ENTRY_CAP * 1000, pttl
        assert await calls(admin, "evalsha") == 0, "the waiter attempted again while queued"
        assert 1 <= await calls(admin, "pexpire") <= 3, "the entry was not refreshed as due"
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
async def test_short_pauses_send_nothing_but_attempts(
    server: RedisServer, other_client: redis.Redis, name: str, notify: bool
) -> None:
    """A queued waiter sends no refresh before one is due (0.7 of its entry's life).

    Regression (found with the waiting marker, before entries): a loop timer may fire a little
    early (uvloop counts whole milliseconds); the end of each 50 ms pause was
    taken for a pause going on, and the marker was set again (one ``SET`` per
    pause). A notified waiter does not poll at all: it attempts once (twice,
    if its subscription is confirmed after the first) and waits for its grant.
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
    # An EVALSHA the server did not know (NOSCRIPT: the script is loaded, then sent
    # again) is not an attempt.
    scripted = [
        c
        for c, then in zip(sent, [*sent[1:], ("",)], strict=True)
        if str(c[0]).upper() == "EVALSHA" and str(then[0]).upper() != "SCRIPT LOAD"
    ]
    if notify:
        # The bare SET, the script that queued it, maybe one more at the subscription's
        # confirmation, the last attempt at the deadline, and the script that leaves.
        assert 2 <= len(scripted) <= 4, f"{len(scripted)} scripts: the waiter polled"
    else:
        assert len(scripted) >= 5, "the waiter did not pause and try again"
    refreshes = [
        c for c in sent if str(c[0]).upper() == "PEXPIRE" or (c[0] == "SET" and "NX" not in c)
    ]
    assert refreshes == [], f"{len(refreshes)} refreshes in 0.6 s, none was due"


async def test_a_waiter_that_gives_up_at_its_deadline_leaves_the_queue(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A waiter with 0.2 s left stands in the queue until its deadline, then leaves it."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=5.0, notify=False, backoff=backoff.constant(5.0))
    waiting = asyncio.create_task(waiter.acquire(timeout=0.2))
    try:
        await eventually(lambda: entries_of(admin, waiter), "the entry is up")
        (entry,) = await entries_of(admin, waiter)
        assert 0 < await admin.pttl(entry) <= ENTRY_CAP * 1000
        assert not await waiting
        assert await entries_of(admin, waiter) == []
        assert await queued(admin, waiter) == []
    finally:
        await holder.release()


@pytest.mark.parametrize("fencing", [False, True])
@pytest.mark.parametrize("how", ["blocking=False", "timeout=0"])
async def test_an_attempt_that_will_not_wait_does_not_queue(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    fencing: bool,
    how: str,
) -> None:
    """Only a waiter queues: a single attempt that fails leaves nothing."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    try:
        lock = AsyncLock(client, name, fencing=fencing)
        got = await (
            lock.acquire(blocking=False) if how == "blocking=False" else lock.acquire(timeout=0)
        )
        assert not got
        assert await entries_of(admin, lock) == []
        assert await admin.exists(keys_of(lock).queue) == 0
    finally:
        await holder.release()
    if fencing:
        await admin.delete(keys_of(holder).fence)


@pytest.mark.parametrize("ending", ["timeout", "cancel", "anyio scope"])
async def test_a_waiter_that_gives_up_leaves_the_queue(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, ending: str
) -> None:
    """Timed out, cancelled or cut off by a cancel scope: the entry goes with the waiter.

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
            await eventually(lambda: entries_of(admin, waiter), "the entry is up")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        else:
            with anyio.move_on_after(0.3):
                await waiter.acquire()
        assert await entries_of(admin, waiter) == [], f"the entry outlived the {ending}"
        assert await queued(admin, waiter) == [], f"the token outlived the {ending}"
    finally:
        await holder.release()


async def test_a_leaving_waiter_takes_out_only_its_own_entry(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    server: RedisServer,
    name: str,
) -> None:
    """Two waiters on two clients: the first one leaving leaves the second in the queue."""
    third = redis.Redis.from_url(server.url)
    holder = AsyncLock(third, name, ttl=5.0)
    assert await holder.acquire()
    first = AsyncLock(client, name, ttl=5.0, notify=False, backoff=backoff.constant(5.0))
    second = AsyncLock(other_client, name, ttl=5.0, notify=False, backoff=backoff.constant(5.0))
    leaving = asyncio.create_task(first.acquire())
    staying: asyncio.Task[bool] | None = None
    try:
        await eventually(lambda: queued(admin, first), "the first waiter queued")
        staying = asyncio.create_task(second.acquire(timeout=5.0))
        await eventually(
            lambda: _length(admin, first, 2), "the second waiter queued behind the first"
        )
        seconds = (await queued(admin, first))[1]
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert await queued(admin, first) == [seconds], "a leaving waiter took another's place"
        assert len(await entries_of(admin, first)) == 1
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


async def _length(admin: redis.Redis, lock: AsyncLock, length: int) -> bool:
    return len(await queued(admin, lock)) == length


# --- kept entries, script by script -------------------------------------------------------------


async def test_keep_deletes_extends_and_looks_in_one_call(admin: redis.Redis, name: str) -> None:
    """KEEP sets the keeper's mark, deletes ended calls' entries, extends and looks at the rest."""
    keys = keys_for(name)
    for token in ("ended", "old", "young"):
        await admin.set(keys.entry(token), "2000 1 tag k1", px=30_000)
    named, args = KEEP.call(
        queue=keys.queue,
        keeper="k1",
        drop=1,
        extend=1,
        life=45_000,
        tokens=["ended", "old", "young", "missing"],
    )
    found = await admin.eval(KEEP.text, len(named), *named, *args)
    assert found == [1, 1, 0], "old: extended; young: there; missing: gone"
    assert not await admin.exists(keys.entry("ended"))
    assert 30_000 < await admin.pttl(keys.entry("old")) <= 45_000
    assert 0 < await admin.pttl(keys.entry("young")) <= 30_000, "only looked at"
    assert 0 < await admin.pttl(keys.mark("k1")) <= KEEPER_MARK_MS
    await admin.delete(keys.entry("old"), keys.entry("young"), keys.mark("k1"))


@pytest.mark.parametrize("marked", [True, False])
async def test_a_release_passes_over_kept_entries_whose_mark_is_gone(
    admin: redis.Redis, name: str, marked: bool
) -> None:
    """A kept entry is alive while its keeper's mark is: else the grant skips and deletes it.

    The queue holds a kept waiter, then a waiter that refreshes its own
    entry; the holder releases. With the mark, the kept one is granted;
    without, the second is, and the first's entry is gone.
    """
    keys = keys_for(name)
    await admin.set(keys.lock, "holder", px=10_000)
    await admin.rpush(keys.queue, "kept", "own")
    await admin.set(keys.entry("kept"), "2000 1 tag k1", px=30_000)
    await admin.set(keys.entry("own"), "2000 1 tag", px=2000)
    if marked:
        await admin.set(keys.mark("k1"), "1", px=2000)
    holder = "holder"
    named, args = RELEASE.call(
        lock=keys.lock,
        queue=keys.queue,
        fence=keys.fence,
        token=holder,
        channel=keys.channel,
        sharded="0",
    )
    released = await admin.eval(RELEASE.text, len(named), *named, *args)
    assert released == 2, "handed to a waiter"
    heir, skipped = ("kept", "own") if marked else ("own", "kept")
    assert await admin.get(keys.lock) == heir
    assert 0 < await admin.pttl(keys.lock) <= 2000, "a grant's first lease: one entry life"
    assert not await admin.exists(keys.entry(heir))
    if marked:
        assert await admin.lrange(keys.queue, 0, -1) == [skipped]
    else:
        assert await admin.lrange(keys.queue, 0, -1) == []
        assert not await admin.exists(keys.entry(skipped)), "a dead kept entry was left"
    await admin.delete(keys.lock, keys.queue, keys.entry("own"), keys.mark("k1"))
