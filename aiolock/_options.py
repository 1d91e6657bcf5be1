"""The options every primitive has, checked once and handed to the engine as one object.

Each primitive keeps its own keyword signature (its documentation lists
them), checks what is its own (the client, the name, ``ttl``, its lease's
options), builds its lease, and then passes these ten to :meth:`Options.of`,
which checks them in one place, in the same order for every primitive, and
returns the immutable object the engine (:class:`~aiolock._leaselock.LeaseLock`)
reads. A ``ReadWriteLock`` checks them once for both of its sides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

from . import backoff as _backoff
from ._checks import check_bool, check_callback, check_max_hold, check_timeout
from ._identity import check_identity

__all__ = ["Options"]

#: The default backoff policy: exponential with full jitter (one object, checked once).
DEFAULT_BACKOFF: Final = _backoff.exponential()


class Options(NamedTuple):
    """The shared options of a primitive, checked (a named tuple: immutable, made in one call).

    Attributes:
        ttl: the lease asked of the server, in seconds (checked by the primitive).
        timeout: how long ``acquire()`` waits by default (``None``: forever).
        blocking: ``False`` makes ``acquire()`` try once by default.
        backoff: the checked backoff policy (the default one when none was given).
        auto_renew: renew each holding every ``ttl/3`` while held.
        on_lost: called with the lock object when a holding is lost, or None.
        cancel_on_lost: cancel the body of ``async with`` when its holding is lost.
        reentrant: the holding task may acquire again (nested holdings).
        max_hold: the longest one holding may last, in seconds (``None``: no cap).
        identity: how holdings and waiters are named to others (``None``: each
            acquiring task's ``host:pid:task-name``).
    """

    ttl: float
    timeout: float | None
    blocking: bool
    backoff: _backoff.Backoff
    auto_renew: bool
    on_lost: Callable[[Any], object] | None
    cancel_on_lost: bool
    reentrant: bool
    max_hold: float | None
    identity: str | None = None

    @classmethod
    def of(
        cls,
        *,
        ttl: float,
        timeout: float | None,
        blocking: bool,
        backoff: _backoff.Backoff | Callable[[int], float] | None,
        auto_renew: bool,
        on_lost: Callable[[Any], object] | None,
        cancel_on_lost: bool,
        reentrant: bool,
        max_hold: float | None,
        identity: str | None = None,
    ) -> Options:
        """Check the options (``ttl`` comes checked) and return them as one object.

        Raises:
            TypeError: an option of the wrong kind, named.
            ValueError: an option out of its range, named.
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
        checked_timeout = None if timeout is None else check_timeout(timeout)
        policy = DEFAULT_BACKOFF if backoff is None else _backoff._coerce(backoff)
        if on_lost is not None:
            check_callback("on_lost", on_lost)
        return tuple.__new__(
            cls,
            (
                ttl,
                checked_timeout,
                blocking,
                policy,
                auto_renew,
                on_lost,
                cancel_on_lost,
                reentrant,
                check_max_hold(max_hold, ttl),
                None if identity is None else check_identity(identity),
            ),
        )
