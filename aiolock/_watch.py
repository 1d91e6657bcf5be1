"""A lock object's holdings from the grant to their end: watched, extended, lost, released.

:class:`Watch` is a base of the engine (:class:`~aiolock._leaselock.LeaseLock`),
which checks the arguments of the public calls and hands the holding to
these methods. Once ``acquire()`` has won, :meth:`Watch._hold` records the
holding and arms its first renewal (or, with ``auto_renew=False``, its
lease end); the loop's renewer (:mod:`aiolock._renewal`) takes it from
there, and :meth:`Watch._extend_holding` resets its lease on request. A
loss, whoever finds it (the renewer, ``extend()``, ``release()``, the lease
end), goes through :meth:`Watch._declare_lost`: the holding stops being
renewed, the next local waiter gets its turn, the body of ``async with`` is
cancelled (``cancel_on_lost=True``), and the loss is logged, told to the
observers and to ``on_lost`` (by its base, :class:`~aiolock._report.Reporter`).
:meth:`Watch._release` ends a holding: the
key is deleted, or handed to the next local waiter
(:func:`~aiolock._queue.hand_over`).

Timers and the renewer hold the lock object weakly: a lock object dropped
while it holds is collected, and its holdings are reported never released
(``__del__``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

from ._cancel import finish, honour_cancellation
from ._contend import Won
from ._exceptions import LockLostError, LockNotOwnedError
from ._holding import Holding, never_released
from ._observe import observers
from ._queue import hand_over
from ._renewal import renewer_for
from ._report import Reporter
from ._timers import GRACE, Cutoff, call_at
from ._wire import slot_ahead

__all__ = ["Watch"]

logger = logging.getLogger("aiolock")


def _renewal_due(lock: weakref.ref[Watch], holding: Holding) -> None:
    """A holding's first renewal is due (its lock held weakly: a dropped one is not kept)."""
    owner = lock()
    if owner is not None:
        owner._start_renewal(holding)


def _lease_due(lock: weakref.ref[Watch], holding: Holding) -> None:
    """A holding's lease end is due (``auto_renew=False``); its lock held weakly."""
    owner = lock()
    if owner is not None:
        owner._lease_over(holding)


