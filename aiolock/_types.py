"""Types shared by the modules: the clients aiolock locks through, and what a primitive is."""

from __future__ import annotations

from typing import Protocol, TypeAlias

from redis.asyncio import Redis, RedisCluster

__all__ = ["Client", "Primitive"]

#: A client aiolock can lock through: ``redis.asyncio.Redis`` (Sentinel's
#: ``master_for()`` returns one) or ``redis.asyncio.RedisCluster``.
Client: TypeAlias = "Redis | RedisCluster"


class Primitive(Protocol):
    """What every primitive (a lock, a quorum lock, ...) shows to the layers below it.

    Observers see primitives through this (:attr:`aiolock.LockEvent.lock`),
    and nothing below the primitives names a primitive class.
    """

    @property
    def name(self) -> str:
        """The primitive's name, as given."""
        ...

    @property
    def key(self) -> str:
        """Its key on the server(s)."""
        ...
