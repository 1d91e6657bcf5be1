"""The wait loop: how a task gets a lock, over any lease.

A task first lines up in the lease's local queue (:mod:`aiolock._queue`):
only the head of the queue talks to the server. The head then attempts on
the server until it wins or its deadline passes.

Between attempts a waiter of a lease that queues (the one-server lease)
stands in the lock's queue on the server: a failed attempt put it there,
and a release hands the lock straight to the first live waiter
(docs/server-queue.md). It then waits, sending nothing but a refresh of its entry every
``refresh_every`` seconds, for whichever comes first:

* its grant, announced on its process's grant channel (:mod:`aiolock._notify`): it
  holds the lock from then on, its lease counted from the latest moment the
  server had shown it still queued (an attempt or a refresh sent then), which
  is before the grant;
* a release with nobody queued, or a break of the notifications: it attempts
  again at once;
* a refresh that finds its entry gone: it was granted the lock (and missed the
  message), or the server lost its data; an attempt tells which, and queues
  it again if need be;
* the end of the holder's lease as last known (its ``PTTL``, or the first
  lease of the latest grant heard): one ``PTTL`` tells whether the holder
  renewed; a lock left to expire (its holder died) is then taken, or granted
  to the first live waiter, by an attempt.

A lock key without expiry (``PTTL`` -1) is no aiolock holding: another
library's lock on a shared key (redis-py's default lock never expires),
whose release grants nothing. Its waiters poll at their backoff steps,
staying queued.

A waiter without notifications (``notify=False``, a user without channel
rights, a pub/sub connection that broke and is not back yet) polls instead:
it attempts at its backoff steps, capped by the holder's remaining lease (an
attempt finds a grant it was given), as waiters of a lease that does not
queue (Redlock's) always do.

The answer is true: ``None`` (not acquired) means the latest verdict was
that someone held the lock. An attempt in flight at the deadline is awaited
as long as the link needs (see :meth:`~aiolock._server_lease.ServerLease.attempt`);
if it got no verdict, the call raises redis-py's ``TimeoutError`` ("the
server did not answer within ...") instead. Whatever a call that gives up
must clean up on the server (undo an attempt, leave the queue, pass on a
grant that came too late) shares one budget (:class:`~aiolock._lease.Call`).

Cancellation: an attempt interrupted at any ``await`` is undone by the
lease before it raises; an attempt that won but whose caller was cancelled
meanwhile is undone here; a queued waiter leaves the queue (passing on a
grant it may have got); a cancellation that redis-py swallowed (CPython
gh-86296) is honoured after every ``await``.

States and steps
----------------

The head of the local queue attempts (ATTEMPTING), waits in the queue on
the server (QUEUED, :func:`_wait_in_queue`), sleeps until its next attempt
(PAUSED, :func:`_pause`), or has ended. What it does after each attempt is
decided without an ``await`` in :mod:`aiolock._decide` (a :class:`Seen`
in, a :data:`Step` out, drawn there as a table); the loop here performs the
step, and every ``await`` is here.

Whatever ends the loop but a win leaves the queue on the server (or stops
waiting there) and passes the local queue's baton on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Final, assert_never, final

import anyio
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import backoff as _backoff
from ._cancel import honour_cancellation
from ._decide import (
    Acquired,
    Cancelled,
    GiveUp,
    Notifications,
    Pacing,
    Poll,
    RaiseLate,
    RaiseNoConnection,
    RaiseUnanswered,
    RetryNow,
    Seen,
    Step,
    Subscribe,
    UndoLateWin,
    WaitInQueue,
    decide,
    poll_delay,
    queued_at_once,
    subscribed,
    wins_at_once,
)
from ._lease import Call, Lease, Queueing, Reply, Unanswered
from ._notify import Subscription
from ._queue import Grant, LocalQueue, Undo
from ._timers import Timer, spare_at

__all__ = ["WATCH_SLACK", "Won", "obtain"]
#: A queued waiter looks at the lock this long after the holder's lease should have
#: ended (its renewal, or the server's expiry, has then happened).
WATCH_SLACK: Final = 0.002
#: The steps that still judge whether the attempt won (a win keeps its spare timer).
_JUDGING_WIN: Final = (Cancelled, UndoLateWin)
_ACQUIRED: Final = Acquired()
_SUBSCRIBE: Final = Subscribe()
_UNASKED: Final = Notifications.UNASKED
_LIVE: Final = Notifications.LIVE
_DOWN: Final = Notifications.DOWN


@final
class Won:
    """A won acquisition: the token, when it was sent, its fence, and how it came."""

    __slots__ = ("fence", "handed", "queue", "sent", "span", "timer", "token")

    def __init__(
        self,
        token: str,
        sent: float,
        fence: int,
        queue: LocalQueue,
        *,
        handed: bool,
        timer: Timer | None = None,
        span: float | None = None,
    ) -> None:
        #: The local queue whose baton the winner holds.
        self.queue = queue
        #: A timer due at the holding's first renewal, unspent, or None.
        self.timer = timer
        self.token = token
        #: When the lease started at the latest, as the holder counts it.
        self.sent = sent
        self.fence = fence
        #: Handed over by a local releaser (not taken on the server).
        self.handed = handed
        #: The first lease as the holder counts it, when not the lease's own (a grant's).
        self.span = span


# -- the loop -------------------------------------------------------------------------


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
    call.task = task
    queue = lease.queue(task.get_loop())
    if queue.take(task):
        return _contend(lease, queue, task, policy, deadline, baseline, call)
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
    return await _contend(lease, queue, task, policy, deadline, baseline, call)


async def _contend(
    lease: Lease,
    queue: LocalQueue,
    task: asyncio.Task[Any],
    policy: _backoff.Backoff,
    deadline: float | None,
    baseline: int,
    call: Call,
) -> Won | None:
    """Try on the server until acquired or past the deadline (we hold the baton).

    Each turn attempts once, writes down what it saw (:class:`Seen`) and
    performs what :func:`decide` says. Unless it wins, it leaves the queue
    on the server (if it was in it) and passes the baton on when it ends
    (returning None, or raising).
    """
    # A lease without a queueing part (Redlock's) never queues the caller: its waiters
    # poll, with no notifications.
    queueing = lease.queueing
    foreign = True if queueing is None else queueing.foreign_without_expiry
    subscription: Subscription | None = None
    won: Won | None = None
    timer: Timer | None = None
    try:
        pacing: Pacing | None = None  # made at the first poll
        late_since: float | None = None
        generation: int | None = None
        while True:
            if subscription is not None and subscription.stale:
                # The listener stopped reading its channel (the server dropped it):
                # subscribe again.
                subscription.close()
                subscription = None
            # Note the channel's generation before the attempt: news after this
            # point (a release, a subscription confirmed) means "try again at once".
            if subscription is not None:
                subscription.mark()
            elif queueing is not None:
                generation = queueing.generation()
            sent = time.monotonic()
            queue_up = queueing is not None and (deadline is None or deadline > sent)
            # An attempt with a deadline is cut off by a timer: one due at the first
            # renewal, lent to the cut-off, then kept for the holding if it wins.
            timer = None if deadline is None else spare_at(sent + lease.span / 3, task.get_loop())
            call.spare = timer
            reply: Reply | None
            unanswered: Exception | None
            try:
                reply = await lease.attempt(deadline, queue_up, call)
                unanswered = None
            except Unanswered as late:
                # No verdict (most often our own loop was busy): try again while the
                # deadline allows; without one, for one lease.
                reply, unanswered = None, late.error
            now = time.monotonic()
            if unanswered is None:
                late_since = None
            elif late_since is None:
                late_since = now
            cancelled = task.cancelling() > baseline
            step: Step
            if wins_at_once(reply, unanswered, cancelled, sent, now, lease.span):
                step = _ACQUIRED  # (what decide says, without writing down the rest)
            elif queued_at_once(reply, unanswered, cancelled, deadline, now, call.queued, foreign):
                # (The same again: a waiter queued behind a holder, its hot path.)
                assert reply is not None  # noqa: S101 - an answer said held
                step = (
                    _SUBSCRIBE if subscription is None else subscribed(reply[1], subscription.live)
                )
            else:
                notifications = _UNASKED if subscription is None else _listening(subscription)
                no_connection = call.waiting and not call.reached
                # (Every argument is named as its field, in the fields' order.)
                seen = Seen(
                    reply,
                    unanswered,
                    late_since,
                    cancelled,
                    sent,
                    now,
                    deadline,
                    lease.span,
                    lease.ttl,
                    call.queued,
                    foreign,
                    notifications,
                    no_connection,
                )
                step = decide(seen)
            # Perform the step. A step that changes what the waiter knows (an undo, a
            # subscription) judges the same attempt again; the others end the call, or
            # lead to the next attempt (break).
            while True:
                if isinstance(step, Acquired):
                    assert reply is not None  # noqa: S101 - a win is a reply
                    got = Won(call.token, sent, reply[1], queue, handed=False, timer=timer)
                    # No longer waiting in the queue. (Cancelled meanwhile, this raises: the
                    # `finally` below sees no win and leaves, which frees the lock.) A call
                    # whose only attempt did not queue it never waited there.
                    if queueing is not None and (call.queued or call.attempts > 1):
                        await queueing.stop_waiting(call)
                    won = got
                    return won
                if timer is not None and not isinstance(step, _JUDGING_WIN):
                    timer.cancel()  # (a win keeps it for the holding)
                    timer = None
                match step:  # (the steps of a waiter's hot path first)
                    case WaitInQueue(pttl=pttl):
                        # In the queue, told of our grant: wait for it, refreshing our entry.
                        assert subscription is not None  # noqa: S101 - notifications are live
                        assert queueing is not None  # noqa: S101 - queued
                        granted = await _wait_in_queue(
                            queueing,
                            queue,
                            task,
                            subscription,
                            deadline,
                            baseline,
                            call,
                            sent,
                            pttl,
                        )
                        if granted is not None:
                            await queueing.stop_waiting(call)  # (as for a win above)
                            won = granted
                            return won
                        break
                    case Subscribe():
                        # (Queued: only a lease that queues puts the caller in the queue.)
                        if queueing is not None:
                            subscription = await queueing.subscribe(generation)
                        # What decide says of the same attempt, notifications now known.
                        assert reply is not None  # noqa: S101 - Subscribe answers a reply
                        live = subscription is not None and subscription.live
                        step = subscribed(reply[1], live)
                        continue
                    case Poll(pttl=pttl):
                        if pacing is None:
                            pacing = Pacing(policy.delays())
                        delay = poll_delay(pacing.take(), pttl, deadline, time.monotonic())
                        if subscription is None and delay > 0 and queueing is not None:
                            subscription = await queueing.subscribe(generation)
                        queued = queueing if call.queued else None
                        await _pause(queued, task, subscription, delay, baseline, call, sent)
                        break
                    case RetryNow():
                        break
                    case Cancelled(undo=undo):
                        if undo:
                            await lease.undo(call.token, call)
                        await honour_cancellation(task, baseline)
                        # (Here only if the cancellation was taken back meanwhile.)
                        seen = seen._replace(cancelled=False)
                    case UndoLateWin():
                        # Not a lock: take it back (as the call's cleanup if it is ending).
                        call.unanswered = now - sent
                        ending = deadline is not None and now >= deadline
                        await lease.undo(call.token, call if ending else None)
                        seen = seen._replace(
                            reply=None, no_connection=call.waiting and not call.reached
                        )
                    case GiveUp():
                        return None
                    case RaiseNoConnection():
                        raise RedisTimeoutError(
                            f"lock {lease.name!r}: no connection of the client's pool came "
                            f"free within {call.unanswered:.2g} s (other commands of the "
                            "client hold them all); not acquired, and nothing was sent"
                        )
                    case RaiseUnanswered(error=error):
                        raise error or RedisTimeoutError(
                            f"lock {lease.name!r}: the server did not answer within "
                            f"{call.unanswered:.2g} s; not acquired, and whether anyone "
                            "holds it is not known"
                        )
                    case RaiseLate(error=error):
                        raise error from None
                    case _:
                        assert_never(step)
                step = decide(seen)
    finally:
        if timer is not None and won is None:
            timer.cancel()
        if subscription is not None:
            subscription.close()
        if won is None:
            try:
                if queueing is not None:
                    if call.queued:
                        await queueing.leave(call)  # (and stops waiting)
                    else:
                        await queueing.stop_waiting(call)
            finally:
                queue.leave()


def _listening(subscription: Subscription) -> Notifications:
    """Whether releases reach the holder of ``subscription``."""
    return _LIVE if subscription.live else _DOWN


async def _pause(
    queued: Queueing | None,
    task: asyncio.Task[Any],
    subscription: Subscription | None,
    delay: float,
    baseline: int,
    call: Call,
    proof: float,
) -> None:
    """Sleep ``delay`` (a poll), cut short by news; a queued poller refreshes its entry.

    ``queued`` is the lease's queueing part when ``call`` stands in the queue
    on the server (then its entry is refreshed), else None.
    """
    end = time.monotonic() + delay
    refreshed = proof
    while True:
        until = min(refreshed + queued.refresh_every, end) if queued is not None else end
        chunk = max(0.0, until - time.monotonic())
        if subscription is None:
            await anyio.sleep(chunk)
            news = False
        else:
            news = await subscription.wait(chunk)
        await honour_cancellation(task, baseline)
        now = time.monotonic()
        if news or now >= end or queued is None:
            return  # (a timer may fire a little early: that is the pause's end too)
        if now >= refreshed + queued.refresh_every:
            standing, proof = await queued.refresh(call, end)
            if standing is False:
                return  # granted, or lost: the attempt tells
            refreshed = proof if standing else now


async def _wait_in_queue(
    queueing: Queueing,
    queue: LocalQueue,
    task: asyncio.Task[Any],
    subscription: Subscription,
    deadline: float | None,
    baseline: int,
    call: Call,
    proof: float,
    pttl: int,
) -> Won | None:
    """Wait in the queue on the server until granted; None: attempt again now.

    ``proof`` is when the latest command was sent that the server answered
    with us still queued (not granted): a grant came after it, so the heir's
    lease is counted from there. ``pttl`` is the holder's remaining lease as
    the attempt saw it.
    """
    subscription.expect(call.token, call.attempts)
    now = time.monotonic()
    watch = now + pttl / 1000 + WATCH_SLACK if pttl >= 0 else None
    refresh_at = proof + queueing.refresh_every
    heard = subscription.holder_until()
    while True:
        if subscription.holder_until() != heard:
            # A grant to another waiter was heard: the lock has a new holder, whose first
            # lease ends then (it renews before, unless it died). We wake for our own
            # refreshes more often than a first lease lasts, so we look in time.
            heard = subscription.holder_until()
            watch = heard + WATCH_SLACK
        end = refresh_at
        if watch is not None and watch < end:
            end = watch
        if deadline is not None and deadline < end:
            end = deadline
        news = await subscription.wait(max(0.0, end - time.monotonic()))
        await honour_cancellation(task, baseline)
        granted = subscription.granted
        if granted is not None:
            ms, fence = granted
            span = ms / 1000
            if queueing.accepts_grants and time.monotonic() < proof + span:
                return Won(call.token, proof, fence, queue, handed=False, span=span)
            return None  # the attempt confirms it (replicas), or finds it too late
        if news or subscription.stale:
            return None  # (a stale channel: subscribe again, and attempt)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return None  # the last attempt at the deadline, then the answer
        if now >= refresh_at:
            until = now + queueing.refresh_every
            if deadline is not None and deadline < until:
                until = deadline
            standing, shown = await queueing.refresh(call, until)
            await honour_cancellation(task, baseline)
            if standing is False:
                return None  # granted (the message was missed), or lost: the attempt tells
            if standing:
                # (Found standing by the latest command for it: its own, or its keeper's
                # for the client's waiters, which may have been sent a moment ago.)
                proof = max(proof, shown)
                refresh_at = shown + queueing.refresh_every
            else:
                refresh_at = now + queueing.refresh_every
            continue
        if watch is not None and now >= watch:
            # The holder's lease as we knew it is over: ask how long the lock is held.
            until = now + queueing.refresh_every
            if deadline is not None and deadline < until:
                until = deadline
            left = await queueing.remaining(call, until)
            await honour_cancellation(task, baseline)
            if left is None or left < 0:
                return None  # free (its holder died), without expiry, or unknown: attempt
            watch = time.monotonic() + left / 1000 + WATCH_SLACK
