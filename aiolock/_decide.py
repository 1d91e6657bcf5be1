"""The wait loop's decisions: what a waiter knows after an attempt, and what it does next.

The wait loop (:mod:`aiolock._contend`) performs; this module decides,
without an ``await`` and without a server. The head of a local queue is in
one of four states:

* ATTEMPTING: one attempt on the server is in flight;
* QUEUED: in the lock's queue on the server, waiting for its grant
  (:func:`aiolock._contend._wait_in_queue`);
* PAUSED: polling, asleep until its next attempt (:func:`aiolock._contend._pause`);
* ENDED: it holds the lock (a :class:`~aiolock._contend.Won`), gave up (None), or raised.

After each attempt the loop writes down what the attempt returned and what
the waiter knows (a :class:`Seen`), and :func:`decide` names what to do
next (a :data:`Step`); a poll's pause is :func:`poll_delay`'s, its backoff
steps :class:`Pacing`'s. A wait in the queue and a pause keep small loops
of their own in :mod:`aiolock._contend` (when to refresh the entry, when to
look at the holder's lease). ``tests/unit/test_wait_loop.py`` calls these
functions case by case::

    ATTEMPTING ──> Seen ──> decide ──> Step

    Step                what the loop does               then
    ──────────────────  ───────────────────────────────  ─────────────────────────────
    Cancelled           undo a win                       ENDED: CancelledError
    Acquired            stop waiting in the queue        ENDED: Won
    UndoLateWin         undo the win that came too late  decide again, without a verdict
    GiveUp                                               ENDED: None
    RaiseNoConnection   raise redis-py's TimeoutError    ENDED
    RaiseUnanswered     raise the attempt's error, or    ENDED
                        redis-py's TimeoutError
    RaiseLate           raise the attempt's error        ENDED
    RetryNow                                             ATTEMPTING
    Subscribe           subscribe to the lock's channel  subscribed(...): the step decide
                                                         gives, notifications known
    WaitInQueue         wait for the grant               QUEUED, then ENDED: Won,
                                                         or ATTEMPTING
    Poll                sleep poll_delay(...)            PAUSED, then ATTEMPTING

The two hot paths skip the :class:`Seen`: :func:`wins_at_once` (a win) and
:func:`queued_at_once` (queued behind a holder: rule 7) tell from the reply
alone what :func:`decide` would say; property tests hold each equal to it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias, final

from . import backoff as _backoff
from ._lease import RETRY, Reply

__all__ = [
    "Acquired",
    "Cancelled",
    "GiveUp",
    "Notifications",
    "Pacing",
    "Poll",
    "RaiseLate",
    "RaiseNoConnection",
    "RaiseUnanswered",
    "RetryNow",
    "Seen",
    "Step",
    "Subscribe",
    "UndoLateWin",
    "WaitInQueue",
    "decide",
    "poll_delay",
    "queued_at_once",
    "subscribed",
    "wins_at_once",
]


# -- what the waiter knows after an attempt --------------------------------------------


class Notifications(enum.Enum):
    """Whether release notifications reach the waiter, as far as it knows."""

    #: It has no subscription: subscribing tells.
    UNASKED = "unasked"
    #: Subscribed, and releases and grants reach it.
    LIVE = "live"
    #: None reach it: ``notify=False``, no rights on the channel, a pub/sub
    #: connection that broke and is not back yet.
    DOWN = "down"


_UNASKED: Final = Notifications.UNASKED
_LIVE: Final = Notifications.LIVE
_DOWN: Final = Notifications.DOWN


class Seen(NamedTuple):
    """What one attempt returned and what the waiter knew then: what :func:`decide` reads.

    The loop writes one after each attempt, and a changed copy when a step
    it performed changed what it knows (an undo, a subscription).
    """

    #: The attempt's answer: ``(1, fence)`` taken, ``(0, code)`` not (``code`` is the
    #: holder's ``PTTL``, or :data:`~aiolock._lease.RETRY`,
    #: :data:`~aiolock._lease.NOT_HELD`); None: no verdict (the attempt was cut off or
    #: unanswered, or it won too late and was undone).
    reply: Reply | None
    #: The error of an attempt that got no verdict in time (it raised ``Unanswered``).
    unanswered: Exception | None
    #: Since when every attempt went unanswered; None once one was answered.
    late_since: float | None
    #: The caller was cancelled while the attempt ran.
    cancelled: bool
    #: When the attempt was sent (``time.monotonic()``).
    sent: float
    #: When its answer was judged.
    now: float
    #: When the call gives up; None: it waits until it wins.
    deadline: float | None
    #: The lease a win gives, as the holder counts it (:attr:`Lease.span`).
    span: float
    #: The lease an attempt asks for (:attr:`Lease.ttl`).
    ttl: float
    #: An attempt put the caller in the lock's queue on the server (it may still be there).
    queued: bool
    #: A ``PTTL`` of -1 is another library's lock, whose release grants nothing
    #: (:attr:`Queueing.foreign_without_expiry`; True for a lease that does not queue).
    foreign_without_expiry: bool
    #: Whether release notifications reach the waiter.
    notifications: Notifications
    #: The attempt waited for a connection of the client's exhausted pool and sent nothing.
    no_connection: bool


# -- the steps ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The caller was cancelled while the attempt ran: undo a win, then raise ``CancelledError``."""

    #: The attempt won: take the lock back before raising.
    undo: bool


