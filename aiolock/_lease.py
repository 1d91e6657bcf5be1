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

A lease that *queues* (:attr:`Lease.queues`: the one-server lease) puts a
waiter that failed in the lock's queue on the server (docs/server-queue.md,
the scripts in :mod:`aiolock._scripts`): a release then hands the lock straight
to the first live waiter. A queued waiter keeps its entry alive with
:meth:`Lease.refresh` every :attr:`Lease.refresh_every` seconds, and takes
it out with :meth:`Lease.leave` when it gives up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, cast, final

from redis.crc import key_slot
from redis.exceptions import ClusterError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _notify
from ._cancel import finish, run_shielded
from ._checks import check_ttl, shared, to_ms
from ._exceptions import LockError
from ._keeper import KEPT_LIFE, Keeper
from ._keys import keys_for
from ._queue import LocalQueue, existing_queue, queue_for, queues_of
from ._scripts import (
    ACQUIRE,
    EXTEND,
    EXTEND_MANY,
    HANDOVER,
    KEEPER_MARK_MS,
    LEAVE,
    RELEASE,
    Bound,
    Script,
    encode_entry,
)
from ._timers import GRACE, Cutoff, Timer
from ._wire import ReplyLost, Wire

if TYPE_CHECKING:
    from ._keys import Keys
    from ._types import Client

__all__ = [
    "CLEANUP_BOUND",
    "CONNECT_GRACE",
    "ENTRY_CAP",
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

#: The longest a waiter's queue entry lives without being refreshed (and not longer
#: than the lease): a dead waiter's entry is gone at most this long after its death,
#: and a grant to a waiter that died meanwhile holds the lock no longer than this.
ENTRY_CAP: Final = KEEPER_MARK_MS / 1000
#: A queued waiter refreshes its entry after this share of the entry's life.
REFRESH_SHARE: Final = 0.7
#: A kept entry's own life (ms): see :mod:`aiolock._keeper`.
_KEPT_MS: Final = to_ms(KEPT_LIFE)
#: A release that handed the lock on makes the next attempt through the same lease
#: skip the bare ``SET`` for this long (the lock is taken: go straight to the queue).
_CONTENDED_HINT: Final = 0.05

#: What an attempt answers: ``(1, fence)`` or ``(0, code)`` (see the module docs).
Reply = tuple[int, int]

#: What an acquire script checks before it tries (its argument ``looks``). QUEUED: the caller
#: may be queued, or granted the lock: it looks at the key and at the queue. LOOK: it
#: looks at the key (another kind's fails with ``WRONGTYPE``; its own token, left by an
#: earlier run whose reply was lost, is the lock). KNOWN: nothing to look at (the key is
#: a lock's and someone else's, as after a release of the caller's that handed it on).
QUEUED: Final = "1"
LOOK: Final = "2"
KNOWN: Final = "0"


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
        "token",
        "unanswered",
        "waiting",
    )

    def __init__(self) -> None:
        #: The token of every attempt of this call (and of its queue entry): 128 random bits.
        self.token = os.urandom(16).hex()  # secrets.token_hex(16), one call less
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
    #: A failed attempt can put the caller in the lock's queue on the server.
    queues: bool
    #: A grant heard on the channel is the lock (else the heir confirms it with an attempt).
    accepts_grants: bool
    #: An attempt's ``-1`` means a key without expiry: no holding of ours (every one has a
    #: lease) but another library's lock on a shared key, whose release grants nothing.
    foreign_without_expiry: bool
    #: Seconds between two refreshes of a queued waiter's entry.
    refresh_every: float
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

    def per_call_waiting(self) -> int | None:
        """How many acquisitions wait in local queues of their own; None: one is shared."""
        ...

    def generation(self) -> int | None:
        """The release channel's generation if this process listens to it, else None."""
        ...

    async def subscribe(self, seen: int | None) -> _notify.Subscription | None:
        """Listen for releases (see :mod:`aiolock._notify`); None without notifications."""
        ...

    async def attempt(
        self,
        deadline: float | None,
        queue_up: bool,
        task: asyncio.Task[Any],
        spare: Timer | None,
        call: Call,
    ) -> Reply | None:
        """One attempt of ``task`` to take the lock with ``call.token`` for :attr:`ttl`.

        Returns None if it was cut off: still unanswered when the link's
        allowance past the deadline ran out. With ``queue_up``, a failed
        attempt of a lease that :attr:`queues` puts the caller in the queue
        (and sets ``call.queued``). ``spare`` is a timer the caller lends to
        the cut-off (see :class:`~aiolock._timers.Cutoff`); ``call`` is told
        when the attempt found another holder's key, and its cleanup budget
        bounds an undo.

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

    async def leave(self, call: Call) -> None:
        """Take a queued caller out of the queue: shielded, bounded by ``call``'s budget.

        A grant that reached it meanwhile goes on to the next waiter.
        """
        ...

    async def refresh(
        self, token: str, until: float, task: asyncio.Task[Any]
    ) -> tuple[bool | None, float]:
        """Keep the queued waiter ``token`` alive: whether it still stands in the queue.

        Returns ``(standing, proof)``: True, and when the command was sent
        that found it standing (a grant's lease counts from there; with the
        client's other waiters it may be one sent a moment ago for them
        all); False if its entry is gone; None if not known (an error, or no
        answer by ``until``, when ``task`` is cut off). Gone means granted
        (the grant deletes the entry) or lost (the server lost its data):
        the caller attempts again, which tells which.
        """
        ...

    async def stop_waiting(self, call: Call) -> None:
        """``call`` no longer waits in the queue (it holds, or ends): shielded, bounded.

        Raises only ``CancelledError``, once what it does is done.
        """
        ...

    async def remaining(self, until: float, task: asyncio.Task[Any]) -> int | None:
        """The holder's remaining lease in ms (``PTTL``), None if unknown; cut off at ``until``."""
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

    async def held(self) -> bool:
        """Whether anyone holds the lock now (asks the server)."""
        ...

    async def holds(self, token: str) -> bool:
        """Whether ``token`` holds the lock now (asks the server)."""
        ...


