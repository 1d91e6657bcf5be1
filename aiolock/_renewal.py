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
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, final

import anyio

from ._cancel import honour_cancellation
from ._lease import Lease
from ._queue import LocalQueue
from ._timers import Timer

__all__ = ["Holding", "keep_alive"]

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
        "owner_done",
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
        token: str,
        task: asyncio.Task[Any],
        ttl: float,
        span: float,
        sent: float,
        fence: int | None,
        queue: LocalQueue,
    ) -> None:
        self.token = token
        self.queue = queue  # the local queue whose baton it holds
        self.thread = threading.get_ident()  # the thread whose event loop it belongs to
        self.task = task
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
        self.owner_done: Callable[[asyncio.Task[Any]], None] | None = None

    def is_lost(self) -> bool:
        """Whether the holding has been declared lost (a method, so checkers re-read it)."""
        return self.lost

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


async def keep_alive(
    holding: Holding,
    lease: Lease,
    name: str,
    declare_lost: Callable[[Holding, str], None],
    renewed: Callable[[Holding, BaseException | None], None],
) -> None:
    """Extend ``holding`` every ``span/3`` until cancelled or lost.

    Args:
        holding: the holding to keep alive.
        lease: the lease it holds: ``extend(token, ttl)`` says whether the
            key was still ours.
        name: the lock's name, for log records.
        declare_lost: marks the holding lost with a reason (idempotent).
        renewed: told of each renewal: with None when it reset the lease, with
            the exception when it failed (and will be retried).
    """
    task = asyncio.current_task()
    while not (holding.ended or holding.lost):
        now = time.monotonic()
        if holding.cap_reached(now):
            await _free_at_cap(holding, lease, declare_lost)
            return
        if now >= holding.lease_end:
            declare_lost(holding, "the lease ran out before it could be renewed")
            return
        if holding.capped:  # the lease ends at the cap: nothing more to renew
            wake = min(holding.hold_end, holding.lease_end)
        else:
            wake = min(holding.renewed_at + holding.span / 3, holding.hold_end)
        if wake > now:
            await anyio.sleep(wake - now)
            await honour_cancellation(task, 0)
            continue
        sent = now
        # Both read now: an extend() that ends while this renewal is in flight changes
        # them, and the renewal's late reply must not mix its lease with the extend's.
        ttl = holding.ttl
        asked = holding.asked(ttl, sent)  # never past the cap
        span = lease.counted(asked)  # a grant's first lease is shorter; renewals ask for ttl
        if span <= 0:  # too little left of the cap to count a lease
            await _free_at_cap(holding, lease, declare_lost)
            return
        try:
            with anyio.move_on_after(holding.lease_end - sent):
                ok = await lease.extend(holding.token, asked)
                await honour_cancellation(task, 0)
                if not ok:
                    declare_lost(holding, "the key was gone or held by another holder at renewal")
                    return
                holding.renewed(sent, ttl, span, capped=asked < ttl)
                renewed(holding, None)
                continue
        except Exception as exc:
            # Not only redis-py's errors: uvloop raises a bare RuntimeError on a closed
            # transport. Any failure is retried until the lease end.
            await honour_cancellation(task, 0)
            remaining = holding.lease_end - time.monotonic()
            logger.warning(
                "renewal of lock %r failed (%s: %s); retrying for %.3f s more",
                name,
                type(exc).__name__,
                exc,
                max(remaining, 0.0),
            )
            renewed(holding, exc)
            retry = min(max(holding.span / 10, _RETRY_MIN), _RETRY_MAX, max(remaining, 0.0))
            await anyio.sleep(retry)
            await honour_cancellation(task, 0)
            continue
        # The lease end came while the extend was still in flight.
        declare_lost(holding, "the lease ran out while a renewal was still unanswered")
        return


async def _free_at_cap(
    holding: Holding, lease: Lease, declare_lost: Callable[[Holding, str], None]
) -> None:
    """The holding reached its cap: declare it lost, then free the key for the next holder.

    Declared first, so the holder stops trusting it before anyone else can
    take the lock; the key is then deleted with the holding's token (never
    another holder's), shielded and bounded, and the lock goes on by the
    grant rule. If the server does not answer, the lease (which ends at the
    cap) expires the key.
    """
    declare_lost(holding, holding.cap_reason())
    await lease.undo(holding.token)
