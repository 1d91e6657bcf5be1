"""AsyncLock: the distributed lock on one Redis or Valkey server (or cluster)."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, final

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _notify
from . import backoff as _backoff
from ._cancel import cancelling, honour_cancellation, run_shielded
from ._exceptions import LockLostError, LockNotOwnedError
from ._holder import _UNSET, Contention, HoldingLock, _check_seconds, _check_timeout, _Unset
from ._holder import current_task as _current_task
from ._renewal import Holding, keep_alive
from ._scripts import scripts_for
from ._timers import Cutoff, call_at
from ._types import Client
from ._waiting import (
    LOCAL_RUN,
    MARK_SLACK,
    Entry,
    Grant,
    LocalQueue,
    Turn,
    Undo,
    Yield,
    existing_queue,
    queue_for,
    queues_of,
    yield_wait,
)

__all__ = ["AsyncLock", "LockStatistics"]

logger = logging.getLogger("aiolock")

#: How long an attempt already sent may run past the deadline before it is cut off.
_GRACE: Final = 0.1
#: The longest a cleanup (undoing an attempt, finishing a cancelled release) may take.
_CLEANUP_BOUND: Final = 1.0
#: The reply of a first attempt (a bare ``SET``) that failed: the remaining lease is unknown.
_UNKNOWN_PTTL: Final = -3
#: The PTTL of a failed attempt that had the lock but not the replicas' acknowledgement.
_UNACKNOWLEDGED: Final = -4


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """What :meth:`AsyncLock.statistics` returns: a lock as this process sees it.

    Attributes:
        held: a task of this process holds the lock through this client.
        owner: that task, or None.
        tasks_waiting: how many tasks of this process wait for the lock
            through this client (the first of them may be talking to the
            server; the others wait in the local queue behind it).
    """

    held: bool
    owner: asyncio.Task[Any] | None
    tasks_waiting: int


def _check_client(client: object) -> Client:
    if isinstance(client, (Redis, RedisCluster)):
        return client
    kind = f"{type(client).__module__}.{type(client).__qualname__}"
    hint = ""
    if kind.startswith("redis.") and not kind.startswith("redis.asyncio"):
        hint = " (a synchronous client: use redis.asyncio.Redis instead)"
    raise TypeError(
        f"client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, got {kind}{hint}"
    )


def _check_ttl(value: object, name: str = "ttl") -> float:
    ttl = _check_seconds(name, value, allow_none=False)
    assert ttl is not None  # noqa: S101 - allow_none=False
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if ttl < 0.001:
        raise ValueError(f"{name} must be at least 0.001 s (1 ms on the wire), got {value!r}")
    return ttl


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


@final
class _ClosedTransport:
    """Turn uvloop's bare ``RuntimeError`` on a closed transport into redis-py's error.

    On a connection the server reset, redis-py translates ``OSError`` into
    ``ConnectionError``, but uvloop raises ``RuntimeError("unable to perform
    operation on <TCPTransport closed=True ...>")`` instead, which would reach
    callers who catch ``RedisError``. Other ``RuntimeError`` pass unchanged.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if exc_type is RuntimeError and "unable to perform operation on" in str(exc):
            raise RedisConnectionError(f"the connection to the server was closed: {exc}") from exc
        return False


_TRANSPORT: Final = _ClosedTransport()


def _ms(seconds: float) -> int:
    """A lease in whole milliseconds for the wire, rounded up (never shorter than counted).

    The holder counts ``seconds`` from when it sent the command; rounding down
    (``int(1.005 * 1000)`` is 1004) would let the server expire the key before
    the holder's own lease end. A float's last-bit error is not rounded up.
    """
    return math.ceil(seconds * 1000 - 1e-6)


@final
class AsyncLock(HoldingLock):
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
            holder dies. Renewal keeps it alive while the holder lives.
        timeout: how long :meth:`acquire` waits, in seconds; ``None`` waits
            forever, ``0`` tries once.
        blocking: ``False`` makes :meth:`acquire` try once by default.
        backoff: the policy for the pause between attempts (see
            :mod:`aiolock.backoff`), or a callable ``attempt -> seconds``.
        auto_renew: extend the lease every ``ttl/3`` while held.
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

    **Ownership.** A holding belongs to the task that acquired it. Another
    task using the same object waits for it; the owner re-acquiring raises
    :class:`LockError` unless ``reentrant=True``. As with ``asyncio.Lock``,
    :meth:`release` may be called from another task (a hand-off); it ends the
    object's current holding. Each acquisition gets a fresh 128-bit token,
    and the server only ever deletes or extends a key holding that token.

    **Fairness.** Tasks of one process waiting through one client object are
    served first come, first served, and only the first of them sends
    commands. A release hands the lock straight to the next of them; once
    such a run has lasted 0.1 s it lets waiters elsewhere go first, whether
    they are notified or poll (they raise the ``<key>:waiting`` marker while
    they pause). Between processes (or client objects) there is no order:
    the first attempt after a release wins.

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
    the server can expire it. If the owning task ends without releasing,
    renewal stops and the key expires after its lease. A failover to a
    replica that had not yet received the key loses the lock without
    notice; fencing tokens let the protected resource reject such stale
    holders.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments, naming the
    argument. :class:`AcquireTimeout` from ``async with`` when the lock was
    not acquired in time. :class:`LockNotOwnedError` from :meth:`release`
    and :meth:`extend` when the holding is not ours; :class:`LockLostError`
    (a subclass) when it was lost while held. redis-py's own exceptions
    propagate unchanged, after the cleanup above.
    """

    __slots__ = (
        "_acquire_keys",
        "_auto_renew",
        "_backoff",
        "_blocking",
        "_by_task",
        "_cancel_on_lost",
        "_channel",
        "_client",
        "_cluster",
        "_current",
        "_fencing",
        "_key",
        "_last",
        "_listeners",
        "_marker",
        "_name",
        "_notify",
        "_on_lost",
        "_prefix",
        "_queues",
        "_reentrant",
        "_release_args",
        "_replica_fsync",
        "_replica_timeout",
        "_replicas",
        "_scopes",
        "_scripts",
        "_timeout",
        "_ttl",
    )

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
        prefix: str = "aiolock:",
        fencing: bool = False,
        replicas: int = 0,
        replica_timeout: float | None = None,
        replica_fsync: bool = False,
    ) -> None:
        self._client = _check_client(client)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if not name:
            raise ValueError(f"name must not be empty, got {name!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        self._name = name
        self._prefix = prefix
        self._ttl = _check_ttl(ttl)
        self._timeout = _check_timeout(timeout)
        self._blocking = _check_bool("blocking", blocking)
        self._backoff = _backoff._coerce(_backoff.exponential() if backoff is None else backoff)
        self._auto_renew = _check_bool("auto_renew", auto_renew)
        self._notify = _check_bool("notify", notify)
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be a callable or None, got {on_lost!r}")
        self._on_lost = on_lost
        self._cancel_on_lost = _check_bool("cancel_on_lost", cancel_on_lost)
        self._reentrant = _check_bool("reentrant", reentrant)
        self._fencing = _check_bool("fencing", fencing)
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise TypeError(f"replicas must be an int, got {replicas!r}")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas!r}")
        if replicas and isinstance(self._client, RedisCluster):
            raise ValueError(
                f"replicas={replicas} is not available with a RedisCluster client "
                "(WAIT must run on the connection that took the lock)"
            )
        self._replicas = replicas
        if replica_timeout is None:
            self._replica_timeout = min(self._ttl / 10, 1.0)
        else:
            self._replica_timeout = _check_ttl(replica_timeout, "replica_timeout")
        self._replica_fsync = _check_bool("replica_fsync", replica_fsync)

        self._key = f"{prefix}{{{name}}}"
        tag = self._key.index("{")
        if self._key[tag + 1] == "}":
            raise ValueError(
                f"name {name!r} with prefix {prefix!r} gives the key {self._key!r} an empty "
                "hash tag '{}', so its companion keys would not share its cluster slot "
                "(a name must not start with '}', nor a prefix contain '{}')"
            )
        self._channel = f"{self._key}:released"
        self._marker = f"{self._key}:waiting"
        self._acquire_keys = (
            (self._key, self._marker, f"{self._key}:fence")
            if fencing
            else (self._key, self._marker)
        )
        self._cluster = isinstance(self._client, RedisCluster)
        sharded = "1" if self._cluster else "0"
        self._release_args = (self._channel, sharded)
        self._scripts = scripts_for(self._client)
        self._queues = queues_of(self._client)
        self._listeners = _notify.listeners_of(self._client)

        self._by_task: dict[asyncio.Task[Any], Holding] = {}
        self._current: Holding | None = None
        self._last: Holding | None = None
        self._scopes: dict[asyncio.Task[Any], list[anyio.CancelScope | None]] = {}

    def __repr__(self) -> str:
        state = "held" if self._current is not None else "free"
        return f"<AsyncLock {self._name!r} key={self._key!r} ttl={self._ttl} {state}>"

    # -- read-only facts ---------------------------------------------------------------
    @property
    def key(self) -> str:
        """The Redis key of the lock: ``<prefix>{<name>}``."""
        return self._key

    @property
    def lost(self) -> bool:
        """Whether this holder's most recent holding was lost while held.

        Looks at the calling task's holding if it has one, else at the
        object's most recent holding. Reset by the next acquisition. It is
        True as soon as the holder's own clock says the lease is over, even
        before the watchdog has run (after the event loop was blocked past
        the lease, the first look already says so), so checking it right
        before a write never lets a holder past its lease write.
        """
        holding = self._holding_of_caller()
        if holding is None:
            return False
        return holding.lost or (not holding.ended and time.monotonic() >= holding.lease_end)

    @property
    def fence(self) -> int | None:
        """The fencing number of the current acquisition (``fencing=True`` only).

        Strictly increases with each acquisition of this name by any holder,
        so a resource that remembers the highest fence it has seen can reject
        writes from a holder whose lock has since passed to someone else. It
        is never below the server's clock in microseconds (a large number),
        so it keeps increasing across a server restart that lost the counter.
        """
        holding = self._holding_of_caller()
        return holding.fence if holding is not None else None

    def _holding_of_caller(self) -> Holding | None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        holding = self._by_task.get(task) if task is not None else None
        return holding if holding is not None else self._last

    def statistics(self) -> LockStatistics:
        """Describe the lock as this process sees it, without asking the server.

        The view is that of the lock's client: every :class:`AsyncLock` with
        the same client and name shares it. Holders in other processes (or
        on other client objects) are not seen; :meth:`locked` asks the server.
        """
        queue = existing_queue(self._queues, self._key)
        if queue is None:
            return LockStatistics(held=False, owner=None, tasks_waiting=0)
        contending = queue.owner is not None and queue.holder is None
        return LockStatistics(
            held=queue.holder is not None,
            owner=queue.holder,
            tasks_waiting=queue.waiting + int(contending),
        )

    # -- acquire -----------------------------------------------------------------------

    async def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | _Unset | None = _UNSET,  # noqa: ASYNC109 - a name of the public contract
    ) -> bool:
        """Acquire the lock; return True once held, False if not within the timeout.

        Args:
            blocking: ``False`` tries once and returns at once; defaults to
                the lock's ``blocking``.
            timeout: seconds to wait, overriding the lock's ``timeout``;
                ``None`` waits forever, ``0`` tries once.

        Raises:
            LockError: the calling task already holds this non-reentrant lock
                (or the same key through another lock object on this client).
            LockLostError: the calling task's holding was lost and has not
                been released yet.
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
        """Get the lock for ``task``: through the local queue, then on the server."""
        baseline = cancelling(task)
        queue = queue_for(self._queues, self._key)
        if queue.take(task):
            ticket: Grant | Turn | Undo | Yield | None = Turn.CONTEND
        else:
            contention.seen = True  # another task of this process had it, or was first in line
            ticket = await queue.enter(task, self, deadline, deadline is None or deadline > started)
        if ticket is None:
            return None
        try:
            if isinstance(ticket, Grant):
                if time.monotonic() < ticket.sent + self._ttl:
                    return self._hold(task, ticket.token, ticket.sent, ticket.fence, handed=True)
                # The releaser's hand-over took longer than our lease: not a lock.
                ticket = Undo(ticket.token)
            if isinstance(ticket, Undo):
                # A hand-over that was too late, or whose outcome is unknown: take our
                # token back, then contend on the server if there is time left.
                await self._undo(ticket.token)
                if deadline is not None and time.monotonic() >= deadline:
                    queue.leave()
                    return None
                ticket = Turn.CONTEND
            pause = ticket.seconds if isinstance(ticket, Yield) else 0.0
            holding = await self._contend(task, deadline, baseline, pause, contention)
        except BaseException:
            queue.leave()
            raise
        if holding is None:
            queue.leave()
        return holding

    async def _contend(
        self,
        task: asyncio.Task[Any],
        deadline: float | None,
        baseline: int,
        wait_first: float,
        contention: Contention,
    ) -> Holding | None:
        """Try on the server until acquired or past the deadline (we hold the baton).

        Between attempts it waits for the backoff step, capped by the holder's
        PTTL and the deadline, and, with ``notify``, cut short by a release
        message on the lock's channel. With ``wait_first`` (seconds) it starts
        with such a wait: the local releaser just let waiters elsewhere go first.

        Each failed attempt that will be followed by a wait also raises the
        lock's waiting marker for that long (plus ``MARK_SLACK``), so that a
        holder elsewhere handing the lock from task to task in its own process
        sees this waiter even when it cannot be notified, and lets it go first
        (see :mod:`aiolock._waiting`). Giving up takes the marker down. An
        attempt that finds another holder's key is noted in ``contention``.
        """
        subscription: _notify.Subscription | None = None
        waiter: str | None = None  # our id in the marker, once we raised it
        holding: Holding | None = None
        try:
            delays: Iterator[float] | None = None
            step = 0.0  # the policy's latest delay: repeated once a finite policy runs out
            drawn = False  # `step` is already the pause after the attempt in flight
            plain = not (self._fencing or self._replicas)  # the first attempt is a bare SET
            seen: int | None = None
            if wait_first:
                # Waiters elsewhere were told to go first; if none has taken the lock by
                # then, try anyway. A plain sleep: the release message of the yield itself
                # may still be on its way to our listener, and must not wake us.
                if deadline is not None:
                    wait_first = max(0.0, min(wait_first, deadline - time.monotonic()))
                await anyio.sleep(wait_first)
                await honour_cancellation(task, baseline)
            while True:
                # Note the channel's generation before the attempt: news after this
                # point (a release, a subscription confirmed) means "try again at once".
                if subscription is not None:
                    subscription.mark()
                elif self._notify:
                    seen = _notify.generation_in(self._listeners, self._channel)
                token = secrets.token_hex(16)
                mark_ms = 0
                if plain:
                    plain = False
                elif deadline is None or deadline > time.monotonic():
                    # Draw the pause that will follow a failure now: the marker lasts that long.
                    if delays is None:
                        delays = self._backoff.delays()
                    step = _backoff._check_delay(next(delays, step))
                    drawn = True
                    bound = step if deadline is None else min(step, deadline - time.monotonic())
                    mark_ms = int((bound + MARK_SLACK) * 1000) + 1
                    if waiter is None:
                        waiter = secrets.token_hex(8)
                sent = time.monotonic()
                reply = await self._attempt(token, deadline, waiter, mark_ms)
                if reply is not None and not reply[0] and reply[1] != _UNACKNOWLEDGED:
                    contention.seen = True
                if cancelling(task) > baseline:
                    if reply is not None and reply[0]:
                        await self._undo(token)
                    await honour_cancellation(task, baseline)
                now = time.monotonic()
                if reply is not None and reply[0]:
                    if now < sent + self._ttl:
                        fence = int(reply[1]) if self._fencing else None
                        holding = self._hold(task, token, sent, fence)
                        return holding
                    # The reply came after the lease it granted had run out: not a lock.
                    await self._undo(token)
                    reply = None
                if deadline is not None and now >= deadline:
                    return None
                if reply is not None and reply[1] == _UNKNOWN_PTTL:
                    continue  # the first, bare attempt failed: the script follows at once
                if not drawn:
                    if delays is None:
                        delays = self._backoff.delays()
                    step = _backoff._check_delay(next(delays, step))
                drawn = False
                delay = step
                pttl = int(reply[1]) if reply is not None else -1
                if pttl >= 0:
                    # An expiring holder sends no message: wake when its lease ends.
                    delay = min(delay, pttl / 1000 + 0.001)
                elif pttl == -2:
                    delay = 0.0
                if deadline is not None:
                    delay = max(0.0, min(delay, deadline - time.monotonic()))
                if subscription is None and self._notify and delay > 0:
                    subscription = await _notify.subscribe(self._client, self._channel, seen)
                if subscription is None:
                    await anyio.sleep(delay)
                else:
                    await subscription.wait(delay)
                await honour_cancellation(task, baseline)
        finally:
            if subscription is not None:
                subscription.close()
            if waiter is not None and holding is None:
                await self._unmark(waiter)

    async def _attempt(
        self, token: str, deadline: float | None, waiter: str | None, mark_ms: int
    ) -> list[int] | None:
        """Send one acquire attempt; None if it was cut off at the deadline.

        Returns ``[1, fence]`` if the lock was taken, else ``[0, pttl]`` (see
        the ACQUIRE script). An attempt without a ``waiter`` and without
        fencing is a bare ``SET NX PX``: on an uncontended lock (the common
        case) it costs a tenth less than the script, client and server
        together; if it fails, the reply is ``[0, _UNKNOWN_PTTL]`` and the
        scripted attempt follows, which gets the PTTL (and, with ``mark_ms``,
        raises the waiting marker) in the same round trip.

        Whatever interrupts the attempt (cancellation, a redis-py error, the
        deadline), the ``SET`` may have reached the server, so it is undone
        with the same token before this returns or raises.
        """
        ms = _ms(self._ttl)
        if self._cluster:
            # A fresh RedisCluster that loads its slot map while many commands are in
            # flight loses replies (redis-py 8.1): load it first (at once when loaded).
            await self._client.initialize()
        if self._replicas:
            return await self._replicated_attempt(token, ms, deadline, waiter, mark_ms)
        plain = waiter is None and not self._fencing
        try:
            if deadline is None:
                return await (
                    self._set(token, ms) if plain else self._script(token, ms, waiter, mark_ms)
                )
            with Cutoff(deadline + _GRACE) as cutoff:
                reply = await (
                    self._set(token, ms) if plain else self._script(token, ms, waiter, mark_ms)
                )
            if not cutoff.expired:
                return reply
        except BaseException:
            await self._undo(token)
            raise
        await self._undo(token)
        return None

    async def _replicated_attempt(
        self, token: str, ms: int, deadline: float | None, waiter: str | None, mark_ms: int
    ) -> list[int] | None:
        """An attempt that counts only once ``replicas`` replicas acknowledged it.

        Sent as one pipeline: the acquire script, then ``WAIT`` (or
        ``WAITAOF``) on the same connection, so that it waits for this very
        write. Returns like :meth:`_attempt`; an acquisition without the
        acknowledgement in time is undone and reported as
        ``[0, _UNACKNOWLEDGED]`` (a failed attempt with no lease to wait for).
        """
        try:
            if deadline is None:
                reply = await self._acquire_and_wait(token, ms, waiter, mark_ms)
            else:
                with Cutoff(deadline + _GRACE) as cutoff:
                    reply = await self._acquire_and_wait(token, ms, waiter, mark_ms)
                if cutoff.expired:
                    await self._undo(token)
                    return None
        except BaseException:
            await self._undo(token)
            raise
        taken, acked = reply
        if taken[0] and acked < self._replicas:
            await self._undo(token)
            logger.info(
                "acquisition of lock %r not acknowledged by %d replicas within %s s "
                "(%d did); released it",
                self._name,
                self._replicas,
                self._replica_timeout,
                acked,
            )
            return [0, _UNACKNOWLEDGED]
        return taken

    async def _acquire_and_wait(
        self, token: str, ms: int, waiter: str | None, mark_ms: int
    ) -> tuple[list[int], int]:
        script = self._scripts.acquire
        keys = self._acquire_keys
        wait_ms = max(1, int(self._replica_timeout * 1000))
        for _ in range(2):
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, token, ms, waiter or "", mark_ms)
            if self._replica_fsync:
                pipe.execute_command("WAITAOF", 0, self._replicas, wait_ms)
            else:
                pipe.execute_command("WAIT", self._replicas, wait_ms)
            try:
                with _TRANSPORT:
                    taken, acked = await pipe.execute()
            except NoScriptError:  # a restarted or flushed server: load it, then again
                with _TRANSPORT:
                    await self._client.script_load(script.script)
                continue
            count = int(acked[1]) if self._replica_fsync else int(acked)
            return [int(taken[0]), int(taken[1])], count
        raise NoScriptError(f"the acquire script of lock {self._name!r} could not be loaded")

    async def _set(self, token: str, ms: int) -> list[int]:
        # execute_command, not client.set(): the same command without redis-py's
        # argument checks, which cost as much as the rest of our acquire.
        with _TRANSPORT:
            if await self._client.execute_command("SET", self._key, token, "NX", "PX", ms):
                return [1, 0]
        return [0, _UNKNOWN_PTTL]

    async def _script(self, token: str, ms: int, waiter: str | None, mark_ms: int) -> list[int]:
        with _TRANSPORT:
            reply: list[int] = await self._scripts.acquire(
                self._acquire_keys, (token, ms, waiter or "", mark_ms)
            )
        return reply

    async def _unmark(self, waiter: str) -> None:
        """Take down the waiting marker if it is ours: shielded, bounded, best effort."""
        try:
            await run_shielded(lambda: self._unmark_script(waiter), self._cleanup_bound())
        except Exception as exc:
            logger.debug(
                "could not take down the waiting marker of %r: %r (it expires by itself)",
                self._name,
                exc,
            )

    async def _unmark_script(self, waiter: str) -> None:
        with _TRANSPORT:
            await self._scripts.unmark((self._marker,), (waiter,))

    async def _undo(self, token: str) -> None:
        """Delete the key if it holds ``token``: shielded, bounded, best effort."""
        try:
            await run_shielded(lambda: self._release_script(token), self._cleanup_bound())
        except Exception as exc:
            logger.debug(
                "could not undo an attempt on %r: %r (the lease will expire it)", self._name, exc
            )

    def _cleanup_bound(self) -> float:
        return min(self._ttl, _CLEANUP_BOUND)

    async def _release_script(self, token: str) -> bool:
        with _TRANSPORT:
            return bool(await self._scripts.release((self._key,), (token, *self._release_args)))

    async def _extend_script(self, token: str, ttl: float) -> bool:
        with _TRANSPORT:
            return bool(await self._scripts.extend((self._key,), (token, _ms(ttl))))

    # -- holding -----------------------------------------------------------------------

    def _hold(
        self,
        task: asyncio.Task[Any],
        token: str,
        sent: float,
        fence: int | None,
        *,
        handed: bool = False,
    ) -> Holding:
        """Record a new holding of ``task`` and start watching its lease.

        ``handed`` tells a lock handed over by a local releaser from one taken
        on the server (which starts a new local run).
        """
        holding = Holding(token, task, self._ttl, sent, fence if self._fencing else None)
        queue = queue_for(self._queues, self._key)
        queue.holder = task
        if not handed:
            queue.run_started = sent
        self._by_task[task] = holding
        self._current = holding
        self._last = holding
        if self._auto_renew:
            holding.timer = call_at(sent + self._ttl / 3, self._start_renewal, holding)
        else:
            holding.timer = call_at(holding.lease_end, self._lease_over, holding)
        holding.owner_done = self._task_done
        task.add_done_callback(self._task_done)
        logger.debug("acquired lock %r (fence %s)", self._name, fence)
        return holding

    def _start_renewal(self, holding: Holding) -> None:
        holding.timer = None
        if holding.ended or holding.lost:
            return
        holding.renewal = asyncio.get_running_loop().create_task(
            keep_alive(holding, self._extend_script, self._declare_lost, self._name, self._renewed),
            name=f"aiolock renewal of {self._name!r}",
        )

    def _declare_lost(self, holding: Holding, reason: str) -> None:
        """Mark ``holding`` lost: flag, baton, ``cancel_on_lost``, ``on_lost``."""
        if holding.lost or holding.ended:
            return
        self._stop_watching(holding)
        self._pass_baton(holding)
        for scope in self._scopes.get(holding.task, ()):
            if scope is not None:
                scope.cancel()
                break
        self._report_loss(holding, reason)

    def _pass_baton(self, holding: Holding) -> None:
        if holding.has_baton:
            holding.has_baton = False
            queue_for(self._queues, self._key).leave()

    def _end(self, holding: Holding) -> None:
        """Forget ``holding`` locally (the server side is the caller's business)."""
        holding.ended = True
        self._stop_watching(holding)
        if self._by_task.get(holding.task) is holding:
            del self._by_task[holding.task]
        if self._current is holding:
            self._current = None
        if holding.owner_done is not None:
            holding.task.remove_done_callback(holding.owner_done)
            holding.owner_done = None

    async def _settle(self, holding: Holding) -> None:
        """Wait for the holding's watchdog and callbacks to finish, even if cancelled meanwhile."""
        me = asyncio.current_task()
        pending = [
            t for t in (holding.renewal, *holding.callbacks) if t is not None and t is not me
        ]
        holding.renewal = None
        holding.callbacks = []
        cancelled: asyncio.CancelledError | None = None
        if pending and not all(t.done() for t in pending):
            # Shielded: a cancelled release must not return while they still run.
            settled = asyncio.ensure_future(asyncio.wait(pending))
            while not settled.done():
                try:
                    await asyncio.shield(settled)
                except asyncio.CancelledError as exc:
                    cancelled = cancelled or exc
        for finished in pending:
            if not finished.cancelled():
                finished.exception()
        if cancelled is not None:
            raise cancelled

    # -- release / extend / queries ----------------------------------------------------

    async def release(self) -> None:
        """Release the lock: delete the key if it is still ours and wake a waiter.

        Releases the calling task's holding, or else (a hand-off) the
        object's current holding. With ``reentrant=True`` only the last of
        nested releases gives the lock up. Completes even if cancelled.

        Raises:
            LockNotOwnedError: nothing is held.
            LockLostError: the holding was lost (declared before, or found
                now: the lease had run out, or the key was no longer ours; then
                ``on_lost`` runs too). Another holder's key is never touched.
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
            queue = existing_queue(self._queues, self._key) if holding.has_baton else None
            entry = queue.reserve() if queue is not None else None
            if queue is not None and entry is not None and (self._replicas or entry.lock._replicas):
                # An acquisition that replicas must acknowledge is taken on the server.
                holding.has_baton = False
                queue.give(entry, Turn.CONTEND)
                entry = None
            if queue is not None and entry is not None:
                holding.has_baton = False  # reserved for `entry`
                deleted = await self._hand_over(holding, queue, entry)
            else:
                # Bounded by the lease: once it is over the key expires by itself, and
                # waiting on for an answer would only stall the caller.
                try:
                    with Cutoff(holding.lease_end + _GRACE) as cutoff:
                        deleted = await self._release_script(holding.token)
                except asyncio.CancelledError:
                    await self._undo(holding.token)
                    raise
                if cutoff.expired:
                    raise RedisTimeoutError(
                        f"releasing lock {self._name!r}: no answer before its lease ended; "
                        "the server expires the key by itself"
                    )
            if not deleted:
                self._report_loss(holding, "the key was gone or held by another holder at release")
        finally:
            self._pass_baton(holding)
            if not holding.lost:
                # Given up: deleted, or (cancelled, failed) undone or left to its lease.
                self._event("released", holding)
            if holding.renewal is not None or holding.callbacks:
                await self._settle(holding)
        if not deleted:
            raise LockLostError(
                f"lock {self._name!r} was no longer held by this holder at release "
                "(its lease ran out); the key was left alone"
            )
        logger.debug("released lock %r", self._name)
        if task.cancelling() > baseline:
            await honour_cancellation(task, baseline)

    async def _hand_over(self, holding: Holding, queue: LocalQueue, entry: Entry) -> bool:
        """Release ``holding`` straight to the reserved local waiter ``entry``.

        Returns whether the key was still ours. Whatever happens, ``entry``
        gets the baton: with the lock (a :class:`Grant`), to contend for it,
        or, when the hand-over was cut off at our lease end and may have run,
        to delete the token it may have been given first (an :class:`Undo`).
        """
        heir = entry.lock
        token = secrets.token_hex(16)
        sent = time.monotonic()
        may_yield = sent - queue.run_started >= LOCAL_RUN
        own = 0 if _notify.generation_in(self._listeners, self._channel) is None else 1
        args = (
            holding.token,
            token,
            _ms(heir._ttl),
            self._channel,
            self._release_args[1],
            own,
            "1" if may_yield else "0",
        )
        try:
            # Bounded by the releaser's lease, like a plain release.
            with _TRANSPORT, Cutoff(holding.lease_end + _GRACE) as cutoff:
                reply = await self._scripts.handover(heir._acquire_keys, args)
        except BaseException:
            # It may have run: make sure neither token keeps the key, then let the heir contend.
            queue.give(entry, Turn.CONTEND)
            await self._undo(token)
            await self._undo(holding.token)
            raise
        if cutoff.expired:
            # It may have run and given the heir's token a fresh lease: the heir takes that
            # back before it contends (or we do, if it gave up meanwhile), so that this
            # release ends by the lease. Our own key has expired by now (its lease is over).
            if not queue.give(entry, Undo(token)):
                await self._undo(token)
            raise RedisTimeoutError(
                f"releasing lock {self._name!r}: no answer before its lease ended; "
                "the server expires the key by itself"
            )
        if reply[0] == 1:
            if not queue.give(entry, Grant(token, sent, int(reply[1]))):
                await self._undo(token)  # the heir gave up meanwhile
            return True
        queue.give(entry, Yield(yield_wait(int(reply[1]))) if reply[0] == 2 else Turn.CONTEND)
        return bool(reply[0])

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease of the current holding to ``ttl`` seconds from now.

        ``ttl`` defaults to the lock's; a value given here also becomes the
        lease that later renewals of this holding use.

        Raises:
            LockNotOwnedError: nothing is held, or the key is no longer ours
                (the holding is then marked lost).
            LockLostError: the holding had already been declared lost, or its
                lease has run out.
            ValueError: ``ttl`` is not a finite number > 0.
        """
        new_ttl = self._ttl if ttl is None else _check_ttl(ttl)
        holding = self._holding_to_release()
        if holding is None or holding.ended:
            raise LockNotOwnedError(f"lock {self._name!r} is not held")
        sent = time.monotonic()
        if not holding.lost and sent >= holding.lease_end:
            self._declare_lost(holding, "the lease ran out before extend()")
        if holding.lost:
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        if not await self._extend_script(holding.token, new_ttl):
            self._declare_lost(holding, "the key was gone or held by another holder at extend()")
            raise LockNotOwnedError(
                f"lock {self._name!r} is no longer held by this holder; the key was left alone"
            )
        if holding.is_lost():  # declared lost while the extend was in flight
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        holding.renewed(sent, new_ttl)
        self._event("renewed", holding)
        if not self._auto_renew and holding.timer is not None:
            holding.timer.cancel()
            holding.timer = call_at(holding.lease_end, self._lease_over, holding)

    async def locked(self) -> bool:
        """Whether anyone holds the lock now (asks the server)."""
        with _TRANSPORT:
            return bool(await self._client.exists(self._key))

    async def owned(self) -> bool:
        """Whether this holder's token is the current one on the server (asks it).

        Looks at the calling task's holding, or else the object's current
        one; False without a round trip when there is none or it was lost.
        """
        holding = self._holding_to_release()
        if holding is None or holding.ended or holding.lost:
            return False
        with _TRANSPORT:
            value = await self._client.get(self._key)
        return value is not None and value in (holding.token, holding.token.encode())

    # -- async with --------------------------------------------------------------------
