"""Which kind of client a lock goes through: a plain one or a cluster's (no server).

``is_cluster`` answers once per client class and remembers it; the answer
must be ``isinstance``'s for redis-py's classes and for subclasses of them.
"""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from aiolock import _types
from aiolock._types import is_cluster


class _MyRedis(Redis):
    """An application's own client class."""


class _MyCluster(RedisCluster):
    """An application's own cluster client class."""


def test_a_plain_client_is_not_a_cluster_and_a_cluster_client_is() -> None:
    """Each answer is isinstance's, the first time and every time after."""
    clients = [
        Redis(),
        _MyRedis(),
        RedisCluster(host="127.0.0.1", port=1),
        _MyCluster(host="127.0.0.1", port=1),
    ]
    for _ in range(2):  # (the second answer comes from what the first remembered)
        assert [is_cluster(c) for c in clients] == [False, False, True, True]
        assert [is_cluster(c) for c in clients] == [isinstance(c, RedisCluster) for c in clients]
    assert {Redis, _MyRedis, RedisCluster, _MyCluster} <= set(_types._CLUSTER_CLASSES)


def test_anything_else_is_not_a_cluster() -> None:
    """A callable that makes clients, or None, is not a cluster client."""
    assert not is_cluster(None)
    assert not is_cluster(Redis)  # (the class itself, not an instance)
    assert not is_cluster(lambda: Redis())