#: One renewal of a batch: the holding's lease, its token and the lease (seconds) to ask for.
Extension = tuple[Lease, str, float]

#: The most holdings one server call renews.
BATCH_MOST: Final = 100

#: How many leases a client remembers for the next lock made with the same options.
_REMEMBERED: Final = 1024


@final
class _Site:
    """What the leases of one client share, looked up once per lock."""

    __slots__ = ("__weakref__", "keepers", "leases", "listeners", "queues", "wire")

    def __init__(self, client: Client) -> None:
        self.wire = Wire(client)
        self.queues = queues_of(client)
        self.listeners = _notify.listeners_of(client)
        #: Leases by their options: a lease holds no state of its own, so the locks a
        #: handler makes per request with the same options share one.
        self.leases: dict[tuple[Any, ...], ServerLease] = {}
        #: The client's queued waiters, per queue (see :mod:`aiolock._keeper`).
        self.keepers: dict[str, Keeper] = {}

    def keeper(self, queue: str) -> Keeper:
        """The keeper of the client's waiters in ``queue`` (made if need be)."""
        keeper = self.keepers.get(queue)
        if keeper is None:
            keeper = self.keepers[queue] = Keeper(self.wire, queue)
        return keeper


def _forget_keepers() -> None:
    """A forked child keeps none of its parent's waiters (nor their keepers' ids)."""
    for site in list(_sites.values()):
        site.keepers.clear()


_sites: weakref.WeakKeyDictionary[Any, _Site] = weakref.WeakKeyDictionary()
#: The client and the site of the latest lookup, both weakly (most programs have one client).
_latest: tuple[weakref.ReferenceType[Any], weakref.ReferenceType[_Site]] | None = None
os.register_at_fork(after_in_child=_forget_keepers)


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
    fair: bool = False,
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
    options = (name, prefix, ttl, notify, fencing, replicas, replica_timeout, replica_fsync, fair)
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
            fair=fair,
        )
    return lease


