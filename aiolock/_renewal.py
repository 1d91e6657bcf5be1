"""One holding of a lock, and the watchdog that keeps its lease alive.

A *holding* is one successful acquisition: its token, its owner task, and
its lease as this process sees it. The lease end is measured on the
monotonic clock from the moment the ``SET`` (or the last successful extend)
was *sent*, so the server, which started its clock later, can never expire
the key before this process thinks the lease has run out. A lease may count
less than it asks for (Redlock subtracts the clock drift allowance): ``ttl``
is what the server is asked for, ``span`` what the holder counts.

The watchdog is one asyncio task per holding that extends the lease, through
the holding's :class:`~aiolock._lease.Lease`, every ``span/3``. It is
started lazily at the first renewal point (a short holding
never needs a task), and it is cancelled and awaited when the holding ends.
It does not end with the task that acquired: a holding whose acquiring task
ended (a *detached* holding: ``acquire()`` run by ``asyncio.wait_for`` on
CPython 3.11, or by ``gather``; a lock handed to a background job) is
renewed until it is released or lost. It holds its lock object only weakly:
a holding that nobody can release any more (its lock object was
garbage-collected, or its event loop shut down) is reported as never
released (:func:`never_released`), and its renewal stops, so that the key
expires with its lease.
It declares the lock lost when the server says the key is gone or is not
ours, when the holding has lasted its cap (``max_hold``: renewals never
carry the lease past it, and at the cap the watchdog frees the key so the
next waiter gets it at once), and also when the lease end arrives before a renewal could be
confirmed (failed calls are retried until then, each bounded by the lease
end, since redis-py's own retries would otherwise run past it). Any error is
retried, not only redis-py's: on uvloop a call on a closed transport raises a
bare ``RuntimeError``, and a watchdog that dies of it would leave the holder
believing it still holds the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import warnings
import weakref
from typing import Any, Protocol, final

import anyio

from ._cancel import honour_cancellation
from ._lease import Lease
from ._queue import LocalQueue
from ._timers import Timer

__all__ = ["Holding", "Watcher", "keep_alive", "never_released", "watchdog_ended"]

logger = logging.getLogger("aiolock")

#: Between two failed renewal attempts: a tenth of the lease, within these bounds.
_RETRY_MIN = 0.005
_RETRY_MAX = 1.0


@final
class Holding:
    """The state of one acquisition, shared by the lock and its watchdog."""

    __slots__ = (
        "acquired_at",
        "callbacks",
        "capped",
        "depth",
        "ended",
        "fence",
        "has_baton",
        "hold_end",
        "lease_end",
        "loss_reason",
        "lost",
        "name",
        "queue",
        "renewal",
        "renewed_at",
        "span",
        "task",
        "thread",
        "timer",
        "token",
        "ttl",
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
    ) -> None:
        self.name = name  # the lock's, for messages
        self.token = token
        self.queue = queue  # the local queue whose baton it holds
        self.thread = threading.get_ident()  # the thread whose event loop it belongs to
        self.task = task  # the task that acquired (it may end first: the holding is detached)
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
        self.depth = 1
        self.lost = False
        self.loss_reason = ""
        self.ended = False
        self.has_baton = True
        self.timer: Timer | None = None
        self.renewal: asyncio.Task[None] | None = None
        self.callbacks: list[asyncio.Future[Any]] = []

    def is_lost(self) -> bool:
        """Whether the holding has been declared lost (a method, so checkers re-read it)."""
        return self.lost

    @property
    def live(self) -> bool:
        """Neither ended (released, or given up) nor lost."""
        return not (self.ended or self.lost)

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


class Watcher(Protocol):
    """What the watchdog tells of a holding: the lock it belongs to."""

    def _declare_lost(self, holding: Holding, reason: str) -> None:
        """Mark ``holding`` lost with ``reason`` (idempotent)."""
        ...

    def _renewed(self, holding: Holding, error: BaseException | None) -> None:
        """One renewal of ``holding`` reset its lease (None), or failed (the error)."""
        ...


async def keep_alive(holding: Holding, lease: Lease, watcher: weakref.ref[Watcher]) -> None:
    """Extend ``holding`` every ``span/3`` until cancelled or lost.

    Args:
        holding: the holding to keep alive.
        lease: the lease it holds: ``extend(token, ttl)`` says whether the
            key was still ours.
        watcher: the lock the holding belongs to, weakly: told of losses and
            renewals while it exists. Once it is gone, nobody can release
            the holding: it was reported never released, and renewal stops.
    """
    task = asyncio.current_task()
    while holding.live:
        now = time.monotonic()
        if holding.cap_reached(now):
            await _free_at_cap(holding, lease, watcher)
            return
        if now >= holding.lease_end:
            _declare_lost(watcher, holding, "the lease ran out before it could be renewed")
            return
        if holding.capped:  # the lease ends at the cap: nothing more to renew
            wake = min(holding.hold_end, holding.lease_end)
        else:
            wake = min(holding.renewed_at + holding.span / 3, holding.hold_end)
        if wake > now:
            await anyio.sleep(wake - now)
            await honour_cancellation(task, 0)
            continue
        if watcher() is None:
            return  # unreachable: reported never released, ended
        sent = now
        # Both read now: an extend() that ends while this renewal is in flight changes
        # them, and the renewal's late reply must not mix its lease with the extend's.
        ttl = holding.ttl
        asked = holding.asked(ttl, sent)  # never past the cap
        span = lease.counted(asked)  # a grant's first lease is shorter; renewals ask for ttl
        if span <= 0:  # too little left of the cap to count a lease
            await _free_at_cap(holding, lease, watcher)
            return
        try:
            with anyio.move_on_after(holding.lease_end - sent):
                ok = await lease.extend(holding.token, asked)
                await honour_cancellation(task, 0)
                if not ok:
                    _declare_lost(
                        watcher, holding, "the key was gone or held by another holder at renewal"
                    )
                    return
                holding.renewed(sent, ttl, span, capped=asked < ttl)
                lock = watcher()
                if lock is not None:
                    lock._renewed(holding, None)
                    del lock
                continue
        except Exception as exc:
            # Not only redis-py's errors: uvloop raises a bare RuntimeError on a closed
            # transport. Any failure is retried until the lease end.
            await honour_cancellation(task, 0)
            remaining = holding.lease_end - time.monotonic()
            logger.warning(
                "renewal of lock %r failed (%s: %s); retrying for %.3f s more",
                holding.name,
                type(exc).__name__,
                exc,
                max(remaining, 0.0),
            )
            lock = watcher()
            if lock is not None:
                lock._renewed(holding, exc)
                del lock
            retry = min(max(holding.span / 10, _RETRY_MIN), _RETRY_MAX, max(remaining, 0.0))
            await anyio.sleep(retry)
            await honour_cancellation(task, 0)
            continue
        # The lease end came while the extend was still in flight.
        _declare_lost(watcher, holding, "the lease ran out while a renewal was still unanswered")
        return


def watchdog_ended(holding: Holding, task: asyncio.Task[None]) -> None:
    """The done callback of ``holding``'s watchdog: a cancellation not of aiolock's is a shutdown.

    aiolock ends or loses a holding before it cancels its watchdog; a
    watchdog cancelled while its holding is live was cancelled by its event
    loop shutting down (``asyncio.run`` cancels every task at its end), even
    before it first ran.
    """
    if task.cancelled() and holding.live:
        never_released(holding, "its event loop shut down while it was held")


def _declare_lost(watcher: weakref.ref[Watcher], holding: Holding, reason: str) -> None:
    lock = watcher()
    if lock is not None:
        lock._declare_lost(holding, reason)


def never_released(holding: Holding, why: str) -> None:
    """``holding`` can no longer be released by anyone: say so, stop renewing it.

    A ``ResourceWarning`` (and a WARNING record) names the lock; the holding
    ends here, its timer and its watchdog stop, and the server expires the
    key with its lease. Safe from any thread (a garbage collection may run
    this in another thread than the holding's loop).
    """
    if not holding.live:
        return
    holding.ended = True
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
    """Stop the holding's timer and watchdog, from whatever thread this runs in."""
    timer, renewal = holding.timer, holding.renewal
    holding.timer = None
    if timer is None and (renewal is None or renewal.done()):
        return
    loop = holding.task.get_loop()

    def stop() -> None:
        if timer is not None:
            timer.cancel()
        if renewal is not None and renewal is not asyncio.current_task():
            renewal.cancel()

    if holding.thread == threading.get_ident():
        stop()
        return
    with contextlib.suppress(RuntimeError):  # its loop is closed: nothing of it runs any more
        loop.call_soon_threadsafe(stop)


async def _free_at_cap(holding: Holding, lease: Lease, watcher: weakref.ref[Watcher]) -> None:
    """The holding reached its cap: declare it lost, then free the key for the next holder.

    Declared first, so the holder stops trusting it before anyone else can
    take the lock; the key is then deleted with the holding's token (never
    another holder's), shielded and bounded, and the lock goes on by the
    grant rule. If the server does not answer, the lease (which ends at the
    cap) expires the key.
    """
    _declare_lost(watcher, holding, holding.cap_reason())
    await lease.undo(holding.token)
