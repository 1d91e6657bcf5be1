"""Backoff policies (docs/design.md): sequences, freshness, argument checks, properties.

Pure tests: no server. Each policy is a factory of delay iterators; these tests
read the iterators directly.
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiolock import backoff
from aiolock.backoff import Backoff

NAN = float("nan")
INF = float("inf")

#: Hypothesis keeps no example database on disk: these are pure, fast properties.
PROPERTY = settings(max_examples=200, deadline=None, database=None)


def take(policy: Backoff, n: int) -> list[float]:
    """The first ``n`` delays of a fresh iterator of ``policy``."""
    return list(itertools.islice(policy.delays(), n))


def names(arg: str, value: object) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``repr(value)`` as a token."""
    shown = re.escape(repr(value))
    return rf"(?s)(?=.*\b{re.escape(arg)}\b)(?=.*(?<![\w.]){shown}(?![\w.]))"


# --- exact sequences of the deterministic policies ------------------------------------------------


def test_constant_yields_the_same_delay_forever() -> None:
    """constant(d) yields d at every attempt."""
    assert take(backoff.constant(0.25), 50) == [0.25] * 50


def test_constant_accepts_an_int_and_yields_floats() -> None:
    """constant(1) yields the float 1.0 (times are float seconds everywhere)."""
    delays = take(backoff.constant(1), 3)
    assert delays == [1.0, 1.0, 1.0]
    assert all(type(d) is float for d in delays)


def test_linear_grows_by_step_until_the_cap() -> None:
    """linear(step, cap) yields step, 2*step, 3*step, ... and then cap for ever."""
    assert take(backoff.linear(0.5, 2.0), 7) == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0]


def test_linear_with_a_cap_below_step_yields_the_cap() -> None:
    """linear(step, cap) never exceeds cap, even at the first attempt."""
    assert take(backoff.linear(1.0, 0.25), 3) == [0.25, 0.25, 0.25]


def test_linear_defaults() -> None:
    """linear() defaults to step 0.01 s and cap 1.0 s."""
    delays = take(backoff.linear(), 200)
    assert delays[:3] == [0.01, 0.02, 0.01 * 3]
    assert delays[-1] == 1.0
    assert max(delays) == 1.0


def test_exponential_without_jitter_is_exact() -> None:
    """exponential(base, factor, cap, 'none') yields base*factor**n, capped at cap."""
    policy = backoff.exponential(0.01, 2.0, 0.05, jitter="none")
    assert take(policy, 6) == [0.01, 0.02, 0.04, 0.05, 0.05, 0.05]


def test_exponential_factor_three() -> None:
    """exponential grows by the given factor, not a fixed doubling."""
    policy = backoff.exponential(1.0, 3.0, 100.0, jitter="none")
    assert take(policy, 6) == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]


def test_exponential_factor_one_is_constant() -> None:
    """exponential with factor 1 yields base at every attempt."""
    policy = backoff.exponential(0.1, 1.0, 5.0, jitter="none")
    assert take(policy, 5) == [0.1] * 5


def test_exponential_base_above_cap_starts_at_the_cap() -> None:
    """exponential never yields more than cap, even when base is above it."""
    policy = backoff.exponential(1.0, 2.0, 0.5, jitter="none")
    assert take(policy, 3) == [0.5, 0.5, 0.5]


def test_spin_yields_zero_forever() -> None:
    """spin() yields 0 (just yield to the loop) at every attempt."""
    assert take(backoff.spin(), 100) == [0.0] * 100


def test_from_callable_calls_with_attempts_counting_from_one() -> None:
    """from_callable(f) yields f(1), f(2), ... as floats."""
    seen: list[int] = []

    def policy(attempt: int) -> float:
        seen.append(attempt)
        return attempt / 10

    assert take(backoff.from_callable(policy), 4) == [0.1, 0.2, 0.3, 0.4]
    assert seen == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (-1.0, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        ("x", TypeError),
        (None, TypeError),
    ],
)
def test_from_callable_rejects_a_bad_delay_when_it_is_produced(
    result: object, error: type[Exception]
) -> None:
    """A delay from a wrapped callable is checked: a bad one raises, naming it."""
    iterator = backoff.from_callable(lambda attempt: result).delays()  # type: ignore[arg-type,return-value]
    with pytest.raises(error, match=names("delay", result)):
        next(iterator)


