"""The life of a holding, for every primitive: acquire, renew, lose, release, ``async with``.

:class:`LeaseLock` is the engine every primitive is made of. A primitive
checks its own options, builds its :class:`~aiolock._lease.Lease` (what it
does on the server) and hands both to this class, which does the rest the
same way for all of them:

* ``acquire()``: arguments, re-entry, the deadline, and the wait loop
  (:mod:`aiolock._contend`);
* the holdings per task (``_by_task``), each watched by a timer or by
  the loop's renewer (:mod:`aiolock._renewal`), and reported lost through
  ``lost``, ``on_lost`` and ``cancel_on_lost``; a holding whose acquiring
  task ended (``_detached``) stays held and renewed until released, lost,
  capped, or unreachable (the lock object garbage-collected: ``__del__``);
* which holding a call acts on (:meth:`LeaseLock._holding_of_task`): the
  calling task's own, else one of a task it was started from (it inherits
  that task's context: :data:`_ANCESTORS`), else a detached one;
* ``release()``, with the hand-over to the next local task where the lease
  can swap tokens in one script; ``extend()``, ``owned()``, ``locked()``;
* ``async with``, and the observers' events (:mod:`aiolock._observe`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Never, NoReturn, Self

import anyio
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import backoff as _backoff
from ._cancel import finish, honour_cancellation
from ._checks import UNSET, Unset, check_bool, check_callback, check_max_hold, check_timeout
from ._contend import Won, obtain
from ._exceptions import AcquireTimeout, LockError, LockLostError, LockNotOwnedError
from ._lease import GRACE, Call, Lease
from ._observe import EventKind, LockEvent, emit, observers
from ._queue import LOCAL_RUN, Entry, Grant, LocalQueue, Turn, Undo
from ._renewal import Holding, never_released, renewer_for
from ._timers import Cutoff, Timer, call_at
from ._wire import Ahead, Wire

__all__ = ["LeaseLock", "LockStatistics", "current_task"]

logger = logging.getLogger("aiolock")

#: The default backoff policy: exponential with full jitter (one object, checked once).
_DEFAULT_BACKOFF: Final = _backoff.exponential()

#: The tasks of this context that acquired a lock, outermost first. A task inherits its
#: creator's context (``asyncio.create_task``, a task group, Starlette's ``call_next``),
#: so a task started by a holder shares the holder's holdings for ``owned()``,
#: ``extend()`` and ``release()`` (not for ``acquire()``: it waits like any other task).
_ANCESTORS: contextvars.ContextVar[tuple[asyncio.Task[Any], ...]] = contextvars.ContextVar(
    "aiolock_ancestors", default=()
)


def _renewal_due(lock: weakref.ref[LeaseLock], holding: Holding) -> None:
    """A holding's first renewal is due (its lock held weakly: a dropped one is not kept)."""
    owner = lock()
    if owner is not None:
        owner._start_renewal(holding)


def _lease_due(lock: weakref.ref[LeaseLock], holding: Holding) -> None:
    """A holding's lease end is due (``auto_renew=False``); its lock held weakly."""
    owner = lock()
    if owner is not None:
        owner._lease_over(holding)


def _refuse_redis_py_extend(
    positional: tuple[object, ...], keywords: Mapping[str, object]
) -> NoReturn:
    """The ``TypeError`` for redis-py's ``extend(additional_time, replace_ttl=...)``."""
    unknown = sorted(set(keywords) - {"additional_time", "replace_ttl"})
    if unknown:
        raise TypeError(f"extend() got an unexpected keyword argument {unknown[0]!r}")
    given = positional[0] if positional else keywords.get("additional_time")
    if positional or "additional_time" in keywords:
        raise TypeError(
            f"extend() takes no additional_time (got {given!r}): redis-py's "
            "extend(additional_time) adds that many seconds to the lease, aiolock's "
            "extend(ttl=...) resets the lease to ttl seconds from now (later renewals "
            "use it too); write extend(ttl=seconds)"
        )
    raise TypeError(
        "extend() takes no replace_ttl: aiolock's extend(ttl=...) always replaces the "
        "lease, as redis-py's extend(t, replace_ttl=True) does; write extend(ttl=t)"
    )


