"""One pass of the renewer over its due holdings, without a server.

A pass takes every holding due now or within its early share of a lease,
and batches their renewals. A holding whose lease was cut to end at its cap
(``max_hold``) has nothing more to renew: the pass must put it back for its
cap and end, even when another holding's renewal brought the pass there
early.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

import pytest

from aiolock._holding import Holding
from aiolock._queue import LocalQueue
from aiolock._renewal import EARLY_SHARE, Renewer


class _Watcher:
    """Stands for the lock object a renewer reports to (only referenced weakly here)."""


@pytest.mark.one_loop
async def test_a_capped_holding_met_early_waits_for_its_cap_and_the_pass_ends() -> None:
    """The pass returns, the holding is due at its cap, and nothing was sent for it."""
    task = asyncio.current_task()
    assert task is not None
    queue = LocalQueue({}, "name", asyncio.get_running_loop())
    lease: Any = object()
    holding = Holding("name", "token", task, 1.0, 1.0, time.monotonic(), None, queue, lease)
    now = time.monotonic()
    cap = now + holding.span * EARLY_SHARE / 2  # within the early share of a pass now
    holding.hold_end = cap
    holding.lease_end = cap
    holding.capped = True
    watcher = _Watcher()
    renewer = Renewer(asyncio.get_running_loop())
    renewer.add(holding, weakref.ref(watcher), cap)  # type: ignore[arg-type]
    try:
        renewer._send(now)  # (before: it met the holding again and again, for ever)
        assert holding.due == cap
        assert holding.entry != -1, "the capped holding left the renewer's heap"
        assert holding.flight is None, "a renewal was sent for a capped holding"
    finally:
        ended = renewer.remove(holding)
        if ended is not None:
            await asyncio.gather(ended, return_exceptions=True)
