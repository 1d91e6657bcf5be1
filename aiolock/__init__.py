"""aiolock: an asyncio-native distributed lock on Redis and Valkey.

Quick start::

    import redis.asyncio as redis
    from aiolock import AsyncLock

    client = redis.Redis()
    async with AsyncLock(client, "orders:42", ttl=10.0, timeout=5.0):
        ...  # only one holder at a time, across every process

See :class:`AsyncLock` for the semantics (ownership, fairness, cancellation,
expiry) and :mod:`aiolock.backoff` for the waiting policies.

The public names are imported when first used: ``import aiolock.testing``
(and the pytest plugin every install registers) loads neither redis-py nor
the locks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import backoff
    from ._election import Election, Term
    from ._exceptions import AcquireTimeout, LockError, LockLostError, LockNotOwnedError
    from ._guard import guard
    from ._inspect import HolderInfo, LockInfo, WaiterInfo, inspect
    from ._leaselock import LockStatistics
    from ._lock import AsyncLock
    from ._multilock import MultiLock
    from ._observe import LockEvent, add_observer, remove_observer
    from ._redlock import Redlock
    from ._rwlock import ReadWriteLock
    from ._semaphore import Semaphore

__all__ = [
    "AcquireTimeout",
    "AsyncLock",
    "Election",
    "HolderInfo",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "MultiLock",
    "ReadWriteLock",
    "Redlock",
    "Semaphore",
    "Term",
    "WaiterInfo",
    "__version__",
    "add_observer",
    "backoff",
    "guard",
    "inspect",
    "remove_observer",
]

#: Where each public name lives (``backoff`` is a module of its own).
_HOMES = {
    "AcquireTimeout": "._exceptions",
    "AsyncLock": "._lock",
    "Election": "._election",
    "HolderInfo": "._inspect",
    "LockError": "._exceptions",
    "LockEvent": "._observe",
    "LockInfo": "._inspect",
    "LockLostError": "._exceptions",
    "LockNotOwnedError": "._exceptions",
    "LockStatistics": "._leaselock",
    "MultiLock": "._multilock",
    "ReadWriteLock": "._rwlock",
    "Redlock": "._redlock",
    "Semaphore": "._semaphore",
    "Term": "._election",
    "WaiterInfo": "._inspect",
    "add_observer": "._observe",
    "backoff": ".backoff",
    "guard": "._guard",
    "inspect": "._inspect",
    "remove_observer": "._observe",
}


def __getattr__(name: str) -> Any:
    """Import a public name at its first use, and keep it here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(home, __name__)
    value = module if name == "backoff" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