class Watch(Reporter):
    """The holdings of a lock object from the grant to their end (see the module)."""

    __slots__ = ("__weakref__", "_auto_renew", "_max_hold")

    _auto_renew: bool
    _max_hold: float | None

    # -- a new holding -----------------------------------------------------------------

    def _hold(self, task: asyncio.Task[Any], won: Won) -> Holding:
        """Record a new holding of ``task`` and start watching its lease.

        A lock handed over by a local releaser (``won.handed``) continues the
        local run; one taken on the server starts a new one.
        """
        lease = self._lease
        sent = won.sent
        queue = won.queue
        holding = Holding(
            self._name,
            won.token,
            task,
            lease.ttl,
            lease.span if won.span is None else won.span,
            sent,
            won.fence if lease.fencing else None,
            queue,
            lease,
        )
        if self._max_hold is not None:
            holding.hold_end = sent + self._max_hold
        queue.holder = task
        if not won.handed:
            queue.run_started = sent
        self._register(task, holding)
        # Its first renewal, or the end of its lease (checked again when due: an
        # attempt's spare timer is due at the first renewal point, maybe earlier). The
        # timer holds the lock weakly: a lock object dropped while held is collected.
        callback = _renewal_due if self._auto_renew else _lease_due
        ref = weakref.ref(self)
        timer = won.timer
        if timer is not None and timer.reuse(callback, ref, holding):
            holding.timer = timer
        else:
            # A grant's first lease is short and counted from before the grant (the
            # heir's latest proof of being queued): renewing it at a third would renew at
            # once whenever that proof is older, so its first renewal comes at two thirds,
            # which still leaves a third of the lease for retries.
            share = 2 / 3 if won.span is not None else 1 / 3
            when = sent + holding.span * share if self._auto_renew else holding.lease_end
            holding.timer = call_at(when, callback, ref, holding, loop=task.get_loop())
        task.add_done_callback(self._task_done)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("acquired lock %r (fence %s)", self._name, holding.fence)
        return holding

    # -- watching it -------------------------------------------------------------------

    def _start_renewal(self, holding: Holding, due: float | None = None) -> None:
        """Hand ``holding`` to its loop's renewer, due at ``due``.

        By default it is due now, or at its next renewal point if an
        ``extend()`` put that later.
        """
        holding.timer = None
        if not holding.live:
            return
        if due is None:
            due = max(time.monotonic(), holding.next_due())
        renewer_for(holding.loop).add(holding, weakref.ref(self), due)

    def _lease_over(self, holding: Holding) -> None:
        """The lease end of a holding that is not renewed came: lost, unless extended."""
        holding.timer = None
        if time.monotonic() < holding.lease_end:  # extended meanwhile
            holding.timer = call_at(holding.lease_end, _lease_due, weakref.ref(self), holding)
            return
        if holding.cap_reached(time.monotonic()):
            reason = holding.cap_reason()
        else:
            reason = "the lease ran out (auto_renew is off)"
        self._declare_lost(holding, reason)

    def _rearm_lease_end(self, holding: Holding) -> None:
        """An ``extend()`` moved the lease end of a holding that is not renewed."""
        if not self._auto_renew and holding.timer is not None:
            holding.timer.cancel()
            holding.timer = call_at(holding.lease_end, _lease_due, weakref.ref(self), holding)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """The acquiring task ended while holding: the holding is detached, and goes on.

        It stays held and renewed until it is released (by any task), lost,
        capped, or unreachable (this lock object collected: :meth:`__del__`).
        """
        holding = self._detach(task)
        if holding is None:
            return
        timer = holding.timer
        if holding.renewer is None and timer is not None and self._auto_renew:
            # It joins the renewer now rather than at its first renewal point: a loop
            # that shuts down cancels tasks, not timers, and the holding must be told.
            timer.cancel()
            self._start_renewal(holding, timer.when)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("lock %r: its acquiring task ended; the holding goes on", self._name)

    def __del__(self) -> None:
        """Nobody can release this lock's holdings any more: say so, and stop renewing them."""
        try:
            if self._current is None and not self._detached and not self._by_task:
                return  # (the common case: nothing held)
            holdings = self._every_holding()
        except AttributeError:  # made only in part (its __init__ raised)
            return
        for holding in holdings:
            if holding.live:
                # (A warning that -W error turns into an exception is Python's to report
                # here: "Exception ignored in __del__".)
                never_released(holding, "its lock object was garbage-collected while it was held")

    def _stop_watching(self, holding: Holding) -> None:
        if holding.timer is not None:
            holding.timer.cancel()
            holding.timer = None
        renewer = holding.renewer
        if renewer is not None:
            # The renewer's task, if this was its last holding: the release awaits it.
            holding.renewal = renewer.remove(holding)

    async def _extend_holding(self, holding: Holding, new_ttl: float) -> None:
        """Reset ``holding``'s lease to ``new_ttl`` from now (``extend()``, checked).

        Raises:
            LockLostError: it was lost, or is found lost now.
            redis.exceptions.RedisError: the server failed; it keeps its lease.
        """
        lease = self._lease
        sent = time.monotonic()
        if not holding.lost:
            if holding.cap_reached(sent):
                self._declare_lost(holding, holding.cap_reason())
            elif sent >= holding.lease_end:
                self._declare_lost(holding, "the lease ran out before extend()")
        if holding.lost:
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        asked = holding.asked(new_ttl, sent)
        span = lease.counted(asked)
        if span <= 0:  # too little of the cap left to count a lease
            self._declare_lost(holding, holding.cap_reason())
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        # No renewal is sent while this extend is in flight. One sent before may still be
        # unanswered: the server may run it after this one, with the lease it asked for;
        # the holder counts the shorter of the two until a renewal after this extend lands.
        holding.extending = True
        flying = holding.flying_end if holding.flight is not None else None
        soon = False
        try:
            extended = await lease.extend(holding.token, asked)
            if extended and holding.live:
                holding.renewed(sent, new_ttl, span, capped=asked < new_ttl)
                if flying is not None and flying < holding.lease_end:
                    holding.lease_end = flying
                    soon = True
        finally:
            holding.extending = False
            if holding.renewer is not None:
                holding.renewer.reschedule(holding, soon=soon)
        if not extended:
            why = await self._why_gone(holding.token) or lease.gone
            self._declare_lost(holding, f"{why} at extend()")
            raise LockLostError(
                f"lock {self._name!r} is no longer held by this holder: {why}; "
                "other holders' keys were left alone"
            )
        if holding.is_lost():  # declared lost while the extend was in flight
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        self._event("renewed", holding)
        self._rearm_lease_end(holding)

    # -- its loss ----------------------------------------------------------------------

    def _declare_lost(self, holding: Holding, reason: str) -> None:
        """Mark ``holding`` lost: renewal stopped, baton passed, body cancelled, reported."""
        if not holding.live:
            return
        self._stop_watching(holding)
        holding.pass_baton()
        self._cancel_body(holding)
        self._report_loss(holding, reason)

    def _gone_at_renewal(self, holding: Holding) -> None:
        """A renewal found the key no longer ours: lost at once, reported once we know why.

        The holding stops being trusted now; the report (the log, the
        observers, ``on_lost``) waits for one more read: the mark a forced
        release leaves (``aiolock release --force``), which names the forcer.
        A release or an exit of ``async with`` waits for that report.
        """
        if not holding.live:
            return
        reason = "the key was gone or held by another holder at renewal"
        self._stop_watching(holding)
        holding.pass_baton()
        holding.lose(reason)
        self._cancel_body(holding)
        holding.callbacks += (asyncio.ensure_future(self._report_gone(holding, reason)),)

    async def _report_gone(self, holding: Holding, reason: str) -> None:
        forced = await self._why_gone(holding.token)
        if forced is not None:
            reason = holding.loss_reason = forced
        self._tell_loss(holding, reason)

    # -- its end -----------------------------------------------------------------------

    def _end(self, holding: Holding) -> None:
        """Forget ``holding`` locally (the server side is the caller's business)."""
        holding.end()
        if holding.timer is not None:
            holding.timer.cancel()
            holding.timer = None
        if holding.renewer is not None:
            self._stop_watching(holding)
        task = self._forget(holding)
        if task is not None:
            task.remove_done_callback(self._task_done)

    async def _release(self, task: asyncio.Task[Any]) -> None:
        """What ``release()`` does, called from ``task``: the holding ends, the key goes."""
        holding = self._holding_of_task(task) or self._current
        if holding is None:
            raise LockNotOwnedError(f"lock {self._name!r} is not held")
        if holding.depth > 1 and not holding.lost:
            holding.depth -= 1
            return
        baseline = task.cancelling()
        ahead = None
        if not holding.lost:
            waiting = slot_ahead(self._lease, holding.loop, task)
            if waiting is not None:
                ahead = await waiting
        try:
            if holding.ended:  # released meanwhile, by another task sharing the holding
                raise LockNotOwnedError(f"lock {self._name!r} is not held")
            if not holding.lost and time.monotonic() >= holding.lease_end:
                # The loop was blocked past the lease: the watchdog had no chance to run.
                self._declare_lost(holding, "the lease ran out before release")
            # The holding's timer (its first renewal, or its lease end) is due before the
            # release's cut-off: the cut-off reuses it rather than arming a timer of its own.
            spare = holding.timer
            holding.timer = None
            self._end(holding)
        except BaseException:
            if ahead is not None:
                ahead.give_back()  # (never kept by a release that sends nothing)
            raise
        lease = self._lease
        try:
            if holding.lost:
                if holding.callbacks:  # (its report may be reading why it was lost)
                    await self._settle(holding)
                raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
            entry = holding.reserve_heir()
            if entry is not None:
                deleted = await hand_over(
                    lease,
                    lease.queueing,
                    holding.queue,
                    entry,
                    name=self._name,
                    token=holding.token,
                    lease_end=holding.lease_end,
                    task=task,
                    spare=spare,
                )
            else:
                cutoff = Cutoff(holding.lease_end + GRACE, task, spare)
                deleted = await lease.release(holding.token, cutoff)
            if not deleted:
                why = lease.gone
                try:
                    why = await self._why_gone(holding.token) or why
                finally:
                    self._report_loss(holding, f"{why} at release")
        finally:
            if ahead is not None:
                ahead.give_back()  # (if no command went out on it)
            if spare is not None and not spare.done:
                spare.cancel()
            holding.pass_baton()
            if observers and not holding.lost:
                # Given up: deleted, or (cancelled, failed) undone or left to its lease.
                self._event("released", holding)
            if holding.renewal is not None or holding.callbacks:
                await self._settle(holding)
        if not deleted:
            raise LockLostError(
                f"lock {self._name!r} was no longer held by this holder at release: "
                f"{holding.loss_reason}; other holders' keys were left alone"
            )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("released lock %r", self._name)
        if task.cancelling() > baseline:
            await honour_cancellation(task, baseline)

    async def _settle(self, holding: Holding) -> None:
        """Wait for the holding's watchdog and callbacks to finish, even if cancelled meanwhile."""
        me = asyncio.current_task()
        pending = [
            t for t in (holding.renewal, *holding.callbacks) if t is not None and t is not me
        ]
        holding.renewal = None
        holding.callbacks = ()
        if pending:
            await finish(pending)  # shielded: a cancelled release must not return before them
