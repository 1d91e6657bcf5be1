"""The event loops the suite runs on, and running a coroutine on a fresh one."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["LOOPS", "run_on"]


#: The event loops the suite runs on, by name: asyncio's default, and uvloop where it exists.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
if sys.platform != "win32":  # uvloop is a dev dependency wherever it exists
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop


def run_on(
    factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]
) -> None:
    """Run ``main`` to completion on a fresh loop from ``factory``, then close the loop.

    Like ``asyncio.run``: tasks still running at the end (a notification
    listener in its linger) are cancelled before the loop closes.
    """
    loop = factory()
    try:
        loop.run_until_complete(main)
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