def _extend_call(
    script: Script, batch: Sequence[Extension], suffix: str
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The keys and arguments of one ``*_EXTEND_MANY`` call renewing ``batch``."""
    locks: list[str] = []
    holdings: list[Any] = []
    for lease, token, ttl in batch:
        locks.append(cast("ServerLease", lease).key)
        holdings += (token, to_ms(ttl))
    return script.call(locks=locks, suffix=suffix, holdings=holdings)


def _extended(reply: Any) -> bool | Exception:
    """One holding's outcome in an ``*_EXTEND_MANY`` reply."""
    if reply == -1:
        return ResponseError("the server could not renew this holding now (its slot migrating?)")
    return bool(reply)


class ServerLease:
    """The lease of a lock on one server, or one slot of a cluster (see :class:`Lease`).

    A primitive whose key is not a plain lock subclasses it with scripts of
    its own (:attr:`_ACQUIRE` and the others), and binds what they take
    by name in :meth:`_bind`.

    It queues: a waiter that failed waits in the lock's queue on the server,
    and a release hands the lock to the first live waiter (docs/server-queue.md).
    With ``fair``, every acquisition goes through the queue: no bare first
    ``SET`` that could take a free lock ahead of it, and no local queue (each
    waiting task has an entry of its own, so the order is strict across
    every task of every process).
    """

    __slots__ = (
        "_acquire",
        "_calls",
        "_cleanup",
        "_contended_until",
        "_entry_ms",
        "_fair",
        "_leave",
        "_letter",
        "_listeners",
        "_ms",
        "_notify",
        "_queues",
        "_release",
        "_replica_fsync",
        "_replica_timeout",
        "_replicas",
        "_sharded",
        "_site",
        "_slot",
        "accepts_grants",
        "bare_first",
        "fencing",
        "foreign_without_expiry",
        "gone",
        "key",
        "keys",
        "name",
        "queues",
        "refresh_every",
        "span",
        "ttl",
        "wire",
    )

    #: The scripts of an attempt, a release, a leave (or undo) and an extension.
    _ACQUIRE = ACQUIRE
    _RELEASE = RELEASE
    _LEAVE = LEAVE
    _EXTEND = EXTEND
    _EXTEND_MANY = EXTEND_MANY

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
        fair: bool = False,
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
        self._fair = fair
        self.ttl = self.span = ttl
        self._ms = shared(to_ms(ttl))
        self._cleanup = min(ttl, CLEANUP_BOUND)
        self.bare_first = not (fencing or replicas or fair)
        self.queues = True
        # A grant sets the key without waiting for replicas: such an heir confirms it.
        self.accepts_grants = not replicas
        self.foreign_without_expiry = True  # the lock's key is a plain string any SET NX takes
        life = min(ttl, ENTRY_CAP)
        self._entry_ms = shared(to_ms(life))
        # What a grant gives this lock's waiters: a first lease of one entry life (a dead
        # heir holds the lock no longer), renewed to the full lease like any other. (A
        # waiter that will not renew asks for its whole lease instead: see _scripted.)
        self._letter = "f" if fencing else ""
        self.refresh_every = REFRESH_SHARE * life
        self._contended_until = 0.0
        self.gone = "the key was gone or held by another holder"
        #: The scripts' ``sharded`` argument: '1' on a cluster (sharded pub/sub).
        self._sharded = "1" if self.wire.cluster else "0"
        self._site = site
        # Only holdings of one slot are renewed by one script call on a cluster.
        self._slot = key_slot(keys.lock.encode()) if self.wire.cluster else None
        self._queues = site.queues
        self._listeners = site.listeners if notify else None
        # A fair lease's acquisitions in progress (their local queues), for statistics.
        self._calls: weakref.WeakSet[LocalQueue] | None = None  # (made at the first)
        self._bind()

    def _bind(self) -> None:
        """Bind the names of the kind's scripts whose values do not change from call to call."""
        keys = self.keys
        named = {
            "lock": keys.lock,
            "queue": keys.queue,
            "fence": keys.fence,
            "channel": keys.channel,
            "sharded": self._sharded,
        }
        self._acquire: Bound = self._ACQUIRE.bind(**named, fencing="1" if self.fencing else "0")
        self._release: Bound = self._RELEASE.bind(**named)
        self._leave: Bound = self._LEAVE.bind(**named)

    def check_ttl(self, value: object, name: str = "ttl") -> float:
        """Check a lease: a finite number of seconds, at least 1 ms."""
        return check_ttl(value, name)

    def counted(self, ttl: float) -> float:
        """The holder counts the whole lease (from when it sent the command)."""
        return ttl

    def queue(self, loop: asyncio.AbstractEventLoop) -> LocalQueue:
        """The client's local queue for this key, shared by every lock object on it.

        A fair lease gets a queue of its own at each call: its tasks wait on
        the server, each with an entry of its own, not behind each other here.
        """
        if self._fair:
            queue = LocalQueue({}, self.key, loop)
            if self._calls is None:
                self._calls = weakref.WeakSet()
            self._calls.add(queue)
            return queue
        # Keyed by the kind's queue, not the lock key: a lock and a semaphore of one
        # permit on one name never hand their keys to each other.
        return queue_for(self._queues, self.keys.queue, loop)

    def existing_queue(self) -> LocalQueue | None:
        """The client's local queue for this key, if there is one (it may be idle)."""
        return None if self._fair else existing_queue(self._queues, self.keys.queue)

    def per_call_waiting(self) -> int | None:
        """With ``fair``, how many acquisitions wait in their own local queues; else None."""
        if not self._fair:
            return None
        calls = self._calls or ()
        return sum(1 for q in calls if q.owner is not None and q.holder is None)

    def generation(self) -> int | None:
        """The release channel's generation if this process listens to it, else None."""
        listeners = self._listeners
        if not listeners:  # notify=False, or nobody of this client listens to anything
            return None
        return _notify.generation_in(listeners, self.keys.channel)

    async def subscribe(self, seen: int | None) -> _notify.Subscription | None:
        """Listen for releases on the lock's channel (None with ``notify=False``)."""
        if self._listeners is None:
            return None
        return await _notify.subscribe(self.wire.client, self.keys.channel, seen)

    # -- acquire -----------------------------------------------------------------------

    async def attempt(
        self,
        deadline: float | None,
        queue_up: bool,
        task: asyncio.Task[Any],
        spare: Timer | None,
        call: Call,
    ) -> Reply | None:
        """Send one acquire attempt of ``task``; None if it was cut off past the deadline.

        The first attempt of a call without fencing, replicas or ``fair``
        is a bare ``SET NX PX``: on an uncontended lock (the common case) it
        costs a tenth less than the script, client and server together; if
        it fails, the reply is ``(0, RETRY)`` and the scripted attempt
        follows, which gets the PTTL (and, with ``queue_up``, queues the
        caller) in the same round trip. Right after this client handed the
        lock on to a waiter, the lock is known to be taken: the script comes
        first.

        An attempt still in flight at the deadline is awaited as long as the
        link needs (:attr:`Wire.allowance <aiolock._wire.Wire.allowance>`),
        and never past the lease it asks for: a reply after that grants
        nothing. Before the client's first answer, what the link needs is
        not known: the whole lease.

        Whatever interrupts the attempt (cancellation, a redis-py error, the
        cut-off), the ``SET`` may have reached the server, so it is undone
        with the same token before this returns or raises (and an entry it
        may have queued is taken out).
        """
        wire = self.wire
        if wire.cluster:
            await wire.ready()
        token = call.token
        # The bare SET is awaited here directly (the common case: one frame less).
        bare = (
            not call.attempts
            and self.bare_first
            and (not self._contended_until or time.monotonic() >= self._contended_until)
        )
        call.attempts += 1
        queued = call.queued
        if queue_up and not bare:
            call.queued = True  # from now on it may be queued (the undo takes it out)
        call.reached = False
        call.waiting = False
        if bare:
            sending: Awaitable[Any] = wire.set_nx(self.key, token, self._ms, call)
        else:
            # Queued: it may hold a grant. Else it looks at the key (whose kind it is, and
            # whether an earlier attempt took it), unless it knows: right after a release
            # of its own handed the lock on, the key is a lock's and someone else's.
            first_known = call.attempts == 1 and self.bare_first
            looks = QUEUED if queued else (KNOWN if first_known else LOOK)
            sending = self._scripted(token, queue_up, looks, call.attempts, call.renews, call)
        sent = time.monotonic()
        try:
            if deadline is None:
                reply = await sending
            elif wire.allowance is None:
                reply = await self._first_answer(sending, deadline, sent, call)
            else:
                when = sent + self.span
                link = (deadline if deadline > sent else sent) + wire.allowance
                if link < when:
                    when = link
                with Cutoff(when, task, spare, lend=True) as cutoff:
                    reply = await sending
                if cutoff.expired:
                    reply = None
        except ClusterError as exc:
            # Redirected (or told TRYAGAIN) until redis-py gave up: the slot is migrating,
            # or its master failing over. No verdict: the wait goes on while its deadline
            # allows. (An undo now would meet the same; the wait's end takes the token
            # out of the queue, and off the key should an earlier send have run.)
            call.queued = True
            raise Unanswered(exc) from exc
        except BaseException:
            if call.reached:
                await self.undo(token, call)
            else:
                call.queued = queued  # nothing reached the server: nothing to undo
            raise
        if reply is None:
            call.unanswered = time.monotonic() - sent
            # Cut off: past the deadline the call is ending, and this is its cleanup;
            # before it (a lease shorter than the wait), a routine undo. (Nothing to
            # undo if it never went out: a connection still in its handshake.)
            if call.reached:
                ending = deadline is not None and time.monotonic() >= deadline
                await self.undo(token, call if ending else None)
            else:
                call.queued = queued
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

    async def _first_answer(
        self, sending: Awaitable[Any], deadline: float, sent: float, call: Call
    ) -> Any:
        """Await an attempt of a client that has never had an answer; None if cut off.

        How long the link needs is not known yet (the first commands include
        the connection's set-up), so an attempt that went out, or that waits
        for a connection in its handshake, is awaited for the whole lease.
        One that at the deadline (plus :data:`CONNECT_GRACE`) is still
        waiting for a connection while the client has none to the server (it
        is down, or nothing listens there) cannot have reached it: it is
        abandoned there, whatever the client's retry policy would do next,
        and raises redis-py's ``ConnectionError`` (nothing to undo). One still
        waiting in the process for a slot or a pooled connection (the pool is
        exhausted: back-pressure) is cut off there too (None; nothing to undo).
        """
        inner = asyncio.ensure_future(sending)
        try:
            first = (deadline if deadline > sent else sent) + CONNECT_GRACE
            await asyncio.wait((inner,), timeout=max(0.0, first - time.monotonic()))
            if not inner.done() and (call.reached or (self.wire.reachable() and not call.waiting)):
                await asyncio.wait((inner,), timeout=max(0.0, sent + self.span - time.monotonic()))
        except BaseException:
            inner.cancel()
            await finish([inner])
            raise
        if inner.done():
            return inner.result()
        connected = call.reached or self.wire.reachable()  # (before the cut-off disconnects)
        queued_here = call.waiting and not call.reached
        inner.cancel()
        await finish([inner])
        if not inner.cancelled():
            return inner.result()  # it ended meanwhile
        if connected or queued_here:
            return None  # cut off at the lease end: undone by the caller
        raise RedisConnectionError(
            f"lock {self.name!r}: no connection to the server within "
            f"{time.monotonic() - sent:.2g} s (the client was still trying to connect); "
            "not acquired, and nothing was sent"
        )

    async def _scripted(
        self,
        token: str,
        queue_up: bool,
        looks: str,
        number: int,
        renews: bool = True,
        trace: Call | None = None,
    ) -> Reply:
        """The acquire script: with fencing, queueing the caller, or with replicas.

        ``number`` (the attempt's, in its call) goes into the entry it writes,
        and comes back with a grant of that entry. ``looks`` (:data:`QUEUED`,
        :data:`LOOK` or :data:`KNOWN`) says what the script checks first. The
        script is sent once: if its reply is lost, it is sent again with
        :data:`LOOK` at least, so that a lock it took is found to be ours.
        """
        entry = ""
        life = self._entry_ms
        keeper: Keeper | None = None
        kept = False
        shown = time.monotonic()
        if queue_up:
            # With notifications, the grant goes to our process's grant channel.
            tag = (
                ""
                if self._listeners is None
                else _notify.grant_tag(self.wire.client, self.keys.channel)
            )
            # A grant's first lease is one entry life, which the heir renews; a waiter that
            # will not renew (auto_renew=False) asks for its whole lease.
            ms = self._entry_ms if renews else self._ms
            keeper = self._site.keeper(self.keys.queue)
            # Another waiter of this client queues on this name: the client's keeper keeps
            # this one's entry alive (with its mark's life: the entry life of a lease of
            # at least ENTRY_CAP).
            if renews and self._entry_ms == KEEPER_MARK_MS and keeper.others(token) > 0:
                kept = True
                life = _KEPT_MS
            entry = encode_entry(ms, self._letter, number, tag, keeper.id if kept else "")
            # Known from now on (the call's end forgets it, whatever happens).
            keeper.reserve(token, kept, shown)
        keys, args = self._acquire.call(
            token=token, ms=self._ms, entry=entry, entry_ms=life, looks=looks
        )
        if self._replicas:
            if trace is not None:
                trace.reached = True  # (sent as a pipeline: assume it went out)
            answer = await self._replicated(token, keys, args)
        else:
            script = self._acquire.script
            try:
                reply = await self.wire.run(script, keys, args, once=True, trace=trace)
            except ReplyLost:
                if looks == KNOWN:
                    keys, args = self._acquire.call(
                        token=token, ms=self._ms, entry=entry, entry_ms=life, looks=LOOK
                    )
                reply = await self.wire.run(script, keys, args, trace=trace)
            answer = (int(reply[0]), int(reply[1]))
        if keeper is not None and not answer[0] and answer[1] != NOT_HELD:
            keeper.register(token, shown)  # it stands in the queue from `shown` on
        return answer

    async def _replicated(self, token: str, keys: tuple[str, ...], args: tuple[Any, ...]) -> Reply:
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
        try:
            taken, acked = await self.wire.run_then(ACQUIRE, keys, args, then)
        except ResponseError as exc:
            if not (self._replica_fsync and "waitaof" in str(exc).lower()):
                raise
            # The script ran (the pipeline goes on past a failed command): undo it first.
            await self.undo(token)
            raise LockError(
                f"lock {self.name!r}: replica_fsync=True needs the WAITAOF command, which "
                f"Redis and Valkey have from 7.2 on; this server refused it ({exc})"
            ) from exc
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

    async def leave(self, call: Call) -> None:
        """Take ``call``'s entry out of the queue (passing on a grant): shielded, bounded."""
        done = False
        try:
            done = await self._undo(call.token, call)
        finally:
            # (Cancelled or not: an anyio scope cancels every await of a cancelled call.)
            keeper = self._site.keepers.get(self.keys.queue)
            if not done and keeper is not None and keeper.keeps(call.token):
                keeper.drop(call.token)  # its keeper's next call deletes the entry
            await self.stop_waiting(call)

    async def stop_waiting(self, call: Call) -> None:
        """Forget ``call`` in the client's keeper; the last kept waiter deletes its mark."""
        keepers = self._site.keepers
        keeper = keepers.get(self.keys.queue)
        if keeper is None:
            return
        doomed = keeper.forget(call.token)
        if not doomed:
            if keeper.idle() and keepers.get(self.keys.queue) is keeper:
                del keepers[self.keys.queue]
            return
        bound = call.cleanup(self._cleanup)
        try:
            await run_shielded(lambda: keeper.farewell(doomed), max(bound, 0.0))
        except Exception as exc:
            logger.debug(
                "could not delete the waiters' mark of %r: %r (it expires by itself)",
                self.name,
                exc,
            )
        if keeper.idle() and keepers.get(self.keys.queue) is keeper:
            del keepers[self.keys.queue]

    async def refresh(
        self, token: str, until: float, task: asyncio.Task[Any]
    ) -> tuple[bool | None, float]:
        """``PEXPIRE`` the entry of ``token`` for one entry life, or have its keeper keep it.

        Cut off at ``until``. An error or a cut-off is only logged (None):
        the entry lives on for the rest of its life, and the next refresh
        may get through.
        """
        keeper = self._site.keepers.get(self.keys.queue)
        if keeper is not None and keeper.pending(token):
            # Its entry names the keeper, and no attempt showed it queued yet (it got no
            # verdict): a PEXPIRE would shorten that entry's life. The next attempt tells.
            return None, 0.0
        sent = time.monotonic()
        try:
            with Cutoff(until, task) as cutoff:
                if keeper is not None and keeper.keeps(token):
                    standing, proof = await keeper.refresh(token, self.refresh_every)
                else:
                    standing = await self.wire.pexpire(self.keys.entry(token), self._entry_ms)
                    proof = sent
        except Exception as exc:
            logger.debug("could not refresh a queue entry of %r: %r", self.name, exc)
            return None, 0.0
        if cutoff.expired:
            logger.debug("no answer in time to refresh a queue entry of %r", self.name)
            return None, 0.0
        return standing, proof

    async def remaining(self, until: float, task: asyncio.Task[Any]) -> int | None:
        """``PTTL`` of the lock key (None on an error, or no answer by ``until``)."""
        try:
            with Cutoff(until, task) as cutoff:
                pttl = await self.wire.pttl(self.key)
        except Exception as exc:
            logger.debug("could not read the lease of %r: %r", self.name, exc)
            return None
        return None if cutoff.expired else pttl

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Free the lock if it holds ``token`` and leave the queue: shielded, bounded.

        The lock goes on to the next queued waiter by the grant rule. Best
        effort: what it has no time for expires by itself.
        """
        await self._undo(token, call)

    async def _undo(self, token: str, call: Call | None) -> bool:
        """:meth:`undo`; whether it was done (else it was logged)."""
        bound = self._cleanup if call is None else call.cleanup(self._cleanup)
        if bound <= 0:
            logger.debug("no time left to undo an attempt on %r (the lease expires it)", self.name)
            return False
        keys, args = self._leave.call(token=token)
        try:
            await run_shielded(lambda: self.wire.run(self._leave.script, keys, args), bound)
        except Exception as exc:
            logger.debug(
                "could not undo an attempt on %r: %r (the lease will expire it)", self.name, exc
            )
            return False
        return True

    # -- raw operations (a quorum of leases calls them on each node) -------------------

    async def take(self, token: str) -> bool:
        """One bare ``SET NX PX``: whether it took the lock (no undo, no cut-off).

        A ``SET`` that found the key taken looks whose it is: ours (the same
        ``SET`` ran before and its reply was lost) counts as taken, and
        another kind of primitive's key raises :class:`~aiolock.LockError`.
        """
        if await self.wire.set_nx(self.key, token, self._ms):
            return True
        value = await self.wire.get(self.key)
        return value is not None and value in (token, token.encode())

    async def delete(self, token: str) -> bool:
        """The release script: free the key if it holds ``token`` (by the grant rule).

        Sent once; if its reply is lost, the key found no longer ours counts
        as freed by it (see :meth:`_release_once`).
        """
        return bool(await self._release_once(token))

    async def _release_once(self, token: str) -> Any:
        """Run a release script for ``token`` once; after a lost reply, ask again.

        The script is never sent twice blindly: run again after it freed (or
        handed on) the lock, it would find the key no longer ours. So a lost
        reply is followed by the same script, asked knowingly: if it frees
        the lock now, the first one never ran; if it finds the key no longer
        ours, the first one freed it (answered as a plain release, 1). (A
        holder that had lost the key in that very moment is then told it
        released; nothing else can tell the two apart.)
        """
        script = self._release.script
        keys, args = self._release.call(token=token)
        try:
            return await self.wire.run(script, keys, args, once=True)
        except ReplyLost as lost:
            reply = await self.wire.run(script, keys, args)
            if not reply:
                logger.info(
                    "the reply to the release of lock %r was lost (%s); the key was no "
                    "longer ours when asked again, so the release had run",
                    self.name,
                    lost.__cause__ or lost,
                )
                return 1
            return reply

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
                reply = await self._release_once(token)
        except asyncio.CancelledError:
            await self.undo(token)
            raise
        if cutoff.expired:
            raise RedisTimeoutError(
                f"releasing lock {self.name!r}: no answer before its lease ended; "
                "the server expires the key by itself"
            )
        if reply == 2:  # handed on: the lock is taken, our next attempt goes to the queue
            self._contended_until = time.monotonic() + _CONTENDED_HINT
        return bool(reply)

    async def extend(self, token: str, ttl: float) -> bool:
        """Reset the lease of ``token``'s key to ``ttl``; False if it is not ours."""
        sent = time.monotonic()
        keys, args = self._EXTEND.call(
            lock=self.key, token=token, ms=to_ms(ttl), queue=self.keys.queue
        )
        extended = bool(await self.wire.run(self._EXTEND, keys, args, urgent=True))
        self.wire.observe(time.monotonic() - sent)
        return extended

    def batch_key(self) -> Hashable:
        """The client and the kind's extend script."""
        return (self._site, self._EXTEND_MANY)

    async def extend_many(self, batch: Sequence[Extension]) -> list[bool | Exception]:
        """Extend every item of ``batch`` (see :meth:`Lease.extend_many`).

        ``batch`` holds at most :data:`BATCH_MOST` items; one item is one
        :meth:`extend`. One script call renews them all; on a cluster, one
        call per hash slot, sent in one pipeline (each master its share).
        """
        if len(batch) == 1:
            lease, token, ttl = batch[0]
            return [await lease.extend(token, ttl)]
        suffix = self.keys.queue[len(self.key) :]  # the kind's queue suffix
        if not self.wire.cluster:
            sent = time.monotonic()
            keys, args = _extend_call(self._EXTEND_MANY, batch, suffix)
            replies = await self.wire.run(self._EXTEND_MANY, keys, args, urgent=True)
            self.wire.observe(time.monotonic() - sent)
            return [_extended(reply) for reply in replies]
        slots: dict[int | None, list[int]] = {}
        for i, (lease, _, _) in enumerate(batch):
            slots.setdefault(cast(ServerLease, lease)._slot, []).append(i)
        groups = list(slots.values())
        calls = [
            _extend_call(self._EXTEND_MANY, [batch[i] for i in group], suffix) for group in groups
        ]
        sent = time.monotonic()
        answers = await self.wire.run_each(self._EXTEND_MANY, calls, urgent=True)
        self.wire.observe(time.monotonic() - sent)
        outcomes: list[bool | Exception] = [False] * len(batch)
        for group, answer in zip(groups, answers, strict=True):
            for j, i in enumerate(group):
                outcomes[i] = answer if isinstance(answer, Exception) else _extended(answer[j])
        return outcomes

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Swap ``token`` for ``heir_token`` in one script (see HANDOVER); None if it cannot.

        With ``may_yield`` the lock goes to the first live waiter of the queue
        on the server instead, if there is one. An acquisition that replicas
        must acknowledge is taken on the server, not handed over.
        """
        if type(heir) is not ServerLease or self._replicas or heir._replicas:
            return None
        keys, args = HANDOVER.call(
            lock=heir.keys.lock,
            queue=heir.keys.queue,
            fence=heir.keys.fence,
            token=token,
            heir=heir_token,
            heir_ms=heir._ms,
            channel=self.keys.channel,
            sharded=self._sharded,
            may_yield="1" if may_yield else "0",
            heir_fencing="1" if heir.fencing else "0",
        )
        reply = await self._hand_over_once(HANDOVER, keys, args)
        if reply[0] == 2:
            self._contended_until = time.monotonic() + _CONTENDED_HINT
        return (int(reply[0]), int(reply[1]))

    async def _hand_over_once(
        self, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]
    ) -> Any:
        """Run a hand-over script once; after a lost reply, ask again (see :meth:`_release_once`).

        Asked again, a hand-over that ran finds the next holder's token on
        the key and answers so; one that finds the key neither ours nor the
        next holder's had handed the lock to the queue's first waiter
        (answered ``(2, 0)``).
        """
        try:
            return await self.wire.run(script, keys, args, once=True)
        except ReplyLost as lost:
            reply = await self.wire.run(script, keys, args)
            if not reply[0]:
                logger.info(
                    "the reply to the hand-over of lock %r was lost (%s); the key was "
                    "no longer ours when asked again, so it had gone to the next waiter",
                    self.name,
                    lost.__cause__ or lost,
                )
                return (2, 0)
            return reply

    async def held(self) -> bool:
        """Whether the key exists (asks the server)."""
        return await self.wire.exists(self.key)

    async def holds(self, token: str) -> bool:
        """Whether the key holds ``token`` (asks the server)."""
        value = await self.wire.get(self.key)
        return value is not None and value in (token, token.encode())
