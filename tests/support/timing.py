"""Time and chance in a test: polling until true, the loop's lateness, ending tasks and processes.

Also the random draw of a randomized test, which ``AIOLOCK_TEST_DRAW`` replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as redis

__all__ = ["Answers", "Lateness", "draw", "eventually", "finish", "pid_gone"]


async def eventually(
    check: Callable[[], object],
    what: str = "the condition",
    timeout: float = 5.0,
    every: float = 0.005,
) -> None:
    """Poll ``check`` (plain or async) until it is true; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if await outcome if inspect.isawaitable(outcome) else outcome:
            return
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)


class Lateness:
    """How late this event loop's timers fire while it runs: the load a test runs under.

    A task ticks every ``tick`` seconds and writes down how late each tick
    woke. On an idle machine the ticks are a fraction of a millisecond late;
    with busy processes beside the suite the loop waits for a core, and every
    step of a chain of awaits (a timer, a reply, a retry) waits as long.
    :meth:`between` sums the lateness of the ticks in a window: what a bound
    on that window adds so that it holds on a loaded machine and still fails
    on an idle one when the library is slow. Use it as ``async with``.
    """

    def __init__(self, tick: float = 0.01) -> None:
        self.tick = tick
        self._ticks: list[tuple[float, float]] = []  # (woke at, how late)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + self.tick
            await asyncio.sleep(self.tick)
            woke = time.monotonic()
            self._ticks.append((woke, max(woke - due, 0.0)))

    async def __aenter__(self) -> Lateness:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def between(self, start: float, end: float) -> float:
        """The lateness of the ticks that woke from ``start`` to ``end`` (monotonic), summed."""
        return sum(late for woke, late in self._ticks if start <= woke <= end + self.tick)

    def most(self) -> float:
        """The lateness of the latest tick (seconds): the longest this loop stood still."""
        return max((late for _, late in self._ticks), default=0.0)


class Answers:
    """How long servers take to answer a ``PING`` while a test runs, as this loop sees it.

    A task pings each server of ``urls`` (on clients of its own) every
    ``tick`` seconds and writes down each round trip: a server starved of a
    core and a loop starved of one both show. Use it as ``async with``;
    :meth:`slowest` is the longest round trip seen.
    """

    def __init__(self, *urls: str, tick: float = 0.01) -> None:
        self.clients = [redis.Redis.from_url(url) for url in urls]
        self.tick = tick
        self.times: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            for client in self.clients:
                sent = time.monotonic()
                await client.ping()
                self.times.append(time.monotonic() - sent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.tick)

    async def __aenter__(self) -> Answers:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Stopped between pings, not cancelled in one: a command cancelled in flight
        # can leave redis-py's connection waiting.
        assert self._task is not None
        self._stop.set()
        await self._task
        for client in self.clients:
            await client.aclose()

    def slowest(self) -> float:
        """The longest round trip seen (seconds); 0 before the first answer."""
        return max(self.times, default=0.0)


async def finish(task: asyncio.Future[Any]) -> None:
    """Cleanup after a failed test: cancel ``task`` if it still runs, and await it."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def pid_gone(pid: int) -> bool:
    """Whether no process (not even a zombie) has the id ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def draw() -> int:
    """A fresh random draw, or the one in ``AIOLOCK_TEST_DRAW`` to replay a failure."""
    given = os.environ.get("AIOLOCK_TEST_DRAW")
    return int(given) if given else random.randrange(2**32)
