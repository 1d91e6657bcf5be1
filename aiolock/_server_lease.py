"""The lease on one server (or one slot of a cluster): the lease every primitive starts from.

:class:`ServerLease` is the :class:`~aiolock._lease.Lease` of ``AsyncLock``
and of each node of a ``Redlock``; the semaphore's and the read-write
lock's leases subclass it and swap its scripts. It is made of three parts,
each in a module of its own: the attempt (here: a bare ``SET NX PX`` first
where it can, then the acquire script, which queues the caller; with
replicas, ``WAIT``), the waiting side (:mod:`aiolock._server_queue`) and the
holding side (:mod:`aiolock._server_holding`). :func:`server_lease` makes
the lease of a client and options once (:mod:`aiolock._site`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, Self

from redis.exceptions import ClusterError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from . import _notify
from ._cancel import finish
from ._checks import to_ms
from ._exceptions import LockError
from ._keeper import KEPT_LIFE, Keeper
from ._keys import keys_for
from ._lease import CONNECT_GRACE, NOT_HELD, RETRY, Call, Reply, Unanswered
from ._scripts import (
    ACQUIRE,
    HANDOVER,
    KEEPER_MARK_MS,
    Script,
    encode_entry,
)
from ._server_holding import CONTENDED_HINT, ServerHolding
from ._server_queue import ServerQueueing
from ._site import REMEMBERED, site_of
from ._timers import Cutoff
from ._wire import ReplyLost

if TYPE_CHECKING:
    from ._types import Client

__all__ = ["ServerLease", "server_lease"]

logger = logging.getLogger("aiolock")

#: A kept entry's own life (ms): see :mod:`aiolock._keeper`.
_KEPT_MS: Final = to_ms(KEPT_LIFE)

#: What an acquire script checks before it tries (its argument ``looks``). QUEUED: the caller
#: may be queued, or granted the lock: it looks at the key and at the queue. LOOK: it
#: looks at the key (another kind's fails with ``WRONGTYPE``; its own token, left by an
#: earlier run whose reply was lost, is the lock). KNOWN: nothing to look at (the key is
#: a lock's and someone else's, as after a release of the caller's that handed it on).
QUEUED: Final = "1"
LOOK: Final = "2"
KNOWN: Final = "0"


class ServerLease(ServerHolding, ServerQueueing):
    """The lease of a lock on one server, or one slot of a cluster (see :class:`Lease`).

    A primitive whose key is not a plain lock subclasses it with scripts of
    its own (:attr:`_ACQUIRE` and the others), and binds what they take
    by name in :meth:`_bind`.

    It queues (its :attr:`queueing` is itself, a
    :class:`~aiolock._lease.Queueing`): a waiter that failed waits in the
    lock's queue on the server, and a release hands the lock to the first
    live waiter (docs/server-queue.md).
    With ``fair``, every acquisition goes through the queue: no bare first
    ``SET`` that could take a free lock ahead of it, and no local queue (each
    waiting task has an entry of its own, so the order is strict across
    every task of every process).
    """

    __slots__ = ()

    @property
    def queueing(self) -> Self:
        """The lease itself: it queues on its server (its waiting side, ``ServerQueueing``)."""
        return self

    async def attempt(self, deadline: float | None, queue_up: bool, call: Call) -> Reply | None:
        """Send one acquire attempt of ``call.task``; None if it was cut off past the deadline.

        The first attempt of a call without fencing, replicas or ``fair``
        is a bare ``SET NX PX``: on an uncontended lock (the common case) it
        takes the lock without running a script (docs/internals.md, The hot
        path); if it fails, the reply is ``(0, RETRY)`` and the scripted attempt
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
                with Cutoff(when, call.task, call.spare, lend=True) as cutoff:
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
        acquire = self._acquiring()
        # (Every kind's acquire script opens with these five, in this order: ACQUIRE_LEAD.)
        keys, args = acquire.lead(token, self._ms, entry, life, looks)
        if self._replicas:
            if trace is not None:
                trace.reached = True  # (sent as a pipeline: assume it went out)
            answer = await self._replicated(token, keys, args)
        else:
            script = acquire.script
            try:
                reply = await self.wire.run(script, keys, args, once=True, trace=trace)
            except ReplyLost:
                if looks == KNOWN:
                    keys, args = acquire.lead(token, self._ms, entry, life, LOOK)
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
        # (The heir waits in the same local queue: its keys are this lease's.)
        bound = heir._heir or heir._inheriting()
        keys, args = bound.lead(token, heir_token, "1" if may_yield else "0")
        reply = await self._hand_over_once(HANDOVER, keys, args)
        if reply[0] == 2:
            self._contended_until = time.monotonic() + CONTENDED_HINT
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
    site = site_of(client)
    if name.__class__ is not str or prefix.__class__ is not str:
        keys_for(name, prefix)  # raises; a str subclass passes, and is looked up below
    options = (name, prefix, ttl, notify, fencing, replicas, replica_timeout, replica_fsync, fair)
    lease: ServerLease | None = site.leases.get(options)
    if lease is None:
        keys = keys_for(name, prefix)
        if len(site.leases) >= REMEMBERED:
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