# --- jittered policies: bounds --------------------------------------------------------------------


def _jittered_samples(jitter: Literal["full", "equal"], floor: float) -> list[float]:
    """200 draws of exponential(0.01, 2, 0.08, jitter): each delay in [floor*ceiling, ceiling].

    Returns the last delay of each draw (at the cap, 0.08).
    """
    policy = backoff.exponential(0.01, 2.0, 0.08, jitter=jitter)
    ceilings = [0.01, 0.02, 0.04, 0.08, 0.08, 0.08]
    samples = [take(policy, 6) for _ in range(200)]
    for delays in samples:
        for delay, ceiling in zip(delays, ceilings, strict=True):
            assert ceiling * floor <= delay <= ceiling
    return [d[-1] for d in samples]


def test_exponential_full_jitter_is_uniform_below_the_delay() -> None:
    """jitter='full': the n-th delay is in [0, min(cap, base*factor**n)], and it varies."""
    late = _jittered_samples("full", floor=0.0)
    assert min(late) < 0.08 / 2 < max(late), "full jitter should spread over [0, delay]"


def test_exponential_equal_jitter_keeps_half_the_delay() -> None:
    """jitter='equal': the n-th delay is in [delay/2, delay], and it varies."""
    late = _jittered_samples("equal", floor=0.5)
    assert len(set(late)) > 1, "equal jitter should vary"
    assert min(late) < 0.08 * 0.75 < max(late)


def test_exponential_default_jitter_is_full() -> None:
    """exponential() defaults: base 5 ms, factor 2, cap 0.5 s, full jitter."""
    signature = inspect.signature(backoff.exponential)
    assert signature.parameters["base"].default == 0.005
    assert signature.parameters["factor"].default == 2.0
    assert signature.parameters["cap"].default == 0.5
    assert signature.parameters["jitter"].default == "full"
    firsts = [take(backoff.exponential(), 1)[0] for _ in range(200)]
    assert all(0.0 <= d <= 0.005 for d in firsts)
    assert len(set(firsts)) > 1


def test_decorrelated_stays_between_base_and_three_times_the_previous() -> None:
    """decorrelated(base, cap): each delay is in [base, min(cap, 3 * previous)]."""
    base, cap = 0.01, 1.0
    for _ in range(50):
        previous = base
        for delay in take(backoff.decorrelated(base, cap), 50):
            assert base <= delay <= min(cap, 3 * previous * (1 + 1e-12))
            previous = delay


def test_decorrelated_reaches_the_cap_and_stays_below_it() -> None:
    """decorrelated grows towards cap (it is not stuck near base) and never exceeds it."""
    delays = take(backoff.decorrelated(0.001, 0.05), 2000)
    assert max(delays) == 0.05
    assert all(0.001 <= d <= 0.05 for d in delays)


def test_decorrelated_with_cap_equal_to_base_is_constant() -> None:
    """decorrelated(b, b) can only yield b."""
    assert take(backoff.decorrelated(0.1, 0.1), 20) == [0.1] * 20


# --- yield_then_sleep and the real clock ----------------------------------------------------------


def test_yield_then_sleep_yields_zero_in_the_window_then_the_interval() -> None:
    """yield_then_sleep(0.05, 0.2): 0 while under 50 ms of waiting, 0.2 after."""
    iterator = backoff.yield_then_sleep(0.05, 0.2).delays()
    before = time.monotonic()  # the window starts at the first delay, not earlier
    assert next(iterator) == 0.0
    started_by = time.monotonic()  # ... and not later
    zeros = 1
    while True:
        delay = next(iterator)
        if time.monotonic() - before >= 0.04:
            break
        assert delay == 0.0
        zeros += 1
    assert zeros > 1
    time.sleep(max(0.0, 0.06 - (time.monotonic() - started_by)))
    assert time.monotonic() - started_by >= 0.06
    assert [next(iterator) for _ in range(5)] == [0.2] * 5


def test_yield_then_sleep_window_starts_with_each_iterator() -> None:
    """A fresh iterator of yield_then_sleep starts its own window (0 again)."""
    policy = backoff.yield_then_sleep(0.05, 0.2)
    first = policy.delays()
    next(first)
    time.sleep(0.07)
    assert next(first) == 0.2
    before = time.monotonic()
    second_delay = next(policy.delays())
    if time.monotonic() - before < 0.05:  # the new window has certainly not run out
        assert second_delay == 0.0
    assert next(first) == 0.2, "the first iterator is not reset by the second"


