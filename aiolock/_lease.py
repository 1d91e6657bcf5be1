"""Leases: what a primitive does on the server, and the lease on one server.

A *lease* is the part of a primitive that talks to the server(s): how to
attempt an acquisition, release it, extend it and undo an attempt whose
outcome is unknown, with the primitive's own scripts and keys. Everything
above it (the wait loop in :mod:`aiolock._contend`, the life of a holding in
:mod:`aiolock._holding`) is written once against the :class:`Lease`
protocol, and never names a primitive.

:class:`ServerLease` is the lease on one server (or one cluster slot); a
quorum of them is :class:`aiolock._quorum.QuorumLease`. Which commands a
lease sends is its own business: a newer server's compare-and-delete
(``DELIFEQ``) could replace the release script here without the wait loop
or the holding life knowing.

An attempt answers ``(taken, value)``: ``(1, fence)`` when the lock was
taken (``fence`` is 0 without fencing), else ``(0, code)`` where ``code`` is
the holder's remaining lease in milliseconds (``PTTL``: ``-1`` when held
with no known end, ``-2`` when the key vanished meanwhile), or one of
:data:`RETRY` and :data:`NOT_HELD`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _notify
from ._cancel import run_shielded
from ._checks import check_ttl, to_ms
from ._keys import keys_for
from ._queue import LocalQueue, existing_queue, queue_for, queues_of
from ._scripts import ACQUIRE, EXTEND, HANDOVER, RELEASE, UNMARK
from ._timers import Cutoff, Timer
from ._wire import Wire

if TYPE_CHECKING:
    from ._keys import Keys
    from ._types import Client

__all__ = [
    "CLEANUP_BOUND",
    "GRACE",
    "NOT_HELD",
    "RETRY",
    "Call",
    "Lease",
    "Reply",
    "ServerLease",
    "Unanswered",
    "server_lease",
]

logger = logging.getLogger("aiolock")

#: How long a release (or hand-over) may run past the holding's lease end before it is cut off.
GRACE: Final = 0.1
#: The longest a cleanup (undoing an attempt, finishing a cancelled release) may take.
CLEANUP_BOUND: Final = 1.0
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
    attempt that may have landed, take down its waiting marker. All of it
    shares one budget (:meth:`cleanup`), so that a server that stopped
    answering costs the call one cleanup bound, not one per step.
    """

    __slots__ = ("_cleanup_end", "contended", "unanswered")

    def __init__(self) -> None:
        self.contended = False
        #: How long the latest attempt cut off had waited for its answer (seconds).
        self.unanswered = 0.0
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
    #: The first attempt can be a cheaper one that only says taken or not (:data:`RETRY`).
    bare_first: bool
    #: Failed attempts can raise the waiting marker (``waiter``, ``mark_ms``).
    marks: bool
    #: Attempts return a fencing number.
    fencing: bool
    #: How the server(s) had stopped holding our token, in words: "<gone> at release".
    gone: str
    #: The lease an acquisition asks for, in seconds (the primitive's ``ttl``).
    ttl: float
    #: The same lease as the holder counts it (:meth:`counted` of :attr:`ttl`).
    span: float

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

    def generation(self) -> int | None:
        """The release channel's generation if this process listens to it, else None."""
        ...

    async def subscribe(self, seen: int | None) -> _notify.Subscription | None:
        """Listen for releases (see :mod:`aiolock._notify`); None without notifications."""
        ...

    async def attempt(
        self,
        token: str,
        deadline: float | None,
        waiter: str | None,
        mark_ms: int,
        task: asyncio.Task[Any],
        spare: Timer | None,
        call: Call,
    ) -> Reply | None:
        """One attempt of ``task`` to take the lock with ``token`` for :attr:`ttl`.

        Returns None if it was cut off: still unanswered when the link's
        allowance past the deadline ran out. ``spare`` is a timer the caller
        lends to the cut-off (see :class:`~aiolock._timers.Cutoff`); ``call``
        is told when the attempt found another holder's key, and its cleanup
        budget bounds an undo.

        Raises:
            Unanswered: no verdict from the server(s) in time.
        """
        ...

    async def release(
        self, token: str, until: float, task: asyncio.Task[Any], spare: Timer | None
    ) -> bool:
        """Delete the lock if it holds ``token``; False if it no longer did.

        Bounded by ``until`` (the holding's lease end), after which the
        server expires the key by itself; ``task`` is the releasing task, and
        ``spare`` a timer of the holding's due before ``until`` that a cut-off
        may reuse (see :class:`~aiolock._timers.Cutoff`).
        """
        ...

    async def extend(self, token: str, ttl: float) -> bool:
        """Reset the lease of ``token`` to ``ttl``; False if it is no longer ours."""
        ...

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Delete the lock if it holds ``token``: shielded, bounded, best effort.

        Bounded by ``call``'s cleanup budget when given, else by a budget of its own.
        """
        ...

    async def unmark(self, waiter: str, call: Call | None = None) -> None:
        """Take down the waiting marker if ``waiter`` raised it last: shielded, best effort.

        Bounded by ``call``'s cleanup budget when given; skipped when it is spent.
        """
        ...

    async def mark(self, waiter: str, mark_ms: int, until: float, task: asyncio.Task[Any]) -> None:
        """Raise the waiting marker again for ``mark_ms`` (a long pause); best effort.

        ``task`` (the waiter) is cut off at ``until`` (its pause's end): a
        server that does not answer never holds up the waiter's next attempt.
        """
        ...

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Release ``token`` straight to a local waiter (for its lease); None if this cannot.

        Returns ``(1, fence)`` when the lock now holds ``heir_token``;
        ``(2, marker)`` when it was released for waiters elsewhere
        (``may_yield``; ``marker`` as :func:`aiolock._queue.yield_wait`
        takes it); ``(0, 0)`` when ``token`` no longer held it.
        """
        ...

    async def held(self) -> bool:
        """Whether anyone holds the lock now (asks the server)."""
        ...

    async def holds(self, token: str) -> bool:
        """Whether ``token`` holds the lock now (asks the server)."""
        ...


#: How many leases a client remembers for the next lock made with the same options.
_REMEMBERED: Final = 1024


@final
class _Site:
    """What the leases of one client share, looked up once per lock."""

    __slots__ = ("__weakref__", "leases", "listeners", "queues", "wire")

    def __init__(self, client: Client) -> None:
        self.wire = Wire(client)
        self.queues = queues_of(client)
        self.listeners = _notify.listeners_of(client)
        #: Leases by their options: a lease holds no state of its own, so the locks a
        #: handler makes per request with the same options share one.
        self.leases: dict[tuple[Any, ...], ServerLease] = {}


_sites: weakref.WeakKeyDictionary[Any, _Site] = weakref.WeakKeyDictionary()
#: The client and the site of the latest lookup, both weakly (most programs have one client).
_latest: tuple[weakref.ReferenceType[Any], weakref.ReferenceType[_Site]] | None = None


def _site(client: Client) -> _Site:
    global _latest  # a one-entry cache in front of the registry
    latest = _latest
    if latest is not None and latest[0]() is client:
        site = latest[1]()
        if site is not None:
            return site
    try:
        site = _sites[client]
    except KeyError:
        site = _sites[client] = _Site(client)
    _latest = (weakref.ref(client), weakref.ref(site))
    return site


def server_lease(
    client: Client,
    name: str,
    prefix: str,
    ttl: float,
    notify: bool,
    fencing: bool,
    replicas: int,
    replica_timeout: float | None,
    replica_fsync: bool,
) -> ServerLease:
    """The lease of ``client`` with these options, made once.

    Every option but ``name`` and ``prefix`` is checked already; those two
    are checked by :func:`~aiolock._keys.keys_for` when the lease is made
    (a name found here is one that passed). ``replica_timeout`` defaults to
    ``min(ttl / 10, 1)``.

    Raises:
        TypeError: ``name`` or ``prefix`` is not a str.
        ValueError: ``name`` is empty, or the key's hash tag would be empty.
    """
    site = _site(client)
    if name.__class__ is not str or prefix.__class__ is not str:
        keys_for(name, prefix)  # raises; a str subclass passes, and is looked up below
    options = (name, prefix, ttl, notify, fencing, replicas, replica_timeout, replica_fsync)
    lease = site.leases.get(options)
    if lease is None:
        keys = keys_for(name, prefix)
        if len(site.leases) >= _REMEMBERED:
            site.leases.clear()
        lease = site.leases[options] = ServerLease(
            client,
            name,
            keys,
            ttl,
            notify=notify,
            fencing=fencing,
            replicas=replicas,
            replica_timeout=min(ttl / 10, 1.0) if replica_timeout is None else replica_timeout,
            replica_fsync=replica_fsync,
        )
    return lease


@final
class ServerLease:
    """The lease of a lock on one server, or one slot of a cluster (see :class:`Lease`)."""

    __slots__ = (
        "_acquire_keys",
        "_cleanup",
        "_listeners",
        "_ms",
        "_notify",
        "_queues",
        "_release_args",
        "_replica_fsync",
        "_replica_timeout",
        "_replicas",
        "_site",
        "bare_first",
        "fencing",
        "gone",
        "key",
        "keys",
        "marks",
        "name",
        "span",
        "ttl",
        "wire",
    )

    def __init__(
        self,
        client: Client,
        name: str,
        keys: Keys,
        ttl: float,
        *,
        notify: bool = True,
        fencing: bool = False,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        replica_fsync: bool = False,
    ) -> None:
        site = _site(client)
        self.wire = site.wire
        self.name = name
        self.keys = keys
        self.key = keys.lock
        self._notify = notify
        self.fencing = fencing
        self._replicas = replicas
        self._replica_timeout = replica_timeout
        self._replica_fsync = replica_fsync
        self.ttl = self.span = ttl
        self._ms = to_ms(ttl)
        self._cleanup = min(ttl, CLEANUP_BOUND)
        self.bare_first = not (fencing or replicas)
        self.marks = True
        self.gone = "the key was gone or held by another holder"
        self._acquire_keys = (
            (keys.lock, keys.marker, keys.fence) if fencing else (keys.lock, keys.marker)
        )
        self._release_args = (keys.channel, "1" if self.wire.cluster else "0")
        self._site = site
        self._queues = site.queues
        self._listeners = site.listeners if notify else None

    def check_ttl(self, value: object, name: str = "ttl") -> float:
        """Check a lease: a finite number of seconds, at least 1 ms."""
        return check_ttl(value, name)

    def counted(self, ttl: float) -> float:
        """The holder counts the whole lease (from when it sent the command)."""
        return ttl

    def queue(self, loop: asyncio.AbstractEventLoop) -> LocalQueue:
        """The client's local queue for this key, shared by every lock object on it."""
        return queue_for(self._queues, self.key, loop)

    def existing_queue(self) -> LocalQueue | None:
        """The client's local queue for this key, if there is one (it may be idle)."""
        return existing_queue(self._queues, self.key)

    def generation(self) -> int | None:
        """The release channel's generation if this process listens to it, else None."""
        listeners = self._listeners
        if not listeners:  # notify=False, or nobody of this client listens to anything
            return None
        return _notify.generation_in(listeners, self._release_args[0])

    async def subscribe(self, seen: int | None) -> _notify.Subscription | None:
        """Listen for releases on the lock's channel (None with ``notify=False``)."""
        if self._listeners is None:
            return None
        return await _notify.subscribe(self.wire.client, self._release_args[0], seen)

    # -- acquire -----------------------------------------------------------------------

    async def attempt(
        self,
        token: str,
        deadline: float | None,
        waiter: str | None,
        mark_ms: int,
        task: asyncio.Task[Any],
        spare: Timer | None,
        call: Call,
    ) -> Reply | None:
        """Send one acquire attempt of ``task``; None if it was cut off past the deadline.

        An attempt without a ``waiter`` and without fencing is a bare ``SET NX
        PX``: on an uncontended lock (the common case) it costs a tenth less
        than the script, client and server together; if it fails, the reply
        is ``(0, RETRY)`` and the scripted attempt follows, which gets the
        PTTL (and, with ``mark_ms``, raises the waiting marker) in the same
        round trip.

        An attempt still in flight at the deadline is awaited as long as the
        link needs (:attr:`Wire.allowance <aiolock._wire.Wire.allowance>`),
        and never past the lease it asks for: a reply after that grants
        nothing. Before the client's first answer, what the link needs is
        not known: the whole lease.

        Whatever interrupts the attempt (cancellation, a redis-py error, the
        cut-off), the ``SET`` may have reached the server, so it is undone
        with the same token before this returns or raises.
        """
        wire = self.wire
        if wire.cluster:
            await wire.ready()
        # The bare SET is awaited here directly (the common case: one frame less).
        bare = waiter is None and self.bare_first
        sending = (
            wire.set_nx(self.key, token, self._ms)
            if bare
            else self._scripted(token, waiter, mark_ms)
        )
        sent = time.monotonic()
        try:
            if deadline is None:
                reply = await sending
            else:
                when = sent + self.span
                allowance = wire.allowance
                if allowance is not None:
                    link = (deadline if deadline > sent else sent) + allowance
                    if link < when:
                        when = link
                with Cutoff(when, task, spare, lend=True) as cutoff:
                    reply = await sending
                if cutoff.expired:
                    reply = None
        except BaseException:
            await self.undo(token, call)
            raise
        if reply is None:
            call.unanswered = time.monotonic() - sent
            # Cut off: past the deadline the call is ending, and this is its cleanup;
            # before it (a lease shorter than the wait), a routine undo.
            ending = deadline is not None and time.monotonic() >= deadline
            await self.undo(token, call if ending else None)
            return None
        if not self._replicas:  # WAIT's time is the replicas', not the link's
            wire.observe(time.monotonic() - sent)
        answer: Reply
        if reply is True:
            answer = (1, 0)
        elif reply is False:
            answer = (0, RETRY)  # the bare SET does not say for how long it is held
        else:
            answer = reply
        if not answer[0] and answer[1] != NOT_HELD:
            call.contended = True
        return answer

    async def _scripted(self, token: str, waiter: str | None, mark_ms: int) -> Reply:
        """The acquire script: with fencing, with the waiting marker, or with replicas."""
        ms = self._ms
        if self._replicas:
            return await self._replicated(token, ms, waiter, mark_ms)
        reply = await self.wire.run(ACQUIRE, self._acquire_keys, (token, ms, waiter or "", mark_ms))
        return (int(reply[0]), int(reply[1]))

    async def _replicated(self, token: str, ms: int, waiter: str | None, mark_ms: int) -> Reply:
        """An attempt that counts only once ``replicas`` replicas acknowledged it.

        The acquire script and ``WAIT`` (or ``WAITAOF``) go in one pipeline,
        so that it waits for this very write. An acquisition without the
        acknowledgement in time is undone and answers ``(0, NOT_HELD)``.
        """
        wait_ms = max(1, to_ms(self._replica_timeout))
        then: tuple[Any, ...] = (
            ("WAITAOF", 0, self._replicas, wait_ms)
            if self._replica_fsync
            else ("WAIT", self._replicas, wait_ms)
        )
        taken, acked = await self.wire.run_then(
            ACQUIRE, self._acquire_keys, (token, ms, waiter or "", mark_ms), then
        )
        count = int(acked[1]) if self._replica_fsync else int(acked)
        if int(taken[0]) and count < self._replicas:
            await self.undo(token)
            logger.info(
                "acquisition of lock %r not acknowledged by %d replicas within %s s "
                "(%d did); released it",
                self.name,
                self._replicas,
                self._replica_timeout,
                count,
            )
            return (0, NOT_HELD)
        return (int(taken[0]), int(taken[1]))

    async def unmark(self, waiter: str, call: Call | None = None) -> None:
        """Take down the waiting marker if it is ours: shielded, bounded, best effort."""
        bound = self._cleanup if call is None else call.cleanup(self._cleanup)
        if bound <= 0:
            logger.debug(
                "no time left to take down the waiting marker of %r (it expires by itself)",
                self.name,
            )
            return
        try:
            await run_shielded(lambda: self.wire.run(UNMARK, (self.keys.marker,), (waiter,)), bound)
        except Exception as exc:
            logger.debug(
                "could not take down the waiting marker of %r: %r (it expires by itself)",
                self.name,
                exc,
            )

    async def mark(self, waiter: str, mark_ms: int, until: float, task: asyncio.Task[Any]) -> None:
        """Set the waiting marker to ``waiter`` for ``mark_ms`` again, cut off at ``until``.

        An error or a cut-off is only logged: the marker expires by itself.
        """
        try:
            with Cutoff(until, task) as cutoff:
                await self.wire.set_px(self.keys.marker, waiter, mark_ms)
            if cutoff.expired:
                logger.debug("no answer in time to raise the waiting marker of %r again", self.name)
        except Exception as exc:
            logger.debug(
                "could not raise the waiting marker of %r again: %r (it expires by itself)",
                self.name,
                exc,
            )

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Delete the key if it holds ``token``: shielded, bounded, best effort."""
        bound = self._cleanup if call is None else call.cleanup(self._cleanup)
        if bound <= 0:
            logger.debug("no time left to undo an attempt on %r (the lease expires it)", self.name)
            return
        try:
            await run_shielded(lambda: self.delete(token), bound)
        except Exception as exc:
            logger.debug(
                "could not undo an attempt on %r: %r (the lease will expire it)", self.name, exc
            )

    # -- raw operations (a quorum of leases calls them on each node) -------------------

    async def take(self, token: str) -> bool:
        """One bare ``SET NX PX``: whether it took the lock (no undo, no cut-off)."""
        return await self.wire.set_nx(self.key, token, self._ms)

    async def delete(self, token: str) -> bool:
        """The release script: delete the key if it holds ``token``, and announce it."""
        return bool(await self.wire.run(RELEASE, (self.key,), (token, *self._release_args)))

    async def value(self) -> Any:
        """The token that holds the lock now (``GET``), or None."""
        return await self.wire.get(self.key)

    # -- holding -----------------------------------------------------------------------

    async def release(
        self, token: str, until: float, task: asyncio.Task[Any], spare: Timer | None
    ) -> bool:
        """Delete the key if it holds ``token`` and announce it; cut off at ``until`` + GRACE.

        Raises:
            redis.exceptions.TimeoutError: no answer before ``until`` (the
                lease end): the server expires the key by itself.
        """
        try:
            with Cutoff(until + GRACE, task, spare) as cutoff:
                deleted = bool(
                    await self.wire.run(RELEASE, (self.key,), (token, *self._release_args))
                )
        except asyncio.CancelledError:
            await self.undo(token)
            raise
        if cutoff.expired:
            raise RedisTimeoutError(
                f"releasing lock {self.name!r}: no answer before its lease ended; "
                "the server expires the key by itself"
            )
        return deleted

    async def extend(self, token: str, ttl: float) -> bool:
        """Reset the lease of ``token``'s key to ``ttl``; False if it is not ours."""
        sent = time.monotonic()
        extended = bool(await self.wire.run(EXTEND, (self.key,), (token, to_ms(ttl))))
        self.wire.observe(time.monotonic() - sent)
        return extended

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Swap ``token`` for ``heir_token`` in one script (see HANDOVER); None if it cannot.

        An acquisition that replicas must acknowledge is taken on the server,
        not handed over.
        """
        if not isinstance(heir, ServerLease) or self._replicas or heir._replicas:
            return None
        # The client's own listener counts whether or not this lock waits by notification:
        # another lock object on the same client and key may be subscribed.
        own = 0 if _notify.generation_in(self._site.listeners, self._release_args[0]) is None else 1
        args = (
            token,
            heir_token,
            heir._ms,
            *self._release_args,
            own,
            "1" if may_yield else "0",
        )
        reply = await self.wire.run(HANDOVER, heir._acquire_keys, args)
        return (int(reply[0]), int(reply[1]))

    async def held(self) -> bool:
        """Whether the key exists (asks the server)."""
        return await self.wire.exists(self.key)

    async def holds(self, token: str) -> bool:
        """Whether the key holds ``token`` (asks the server)."""
        value = await self.wire.get(self.key)
        return value is not None and value in (token, token.encode())
