"""The renewals that keep the leases of an event loop's holdings alive.

A holding (:mod:`aiolock._holding`) is renewed every ``span/3`` by its
event loop's :class:`Renewer`: one asyncio task for every holding of the
loop, which renews the holdings due in the same window together, one server
call per batch (:meth:`~aiolock._lease.Lease.extend_many`: one per client
and, on a cluster, per hash slot; one per node for Redlock), at most
:data:`~aiolock._lease.BATCH_MOST` holdings a call. A renewal due within a
twelfth of its lease joins the batch of one due now (Redisson's watchdog
batches for the same reason). Each holding keeps its own outcome: renewed,
or lost with its own reason, told to its own lock. A holding joins the
renewer at its first renewal point (a short holding never does), and
leaves it when it ends; the task ends with its last holding, and is
awaited by the release that ended it.

It does not end with the task that acquired: a holding whose acquiring
task ended (a *detached* holding: ``acquire()`` run by ``asyncio.wait_for``
on CPython 3.11, or by ``gather``; a lock handed to a background job) is
renewed until it is released or lost. It holds its lock object only weakly:
a holding that nobody can release any more (its lock object was
garbage-collected, or its event loop shut down) is reported as never
released (:func:`~aiolock._holding.never_released`), and its renewal stops, so that the key
expires with its lease.

A holding is declared lost when the server says the key is gone or is not
ours, when it has lasted its cap (``max_hold``: renewals never carry the
lease past it, and at the cap the renewer frees the key so the next waiter
gets it at once), and also when its lease end arrives before a renewal could
be confirmed (a failed call is retried until then, and a call still in
flight at a member's lease end does not keep that member believing it
holds; redis-py's own retries would otherwise run past it). Any error is
retried, not only redis-py's: on uvloop a call on a closed transport raises a
bare ``RuntimeError``, and a renewal that dies of it would leave the holder
believing it still holds the lock.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import logging
import math
import time
import weakref
from collections.abc import Hashable
from typing import Any, Final, final

from ._cancel import finish
from ._holding import Holding, Watcher, never_released
from ._lease import BATCH_MOST, Extension
from ._timers import call_at

__all__ = ["Renewer", "renewer_for"]

logger = logging.getLogger("aiolock")

#: Between two failed renewal attempts: a tenth of the lease, within these bounds.
_RETRY_MIN: Final = 0.005
_RETRY_MAX: Final = 1.0
#: A renewal due within this share of its lease goes out with a batch sent now.
EARLY_SHARE: Final = 1 / 12
#: The most names a WARNING about a failed batch lists.
_NAMED: Final = 3


@final
class _Flight:
    """One renewal call in flight: the holdings it renews, and what was asked for each."""

    __slots__ = ("deadline", "members", "task")

    def __init__(self, task: asyncio.Task[list[bool | Exception]], members: list[_Member]) -> None:
        self.task = task
        self.members = members
        #: The earliest lease end among its members still waiting for it.
        self.deadline = min(member[0].lease_end for member in members)


#: A holding in a flight: the holding, when the call was sent, the ``ttl`` it renews
#: with, the lease asked for (the ttl cut at the cap) and that lease as counted.
_Member = tuple[Holding, float, float, float, float]


@final
class Renewer:
    """The renewals of the holdings of one event loop, in one task.

    Holdings wait in a heap ordered by when they are due. The task sleeps
    until the first is due, then sends every holding due within
    :data:`EARLY_SHARE` of its lease, grouped by
    :meth:`~aiolock._lease.Lease.batch_key` in calls of at most
    :data:`~aiolock._lease.BATCH_MOST`; each call runs in a task of its own
    (a server that does not answer holds up its own holdings only). Every
    outcome, and every member's lease end while its call is unanswered, is
    handled in this task. It ends when its last holding leaves; a loop
    that shuts down while it has holdings reports each never released.
    """

    __slots__ = (
        "__weakref__",
        "_flights",
        "_heap",
        "_loop",
        "_members",
        "_order",
        "_task",
        "_undos",
        "_wake",
        "_wake_at",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._members: set[Holding] = set()
        self._heap: list[tuple[float, int, Holding]] = []
        self._order = itertools.count()
        self._flights: list[_Flight] = []
        self._undos: set[asyncio.Task[Any]] = set()
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = math.inf
        # In a context of its own, not in that of the task that happened to start it.
        self._task = loop.create_task(
            self._run(), name="aiolock renewals", context=contextvars.Context()
        )
        self._task.add_done_callback(self._ended)

    # -- membership (called in the loop's thread) --------------------------------------

    def add(self, holding: Holding, watcher: weakref.ref[Watcher], due: float) -> None:
        """Renew ``holding`` (of ``watcher``'s lock) from ``due`` on."""
        holding.renewer = self
        holding.watcher = watcher
        self._members.add(holding)
        self._push(holding, due)

    def reschedule(self, holding: Holding, *, soon: bool = False) -> None:
        """``holding``'s lease changed outside the renewer (an ``extend()``): due anew.

        ``soon``: at once (its lease end was cut to the one a renewal still in
        flight may leave). A holding whose renewal is in flight is due again
        when it lands.
        """
        if holding.renewer is self and holding.flight is None:
            self._push(holding, time.monotonic() if soon else holding.next_due())

    def remove(self, holding: Holding) -> asyncio.Task[None] | None:
        """Stop renewing ``holding``; the renewer's task, if that ended it, else None.

        A call in flight for it goes on for the others; its outcome for this
        holding is dropped.
        """
        if holding.renewer is not self:
            return None
        holding.renewer = None
        holding.entry = -1
        self._members.discard(holding)
        if self._members:
            return None
        self._retire()
        task = self._task
        if task.done() or task is asyncio.current_task(self._loop):
            return None  # (its loop sees that it has nothing left)
        task.cancel()
        return task

    def _retire(self) -> None:
        """Take no new holdings: the next one of the loop gets a new renewer."""
        if _renewers.get(self._loop) is self:
            del _renewers[self._loop]

    def _push(self, holding: Holding, due: float) -> None:
        holding.due = due
        holding.entry = entry = next(self._order)
        heapq.heappush(self._heap, (due, entry, holding))
        if due < self._wake_at and self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _poke(self, _: object = None) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # -- the task ----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._members:
                now = time.monotonic()
                self._land(now)
                if not self._members:
                    break
                wake = self._next()
                if wake > now:
                    await self._sleep(wake)
                else:
                    self._send(now)
        finally:
            self._retire()
            calls = [flight.task for flight in self._flights]
            for call in calls:
                call.cancel()
            self._flights = []
            pending: list[asyncio.Future[Any]] = [*calls, *self._undos]
            if pending:
                await finish(pending)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A renewer cancelled with holdings left was cancelled by its loop shutting down.

        aiolock ends a renewer only once its last holding left: one
        cancelled while it still has some (even before it first ran) was
        cancelled by ``asyncio.run`` at its end.
        """
        self._retire()
        members, self._members = self._members, set()
        for holding in members:
            holding.renewer = None
        if task.cancelled():
            for holding in members:
                never_released(holding, "its event loop shut down while it was held")
        elif (error := task.exception()) is not None:  # pragma: no cover - a defect of aiolock
            logger.error("aiolock's renewals failed", exc_info=error)
            for holding in members:
                _declare_lost(holding, f"its renewal failed ({type(error).__name__}: {error})")

    async def _sleep(self, until: float) -> None:
        wake = self._wake = self._loop.create_future()
        self._wake_at = until
        timer = call_at(until, _wake_up, wake, loop=self._loop)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None
            self._wake_at = math.inf

    def _next(self) -> float:
        """When something is due next: a holding's renewal, or a flight member's lease end."""
        heap = self._heap
        while heap and heap[0][2].entry != heap[0][1]:
            heapq.heappop(heap)  # a holding that left, or was put back in with a new due
        due = heap[0][0] if heap else math.inf
        for flight in self._flights:
            due = min(due, flight.deadline)
        return due

    def _send(self, now: float) -> None:
        """Send every holding due now or within its early share, in batches."""
        heap = self._heap
        batches: dict[Hashable, list[Extension]] = {}
        members: dict[Hashable, list[_Member]] = {}
        # Capped holdings met early (their lease ends at the cap, within the early
        # share): back in the heap once this pass is over, not during it, where the
        # pass would meet them again at once, and for ever.
        later: list[Holding] = []
        while heap:
            due, entry, holding = heap[0]
            if holding.entry != entry:
                heapq.heappop(heap)
                continue
            if due > now + holding.span * EARLY_SHARE:
                break
            heapq.heappop(heap)
            holding.entry = -1
            if holding.extending:
                continue  # the holder's extend() puts it back when it ends
            item = self._ask(holding, now, later)
            if item is None:
                continue
            lease = holding.lease
            key = lease.batch_key()
            batch = batches.setdefault(key, [])
            batch.append((lease, holding.token, item[3]))
            members.setdefault(key, []).append(item)
            if len(batch) == BATCH_MOST:
                self._fly(batches.pop(key), members.pop(key))
        for key, batch in batches.items():
            self._fly(batch, members[key])
        for holding in later:
            self._push(holding, holding.next_due())

    def _ask(self, holding: Holding, now: float, later: list[Holding]) -> _Member | None:
        """What to ask for ``holding`` now; None when it needs no renewal (lost, capped).

        A capped holding whose cap is not reached yet goes to ``later``: the
        renewer looks at it again at its cap.
        """
        if not holding.live:
            self.remove(holding)
            return None
        watcher = holding.watcher
        if watcher is None or watcher() is None:
            return None  # unreachable: reported never released, and on its way out
        if holding.cap_reached(now):
            self._free_at_cap(holding)
            return None
        if now >= holding.lease_end:
            _declare_lost(holding, "the lease ran out before it could be renewed")
            return None
        if holding.capped:
            later.append(holding)
            return None
        # Both read now: an extend() that ends while this renewal is in flight changes
        # them, and the renewal's late reply must not mix its lease with the extend's.
        ttl = holding.ttl
        asked = holding.asked(ttl, now)  # never past the cap
        span = holding.lease.counted(
            asked
        )  # a grant's first lease is shorter; renewals ask for ttl
        if span <= 0:  # too little left of the cap to count a lease
            self._free_at_cap(holding)
            return None
        return (holding, now, ttl, asked, span)

    def _fly(self, batch: list[Extension], members: list[_Member]) -> None:
        lease = batch[0][0]
        task = self._loop.create_task(lease.extend_many(batch), name="aiolock renewing")
        task.add_done_callback(self._poke)
        for holding, sent, _, _, span in members:
            holding.flight = task
            holding.flying_end = sent + span
        self._flights.append(_Flight(task, members))

    def _land(self, now: float) -> None:
        """Handle the flights that landed, and the members whose lease ended unanswered."""
        if not self._flights:
            return
        flying: list[_Flight] = []
        for flight in self._flights:
            if flight.task.done():
                self._outcomes(flight, now)
                continue
            if flight.deadline <= now:
                waiting = [m for m in flight.members if m[0].renewer is self and m[0].live]
                for member in waiting:
                    holding = member[0]
                    if holding.lease_end <= now:
                        holding.flight = None
                        _declare_lost(
                            holding, "the lease ran out while a renewal was still unanswered"
                        )
                waiting = [m for m in waiting if m[0].renewer is self and m[0].live]
                if not waiting:
                    flight.task.cancel()  # nobody waits for it any more
                    self._undos.add(flight.task)  # (awaited at the end)
                    flight.task.add_done_callback(self._undos.discard)
                    continue
                flight.deadline = min(m[0].lease_end for m in waiting)
            flying.append(flight)
        self._flights = flying

    def _outcomes(self, flight: _Flight, now: float) -> None:
        """Tell each member of a landed flight its own outcome."""
        task = flight.task
        outcomes: list[bool | Exception] | None = None
        error: BaseException | None = None
        if task.cancelled():
            error = asyncio.CancelledError("the renewal call was cancelled")
        elif (error := task.exception()) is None:
            outcomes = task.result()
        failed: list[Holding] = []
        for index, (holding, sent, ttl, asked, span) in enumerate(flight.members):
            if holding.flight is task:
                holding.flight = None
            if holding.renewer is not self or not holding.live:
                continue
            outcome: bool | BaseException | None = error if outcomes is None else outcomes[index]
            lock = holding.watcher() if holding.watcher is not None else None
            if lock is None:
                continue  # unreachable: reported never released, and on its way out
            if outcome is True:
                if sent >= holding.renewed_at:
                    holding.renewed(sent, ttl, span, capped=asked < ttl)
                    lock._renewed(holding, None)
                    self._push(holding, holding.next_due())
                else:
                    # An extend() sent after it landed meanwhile, and counts the shorter
                    # lease of the two: a renewal with the extend's lease lifts that.
                    self._push(holding, now)
            elif outcome is False:
                lock._gone_at_renewal(holding)
            elif outcome is not None:
                failed.append(holding)
                lock._renewed(holding, outcome)
                remaining = holding.lease_end - now
                retry = min(max(holding.span / 10, _RETRY_MIN), _RETRY_MAX, max(remaining, 0.0))
                self._push(holding, now + retry)
            del lock
        if failed:
            _warn_failed(failed, error if error is not None else _first_error(outcomes))

    def _free_at_cap(self, holding: Holding) -> None:
        """The holding reached its cap: declare it lost, then free the key for the next holder.

        Declared first, so the holder stops trusting it before anyone else can
        take the lock; the key is then deleted with the holding's token (never
        another holder's), shielded and bounded, and the lock goes on by the
        grant rule. If the server does not answer, the lease (which ends at the
        cap) expires the key.
        """
        _declare_lost(holding, holding.cap_reason())
        undo = self._loop.create_task(
            holding.lease.undo(holding.token), name="aiolock freeing at cap"
        )
        self._undos.add(undo)
        undo.add_done_callback(self._undos.discard)


def _wake_up(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)


def _first_error(outcomes: list[bool | Exception] | None) -> BaseException:
    for outcome in outcomes or ():
        if isinstance(outcome, Exception):
            return outcome
    return RuntimeError("renewal failed")  # pragma: no cover - a failed member has its error


def _warn_failed(failed: list[Holding], error: BaseException) -> None:
    """One WARNING for the members of one call that failed: retried until their lease ends."""
    now = time.monotonic()
    remaining = max(min(h.lease_end for h in failed) - now, 0.0)
    first = failed[0].name
    others = len(failed) - 1
    names = ", ".join(repr(h.name) for h in failed[1:_NAMED])
    more = f" and {others} more ({names}{', ...' if others >= _NAMED else ''})" if others else ""
    logger.warning(
        "renewal of lock %r%s failed (%s: %s); retrying for %.3f s more",
        first,
        more,
        type(error).__name__,
        error,
        remaining,
    )


#: The renewer of each event loop that has holdings to renew.
_renewers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Renewer] = (
    weakref.WeakKeyDictionary()
)


def renewer_for(loop: asyncio.AbstractEventLoop) -> Renewer:
    """``loop``'s renewer (started if it has none)."""
    renewer = _renewers.get(loop)
    if renewer is None:
        renewer = _renewers[loop] = Renewer(loop)
    return renewer


def _declare_lost(holding: Holding, reason: str) -> None:
    watcher = holding.watcher
    lock = watcher() if watcher is not None else None
    if lock is not None:
        lock._declare_lost(holding, reason)
    elif holding.renewer is not None:  # pragma: no cover - its lock is gone: it was reported
        holding.renewer.remove(holding)
