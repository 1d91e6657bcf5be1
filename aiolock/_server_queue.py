"""A one-server lease as a waiter: its local queue, its entry in the queue on the server.

:class:`ServerQueueing` is a part of :class:`~aiolock._server_lease.ServerLease`:
the local queue its tasks wait in, the release notifications it listens to,
and what a waiter that failed does in the lock's queue on the server
(docs/server-queue.md): its entry kept alive (:meth:`ServerQueueing.refresh`,
alone or by the client's keeper, :mod:`aiolock._keeper`), taken out when it
gives up (:meth:`ServerQueueing.leave`), and the holder's remaining lease
read when it should have ended. An attempt's undo is here too: it frees the
key and leaves the queue in one script.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref

from . import _notify
from ._cancel import run_shielded
from ._lease import Call
from ._queue import LocalQueue, existing_queue, queue_for
from ._server_state import ServerState
from ._timers import Cutoff

__all__ = ["ServerQueueing"]

logger = logging.getLogger("aiolock")


class ServerQueueing(ServerState):
    """The waiting side of a one-server lease (a base of ``ServerLease``; see the module)."""

    __slots__ = ()

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

    async def refresh(self, call: Call, until: float) -> tuple[bool | None, float]:
        """``PEXPIRE`` the entry of ``call`` for one entry life, or have its keeper keep it.

        Cut off at ``until``. An error or a cut-off is only logged (None):
        the entry lives on for the rest of its life, and the next refresh
        may get through.
        """
        token = call.token
        keeper = self._site.keepers.get(self.keys.queue)
        if keeper is not None and keeper.pending(token):
            # Its entry names the keeper, and no attempt showed it queued yet (it got no
            # verdict): a PEXPIRE would shorten that entry's life. The next attempt tells.
            return None, 0.0
        sent = time.monotonic()
        try:
            with Cutoff(until, call.task) as cutoff:
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

    async def remaining(self, call: Call, until: float) -> int | None:
        """``PTTL`` of the lock key (None on an error, or no answer by ``until``)."""
        try:
            with Cutoff(until, call.task) as cutoff:
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
        leave = self._leaving()
        keys, args = leave.call(token=token)
        try:
            await run_shielded(lambda: self.wire.run(leave.script, keys, args), bound)
        except Exception as exc:
            logger.debug(
                "could not undo an attempt on %r: %r (the lease will expire it)", self.name, exc
            )
            return False
        return True
