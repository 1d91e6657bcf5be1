"""Renewal and loss (docs/design.md, Renewal; the Expiry paragraph of AsyncLock).

A live holder keeps its lock by renewal; a dead or stalled one loses it after
its lease; the holder learns of the loss (``lost``, ``on_lost``,
``cancel_on_lost``, ``LockLostError`` on exit) no later than the lease end,
and leaving ``async with`` after a loss needs no server. All against real
servers: the session server, private servers (paused, restarted) and a TCP
fault proxy.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as redis
from support.checkout import ROOT
from support.leaks import in_use_connections, other_tasks
from support.locks import CALLBACK_KINDS, LossRecorder
from support.servers import Own
from support.timing import Answers

from aiolock import AsyncLock, LockError, LockLostError, LockNotOwnedError
from aiolock._scripts import RELEASE
from aiolock.testing import FaultProxy, RedisServer

#: Scheduling slack for timing bounds (2 cores, two loop flavours, a busy suite).
SLACK = 0.1
#: How long leaving ``async with`` may take when it must not talk to the server.
PROMPT_EXIT = 0.05


# --- helpers -------------------------------------------------------------------------------------


def _renewal_tasks() -> list[asyncio.Task[Any]]:
    """The live watchdog tasks of this loop (aiolock names them "aiolock renewal of ...")."""
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("aiolock renewal") and not t.done()
    ]


async def _wait_for_renewal(
    adm: redis.Redis, key: str, timeout: float = 2.0, *, via: FaultProxy | None = None
) -> tuple[float, float]:
    """Poll the key's PTTL until it goes up: a renewal reached the server.

    Returns ``(before, after)``: the server ran the renewal after the poll sent
    at ``before`` and before the reply to the poll received at ``after``.

    With ``via`` (the proxy the holder talks through), also wait until the proxy
    has passed on a reply since ``before``, so the holder is sure to learn that
    the renewal worked even if the proxy turns into a black hole right after.
    """
    deadline = time.monotonic() + timeout
    before = time.monotonic()
    forwarded = via.replies_forwarded if via is not None else 0
    last = await adm.pttl(key)
    assert last > 0, f"the key {key!r} is not held with a lease (PTTL {last})"
    while time.monotonic() < deadline:
        await asyncio.sleep(0.002)
        sent = time.monotonic()
        mark = via.replies_forwarded if via is not None else 0
        now = await adm.pttl(key)
        if now > last:
            after = time.monotonic()
            while via is not None and via.replies_forwarded <= forwarded:
                assert time.monotonic() < deadline, "the renewal's reply never left the proxy"
                await asyncio.sleep(0.001)
            return before, after
        assert now > 0, f"the key {key!r} expired instead of being renewed (PTTL {now})"
        before, last, forwarded = sent, now, mark
    raise AssertionError(f"no renewal of {key!r} reached the server within {timeout} s")


async def _wait_until_gone(adm: redis.Redis, key: str, timeout: float = 1.0) -> float:
    """Wait until the server no longer has ``key``; return when that was seen."""
    deadline = time.monotonic() + timeout
    while await adm.exists(key):
        assert time.monotonic() < deadline, f"{key!r} still exists after {timeout} s"
        await asyncio.sleep(0.002)
    return time.monotonic()


def watched(
    c: redis.Redis, lock_name: str, kind: str = "function", **options: Any
) -> tuple[AsyncLock, LossRecorder]:
    """A lock on ``c`` whose ``on_lost`` callback (of ``kind``) records its losses."""
    losses = LossRecorder()
    return AsyncLock(c, lock_name, on_lost=losses.callback(kind), **options), losses


def _is_lost(lock: AsyncLock) -> bool:
    """``lock.lost``, read through a call so type checkers do not narrow it across awaits."""
    return lock.lost


@dataclass
class Outcome:
    """How leaving ``async with`` went: the exception it raised and how long the exit took."""

    error: BaseException | None
    exit_took: float


async def hold(lock: AsyncLock, body: Callable[[], Awaitable[None]]) -> Outcome:
    """Run ``async with lock: await body()`` and report the exception and the exit time.

    An AssertionError of the body propagates, so that a failed check is not
    mistaken for the outcome under test.
    """
    body_done = math.nan
    try:
        async with lock:
            await body()
            body_done = time.monotonic()
    except AssertionError:
        raise
    except Exception as exc:
        return Outcome(exc, time.monotonic() - body_done)
    return Outcome(None, time.monotonic() - body_done)


# --- 1. a live holder keeps the lock; without renewal the lease runs out -----------------------


async def test_without_auto_renew_lease_runs_out_and_exit_needs_no_server(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """auto_renew=False: lost at the lease end, the key expires, exit raises without the server."""
    c = proxied
    lock, losses = watched(c, name, ttl=0.3, auto_renew=False)
    lost_at: list[float] = []

    async def body() -> None:
        acquired = time.monotonic()
        assert await admin.pttl(lock.key) > 200
        assert not _is_lost(lock)
        lost_at.append(await losses.wait(timeout=1.0))
        assert _is_lost(lock)
        # Not before the lease end, and not much after it.
        assert lost_at[0] >= before_acquire + 0.3
        assert lost_at[0] <= acquired + 0.3 + SLACK
        # Nobody renewed: the server expires the key (about now).
        assert await admin.pttl(lock.key) <= 50
        await _wait_until_gone(admin, lock.key, timeout=0.5)
        proxy.black_hole()  # from here on the server is unreachable for the lock

    before_acquire = time.monotonic()
    outcome = await hold(lock, body)
    assert isinstance(outcome.error, LockLostError), outcome.error
    assert outcome.exit_took < PROMPT_EXIT, f"leaving took {outcome.exit_took:.3f} s"
    assert _is_lost(lock)
    assert losses.calls == [(lock, lost_at[0])]
    assert in_use_connections(c) == 0


# --- 2. a dead holder frees the lock after its lease ----------------------------------------------

_CHILD = """
import asyncio
import sys

