"""Type aliases shared by the modules."""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import Redis, RedisCluster

#: A client aiolock can lock through: ``redis.asyncio.Redis`` (Sentinel's
#: ``master_for()`` returns one) or ``redis.asyncio.RedisCluster``.
Client: TypeAlias = "Redis | RedisCluster"
