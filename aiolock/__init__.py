"""aiolock: an asyncio-native distributed lock on Redis and Valkey.

Quick start::

    import redis.asyncio as redis
    from aiolock import AsyncLock

    client = redis.Redis()
    async with AsyncLock(client, "orders:42", ttl=10.0, timeout=5.0):
        ...  # only one holder at a time, across every process

See :class:`AsyncLock` for the semantics (ownership, fairness, cancellation,
expiry) and :mod:`aiolock.backoff` for the waiting policies.
"""

from . import backoff
from ._exceptions import AcquireTimeout, LockError, LockLostError, LockNotOwnedError
from ._guard import guard
from ._leaselock import LockStatistics
from ._lock import AsyncLock
from ._observe import LockEvent, add_observer, remove_observer
from ._redlock import Redlock
from ._rwlock import ReadWriteLock
from ._semaphore import Semaphore
from ._version import __version__

__all__ = [
    "AcquireTimeout",
    "AsyncLock",
    "LockError",
    "LockEvent",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "ReadWriteLock",
    "Redlock",
    "Semaphore",
    "__version__",
    "add_observer",
    "backoff",
    "guard",
    "remove_observer",
]
