"""What ``AsyncLock`` and ``Redlock`` share: holdings per task, loss reports, ``async with``.

A lock keeps its holdings per task (``_by_task``), watches each lease with a
timer or a renewal task, and reports a loss the same way whatever server(s)
it runs on. The subclasses supply how to acquire, release, end a holding and
declare it lost; this base keeps the rest in one place.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, cast

import anyio
from redis.exceptions import RedisError

from ._exceptions import AcquireTimeout, LockError, LockLostError, LockNotOwnedError
from ._observe import EventKind, LockEvent, emit, observing
from ._renewal import Holding
from ._timers import call_at

if TYPE_CHECKING:
    from ._lock import AsyncLock
    from ._redlock import Redlock

__all__ = ["Contention", "HoldingLock", "current_task"]

logger = logging.getLogger("aiolock")


class _Unset:
    """The type of the "argument not given" marker."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Final = _Unset()


def _check_seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        allowed = "None or a number of seconds" if allow_none else "a number of seconds"
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return seconds


def _check_timeout(value: object) -> float | None:
    timeout = _check_seconds("timeout", value, allow_none=True)
    if timeout is None or timeout == math.inf:
        return None
    if timeout < 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {value!r}")
    return timeout


def current_task() -> asyncio.Task[Any]:
    """The running task (aiolock is used from inside tasks only)."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - only outside a task, which asyncio forbids anyway
        raise RuntimeError("aiolock must be used from inside an asyncio task")
    return task


class Contention:
    """What one ``acquire()`` call saw: whether someone else had the lock first.

    Set when the caller queued behind another task of its process, or when an
    attempt found another holder's key (not when an attempt merely failed:
    an error, a late reply, replicas that did not acknowledge).
    """

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


class HoldingLock:
    """The base of the lock classes: per-task holdings, loss reports, ``async with``."""

    __slots__ = ()

    if TYPE_CHECKING:
        _name: str
        _ttl: float
        _timeout: float | None
        _blocking: bool
        _cancel_on_lost: bool
        _reentrant: bool
        _on_lost: Callable[[Any], object] | None
        _by_task: dict[asyncio.Task[Any], Holding]
        _current: Holding | None
        _scopes: dict[asyncio.Task[Any], list[anyio.CancelScope | None]]

        async def acquire(self) -> bool: ...
        async def release(self) -> None: ...
        def _declare_lost(self, holding: Holding, reason: str) -> None: ...
        def _end(self, holding: Holding) -> None: ...
        def _pass_baton(self, holding: Holding) -> None: ...
        async def _settle(self, holding: Holding) -> None: ...
        async def _take(
            self,
            task: asyncio.Task[Any],
            started: float,
            deadline: float | None,
            contention: Contention,
        ) -> Holding | None: ...

    @property
    def name(self) -> str:
        """The lock's name, as given."""
        return self._name

    @property
    def ttl(self) -> float:
        """The lease in seconds given to each acquisition."""
        return self._ttl

    @property
    def timeout(self) -> float | None:
        """How long :meth:`acquire` waits by default (``None``: forever)."""
        return self._timeout

    async def _acquire(
        self,
        blocking: bool | None,
        timeout: float | _Unset | None,  # noqa: ASYNC109 - acquire()'s, of the public contract
    ) -> bool:
        """What ``acquire()`` does: check, count a re-entry, or ``_take`` and report it."""
        if blocking is None:
            blocking = self._blocking
        elif not isinstance(blocking, bool):
            raise TypeError(f"blocking must be True, False or None, got {blocking!r}")
        if isinstance(timeout, _Unset):
            wait = self._timeout
        else:
            if not blocking:
                raise ValueError("timeout cannot be given with blocking=False")
            wait = _check_timeout(timeout)
        task = current_task()
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
        contention = Contention()
        try:
            holding = await self._take(task, started, deadline, contention)
        except BaseException as exc:
            self._gave_up(started, contention, exc)
            raise
        if holding is None:
            self._gave_up(started, contention, None)
            return False
        self._event(
            "acquired", holding, waited=time.monotonic() - started, contended=contention.seen
        )
        return True

    def _lease_over(self, holding: Holding) -> None:
        holding.timer = None
        if time.monotonic() < holding.lease_end:  # extended meanwhile
            holding.timer = call_at(holding.lease_end, self._lease_over, holding)
            return
        reason = (
            "its owner task ended without releasing it and the lease ran out"
            if holding.task.done()
            else "the lease ran out (auto_renew is off)"
        )
        self._declare_lost(holding, reason)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """The owning task ended while holding: stop renewing, let the lease run out."""
        holding = self._by_task.pop(task, None)
        if holding is None or holding.ended or holding.lost:
            return
        self._stop_watching(holding)
        holding.timer = call_at(holding.lease_end, self._lease_over, holding)

    def _stop_watching(self, holding: Holding) -> None:
        if holding.timer is not None:
            holding.timer.cancel()
            holding.timer = None
        renewal = holding.renewal
        if renewal is not None and renewal is not asyncio.current_task():
            renewal.cancel()

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
        if not observing():
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
                cast("AsyncLock | Redlock", self),
                self._name,
                waited=waited,
                contended=contended,
                held=held,
                fence=fence,
                reason=reason,
                error=error,
            )
        )

    def _gave_up(self, started: float, contention: Contention, error: BaseException | None) -> None:
        """Report an ``acquire()`` that did not get the lock: it returned False, or raised."""
        self._event(
            "not_acquired",
            None,
            waited=time.monotonic() - started,
            contended=contention.seen,
            error=error,
        )

    def _renewed(self, holding: Holding, error: BaseException | None) -> None:
        """The watchdog's report of one renewal: done (None) or failed (the error)."""
        if error is None:
            self._event("renewed", holding)
        else:
            self._event("renewal_failed", holding, error=error)

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
                    holding.callbacks.append(asyncio.ensure_future(self._run_callback(result)))

    async def _run_callback(self, awaitable: Any) -> None:
        try:
            await awaitable
        except Exception:
            logger.exception("on_lost callback of lock %r raised", self._name)

    def _holding_to_release(self) -> Holding | None:
        task = asyncio.current_task()
        mine = self._by_task.get(task) if task is not None else None
        return mine if mine is not None else self._current

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise AcquireTimeout(
                f"could not acquire lock {self._name!r} within {self._timeout} s"
                if self._blocking
                else f"lock {self._name!r} is held by someone else (blocking=False)"
            )
        if self._cancel_on_lost:
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
        task = current_task()
        cancelled_by_loss = False
        if self._cancel_on_lost:
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
            await self.release()
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
