"""The wait loop: how a task gets a lock, over any lease.

A task first lines up in the lease's local queue (:mod:`aiolock._queue`):
only the head of the queue talks to the server. The head then attempts on
the server until it wins or its deadline passes. Between attempts it waits
for the backoff step (:mod:`aiolock.backoff`), capped by the holder's
remaining lease and the deadline, and cut short by a release notification
(:mod:`aiolock._notify`) when the lease has them.

Each failed attempt that will be followed by a wait also raises the lock's
waiting marker for that long (plus ``MARK_SLACK``), where the lease has one,
so that a holder elsewhere handing the lock from task to task in its own
process sees this waiter even when it cannot be notified, and lets it go
first. Giving up takes the marker down.

The answer is true: ``None`` (not acquired) means the latest verdict was
that someone held the lock. An attempt in flight at the deadline is awaited
as long as the link needs (see :meth:`~aiolock._lease.ServerLease.attempt`);
if it got no verdict, the call raises redis-py's ``TimeoutError`` ("the
server did not answer within ...") instead. Whatever a call that gives up
must clean up on the server shares one budget (:class:`~aiolock._lease.Call`).

Cancellation: an attempt interrupted at any ``await`` is undone by the
lease before it raises; an attempt that won but whose caller was cancelled
meanwhile is undone here; a cancellation that redis-py swallowed (CPython
gh-86296) is honoured after every ``await``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Iterator
from typing import Any, final

import anyio
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import backoff as _backoff
from ._cancel import honour_cancellation
from ._checks import to_ms
from ._lease import RETRY, Call, Lease, Unanswered
from ._notify import Subscription
from ._queue import MARK_CAP, MARK_SLACK, Grant, LocalQueue, Undo, Yield
from ._timers import Timer, spare_at

__all__ = ["Won", "obtain"]


@final
class Won:
    """A won acquisition: the token, when it was sent, its fence, and how it came."""

    __slots__ = ("fence", "handed", "queue", "sent", "timer", "token")

    def __init__(
        self,
        token: str,
        sent: float,
        fence: int,
        queue: LocalQueue,
        *,
        handed: bool,
        timer: Timer | None = None,
    ) -> None:
        #: The local queue whose baton the winner holds.
        self.queue = queue
        #: A timer due at the holding's first renewal, unspent, or None.
        self.timer = timer
        self.token = token
        self.sent = sent
        self.fence = fence
        #: Handed over by a local releaser (not taken on the server).
        self.handed = handed


def obtain(
    lease: Lease,
    task: asyncio.Task[Any],
    policy: _backoff.Backoff,
    deadline: float | None,
    blocking: bool,
    call: Call,
) -> Awaitable[Won | None]:
    """Get the lock for ``task``: through the local queue, then on the server.

    The awaitable returns None when ``deadline`` passed first while the lock
    was held (the baton passed on), and raises redis-py's ``TimeoutError``
    when the attempt in flight at the deadline got no answer. On success
    ``task`` holds the local queue's baton. When nobody of this process
    wants the key, the task takes the baton at once and goes straight to
    the server (the awaitable is the wait loop itself).
    """
    baseline = task.cancelling()
    queue = lease.queue(task.get_loop())
    if queue.take(task):
        return _contend(lease, queue, task, policy, deadline, baseline, 0.0, call)
    call.contended = True  # another task of this process had it, or was first in line
    return _queue_then_contend(lease, queue, task, policy, deadline, blocking, call)


async def _queue_then_contend(
    lease: Lease,
    queue: LocalQueue,
    task: asyncio.Task[Any],
    policy: _backoff.Backoff,
    deadline: float | None,
    blocking: bool,
    call: Call,
) -> Won | None:
    """Wait in the local queue for the baton, then take what came with it."""
    baseline = task.cancelling()
    ticket = await queue.enter(task, lease, deadline, blocking)
    if ticket is None:
        return None
    try:
        if isinstance(ticket, Grant):
            if time.monotonic() < ticket.sent + lease.span:
                return Won(ticket.token, ticket.sent, ticket.fence, queue, handed=True)
            # The releaser's hand-over took longer than our lease: not a lock.
            ticket = Undo(ticket.token)
        if isinstance(ticket, Undo):
            # A hand-over that was too late, or whose outcome is unknown: take our
            # token back, then contend on the server if there is time left.
            ending = deadline is not None and time.monotonic() >= deadline
            await lease.undo(ticket.token, call if ending else None)
            if deadline is not None and time.monotonic() >= deadline:
                queue.leave()
                return None
    except BaseException:
        queue.leave()
        raise
    pause = ticket.seconds if isinstance(ticket, Yield) else 0.0
    return await _contend(lease, queue, task, policy, deadline, baseline, pause, call)


async def _contend(
    lease: Lease,
    queue: LocalQueue,
    task: asyncio.Task[Any],
    policy: _backoff.Backoff,
    deadline: float | None,
    baseline: int,
    wait_first: float,
    call: Call,
) -> Won | None:
    """Try on the server until acquired or past the deadline (we hold the baton).

    With ``wait_first`` (seconds) it starts with a wait: the local releaser
    just let waiters elsewhere go first. Unless it wins, it passes the baton
    on when it ends (returning None, or raising).
    """
    subscription: Subscription | None = None
    waiter: str | None = None  # our id in the marker, once we raised it
    won: Won | None = None
    timer: Timer | None = None
    try:
        delays: Iterator[float] | None = None
        step = 0.0  # the policy's latest delay: repeated once a finite policy runs out
        drawn = False  # `step` is already the pause after the attempt in flight
        plain = lease.bare_first  # the first attempt is a bare SET
        marks = lease.marks
        late_since: float | None = None  # since when every attempt went unanswered
        seen: int | None = None
        # The marker lives at most this long without being set again (see MARK_CAP).
        mark_life = min(lease.ttl, MARK_CAP)
        if wait_first:
            # Waiters elsewhere were told to go first; if none has taken the lock by
            # then, try anyway. A plain sleep: the release message of the yield itself
            # may still be on its way to our listener, and must not wake us.
            if deadline is not None:
                wait_first = max(0.0, min(wait_first, deadline - time.monotonic()))
            await anyio.sleep(wait_first)
            await honour_cancellation(task, baseline)
        while True:
            # Note the channel's generation before the attempt: news after this
            # point (a release, a subscription confirmed) means "try again at once".
            if subscription is not None:
                subscription.mark()
            elif not plain:  # a bare attempt that fails is followed at once by another
                seen = lease.generation()
            token = os.urandom(16).hex()  # secrets.token_hex(16), one call less
            mark_ms = 0
            if plain:
                plain = False
            elif marks and (deadline is None or deadline > time.monotonic()):
                # Draw the pause that will follow a failure now: the marker lasts that long.
                if delays is None:
                    delays = policy.delays()
                step = _backoff._check_delay(next(delays, step))
                drawn = True
                bound = step if deadline is None else min(step, deadline - time.monotonic())
                mark_ms = to_ms(min(bound + MARK_SLACK, mark_life))
                if waiter is None:
                    waiter = os.urandom(8).hex()
            sent = time.monotonic()
            marked_until = sent + mark_ms / 1000  # when the marker this attempt raises ends
            # An attempt with a deadline is cut off by a timer: one due at the first
            # renewal, lent to the cut-off, then kept for the holding if it wins.
            timer = None if deadline is None else spare_at(sent + lease.span / 3, task.get_loop())
            try:
                reply = await lease.attempt(token, deadline, waiter, mark_ms, task, timer, call)
            except Unanswered as late:
                # No verdict (most often our own loop was busy): try again while the
                # deadline allows; without one, for one lease.
                now = time.monotonic()
                late_since = now if late_since is None else late_since
                if deadline is None and now - late_since >= lease.ttl:
                    raise late.error from None
                reply = None
                unanswered: Exception | None = late.error
            else:
                late_since = None
                unanswered = None
            if task.cancelling() > baseline:
                if reply is not None and reply[0]:
                    await lease.undo(token, call)
                await honour_cancellation(task, baseline)
            now = time.monotonic()
            if reply is not None and reply[0]:
                if now < sent + lease.span:
                    won = Won(token, sent, reply[1], queue, handed=False, timer=timer)
                    return won
                # The reply came after the lease it granted had run out: not a lock.
                call.unanswered = now - sent
                ending = deadline is not None and now >= deadline
                await lease.undo(token, call if ending else None)
                reply = None
            if timer is not None:
                timer.cancel()
                timer = None
            if deadline is not None and now >= deadline:
                if reply is None:
                    # No verdict: "not acquired" would claim that someone holds it.
                    raise unanswered or RedisTimeoutError(
                        f"lock {lease.name!r}: the server did not answer within "
                        f"{call.unanswered:.2g} s; not acquired, and whether anyone "
                        "holds it is not known"
                    )
                return None
            if reply is not None and reply[1] == RETRY:
                continue  # the first, bare attempt failed: the full attempt follows at once
            if not drawn:
                if delays is None:
                    delays = policy.delays()
                step = _backoff._check_delay(next(delays, step))
            drawn = False
            delay = step
            pttl = reply[1] if reply is not None else -1
            if pttl >= 0:
                # An expiring holder sends no message: wake when its lease ends.
                delay = min(delay, pttl / 1000 + 0.001)
            elif pttl == -2:
                delay = 0.0
            if deadline is not None:
                delay = max(0.0, min(delay, deadline - time.monotonic()))
            if subscription is None and delay > 0:
                subscription = await lease.subscribe(seen)
            # A pause longer than the marker lives: set it again every half of its life,
            # so that it tells of a live waiter, and a dead one's is gone soon.
            refresh = waiter is not None and delay + MARK_SLACK > mark_life
            every = mark_life / 2 if refresh else delay
            end = time.monotonic() + delay
            while True:
                chunk = max(0.0, min(every, end - time.monotonic()))
                if subscription is None:
                    await anyio.sleep(chunk)
                    news = False
                else:
                    news = await subscription.wait(chunk)
                await honour_cancellation(task, baseline)
                now = time.monotonic()
                if news or now >= end or not refresh:
                    break  # (a timer may fire a little early: that is the pause's end too)
                if end + MARK_SLACK > marked_until:  # the marker would die before the pause
                    life = min(end - now + MARK_SLACK, mark_life)
                    marked_until = now + life
                    assert waiter is not None  # noqa: S101 - `refresh` says so
                    await lease.mark(waiter, to_ms(life), end, task)
    finally:
        if timer is not None and won is None:
            timer.cancel()
        if subscription is not None:
            subscription.close()
        if won is None:
            try:
                if waiter is not None:
                    await lease.unmark(waiter, call)
            finally:
                queue.leave()
