"""Cancellation plumbing: shielded cleanup and swallowed cancellations.

asyncio can cancel a coroutine at any ``await``. Two tools keep every path of
a lock correct when that happens:

* :func:`run_shielded` finishes a piece of cleanup (a release, an undo of a
  ``SET`` that may have gone through) even when the caller is being
  cancelled, bounded in time, then lets the cancellation go on.
* :func:`finish` waits for tasks of the caller's (a watchdog, ``on_lost``
  callbacks) to end, even when the caller is being cancelled meanwhile.
* :func:`honour_cancellation` re-raises a cancellation that a lower layer
  swallowed. On CPython 3.11 and older, ``asyncio.wait_for`` (used by
  redis-py when a socket timeout is set) returns the inner result instead of
  raising when the cancellation and the result arrive in the same loop step
  (CPython gh-86296): the task's ``cancelling()`` count went up but no
  ``CancelledError`` was raised. ``Task.cancelling()`` is why aiolock needs
  Python 3.11: without it such a cancellation cannot be told apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


def cancelling(task: asyncio.Task[Any] | None) -> int:
    """Return how many cancellations of ``task`` are pending."""
    return 0 if task is None else task.cancelling()


async def honour_cancellation(task: asyncio.Task[Any] | None, baseline: int) -> None:
    """Raise ``CancelledError`` if ``task`` was cancelled since ``baseline``.

    A cancellation that is still pending is delivered by the ``sleep(0)``
    (so it is not raised twice); one that a lower layer swallowed is raised
    here.
    """
    if cancelling(task) > baseline:
        await asyncio.sleep(0)
        raise asyncio.CancelledError


async def run_shielded(function: Callable[[], Awaitable[T]], bound: float) -> T:
    """Run ``function()`` to completion, or for ``bound`` seconds, whatever cancels us.

    The work runs in a task of its own, so neither ``Task.cancel()``, an
    ``asyncio.timeout`` nor an anyio cancel scope can stop it half way. If
    the caller was cancelled meanwhile, the cancellation is raised once the
    work is done.

    Raises:
        TimeoutError: the work did not finish within ``bound`` seconds.
        asyncio.CancelledError: the caller was cancelled while waiting.
    """

    async def bounded() -> T:
        with anyio.fail_after(bound):
            return await function()

    inner = asyncio.ensure_future(bounded())
    cancelled: asyncio.CancelledError | None = None
    while not inner.done():
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError as exc:
            if inner.cancelled():
                raise
            cancelled = cancelled or exc
        except BaseException:
            if not inner.done():
                raise  # not the work's own outcome: a KeyboardInterrupt, say
            # The work's own error: read from `inner` below.
    if cancelled is not None:
        if not inner.cancelled():
            inner.exception()  # retrieved: the cancellation takes precedence
        raise cancelled
    return inner.result()


async def finish(tasks: list[asyncio.Future[Any]]) -> None:
    """Wait until ``tasks`` have ended, even if cancelled meanwhile; then re-raise that.

    Their own outcomes are retrieved (so none is reported as "never
    retrieved") but not raised.
    """
    interrupted: asyncio.CancelledError | None = None
    while pending := [t for t in tasks if not t.done()]:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            interrupted = interrupted or exc
    for task in tasks:
        if not task.cancelled():
            task.exception()
    if interrupted is not None:
        raise interrupted
