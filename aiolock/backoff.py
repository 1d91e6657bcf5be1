"""Backoff policies: how long a waiter sleeps between attempts.

A policy is a reusable, immutable description; each acquisition asks it for a
fresh iterator of delays (``policy.delays()``), so a stateful policy such as
:func:`decorrelated` is safe to share between locks and tasks. Delays are
seconds (``float``); ``0`` means "just yield to the event loop".

aiolock sleeps with :func:`anyio.sleep` and never sleeps past the remaining
timeout, nor much past the current holder's remaining lease (``PTTL``). With
release notifications on (the default), a waiter also wakes as soon as the
holder releases; the policy then only bounds how long a waiter trusts the
notification before it tries again.

The five retry strategies of the article 「分布式」实现分布式锁的正确姿势 (its
"seckill" load test, which ``benchmarks.seckill`` reproduces) map to: spin then
yield and yield only: :func:`spin`; yield then sleep 200 ms after 600 ms:
``yield_then_sleep(0.6, 0.2)``; sleep 200 ms: ``constant(0.2)``; sleep 2 s:
``constant(2.0)``.

A plain callable ``attempt -> seconds`` (attempt counts from 1) is accepted
wherever a policy is, and wrapped with :func:`from_callable`.

A policy paces the waiters that poll: those without release notifications
(``notify=False``, a user without channel rights, a pub/sub connection that
is down) and ``Redlock``'s. A notified waiter in the queue on the server
waits for its grant and draws no delay. No delay may exceed
:data:`aiolock._checks.MAX_SECONDS` (10**12 s), the longest duration aiolock
takes: the factories check their parameters against it, and the delays of a
user policy are checked as they are drawn.
"""

from __future__ import annotations

import abc
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, final

from ._checks import MAX_SECONDS, too_long

__all__ = [
    "Backoff",
    "constant",
    "decorrelated",
    "exponential",
    "from_callable",
    "linear",
    "spin",
    "yield_then_sleep",
]

Jitter = Literal["none", "full", "equal"]

#: How many delays of a user-supplied policy are checked when a lock is made.
_PROBE = 16


