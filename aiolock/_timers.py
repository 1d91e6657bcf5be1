"""Deadlines on one lazily armed loop timer per event loop, for all of aiolock's.

Every holding needs a timer (its first renewal, or the end of its lease) and
every attempt with a timeout needs a cut-off, yet almost all of them are
cancelled long before they are due: a lock held for a millisecond cancels a
renewal timer set ``ttl/3`` ahead. A loop timer per deadline would be made
and cancelled at every acquire and release (docs/internals.md, The hot
path, says what that would cost).

So the deadlines of one event loop share a heap and one loop timer, armed
for the earliest of them. Adding a later deadline is a heap push; cancelling
one only marks it (the heap is compacted when most of it is cancelled), and
the loop timer is re-armed only for a deadline earlier than the one it waits
for. Times are ``time.monotonic()`` seconds, the clock of every lease.

:class:`Cutoff` builds on it: it cancels the current task at a deadline and
turns that cancellation back into a plain "expired" flag, as
``asyncio.timeout_at`` does, for the cost of a heap push.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, final

__all__ = ["GRACE", "Cutoff", "Timer", "call_at", "spare_at"]

#: How long a release (or hand-over) may run past the holding's lease end before it is cut off.
GRACE: Final = 0.1

#: The context the loop timer runs in: none of the task that armed it, which it
#: would keep alive (a task's context refers to the task) until it fires.
_CONTEXT: Final = contextvars.Context()

#: Compact a heap only once it holds at least this many cancelled deadlines.
_COMPACT_MIN: Final = 64


def _nothing() -> None:
    """The callback of a cancelled timer."""


@final
class Timer:
    """One deadline: ``cancel()`` it to keep its callback from running."""

    __slots__ = ("_args", "_callback", "_scheduler", "done", "when")

    def __init__(
        self,
        scheduler: _Scheduler,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
    ) -> None:
        self._scheduler = scheduler
        self.when = when
        self._callback = callback
        self._args = args
        #: Fired or cancelled.
        self.done = False

    def cancel(self) -> None:
        """Make sure the callback does not run (no-op once it ran or was cancelled).

        The callback and its arguments are dropped at once: a cancelled
        deadline waits in the heap until it is due or compacted, and must not
        keep a lock (and its holding) alive until then.
        """
        if not self.done:
            self.done = True
            self._callback = _nothing
            self._args = ()
            self._scheduler.cancelled()

    def reuse(self, callback: Callable[..., object], *args: Any) -> bool:
        """Run ``callback(*args)`` at this timer's deadline instead; False if it is done.

        Saves a new timer for a later deadline: the new callback, called at
        this earlier one, arms the later one only if it is still needed.
        """
        if self.done:
            return False
        self._callback = callback
        self._args = args
        return True

    def _run(self) -> None:
        self.done = True
        self._callback(*self._args)


@final
class _Scheduler:
    """The deadlines of one event loop, on one loop timer.

    Nothing global holds a scheduler strongly: the registry maps the loop to
    a weak reference, and the loop's own pending timer keeps the scheduler
    alive while it has deadlines. So a closed loop, its scheduler and
    whatever its deadlines refer to (tasks, holdings) are freed together.
    That is also why the loop timer is never kept here to be cancelled: a
    stale firing (after an earlier deadline re-armed it) sees that its
    ``generation`` is old and does nothing.
    """

    __slots__ = ("__weakref__", "_armed", "_cancelled", "_generation", "_heap", "_loop", "_order")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._generation = 0
        self._armed: float | None = None  # the deadline the current loop timer is for
        self._cancelled = 0

    def add(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> Timer:
        timer = Timer(self, when, callback, args)
        heapq.heappush(self._heap, (when, next(self._order), timer))
        if self._armed is None or when < self._armed:
            self._arm(self._heap[0][0])  # not `when`: from a callback, earlier ones may wait
        return timer

    def cancelled(self) -> None:
        self._cancelled += 1
        if self._cancelled >= _COMPACT_MIN and 2 * self._cancelled > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].done]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _arm(self, when: float) -> None:
        loop = self._loop()
        if loop is None:  # pragma: no cover - the loop is gone, and its deadlines with it
            self._armed = None
            return
        self._generation += 1
        self._armed = when
        loop.call_later(
            max(0.0, when - time.monotonic()), self._fire, self._generation, context=_CONTEXT
        )

    def _fire(self, generation: int) -> None:
        if generation != self._generation:
            return  # re-armed for an earlier deadline meanwhile
        self._armed = None
        now = time.monotonic()
        # self._heap is read afresh at every step: a callback may compact it.
        while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
            timer = heapq.heappop(self._heap)[2]
            if timer.done:
                self._cancelled -= 1
                continue
            try:
                timer._run()
            except Exception as exc:  # pragma: no cover - aiolock's callbacks do not raise
                loop = self._loop()
                if loop is not None:
                    loop.call_exception_handler(
                        {"message": "aiolock timer callback failed", "exception": exc}
                    )
        if self._heap and self._armed is None:
            # Loop timers may fire a little early (uvloop counts whole milliseconds):
            # whatever is not yet due waits for another turn.
            self._arm(self._heap[0][0])


_schedulers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.ReferenceType[_Scheduler]
] = weakref.WeakKeyDictionary()


#: The loop and the scheduler of the latest call, both weakly (the common case: one loop).
_latest: (
    tuple[weakref.ReferenceType[asyncio.AbstractEventLoop], weakref.ReferenceType[_Scheduler]]
    | None
) = None


def call_at(
    when: float,
    callback: Callable[..., object],
    *args: Any,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Timer:
    """Call ``callback(*args)`` in ``loop`` (default: the running loop) at monotonic ``when``.

    Pass the loop when it is at hand (``task.get_loop()``): asking for the
    running loop checks the process id, a system call on glibc >= 2.25.
    """
    global _latest  # a one-entry cache in front of the registry
    if loop is None:
        loop = asyncio.get_running_loop()
    latest = _latest
    scheduler = latest[1]() if latest is not None and latest[0]() is loop else None
    if scheduler is None:
        ref = _schedulers.get(loop)
        scheduler = None if ref is None else ref()
        if scheduler is None:
            scheduler = _Scheduler(loop)
            _schedulers[loop] = weakref.ref(scheduler)
        _latest = (weakref.ref(loop), weakref.ref(scheduler))
    return scheduler.add(when, callback, args)


def spare_at(when: float, loop: asyncio.AbstractEventLoop) -> Timer:
    """A timer at ``when`` with nothing to do yet: lent to a :class:`Cutoff`, then reused.

    Its owner gives it a callback with :meth:`Timer.reuse` or cancels it.
    """
    return call_at(when, _nothing, loop=loop)


@final
class Cutoff:
    """Cancel the current task at monotonic time ``when`` unless the block ended first.

    Used as ``with Cutoff(when) as cutoff:``; a cancellation it caused is
    swallowed at the end of the block and :attr:`expired` is set, while any
    other cancellation (``Task.cancel()``, ``asyncio.timeout``, an anyio
    scope) propagates untouched. The same contract as
    ``asyncio.timeout_at``, without its loop timer.
    """

    __slots__ = ("_cancelling", "_lent", "_task", "_timer", "_when", "expired")

    def __init__(
        self,
        when: float,
        task: asyncio.Task[Any] | None = None,
        spare: Timer | None = None,
        *,
        lend: bool = False,
    ) -> None:
        """Cut off the block at ``when``.

        ``task`` is the running task, if at hand. ``spare`` is a timer that
        the block may use if it is due no later than ``when``, so that a block
        that ends before it is due costs no timer of its own: one no longer
        needed (a holding's renewal timer, at its release), cancelled at the
        end of the block; or, with ``lend``, one its owner wants back
        (:func:`spare_at`), handed back unspent if it was not due.
        """
        self._when = when
        self._task = task
        self._timer = spare
        self._lent = spare if lend else None
        self._cancelling = 0
        #: The deadline passed inside the block, and the block was cut off there.
        self.expired = False

    def __enter__(self) -> Cutoff:
        task = self._task
        if task is None:
            task = self._task = asyncio.current_task()
            if task is None:  # pragma: no cover - only outside a task, which asyncio forbids
                raise RuntimeError("Cutoff must be used inside a task")
        self._cancelling = task.cancelling()
        spare = self._timer
        if spare is None or spare.when > self._when or not spare.reuse(self._due):
            self._timer = call_at(self._when, self._expire, loop=task.get_loop())
        return self

    def _due(self) -> None:
        """The spare timer is due: cut off now, or arm the real deadline."""
        if time.monotonic() >= self._when:
            self._expire()
        else:
            assert self._task is not None  # noqa: S101 - armed in __enter__
            self._timer = call_at(self._when, self._expire, loop=self._task.get_loop())

    def _expire(self) -> None:
        assert self._task is not None  # noqa: S101 - armed in __enter__
        self.expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        timer = self._timer
        assert timer is not None  # noqa: S101 - armed in __enter__
        assert self._task is not None  # noqa: S101
        if timer is self._lent and not timer.done:
            timer.reuse(_nothing)  # not due: its owner has it back
        else:
            timer.cancel()
        if not self.expired:
            return False
        # Take back the cancellation we asked for; swallow it only if it is the one
        # being raised and nothing else asked for one meanwhile.
        return self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError
