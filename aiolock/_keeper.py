"""The keeper: one client's queued waiters on one name, kept alive together.

A waiter in the queue on the server has an *entry* (see
:mod:`aiolock._scripts`), which lives while it is refreshed: a waiter that
dies stops refreshing, and its entry is gone within an entry's life. When a
client has one waiter on a name, that waiter refreshes its own entry
(``PEXPIRE``, one command). When it has more, each entry beyond the first
is *kept*: its value names the client's :class:`Keeper` for that name, and
it is alive while the keeper's *mark* (``<queue>:@<id>``) is, whatever its
own expiry (a long one, :data:`KEPT_LIFE`, extended now and then). The
keeper sets its mark again every refresh period with one script call
(:data:`~aiolock._scripts.KEEP`) that also looks at every kept entry of the
client with one ``MGET``: so the waiters of one client on one name cost the
server the same few commands however many they are, and each still learns
whether it stands in the queue (its proof, from which a grant's lease is
counted) or is gone (granted, or lost).

A process that dies, or stops answering, stops setting its mark: all its
kept entries are dead an entry's life later, as a single waiter's would
be. When the last kept waiter ends, the keeper deletes its mark
(:meth:`Keeper.farewell`), so that nothing of the client's is left on the
server, and takes a new id for the waiters to come.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Final, final

from ._checks import to_ms
from ._scripts import KEEP

if TYPE_CHECKING:
    from ._wire import Wire

__all__ = ["KEEP_MOST", "KEPT_LIFE", "Keeper"]

logger = logging.getLogger("aiolock")

#: A kept entry's own life (seconds): its keeper extends it when half is gone. It bounds
#: how long the entry of a waiter whose process died outlives the keeper's mark.
KEPT_LIFE: Final = 30.0
_KEPT_MS: Final = to_ms(KEPT_LIFE)
#: The most entries one KEEP call extends or looks at.
KEEP_MOST: Final = 1000


@final
class _Kept:
    """What a keeper knows of one queued waiter of its client."""

    __slots__ = ("extended", "gone", "kept", "pending", "proof")

    def __init__(self, kept: bool, shown: float) -> None:
        self.kept = kept  # its entry names the keeper (else it refreshes its own)
        self.proof = shown  # when the latest command was sent that found it standing
        self.extended = shown  # when its entry's own life was last set
        self.gone = False  # the latest KEEP found its entry gone
        self.pending = True  # its first attempt is in flight: not standing yet


@final
class Keeper:
    """The queued waiters of one client on one name (see the module's text).

    Every waiter of the client that queues on the server is known here
    from the moment its attempt goes out (:meth:`reserve`) until its call
    ends (:meth:`forget`): a new waiter's entry is kept when another is
    known already, and the mark stays while any entry may name it.
    """

    __slots__ = ("_dropped", "_flight", "_loop", "_marked", "_tokens", "id", "queue", "wire")

    def __init__(self, wire: Wire, queue: str) -> None:
        self.wire = wire
        #: The queue's key.
        self.queue = queue
        #: The id its kept entries name; a new one after each farewell.
        self.id = os.urandom(4).hex()
        self._tokens: dict[str, _Kept] = {}
        #: Kept tokens whose calls could not take their entries out: the next KEEP does.
        self._dropped: list[str] = []
        self._flight: asyncio.Task[float] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._marked = False  # a kept entry may have set the mark of the current id

    def others(self, token: str) -> int:
        """How many waiters of the client other than ``token`` stand in the queue."""
        self._bind()
        return len(self._tokens) - (token in self._tokens)

    def idle(self) -> bool:
        """Nobody to keep, no mark to delete, nothing in flight: the keeper may go."""
        flight = self._flight
        return not self._tokens and not self._marked and (flight is None or flight.done())

    def pending(self, token: str) -> bool:
        """Whether ``token``'s entry names this keeper and no attempt showed it queued yet."""
        kept = self._tokens.get(token)
        return kept is not None and kept.kept and kept.pending

    def keeps(self, token: str) -> bool:
        """Whether ``token``'s entry names this keeper (and it stands in the queue)."""
        kept = self._tokens.get(token)
        return kept is not None and kept.kept and not kept.pending

    def reserve(self, token: str, kept: bool, shown: float) -> None:
        """An attempt of ``token`` that may queue it goes out now (``shown``).

        ``kept``: the entry it writes names this keeper (and sets its mark).
        """
        self._bind()
        entry = self._tokens.get(token)
        if entry is None:
            self._tokens[token] = _Kept(kept, shown)
        else:
            entry.kept = kept
        if kept:
            self._marked = True

    def register(self, token: str, shown: float) -> None:
        """``token`` stands in the queue since ``shown`` (when its queueing attempt was sent)."""
        self._bind()
        entry = self._tokens.get(token)
        if entry is None:
            return  # (forgotten meanwhile: its call ended)
        entry.pending = False
        entry.gone = False
        entry.extended = shown
        if shown > entry.proof:
            entry.proof = shown

    def forget(self, token: str) -> list[str]:
        """The call of ``token`` no longer waits; the keys :meth:`farewell` must delete.

        When the last kept waiter went, the mark must go (with the entries
        of ended calls not deleted yet): the keeper takes a new id at once,
        so that a waiter that queues from now on names a mark the deletion
        does not touch. Otherwise nothing is to delete (an empty list).
        """
        entry = self._tokens.pop(token, None)
        if entry is None or not self._marked or any(k.kept for k in self._tokens.values()):
            return []
        doomed = [f"{self.queue}:@{self.id}", *(f"{self.queue}:{t}" for t in self._dropped)]
        self.id = os.urandom(4).hex()
        self._marked = False
        self._dropped = []
        return doomed

    def drop(self, token: str) -> None:
        """``token``'s call ended and could not take its entry out: the next KEEP deletes it."""
        if self._marked:
            self._dropped.append(token)

    async def refresh(self, token: str, every: float) -> tuple[bool | None, float]:
        """Whether kept ``token`` still stands, and since when; (False, …) if gone.

        A waiter found standing by a KEEP sent less than ``every`` ago takes
        that answer; otherwise it waits for the KEEP in flight, or sends one
        for every kept waiter of the client. (None, 0.0): its call was
        forgotten meanwhile.

        Raises:
            Exception: the KEEP that carried it failed (the caller logs it).
        """
        self._bind()
        loop = asyncio.get_running_loop()
        while True:
            entry = self._tokens.get(token)
            if entry is None:
                return None, 0.0
            if entry.gone:
                return False, entry.proof  # its next attempt takes the lock or queues again
            now = time.monotonic()
            if now < entry.proof + every:
                return True, entry.proof
            flight = self._flight
            fresh = flight is None or flight.done()
            if flight is None or fresh:
                flight = self._flight = loop.create_task(
                    self._keep(now), name="aiolock keeping waiters"
                )
                flight.add_done_callback(_retrieved)
            try:
                await asyncio.shield(flight)
            except Exception:
                if fresh:
                    raise
                # Another waiter's KEEP failed: this one sends its own (it may fail alike).

    async def farewell(self, doomed: list[str]) -> None:
        """Delete what :meth:`forget` named: the old mark, and entries of ended calls."""
        flight = self._flight
        if flight is not None and not flight.done():
            # A KEEP in flight (of the old id) would set the mark again after the DEL.
            await asyncio.wait((flight,))
        await self.wire.delete(*doomed)

    def _bind(self) -> None:
        """Forget what an event loop that is gone left: its flight, its waiters, its id.

        (A loop closed while tasks waited ended their calls without their
        cleanup: their entries die with the old id's mark.)
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                self._tokens.clear()
                self._dropped = []
                self.id = os.urandom(4).hex()
                self._marked = False
            self._loop = loop
            self._flight = None

    async def _keep(self, now: float) -> float:
        """One KEEP for the kept waiters (the least recently proven first); returns when sent."""
        tokens = self._tokens
        kept = [t for t, k in tokens.items() if k.kept and not k.gone and not k.pending]
        if not kept:
            return now  # (nobody left to keep: the last one's farewell deletes the mark)
        if len(kept) > KEEP_MOST:
            kept = sorted(kept, key=lambda t: tokens[t].proof)[:KEEP_MOST]
        due = now - KEPT_LIFE / 2
        extend = [t for t in kept if tokens[t].extended < due]
        look = [t for t in kept if tokens[t].extended >= due]
        dropped = self._dropped[:KEEP_MOST]
        del self._dropped[: len(dropped)]
        keys, args = KEEP.call(
            queue=self.queue,
            keeper=self.id,
            drop=len(dropped),
            extend=len(extend),
            life=_KEPT_MS,
            tokens=[*dropped, *extend, *look],
        )
        found = await self.wire.run(KEEP, keys, args)
        for token, there in zip((*extend, *look), found, strict=True):
            entry = tokens.get(token)
            if entry is None:
                continue
            if not there:
                entry.gone = True
            elif now > entry.proof:
                entry.proof = now
        for token in extend:
            entry = tokens.get(token)
            if entry is not None:
                entry.extended = now
        return now


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Mark a KEEP's error seen: the waiters it carried were told (or had left)."""
    if not task.cancelled():
        task.exception()
