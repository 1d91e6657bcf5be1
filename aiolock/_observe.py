"""Observers: a hook that sees every acquisition, release, renewal and loss.

An *observer* is any callable taking one :class:`LockEvent`. Registered with
:func:`add_observer`, it is called synchronously, in the event loop, for
every :class:`~aiolock.AsyncLock` and :class:`~aiolock.Redlock` of the
process. That is enough to back metrics (``aiolock.otel`` does it with
OpenTelemetry), tracing or audit logs. With no observer registered, aiolock
pays one list check per event.

An observer must be quick and must not block: it runs inside the lock's own
code paths. An exception it raises is logged (``aiolock`` logger, ERROR) and
otherwise ignored, so a broken observer never breaks locking.

The ``aiolock`` logger itself writes: ``acquired`` and ``released`` at DEBUG,
renewal failures (retried until the lease ends) and losses at WARNING.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from ._types import Primitive

__all__ = [
    "EventKind",
    "LockEvent",
    "Observer",
    "add_observer",
    "emit",
    "observers",
    "observing",
    "remove_observer",
]

logger = logging.getLogger("aiolock")

EventKind: TypeAlias = Literal[
    "acquired", "not_acquired", "released", "renewed", "renewal_failed", "lost"
]


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One thing that happened to a lock, as an observer sees it.

    Attributes:
        kind: what happened:

            - ``"acquired"``: :meth:`~aiolock.AsyncLock.acquire` got the lock
              (not counting re-entries of a reentrant lock);
            - ``"not_acquired"``: it did not get the lock: it returned False
              (the timeout passed, or ``blocking=False`` found the lock
              held), or it raised (``error`` says what: a cancellation, as by
              ``asyncio.timeout``, or a redis-py error);
            - ``"released"``: a holding was given up by ``release()`` without
              having been lost: the key was deleted (or, when the release
              failed or was cancelled, undone or left to expire with its
              lease);
            - ``"renewed"``: the lease was reset, by the watchdog or by
              :meth:`~aiolock.AsyncLock.extend`;
            - ``"renewal_failed"``: a watchdog renewal raised; it is retried
              until the lease would run out, then the lock is lost;
            - ``"lost"``: the holding was lost while held (``on_lost`` runs
              right after the observers).
        lock: the lock object (an :class:`~aiolock.AsyncLock`, a
            :class:`~aiolock.Redlock`, ...).
        name: the lock's name.
        waited: ``acquired`` and ``not_acquired``: seconds from the call of
            ``acquire()`` to its outcome.
        contended: ``acquired`` and ``not_acquired``: True if someone else
            had the lock first: the caller queued behind another task of its
            process, or an attempt found another holder's key. Attempts that
            failed otherwise (an error, no answer in time, replicas that did
            not acknowledge) do not count.
        held: ``released`` and ``lost``: seconds since the lock was acquired.
        fence: the holding's fencing number (``fencing=True`` only).
        reason: ``lost``: why, in words.
        identity: who holds (or tried to acquire): the identity the holding's
            token carries, as :func:`aiolock.inspect` shows it (the lock's
            ``identity=``, else ``host:pid:task-name`` of the acquiring task).
        error: ``renewal_failed``: the exception the renewal raised;
            ``not_acquired``: the exception ``acquire()`` raised, if it raised.
    """

    kind: EventKind
    lock: Primitive
    name: str
    waited: float | None = None
    contended: bool = False
    held: float | None = None
    fence: int | None = None
    reason: str | None = None
    error: BaseException | None = None
    identity: str | None = None


#: What :func:`add_observer` takes: a callable of one :class:`LockEvent`.
Observer: TypeAlias = Callable[[LockEvent], object]

#: The registered observers (read directly on hot paths: an empty list is falsy).
observers: list[Observer] = []


def add_observer(observer: Observer) -> None:
    """Call ``observer`` with a :class:`LockEvent` for every lock event in this process.

    Observers are called in the order they were added. Adding the same
    observer twice calls it twice.

    Raises:
        TypeError: ``observer`` is not callable.
    """
    if not callable(observer):
        raise TypeError(f"observer must be a callable taking a LockEvent, got {observer!r}")
    observers.append(observer)


def remove_observer(observer: Observer) -> None:
    """Stop calling ``observer`` (one registration of it).

    Raises:
        ValueError: ``observer`` was not added.
    """
    try:
        observers.remove(observer)
    except ValueError:
        raise ValueError(f"observer {observer!r} was not added") from None


def observing() -> bool:
    """Whether any observer is registered (checked before building an event)."""
    return bool(observers)


def emit(event: LockEvent) -> None:
    """Hand ``event`` to every observer; log and swallow what they raise."""
    for observer in tuple(observers):
        try:
            observer(event)
        except Exception:
            logger.exception(
                "observer %r raised on the %s event of lock %r", observer, event.kind, event.name
            )
