"""What tests watch locks with: key names, critical sections, events, losses, messages."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as redis

from aiolock import LockEvent
from aiolock._keys import DEFAULT_PREFIX, Keys
from aiolock.testing import FaultProxy
from support.servers import wait_for_key
from support.timing import finish

__all__ = [
    "CALLBACK_KINDS",
    "CriticalSection",
    "LossRecorder",
    "all_keys",
    "cancel_once_the_key_exists",
    "holds_on_server",
    "keys_of",
    "kinds",
    "names",
    "names_value",
    "the_miss",
]


def all_keys(name: str) -> str:
    """A ``KEYS`` pattern for every key of lock ``name`` (any prefix, any companion)."""
    return f"*{Keys(name, prefix='').lock}*"


def keys_of(lock: Any, prefix: str = DEFAULT_PREFIX) -> Keys:
    """The key names of ``lock`` (made with ``prefix``), checked against its own ``key``."""
    kind = {"Semaphore": "semaphore", "RWSide": "rw"}.get(type(lock).__name__, "lock")
    # (A MultiLock's key is its first name's.)
    name = lock.names[0] if type(lock).__name__ == "MultiLock" else lock.name
    keys = Keys(name, prefix, kind=kind)
    assert keys.lock == lock.key, (keys, lock.key)
    return keys


async def holds_on_server(lock: Any) -> bool:
    """Whether the object's current holding (whichever task acquired it) is the server's.

    ``owned()`` answers for the calling task only; a test that let another
    task acquire (a task that may have ended since, leaving the holding to
    be released by anyone) asks the server about that holding's token here.
    """
    holding = lock._current
    if holding is None or holding.ended or holding.lost:
        return False
    return bool(await lock._lease.holds(holding.token))


class CriticalSection:
    """Counts the holders in a critical section: ``overlaps`` counts entries that found company."""

    def __init__(self) -> None:
        self.inside = 0
        self.overlaps = 0
        self.holdings = 0

    async def stay(self, seconds: float = 0.001) -> None:
        """Be inside for ``seconds`` (call it while holding the lock)."""
        self.inside += 1
        self.overlaps += self.inside != 1
        self.holdings += 1
        await asyncio.sleep(seconds)
        self.inside -= 1


def kinds(events: list[LockEvent], name: str) -> list[str]:
    """The kinds of the events of lock ``name``, in order."""
    return [e.kind for e in events if e.name == name]


def the_miss(events: list[LockEvent], lock: object) -> LockEvent:
    """The one event of ``lock``, which must be a 'not_acquired'."""
    mine = [e for e in events if e.lock is lock]
    assert [e.kind for e in mine] == ["not_acquired"]
    return mine[0]


class LossRecorder:
    """An ``on_lost`` callback (plain or async) that records which lock lost, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, float]] = []
        self.event = asyncio.Event()

    @property
    def locks(self) -> list[Any]:
        """The locks the callback was called with, in order."""
        return [who for who, _ in self.calls]

    def function(self, lock: Any) -> None:
        """The plain-function form of the callback."""
        self.calls.append((lock, time.monotonic()))
        self.event.set()

    async def coroutine_function(self, lock: Any) -> None:
        """The coroutine-function form: it must be run to the end, not dropped."""
        at = time.monotonic()
        await asyncio.sleep(0)
        self.calls.append((lock, at))
        self.event.set()

    def callback(self, kind: str) -> Callable[[Any], object]:
        """The callback of ``kind``: ``"function"`` or ``"coroutine_function"``."""
        return self.function if kind == "function" else self.coroutine_function

    async def wait(self, timeout: float = 2.0) -> float:
        """Wait for the callback; return when it ran."""
        await asyncio.wait_for(self.event.wait(), timeout)
        return float(self.calls[0][1])


#: The kinds of ``on_lost`` callbacks a lock accepts (see :meth:`LossRecorder.callback`).
CALLBACK_KINDS = ["function", "coroutine_function"]


async def cancel_once_the_key_exists(
    proxies: list[FaultProxy], admins: list[redis.Redis], key: str, acquire: Awaitable[Any]
) -> None:
    """Hold replies, run ``acquire`` until every server has the key, cancel it.

    The caller has used the proxied clients once, so their pools have a
    connection (which the proxies then hold) and the servers know the scripts.
    """
    assert all(p.connections > 0 for p in proxies)
    for p in proxies:
        p.hold_replies()
    task = asyncio.ensure_future(acquire)
    try:
        for a in admins:
            await wait_for_key(a, key)
        assert not task.done(), "the reply was not held back"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        for p in proxies:
            p.release_replies()
        await finish(task)


def names(arg: str, shown: str) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``shown`` as a whole token."""
    return (
        rf"(?s)(?=.*\b{re.escape(arg)}\b)"
        rf"(?=.*(?<![\w.]){re.escape(shown)}(?![\w.]))"
    )


def names_value(arg: str, value: object) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``repr(value)``."""
    return names(arg, repr(value))
