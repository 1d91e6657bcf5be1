"""The engine every primitive is made of: the public contract of a lock over a lease.

A primitive checks its own options, builds its lease (what it does on the
server, :mod:`aiolock._lease`) and its :class:`~aiolock._options.Options`,
and hands both to :class:`LeaseLock`, which does the rest the same way for
all of them: ``acquire()`` (arguments, re-entry, the deadline; the wait
loop is :mod:`aiolock._contend`), ``release()`` (with the hand-over to the
next local task, :func:`~aiolock._queue.hand_over`), ``extend()``,
``owned()``, ``locked()``, ``statistics()`` and ``async with``. Its
holdings, which holding a call acts on, and their life are its bases'
(:mod:`aiolock._holding`, :mod:`aiolock._watch`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from os import urandom
from time import time_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Never, NoReturn, Self
from urllib.parse import unquote

from redis.exceptions import RedisError

from ._checks import UNSET, Unset, check_timeout, refuse_redis_py_extend
from ._contend import obtain
from ._exceptions import AcquireTimeout, LockError, LockLostError, LockNotOwnedError
from ._holding import no_task
from ._identity import DEFAULTS, default_encoded, encode_identity
from ._lease import Call, Lease
from ._observe import observers
from ._options import Options
from ._watch import Watch

__all__ = ["LeaseLock", "LockStatistics"]

logger = logging.getLogger("aiolock")


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """What ``statistics()`` returns: a lock as this process sees it.

    Attributes:
        held: a task of this process holds the lock through this client.
        owner: that task, or None (also when the task that acquired has
            ended: the holding goes on, detached, and any task may release it).
        tasks_waiting: how many tasks of this process wait for the lock
            through this client (the first of them may be talking to the
            server; the others wait in the local queue behind it).
    """

    held: bool
    owner: asyncio.Task[Any] | None
    tasks_waiting: int


class LeaseLock(Watch):
    """A primitive's holdings over its lease: the engine under every lock class."""

    __slots__ = (
        "_backoff",
        "_blocking",
        "_cancel_on_lost",
        "_reentrant",
        "_tail",
        "_timeout",
        "_ttl",
    )

    #: The marks of its tokens beyond the fence's (see :func:`aiolock._identity.mint`).
    _MARKS: ClassVar[str] = ""

    def __init__(self, lease: Lease, options: Options, /) -> None:
        """Take the lease (with the name) and the options, both checked by the primitive."""
        super().__init__()
        self._name = lease.name
        self._lease = lease
        (
            self._ttl,
            self._timeout,
            self._blocking,
            self._backoff,
            self._auto_renew,
            self._on_lost,
            self._cancel_on_lost,
            self._reentrant,
            self._max_hold,
            identity,
        ) = options
        self._scopes = {} if self._cancel_on_lost else None
        # What follows the random bits and the time in each token (see acquire): the
        # marks, then ':' and the identity given, encoded; the marks alone (no ':') for
        # the default identity, which is the acquiring task's. (One slot: a held lock
        # costs its bytes.)
        marks = self._MARKS + ("f" if lease.fencing else "")
        self._tail = marks if identity is None else f"{marks}:{encode_identity(identity)}"

    # -- read-only facts ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The lock's name, as given."""
        return self._name

    @property
    def key(self) -> str:
        """The lock's key: ``<prefix>{<name>}`` (on every node of a Redlock)."""
        return self._lease.key

    @property
    def identity(self) -> str | None:
        """The identity given (``identity=``), or None: each holder's default then.

        The default is ``host:pid:task-name`` of the task that acquires. The
        identity is how :func:`aiolock.inspect` and ``aiolock status`` name
        the holder or the waiter.
        """
        _, colon, encoded = self._tail.partition(":")
        return unquote(encoded) if colon else None

    @property
    def ttl(self) -> float:
        """The lease in seconds given to each acquisition."""
        return self._ttl

    @property
    def timeout(self) -> float | None:
        """How long :meth:`acquire` waits by default (``None``: forever)."""
        return self._timeout

    @property
    def max_hold(self) -> float | None:
        """The longest one holding may last, in seconds (``None``: no cap).

        Renewal and :meth:`extend` never carry the lease past it; when it
        runs out the holding is lost (reported as any loss) and the key is
        freed for the next holder.
        """
        return self._max_hold

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

    def statistics(self) -> LockStatistics:
        """Describe the lock as this process sees it, without asking the server.

        The view is that of the lock's local queue: every lock object with
        the same client and name shares it. Where every acquisition waits in
        a queue of its own (``fair=True``; a semaphore of several permits;
        a read-write lock's sides), ``held`` and ``owner`` are this object's
        (its latest holding) and ``tasks_waiting`` counts the acquisitions in
        progress through objects of this client with the same options.
        Holders in other processes (or on other client objects) are not
        seen; :meth:`locked` asks the server.
        """
        queueing = self._lease.queueing
        waiting = None if queueing is None else queueing.per_call_waiting()
        if waiting is not None:
            current = self._current
            return LockStatistics(
                held=current is not None or bool(self._by_task),
                owner=current.task if current is not None else None,
                tasks_waiting=waiting,
            )
        queue = self._lease.existing_queue()
        if queue is None:
            return LockStatistics(held=False, owner=None, tasks_waiting=0)
        contending = queue.owner is not None and queue.holder is None
        return LockStatistics(
            held=queue.holder is not None,
            owner=queue.holder if isinstance(queue.holder, asyncio.Task) else None,
            tasks_waiting=queue.waiting + int(contending),
        )

    async def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | Unset | None = UNSET,  # noqa: ASYNC109 - a name of the public contract
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
            redis.exceptions.RedisError: the server failed (after the
                cleanup that leaves no key behind).
        """
        if blocking is None:
            blocking = self._blocking
        elif blocking is not True and blocking is not False:
            raise TypeError(f"blocking must be True, False or None, got {blocking!r}")
        if timeout is UNSET:
            wait = self._timeout
        else:
            if not blocking:
                raise ValueError("timeout cannot be given with blocking=False")
            wait = check_timeout(timeout)
        task = asyncio.current_task() or no_task()
        if self._detached:
            self._latest_detached()  # (forgets those of a closed loop, with a warning)
        mine = self._by_task.get(task)
        if mine is not None:
            if mine.lost:
                raise LockLostError(
                    f"lock {self._name!r} was lost by this task ({mine.loss_reason}); "
                    "release() it before acquiring again"
                )
            if not self._reentrant:
                raise LockError(
                    f"lock {self._name!r} is already held by this task "
                    "(make it with reentrant=True to acquire it again)"
                )
            mine.depth += 1
            return True

        started = time.monotonic()
        if not blocking:
            deadline: float | None = started
        elif wait is None:
            deadline = None
        else:
            deadline = started + wait
        # The call's token (see aiolock._identity.mint), minted now: its time is what
        # aiolock.inspect reports as acquired_at. 16 random bytes and the time in ms
        # (6 bytes) go to hex in one go.
        head = (urandom(16) + (time_ns() // 1_000_000).to_bytes(6)).hex()
        tail = self._tail
        if ":" in tail:  # an identity given
            call = Call(head + tail)
        else:  # the task's default, made at its first acquisition
            encoded = DEFAULTS.get(task.get_name()) or default_encoded(task)
            call = Call(f"{head}{tail}:{encoded}")
        call.renews = self._auto_renew
        try:
            won = await obtain(
                self._lease,
                task,
                self._backoff,
                deadline,
                deadline is None or deadline > started,
                call,
            )
        except BaseException as exc:
            if observers:
                self._gave_up(started, call, exc)
            raise
        if won is None:
            if observers:
                self._gave_up(started, call, None)
            return False
        holding = self._hold(task, won)
        if observers:
            self._event(
                "acquired", holding, waited=time.monotonic() - started, contended=call.contended
            )
        return True

    async def release(self) -> None:
        """Release the lock: delete the key if it is still ours and let the next holder in.

        Releases the calling task's holding (see :meth:`extend`), or else (a
        hand-off) the object's current holding. With ``reentrant=True`` only
        the last of nested releases gives the lock up. Completes even if
        cancelled.

        Raises:
            LockNotOwnedError: nothing is held.
            LockLostError: the holding was lost (declared before, without a
                round trip; or found now: the lease had run out, or the key
                was no longer ours; then ``on_lost`` runs too). Another
                holder's key is never touched.
            redis.exceptions.RedisError: the server failed, or did not answer
                before the lease ended; the key expires with its lease.
        """
        await self._release(asyncio.current_task() or no_task())

    async def extend(
        self, *additional_time: Never, ttl: float | None = None, **redis_py: Never
    ) -> bool:
        """Reset the lease of the calling task's holding to ``ttl`` seconds from now.

        ``ttl`` defaults to the lock's; a value given here also becomes the
        lease that later renewals of this holding use. With ``max_hold`` the
        lease is cut to end at the cap. The holding is the calling task's,
        one of a task it was started from, or one whose acquiring task has
        ended; any other task (one that merely shares the lock object) gets
        :class:`~aiolock.LockNotOwnedError`, and the holder's lease is left
        alone.

        The lease argument is keyword-only: redis-py's ``extend(10)`` *adds*
        10 s to what is left, aiolock's ``extend(ttl=10.0)`` resets the lease
        to 10 s, so a positional argument (``additional_time``) and
        redis-py's ``replace_ttl`` are a ``TypeError`` that says so.

        Returns:
            True (as redis-py's ``extend()``); every failure raises.

        Raises:
            LockNotOwnedError: the calling task holds nothing here.
            LockLostError: the holding was lost: declared before, its lease
                (or its ``max_hold``) ran out, or the server says the key is
                no longer ours (then ``on_lost`` runs too); another holder's
                key is never touched.
            TypeError: a positional argument, ``replace_ttl=``, or ``ttl``
                not a number.
            ValueError: ``ttl`` is not a lease the lock can ask for.
            redis.exceptions.RedisError: the server failed; the holding keeps
                its previous lease.
        """
        if additional_time or redis_py:
            refuse_redis_py_extend(additional_time, redis_py)
        new_ttl = self._ttl if ttl is None else self._lease.check_ttl(ttl)
        holding = self._holding_of_task()
        if holding is None or holding.ended:
            raise LockNotOwnedError(self._not_held_by_caller())
        await self._extend_holding(holding, new_ttl)
        return True

    def _not_held_by_caller(self) -> str:
        """Why ``extend()`` from the calling task finds nothing to extend."""
        if self._current is None or self._current.ended:
            return f"lock {self._name!r} is not held"
        return (
            f"lock {self._name!r} is not held by this task (another task holds it "
            "through this object: owned() and extend() answer for the task that "
            "acquired; release() may end another task's holding)"
        )

    async def locked(self) -> bool:
        """Whether anyone holds the lock now (asks the server)."""
        return await self._lease.held()

    async def owned(self) -> bool:
        """Whether the calling task holds the lock: its token is the current one (asks the server).

        The calling task's holding is its own, one of a task it was started
        from, or one whose acquiring task has ended (see :meth:`extend`).
        False without a round trip when there is none (even if another task
        holds it through this object), or it was lost, or its lease is over
        by the holder's clock.
        """
        holding = self._holding_of_task()
        if (
            holding is None
            or holding.ended
            or holding.lost
            or time.monotonic() >= holding.lease_end
        ):
            return False
        return await self._lease.holds(holding.token)

    # -- async with --------------------------------------------------------------------

    def _what(self) -> str:
        """What this lock is called in a message: its class."""
        return type(self).__name__

    if not TYPE_CHECKING:  # to a type checker, a plain `with lock:` stays an error

        def __enter__(self) -> NoReturn:
            raise TypeError(
                f"{self._what()} {self._name!r} needs 'async with', not 'with': acquiring it "
                "awaits the server"
            )

        def __exit__(self, *exc_info: object) -> None:  # never reached: __enter__ raised
            raise TypeError(f"{self._what()} {self._name!r}: use 'async with', not 'with'")

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise AcquireTimeout(
                f"could not acquire lock {self._name!r} within {self._timeout} s"
                if self._blocking
                else f"lock {self._name!r} is held by someone else (blocking=False)"
            )
        if self._scopes is not None:
            task = asyncio.current_task() or no_task()
            self._enter_scope(task, self._by_task[task])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task() or no_task()
        # (Only a lock that cancels bodies on a loss has scopes to close.)
        cancelled_by_loss = self._scopes is not None and self._exit_scope(task, exc_type, exc, tb)
        if cancelled_by_loss:
            exc = None
        holding = self._by_task.get(task)
        if holding is None:  # released inside the body, or ended by a hand-off
            if cancelled_by_loss:
                raise LockLostError(f"lock {self._name!r} was lost while held") from None
            return
        if not holding.lost and holding.depth == 1 and time.monotonic() >= holding.lease_end:
            self._declare_lost(holding, "the lease ran out before the body ended")
        if holding.lost:
            self._end(holding)
            holding.pass_baton()
            await self._settle(holding)
            error = LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
            if exc is not None:
                exc.add_note(f"aiolock: {error}")
                return
            raise error from None
        try:
            await self._release(task)
        except LockNotOwnedError as release_error:
            lost = (
                release_error
                if isinstance(release_error, LockLostError)
                else LockLostError(f"lock {self._name!r} was lost while held: {release_error}")
            )
            if exc is not None:
                exc.add_note(f"aiolock: {lost}")
                return
            raise lost from None
        except (RedisError, OSError, RuntimeError) as release_error:
            if exc is not None:
                exc.add_note(f"aiolock: releasing lock {self._name!r} failed: {release_error!r}")
                return
            raise
