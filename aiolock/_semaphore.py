"""Semaphore: at most ``limit`` holders at once, across every process.

A semaphore is the lock's engine (:class:`~aiolock._holding.LeaseLock`)
over a lease of its own, :class:`SemaphoreLease`: each permit is a holding
with its own token and lease, renewed, lost, released and undone exactly
as an ``AsyncLock`` holding. On the server the key is a sorted set of the
permits' tokens, scored with when each lease ends (the scripts in
:mod:`aiolock._scripts`); waiters queue as the lock's do (docs/server-queue.md),
and a release grants the freed permit to the first live one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Never, final

from redis.asyncio import Redis

from . import backoff as _backoff
from ._checks import check_bool, check_client, check_refused, check_ttl
from ._keys import DEFAULT_PREFIX, keys_for
from ._leaselock import LeaseLock
from ._options import Options
from ._scripts import (
    SEMAPHORE_ACQUIRE,
    SEMAPHORE_EXTEND,
    SEMAPHORE_EXTEND_MANY,
    SEMAPHORE_HANDOVER,
    SEMAPHORE_LEAVE,
    SEMAPHORE_RELEASE,
    SEMAPHORE_STATE,
)
from ._server_lease import ServerLease
from ._timers import Cutoff

if TYPE_CHECKING:
    from ._keys import Keys
    from ._lease import Call, Reply
    from ._types import Client

__all__ = ["Semaphore", "SemaphoreLease"]


class SemaphoreLease(ServerLease):
    """The lease of one permit of a semaphore on one server (or cluster slot).

    The lock's lease with the semaphore's scripts; the first attempt is
    always the script. With several permits every acquisition has a local
    queue of its own (each waiting task stands in the server's queue itself,
    as with ``fair=True``): tasks of one process may hold several permits at
    once. A semaphore of one permit (unless ``fair``) is a lock: its tasks
    of one client wait in one local FIFO, only the first stands in the
    server's queue, and a release hands the permit straight to the next of
    them (:data:`~aiolock._scripts.SEMAPHORE_HANDOVER`), as ``AsyncLock`` does.
    """

    __slots__ = ("limit", "shared")

    _ACQUIRE = SEMAPHORE_ACQUIRE
    _RELEASE = SEMAPHORE_RELEASE
    _LEAVE = SEMAPHORE_LEAVE
    _EXTEND = SEMAPHORE_EXTEND
    _EXTEND_MANY = SEMAPHORE_EXTEND_MANY

    def __init__(
        self,
        client: Client,
        name: str,
        keys: Keys,
        ttl: float,
        limit: int,
        *,
        notify: bool,
        fair: bool = False,
    ) -> None:
        shared = limit == 1 and not fair
        #: How many permits there are.
        self.limit = limit
        super().__init__(client, name, keys, ttl, notify=notify, fair=not shared)
        self.bare_first = False  # a SET NX means nothing on a sorted set
        self.foreign_without_expiry = False  # another library's key is a WRONGTYPE here
        #: The tasks of one client wait in one local queue (one permit, not fair).
        self.shared = shared
        self.gone = "the permit's lease was over, or its token no longer held one"

    def _named(self) -> dict[str, Any]:
        """The values of the names the semaphore's scripts share (the keys, ``sharded``, ...)."""
        keys = self.keys
        return {
            "lock": keys.lock,
            "queue": keys.queue,
            "channel": keys.channel,
            "sharded": self._sharded,
            "limit": str(self.limit),
        }

    def _acquire_named(self) -> dict[str, Any]:
        """The acquire script has no name of its own here."""
        return {}

    async def _state(self, token: str) -> tuple[int, int, bool]:
        keys, args = SEMAPHORE_STATE.call(lock=self.key, limit=str(self.limit), token=token)
        held, left, mine = await self.wire.run(SEMAPHORE_STATE, keys, args)
        return int(held), int(left), bool(int(mine))

    async def remaining(self, call: Call, until: float) -> int | None:
        """Ms until the first permit's lease ends (-2: one is free), None if unknown."""
        try:
            with Cutoff(until, call.task) as cutoff:
                _, left, _ = await self._state("")
        except Exception:
            return None
        return None if cutoff.expired else left

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Give the permit straight to a local waiter of a semaphore of one permit.

        None (the caller releases and the waiter contends) if ``heir`` is not
        such a semaphore's (an ``AsyncLock`` on the same name and client).
        """
        if not (isinstance(heir, SemaphoreLease) and heir.shared and self.shared):
            return None
        keys, args = SEMAPHORE_HANDOVER.call(
            lock=self.key,
            queue=self.keys.queue,
            token=token,
            heir=heir_token,
            heir_ms=heir._ms,
            channel=self.keys.channel,
            sharded=self._sharded,
            limit=str(self.limit),
            may_yield="1" if may_yield else "0",
        )
        reply = await self._hand_over_once(SEMAPHORE_HANDOVER, keys, args)
        return (int(reply[0]), int(reply[1]))

    async def held(self) -> bool:
        """Whether every permit is taken now (asks the server)."""
        held, _, _ = await self._state("")
        return held >= self.limit

    async def holds(self, token: str) -> bool:
        """Whether ``token`` holds a permit now (asks the server)."""
        _, _, mine = await self._state(token)
        return mine


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit!r}")
    return limit


@final
class Semaphore(LeaseLock):
    """A distributed semaphore on Redis or Valkey: at most ``limit`` holders at once.

    ``Semaphore(client, "partner-api", limit=4)`` names one; nothing is sent
    to the server until a permit is acquired. Use it as ``async with sem:``
    (waits for a permit, holds it, renews it, gives it back) or with
    :meth:`acquire` / :meth:`release`. Every holder of one name must use the
    same ``limit``: each attempt is counted against the limit its caller gave.

    Args:
        client: a ``redis.asyncio.Redis`` (Sentinel's ``master_for()`` gives
            one) or ``redis.asyncio.RedisCluster``.
        name: the semaphore's name; the key is ``<prefix>{<name>}``, as for
            :class:`~aiolock.AsyncLock`. A name in use by another kind of
            primitive raises :class:`~aiolock.LockError`.
        limit: how many permits there are: an ``int`` of at least 1.
        ttl: the lease of each permit in seconds: how long the server keeps
            it if its holder dies. Renewal keeps it while the holder lives.
        timeout: how long :meth:`acquire` waits, in seconds; ``None`` waits
            forever, ``0`` tries once.
        blocking: ``False`` makes :meth:`acquire` try once by default.
        backoff: the policy for the pause between attempts of a waiter that
            polls (see :mod:`aiolock.backoff`), or a callable ``attempt -> seconds``.
        auto_renew: extend each permit's lease every ``ttl/3`` while held.
        notify: wake waiters by messages, not only by backoff.
        on_lost: called with the semaphore when a permit is lost while held;
            may be a coroutine function.
        cancel_on_lost: cancel the body of ``async with`` at once when its
            permit is lost (``LockLostError`` is raised in its place).
        max_hold: the longest one holding may last, in seconds, renewal or
            not (``None``: no cap; at least ``ttl``). Renewal and
            ``extend()`` never carry the lease past it; when it runs out the
            holding is lost (reported as any loss) and the key is freed
            for the next holder.
        prefix: the key prefix.
        identity: how others see each holding and each waiting call of this
            semaphore (:func:`aiolock.inspect`, ``aiolock status``): a ``str``
            of at most 256 printable characters. Default: the acquiring
            task's ``host:pid:task-name``.
        fair: serve every ``acquire()`` strictly in call order across every
            task of every process even with one permit (with several, every
            waiting task always has an entry of its own on the server).

    ``reentrant``, ``fencing`` and the replica options are refused with a
    ``TypeError`` that names them.

    **Ownership.** Each :meth:`acquire` takes one permit for the calling
    task, with a token and a lease of its own; several tasks may hold
    permits of one object at once, and a task that holds one and acquires
    again raises :class:`~aiolock.LockError`. The server only ever extends
    or removes a permit holding the caller's token.

    **Fairness.** Waiters are served in the order they reached the
    semaphore's queue on the server, and a freed permit goes straight to the
    first live one. With one permit (unless ``fair=True``) the tasks of one
    process that wait through one client take turns as for an ``AsyncLock``.

    **Cancellation.** As for ``AsyncLock``: cancelling :meth:`acquire` at
    any ``await`` leaves no permit and no queue entry behind, and a
    cancelled :meth:`release` still completes, within ``min(ttl, 1)``
    seconds of cleanup.

    **Expiry.** The server counts a permit as held until ``ttl`` after its
    last acquisition or renewal, by its own clock, and the holder declares
    it lost no later than that; a dead holder's permit comes back when its
    lease ends.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments (``limit``
    among them); :class:`AcquireTimeout` from ``async with`` when no permit
    came in time; :class:`LockNotOwnedError` from :meth:`release` and
    :meth:`extend` when the caller holds no permit, :class:`LockLostError`
    when it was lost while held; :class:`LockError` when the name is in use
    by another kind of primitive; redis-py's own exceptions, unchanged,
    after the cleanup. In full, on the semantics page:
    :section:`semantics#semaphore`.
    """

    __slots__ = ()

    def __init__(
        self,
        client: Client,
        name: str,
        limit: int,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        blocking: bool = True,
        backoff: _backoff.Backoff | Callable[[int], float] | None = None,
        auto_renew: bool = True,
        notify: bool = True,
        on_lost: Callable[[Semaphore], object] | None = None,
        cancel_on_lost: bool = False,
        max_hold: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        identity: str | None = None,
        fair: bool = False,
        **refused: Never,
    ) -> None:
        check_refused("Semaphore", refused)
        if client.__class__ is not Redis:
            client = check_client(client)
        limit = _check_limit(limit)
        ttl = check_ttl(ttl)
        check_bool("notify", notify)
        check_bool("fair", fair)
        lease = SemaphoreLease(
            client, name, keys_for(name, prefix, "semaphore"), ttl, limit, notify=notify, fair=fair
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
                reentrant=False,
                max_hold=max_hold,
                identity=identity,
            ),
        )

    @property
    def limit(self) -> int:
        """How many permits there are (the ``limit`` given)."""
        lease = self._lease
        assert isinstance(lease, SemaphoreLease)  # noqa: S101 - made in __init__
        return lease.limit

    def __repr__(self) -> str:
        held = len(self._by_task)
        return (
            f"<Semaphore {self._name!r} key={self.key!r} limit={self.limit} ttl={self._ttl} "
            f"held here={held}>"
        )
