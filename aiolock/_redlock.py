"""Redlock: one lock over several independent Redis masters (DESIGN.md §7).

The algorithm is the one of the Redis documentation's page *Distributed Locks
with Redis*, with the node calls of a step sent to every node at once:

1. Note the monotonic time and draw a fresh 128-bit token.
2. Send ``SET key token NX PX ttl`` to every node, each call cut off after
   ``node_timeout``.
3. The lock is held if a majority (``N // 2 + 1``) of the nodes granted it
   and some validity is left: ``ttl - elapsed - drift > 0``, where
   ``drift = ttl * 0.01 + 0.002`` allows for the nodes' clocks running fast.
4. Otherwise the token is deleted again from every node (a compare-and-delete
   script: only a key that holds this token is touched) and the next attempt
   follows after a jittered pause.

Renewal, release and the queries talk to every node at once as well, each
call bounded by ``node_timeout``. Everything else (ownership per task, loss,
cancellation) behaves as :class:`aiolock.AsyncLock` does, with a quorum in
place of one server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Final, final

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import backoff as _backoff
from ._cancel import cancelling, honour_cancellation
from ._exceptions import LockLostError, LockNotOwnedError
from ._holder import _UNSET, Contention, HoldingLock, _check_seconds, _check_timeout, _Unset
from ._holder import current_task as _current_task
from ._lock import _TRANSPORT, _check_bool
from ._renewal import Holding, keep_alive
from ._scripts import scripts_for
from ._timers import Cutoff, call_at

__all__ = ["Redlock"]

logger = logging.getLogger("aiolock")

#: The clock drift allowance of the Redlock specification: ``ttl * 0.01 + 2 ms``.
_DRIFT_FACTOR: Final = 0.01
_DRIFT_FLOOR: Final = 0.002
#: The smallest lease: the drift allowance alone is 2 ms.
_MIN_TTL: Final = 0.01
#: The default per-node limit is ``min(_NODE_TIMEOUT, ttl / 10)``. The specification
#: suggests 5-50 ms for a 10 s lease; the limit also has to absorb the event loop's
#: own lag (a busy asyncio process answers its sockets late), hence 100 ms.
_NODE_TIMEOUT: Final = 0.1
#: A node call that was cut off and has not ended yet is cancelled again this often
#: (a cancellation swallowed inside redis-py, CPython gh-86296, must not let it run on
#: to redis-py's own socket timeout and retries).
_RECANCEL: Final = 0.05


def _drift(ttl: float) -> float:
    return ttl * _DRIFT_FACTOR + _DRIFT_FLOOR


def _ms(ttl: float) -> int:
    """The lease in whole milliseconds for ``PX``, never shorter than ``ttl`` (1.005 -> 1005)."""
    return math.ceil(round(ttl * 1000, 6))


def _check_lease(value: object, node_timeout: float | None, name: str = "ttl") -> float:
    """Check a Redlock lease: a finite number of seconds >= 0.01, above ``node_timeout``."""
    ttl = _check_seconds(name, value, allow_none=False)
    assert ttl is not None  # noqa: S101 - allow_none=False
    if not math.isfinite(ttl) or ttl < _MIN_TTL:
        raise ValueError(
            f"{name} must be a finite number of seconds >= {_MIN_TTL} (Redlock allows "
            f"{_DRIFT_FLOOR} s of clock drift on top of 1%), got {value!r}"
        )
    if node_timeout is not None and ttl <= node_timeout:
        raise ValueError(
            f"{name} must be longer than node_timeout ({node_timeout!r} s), got {value!r}"
        )
    return ttl


def _address(client: Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


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
            if isinstance(client, RedisCluster):
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
                    f"({_address(client)}): each node of a Redlock must be a different server"
                )
    return nodes


def _text(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value


#: A call to one node: ``command(index, client)``.
_Command = Callable[[int, Redis], Awaitable[object]]


class _NodeLate(RedisTimeoutError):
    """A node did not answer within ``node_timeout`` (redis-py's ``TimeoutError`` to callers)."""


class _AllLate(Exception):
    """Every node of an attempt failed, some only by being late: a slow attempt, not a verdict.

    A node that was late (a busy event loop, say) may well be up; only when
    every node failed with an error of its own is the attempt's error raised
    at once.
    """

    def __init__(self, last: _NodeLate) -> None:
        super().__init__(str(last))
        self.last = last


async def _call(command: _Command, index: int, client: Redis) -> object:
    """Run one node call; an error is returned as a value (a failure of that node)."""
    try:
        with _TRANSPORT:
            return await command(index, client)
    except Exception as exc:
        return exc


async def _finish(tasks: list[asyncio.Future[Any]]) -> None:
    """Wait until ``tasks`` have ended, even if cancelled meanwhile; then re-raise that."""
    interrupted: asyncio.CancelledError | None = None
    while pending := [t for t in tasks if not t.done()]:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


@final
class Redlock(HoldingLock):
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
        auto_renew: extend the lease every ``ttl/3`` while held.
        on_lost: called with the lock when the lock is lost while held; may
            be a coroutine function.
        cancel_on_lost: cancel the body of ``async with`` at once when the
            lock is lost (``LockLostError`` is raised in its place).
        reentrant: let a task acquire the lock again while it holds it
            (counted; each acquire needs its release).
        prefix: the key prefix.
        node_timeout: the limit in seconds of every node call (acquire,
            extend, release, queries, cleanup), below ``ttl``; by default
            ``min(0.1, ttl / 10)``. A node that does not answer in time
            counts as failed for that step. Keep it small against ``ttl``:
            an attempt waits for every node (up to this long), and what it
            takes is subtracted from the lease. Keep it above the event
            loop's usual lag too: a reply read late counts as late.

    **Ownership.** A holding belongs to the task that acquired it. Another
    task using the same object waits for it; the owner re-acquiring raises
    :class:`~aiolock.LockError` unless ``reentrant=True``. As with
    ``asyncio.Lock``, :meth:`release` may be called from another task (a
    hand-off); it ends the object's current holding. Each attempt uses a
    fresh 128-bit token, and a node only ever deletes or extends a key
    holding that token.

    **Fairness.** Tasks waiting on the same object are served first come,
    first served, and only the first of them talks to the nodes. Between
    objects (and processes) there is no order and no release notification:
    a waiter retries after a jittered pause (the ``backoff`` policy), never
    past its timeout, and the first attempt that gets a majority wins.

    **Cancellation.** Cancelling :meth:`acquire` at any ``await`` leaves no
    key behind: the node calls in flight are let finish (each within
    ``node_timeout``), then the token is deleted from every node before the
    cancellation propagates. A cancelled :meth:`release` still completes.
    ``asyncio.timeout``, anyio cancel scopes, task groups and
    ``Task.cancel()`` are all covered. This cleanup waits at most about
    twice ``node_timeout``; a node that does not answer by then (or a paused
    one that runs a ``SET`` still in its socket when it resumes) keeps the
    key until its lease ends.

    **Expiry.** A node deletes the key ``ttl`` seconds after the last
    acquisition or renewal it saw. The holder measures its lease from when it
    sent the commands, minus the drift allowance (``ttl * 0.01 + 0.002``), so
    it declares the lock lost (:attr:`lost`, ``on_lost``, ``LockLostError``
    on exit) no later than a majority of the nodes can expire it. Renewal
    extends the key on every node that still holds the token and keeps the
    lock while a majority does in time; once a majority says the key is not
    ours, or no majority confirmed a renewal before the lease end, the lock
    is lost. If the owning task ends without releasing, renewal stops and the
    keys expire after their lease.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments, naming the
    argument. :class:`~aiolock.AcquireTimeout` from ``async with`` when the
    lock was not acquired in time. :class:`~aiolock.LockNotOwnedError` from
    :meth:`release` and :meth:`extend` when the holding is not ours (nothing
    is held, or a majority of the nodes no longer holds our key);
    :class:`~aiolock.LockLostError` (a subclass) when it was lost while
    held. Errors of single nodes are failures of
    those nodes only; redis-py's own exception propagates when every node
    failed an acquire attempt or a query, or when failed nodes leave a
    release or extend without a verdict (then it is the last node's error,
    or ``redis.exceptions.TimeoutError`` for a node that did not answer in
    time), always after the cleanup above.
    """

    __slots__ = (
        "_auto_renew",
        "_backoff",
        "_blocking",
        "_by_task",
        "_cancel_on_lost",
        "_clients",
        "_current",
        "_gate",
        "_key",
        "_last",
        "_leases",
        "_name",
        "_node_timeout",
        "_on_lost",
        "_prefix",
        "_quorum",
        "_reentrant",
        "_release_args",
        "_scopes",
        "_scripts",
        "_timeout",
        "_ttl",
    )

    def __init__(
        self,
        clients: Iterable[Redis],
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        blocking: bool = True,
        backoff: _backoff.Backoff | Callable[[int], float] | None = None,
        auto_renew: bool = True,
        on_lost: Callable[[Redlock], object] | None = None,
        cancel_on_lost: bool = False,
        reentrant: bool = False,
        prefix: str = "aiolock:",
        node_timeout: float | None = None,
    ) -> None:
        self._clients = _check_clients(clients)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if not name:
            raise ValueError(f"name must not be empty, got {name!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        self._name = name
        self._prefix = prefix
        self._ttl = _check_lease(ttl, None)
        if node_timeout is None:
            self._node_timeout = min(_NODE_TIMEOUT, self._ttl / 10)
        else:
            limit = _check_seconds("node_timeout", node_timeout, allow_none=False)
            assert limit is not None  # noqa: S101 - allow_none=False
            if not math.isfinite(limit) or limit <= 0 or limit >= self._ttl:
                raise ValueError(
                    "node_timeout must be a finite number of seconds > 0 and below "
                    f"ttl ({self._ttl!r}), got {node_timeout!r}"
                )
            self._node_timeout = limit
        self._timeout = _check_timeout(timeout)
        self._blocking = _check_bool("blocking", blocking)
        self._backoff = _backoff._coerce(_backoff.exponential() if backoff is None else backoff)
        self._auto_renew = _check_bool("auto_renew", auto_renew)
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be a callable or None, got {on_lost!r}")
        self._on_lost = on_lost
        self._cancel_on_lost = _check_bool("cancel_on_lost", cancel_on_lost)
        self._reentrant = _check_bool("reentrant", reentrant)

        self._key = f"{prefix}{{{name}}}"
        self._quorum = len(self._clients) // 2 + 1
        # The release script also announces the release on this channel: harmless,
        # since nobody subscribes to a Redlock's channel.
        self._release_args = (f"{self._key}:released", "0")
        self._scripts = tuple(scripts_for(client) for client in self._clients)

        # The local queue: tasks of this object wait here; the head contends.
        self._gate = asyncio.Lock()
        self._by_task: dict[asyncio.Task[Any], Holding] = {}
        self._current: Holding | None = None
        self._last: Holding | None = None
        # The lease each holding asks the nodes for. A Holding's own `ttl` is the
        # lease as the holder counts it (ttl minus the drift allowance), which is
        # what the shared watchdog adds to the time an extend was sent.
        self._leases: dict[Holding, float] = {}
        self._scopes: dict[asyncio.Task[Any], list[anyio.CancelScope | None]] = {}

    def __repr__(self) -> str:
        state = "held" if self._current is not None else "free"
        return (
            f"<Redlock {self._name!r} key={self._key!r} nodes={len(self._clients)} "
            f"ttl={self._ttl} {state}>"
        )

    # -- read-only facts ---------------------------------------------------------------
    @property
    def key(self) -> str:
        """The key of the lock on every node: ``<prefix>{<name>}``."""
        return self._key

    @property
    def node_timeout(self) -> float:
        """The limit in seconds of every call to one node."""
        return self._node_timeout

    @property
    def quorum(self) -> int:
        """How many nodes must agree: a majority, ``len(clients) // 2 + 1``."""
        return self._quorum

    @property
    def lost(self) -> bool:
        """Whether this holder's most recent holding was lost while held.

        Looks at the calling task's holding if it has one, else at the
        object's most recent holding. Reset by the next acquisition. It is
        True as soon as the holder's own clock says the lease is over, even
        before the watchdog has run.
        """
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        holding = self._by_task.get(task) if task is not None else None
        if holding is None:
            holding = self._last
        if holding is None:
            return False
        return holding.lost or (not holding.ended and time.monotonic() >= holding.lease_end)

    # -- node calls --------------------------------------------------------------------

    async def _on_every_node(self, command: _Command, *, patient: bool) -> list[object]:
        """Run ``command(index, client)`` on every node at once, each within ``node_timeout``.

        Returns one outcome per node, in order: the reply, or the exception
        the call raised (a node that did not answer in time gives a
        ``redis.exceptions.TimeoutError``). The calls run in tasks of their
        own, and never outlive this call. If the caller is cancelled
        meanwhile, the calls are let finish when ``patient`` (a ``SET`` or a
        delete, whose outcome matters), else cut off at once; then the
        cancellation is raised.
        """
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(_call(command, index, client))
            for index, client in enumerate(self._clients)
        ]
        deadline = time.monotonic() + self._node_timeout
        interrupted: asyncio.CancelledError | None = None
        while pending := [t for t in tasks if not t.done()]:
            wait = deadline - time.monotonic()
            if wait <= 0:
                for task in pending:
                    task.cancel()
                wait = _RECANCEL
            try:
                # An anyio scope cancels again at every step: `pending` is recomputed.
                await asyncio.wait(pending, timeout=wait)
            except asyncio.CancelledError as exc:
                interrupted = interrupted or exc
                if not patient:
                    deadline = 0.0
        outcomes: list[object] = []
        for index, task in enumerate(tasks):
            if task.cancelled():
                outcomes.append(
                    _NodeLate(
                        f"Redlock node {index} ({_address(self._clients[index])}) did not "
                        f"answer within node_timeout ({self._node_timeout:g} s)"
                    )
                )
            else:
                outcomes.append(task.result())
        if interrupted is not None:
            raise interrupted
        return outcomes

    def _set(self, token: str) -> _Command:
        ms = _ms(self._ttl)
        key = self._key
        return lambda _, client: client.set(key, token, nx=True, px=ms)

    def _delete(self, token: str) -> _Command:
        keys = (self._key,)
        args = (token, *self._release_args)
        return lambda index, _: self._scripts[index].release(keys, args)

    def _pexpire(self, token: str, ttl: float) -> _Command:
        keys = (self._key,)
        args = (token, _ms(ttl))
        return lambda index, _: self._scripts[index].extend(keys, args)

    async def _clear(self, token: str) -> None:
        """Delete ``token``'s key from every node: finishes even if cancelled, bounded."""
        outcomes = await self._on_every_node(self._delete(token), patient=True)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            logger.debug(
                "could not clear an attempt on %r from %d node(s): %r (the lease expires it)",
                self._name,
                len(failed),
                failed[-1],
            )

    # -- acquire -----------------------------------------------------------------------

    async def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | _Unset | None = _UNSET,  # noqa: ASYNC109 - a name of the public contract
    ) -> bool:
        """Acquire the lock on a majority of the nodes; True once held, False if not in time.

        Each attempt sends ``SET NX PX`` with a fresh token to every node at
        once and succeeds if a majority granted it with validity left (see
        the module docs); a failed attempt deletes its token from every node
        before the next one. An attempt already sent when the timeout
        passes is finished (within ``node_timeout``) and cleaned up, so this
        may return up to about twice ``node_timeout`` after the timeout.

        Args:
            blocking: ``False`` tries once and returns at once; defaults to
                the lock's ``blocking``.
            timeout: seconds to wait, overriding the lock's ``timeout``;
                ``None`` waits forever, ``0`` tries once.

        Raises:
            LockError: the calling task already holds this non-reentrant lock.
            LockLostError: the calling task's holding was lost and has not
                been released yet.
            redis.exceptions.RedisError: every node failed an attempt with an
                error (the last node's). Attempts on which some of the failed
                nodes were merely late (past ``node_timeout``) are retried
                while the timeout allows, and without a timeout for one
                ``ttl``; then redis-py's ``TimeoutError`` is raised.
            TypeError: ``blocking`` is not a bool, or ``timeout`` not a number.
            ValueError: ``timeout`` is negative or NaN, or given together
                with ``blocking=False``; or the backoff policy yields a bad delay.
        """
        return await self._acquire(blocking, timeout)

    async def _take(
        self,
        task: asyncio.Task[Any],
        started: float,
        deadline: float | None,
        contention: Contention,
    ) -> Holding | None:
        """Get the lock for ``task``: past the local gate, then on a majority of the nodes."""
        baseline = cancelling(task)
        if self._gate.locked():
            contention.seen = True  # another task of this process holds it or is trying
        if deadline is None:
            await self._gate.acquire()
        else:
            with Cutoff(deadline) as cutoff:
                await self._gate.acquire()
            if cutoff.expired:
                return None
        try:
            holding = await self._contend(task, deadline, baseline, contention)
        except BaseException:
            self._gate.release()
            raise
        if holding is None:
            self._gate.release()
        return holding

    async def _contend(
        self,
        task: asyncio.Task[Any],
        deadline: float | None,
        baseline: int,
        contention: Contention,
    ) -> Holding | None:
        """Attempt until acquired or past the deadline, pausing per the backoff between."""
        delays: Iterator[float] | None = None
        step = 0.0  # the policy's latest delay: repeated once a finite policy runs out
        late_since: float | None = None  # since when every attempt found every node late
        while True:
            token = secrets.token_hex(16)
            try:
                sent = await self._attempt(token, contention)
            except _AllLate as late:
                # Every node missed node_timeout: most often our own loop was busy. Try
                # again while the caller's timeout allows; without one, for one lease.
                now = time.monotonic()
                late_since = now if late_since is None else late_since
                if deadline is None and now - late_since >= self._ttl:
                    raise late.last from None
                sent = None
            else:
                late_since = None
            if sent is not None:
                if cancelling(task) > baseline:  # a cancellation swallowed below us
                    await self._clear(token)
                    await honour_cancellation(task, baseline)
                return self._hold(task, token, sent)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if delays is None:
                delays = self._backoff.delays()
            step = _backoff._check_delay(next(delays, step))
            delay = step if deadline is None else max(0.0, min(step, deadline - now))
            await anyio.sleep(delay)
            await honour_cancellation(task, baseline)

    async def _attempt(self, token: str, contention: Contention) -> float | None:
        """One attempt on every node: the time it was sent if it won, else None.

        A lost attempt, an interrupted one and one that every node failed
        are cleared from every node (a ``SET`` that timed out or failed may
        still have landed) before this returns or raises.

        Raises:
            _AllLate: every node failed, some by missing ``node_timeout``.
            Exception: every node failed with an error; the last node's.
        """
        sent = time.monotonic()
        try:
            outcomes = await self._on_every_node(self._set(token), patient=True)
        except BaseException:
            await self._clear(token)
            raise
        elapsed = time.monotonic() - sent
        granted = sum(1 for o in outcomes if o is True)
        if any(o is None or o is False for o in outcomes):
            contention.seen = True  # a node had another holder's key
        validity = self._ttl - elapsed - _drift(self._ttl)
        if granted >= self._quorum and validity > 0:
            return sent
        await self._clear(token)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if len(failed) == len(outcomes):
            late = [o for o in failed if isinstance(o, _NodeLate)]
            if late:
                raise _AllLate(late[-1])
            raise failed[-1]
        if granted >= self._quorum:
            logger.debug(
                "lock %r: a majority granted it but the attempt took %.3f s of a %.3f s lease",
                self._name,
                elapsed,
                self._ttl,
            )
        return None

    # -- holding -----------------------------------------------------------------------

    def _hold(self, task: asyncio.Task[Any], token: str, sent: float) -> Holding:
        """Record a new holding of ``task`` and start watching its lease."""
        holding = Holding(token, task, self._ttl - _drift(self._ttl), sent, None)
        self._leases[holding] = self._ttl
        self._by_task[task] = holding
        self._current = holding
        self._last = holding
        if self._auto_renew:
            holding.timer = call_at(sent + holding.ttl / 3, self._start_renewal, holding)
        else:
            holding.timer = call_at(holding.lease_end, self._lease_over, holding)
        holding.owner_done = self._task_done
        task.add_done_callback(self._task_done)
        logger.debug("acquired lock %r on a majority of %d nodes", self._name, len(self._clients))
        return holding

    def _start_renewal(self, holding: Holding) -> None:
        holding.timer = None
        if holding.ended or holding.lost:
            return

        async def renew(token: str, _counted: float) -> bool:
            return await self._extend_on_nodes(token, self._leases.get(holding, self._ttl))

        holding.renewal = asyncio.get_running_loop().create_task(
            keep_alive(holding, renew, self._declare_lost, self._name, self._renewed),
            name=f"aiolock renewal of {self._name!r}",
        )

    def _declare_lost(self, holding: Holding, reason: str) -> None:
        """Mark ``holding`` lost: flag, local queue, ``cancel_on_lost``, ``on_lost``."""
        if holding.lost or holding.ended:
            return
        self._stop_watching(holding)
        self._leases.pop(holding, None)
        self._pass_baton(holding)
        for scope in self._scopes.get(holding.task, ()):
            if scope is not None:
                scope.cancel()
                break
        self._report_loss(holding, reason)

    def _pass_baton(self, holding: Holding) -> None:
        """Let the next local waiter contend (once per holding)."""
        if holding.has_baton:
            holding.has_baton = False
            self._gate.release()

    def _end(self, holding: Holding) -> None:
        """Forget ``holding`` locally (the nodes are the caller's business)."""
        holding.ended = True
        self._stop_watching(holding)
        self._leases.pop(holding, None)
        if self._by_task.get(holding.task) is holding:
            del self._by_task[holding.task]
        if self._current is holding:
            self._current = None
        if holding.owner_done is not None:
            holding.task.remove_done_callback(holding.owner_done)
            holding.owner_done = None

    async def _settle(self, holding: Holding) -> None:
        """Wait for the holding's watchdog (it ends within node_timeout) and callbacks, shielded."""
        me = asyncio.current_task()
        renewal = holding.renewal if holding.renewal is not me else None
        callbacks = [t for t in holding.callbacks if t is not me]
        holding.renewal = None
        holding.callbacks = []
        if renewal is not None:
            await _finish([renewal])
            if not renewal.cancelled():
                renewal.exception()
        if callbacks:
            await _finish(callbacks)  # shielded too: no task outlives the lock
        for finished in callbacks:
            if not finished.cancelled():
                finished.exception()

    # -- release / extend / queries ----------------------------------------------------

    async def release(self) -> None:
        """Release the lock: delete our key from every node, and let the next task in.

        Releases the calling task's holding, or else (a hand-off) the
        object's current holding. With ``reentrant=True`` only the last of
        nested releases gives the lock up. Completes even if cancelled; every
        node call is bounded by ``node_timeout``. The release is clean when
        a majority of the nodes deleted our key.

        Raises:
            LockNotOwnedError: nothing is held.
            LockLostError: the holding was lost (declared before, without a
                round trip; or found now: its lease had run out, or fewer
                nodes than a majority could still have held our key; then
                ``on_lost`` runs too). Other holders' keys are never touched.
            redis.exceptions.RedisError: fewer than a majority deleted our
                key and failed nodes leave it open whether we still held it
                (the last failed node's error); the keys those nodes may
                hold expire with their lease.
        """
        holding = self._holding_to_release()
        if holding is None:
            raise LockNotOwnedError(f"lock {self._name!r} is not held")
        if holding.depth > 1 and not holding.lost:
            holding.depth -= 1
            return
        task = _current_task()
        baseline = cancelling(task)
        if not holding.lost and time.monotonic() >= holding.lease_end:
            # The loop was blocked past the lease: the watchdog had no chance to run.
            self._declare_lost(holding, "the lease ran out before release")
        self._end(holding)
        try:
            if holding.lost:
                raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
            outcomes = await self._on_every_node(self._delete(holding.token), patient=True)
        except BaseException:
            if not holding.lost:
                self._event("released", holding)  # given up; the nodes' leases expire the rest
            raise
        finally:
            self._pass_baton(holding)
            if holding.renewal is not None or holding.callbacks:
                await self._settle(holding)
        deleted = sum(1 for o in outcomes if o == 1)
        if deleted < self._quorum:
            failed = [o for o in outcomes if isinstance(o, Exception)]
            if deleted + len(failed) >= self._quorum:
                self._event("released", holding)  # given up; the nodes' leases expire the rest
                raise failed[-1]
            self._report_loss(holding, "a majority of the nodes no longer held our key at release")
            await self._settle(holding)  # an async on_lost
            raise LockLostError(
                f"lock {self._name!r} was no longer held on a majority of its nodes at release "
                f"({deleted} of {len(outcomes)} still had our key, {self._quorum} needed); "
                "other holders' keys were left alone"
            )
        logger.debug("released lock %r", self._name)
        self._event("released", holding)
        if task.cancelling() > baseline:
            await honour_cancellation(task, baseline)

    async def _extend_on_nodes(self, token: str, ttl: float) -> bool:
        """Set the lease of ``token``'s key to ``ttl`` on every node that holds it.

        Returns True if a majority did so with validity left, False if the
        lock is lost for sure (too few nodes can still hold our key).

        Raises:
            Exception: failed nodes leave it open (the last one's error, or a
                ``redis.exceptions.TimeoutError`` if the validity ran out).
        """
        sent = time.monotonic()
        outcomes = await self._on_every_node(self._pexpire(token, ttl), patient=False)
        elapsed = time.monotonic() - sent
        extended = sum(1 for o in outcomes if o == 1)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if extended + len(failed) < self._quorum:
            return False
        if extended >= self._quorum:
            if ttl - elapsed - _drift(ttl) > 0:
                return True
            raise RedisTimeoutError(
                f"extending lock {self._name!r} took {elapsed:.3f} s, more than the "
                f"{ttl:g} s lease it asked for"
            )
        raise failed[-1]

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease of the current holding to ``ttl`` seconds from now, on every node.

        Succeeds when a majority of the nodes still held our key and extended
        it, within the new lease's validity. ``ttl`` defaults to the lock's;
        a value given here also becomes the lease that later renewals of this
        holding use.

        Raises:
            LockNotOwnedError: nothing is held, or a majority of the nodes no
                longer holds our key (the holding is then marked lost).
            LockLostError: the holding had already been declared lost, or its
                lease has run out.
            redis.exceptions.RedisError: failed nodes leave it open; the
                holding keeps its previous lease.
            ValueError: ``ttl`` is below 0.01 or ``node_timeout``, or not finite.
        """
        new_ttl = self._ttl if ttl is None else _check_lease(ttl, self._node_timeout)
        holding = self._holding_to_release()
        if holding is None or holding.ended:
            raise LockNotOwnedError(f"lock {self._name!r} is not held")
        sent = time.monotonic()
        if not holding.lost and sent >= holding.lease_end:
            self._declare_lost(holding, "the lease ran out before extend()")
        if holding.lost:
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        if not await self._extend_on_nodes(holding.token, new_ttl):
            self._declare_lost(
                holding, "a majority of the nodes no longer held our key at extend()"
            )
            raise LockNotOwnedError(
                f"lock {self._name!r} is no longer held on a majority of its nodes; "
                "other holders' keys were left alone"
            )
        if holding.is_lost():  # declared lost while the extend was in flight
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        holding.renewed(sent, new_ttl - _drift(new_ttl))
        self._event("renewed", holding)
        if not (holding.ended or holding.lost):
            self._leases[holding] = new_ttl  # for later renewals; dropped at the end or loss
        if not self._auto_renew and holding.timer is not None:
            holding.timer.cancel()
            holding.timer = call_at(holding.lease_end, self._lease_over, holding)

    async def _values(self) -> list[object]:
        """GET the key on every node: one value (or None) per node that answered.

        Raises:
            Exception: every node failed (the last one's error).
        """
        key = self._key
        outcomes = await self._on_every_node(lambda _, client: client.get(key), patient=False)
        answered = [_text(o) for o in outcomes if not isinstance(o, Exception)]
        if not answered:
            failed = outcomes[-1]
            assert isinstance(failed, Exception)  # noqa: S101 - none answered
            raise failed
        return answered

    async def locked(self) -> bool:
        """Whether anyone holds the lock now: one token is on a majority of the nodes (asks them).

        Raises:
            redis.exceptions.RedisError: every node failed (the last one's error).
        """
        counts = collections.Counter(v for v in await self._values() if v is not None)
        return any(n >= self._quorum for n in counts.values())

    async def owned(self) -> bool:
        """Whether this holder's token is on a majority of the nodes (asks them).

        Looks at the calling task's holding, or else the object's current
        one; False without a round trip when there is none, it was lost, or
        its lease is over.

        Raises:
            redis.exceptions.RedisError: every node failed (the last one's error).
        """
        holding = self._holding_to_release()
        if (
            holding is None
            or holding.ended
            or holding.lost
            or time.monotonic() >= holding.lease_end
        ):
            return False
        token = holding.token
        return sum(1 for v in await self._values() if v == token) >= self._quorum

    # -- async with --------------------------------------------------------------------
