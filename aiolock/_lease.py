"""Leases: what a primitive does on the server, as the engine sees it.

A *lease* is the part of a primitive that talks to the server(s): how to
attempt an acquisition, release it, extend it and undo an attempt whose
outcome is unknown, with the primitive's own scripts and keys. Everything
above it (the wait loop in :mod:`aiolock._contend`, the life of a holding in
:mod:`aiolock._watch`) is written once against the :class:`Lease`
protocol, and never names a primitive.

:class:`~aiolock._server_lease.ServerLease` is the lease on one server (or
one cluster slot); a quorum of them is :class:`aiolock._quorum.QuorumLease`.
Which commands a lease sends is its own business: a newer server's
compare-and-delete (``DELIFEQ``) could replace the release script without
the wait loop or the holding life knowing.

An attempt answers ``(taken, value)``: ``(1, fence)`` when the lock was
taken (``fence`` is 0 without fencing), else ``(0, code)`` where ``code`` is
the holder's remaining lease in milliseconds (``PTTL``: ``-1`` when held
with no known end, ``-2`` when the key vanished meanwhile), or one of
:data:`RETRY` and :data:`NOT_HELD`.

Every lease attempts, releases, extends and undoes. A lease that also
*queues* (the one-server lease) has a :class:`Queueing` part, which the
engine reaches through :attr:`Lease.queueing` (None for a lease that does
not queue, as Redlock's): a waiter that failed stands in the lock's queue
on the server (docs/server-queue.md, the scripts in :mod:`aiolock._scripts`),
and a release hands the lock straight to the first live waiter. A queued
waiter keeps its entry alive with :meth:`Queueing.refresh` every
:attr:`Queueing.refresh_every` seconds, and takes it out with
:meth:`Queueing.leave` when it gives up.

The calling task and a timer it lends to a cut-off (see
:class:`~aiolock._timers.Cutoff`) travel on the :class:`Call` of an
acquisition (:attr:`Call.task`, :attr:`Call.spare`); a release is handed
its cut-off whole.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from ._timers import Cutoff, Timer

if TYPE_CHECKING:
    from . import _notify
    from ._queue import LocalQueue

__all__ = [
    "BATCH_MOST",
    "CLEANUP_BOUND",
    "CONNECT_GRACE",
    "NOT_HELD",
    "RETRY",
    "Call",
    "Extension",
    "Lease",
    "Queueing",
    "Reply",
    "Unanswered",
]

#: The longest a cleanup (undoing an attempt, finishing a cancelled release) may take.
CLEANUP_BOUND: Final = 1.0
#: How long past its deadline an attempt may wait for a connection to the server when
#: the client has never had an answer (a server that is down, a port nobody listens
#: on): then it is abandoned, with nothing sent and nothing to undo.
CONNECT_GRACE: Final = 0.3
#: A failed attempt whose holder's lease is unknown (a bare ``SET``): try the full attempt now.
RETRY: Final = -3
#: A failed attempt that nobody else's holding explains (replicas did not acknowledge
#: it, a quorum was not reached in time): no contention, no lease to wait for.
NOT_HELD: Final = -4

#: What an attempt answers: ``(1, fence)`` or ``(0, code)`` (see the module docs).
Reply = tuple[int, int]


@final
class Call:
    """One ``acquire()`` call: what it saw, and what is left of its cleanup budget.

    :attr:`contended` is set when the caller queued behind another task of
    its process, or when an attempt found another holder's key (not when an
    attempt merely failed: an error, a late reply, replicas that did not
    acknowledge).

    A call that gives up may have cleanup to do on the server: undo an
    attempt that may have landed, take its entry out of the queue. All of it
    shares one budget (:meth:`cleanup`), so that a server that stopped
    answering costs the call one cleanup bound, not one per step.
    """

    __slots__ = (
        "_cleanup_end",
        "attempts",
        "contended",
        "queued",
        "reached",
        "renews",
        "spare",
        "task",
        "token",
        "unanswered",
        "waiting",
    )

    def __init__(self, token: str | None = None) -> None:
        #: The token of every attempt of this call (and of its queue entry): the one given
        #: (see :func:`aiolock._identity.mint`), else 128 random bits.
        self.token = os.urandom(16).hex() if token is None else token
        #: How many attempts the call has sent.
        self.attempts = 0
        #: An attempt put the caller in the queue on the server (it may still be there).
        self.queued = False
        #: The holding will be renewed (else a grant must give it its whole lease).
        self.renews = True
        self.contended = False
        #: How long the latest attempt cut off had waited for its answer (seconds).
        self.unanswered = 0.0
        #: The latest attempt may have reached the server (it went out on a connection);
        #: one that did not has nothing to undo (see :class:`~aiolock._wire.Trace`).
        self.reached = False
        #: The latest attempt waits in the process for a free slot of the client or a
        #: connection of its exhausted pool (see :class:`~aiolock._wire.Trace`).
        self.waiting = False
        #: The calling task (the wait loop sets it): a cut-off of its attempt cancels it.
        self.task: asyncio.Task[Any] | None = None
        #: A timer the wait loop lends to the cut-off of the attempt in flight (see
        #: :class:`~aiolock._timers.Cutoff`), or None.
        self.spare: Timer | None = None
        self._cleanup_end: float | None = None

    def cleanup(self, bound: float) -> float:
        """Seconds left for cleanup: the call's first cleanup starts a budget of ``bound``."""
        now = time.monotonic()
        end = self._cleanup_end
        if end is None:
            end = self._cleanup_end = now + bound
        return end - now


