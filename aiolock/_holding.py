"""A holding and its life: one acquisition, from the grant to its end.

A *holding* is one successful acquisition: its token, the task that
acquired it, and its lease as this process sees it. The lease end is
measured on the monotonic clock from the moment the ``SET`` (or the last
confirmed extend) was *sent*, so the server, which started its clock later,
can never expire the key before this process thinks the lease has run out.
A lease may count less than it asks for (Redlock subtracts the clock drift
allowance): ``ttl`` is what the server is asked for, ``span`` what the
holder counts.

Its life is a small state machine (:class:`State`)::

    HELD --lose(reason)--> LOST --end()--> ENDED
    HELD --end()------------------------> ENDED  (--lost_at_release(reason)-->)

``HELD``: renewed (or waiting for its lease end), answered for by the lock.
``LOST``: declared lost (the server said the key is gone, the lease or the
cap ran out): renewal stopped, the loss reported, not yet released.
``ENDED``: forgotten locally (released, or given up); a release that finds
the key gone records the loss then. A transition from a state it does not
start from changes nothing and says so (returns False): a loss declared
twice, or declared after the release, is not a second loss.

The lock object keeps its holdings (:class:`Holdings`): one per task that
acquired, and the *detached* ones, whose acquiring task ended while holding
(``acquire()`` run by ``asyncio.wait_for`` on CPython 3.11, or by
``gather``; a lock handed to a background job); those stay held and renewed
until they are released, lost, or nobody can release them any more
(:func:`never_released`). A task started by a holder shares its holdings
(:data:`ANCESTORS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
import math
import threading
import warnings
import weakref
from typing import Any, Final, NoReturn, Protocol, final

from ._lease import Lease
from ._queue import Entry, LocalQueue
from ._timers import Timer

__all__ = [
    "ANCESTORS",
    "Holding",
    "Holdings",
    "Renewing",
    "State",
    "Watcher",
    "never_released",
    "no_task",
]

logger = logging.getLogger("aiolock")

#: The tasks of this context that acquired a lock, outermost first. A task inherits its
#: creator's context (``asyncio.create_task``, a task group, Starlette's ``call_next``),
#: so a task started by a holder shares the holder's holdings for ``owned()``,
#: ``extend()`` and ``release()`` (not for ``acquire()``: it waits like any other task).
ANCESTORS: contextvars.ContextVar[tuple[asyncio.Task[Any], ...]] = contextvars.ContextVar(
    "aiolock_ancestors", default=()
)


class State(enum.Enum):
    """Where a holding is in its life (see the module's docstring)."""

    HELD = "held"
    LOST = "lost"
    ENDED = "ended"


#: The table of tasks of every lock that has none registered: shared, so never written
#: (only ``_register`` adds to a table, and it makes the lock a table of its own first).
_NO_TASKS: Final[dict[asyncio.Task[Any], Holding]] = {}

HELD: Final = State.HELD
LOST: Final = State.LOST
ENDED: Final = State.ENDED


class Renewing(Protocol):
    """What a holding asks of the renewer it belongs to (:class:`~aiolock._renewal.Renewer`)."""

    def remove(self, holding: Holding) -> asyncio.Task[None] | None:
        """Stop renewing ``holding``; the renewer's task if that ended it."""
        ...

    def reschedule(self, holding: Holding, *, soon: bool = False) -> None:
        """``holding``'s lease changed outside the renewer: due anew."""
        ...


class Watcher(Protocol):
    """What the renewer tells of a holding: the lock it belongs to."""

    def _declare_lost(self, holding: Holding, reason: str) -> None:
        """Mark ``holding`` lost with ``reason`` (idempotent)."""
        ...

    def _gone_at_renewal(self, holding: Holding) -> None:
        """A renewal found the key no longer ``holding``'s: lost now, the reason looked up."""
        ...

    def _renewed(self, holding: Holding, error: BaseException | None) -> None:
        """One renewal of ``holding`` reset its lease (None), or failed (the error)."""
        ...


@final
class Holding:
    """One acquisition: its token, its task, its lease, and where it is in its life."""

    __slots__ = (
        "acquired_at",
        "callbacks",
        "capped",
        "depth",
        "due",
        "ended",
        "entry",
        "extending",
        "fence",
        "flight",
        "flying_end",
        "has_baton",
        "hold_end",
        "lease",
        "lease_end",
        "live",
        "loop",
        "loss_reason",
        "lost",
        "name",
        "queue",
        "renewal",
        "renewed_at",
        "renewer",
        "span",
        "state",
        "task",
        "thread",
        "timer",
        "token",
        "ttl",
        "watcher",
    )

    def __init__(
        self,
        name: str,
        token: str,
        task: asyncio.Task[Any],
        ttl: float,
        span: float,
        sent: float,
        fence: int | None,
        queue: LocalQueue,
        lease: Lease,
    ) -> None:
        self.name = name  # the lock's, for messages
        self.lease = lease  # renewed through it
        self.token = token
        self.queue = queue  # the local queue whose baton it holds
        self.thread = queue.thread  # the thread whose event loop it belongs to
        # The task that acquired; None once it has ended (the holding is detached, and
        # keeps nothing of it: a done task holds its coroutine, context and result).
        self.task: asyncio.Task[Any] | None = task
        self.loop = task.get_loop()  # the event loop it belongs to
        self.ttl = ttl  # asked of the server
        self.span = span  # counted by the holder
        self.renewed_at = sent
        self.lease_end = sent + span
        self.acquired_at = sent
        # The end of the holding's cap (max_hold) on the monotonic clock, or infinity;
        # ``capped``: the lease last asked for ends at the cap (no renewal after it).
        self.hold_end = math.inf
        self.capped = False
        self.fence = fence
        #: How many nested acquisitions of its task it stands for (``reentrant=True``).
        self.depth = 1
        self.state = HELD
        #: Why it was lost; empty while it was not.
        self.loss_reason = ""
        # What the state says, read on every acquisition and release: kept by the
        # transitions below, and by nothing else.
        #: Held: neither lost nor ended.
        self.live = True
        #: Forgotten locally: released, or given up.
        self.ended = False
        #: Declared lost, before its end or at its release.
        self.lost = False
        #: Whether it still has its local queue's baton (the next local waiter's turn).
        self.has_baton = True
        #: Its first renewal point, or its lease end (``auto_renew=False``), while no
        #: renewer has it.
        self.timer: Timer | None = None
        # Renewal: the renewer it belongs to, with its lock (weakly), when it is due
        # next, the number of its entry in the renewer's heap (-1: none), the renewal
        # call in flight for it with the lease end it would give, and whether an
        # extend() of the holder is in flight.
        self.renewer: Renewing | None = None
        self.watcher: weakref.ref[Watcher] | None = None
        self.due = 0.0
        self.entry = -1
        self.flight: asyncio.Task[Any] | None = None
        self.flying_end = 0.0
        self.extending = False
        #: The renewer's task, when the end of this holding ended it: its release awaits it.
        self.renewal: asyncio.Task[None] | None = None
        #: ``on_lost`` coroutines still running (a tuple: most holdings never have one).
        self.callbacks: tuple[asyncio.Future[Any], ...] = ()

    # -- its state ---------------------------------------------------------------------

    def is_lost(self) -> bool:
        """Whether the holding has been declared lost (a method, so checkers re-read it)."""
        return self.loss_reason != ""

    def lose(self, reason: str) -> bool:
        """``HELD`` → ``LOST`` with ``reason``; False (and no change) from any other state."""
        if self.state is not HELD:
            return False
        self.state = LOST
        self.loss_reason = reason or "lost"
        self.live = False
        self.lost = True
        return True

    def end(self) -> bool:
        """``HELD`` or ``LOST`` → ``ENDED``; False (and no change) if it had ended."""
        if self.state is ENDED:
            return False
        self.state = ENDED
        self.live = False
        self.ended = True
        return True

    def lost_at_release(self, reason: str) -> bool:
        """Record that its release found the key no longer ours (``ENDED``, not lost before)."""
        if self.state is not ENDED or self.loss_reason:
            return False
        self.loss_reason = reason or "lost"
        self.lost = True
        return True

    # -- its local queue's baton -------------------------------------------------------

    def pass_baton(self) -> None:
        """Let the next local waiter contend (once per holding)."""
        if self.has_baton:
            self.has_baton = False
            self.queue.leave()

    def reserve_heir(self) -> Entry | None:
        """The next local waiter, reserved for a hand-over (the baton goes with it), or None."""
        if not self.has_baton:
            return None
        entry = self.queue.reserve()
        if entry is not None:
            self.has_baton = False
        return entry

    # -- its lease ---------------------------------------------------------------------

    def renewed(self, sent: float, ttl: float, span: float, *, capped: bool = False) -> None:
        """Record a confirmed extend sent at ``sent`` (``span`` s as counted).

        ``ttl`` is the lease later renewals ask for; ``capped``: the lease
        asked for was cut to end at the holding's cap.
        """
        self.ttl = ttl
        self.span = span
        self.renewed_at = sent
        self.lease_end = sent + span
        self.capped = capped

    def next_due(self) -> float:
        """When the renewer should look at this holding next: its renewal, or its cap."""
        if self.capped:  # the lease ends at the cap: nothing more to renew
            return min(self.hold_end, self.lease_end)
        return min(self.renewed_at + self.span / 3, self.hold_end)

    def asked(self, ttl: float, now: float) -> float:
        """The lease to ask for at ``now``: ``ttl``, cut to end at the cap (``max_hold``)."""
        return min(ttl, self.hold_end - now)

    def cap_reached(self, now: float) -> bool:
        """Whether the holding has lasted its cap at ``now`` (its last lease ended there)."""
        return now >= self.hold_end or (self.capped and now >= self.lease_end)

    def cap_reason(self) -> str:
        """Why a holding that reached its cap is lost."""
        cap = self.hold_end - self.acquired_at
        return f"it was held for max_hold={cap:g} s, the cap of one holding"


def no_task() -> NoReturn:
    """Raise: aiolock is used from inside asyncio tasks only.

    Callers write ``asyncio.current_task() or no_task()``.
    """
    raise RuntimeError("aiolock must be used from inside an asyncio task")


class Holdings:
    """The holdings of one lock object: one per task that acquired, and the detached ones.

    A base of the engine (:class:`~aiolock._leaselock.LeaseLock`): it keeps
    the tables and answers which holding a call acts on; the engine starts,
    watches and ends them.
    """

    __slots__ = ("_by_task", "_current", "_detached", "_last")

    def __init__(self) -> None:
        # (Both empty most of the time. The table is shared until the lock's first
        # registration makes its own; a lock whose holdings all detached (thousands
        # held by tasks that ended) gives its table back.)
        self._by_task: dict[asyncio.Task[Any], Holding] = _NO_TASKS
        #: Live holdings whose acquiring task ended, oldest first.
        self._detached: tuple[Holding, ...] = ()
        #: The latest holding that has not ended, and the latest of all.
        self._current: Holding | None = None
        self._last: Holding | None = None

    def _register(self, task: asyncio.Task[Any], holding: Holding) -> None:
        """``task`` holds ``holding`` now; the tasks it starts from now on share it."""
        by_task = self._by_task
        if by_task is _NO_TASKS:
            by_task = self._by_task = {}
        by_task[task] = holding
        self._current = holding
        self._last = holding
        ancestors = ANCESTORS.get()
        if task not in ancestors:
            ANCESTORS.set((*ancestors, task))

    def _holding_of_task(self, task: asyncio.Task[Any] | None = None) -> Holding | None:
        """The holding the calling task acts on (``owned()``, ``extend()``), or None.

        Its own; else that of the nearest task it was started from (whose
        context it inherited) that holds; else the latest detached holding
        (one whose acquiring task has ended: anyone may act on it).
        """
        if task is None:
            task = asyncio.current_task()
        by_task = self._by_task
        holding = by_task.get(task) if task is not None else None
        if holding is not None:
            return holding
        for ancestor in reversed(ANCESTORS.get()):
            holding = by_task.get(ancestor)
            if holding is not None:
                return holding
        return self._latest_detached()

    def _latest_detached(self) -> Holding | None:
        """The latest live holding whose acquiring task ended, or None."""
        detached = self._detached
        while detached:
            holding = detached[-1]
            if holding.live and not holding.loop.is_closed():
                return holding
            detached = self._detached = detached[:-1]
            if holding.live:  # its loop closed while it was held
                never_released(holding, "its event loop was closed while it was held")
        current = self._current
        if current is not None and current.live and (current.task is None or current.task.done()):
            return current  # detached a moment ago: its task's callback has not run yet
        return None

    def _holding_of_caller(self) -> Holding | None:
        """The calling task's holding (see :meth:`_holding_of_task`), else the latest one."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        holding = self._holding_of_task(task) if task is not None else None
        return holding if holding is not None else self._last

    def _detach(self, task: asyncio.Task[Any]) -> Holding | None:
        """``task`` ended: its live holding, now detached (kept among the detached), or None."""
        holding = self._by_task.pop(task, None)
        if holding is None or not holding.live:
            return None
        self._detached = (*self._detached, holding)
        # Keep nothing of the ended task (its coroutine, context and result): thousands
        # of holdings acquired by short tasks would keep thousands of them.
        holding.task = None
        queue = holding.queue
        if queue.owner is task:
            queue.owner = holding
        if queue.holder is task:
            queue.holder = holding
        if not self._by_task:
            self._by_task = _NO_TASKS  # (a dict keeps the table it grew to)
        return holding

    def _forget(self, holding: Holding) -> asyncio.Task[Any] | None:
        """Take ``holding`` out of the tables; its task if it was still registered for it."""
        task = holding.task
        found = None
        if task is not None and self._by_task.get(task) is holding:
            del self._by_task[task]  # (its table stays: a lock is usually taken again)
            found = task
        elif holding in self._detached:
            self._detached = tuple(h for h in self._detached if h is not holding)
        if self._current is holding:
            self._current = None
        return found

    def _every_holding(self) -> set[Holding]:
        """Every holding the object still knows of (for its garbage collection)."""
        holdings = {*self._by_task.values(), *self._detached}
        if self._current is not None:
            holdings.add(self._current)
        return holdings


def never_released(holding: Holding, why: str) -> None:
    """``holding`` can no longer be released by anyone: say so, stop renewing it.

    A ``ResourceWarning`` (and a WARNING record) names the lock; the holding
    ends here, its timer and its renewal stop, and the server expires the
    key with its lease. Safe from any thread, and from a garbage collection
    that interrupts the renewer: the renewal is stopped by a callback of the
    holding's loop.
    """
    if not holding.live:
        return
    holding.end()
    message = (
        f"lock {holding.name!r} was never released ({why}); its renewal stopped and "
        "the server expires the key with its lease. Release what you acquire: "
        "async with, or release() in a finally"
    )
    try:
        warnings.warn(message, ResourceWarning, stacklevel=2)
    finally:
        logger.warning("%s", message)
        _stop(holding)


def _stop(holding: Holding) -> None:
    """Stop the holding's timer and renewal, in its loop's thread, soon."""
    timer, renewer = holding.timer, holding.renewer
    holding.timer = None
    if timer is None and renewer is None:
        return
    loop = holding.loop

    def stop() -> None:
        if timer is not None:
            timer.cancel()
        if renewer is not None:
            renewer.remove(holding)

    with contextlib.suppress(RuntimeError):  # its loop is closed: nothing of it runs any more
        if holding.thread == threading.get_ident():
            loop.call_soon(stop)
        else:
            loop.call_soon_threadsafe(stop)
