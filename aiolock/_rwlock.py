"""ReadWriteLock: many readers at once, or one writer; a waiting writer is not starved.

``ReadWriteLock(client, name)`` has two lock objects, :attr:`~ReadWriteLock.reader`
and :attr:`~ReadWriteLock.writer`, each the lock's engine
(:class:`~aiolock._holding.LeaseLock`) over a lease of its own kind,
:class:`RWLease`: every holding, a reader's or the writer's, has its own
token and lease, renewed, lost, released and undone exactly as an
``AsyncLock`` holding. On the server the key is a hash of the holders
(the scripts in :mod:`aiolock._scripts`); readers and writers wait in one
queue in arrival order (docs/server-queue.md), so once a writer waits, the
readers that come after it wait behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal, Never, final

from redis.asyncio import Redis

from . import backoff as _backoff
from ._checks import UNSET, Unset, check_bool, check_client, check_refused, check_ttl
from ._exceptions import LockError
from ._holding import no_task
from ._keys import DEFAULT_PREFIX, Keys, keys_for
from ._leaselock import LeaseLock
from ._options import Options
from ._scripts import (
    RW_ACQUIRE,
    RW_EXTEND,
    RW_EXTEND_MANY,
    RW_INDEX_SUFFIX,
    RW_LEAVE,
    RW_RELEASE,
    RW_STATE,
)
from ._server_lease import ServerLease
from ._timers import Cutoff

if TYPE_CHECKING:
    from ._lease import Call, Reply
    from ._types import Client

__all__ = ["RWLease", "RWSide", "ReadWriteLock"]

#: A holding's kind on the server: a reader's or the writer's.
Kind = Literal["r", "w"]


class RWLease(ServerLease):
    """The lease of a reader's or the writer's holding of a read-write lock on one server.

    The lock's lease with the read-write scripts: every acquisition has a
    local queue of its own (each waiting task stands in the server's queue
    itself), the first attempt is the script, and no release hands the
    lock over locally.
    """

    __slots__ = ("_index", "kind")

    _ACQUIRE = RW_ACQUIRE
    _RELEASE = RW_RELEASE
    _LEAVE = RW_LEAVE
    _EXTEND = RW_EXTEND
    _EXTEND_MANY = RW_EXTEND_MANY

    def __init__(
        self, client: Client, name: str, keys: Keys, ttl: float, kind: Kind, *, notify: bool
    ) -> None:
        #: ``"r"`` for the readers' lease, ``"w"`` for the writer's.
        self.kind = kind
        # The read-write scripts' key ``index``: the index of the holders' ends.
        self._index = keys.lock + RW_INDEX_SUFFIX
        super().__init__(client, name, keys, ttl, notify=notify, fair=True)
        self._letter = kind
        self.gone = "the holding's lease was over, or its token no longer held"
        # An attempt's -1 means no lease end known; another library's key is a WRONGTYPE.
        self.foreign_without_expiry = False

    def _named(self) -> dict[str, Any]:
        """The values of the names the read-write scripts share (the keys, ``sharded``)."""
        keys = self.keys
        return {
            "lock": keys.lock,
            "queue": keys.queue,
            "index": self._index,
            "channel": keys.channel,
            "sharded": self._sharded,
        }

    def _acquire_named(self) -> dict[str, Any]:
        """The acquire script's own name: which side acquires."""
        return {"kind": self.kind}

    async def _state(self, token: str, asking: str = "") -> tuple[int, bool, int, bool]:
        keys, args = RW_STATE.call(lock=self.key, index=self._index, token=token, asking=asking)
        readers, writer, left, mine = await self.wire.run(RW_STATE, keys, args)
        return int(readers), bool(int(writer)), int(left), bool(int(mine))

    async def remaining(self, call: Call, until: float) -> int | None:
        """Ms until the first holder's lease ends, None if unknown.

        -2 when this side would be admitted now (nobody holds; for a reader, no
        writer holds): the waiter then attempts, which grants it, or the waiters
        queued before it that are still alive (a dead one is dropped).
        """
        try:
            with Cutoff(until, call.task) as cutoff:
                _, _, left, _ = await self._state("", self.kind)
        except Exception:
            return None
        return None if cutoff.expired else left

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Never handed over locally (each task queues on the server)."""
        return None

    async def held(self) -> bool:
        """Whether anyone of this kind holds now (asks the server)."""
        readers, writer, _, _ = await self._state("")
        return writer if self.kind == "w" else readers > 0

    async def holds(self, token: str) -> bool:
        """Whether ``token`` holds now (asks the server)."""
        _, _, _, mine = await self._state(token)
        return mine


@final
class RWSide(LeaseLock):
    """The readers' or the writer's side of a :class:`ReadWriteLock` (``rw.reader``, ``rw.writer``).

    A lock object with ``AsyncLock``'s methods and ``async with``:
    :meth:`acquire`, :meth:`release`, :meth:`extend`, :meth:`owned`,
    :meth:`locked` (the reader side: whether any reader holds now; the
    writer side: whether the writer does),
    :attr:`lost`, ``on_lost``, ``cancel_on_lost``. Made by
    :class:`ReadWriteLock`, not directly.
    """

    __slots__ = ("_other", "_rw")

    def __init__(self, rw: ReadWriteLock, lease: RWLease, options: Options) -> None:
        super().__init__(lease, options)
        self._rw = rw
        self._other: RWSide | None = None

    @property
    def kind(self) -> str:
        """``"reader"`` or ``"writer"``."""
        lease = self._lease
        assert isinstance(lease, RWLease)  # noqa: S101 - made in ReadWriteLock
        return "reader" if lease.kind == "r" else "writer"

    @property
    def lock(self) -> ReadWriteLock:
        """The read-write lock this side belongs to."""
        return self._rw

    async def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | Unset | None = UNSET,  # noqa: ASYNC109 - a name of the public contract
    ) -> bool:
        """Acquire this side; see :meth:`AsyncLock.acquire <aiolock.AsyncLock.acquire>`.

        Raises:
            LockError: the calling task holds the other side of this
                ``ReadWriteLock`` object (a reader asking to write, or the
                writer asking to read, would wait for itself), or already
                holds this side.
        """
        other = self._other
        if other is not None and other._by_task:
            task = asyncio.current_task() or no_task()
            if task in other._by_task:
                raise LockError(
                    f"read-write lock {self._name!r}: this task holds its {other.kind} side; "
                    f"acquiring the {self.kind} side too would wait for itself (release the "
                    f"{other.kind} side first)"
                )
        return await super().acquire(blocking, timeout)

    def _what(self) -> str:
        return f"the {self.kind} side of ReadWriteLock"

    def __repr__(self) -> str:
        return (
            f"<ReadWriteLock {self._name!r} {self.kind} key={self.key!r} ttl={self._ttl} "
            f"held here={len(self._by_task)}>"
        )


@final
class ReadWriteLock:
    """A distributed read-write lock on Redis or Valkey: many readers, or one writer.

    ``rw = ReadWriteLock(client, "doc:42")``; then ``async with rw.reader:``
    (shared with other readers) or ``async with rw.writer:`` (alone).
    Nothing is sent to the server until a side is acquired.

    Args:
        client: a ``redis.asyncio.Redis`` (Sentinel's ``master_for()`` gives
            one) or ``redis.asyncio.RedisCluster``.
        name: the lock's name; the key is ``<prefix>{<name>}``, as for
            :class:`~aiolock.AsyncLock`. A name in use by another kind of
            primitive raises :class:`~aiolock.LockError`.
        ttl: the lease of each holding (a reader's or the writer's) in
            seconds: how long the server keeps it if its holder dies.
            Renewal keeps it while the holder lives.
        timeout: how long ``acquire()`` waits, in seconds; ``None`` waits
            forever, ``0`` tries once.
        blocking: ``False`` makes ``acquire()`` try once by default.
        backoff: the policy for the pause between attempts of a waiter that
            polls (see :mod:`aiolock.backoff`), or a callable ``attempt -> seconds``.
        auto_renew: extend each holding's lease every ``ttl/3`` while held.
        notify: wake waiters by messages, not only by backoff.
        on_lost: called with the side (``rw.reader`` or ``rw.writer``) when a
            holding is lost while held; may be a coroutine function.
        cancel_on_lost: cancel the body of ``async with`` at once when its
            holding is lost (``LockLostError`` is raised in its place).
        max_hold: the longest one holding may last, in seconds, renewal or
            not (``None``: no cap; at least ``ttl``). Renewal and
            ``extend()`` never carry the lease past it; when it runs out the
            holding is lost (reported as any loss) and the key is freed
            for the next holder.
        prefix: the key prefix.
        identity: how others see each holding and each waiting call of this
            lock (both sides) (:func:`aiolock.inspect`, ``aiolock status``): a ``str``
            of at most 256 printable characters. Default: the acquiring
            task's ``host:pid:task-name``.
        fair: accepted for symmetry with ``AsyncLock``: waiters are always
            served in arrival order.

    ``reentrant``, ``fencing`` and the replica options are refused with a
    ``TypeError`` that names them.

    **Ownership.** Each ``acquire()`` of a side is a holding of the calling
    task, with a token and a lease of its own; many tasks may hold the
    reader side at once, and a task that holds one side and asks for the
    other raises :class:`~aiolock.LockError` (it would wait for itself).
    The server only ever extends or removes a holding with the caller's
    token.

    **Fairness.** Readers and writers wait in one queue on the server, in
    arrival order, across every task of every process: once a writer waits,
    the readers that come after it wait behind it, so readers cannot starve
    a writer.

    **Cancellation.** As for ``AsyncLock``: cancelling ``acquire()`` at any
    ``await`` leaves no holding and no queue entry behind, and a cancelled
    ``release()`` still completes, within ``min(ttl, 1)`` seconds of
    cleanup.

    **Expiry.** The server counts each holding as held until ``ttl`` after
    its last acquisition or renewal, by its own clock, and the holder
    declares it lost no later than that; a dead reader's lease runs out on
    its own, and the other readers keep theirs.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments;
    :class:`AcquireTimeout` from ``async with`` when the side was not
    acquired in time; :class:`LockNotOwnedError` from ``release()`` and
    ``extend()`` when the caller holds nothing, :class:`LockLostError` when
    the holding was lost while held; :class:`LockError` when the name is in
    use by another kind of primitive, or a task asks for both sides;
    redis-py's own exceptions, unchanged, after the cleanup. In full, on
    the semantics page: :section:`semantics#readwritelock`.
    """

    __slots__ = ("_key", "_name", "_ttl", "reader", "writer")

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
        on_lost: Callable[[RWSide], object] | None = None,
        cancel_on_lost: bool = False,
        max_hold: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        identity: str | None = None,
        fair: bool = False,
        **refused: Never,
    ) -> None:
        check_refused("ReadWriteLock", refused)
        if client.__class__ is not Redis:
            client = check_client(client)
        ttl = check_ttl(ttl)
        check_bool("notify", notify)
        check_bool("fair", fair)
        keys = keys_for(name, prefix, "rw")
        # Checked once, for both sides.
        options = Options.of(
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
        )
        self._name = name
        self._key = keys.lock
        self._ttl = ttl
        #: The readers' side: shared with other readers, never with the writer.
        self.reader: Final[RWSide] = RWSide(
            self, RWLease(client, name, keys, ttl, "r", notify=notify), options
        )
        #: The writer's side: alone, no reader.
        self.writer: Final[RWSide] = RWSide(
            self, RWLease(client, name, keys, ttl, "w", notify=notify), options
        )
        self.reader._other = self.writer
        self.writer._other = self.reader

    def _sides_only(self) -> TypeError:
        return TypeError(
            f"ReadWriteLock {self._name!r} is held through its sides: "
            "'async with rw.reader:' or 'async with rw.writer:'"
        )

    if not TYPE_CHECKING:  # to a type checker, `with rw:` stays an error

        def __enter__(self) -> Never:
            raise self._sides_only()

        def __exit__(self, *exc_info: object) -> None:  # never reached: __enter__ raised
            raise self._sides_only()

        async def __aenter__(self) -> Never:
            raise self._sides_only()

        async def __aexit__(self, *exc_info: object) -> None:  # never reached
            raise self._sides_only()

    @property
    def name(self) -> str:
        """The lock's name, as given."""
        return self._name

    @property
    def key(self) -> str:
        """The lock's key: ``<prefix>{<name>}``."""
        return self._key

    @property
    def ttl(self) -> float:
        """The lease in seconds given to each holding."""
        return self._ttl

    @property
    def identity(self) -> str | None:
        """The identity given to both sides (``identity=``), or None: each holder's default."""
        return self.reader.identity

    async def locked(self) -> bool:
        """Whether anyone holds the lock now, a reader or the writer (asks the server)."""
        lease = self.reader._lease
        assert isinstance(lease, RWLease)  # noqa: S101 - made in __init__
        readers, writer, _, _ = await lease._state("")
        return writer or readers > 0

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self._name!r} key={self._key!r} ttl={self._ttl}>"
