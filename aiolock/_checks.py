"""Argument checks shared by every primitive, and the one seconds-to-milliseconds rule.

Each check names the argument and the value it refused, as the public
contract asks (docs/design.md): ``TypeError`` for a value of the wrong kind,
``ValueError`` for one out of range.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any, Final, NoReturn, TypeVar, final

from redis.asyncio import Redis, RedisCluster

from ._types import Client

__all__ = [
    "LONG_TTL",
    "MAX_MS",
    "MAX_SECONDS",
    "REFUSED_OPTIONS",
    "UNSET",
    "Unset",
    "check_bool",
    "check_callback",
    "check_client",
    "check_max_hold",
    "check_refused",
    "check_seconds",
    "check_timeout",
    "check_ttl",
    "refuse_redis_py_extend",
    "shared",
    "to_ms",
    "too_long",
    "warn_long_ttl",
]


@final
class Unset:
    """The type of the "argument not given" marker."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


#: Stands for an argument that was not given (where ``None`` has a meaning of its own).
UNSET: Final = Unset()

#: The longest duration aiolock sends to the server, in milliseconds: 10**15 ms
#: (10**12 s, about 31,700 years). Every duration that reaches the server as
#: ``PX``, ``PEXPIRE`` or ``WAIT`` milliseconds (a lease ``ttl``, ``replica_timeout``)
#: must be at most :data:`MAX_SECONDS`, checked when the lock is made; backoff
#: delays are held to the same limit when the policy is made or a delay is drawn
#: (they do not reach the server: a queued waiter's entry lives ``min(ttl, 2 s)``
#: whatever its pause; but a delay longer than any lease is a mistake all the same). The server
#: refuses a ``PX`` when ``now_ms + PX`` overflows a signed 64-bit integer (about
#: 9.2e18 ms; valkey 8.1 says "invalid expire time"); this limit is far below
#: that, and below 2**53 even with the queue's slack added to a lease, so every
#: count of milliseconds is exact in a float and in the scripts' Lua numbers. A
#: round number, so that it reads well in messages.
MAX_MS: Final = 10**15

#: :data:`MAX_MS` in seconds: the largest ``ttl`` (or other duration sent to the server).
MAX_SECONDS: Final = MAX_MS / 1000


def too_long(name: str, value: object) -> str:
    """The message for a duration above :data:`MAX_SECONDS`: names it, the value and the limit."""
    return (
        f"{name} must be at most {MAX_SECONDS:g} s ({MAX_MS:.0e} ms, the longest duration "
        f"aiolock takes), got {value!r}"
    )


#: The numbers :func:`shared` hands out, by type and value (``1`` and ``1.0`` apart).
_SHARED: dict[tuple[type, float], Any] = {}
#: How many distinct values :func:`shared` keeps before it starts afresh.
_SHARED_MOST: Final = 1024

_Number = TypeVar("_Number", int, float)


def shared(number: _Number) -> _Number:
    """``number`` as one object for every equal value kept long (a pid, a lease in ms).

    An int beyond 256 is an object of its own, 28 to 32 bytes, and a float
    24: ten thousand holdings each keeping their own copy of the same few
    numbers pay for it.
    """
    key = (number.__class__, number)
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) >= _SHARED_MOST:
            _SHARED.clear()
        found = _SHARED[key] = number
    shared_number: _Number = found
    return shared_number


def to_ms(seconds: float) -> int:
    """A lease in whole milliseconds for the wire, rounded up (never shorter than counted).

    The holder counts ``seconds`` from when it sent the command; rounding down
    (``int(1.005 * 1000)`` is 1004) would let the server expire the key before
    the holder's own lease end. A float's last-bit error is not rounded up.
    """
    return math.ceil(seconds * 1000 - 1e-6)


