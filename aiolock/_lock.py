"""AsyncLock: the distributed lock on one Redis or Valkey server (or cluster)."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from redis.asyncio import Redis

from . import backoff as _backoff
from ._checks import check_bool, check_client, check_ttl
from ._keys import DEFAULT_PREFIX
from ._leaselock import LeaseLock, LockStatistics
from ._options import Options
from ._server_lease import server_lease
from ._types import Client, is_cluster

__all__ = ["AsyncLock", "LockStatistics"]


@final
class AsyncLock(LeaseLock):
    """A distributed lock on Redis or Valkey, for asyncio.

    ``AsyncLock(client, "orders:42")`` names a lock; nothing is sent to the
    server until it is acquired. Use it as ``async with lock:`` (waits,
    holds, renews, releases) or with :meth:`acquire` / :meth:`release`.

    Args:
        client: a ``redis.asyncio.Redis`` (Sentinel's ``master_for()`` gives
            one) or ``redis.asyncio.RedisCluster``.
        name: the lock's name; the key is ``<prefix>{<name>}``. It must not
            start with ``}`` (nor the prefix contain ``{}``): the key's hash
            tag would be empty, and its companion keys in other cluster slots.
        ttl: the lease in seconds: how long the server keeps the lock if the
            holder dies. Renewal keeps it alive while the holder lives. One
            above a day is taken with a ``UserWarning`` (the first in a
            process): most often it is milliseconds meant.
        timeout: how long :meth:`acquire` waits, in seconds; ``None`` waits
            forever, ``0`` tries once.
        blocking: ``False`` makes :meth:`acquire` try once by default.
        backoff: the policy for the pause between attempts (see
            :mod:`aiolock.backoff`), or a callable ``attempt -> seconds``.
        auto_renew: extend the lease every ``ttl/3`` while held.
        max_hold: the longest one holding may last, in seconds, renewal or
            not (``None``: no cap; at least ``ttl``). Renewal and
            :meth:`extend` never carry the lease past it; when it runs out
            the holding is lost (``lost``, ``on_lost``, ``cancel_on_lost``,
            ``LockLostError`` on exit) and the key is freed for the next
            holder, so a holder that hangs keeps the lock ``max_hold`` at most.
        notify: wake waiters by release notifications, not only by backoff.
        on_lost: called with the lock when the lock is lost while held; may
            be a coroutine function.
        cancel_on_lost: cancel the body of ``async with`` at once when the
            lock is lost (``LockLostError`` is raised in its place).
        reentrant: let a task acquire the lock again while it holds it
            (counted; each acquire needs its release).
        prefix: the key prefix.
        identity: how others see each holding and each waiting call of this
            lock (:func:`aiolock.inspect`, ``aiolock status``): a ``str``
            of at most 256 printable characters. Default: the acquiring
            task's ``host:pid:task-name``.
        fencing: number each acquisition with a strictly increasing
            :attr:`fence`, kept in a companion key that is never deleted.
        replicas: how many replicas must acknowledge an acquisition (``WAIT``
            on the connection that took the lock) before it counts; an
            acquisition they do not acknowledge within ``replica_timeout`` is
            released and counts as a failed attempt. ``0`` (the default)
            does not wait. Not available on a ``RedisCluster`` client.
        replica_timeout: how long to wait for that acknowledgement, in
            seconds; defaults to ``min(ttl / 10, 1)``.
        replica_fsync: acknowledgement means written to the replicas'
            append-only files (``WAITAOF 0 replicas timeout``: the replicas
            need ``appendonly yes``), not only received.
        fair: serve every ``acquire()`` strictly in call order, across every
            task of every process: each waiting task gets its own entry in the
            lock's queue on the server, none waits in a local queue, and a
            free lock is not taken ahead of a live waiter in the queue.

    **Ownership.** A holding belongs to the task that acquired it: another
    task waits for it, and the owner acquiring again raises
    :class:`LockError` unless ``reentrant=True``. The server only ever
    deletes or extends the key while it holds the acquisition's own token.

    **Fairness.** Waiters are served in the order they reached the lock's
    queue on the server, and a release hands the lock straight to the first
    live one; the tasks of one process that wait through one client take
    turns among themselves first, and after 0.1 s of such turns the lock
    goes to the server's queue if anyone waits there. With ``fair=True``
    the order is strict across every task of every process.

    **Cancellation.** Cancelling :meth:`acquire` at any ``await`` leaves no
    key and no queue entry behind, and a cancelled :meth:`release` still
    completes; the cleanup waits at most ``min(ttl, 1)`` seconds for the
    server, and after that the lease expires the key.

    **Expiry.** The server deletes the key ``ttl`` seconds after the last
    acquisition or renewal, and the holder, counting the same lease from
    when it sent the command, declares the lock lost no later than that. A
    failover to a replica that had not received the key loses the lock
    without notice.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments;
    :class:`AcquireTimeout` from ``async with`` when the lock was not
    acquired in time; :class:`LockNotOwnedError` from :meth:`release` and
    :meth:`extend` when the holding is not ours, :class:`LockLostError` (a
    subclass) when it was lost while held; redis-py's own exceptions,
    unchanged, after the cleanup. In full, on the semantics page:
    :section:`semantics#ownership`, :section:`semantics#fairness`,
    :section:`semantics#cancellation`, :section:`semantics#expiry-and-renewal`
    and :section:`semantics#exceptions`.
    """

    __slots__ = ()

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        blocking: bool = True,
        backoff: _backoff.Backoff | Callable[[int], float] | None = None,
        auto_renew: bool = True,
        notify: bool = True,
        on_lost: Callable[[AsyncLock], object] | None = None,
        cancel_on_lost: bool = False,
        reentrant: bool = False,
        max_hold: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        identity: str | None = None,
        fencing: bool = False,
        replicas: int = 0,
        replica_timeout: float | None = None,
        replica_fsync: bool = False,
        fair: bool = False,
    ) -> None:
        if client.__class__ is not Redis:
            client = check_client(client)
        ttl = check_ttl(ttl)
        if not (
            notify.__class__ is bool
            and fencing.__class__ is bool
            and replica_fsync.__class__ is bool
            and fair.__class__ is bool
        ):
            check_bool("notify", notify)  # type: ignore[unreachable] # for unannotated callers
            check_bool("fencing", fencing)
            check_bool("replica_fsync", replica_fsync)
            check_bool("fair", fair)
        if replicas.__class__ is not int or replicas or replica_timeout is not None:
            if isinstance(replicas, bool) or not isinstance(replicas, int):
                raise TypeError(f"replicas must be an int, got {replicas!r}")
            if replicas < 0:
                raise ValueError(f"replicas must be >= 0, got {replicas!r}")
            if replicas and is_cluster(client):
                raise ValueError(
                    f"replicas={replicas} is not available with a RedisCluster client "
                    "(WAIT must run on the connection that took the lock)"
                )
            if replica_timeout is not None:
                replica_timeout = check_ttl(replica_timeout, "replica_timeout")
        lease = server_lease(
            client,
            name,
            prefix,
            ttl,
            notify,
            fencing,
            replicas,
            replica_timeout,
            replica_fsync,
            fair,
        )
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
        return f"<AsyncLock {self._name!r} key={self.key!r} ttl={self._ttl} {state}>"
