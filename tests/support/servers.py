"""Servers and clients: the test server's features, private servers, clients, server states.

The states are what the server reports (``INFO``, ``CLIENT LIST``, ``KEYS``),
read with an admin client that no lock uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as redis

from aiolock.testing import RedisServer, server_version
from support.timing import eventually

__all__ = [
    "FEATURES",
    "Own",
    "assert_absent_and_stays",
    "blocked_client_ids",
    "calls",
    "connected",
    "has",
    "needs",
    "server_release",
    "started_servers",
    "user_without_channels",
    "wait_for_key",
    "wait_for_paused_client",
]


#: Server features some tests need, and the Redis release that brought each (every Valkey
#: has them all: Valkey began as Redis 7.2).
FEATURES = {
    "sharded pub/sub": (7, 0),  # SSUBSCRIBE, SPUBLISH, PUBSUB SHARDNUMSUB
    "WAITAOF": (7, 2),
}


@functools.cache
def server_release() -> tuple[str, tuple[int, int]]:
    """The test server's name (``redis`` or ``valkey``) and its (major, minor) release."""
    name, _, version = server_version().partition(" ")
    major, minor = (int(part) for part in version.split(".")[:2])
    return name, (major, minor)


def has(feature: str) -> bool:
    """Whether the test server has ``feature`` (a key of :data:`FEATURES`)."""
    name, release = server_release()
    return name != "redis" or release >= FEATURES[feature]


def needs(feature: str) -> pytest.MarkDecorator:
    """Skip the test on a server without ``feature`` (``make matrix`` runs older servers)."""
    name, (major, minor) = server_release()
    need = ".".join(map(str, FEATURES[feature]))
    return pytest.mark.skipif(
        not has(feature),
        reason=f"needs {feature} (Redis {need}); the server is {name} {major}.{minor}",
    )


@contextlib.contextmanager
def started_servers(count: int) -> Iterator[list[RedisServer]]:
    """``count`` private servers, all stopped at the end (also if one fails to start)."""
    started: list[RedisServer] = []
    try:
        started.extend(RedisServer().start() for _ in range(count))
        yield started
    finally:
        for srv in started:
            srv.stop()


@contextlib.asynccontextmanager
async def connected(url: str, **options: Any) -> AsyncIterator[redis.Redis]:
    """A ``redis.asyncio`` client of ``url`` (with redis-py ``options``), closed at the end."""
    c = redis.Redis.from_url(url, **options)
    try:
        yield c
    finally:
        await c.aclose()


@contextlib.asynccontextmanager
async def user_without_channels(admins: list[redis.Redis]) -> AsyncIterator[tuple[str, str]]:
    """A user on every server of ``admins`` with every command and key but no channel.

    What new users get on Redis 7+ (``resetchannels``); yields ``(user,
    password)`` and deletes the user at the end.
    """
    user = f"locker-{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    for admin in admins:
        await admin.acl_setuser(
            user,
            enabled=True,
            passwords=[f"+{password}"],
            keys=["~*"],
            categories=["+@all"],
            reset_channels=True,
        )
    try:
        yield user, password
    finally:
        for admin in admins:
            await admin.acl_deluser(user)


@dataclass
class Own:
    """A private server of the test's own (to pause, kill, restart), a lock client, an admin."""

    server: RedisServer
    client: redis.Redis
    admin: redis.Redis


async def calls(admin: redis.Redis, command: str) -> int:
    """How many times the server ran ``command`` since the last CONFIG RESETSTAT."""
    stats = await admin.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


async def blocked_client_ids(admin: redis.Redis) -> set[str]:
    """The ids of the clients the server holds blocked (``CLIENT LIST`` flag ``b``)."""
    return {c["id"] for c in await admin.client_list() if "b" in c["flags"]}


async def wait_for_paused_client(admin: redis.Redis) -> None:
    """Until a client's command is held back by ``CLIENT PAUSE``.

    Measured on valkey 8.1: ``INFO clients`` shows ``blocked_clients: 1`` and
    ``paused_reason: client_pause`` (``CLIENT LIST`` shows the client with flag
    ``b`` and ``cmd=evalsha``). Redis 7.0 has no ``paused_reason``:
    there ``blocked_clients`` alone says it (these tests block on nothing else).
    """

    async def paused_one() -> bool:
        info = await admin.info("clients")
        reason = info.get("paused_reason", "client_pause")
        return int(info["blocked_clients"]) > 0 and reason == "client_pause"

    await eventually(paused_one, "a client blocked by CLIENT PAUSE", timeout=3.0, every=0.002)


async def wait_for_key(admin: redis.Redis, key: str) -> None:
    """Until ``key`` exists on the server."""

    async def exists() -> bool:
        return bool(await admin.exists(key))

    await eventually(exists, f"the key {key!r} to appear", timeout=3.0, every=0.002)


async def assert_absent_and_stays(admin: redis.Redis, key: str) -> None:
    """``key`` does not exist, and still does not a moment later."""
    assert await admin.exists(key) == 0, f"{key!r} was left on the server"
    await asyncio.sleep(0.05)
    assert await admin.exists(key) == 0, f"{key!r} appeared after the cancellation"
