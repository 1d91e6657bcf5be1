"""Waiting inside one process: a FIFO queue per client and key.

The coroutines of one process that want the same key through the same client
object line up here, first come first served. Only the task at the head of
the queue ("the baton holder") talks to Redis: it contends on the server
while someone elsewhere holds the lock, keeps the baton while it holds the
lock itself, and hands it to the next local waiter when it releases, gives
up, or loses the lock. Everyone else waits on a local future, sending no
commands at all. Two client objects have two queues, so they behave like two
processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque
from typing import Any, final

import anyio

from ._exceptions import LockError

__all__ = ["LocalQueue", "existing_queue", "queue_for"]


@final
class LocalQueue:
    """The FIFO of local tasks that want one key through one client."""

    __slots__ = ("__weakref__", "_home", "_key", "_waiters", "holder", "owner")

    def __init__(self, home: dict[str, LocalQueue], key: str) -> None:
        self._home = home
        self._key = key
        self.owner: asyncio.Task[Any] | None = None  # the baton holder
        self.holder: asyncio.Task[Any] | None = None  # the baton holder, once it holds the lock
        self._waiters: deque[tuple[asyncio.Task[Any], asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """How many local tasks wait behind the baton holder."""
        return len(self._waiters)

    async def enter(self, task: asyncio.Task[Any], deadline: float | None, blocking: bool) -> bool:
        """Wait for the baton until ``deadline`` (``time.monotonic()``); True once held.

        Raises:
            LockError: ``task`` already holds the baton (it holds or waits for
                the same key through another lock object: waiting would
                deadlock).
        """
        if self.owner is None and not self._waiters:
            self.owner = task
            return True
        if self.owner is task:
            raise LockError(
                f"this task already holds {self._key!r} through another lock object; "
                "waiting for it again would deadlock"
            )
        if not blocking:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (task, future)
        self._waiters.append(entry)
        try:
            if deadline is None:
                await future
            else:
                with anyio.move_on_after(deadline - time.monotonic()):
                    await future
        except BaseException:
            self._abandon(entry)
            raise
        if future.done() and not future.cancelled():
            return True
        self._abandon(entry)
        return False

    def _abandon(self, entry: tuple[asyncio.Task[Any], asyncio.Future[None]]) -> None:
        """Step out of the queue; pass the baton on if it was handed to us meanwhile."""
        future = entry[1]
        if future.done() and not future.cancelled():
            self.leave()
        else:
            future.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    def leave(self) -> None:
        """Give the baton to the next waiter, or free the queue."""
        self.holder = None
        while self._waiters:
            task, future = self._waiters.popleft()
            if not future.done():
                self.owner = task
                future.set_result(None)
                return
        self.owner = None
        if self._home.get(self._key) is self:
            del self._home[self._key]


_queues: weakref.WeakKeyDictionary[Any, dict[str, LocalQueue]] = weakref.WeakKeyDictionary()


def queue_for(client: object, key: str) -> LocalQueue:
    """Return the local queue of ``key`` on ``client``, making it on first use."""
    try:
        home = _queues[client]
    except KeyError:
        home = _queues[client] = {}
    queue = home.get(key)
    if queue is None:
        queue = home[key] = LocalQueue(home, key)
    return queue


def existing_queue(client: object, key: str) -> LocalQueue | None:
    """Return the local queue of ``key`` on ``client`` if anyone is in it."""
    home = _queues.get(client)
    return None if home is None else home.get(key)