@dataclass(frozen=True, slots=True)
class Acquired:
    """The attempt won within the lease it granted: stop waiting in the queue, and hold.

    The win's fencing number is the reply's (``Seen.reply[1]``).
    """


@dataclass(frozen=True, slots=True)
class UndoLateWin:
    """The attempt won, but its answer came after the lease it granted had run out.

    That is not a lock: undo it, then judge the attempt again as one without a verdict.
    """


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Past the deadline, and the latest verdict was that someone held the lock: return None."""


@dataclass(frozen=True, slots=True)
class RaiseNoConnection:
    """Past the deadline without a verdict, and the attempt never got a connection.

    It waited for one of the client's exhausted pool and sent nothing: raise
    redis-py's ``TimeoutError`` saying so.
    """


@dataclass(frozen=True, slots=True)
class RaiseUnanswered:
    """Past the deadline without a verdict: raise :attr:`error`, or redis-py's ``TimeoutError``.

    Not "not acquired": that would claim that someone holds the lock.
    """

    #: The unanswered attempt's error; None: the attempt was cut off, or won too late.
    error: Exception | None


@dataclass(frozen=True, slots=True)
class RaiseLate:
    """No deadline, and every attempt for one whole lease went unanswered: raise :attr:`error`."""

    #: The latest attempt's error.
    error: Exception


@dataclass(frozen=True, slots=True)
class RetryNow:
    """The first, bare attempt failed (it does not say for how long): the full one follows now."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Queued on the server while someone holds, with no subscription: subscribe, judge again."""


@dataclass(frozen=True, slots=True)
class WaitInQueue:
    """Queued on the server, told of releases: wait for the grant, refreshing the entry.

    Then it holds, or attempts again (news, its entry gone, the holder's
    lease over, the deadline).
    """

    #: The holder's remaining lease in ms as the attempt saw it (negative: no end to
    #: watch for).
    pttl: int


@dataclass(frozen=True, slots=True)
class Poll:
    """Attempt again after a pause: the backoff's next step, capped (:func:`poll_delay`)."""

    #: The holder's remaining lease in ms: -1 no known end (or no verdict), -2 the key
    #: vanished; another code (:data:`~aiolock._lease.NOT_HELD`) caps nothing.
    pttl: int


#: What :func:`decide` says to do after an attempt.
Step: TypeAlias = (
    Cancelled
    | Acquired
    | UndoLateWin
    | GiveUp
    | RaiseNoConnection
    | RaiseUnanswered
    | RaiseLate
    | RetryNow
    | Subscribe
    | WaitInQueue
    | Poll
)

_ACQUIRED: Final = Acquired()
_UNDO_LATE_WIN: Final = UndoLateWin()
_GIVE_UP: Final = GiveUp()
_RAISE_NO_CONNECTION: Final = RaiseNoConnection()
_RETRY_NOW: Final = RetryNow()
_SUBSCRIBE: Final = Subscribe()


