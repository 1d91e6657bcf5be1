"""AsyncLock: the distributed lock on one Redis or Valkey server (or cluster)."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from redis.asyncio import Redis, RedisCluster

from . import backoff as _backoff
from ._checks import check_bool, check_client, check_ttl
from ._keys import DEFAULT_PREFIX
from ._leaselock import LeaseLock, LockStatistics
from ._options import Options
from ._server_lease import server_lease
from ._types import Client

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

    **Ownership.** A holding belongs to the task that acquired it. Another
    task using the same object waits for it; the owner re-acquiring raises
    :class:`LockError` unless ``reentrant=True``. :meth:`owned`,
    :meth:`extend` and :meth:`release` act for the holder, the tasks it
    starts (they inherit its context), and, once the acquiring task has
    ended, any task: such a *detached* holding stays held and renewed until
    it is released (``asyncio.wait_for`` and ``gather`` run ``acquire()`` in
    a task of their own; a request may hand its lock to a background job).
    In any other task ``owned()`` is False and ``extend()`` raises
    :class:`LockNotOwnedError` without touching the holder's lease; as with
    ``asyncio.Lock``, :meth:`release` may be called from another task (a
    hand-off). A lock object dropped while it holds gives a
    ``ResourceWarning``, and its key expires with its lease. Each
    acquisition gets a fresh 128-bit token, and the server only ever deletes
    or extends a key holding that token.

    **Fairness.** Waiters on different client objects (processes) are
    served in the order they reached the lock's queue on the server: a
    release hands the lock straight to the first live waiter in it, which
    learns of it by a message (about one round trip). Tasks of one process
    waiting through one client object are served first come, first served,
    and only the first of them stands in the server's queue; a release hands
    the lock to the next of them, and once such a run has lasted 0.1 s, to
    the server's queue instead if anyone waits there. A lock that was not
    released (its holder died and its lease ran out) goes to whoever asks
    first; a queued waiter asks as the lease ends. With ``fair=True`` the
    order is strict across every task of every process.

    **Cancellation.** Cancelling :meth:`acquire` at any ``await`` leaves no
    key behind: an attempt that may have reached the server is undone with
    the same token before the cancellation propagates. A cancelled
    :meth:`release` still completes. ``asyncio.timeout``, anyio cancel
    scopes, task groups and ``Task.cancel()`` are all covered. Cleanup on
    these paths is bounded (at most ``min(ttl, 1)`` seconds); if the server
    does not answer by then, the lease expires the key.

    **Expiry.** The server deletes the key ``ttl`` seconds after the last
    acquisition or renewal. The holder measures the same lease on its
    monotonic clock from when the command was sent, so it declares the lock
    lost (:attr:`lost`, ``on_lost``, ``LockLostError`` on exit) no later than
    the server can expire it. A failover to a replica that had not yet
    received the key loses the lock without notice; fencing tokens let the
    protected resource reject such stale holders.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments, naming the
    argument. :class:`AcquireTimeout` from ``async with`` when the lock was
    not acquired in time. :class:`LockNotOwnedError` from :meth:`release`
    and :meth:`extend` when the holding is not ours; :class:`LockLostError`
    (a subclass) when it was lost while held. redis-py's own exceptions
    propagate unchanged, after the cleanup above.
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
            if replicas and isinstance(client, RedisCluster):
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
            ),
        )

    def __repr__(self) -> str:
        state = "held" if self._current is not None else "free"
        return f"<AsyncLock {self._name!r} key={self.key!r} ttl={self._ttl} {state}>"
