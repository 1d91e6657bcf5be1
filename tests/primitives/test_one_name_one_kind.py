"""One name, one kind: every attempt that meets another kind's key fails at once, every time.

A name serves one kind of primitive. An ``AsyncLock`` on a ``Semaphore``'s
name (or a ``ReadWriteLock``'s, and every other pair) raises
:class:`~aiolock.LockError` naming the kind that holds it, at the first
attempt that sees the key, and so does every later call in the same process,
whether or not the process already listens on the name's channel (a
lock's attempt reads its key with ``GET``, which the other kinds' keys
refuse with ``WRONGTYPE``). The regression: only the first call of a
process raised; every later one waited for its deadline, or for ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as redis

from aiolock import AsyncLock, LockError, ReadWriteLock, Semaphore

#: How soon "at once" is, with room for a loaded machine.
AT_ONCE = 0.5

#: Each kind's holder, made on ``client`` for ``name``: it holds while the others try.
HOLDERS: dict[str, Callable[[redis.Redis, str], Any]] = {
    "Semaphore": lambda c, name: Semaphore(c, name, 2, ttl=5.0),
    "ReadWriteLock": lambda c, name: ReadWriteLock(c, name, ttl=5.0).reader,
    "AsyncLock": lambda c, name: AsyncLock(c, name, ttl=5.0),
}

#: What the error names for a key held by each kind.
NAMED = {
    "Semaphore": "a Semaphore",
    "ReadWriteLock": "a ReadWriteLock",
    "AsyncLock": "an AsyncLock",
}

#: The lock options the regression was seen with.
LOCK_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "fair": {"fair": True},
    "fenced": {"fencing": True},
}


@pytest.mark.parametrize("held_by", ["Semaphore", "ReadWriteLock"])
@pytest.mark.parametrize("options", list(LOCK_OPTIONS))
async def test_a_lock_on_another_kinds_name_fails_at_once_three_times_in_a_row(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    held_by: str,
    options: str,
    no_leaks: None,
) -> None:
    """Three AsyncLocks in turn on a held Semaphore's (ReadWriteLock's) name: each raises at once.

    The first attempt of the process subscribes to the name's channel; the
    second and third find it subscribed already (the case that waited for
    its deadline).
    """
    holder = HOLDERS[held_by](other_client, name)
    async with holder:
        for attempt in range(3):
            lock = AsyncLock(client, name, **LOCK_OPTIONS[options])
            started = time.monotonic()
            with pytest.raises(LockError, match=f"in use by {NAMED[held_by]}"):
                await lock.acquire(timeout=3.0)
            took = time.monotonic() - started
            assert took < AT_ONCE, f"attempt {attempt + 1} took {took:.2f} s"
            assert not await lock.owned()


@pytest.mark.parametrize(
    ("kind", "held_by"),
    [
        ("Semaphore", "AsyncLock"),
        ("Semaphore", "ReadWriteLock"),
        ("ReadWriteLock", "AsyncLock"),
        ("ReadWriteLock", "Semaphore"),
    ],
)
async def test_every_other_pair_fails_at_once_three_times_in_a_row(
    client: redis.Redis,
    other_client: redis.Redis,
    name: str,
    kind: str,
    held_by: str,
    no_leaks: None,
) -> None:
    """A Semaphore or a ReadWriteLock on another kind's held name raises at once, each time."""
    holder = HOLDERS[held_by](other_client, name)
    async with holder:
        for attempt in range(3):
            lock = HOLDERS[kind](client, name)
            started = time.monotonic()
            with pytest.raises(LockError, match=f"in use by {NAMED[held_by]}"):
                await lock.acquire(timeout=3.0)
            took = time.monotonic() - started
            assert took < AT_ONCE, f"attempt {attempt + 1} took {took:.2f} s"