def current_task(hint: Holding | None = None) -> asyncio.Task[Any]:
    """The running task (aiolock is used from inside tasks only).

    With a holding at hand (``hint``) made in this thread, the task is
    looked up in the holding's loop, which is cheaper than asking for the
    running loop. If that loop is not running (a second ``asyncio.run``),
    or the holding belongs to another thread, the running loop is asked.
    """
    if hint is not None and hint.thread == threading.get_ident():
        task = asyncio.current_task(hint.loop)
        if task is not None:
            return task
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - only outside a task, which asyncio forbids anyway
        raise RuntimeError("aiolock must be used from inside an asyncio task")
    return task


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


class LeaseLock:
    """A primitive's holdings over its lease: the engine under every lock class."""

    __slots__ = (
        "__weakref__",
        "_auto_renew",
        "_backoff",
        "_blocking",
        "_by_task",
        "_cancel_on_lost",
        "_current",
        "_detached",
        "_last",
        "_lease",
        "_max_hold",
        "_name",
        "_on_lost",
        "_reentrant",
        "_scopes",
        "_timeout",
        "_ttl",
    )

    def __init__(
        self,
        lease: Lease,
        ttl: float,
        timeout: float | None,
        blocking: bool,
        backoff: _backoff.Backoff | Callable[[int], float] | None,
        auto_renew: bool,
        on_lost: Callable[[Any], object] | None,
        cancel_on_lost: bool,
        reentrant: bool,
        max_hold: float | None,
        /,
    ) -> None:
        """Check the options every primitive has, in the order of its signature.

        The lease (with the name) and ``ttl`` come checked by the primitive.
        """
        if not (
            blocking.__class__ is bool
            and auto_renew.__class__ is bool
            and cancel_on_lost.__class__ is bool
            and reentrant.__class__ is bool
        ):
            # Reachable for callers that ignore the annotations (mypy trusts them).
            check_bool("blocking", blocking)  # type: ignore[unreachable]
            check_bool("auto_renew", auto_renew)
            check_bool("cancel_on_lost", cancel_on_lost)
            check_bool("reentrant", reentrant)
        self._name = lease.name
        self._lease = lease
        self._ttl = ttl
        self._timeout = None if timeout is None else check_timeout(timeout)
        self._blocking = blocking
        self._backoff = _DEFAULT_BACKOFF if backoff is None else _backoff._coerce(backoff)
        self._auto_renew = auto_renew
        if on_lost is not None:
            check_callback("on_lost", on_lost)
        self._on_lost = on_lost
        self._cancel_on_lost = cancel_on_lost
        self._reentrant = reentrant
        self._max_hold = check_max_hold(max_hold, ttl)
        self._by_task: dict[asyncio.Task[Any], Holding] = {}
        #: Live holdings whose acquiring task ended, oldest first.
        self._detached: list[Holding] = []
        self._current: Holding | None = None
        self._last: Holding | None = None
        # The cancel scopes of ``async with`` bodies, per task (cancel_on_lost only).
        self._scopes: dict[asyncio.Task[Any], list[anyio.CancelScope | None]] | None = (
            {} if cancel_on_lost else None
        )

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
        waiting = self._lease.per_call_waiting()
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

    def _holding_of_task(self, task: asyncio.Task[Any] | None = None) -> Holding | None:
        """The holding the calling task acts on (``owned()``, ``extend()``), or None.

        Its own; else that of the nearest task it was started from (whose
        context it inherited) that holds; else the latest detached holding
        (one whose acquiring task has ended: anyone may act on it).
        """
        if task is None:
            task = asyncio.current_task()
        by_task = self._by_task
        holding = by_task.get(task) if task is not None else None
        if holding is not None:
            return holding
        for ancestor in reversed(_ANCESTORS.get()):
            holding = by_task.get(ancestor)
            if holding is not None:
                return holding
        return self._latest_detached()

    def _latest_detached(self) -> Holding | None:
        """The latest live holding whose acquiring task ended, or None."""
        detached = self._detached
        while detached:
            holding = detached[-1]
            if holding.live and not holding.loop.is_closed():
                return holding
            detached.pop()
            if holding.live:  # its loop closed while it was held
                never_released(holding, "its event loop was closed while it was held")
        current = self._current
        if current is not None and current.live and (current.task is None or current.task.done()):
            return current  # detached a moment ago: its task's callback has not run yet
        return None

    def _holding_of_caller(self) -> Holding | None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        holding = self._holding_of_task(task) if task is not None else None
        return holding if holding is not None else self._last

    # -- acquire -----------------------------------------------------------------------

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
        task = current_task(self._last)
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
        call = Call()
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

    def _hold(self, task: asyncio.Task[Any], won: Won) -> Holding:
        """Record a new holding of ``task`` and start watching its lease.

        A lock handed over by a local releaser (``won.handed``) continues the
        local run; one taken on the server starts a new one.
        """
        lease = self._lease
        sent = won.sent
        queue = won.queue
        holding = Holding(
            self._name,
            won.token,
            task,
            lease.ttl,
            lease.span if won.span is None else won.span,
            sent,
            won.fence if lease.fencing else None,
            queue,
            lease,
        )
        if self._max_hold is not None:
            holding.hold_end = sent + self._max_hold
        queue.holder = task
        if not won.handed:
            queue.run_started = sent
        self._by_task[task] = holding
        self._current = holding
        self._last = holding
        # Tasks this one starts from now on share its holdings (they inherit the context).
        ancestors = _ANCESTORS.get()
        if task not in ancestors:
            _ANCESTORS.set((*ancestors, task))
        # Its first renewal, or the end of its lease (checked again when due: an
        # attempt's spare timer is due at the first renewal point, maybe earlier). The
        # timer holds the lock weakly: a lock object dropped while held is collected.
        callback = _renewal_due if self._auto_renew else _lease_due
        ref = weakref.ref(self)
        timer = won.timer
        if timer is not None and timer.reuse(callback, ref, holding):
            holding.timer = timer
        else:
            # A grant's first lease is short and counted from before the grant (the
            # heir's latest proof of being queued): renewing it at a third would renew at
            # once whenever that proof is older, so its first renewal comes at two thirds,
            # which still leaves a third of the lease for retries.
            share = 2 / 3 if won.span is not None else 1 / 3
            when = sent + holding.span * share if self._auto_renew else holding.lease_end
            holding.timer = call_at(when, callback, ref, holding, loop=task.get_loop())
        task.add_done_callback(self._task_done)
        if logger.isEnabledFor(logging.DEBUG):  # one call, not two, when it is not
            logger.debug("acquired lock %r (fence %s)", self._name, holding.fence)
        return holding

    # -- watching a holding ------------------------------------------------------------

    def _start_renewal(self, holding: Holding, due: float | None = None) -> None:
        """Hand ``holding`` to its loop's renewer, due at ``due``.

        By default it is due now, or at its next renewal point if an
        ``extend()`` put that later.
        """
        holding.timer = None
        if not holding.live:
            return
        if due is None:
            due = max(time.monotonic(), holding.next_due())
        renewer_for(holding.loop).add(holding, weakref.ref(self), due)

    def _lease_over(self, holding: Holding) -> None:
        holding.timer = None
        if time.monotonic() < holding.lease_end:  # extended meanwhile
            holding.timer = call_at(holding.lease_end, _lease_due, weakref.ref(self), holding)
            return
        if holding.cap_reached(time.monotonic()):
            reason = holding.cap_reason()
        else:
            reason = "the lease ran out (auto_renew is off)"
        self._declare_lost(holding, reason)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """The acquiring task ended while holding: the holding is detached, and goes on.

        It stays held and renewed until it is released (by any task), lost,
        capped, or unreachable (this lock object collected: :meth:`__del__`).
        """
        holding = self._by_task.pop(task, None)
        if holding is None or not holding.live:
            return
        self._detached.append(holding)
        # Keep nothing of the ended task (its coroutine, context and result): thousands
        # of holdings acquired by short tasks would keep thousands of them.
        holding.task = None
        queue = holding.queue
        if queue.owner is task:
            queue.owner = holding
        if queue.holder is task:
            queue.holder = holding
        if not self._by_task:
            self._by_task = {}  # (a dict keeps the table it grew to)
        timer = holding.timer
        if holding.renewer is None and timer is not None and self._auto_renew:
            # It joins the renewer now rather than at its first renewal point: a loop
            # that shuts down cancels tasks, not timers, and the holding must be told.
            timer.cancel()
            self._start_renewal(holding, timer.when)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("lock %r: its acquiring task ended; the holding goes on", self._name)

    def __del__(self) -> None:
        """Nobody can release this lock's holdings any more: say so, and stop renewing them."""
        try:
            holdings = {*self._by_task.values(), *self._detached, self._current}
        except AttributeError:  # made only in part (its __init__ raised)
            return
        for holding in holdings:
            if holding is not None and holding.live:
                # (A warning that -W error turns into an exception is Python's to report
                # here: "Exception ignored in __del__".)
                never_released(holding, "its lock object was garbage-collected while it was held")

    def _stop_watching(self, holding: Holding) -> None:
        if holding.timer is not None:
            holding.timer.cancel()
            holding.timer = None
        renewer = holding.renewer
        if renewer is not None:
            # The renewer's task, if this was its last holding: the release awaits it.
            holding.renewal = renewer.remove(holding)

    def _declare_lost(self, holding: Holding, reason: str) -> None:
        """Mark ``holding`` lost: flag, baton, ``cancel_on_lost``, ``on_lost``."""
        if holding.lost or holding.ended:
            return
        self._stop_watching(holding)
        self._pass_baton(holding)
        if self._scopes is not None and holding.task is not None:
            for scope in self._scopes.get(holding.task, ()):
                if scope is not None:
                    scope.cancel()
                    break
        self._report_loss(holding, reason)

    def _report_loss(self, holding: Holding, reason: str) -> None:
        """Flag ``holding`` lost, log it, tell the observers, and run ``on_lost``."""
        holding.lost = True
        holding.loss_reason = reason
        logger.warning("lost lock %r: %s", self._name, reason)
        self._event("lost", holding, reason=reason)
        if self._on_lost is not None:
            try:
                result = self._on_lost(self)
            except Exception:
                logger.exception("on_lost callback of lock %r raised", self._name)
            else:
                if inspect.isawaitable(result):
                    holding.callbacks += (asyncio.ensure_future(self._run_callback(result)),)

    async def _run_callback(self, awaitable: Any) -> None:
        try:
            await awaitable
        except Exception:
            logger.exception("on_lost callback of lock %r raised", self._name)

    def _pass_baton(self, holding: Holding) -> None:
        """Let the next local waiter contend (once per holding)."""
        if holding.has_baton:
            holding.has_baton = False
            holding.queue.leave()

    def _end(self, holding: Holding) -> None:
        """Forget ``holding`` locally (the server side is the caller's business)."""
        holding.ended = True
        if holding.timer is not None:
            holding.timer.cancel()
            holding.timer = None
        if holding.renewer is not None:
            self._stop_watching(holding)
        task = holding.task
        if task is not None and self._by_task.get(task) is holding:
            del self._by_task[task]
            task.remove_done_callback(self._task_done)
        elif holding in self._detached:
            self._detached.remove(holding)
        if self._current is holding:
            self._current = None

    async def _settle(self, holding: Holding) -> None:
        """Wait for the holding's watchdog and callbacks to finish, even if cancelled meanwhile."""
        me = asyncio.current_task()
        pending = [
            t for t in (holding.renewal, *holding.callbacks) if t is not None and t is not me
        ]
        holding.renewal = None
        holding.callbacks = ()
        if pending:
            await finish(pending)  # shielded: a cancelled release must not return before them

    # -- release / extend / queries ----------------------------------------------------

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
        await self._release(current_task(self._last))

    async def _release(self, task: asyncio.Task[Any]) -> None:
        """What :meth:`release` does, called from ``task``."""
        holding = self._holding_of_task(task) or self._current
        if holding is None:
            raise LockNotOwnedError(f"lock {self._name!r} is not held")
        if holding.depth > 1 and not holding.lost:
            holding.depth -= 1
            return
        baseline = task.cancelling()
        ahead = await self._slot_ahead(holding, task)
        try:
            if holding.ended:  # released meanwhile, by another task sharing the holding
                raise LockNotOwnedError(f"lock {self._name!r} is not held")
            if not holding.lost and time.monotonic() >= holding.lease_end:
                # The loop was blocked past the lease: the watchdog had no chance to run.
                self._declare_lost(holding, "the lease ran out before release")
            # The holding's timer (its first renewal, or its lease end) is due before the
            # release's cut-off: the cut-off reuses it rather than arming a timer of its own.
            spare = holding.timer
            holding.timer = None
            self._end(holding)
        except BaseException:
            if ahead is not None:
                ahead.give_back()  # (never kept by a release that sends nothing)
            raise
        lease = self._lease
        try:
            if holding.lost:
                raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
            entry = holding.queue.reserve() if holding.has_baton else None
            if entry is not None:
                holding.has_baton = False  # reserved for `entry`
                deleted = await self._hand_over(holding, holding.queue, entry, task, spare)
            else:
                deleted = await lease.release(holding.token, holding.lease_end, task, spare)
            if not deleted:
                self._report_loss(holding, f"{lease.gone} at release")
        finally:
            if ahead is not None:
                ahead.give_back()  # (if no command went out on it)
            if spare is not None and not spare.done:
                spare.cancel()
            if holding.has_baton:
                holding.has_baton = False
                holding.queue.leave()
            if observers and not holding.lost:
                # Given up: deleted, or (cancelled, failed) undone or left to its lease.
                self._event("released", holding)
            if holding.renewal is not None or holding.callbacks:
                await self._settle(holding)
        if not deleted:
            raise LockLostError(
                f"lock {self._name!r} was no longer held by this holder at release: "
                f"{lease.gone}; other holders' keys were left alone"
            )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("released lock %r", self._name)
        if task.cancelling() > baseline:
            await honour_cancellation(task, baseline)

    async def _slot_ahead(self, holding: Holding, task: asyncio.Task[Any]) -> Ahead | None:
        """Wait for a slot of the client for the release, the holding renewed meanwhile.

        Behind thousands of other commands of the client (a service releasing
        everything it holds at once), the release waits in the process's line
        with its holding still renewed, so that its lease does not run out in
        line. Cancelled while it waits, the release goes on as it would have
        without it (and is cancelled at its end).
        """
        wire = getattr(self._lease, "wire", None)
        if holding.lost or not isinstance(wire, Wire) or not wire.crowded(holding.loop):
            return None  # (no line: the release goes out at once)
        try:
            return await wire.ahead(task)
        except asyncio.CancelledError:
            return None

    async def _hand_over(
        self,
        holding: Holding,
        queue: LocalQueue,
        entry: Entry,
        task: asyncio.Task[Any],
        spare: Timer | None,
    ) -> bool:
        """Release ``holding`` straight to the reserved local waiter ``entry``.

        Returns whether the key was still ours. Whatever happens, ``entry``
        gets the baton: with the lock (a :class:`Grant`), to contend for it,
        or, when the hand-over was cut off at our lease end and may have run,
        to delete the token it may have been given first (an :class:`Undo`).
        """
        lease = self._lease
        token = os.urandom(16).hex()
        sent = time.monotonic()
        may_yield = sent - queue.run_started >= LOCAL_RUN
        try:
            # Bounded by the releaser's lease, like a plain release.
            with Cutoff(holding.lease_end + GRACE, task, spare) as cutoff:
                reply = await lease.hand_over(holding.token, entry.heir, token, may_yield)
        except BaseException:
            # It may have run: make sure neither token keeps the key, then let the heir contend.
            queue.give(entry, Turn.CONTEND)
            await lease.undo(token)
            await lease.undo(holding.token)
            raise
        if cutoff.expired:
            # It may have run and given the heir's token a fresh lease: the heir takes that
            # back before it contends (or we do, if it gave up meanwhile), so that this
            # release ends by the lease. Our own key has expired by now (its lease is over).
            if not queue.give(entry, Undo(token)):
                await lease.undo(token)
            raise RedisTimeoutError(
                f"releasing lock {self._name!r}: no answer before its lease ended; "
                "the server expires the key by itself"
            )
        if reply is None:
            # This lease cannot hand over: release, then let the heir contend.
            try:
                return await lease.release(holding.token, holding.lease_end, task, None)
            finally:
                queue.give(entry, Turn.CONTEND)
        if reply[0] == 1:
            if not queue.give(entry, Grant(token, sent, reply[1])):
                await lease.undo(token)  # the heir gave up meanwhile
            return True
        # 2: it went to the first waiter of the queue on the server; the heir queues up.
        queue.give(entry, Turn.CONTEND)
        return bool(reply[0])

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
            _refuse_redis_py_extend(additional_time, redis_py)
        lease = self._lease
        new_ttl = self._ttl if ttl is None else lease.check_ttl(ttl)
        holding = self._holding_of_task()
        if holding is None or holding.ended:
            raise LockNotOwnedError(self._not_held_by_caller())
        sent = time.monotonic()
        if not holding.lost:
            if holding.cap_reached(sent):
                self._declare_lost(holding, holding.cap_reason())
            elif sent >= holding.lease_end:
                self._declare_lost(holding, "the lease ran out before extend()")
        if holding.lost:
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        asked = holding.asked(new_ttl, sent)
        span = lease.counted(asked)
        if span <= 0:  # too little of the cap left to count a lease
            self._declare_lost(holding, holding.cap_reason())
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        # No renewal is sent while this extend is in flight. One sent before may still be
        # unanswered: the server may run it after this one, with the lease it asked for;
        # the holder counts the shorter of the two until a renewal after this extend lands.
        holding.extending = True
        flying = holding.flying_end if holding.flight is not None else None
        soon = False
        try:
            extended = await lease.extend(holding.token, asked)
            if extended and holding.live:
                holding.renewed(sent, new_ttl, span, capped=asked < new_ttl)
                if flying is not None and flying < holding.lease_end:
                    holding.lease_end = flying
                    soon = True
        finally:
            holding.extending = False
            if holding.renewer is not None:
                holding.renewer.reschedule(holding, soon=soon)
        if not extended:
            self._declare_lost(holding, f"{lease.gone} at extend()")
            raise LockLostError(
                f"lock {self._name!r} is no longer held by this holder: {lease.gone}; "
                "other holders' keys were left alone"
            )
        if holding.is_lost():  # declared lost while the extend was in flight
            raise LockLostError(f"lock {self._name!r} was lost: {holding.loss_reason}")
        self._event("renewed", holding)
        if not self._auto_renew and holding.timer is not None:
            holding.timer.cancel()
            holding.timer = call_at(holding.lease_end, _lease_due, weakref.ref(self), holding)
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

    # -- observers ---------------------------------------------------------------------

    def _event(
        self,
        kind: EventKind,
        holding: Holding | None,
        *,
        waited: float | None = None,
        contended: bool = False,
        reason: str | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Tell the observers (see :mod:`aiolock._observe`), if there are any."""
        if not observers:
            return
        held = None
        fence = None
        if holding is not None:
            fence = holding.fence
            if kind in ("released", "lost"):
                held = time.monotonic() - holding.acquired_at
        emit(
            LockEvent(
                kind,
                self,
                self._name,
                waited=waited,
                contended=contended,
                held=held,
                fence=fence,
                reason=reason,
                error=error,
            )
        )

    def _gave_up(self, started: float, call: Call, error: BaseException | None) -> None:
        """Report an ``acquire()`` that did not get the lock: it returned False, or raised."""
        self._event(
            "not_acquired",
            None,
            waited=time.monotonic() - started,
            contended=call.contended,
            error=error,
        )

    def _renewed(self, holding: Holding, error: BaseException | None) -> None:
        """The watchdog's report of one renewal: done (None) or failed (the error)."""
        if error is None:
            self._event("renewed", holding)
        else:
            self._event("renewal_failed", holding, error=error)

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
            task = current_task()
            holding = self._by_task[task]
            scope: anyio.CancelScope | None = None
            if holding.depth == 1:
                scope = anyio.CancelScope()
                scope.__enter__()
            self._scopes.setdefault(task, []).append(scope)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = current_task(self._last)
        cancelled_by_loss = False
        if self._scopes is not None:
            stack = self._scopes.get(task)
            scope = stack.pop() if stack else None
            if stack is not None and not stack:
                del self._scopes[task]
            if scope is not None and scope.__exit__(exc_type, exc, tb):
                cancelled_by_loss = True
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
            self._pass_baton(holding)
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
