"""What a lock object tells about its holdings: the log, the observers, ``on_lost``, the body.

:class:`Reporter` is a base of the engine (:class:`~aiolock._leaselock.LeaseLock`),
under :class:`~aiolock._watch.Watch`, which decides when a holding is lost
or ends; this class says so. A loss is logged (a warning), told to the
observers (:mod:`aiolock._observe`) and to ``on_lost`` (a coroutine it
returns runs as a task the release waits for), and, with
``cancel_on_lost=True``, cancels the body of the ``async with`` that holds
it: each body runs in a cancel scope of its own, opened at ``__aenter__``
and closed at ``__aexit__``. A holding released by force
(``aiolock release --force``) is reported with the forcer's name, read
from the mark the forced release leaves (:meth:`Reporter._why_gone`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, cast

import anyio
from redis.exceptions import RedisError

from ._exceptions import LockError
from ._holding import Holding, Holdings
from ._identity import identity_of
from ._lease import CLEANUP_BOUND, Call, Lease
from ._observe import EventKind, LockEvent, emit, observers
from ._types import Primitive

__all__ = ["Reporter"]

logger = logging.getLogger("aiolock")


class Reporter(Holdings):
    """Tells what happens to a lock object's holdings (see the module)."""

    __slots__ = ("_lease", "_name", "_on_lost", "_scopes")

    _name: str
    _lease: Lease
    _on_lost: Callable[[Any], object] | None
    #: The cancel scopes of ``async with`` bodies, per task (``cancel_on_lost`` only).
    _scopes: dict[asyncio.Task[Any], list[anyio.CancelScope | None]] | None

    # -- a loss --------------------------------------------------------------------------

    def _cancel_body(self, holding: Holding) -> None:
        """Cancel the body of ``async with`` that holds ``holding`` (``cancel_on_lost``)."""
        if self._scopes is not None and holding.task is not None:
            for scope in self._scopes.get(holding.task, ()):
                if scope is not None:
                    scope.cancel()
                    break

    async def _why_gone(self, token: str) -> str | None:
        """The reason "released by force by …" if a forced release marked ``token``; else None.

        Asked on the loss path only, bounded; a server that fails or does not
        answer leaves the reason as it was.
        """
        try:
            async with asyncio.timeout(CLEANUP_BOUND):
                forcer = await self._lease.forced_by(token)
        except (RedisError, OSError, TimeoutError, LockError):
            return None
        return None if forcer is None else f"released by force by {forcer}"

    def _report_loss(self, holding: Holding, reason: str) -> None:
        """Flag ``holding`` lost, log it, tell the observers, and run ``on_lost``."""
        if not (holding.lose(reason) or holding.lost_at_release(reason)):
            return  # (reported already)
        self._tell_loss(holding, reason)

    def _tell_loss(self, holding: Holding, reason: str) -> None:
        """Log the loss of ``holding``, tell the observers, and run ``on_lost``."""
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

    # -- the body of `async with` (cancel_on_lost) -------------------------------------

    def _enter_scope(self, task: asyncio.Task[Any], holding: Holding) -> None:
        """Open the cancel scope of ``task``'s body (its outermost holding only)."""
        if self._scopes is None:
            return
        scope: anyio.CancelScope | None = None
        if holding.depth == 1:
            scope = anyio.CancelScope()
            scope.__enter__()
        self._scopes.setdefault(task, []).append(scope)

    def _exit_scope(
        self,
        task: asyncio.Task[Any],
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Close ``task``'s innermost body scope: whether it swallowed a loss's cancellation."""
        if self._scopes is None:
            return False
        stack = self._scopes.get(task)
        scope = stack.pop() if stack else None
        if stack is not None and not stack:
            del self._scopes[task]
        return scope is not None and bool(scope.__exit__(exc_type, exc, tb))

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
        token: str | None = None,
    ) -> None:
        """Tell the observers (see :mod:`aiolock._observe`), if there are any.

        ``token`` is the call's, for an event without a holding.
        """
        if not observers:
            return
        held = None
        fence = None
        if holding is not None:
            token = holding.token
            fence = holding.fence
            if kind in ("released", "lost"):
                held = time.monotonic() - holding.acquired_at
        emit(
            LockEvent(
                kind,
                cast("Primitive", self),  # (a LeaseLock: the only class built on this one)
                self._name,
                waited=waited,
                contended=contended,
                held=held,
                fence=fence,
                reason=reason,
                error=error,
                identity=None if token is None else identity_of(token),
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
            token=call.token,
        )

    def _renewed(self, holding: Holding, error: BaseException | None) -> None:
        """The watchdog's report of one renewal: done (None) or failed (the error)."""
        if error is None:
            self._event("renewed", holding)
        else:
            self._event("renewal_failed", holding, error=error)