class Unanswered(Exception):
    """An attempt got no verdict: the server(s) did not answer in time.

    Not "held by someone": the wait loop tries again while its deadline
    allows (without one, for one lease), then raises :attr:`error`.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        #: The error to raise once the wait loop gives up.
        self.error = error


class Queueing(Protocol):
    """The part of a lease that queues on its server: what a waiter and a releaser ask of it.

    A lease has one (:attr:`Lease.queueing`) when a failed attempt can put
    the caller in the lock's queue on the server, where releases and grants
    are announced (:mod:`aiolock._notify`).
    """

    #: A grant heard on the channel is the lock (else the heir confirms it with an attempt).
    accepts_grants: bool
    #: An attempt's ``-1`` means a key without expiry: no holding of ours (every one has a
    #: lease) but another library's lock on a shared key, whose release grants nothing.
    foreign_without_expiry: bool
    #: Seconds between two refreshes of a queued waiter's entry.
    refresh_every: float

    def per_call_waiting(self) -> int | None:
        """How many acquisitions wait in local queues of their own; None: one is shared."""
        ...

    def generation(self) -> int | None:
        """The release channel's generation if this process listens to it, else None."""
        ...

    async def subscribe(self, seen: int | None) -> _notify.Subscription | None:
        """Listen for releases (see :mod:`aiolock._notify`); None without notifications."""
        ...

    async def leave(self, call: Call) -> None:
        """Take a queued caller out of the queue: shielded, bounded by ``call``'s budget.

        A grant that reached it meanwhile goes on to the next waiter.
        """
        ...

    async def stop_waiting(self, call: Call) -> None:
        """``call`` no longer waits in the queue (it holds, or ends): shielded, bounded.

        Raises only ``CancelledError``, once what it does is done.
        """
        ...

    async def refresh(self, call: Call, until: float) -> tuple[bool | None, float]:
        """Keep the queued waiter ``call`` alive: whether it still stands in the queue.

        Returns ``(standing, proof)``: True, and when the command was sent
        that found it standing (a grant's lease counts from there; with the
        client's other waiters it may be one sent a moment ago for them
        all); False if its entry is gone; None if not known (an error, or no
        answer by ``until``, when :attr:`Call.task` is cut off). Gone means
        granted (the grant deletes the entry) or lost (the server lost its
        data): the caller attempts again, which tells which.
        """
        ...

    async def remaining(self, call: Call, until: float) -> int | None:
        """The holder's remaining lease in ms (``PTTL``), None if unknown.

        Cut off at ``until`` (:attr:`Call.task` is the task cut off).
        """
        ...

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Release ``token`` straight to a local waiter (for its lease); None if this cannot.

        Returns ``(1, fence)`` when the lock now holds ``heir_token``;
        ``(2, ms)`` when it went to the first live waiter of the queue on the
        server instead (``may_yield``); ``(0, 0)`` when ``token`` no longer
        held it.
        """
        ...


class Lease(Protocol):
    """What the wait loop and the holding life need of a primitive's server side.

    Every method that may have left a token on the server when interrupted
    (cancelled, failed, cut off) undoes it before it returns or raises,
    except :meth:`release`, whose cancellation undoes it too.
    """

    #: The primitive's name, as given.
    name: str
    #: The key (or, on several servers, the key on each): for messages and ``repr``.
    key: str
    #: Attempts return a fencing number.
    fencing: bool
    #: How the server(s) had stopped holding our token, in words: "<gone> at release".
    gone: str
    #: The lease an acquisition asks for, in seconds (the primitive's ``ttl``).
    ttl: float
    #: The same lease as the holder counts it (:meth:`counted` of :attr:`ttl`).
    span: float

    @property
    def queueing(self) -> Queueing | None:
        """The part that queues on the server; None: a failed attempt does not queue."""
        ...

    def check_ttl(self, value: object, name: str = "ttl") -> float:
        """Check a lease this lease can ask for; return it in seconds."""
        ...

    def counted(self, ttl: float) -> float:
        """How long a lease of ``ttl`` asked for lasts as the holder counts it."""
        ...

    def queue(self, loop: asyncio.AbstractEventLoop) -> LocalQueue:
        """The local queue of ``loop``'s tasks that wait through this lease (made if need be)."""
        ...

    def existing_queue(self) -> LocalQueue | None:
        """The local queue, if there is one (it may be idle)."""
        ...

    async def attempt(self, deadline: float | None, queue_up: bool, call: Call) -> Reply | None:
        """One attempt of :attr:`Call.task` to take the lock with ``call.token`` for :attr:`ttl`.

        Returns None if it was cut off: still unanswered when the link's
        allowance past the deadline ran out. With ``queue_up`` (given only
        to a lease with a :attr:`queueing` part), a failed attempt puts the
        caller in the queue (and sets ``call.queued``). The cut-off may use
        :attr:`Call.spare`; ``call`` is told when the attempt found another
        holder's key, and its cleanup budget bounds an undo.

        Raises:
            Unanswered: no verdict from the server(s) in time.
        """
        ...

    async def release(self, token: str, cutoff: Cutoff) -> bool:
        """Delete the lock if it holds ``token``; False if it no longer did.

        Bounded by ``cutoff`` (at the holding's lease end and
        :data:`~aiolock._timers.GRACE`, after which the server expires the
        key by itself), entered around what is sent; a lease whose calls
        have bounds of their own may leave it unused.

        Raises:
            redis.exceptions.TimeoutError: cut off: the key expires by itself.
        """
        ...

    async def extend(self, token: str, ttl: float) -> bool:
        """Reset the lease of ``token`` to ``ttl``; False if it is no longer ours."""
        ...

    def batch_key(self) -> Hashable:
        """What the leases renewed together in one :meth:`extend_many` share.

        Leases with equal keys can be renewed by one call: the same
        server(s), script and hash slot.
        """
        ...

    async def extend_many(self, batch: Sequence[Extension]) -> list[bool | Exception]:
        """:meth:`extend` for every ``(lease, token, ttl)`` of ``batch``, in as few calls as can be.

        Every lease of ``batch`` has this lease's :meth:`batch_key`. Returns
        one outcome per item, in order: True (renewed), False (no longer
        ours), or the error that leaves it open.

        Raises:
            Exception: the call failed for every item.
        """
        ...

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Delete the lock if it holds ``token``: shielded, bounded, best effort.

        Bounded by ``call``'s cleanup budget when given, else by a budget of its own.
        """
        ...

    async def held(self) -> bool:
        """Whether anyone holds the lock now (asks the server)."""
        ...

    async def forced_by(self, token: str) -> str | None:
        """Who released ``token``'s holding by force (its mark), or None (asks the server).

        Only the loss path asks: a holding found gone may have been freed by
        ``aiolock release --force``, which leaves a mark naming the forcer.
        """
        ...

    async def holds(self, token: str) -> bool:
        """Whether ``token`` holds the lock now (asks the server)."""
        ...


#: One renewal of a batch: the holding's lease, its token and the lease (seconds) to ask for.
Extension = tuple[Lease, str, float]

#: The most holdings one server call renews.
BATCH_MOST: Final = 100