def test_yield_then_sleep_zero_window_sleeps_at_once() -> None:
    """yield_then_sleep(0, interval) never spins: the interval from the first delay."""
    assert take(backoff.yield_then_sleep(0.0, 0.3), 3) == [0.3, 0.3, 0.3]


# --- freshness: one iterator per acquisition ---------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (backoff.constant(0.2), [0.2, 0.2, 0.2]),
        (backoff.linear(0.1, 10.0), [0.1, 0.2, 0.1 * 3]),
        (backoff.exponential(0.01, 2.0, 1.0, jitter="none"), [0.01, 0.02, 0.04]),
        (backoff.spin(), [0.0, 0.0, 0.0]),
        (backoff.yield_then_sleep(30.0, 0.2), [0.0, 0.0, 0.0]),
        (backoff.from_callable(lambda attempt: attempt * 0.5), [0.5, 1.0, 1.5]),
    ],
    ids=["constant", "linear", "exponential", "spin", "yield_then_sleep", "from_callable"],
)
def test_every_delays_call_starts_from_the_beginning(
    policy: Backoff, expected: list[float]
) -> None:
    """delays() returns a new iterator each call: advancing one does not advance another."""
    first = policy.delays()
    assert first is not policy.delays()
    advanced = [next(first) for _ in range(20)]
    assert take(policy, 3) == expected
    assert take(policy, 20) == advanced
    assert next(first) == take(policy, 21)[-1], "the first iterator kept its own position"


def test_sharing_a_decorrelated_policy_does_not_couple_iterators() -> None:
    """A decorrelated policy shared by two acquisitions keeps separate state per iterator."""
    base, cap = 0.001, 100.0
    policy = backoff.decorrelated(base, cap)
    first = policy.delays()
    previous = next(first)
    for _ in range(100_000):
        if previous > 1.0:
            break
        previous = next(first)
    assert previous > 1.0, "the first iterator never grew (test precondition)"
    for _ in range(20):
        # A fresh iterator starts from base, whatever the other one reached.
        assert base <= next(policy.delays()) <= 3 * base * (1 + 1e-12)
    second = policy.delays()
    second_previous = base
    for _ in range(50):
        delay = next(first)
        assert base <= delay <= min(cap, 3 * previous * (1 + 1e-12))
        previous = delay
        delay = next(second)
        assert base <= delay <= min(cap, 3 * second_previous * (1 + 1e-12))
        second_previous = delay


# --- parameter checks -----------------------------------------------------------------------------


BAD_SECONDS: list[tuple[object, type[Exception]]] = [
    (-1, ValueError),
    (-0.5, ValueError),
    (NAN, ValueError),
    (INF, ValueError),
    (-INF, ValueError),
    ("1", TypeError),
    (None, TypeError),
    (True, TypeError),
]


def _bad_parameter_cases() -> Iterator[tuple[str, Callable[[object], Backoff], str, object, type]]:
    makers: dict[str, tuple[str, Callable[[object], Backoff]]] = {
        "constant.delay": ("delay", lambda v: backoff.constant(v)),  # type: ignore[arg-type]
        "linear.step": ("step", lambda v: backoff.linear(step=v)),  # type: ignore[arg-type]
        "linear.cap": ("cap", lambda v: backoff.linear(cap=v)),  # type: ignore[arg-type]
        "exponential.base": ("base", lambda v: backoff.exponential(base=v)),  # type: ignore[arg-type]
        "exponential.cap": ("cap", lambda v: backoff.exponential(cap=v)),  # type: ignore[arg-type]
        "decorrelated.base": ("base", lambda v: backoff.decorrelated(base=v)),  # type: ignore[arg-type]
        "decorrelated.cap": ("cap", lambda v: backoff.decorrelated(base=0.001, cap=v)),  # type: ignore[arg-type]
        "yield_then_sleep.window": (
            "window",
            lambda v: backoff.yield_then_sleep(window=v),  # type: ignore[arg-type]
        ),
        "yield_then_sleep.interval": (
            "interval",
            lambda v: backoff.yield_then_sleep(interval=v),  # type: ignore[arg-type]
        ),
    }
    for case, (param, make) in makers.items():
        for value, error in BAD_SECONDS:
            yield case, make, param, value, error