import redis.asyncio as redis

from aiolock import AsyncLock


async def main() -> None:
    client = redis.Redis.from_url(sys.argv[1])
    lock = AsyncLock(client, sys.argv[2], ttl=1.0)
    assert await lock.acquire(timeout=5.0)
    print("held", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""


async def test_holder_killed_with_sigkill_frees_lock_after_its_lease(
    server: RedisServer, admin: redis.Redis, other_client: redis.Redis, name: str, no_leaks: None
) -> None:
    """A SIGKILLed holder's lock passes to another client when its lease (PTTL at kill) ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, server.url, name],
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 15.0)
        assert line.strip() == b"held", f"the child did not acquire: {line!r}"
        waiter = AsyncLock(other_client, name, ttl=1.0)
        key = waiter.key
        token = await admin.get(key)
        assert token is not None
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 5.0)
        # The child can no longer renew: this PTTL is when the server frees the key.
        measured = time.monotonic()
        pttl = await admin.pttl(key)
        assert 0 < pttl <= 1000, f"PTTL of the dead holder's key: {pttl}"
        assert await waiter.acquire(timeout=2.0)
        got_it = time.monotonic() - measured
        try:
            assert await admin.get(key) != token
            assert got_it >= pttl / 1000 - 0.02, f"acquired {got_it:.3f} s after, PTTL was {pttl}"
            assert got_it <= pttl / 1000 + 0.25, f"acquired {got_it:.3f} s after, PTTL was {pttl}"
        finally:
            await waiter.release()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5.0)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_an_acquiring_task_that_ends_holding_leaves_its_holding_renewed(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """The acquiring task returns holding the lock: the holding goes on, renewed, until released.

    A detached holding: its watchdog keeps the key (three leases and more)
    and a local waiter keeps waiting; a release from another task ends it,
    and the waiter gets the lock at once. (Before, renewal stopped with the
    acquiring task, and the lock expired under whoever had taken it over.)
    """
    lock = AsyncLock(client, name, ttl=0.3)

    async def owner() -> None:
        assert await lock.acquire()
        # returns without release()

    async def waiter() -> tuple[float, object]:
        assert await lock.acquire(timeout=5.0)
        at = time.monotonic()
        token = await admin.get(lock.key)
        await lock.release()
        return at, token

    await asyncio.create_task(owner())
    old_token = await admin.get(lock.key)
    waiter_task = asyncio.create_task(waiter())
    try:
        await _wait_for_renewal(admin, lock.key)  # the watchdog runs, its task gone
        await asyncio.sleep(1.0)  # more than three leases
        assert await admin.get(lock.key) == old_token, "the detached holding lapsed"
        assert 0 < await admin.pttl(lock.key) <= 300
        assert not waiter_task.done(), "the waiter got a lock that is still held"
        assert len(_renewal_tasks()) == 1
        assert await lock.owned()
        released = time.monotonic()
        await lock.release()
        got_at, new_token = await asyncio.wait_for(waiter_task, 2.0)
    finally:
        await asyncio.gather(waiter_task, return_exceptions=True)
    assert new_token is not None
    assert new_token != old_token
    assert got_at - released < SLACK, f"the waiter got it {got_at - released:.3f} s after"
    assert await other_tasks() == set()


# --- 3. an event loop blocked past the lease ----------------------------------------------------


@pytest.mark.parametrize("kind", CALLBACK_KINDS)
async def test_blocked_loop_loss_is_detected_and_reported(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None, kind: str
) -> None:
    """A loop blocked past the lease: lost is set, on_lost gets the lock, exit raises the loss."""
    lock, losses = watched(client, name, kind, ttl=0.3)

    async def body() -> None:
        time.sleep(0.5)  # blocks the event loop: no renewal can run
        await losses.wait(timeout=1.0)
        assert _is_lost(lock)
        assert await admin.exists(lock.key) == 0

    outcome = await hold(lock, body)
    assert isinstance(outcome.error, LockLostError), outcome.error
    assert isinstance(outcome.error, LockNotOwnedError)
    assert isinstance(outcome.error, LockError)
    assert [who for who, _ in losses.calls] == [lock]
    assert _is_lost(lock)


@pytest.mark.parametrize("kind", CALLBACK_KINDS)
async def test_blocked_loop_loss_reported_when_body_ends_without_await(
    client: redis.Redis, name: str, no_leaks: None, kind: str
) -> None:
    """A body that blocks past the lease and ends at once still gets lost, on_lost, the error."""
    lock, losses = watched(client, name, kind, ttl=0.3)

    async def body() -> None:
        time.sleep(0.5)

    outcome = await hold(lock, body)
    assert isinstance(outcome.error, LockLostError), outcome.error
    assert _is_lost(lock)
    assert [who for who, _ in losses.calls] == [lock], "on_lost did not run for a lost lock"


async def test_cancel_on_lost_after_a_blocked_loop_cancels_the_body_at_once(
    client: redis.Redis, name: str, no_leaks: None
) -> None:
    """cancel_on_lost=True: a body that blocked past its lease is cancelled as soon as it awaits.

    test_contract.py proves cancel_on_lost for every primitive with a key taken
    away; here the loss comes from the holder's own blocked event loop.
    """
    lock = AsyncLock(client, name, ttl=0.3, cancel_on_lost=True)
    unblocked: list[float] = []
    finished: list[bool] = []

    async def body() -> None:
        time.sleep(0.5)
        unblocked.append(time.monotonic())
        await asyncio.sleep(10)
        finished.append(True)

    started = time.monotonic()
    outcome = await hold(lock, body)
    after_block = time.monotonic() - unblocked[0]
    assert isinstance(outcome.error, LockLostError), outcome.error
    assert finished == []
    assert after_block < 0.3, f"the body ran {after_block:.3f} s after the loss"
    assert time.monotonic() - started < 1.0
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0, "the loss left a cancellation behind"
    await asyncio.sleep(0)  # the test task itself is not cancelled
    assert _is_lost(lock)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
async def test_body_exception_after_a_blocked_loop_carries_the_loss_as_note(
    client: redis.Redis, name: str, no_leaks: None
) -> None:
    """A body that blocked past its lease and raises: its exception wins, the loss is a note.

    The loss is found at exit from the lease end the holder counts (no
    server needed); test_contract.py proves the other paths for every primitive.
    """
    lock, _losses = watched(client, name, ttl=0.3)

    async def body() -> None:
        time.sleep(0.5)
        raise ValueError("body failed")

    outcome = await hold(lock, body)
    assert isinstance(outcome.error, ValueError), outcome.error
    assert str(outcome.error) == "body failed"
    notes: list[str] = getattr(outcome.error, "__notes__", [])
    assert any("aiolock" in note and "lost" in note for note in notes), notes
    assert _is_lost(lock)


async def test_stale_holder_after_blocked_loop_cannot_touch_new_holder(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """After a blocked loop lost the lock, old release()/extend() fail and the new key stays."""
    old = AsyncLock(client, name, ttl=0.3)
    assert await old.acquire()
    time.sleep(0.5)  # the loop is blocked past the lease; the server expires the key
    new = AsyncLock(other_client, name, ttl=5.0)
    assert await new.acquire(blocking=False), "the key did not expire"
    try:
        token = await admin.get(new.key)
        measured = time.monotonic()
        pttl = await admin.pttl(new.key)
        with pytest.raises(LockNotOwnedError):
            await old.extend()
        with pytest.raises(LockNotOwnedError):
            await old.release()
        assert _is_lost(old)
        assert not await old.owned()
        assert await admin.get(new.key) == token
        elapsed_ms = (time.monotonic() - measured) * 1000
        assert await admin.pttl(new.key) >= pttl - elapsed_ms - 5, "the new holder's lease shrank"
        assert await new.owned()
        with pytest.raises(LockNotOwnedError):  # nothing left to release
            await old.release()
    finally:
        await new.release()


@pytest.mark.parametrize("operation", ["release", "extend"])
async def test_release_or_extend_of_expired_holding_leaves_new_holder_alone(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    no_leaks: None,
    operation: str,
) -> None:
    """A holder whose key expired and passed on gets LockNotOwnedError; the new key is untouched."""
    old = AsyncLock(client, name, ttl=5.0)
    new = AsyncLock(other_client, name, ttl=5.0)
    assert await old.acquire()
    await admin.pexpire(old.key, 1)  # the lease runs out behind the holder's back
    assert await new.acquire(timeout=1.0)
    try:
        token = await admin.get(new.key)
        measured = time.monotonic()
        pttl = await admin.pttl(new.key)
        with pytest.raises(LockNotOwnedError):
            await getattr(old, operation)()
        assert _is_lost(old)
        assert await admin.get(new.key) == token
        elapsed_ms = (time.monotonic() - measured) * 1000
        assert await admin.pttl(new.key) >= pttl - elapsed_ms - 5, "the new holder's lease shrank"
        if operation == "extend":
            with pytest.raises(LockLostError):  # now known lost: no second round trip needed
                await old.extend()
            with pytest.raises(LockLostError):
                await old.release()
        assert await admin.get(new.key) == token
    finally:
        await new.release()


# --- 4. renewal failures ------------------------------------------------------------------------


async def test_unreachable_server_loss_declared_by_lease_end(
    proxy: FaultProxy,
    proxied: redis.Redis,
    admin: redis.Redis,
    server: RedisServer,
    name: str,
    caplog: pytest.LogCaptureFixture,
    no_leaks: None,
) -> None:
    """A black-holed holder declares the loss by the lease end of its last renewal, warning.

    It may declare it before ``before + ttl`` by as long as a command then
    took to reach the server (the slowest ``PING`` meanwhile): it counts its
    lease from when it sent the renewal, which the server ran after ``before``.
    """
    ttl = 0.5
    c = proxied
    lock, losses = watched(c, name, ttl=ttl)

    async def body() -> None:
        token = await admin.get(lock.key)
        async with Answers(server.url) as answers:
            before, after = await _wait_for_renewal(admin, lock.key, via=proxy)
        proxy.black_hole()
        # The last renewal that worked ran on the server between `before` and `after`
        # (polled every ~2 ms), so the holder sent it before `after`. The server expires
        # the key at its arrival + ttl at the earliest; the holder measures from its send.
        lost_at = await losses.wait(timeout=2.0)
        assert _is_lost(lock)
        late = lost_at - (after + ttl)
        assert late <= SLACK, f"loss declared {late:.3f} s after the lease end"
        # And it does not give up early: it keeps trying until the lease end.
        early = (before + ttl) - lost_at
        allowed = 0.05 + answers.slowest()
        assert early <= allowed, f"loss declared {early:.3f} s before the lease end ({allowed=})"
        assert await admin.get(lock.key) in (token, None)
        await _wait_until_gone(admin, lock.key, timeout=0.5)

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        outcome = await hold(lock, body)
    assert isinstance(outcome.error, LockLostError), outcome.error
    assert outcome.exit_took < PROMPT_EXIT, f"leaving took {outcome.exit_took:.3f} s"
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "aiolock" and r.levelno == logging.WARNING
    ]
    assert any(name in message for message in warnings), warnings
    assert [who for who, _ in losses.calls] == [lock]
    assert in_use_connections(c) == 0


async def test_paused_server_loss_declared_and_no_resurrection(own: Own, name: str) -> None:
    """A SIGSTOPped server: loss within the lease, exit needs no server, no resurrection after.

    The holder counts its lease from when it sent the renewal, which the
    server ran between ``before`` and ``after``: it may have been sent
    earlier by as long as a command then took to reach the server, so the
    loss may come that much before ``before + ttl`` (measured: the slowest
    ``PING`` round trip meanwhile, a fraction of a millisecond when idle).
    """
    ttl = 0.5
    lock, losses = watched(own.client, name, ttl=ttl)

    async def body() -> None:
        async with Answers(own.server.url) as answers:
            before, after = await _wait_for_renewal(own.admin, lock.key)
        own.server.pause()
        lost_at = await losses.wait(timeout=2.0)
        late = lost_at - (after + ttl)
        assert late <= SLACK, f"loss declared {late:.3f} s after the lease end"
        early = (before + ttl) - lost_at
        allowed = 0.05 + answers.slowest()
        assert early <= allowed, f"loss declared {early:.3f} s before the lease end ({allowed=})"
        assert _is_lost(lock)

    try:
        outcome = await hold(lock, body)
        assert own.server.paused, "the server must still be paused while leaving `async with`"
        assert isinstance(outcome.error, LockLostError), outcome.error
        assert outcome.exit_took < PROMPT_EXIT, f"leaving took {outcome.exit_took:.3f} s"
        # The holder gives up at its lease end, a hair before the server's expiry (it
        # measures from the send). Let the server's lease end too before resuming, so
        # the stale extend still queued on the paused server finds the key expired.
        await asyncio.sleep(0.05)
        own.server.resume()
        assert await own.admin.get(lock.key) is None, "the key came back after the server resumed"
        assert _is_lost(lock), "the old holding came back to life"
        assert not await lock.owned()
        assert await other_tasks() == set()
        await asyncio.sleep(ttl / 3 + 0.05)  # a renewal period: no watchdog revives it
        assert await own.admin.exists(lock.key) == 0
        assert _is_lost(lock)
        # The object itself is usable again: a fresh acquisition is not lost.
        async with lock:
            assert not _is_lost(lock)
            assert await lock.owned()
        assert await own.admin.exists(lock.key) == 0
    finally:
        if own.server.paused:
            own.server.resume()
    assert in_use_connections(own.client) == 0
    assert await other_tasks() == set()


# --- 5. the watchdog is cancelled and awaited on release ----------------------------------------


async def test_release_cancels_and_awaits_watchdog(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """When release() returns, the renewal task is finished, not merely cancelled."""
    # (A lease of 1 s: renewed after a third, with room for a loaded machine; 0.3 s once
    # ran out in a fresh-clone run before its first renewal.)
    lock = AsyncLock(client, name, ttl=1.0)
    assert await lock.acquire()
    await _wait_for_renewal(admin, lock.key)
    watchdogs = _renewal_tasks()
    assert len(watchdogs) == 1
    await lock.release()
    assert watchdogs[0].done(), "release() returned while the watchdog was still running"
    assert _renewal_tasks() == []
    assert await admin.exists(lock.key) == 0


async def test_a_cancelled_release_still_waits_for_the_on_lost_callback(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """A ``release()`` cancelled while it waits for the holding's tasks returns only after them.

    Regression test for a defect found in review: the wait for the watchdog
    and the ``on_lost`` coroutine was not shielded, so a release cancelled
    there returned while they still ran (a task outliving its lock).
    """
    finished = asyncio.Event()

    async def on_lost(_: AsyncLock) -> None:
        await asyncio.sleep(0.2)
        finished.set()

    lock = AsyncLock(client, name, ttl=0.2, on_lost=on_lost)
    assert await lock.acquire()
    await admin.delete(lock.key)  # the next renewal finds the key gone: lost
    deadline = time.monotonic() + 2.0
    while not lock.lost:
        assert time.monotonic() < deadline, "the loss was not declared"
        await asyncio.sleep(0.01)
    releasing = asyncio.create_task(lock.release())
    await asyncio.sleep(0.05)  # now waiting for on_lost
    releasing.cancel()
    with pytest.raises((asyncio.CancelledError, LockLostError)):
        await releasing
    assert finished.is_set(), "release() returned while on_lost was still running"


async def test_release_during_inflight_renewal_leaves_nothing(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Releasing while a slow extend is in flight ends the watchdog and deletes the key for good."""
    latency = 0.04
    c = proxied
    lock = AsyncLock(c, name, ttl=0.6)
    # Two connections ready before the latency starts (one for the extend in flight,
    # one for the release), so the lease is not spent on connection handshakes.
    await asyncio.gather(c.ping(), c.ping())
    proxy.set_latency(latency)
    assert await lock.acquire()
    before, _ = await _wait_for_renewal(admin, lock.key)
    watchdogs = _renewal_tasks()
    assert len(watchdogs) == 1
    # The server ran the extend after `before`; its reply takes `latency` to come back.
    assert time.monotonic() - before < latency, "the test was too slow to catch the extend"
    assert not watchdogs[0].done()
    await lock.release()
    assert watchdogs[0].done(), "release() returned while the watchdog was still running"
    assert _renewal_tasks() == []
    assert await admin.exists(lock.key) == 0
    assert await other_tasks() == set()
    await asyncio.sleep(3 * latency)  # anything still in flight has landed by now
    assert await admin.exists(lock.key) == 0, "a late extend brought the key back"
    assert in_use_connections(c) == 0


async def test_an_extend_that_ends_during_a_renewal_keeps_the_lease_the_server_has(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (review of the lease engine): a renewal whose reply comes after an
    ``extend(ttl=...)`` must not leave the holder counting the extend's lease while it
    renews with the old one.

    The renewal's reply is held back while ``extend(ttl=10)`` runs on a new
    connection; once it arrives, the holder's lease end must still be one the
    server keeps: the key never expires while the holder says it holds it.
    """
    lock = AsyncLock(proxied, name, ttl=0.6)  # renews every 0.2 s
    assert await lock.acquire()
    try:
        await asyncio.sleep(0.15)
        proxy.hold_replies()  # the renewal at 0.2 s runs on the server; its reply waits
        await asyncio.sleep(0.1)
        await lock.extend(ttl=10.0)  # a new connection: answered at once
        proxy.release_replies()
        for _ in range(12):
            await asyncio.sleep(0.1)
            if not lock.lost:
                assert await admin.exists(lock.key), (
                    "the holder says it holds the lock, but its key expired"
                )
    finally:
        if not lock.lost:
            await lock.release()
        await admin.delete(lock.key)


# --- 6. a server restart with empty data --------------------------------------------------------


async def test_server_restart_loses_lock_and_scripts_reload(own: Own, name: str) -> None:
    """A restart with empty data: loss known within ttl/3 + a round trip; scripts reload after."""
    ttl = 0.9
    lock, losses = watched(own.client, name, ttl=ttl)

    async def body() -> None:
        await _wait_for_renewal(own.admin, lock.key)  # the watchdog (and its script) is in use
        own.server.restart()
        restarted = time.monotonic()
        await own.admin.connection_pool.disconnect()  # its connection died with the old process
        took = await losses.wait(timeout=2.0) - restarted
        assert took <= ttl / 3 + SLACK, f"the loss was noticed {took:.3f} s after the restart"
        assert _is_lost(lock)

    outcome = await hold(lock, body)
    assert isinstance(outcome.error, LockLostError), outcome.error
    assert [who for who, _ in losses.calls] == [lock]
    assert await own.admin.exists(lock.key) == 0
    # The restarted server has no scripts: the release script is loaded again (NOSCRIPT).
    sha = RELEASE.sha
    assert await own.admin.script_exists(sha) == [False]
    again = AsyncLock(own.client, name, ttl=ttl)
    assert await again.acquire(blocking=False)
    assert await again.owned()
    await again.release()
    assert await own.admin.script_exists(sha) == [True]
    assert await own.admin.exists(again.key) == 0
    assert await other_tasks() == set()
    assert in_use_connections(own.client) == 0


# --- 7. extend() --------------------------------------------------------------------------------


async def test_extend_with_ttl_sets_lease_used_by_later_renewals(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """extend(ttl=2.0) sets PTTL to ~2000 ms; the watchdog then renews to 2.0 s every 2.0/3 s."""
    lock = AsyncLock(client, name, ttl=0.3)
    async with lock:
        extending = time.monotonic()
        await lock.extend(ttl=2.0)
        assert 1900 < await admin.pttl(lock.key) <= 2000
        _, after = await _wait_for_renewal(admin, lock.key, timeout=1.5)
        assert after - extending >= 2.0 / 3 - 0.02, "renewed at the old ttl/3 cadence"
        assert after - extending <= 2.0 / 3 + 2 * SLACK
        assert await admin.pttl(lock.key) > 1800, "the renewal did not use the new ttl"
        assert not _is_lost(lock)