def _seconds(name: str, value: object, *, positive: bool = False, bounded: bool = True) -> float:
    """Check that ``value`` is a finite, non-negative number of seconds.

    With ``bounded`` (for what becomes a delay), it must also be at most
    :data:`~aiolock._checks.MAX_SECONDS`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        need = "a finite number > 0" if positive else "a finite number >= 0"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    if bounded and seconds > MAX_SECONDS:
        raise ValueError(too_long(name, value))
    return seconds


def _check_delay(value: object, *, source: str = "backoff") -> float:
    """Validate one delay produced by a policy; return it as a float.

    Raises:
        TypeError: the delay is not a number.
        ValueError: the delay is negative, NaN, infinite, or longer than the
            longest duration aiolock takes (:data:`~aiolock._checks.MAX_SECONDS`).
    """
    if value.__class__ is float and 0 <= value <= MAX_SECONDS:  # the common case, at once
        return value
    return _seconds(f"{source} delay", value)


class Backoff(abc.ABC):
    """A backoff policy: a factory of delay iterators, one per acquisition.

    Subclass it and implement :meth:`delays` to write your own policy; the
    iterator may be infinite (the usual case) or finite, in which case its
    last delay repeats.
    """

    @abc.abstractmethod
    def delays(self) -> Iterator[float]:
        """Return a fresh iterator of delays in seconds, for one acquisition."""


@final
@dataclass(frozen=True)
class _Constant(Backoff):
    delay: float

    def delays(self) -> Iterator[float]:
        delay = self.delay
        while True:
            yield delay


@final
@dataclass(frozen=True)
class _Linear(Backoff):
    step: float
    cap: float

    def delays(self) -> Iterator[float]:
        attempt = 1
        while True:
            yield min(self.cap, self.step * attempt)
            attempt += 1


@final
@dataclass(frozen=True)
class _Exponential(Backoff):
    base: float
    factor: float
    cap: float
    jitter: Jitter

    def delays(self) -> Iterator[float]:
        delay = self.base
        uniform = random.uniform
        while True:
            if self.jitter == "full":
                yield uniform(0.0, delay)
            elif self.jitter == "equal":
                yield delay / 2 + uniform(0.0, delay / 2)
            else:
                yield delay
            delay = min(self.cap, delay * self.factor)


@final
@dataclass(frozen=True)
class _Decorrelated(Backoff):
    base: float
    cap: float

    def delays(self) -> Iterator[float]:
        previous = self.base
        uniform = random.uniform
        while True:
            previous = min(self.cap, uniform(self.base, previous * 3))
            yield previous


@final
@dataclass(frozen=True)
class _YieldThenSleep(Backoff):
    window: float
    interval: float

    def delays(self) -> Iterator[float]:
        started = time.monotonic()
        while time.monotonic() - started < self.window:
            yield 0.0
        while True:
            yield self.interval


@final
@dataclass(frozen=True)
class _FromCallable(Backoff):
    function: Callable[[int], float]

    def delays(self) -> Iterator[float]:
        attempt = 1
        while True:
            yield _check_delay(self.function(attempt), source="backoff callable")
            attempt += 1


def constant(delay: float) -> Backoff:
    """Sleep the same ``delay`` seconds between attempts.

    ``constant(0.2)`` and ``constant(2.0)`` are the "sleep 200 ms" and "sleep
    2 s" strategies of the seckill article (see the module docstring).

    Raises:
        ValueError: ``delay`` is negative, not finite, or above ``MAX_SECONDS`` (10**12 s).
    """
    return _Constant(_seconds("delay", delay))


def linear(step: float = 0.01, cap: float = 1.0) -> Backoff:
    """Sleep ``step``, ``2*step``, ``3*step``, ... seconds, never more than ``cap``.

    Raises:
        ValueError: ``step`` or ``cap`` is negative, not finite, or above
            ``MAX_SECONDS`` (10**12 s).
    """
    return _Linear(_seconds("step", step), _seconds("cap", cap))


def exponential(
    base: float = 0.005,
    factor: float = 2.0,
    cap: float = 0.5,
    jitter: Jitter = "full",
) -> Backoff:
    """Sleep ``base * factor**n`` seconds (capped at ``cap``), with jitter.

    Args:
        base: the first delay, before jitter.
        factor: growth per attempt, at least 1.
        cap: the largest delay, before jitter.
        jitter: ``"none"`` (exact delays), ``"full"`` (uniform in
            ``[0, delay]``) or ``"equal"`` (uniform in ``[delay/2, delay]``).

    Raises:
        ValueError: a number is negative or not finite, ``base`` or ``cap`` is
            above ``MAX_SECONDS`` (10**12 s), ``factor < 1``, or ``jitter`` is
            not one of the three names.
    """
    base_s = _seconds("base", base)
    cap_s = _seconds("cap", cap)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise TypeError(f"factor must be a number, got {factor!r}")
    if not math.isfinite(factor) or factor < 1:
        raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
    if jitter not in ("none", "full", "equal"):
        raise ValueError(f"jitter must be 'none', 'full' or 'equal', got {jitter!r}")
    return _Exponential(min(base_s, cap_s), float(factor), cap_s, jitter)


def decorrelated(base: float = 0.005, cap: float = 0.5) -> Backoff:
    """Decorrelated jitter: each delay is uniform in ``[base, 3 * previous]``, capped.

    Each acquisition gets its own state, so one policy object may be shared.

    Raises:
        ValueError: ``base`` is not > 0, ``cap`` is below ``base`` or above
            ``MAX_SECONDS`` (10**12 s).
    """
    base_s = _seconds("base", base, positive=True)
    cap_s = _seconds("cap", cap)
    if cap_s < base_s:
        raise ValueError(f"cap must be >= base ({base_s!r}), got {cap!r}")
    return _Decorrelated(base_s, cap_s)


def spin() -> Backoff:
    """Retry at once, only yielding to the event loop between attempts.

    The seckill article's "spin" and "yield only" strategies (see the module
    docstring): lowest latency, highest load on Redis. Useful as a baseline,
    rarely in production.
    """
    return _Constant(0.0)


def yield_then_sleep(window: float = 0.6, interval: float = 0.2) -> Backoff:
    """Spin (delay 0) for ``window`` seconds of waiting, then sleep ``interval`` each time.

    ``yield_then_sleep(0.6, 0.2)`` is the seckill article's second strategy (see
    the module docstring).

    Raises:
        ValueError: ``window`` or ``interval`` is negative or not finite, or
            ``interval`` is above ``MAX_SECONDS`` (10**12 s).
    """
    # The window only bounds local spinning (its delays are 0): it never reaches the server.
    return _YieldThenSleep(
        _seconds("window", window, bounded=False), _seconds("interval", interval)
    )


def from_callable(function: Callable[[int], float]) -> Backoff:
    """Wrap a plain ``attempt -> seconds`` callable (attempt counts from 1).

    Raises:
        TypeError: ``function`` is not callable.
    """
    if not callable(function):
        raise TypeError(f"backoff must be a Backoff policy or a callable, got {function!r}")
    return _FromCallable(function)


def _coerce(value: object) -> Backoff:
    """Turn the ``backoff=`` argument of a lock into a checked policy.

    A :class:`Backoff` is taken as it is; a callable is wrapped. The first
    delays of either are computed once here, so a policy that yields a
    negative, NaN or non-numeric delay fails when the lock is made.

    Raises:
        TypeError: ``value`` is neither a policy nor a callable, or a delay is
            not a number.
        ValueError: a delay is negative, NaN, infinite, or above ``MAX_SECONDS``.
    """
    policy = value if isinstance(value, Backoff) else from_callable(value)  # type: ignore[arg-type]
    if not isinstance(policy, (_Constant, _Linear, _Exponential, _Decorrelated, _YieldThenSleep)):
        iterator = policy.delays()
        for _, delay in zip(range(_PROBE), iterator, strict=False):
            try:
                _check_delay(delay)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"backoff={value!r} yields a bad delay: {exc}") from None
    return policy
