"""Types shared by the modules: the clients aiolock locks through, and what a primitive is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

from redis.asyncio import Redis, RedisCluster

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["Client", "Primitive", "is_cluster"]

#: A client aiolock can lock through: ``redis.asyncio.Redis`` (Sentinel's
#: ``master_for()`` returns one) or ``redis.asyncio.RedisCluster``.
Client: TypeAlias = "Redis | RedisCluster"

#: Whether a client class is a cluster client, per class (see :func:`is_cluster`).
_CLUSTER_CLASSES: dict[type, bool] = {}


def is_cluster(client: object) -> TypeIs[RedisCluster]:
    """Whether ``client`` is a ``RedisCluster`` (or a subclass's instance).

    Answered once per class: redis-py's client classes derive from a
    ``typing.Protocol``, whose ``isinstance`` runs Python code at every call.
    """
    kind = client.__class__
    known = _CLUSTER_CLASSES.get(kind)
    if known is None:
        known = _CLUSTER_CLASSES[kind] = isinstance(client, RedisCluster)
    return known


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