def check_seconds(name: str, value: object, *, allow_none: bool = False) -> float | None:
    """Check that ``value`` is a number of seconds (not a bool, not NaN); return it as a float."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        allowed = "None or a number of seconds" if allow_none else "a number of seconds"
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return seconds


def check_timeout(value: object) -> float | None:
    """Check a ``timeout``: ``None`` (or infinity) waits forever, else seconds >= 0.

    No upper bound: a timeout never reaches the server. It only sets a deadline
    on the local monotonic clock; asyncio caps each of its own waits (the
    selector never sleeps more than a day at once), and what a waiter keeps on
    the server (its queue entry) lives ``min(ttl, 2 s)`` at a time, whatever
    the deadline. So a finite timeout of any size waits that long and no
    more, like ``None``.
    """
    if value.__class__ is float and 0 <= value < math.inf:  # the common case, at once
        return value
    timeout = check_seconds("timeout", value, allow_none=True)
    if timeout is None or timeout == math.inf:
        return None
    if timeout < 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {value!r}")
    return timeout


#: A ``ttl`` longer than this (one day) is taken, with a ``UserWarning`` once per process:
#: ``ttl`` is in seconds, and ``ttl=100000`` meant as milliseconds is a 28-hour lease.
LONG_TTL: Final = 86_400.0

#: Whether :func:`warn_long_ttl` has warned in this process (it warns once).
_long_ttl_warned = False

#: The folder of aiolock's own modules: a warning points at the first frame outside it.
_HERE: Final = os.path.dirname(os.path.abspath(__file__))


def warn_long_ttl(ttl: float, name: str = "ttl") -> None:
    """Warn, once per process, that a ``ttl`` above :data:`LONG_TTL` is in seconds.

    A lease that long outlives a crashed holder by as much: most often it is a
    number of milliseconds given as seconds. Taken all the same (a lease of days
    can be meant); the warning points at the caller's line, outside aiolock.
    """
    global _long_ttl_warned
    if ttl <= LONG_TTL or _long_ttl_warned:
        return
    _long_ttl_warned = True
    hours = ttl / 3600
    length = f"{hours:.1f} hours" if hours < 48 else f"{hours / 24:.1f} days"
    level, frame = 1, sys._getframe(0)
    while frame.f_back is not None and os.path.dirname(frame.f_code.co_filename) == _HERE:
        frame, level = frame.f_back, level + 1
    shown = f"{int(ttl)}" if ttl.is_integer() else repr(ttl)
    warnings.warn(
        f"{name}={shown} is in seconds: a lease of {length} (a crashed holder keeps the lock "
        f"that long); for milliseconds pass {name}={ttl / 1000!r} (aiolock warns once per "
        f"process about a {name} above {LONG_TTL:g} s)",
        UserWarning,
        stacklevel=level,
    )


def check_ttl(value: object, name: str = "ttl", *, least: float = 0.001) -> float:
    """Check a lease: seconds >= ``least`` (1 ms), at most :data:`MAX_SECONDS`, never NaN.

    A ``ttl`` above :data:`LONG_TTL` is taken with a warning, once per process
    (:func:`warn_long_ttl`).
    """
    if value.__class__ is float and least <= value <= LONG_TTL:  # the common case, at once
        return value
    ttl = check_seconds(name, value)
    assert ttl is not None  # noqa: S101 - allow_none is False
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if ttl < least:
        raise ValueError(
            f"{name} must be at least {least:g} s"
            f"{' (1 ms on the wire)' if least == 0.001 else ''}, got {value!r}"
        )
    if ttl > MAX_SECONDS:
        raise ValueError(too_long(name, value))
    if name == "ttl":
        warn_long_ttl(ttl)
    return ttl


def check_max_hold(value: object, ttl: float) -> float | None:
    """Check a ``max_hold``: ``None`` (no cap) or finite seconds >= ``ttl``."""
    if value is None:
        return None
    cap = check_seconds("max_hold", value)
    assert cap is not None  # noqa: S101 - allow_none is False
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"max_hold must be None or a finite number of seconds > 0, got {value!r}")
    if cap < ttl:
        raise ValueError(
            f"max_hold must be at least ttl ({ttl!r} s): the first lease alone lasts ttl, "
            f"got {value!r}"
        )
    return cap


def check_bool(name: str, value: object) -> bool:
    """Check that ``value`` is True or False."""
    if value is not True and value is not False:
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_callback(name: str, value: object) -> None:
    """Check that ``value`` is None or callable."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable or None, got {value!r}")


def check_client(client: object, name: str = "client") -> Client:
    """Check that ``client`` is a ``redis.asyncio`` client (a plain one or a cluster)."""
    if isinstance(client, (Redis, RedisCluster)):
        return client
    kind = f"{type(client).__module__}.{type(client).__qualname__}"
    hint = ""
    if kind.startswith("redis.") and not kind.startswith("redis.asyncio"):
        hint = " (a synchronous client: use redis.asyncio.Redis instead)"
    raise TypeError(
        f"{name} must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, got {kind}{hint}"
    )


#: The options of ``AsyncLock`` that the other primitives do not take, and why not.
REFUSED_OPTIONS: Final = {
    "reentrant": "each acquisition is a holding of its own, one per acquire()",
    "fencing": "its holders hold at the same time, so no order of holders exists to fence",
    "replicas": "replica acknowledgement is only for AsyncLock",
    "replica_timeout": "replica acknowledgement is only for AsyncLock",
    "replica_fsync": "replica acknowledgement is only for AsyncLock",
}


def check_refused(primitive: str, refused: Mapping[str, object]) -> None:
    """Raise a ``TypeError`` naming the first keyword ``primitive`` does not take, and why."""
    for option in refused:
        why = REFUSED_OPTIONS.get(option)
        if why is None:
            raise TypeError(f"{primitive}() got an unexpected keyword argument {option!r}")
        raise TypeError(f"{primitive} does not take {option}: {why}")


def refuse_redis_py_extend(
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
