"""Leak checks: tasks left running, listeners that did not stop, connections checked out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as redis

__all__ = [
    "assert_nothing_leaked",
    "connections_made",
    "in_use_connections",
    "is_listener",
    "listeners_gone",
    "other_tasks",
]


def is_listener(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is the release-notification listener of a client.

    Listeners outlive the waits that started them by a short linger, and end
    by themselves; ``no_leaks`` checks that they do.
    """
    return task.get_name().startswith("aiolock-notify")


async def other_tasks() -> set[asyncio.Task[Any]]:
    """The tasks of this loop but the caller and listeners, after letting finished ones go."""
    for _ in range(3):
        await asyncio.sleep(0)
    me = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not me and not is_listener(t)}


async def listeners_gone(timeout: float = 3.0) -> bool:
    """Wait until no release-notification listener task runs; False if one still does."""
    deadline = time.monotonic() + timeout
    while any(is_listener(t) for t in asyncio.all_tasks()):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def in_use_connections(c: redis.Redis) -> int:
    """How many connections of ``c``'s pool are checked out."""
    return len(c.connection_pool._in_use_connections)


async def assert_nothing_leaked(*clients: redis.Redis) -> None:
    """No task besides the caller, no connection checked out on any of ``clients``."""
    assert await other_tasks() == set(), "a task outlived its lock"
    for c in clients:
        assert in_use_connections(c) == 0, "a connection was left checked out"


def connections_made(c: redis.Redis) -> int:
    """How many connections ``c``'s pool has opened and still keeps (idle or in use)."""
    pool = c.connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)
