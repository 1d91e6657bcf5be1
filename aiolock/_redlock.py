"""Redlock: one lock over several independent Redis masters (docs/design.md, Beyond one server).

How the quorum is counted is :mod:`aiolock._quorum`; everything else
(ownership per task, renewal, loss, cancellation) is the engine every lock
shares (:mod:`aiolock._holding`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, final

from redis.asyncio import Redis, RedisCluster

from . import backoff as _backoff
from ._checks import check_seconds
from ._keys import DEFAULT_PREFIX, Keys
from ._leaselock import LeaseLock
from ._options import Options
from ._quorum import QuorumLease, address, check_lease
from ._server_lease import ServerLease
from ._types import is_cluster

__all__ = ["Redlock"]

#: The default per-node limit is ``min(_NODE_TIMEOUT, ttl / 10)``. The specification
#: suggests 5-50 ms for a 10 s lease; the limit also has to absorb the event loop's
#: own lag (a busy asyncio process answers its sockets late), hence 100 ms.
_NODE_TIMEOUT: Final = 0.1


def _check_clients(clients: object) -> tuple[Redis, ...]:
    if isinstance(clients, (Redis, RedisCluster)):
        raise TypeError(
            "clients must be a sequence of redis.asyncio.Redis clients, got a single client "
            f"{clients!r} (use AsyncLock for one server, or pass [client])"
        )
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Iterable):
        raise TypeError(
            f"clients must be a sequence of redis.asyncio.Redis clients, got {clients!r}"
        )
    nodes = tuple(clients)
    if not nodes:
        raise ValueError("clients must hold at least one redis.asyncio.Redis client, got none")
    seen: dict[int, int] = {}
    addresses: dict[tuple[object, ...], int] = {}
    for index, client in enumerate(nodes):
        if not isinstance(client, Redis):
            kind = f"{type(client).__module__}.{type(client).__qualname__}"
            hint = ""
            if is_cluster(client):
                hint = " (Redlock's nodes are independent masters, not a cluster)"
            elif kind.startswith("redis.") and not kind.startswith("redis.asyncio"):
                hint = " (a synchronous client: use redis.asyncio.Redis instead)"
            raise TypeError(f"clients[{index}] must be a redis.asyncio.Redis, got {kind}{hint}")
        first = seen.setdefault(id(client), index)
        if first != index:
            raise ValueError(
                f"clients[{index}] is the same client object as clients[{first}]: "
                "each node of a Redlock must be a different server"
            )
        kwargs = client.connection_pool.connection_kwargs
        if kwargs.get("host") or kwargs.get("path"):
            where = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db"))
            first = addresses.setdefault(where, index)
            if first != index:
                raise ValueError(
                    f"clients[{index}] talks to the same server as clients[{first}] "
                    f"({address(client)}): each node of a Redlock must be a different server"
                )
    return nodes


@final
class Redlock(LeaseLock):
    """A distributed lock over several independent Redis or Valkey masters (Redlock).

    ``Redlock([a, b, c], "orders:42")`` names a lock held on a majority of the
    masters behind the clients ``a``, ``b`` and ``c``; nothing is sent until
    it is acquired. It has the methods and the ``async with`` behaviour of
    :class:`~aiolock.AsyncLock`.

    The guarantee: while the holder's lease lasts (measured on its own
    monotonic clock, from before it sent the ``SET``, minus the drift
    allowance), no other holder can get a majority of the nodes, provided
    the nodes' clocks run at most 1% fast and no node forgets a key it holds
    (a node restarted without persistence should stay down for a lease
    first). Acquiring needs ``N // 2 + 1`` nodes up and answering: 5 nodes
    tolerate 2 failures, 3 nodes 1; an even ``N = 2k`` tolerates only
    ``k - 1``, no more than ``2k - 1`` nodes do.

    What it does *not* protect against: the holder's process pausing (a GC
    pause, a stopped VM, a blocked event loop) or the network delaying its
    writes past the lease, and a node's clock jumping forward (an operator, a
    misconfigured NTP). Then two holders may both act as if they held the
    lock. Only fencing makes the protected resource safe against that: the
    resource rejects writes that carry an older number than one it has
    already seen. Redlock has no single counter to draw such numbers from;
    ``AsyncLock(fencing=True)`` offers them on one server.

    Args:
        clients: the nodes, one ``redis.asyncio.Redis`` per independent master
            (at least one; no client object or server address twice).
        name: the lock's name; the key on every node is ``<prefix>{<name>}``.
        ttl: the lease in seconds (at least 0.01 and above ``node_timeout``):
            how long the nodes keep the lock if the holder dies.
        timeout: how long :meth:`acquire` waits, in seconds; ``None`` waits
            forever, ``0`` tries once.
        blocking: ``False`` makes :meth:`acquire` try once by default.
        backoff: the policy for the pause between attempts (see
            :mod:`aiolock.backoff`), or a callable ``attempt -> seconds``.
            The default, exponential with full jitter, is the random retry
            delay the specification asks for, so that contenders that
            split the nodes between them do not keep doing so.
        auto_renew: renew the lease by quorum every third of it while held.
        on_lost: a callable (or coroutine function) given the lock when it
            is lost while held.
        cancel_on_lost: on a loss, cancel the body of ``async with`` at once
            and raise ``LockLostError`` in its place.
        reentrant: count re-acquisitions by the holding task instead of
            refusing them (each needs its own release).
        max_hold: the longest one holding may last, in seconds, renewal or
            not (``None``: no cap; at least ``ttl``). Renewal and
            ``extend()`` never carry the lease past it; when it runs out the
            holding is lost (reported as any loss) and the key is freed
            for the next holder.
        prefix: the key prefix, the same on every node.
        identity: how others see each holding and each waiting call of this
            lock (:func:`aiolock.inspect`, ``aiolock status``): a ``str``
            of at most 256 printable characters. Default: the acquiring
            task's ``host:pid:task-name``.
        node_timeout: the limit in seconds of every node call (acquire,
            extend, release, queries, cleanup), below ``ttl``; by default
            ``min(0.1, ttl / 10)``. A node that does not answer in time
            counts as failed for that step. Keep it small against ``ttl``:
            an attempt waits for every node (up to this long), and what it
            takes is subtracted from the lease. Keep it above the event
            loop's usual lag too: a reply read late counts as late.

    **Ownership.** As for ``AsyncLock``: a holding belongs to the task that
    acquired it (another task waits; the owner acquiring again raises
    :class:`~aiolock.LockError` unless ``reentrant=True``), and a node only
    ever deletes or extends a key holding that acquisition's own token.

    **Fairness.** Tasks waiting on the same object are served first come,
    first served; between objects and processes there is no order and no
    release notification: waiters retry after a jittered pause, and the
    first attempt that gets a majority wins.

    **Cancellation.** Cancelling :meth:`acquire` at any ``await`` deletes
    its token from every node before the cancellation propagates, within
    about twice ``node_timeout``; a node that does not answer by then keeps
    the key until its lease ends. A cancelled :meth:`release` still
    completes.

    **Expiry.** A node deletes the key ``ttl`` seconds after the last
    acquisition or renewal it saw; the holder counts its lease from when it
    sent the commands, minus the drift allowance, so it declares the lock
    lost no later than a majority can expire it. Renewal keeps the lock
    while a majority extends it in time.

    **Raises.** As ``AsyncLock``: ``TypeError``/``ValueError`` for bad
    arguments, :class:`~aiolock.AcquireTimeout`,
    :class:`~aiolock.LockNotOwnedError` and :class:`~aiolock.LockLostError`.
    An error of one node is a failure of that node only; redis-py's own
    exception propagates when the nodes' errors leave a call without a
    verdict, after the cleanup. In full, on the semantics page:
    :section:`semantics#redlock`.
    """

    __slots__ = ("_clients", "_node_timeout", "_quorum")

    def __init__(
        self,
        clients: Iterable[Redis],
        name: str,
        *,
        ttl: float = 10.0,
        node_timeout: float | None = None,
        timeout: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        identity: str | None = None,
        blocking: bool = True,
        backoff: _backoff.Backoff | Callable[[int], float] | None = None,
        on_lost: Callable[[Redlock], object] | None = None,
        auto_renew: bool = True,
        reentrant: bool = False,
        cancel_on_lost: bool = False,
        max_hold: float | None = None,
    ) -> None:
        self._clients = _check_clients(clients)
        keys = Keys(name, prefix, tagged=False)  # independent servers: no slots to share
        ttl = check_lease(ttl, None)
        if node_timeout is None:
            self._node_timeout = min(_NODE_TIMEOUT, ttl / 10)
        else:
            limit = check_seconds("node_timeout", node_timeout)
            assert limit is not None  # noqa: S101 - allow_none is False
            # Below ttl, which check_lease bounded by MAX_SECONDS, hence bounded too (it
            # never reaches a server anyway: it limits each call to a node, here).
            if not 0 < limit < ttl:
                raise ValueError(
                    "node_timeout must be a finite number of seconds > 0 and below "
                    f"ttl ({ttl!r}), got {node_timeout!r}"
                )
            self._node_timeout = limit
        # Each node is a one-server lease without notifications (nobody would listen).
        nodes = [ServerLease(c, name, keys, ttl, notify=False) for c in self._clients]
        lease = QuorumLease(nodes, name, self._node_timeout)
        self._quorum = lease.quorum
        super().__init__(
            lease,
            Options.of(
                ttl=ttl,
                timeout=timeout,
                blocking=blocking,
                backoff=backoff,
                auto_renew=auto_renew,
                on_lost=on_lost,
                cancel_on_lost=cancel_on_lost,
                reentrant=reentrant,
                max_hold=max_hold,
                identity=identity,
            ),
        )

    def __repr__(self) -> str:
        state = "held" if self._current is not None else "free"
        return (
            f"<Redlock {self._name!r} key={self.key!r} nodes={len(self._clients)} "
            f"ttl={self._ttl} {state}>"
        )

    @property
    def node_timeout(self) -> float:
        """The limit in seconds of every call to one node."""
        return self._node_timeout

    @property
    def quorum(self) -> int:
        """How many nodes must agree: a majority, ``len(clients) // 2 + 1``."""
        return self._quorum