@pytest.mark.parametrize(
    ("case", "make", "param", "value", "error"),
    list(_bad_parameter_cases()),
    ids=[f"{c[0]}={c[3]!r}" for c in _bad_parameter_cases()],
)
def test_policy_constructors_reject_bad_seconds(
    case: str, make: Callable[[object], Backoff], param: str, value: object, error: type[Exception]
) -> None:
    """A negative, non-finite or non-numeric number of seconds is rejected, naming the parameter."""
    with pytest.raises(error, match=names(param, value)):
        make(value)


@pytest.mark.parametrize(
    ("kwargs", "param", "value", "error"),
    [
        ({"factor": 0.5}, "factor", 0.5, ValueError),
        ({"factor": 0}, "factor", 0, ValueError),
        ({"factor": -2.0}, "factor", -2.0, ValueError),
        ({"factor": NAN}, "factor", NAN, ValueError),
        ({"factor": INF}, "factor", INF, ValueError),
        ({"factor": "2"}, "factor", "2", TypeError),
        ({"factor": True}, "factor", True, TypeError),
        ({"factor": None}, "factor", None, TypeError),
        ({"jitter": "half"}, "jitter", "half", ValueError),
        ({"jitter": "Full"}, "jitter", "Full", ValueError),
        ({"jitter": None}, "jitter", None, (TypeError, ValueError)),
        ({"jitter": True}, "jitter", True, (TypeError, ValueError)),
    ],
)
def test_exponential_rejects_bad_factor_and_jitter(
    kwargs: dict[str, object],
    param: str,
    value: object,
    error: type[Exception] | tuple[type[Exception], ...],
) -> None:
    """exponential() rejects factor < 1 or non-finite, and an unknown jitter, naming them."""
    with pytest.raises(error, match=names(param, value)):
        backoff.exponential(**kwargs)  # type: ignore[arg-type]


def test_decorrelated_rejects_zero_base() -> None:
    """decorrelated() needs base > 0 (a zero base would never grow)."""
    with pytest.raises(ValueError, match=names("base", 0)):
        backoff.decorrelated(base=0)


def test_decorrelated_rejects_cap_below_base() -> None:
    """decorrelated() rejects cap < base, naming cap and its value."""
    with pytest.raises(ValueError, match=names("cap", 0.05)):
        backoff.decorrelated(base=0.1, cap=0.05)


@pytest.mark.parametrize("value", [42, "fast", None, 0.5])
def test_from_callable_rejects_a_non_callable(value: object) -> None:
    """from_callable() of something that is not callable is a TypeError showing the value."""
    with pytest.raises(TypeError, match=names("callable", value)):
        backoff.from_callable(value)  # type: ignore[arg-type]


def test_backoff_is_abstract() -> None:
    """Backoff cannot be instantiated without delays(); a subclass with it can."""
    with pytest.raises(TypeError):
        Backoff()  # type: ignore[abstract]

    class Halves(Backoff):
        def delays(self) -> Iterator[float]:
            return iter([0.5, 0.25])

    assert take(Halves(), 5) == [0.5, 0.25]


def test_policies_are_immutable() -> None:
    """A built-in policy is an immutable description (safe to share): nothing can be set on it."""
    policies = [
        backoff.constant(0.2),
        backoff.linear(0.1, 1.0),
        backoff.exponential(0.1, 2.0, 1.0, jitter="none"),
        backoff.decorrelated(0.1, 0.1),
        backoff.spin(),
        backoff.yield_then_sleep(0.0, 0.2),
        backoff.from_callable(lambda attempt: 0.2),
    ]
    for policy in policies:
        before = take(policy, 3)
        for field in [*vars(policy), "delay", "cap"]:
            with pytest.raises(AttributeError):
                setattr(policy, field, 5.0)
        assert take(policy, 3) == before


# --- properties over any valid parameters ---------------------------------------------------------

seconds = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-9, max_value=1e6, allow_nan=False, allow_infinity=False)
factors = st.floats(min_value=1.0, max_value=1e3, allow_nan=False, allow_infinity=False)
jitters = st.sampled_from(["none", "full", "equal"])


def well_formed(delays: list[float]) -> bool:
    """Every delay is a finite, non-negative float."""
    return all(type(d) is float and math.isfinite(d) and d >= 0 for d in delays)