def decide(seen: Seen) -> Step:
    """What to do after an attempt, from what it returned and what the waiter knows.

    Pure: no ``await``, no clock, no state; the same ``seen`` gives the same
    step. The rules, the first that applies:

    1. unanswered, with no deadline, for one whole lease: :class:`RaiseLate`;
    2. cancelled: :class:`Cancelled` (undo the attempt if it won);
    3. won: :class:`Acquired` while the lease it granted lasts, else
       :class:`UndoLateWin`;
    4. past the deadline: :class:`GiveUp` with a verdict (someone holds),
       else :class:`RaiseNoConnection` (nothing was sent) or
       :class:`RaiseUnanswered` (never "not acquired" without a verdict);
    5. no verdict: :class:`Poll`;
    6. the bare first attempt failed: :class:`RetryNow`;
    7. queued on the server while someone holds (not a foreign key without
       expiry): :class:`Subscribe` before the first subscription,
       :class:`WaitInQueue` while notifications are live;
    8. else :class:`Poll`, capped by the holder's ``PTTL``.
    """
    reply = seen.reply
    unanswered = seen.unanswered
    if unanswered is not None and seen.deadline is None:
        late_since = seen.late_since
        if late_since is not None and seen.now - late_since >= seen.ttl:
            return RaiseLate(unanswered)
    won = reply is not None and reply[0] != 0
    if seen.cancelled:
        return Cancelled(undo=won)
    if won:
        return _ACQUIRED if seen.now < seen.sent + seen.span else _UNDO_LATE_WIN
    deadline = seen.deadline
    if deadline is not None and seen.now >= deadline:
        if reply is not None:
            return _GIVE_UP
        if seen.no_connection:
            return _RAISE_NO_CONNECTION
        return RaiseUnanswered(unanswered)
    if reply is None:
        return Poll(-1)
    pttl = reply[1]
    if pttl == RETRY:
        return _RETRY_NOW
    # A key without expiry (PTTL -1) is not an aiolock holding (every one has a
    # lease): another library's lock, whose release sends no grant. Poll it.
    if seen.queued and not (pttl == -1 and seen.foreign_without_expiry):
        if seen.notifications is _UNASKED:
            return _SUBSCRIBE
        if seen.notifications is _LIVE:
            return WaitInQueue(pttl)
    return Poll(pttl)


def queued_at_once(
    reply: Reply | None,
    unanswered: Exception | None,
    cancelled: bool,
    deadline: float | None,
    now: float,
    queued: bool,
    foreign_without_expiry: bool,
) -> bool:
    """Whether :func:`decide` would apply its rule 7, told without a :class:`Seen`.

    The waiter's hot path: an answered attempt that found the lock held and
    left the caller queued behind an aiolock holding, its caller not
    cancelled, its deadline not reached. Where this says True, decide says
    :class:`Subscribe` with no subscription yet, else :func:`subscribed`'s
    step for whether notifications are live.
    """
    if unanswered is not None or cancelled or reply is None or not queued:
        return False
    if reply[0] != 0 or (deadline is not None and now >= deadline):
        return False
    pttl = reply[1]
    return pttl != RETRY and not (pttl == -1 and foreign_without_expiry)


def subscribed(pttl: int, live: bool) -> Step:
    """What :func:`decide` says of an attempt it said :class:`Subscribe` to, once subscribed.

    Only what the waiter knows of notifications changed (rule 7): live, it
    waits in the queue; else it polls, capped by the holder's ``PTTL``. The
    loop takes this instead of writing down the attempt again.
    """
    return WaitInQueue(pttl) if live else Poll(pttl)


def wins_at_once(
    reply: Reply | None,
    unanswered: Exception | None,
    cancelled: bool,
    sent: float,
    now: float,
    span: float,
) -> bool:
    """Whether :func:`decide` would say :class:`Acquired`, told without a :class:`Seen`.

    The hot path: an answered attempt that won within its lease, its caller
    not cancelled (rules 2 and 3). Every other answer needs the whole
    :class:`Seen`; where this says True, :func:`decide` says ``Acquired``.
    """
    return (
        unanswered is None
        and not cancelled
        and reply is not None
        and reply[0] != 0
        and now < sent + span
    )


def poll_delay(step: float, pttl: int, deadline: float | None, now: float) -> float:
    """How long a poller sleeps: the backoff ``step``, capped by the holder's lease and deadline.

    ``pttl`` is the holder's remaining lease in ms: an expiring holder sends
    no message, so the poller wakes when that lease ends (1 ms after); -2
    (the key vanished meanwhile) means at once; -1 leaves the step. The
    delay is never negative (``step`` is not) and never ends past
    ``deadline``, seen at ``now``.
    """
    delay = step
    if pttl >= 0:
        delay = min(delay, pttl / 1000 + 0.001)
    elif pttl == -2:
        delay = 0.0
    if deadline is not None:
        delay = max(0.0, min(delay, deadline - now))
    return delay


@final
class Pacing:
    """One call's backoff: the policy's delays, one step per poll.

    A finite policy that ran out repeats its latest step (0 if it gave none).
    """

    __slots__ = ("_delays", "step")

    def __init__(self, delays: Iterator[float]) -> None:
        self._delays = delays
        #: The latest step taken.
        self.step = 0.0

    def take(self) -> float:
        """The next step, checked.

        Raises:
            TypeError: the policy's delay is not a number.
            ValueError: the policy's delay is negative, not finite or too long.
        """
        self.step = _backoff._check_delay(next(self._delays, self.step))
        return self.step