@PROPERTY
@given(delay=seconds)
def test_property_constant(delay: float) -> None:
    """For any valid delay, constant yields exactly it, finite and >= 0."""
    delays = take(backoff.constant(delay), 50)
    assert well_formed(delays)
    assert delays == [delay] * 50


@PROPERTY
@given(step=seconds, cap=seconds)
def test_property_linear(step: float, cap: float) -> None:
    """For any valid step and cap, linear's first 50 delays are finite, >= 0, <= cap, monotone."""
    delays = take(backoff.linear(step, cap), 50)
    assert well_formed(delays)
    assert all(d <= cap for d in delays)
    assert delays == sorted(delays)


@PROPERTY
@given(base=seconds, factor=factors, cap=seconds, jitter=jitters)
def test_property_exponential(base: float, factor: float, cap: float, jitter: str) -> None:
    """For any valid parameters, exponential's first 50 delays are finite, >= 0 and <= cap."""
    delays = take(backoff.exponential(base, factor, cap, jitter), 50)  # type: ignore[arg-type]
    assert well_formed(delays)
    assert all(d <= cap for d in delays)
    if jitter == "none":
        assert delays == sorted(delays)


@PROPERTY
@given(base=positive, extra=seconds)
def test_property_decorrelated(base: float, extra: float) -> None:
    """For any valid base <= cap, decorrelated's first 50 delays are in [base, cap]."""
    cap = base + extra
    delays = take(backoff.decorrelated(base, cap), 50)
    assert well_formed(delays)
    assert all(base <= d <= cap for d in delays)


@PROPERTY
@given(window=st.floats(min_value=0.0, max_value=1e-3), interval=seconds)
def test_property_yield_then_sleep(window: float, interval: float) -> None:
    """For any valid window and interval, yield_then_sleep yields only 0 or the interval."""
    delays = take(backoff.yield_then_sleep(window, interval), 50)
    assert well_formed(delays)
    assert set(delays) <= {0.0, interval}


@PROPERTY
@given(values=st.lists(seconds, min_size=1, max_size=50))
def test_property_from_callable_passes_valid_delays_through(values: list[float]) -> None:
    """from_callable yields exactly what a valid callable returns."""
    delays = take(backoff.from_callable(lambda attempt: values[(attempt - 1) % len(values)]), 50)
    assert well_formed(delays)
    assert delays == [values[i % len(values)] for i in range(50)]


# --- the seckill article's strategies (module docstring) ------------------------------------------


def test_the_article_mapping_is_documented() -> None:
    """The module docstring maps the seckill article's five strategies to these policies."""
    doc = backoff.__doc__ or ""
    for expression in ("spin", "yield_then_sleep(0.6, 0.2)", "constant(0.2)", "constant(2.0)"):
        assert expression in doc


def test_article_strategies_sleep_200ms_and_2s() -> None:
    """The article's No3 and No4: constant(0.2) and constant(2.0) sleep 200 ms and 2 s each time."""
    assert take(backoff.constant(0.2), 5) == [0.2] * 5
    assert take(backoff.constant(2.0), 5) == [2.0] * 5


def test_article_strategies_spin_and_yield_only() -> None:
    """The article's No1 and No5: spin() only yields to the loop."""
    assert take(backoff.spin(), 10) == [0.0] * 10


def test_article_strategy_yield_then_sleep_after_600ms() -> None:
    """Its No2: yield_then_sleep(0.6, 0.2) spins for 600 ms of waiting, then sleeps 200 ms."""
    iterator = backoff.yield_then_sleep(0.6, 0.2).delays()
    before = time.monotonic()
    assert next(iterator) == 0.0
    started_by = time.monotonic()
    time.sleep(0.3)
    delay = next(iterator)
    if time.monotonic() - before < 0.6:  # still inside the window
        assert delay == 0.0
    time.sleep(max(0.0, 0.61 - (time.monotonic() - started_by)))
    assert [next(iterator) for _ in range(3)] == [0.2] * 3


def test_article_strategy_defaults_of_yield_then_sleep() -> None:
    """yield_then_sleep() defaults to the article's window 0.6 s and interval 0.2 s."""
    signature = inspect.signature(backoff.yield_then_sleep)
    assert signature.parameters["window"].default == 0.6
    assert signature.parameters["interval"].default == 0.2
