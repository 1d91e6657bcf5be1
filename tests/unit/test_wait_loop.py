"""The wait loop's rules (``aiolock._contend``): :func:`decide`, :func:`poll_delay`, and the loop.

Pure tests: no server. :func:`decide` and :func:`poll_delay` are pure
functions, checked case by case and by properties (hypothesis). The loop
itself (:func:`obtain` and ``_contend``) runs here over :class:`FakeLease`:
an in-memory stand-in for aiolock's own ``Lease`` protocol (not for Redis)
whose attempts answer from a script, so that each path of the loop (a win,
a release heard, a deadline, no answer, a cancellation) runs without a
server. A fake lease that queues has a :class:`FakeQueueing` part (the
``Queueing`` protocol); one without it takes the path of a lease that does
not queue (Redlock's). How the loop behaves against real servers is the contract suite's
(tests/primitives/test_contract*.py) and the other modules'.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import TimeoutError as RedisTimeoutError

from aiolock import backoff
from aiolock._contend import Won, obtain
from aiolock._decide import (
    Acquired,
    Cancelled,
    GiveUp,
    Notifications,
    Pacing,
    Poll,
    RaiseLate,
    RaiseNoConnection,
    RaiseUnanswered,
    RetryNow,
    Seen,
    Step,
    Subscribe,
    UndoLateWin,
    WaitInQueue,
    decide,
    poll_delay,
    queued_at_once,
    subscribed,
    wins_at_once,
)
from aiolock._lease import NOT_HELD, RETRY, Call, Lease, Queueing, Reply, Unanswered
from aiolock._notify import Subscription
from aiolock._queue import LocalQueue

#: Hypothesis keeps no example database on disk: these are pure, fast properties.
PROPERTY = settings(max_examples=300, deadline=None, database=None)

UNASKED: Final = Notifications.UNASKED
LIVE: Final = Notifications.LIVE
DOWN: Final = Notifications.DOWN

#: An attempt's error that got no verdict (what ``Unanswered.error`` carries).
LATE: Final = RedisTimeoutError("no answer from the server")

#: A failed attempt: someone holds the lock for 500 ms more.
HELD: Final[Reply] = (0, 500)


def seen(**changes: Any) -> Seen:
    """A Seen of a failed attempt (held 500 ms more), before the deadline, with ``changes``.

    The attempt was sent at 100.0 and judged at 100.1; the deadline is 110.0;
    the lease 10 s; not queued; no subscription.
    """
    base = Seen(
        reply=HELD,
        unanswered=None,
        late_since=None,
        cancelled=False,
        sent=100.0,
        now=100.1,
        deadline=110.0,
        span=10.0,
        ttl=10.0,
        queued=False,
        foreign_without_expiry=True,
        notifications=UNASKED,
        no_connection=False,
    )
    return base._replace(**changes)


# -- decide, case by case --------------------------------------------------------------

#: (what the attempt returned and the waiter knew, the step decide gives). Every step
#: appears at least once.
CASES: Final[list[tuple[str, Seen, Step]]] = [
    # A win.
    ("a win within its lease", seen(reply=(1, 0)), Acquired()),
    ("a fenced win", seen(reply=(1, 42)), Acquired()),
    ("a win at the deadline", seen(reply=(1, 0), deadline=100.1), Acquired()),
    ("a win without a deadline", seen(reply=(1, 0), deadline=None), Acquired()),
    ("a win whose lease ran out", seen(reply=(1, 0), now=115.0, deadline=120.0), UndoLateWin()),
    ("a win as its lease ends", seen(reply=(1, 0), now=110.0, deadline=None), UndoLateWin()),
    ("a late win past the deadline", seen(reply=(1, 0), now=111.0), UndoLateWin()),
    # Cancelled while the attempt ran.
    ("cancelled, with a win", seen(reply=(1, 0), cancelled=True), Cancelled(undo=True)),
    ("cancelled, held", seen(cancelled=True), Cancelled(undo=False)),
    ("cancelled, no verdict", seen(reply=None, cancelled=True), Cancelled(undo=False)),
    ("cancelled past the deadline", seen(cancelled=True, now=111.0), Cancelled(undo=False)),
    (
        "cancelled with a late win",
        seen(reply=(1, 0), cancelled=True, now=111.0),
        Cancelled(undo=True),
    ),
    # The deadline.
    ("held at the deadline", seen(now=110.0), GiveUp()),
    ("held past the deadline", seen(now=111.0), GiveUp()),
    ("queued and held past the deadline", seen(now=111.0, queued=True), GiveUp()),
    ("a bare attempt failed at the deadline", seen(reply=(0, RETRY), now=110.0), GiveUp()),
    ("not held by anyone past the deadline", seen(reply=(0, NOT_HELD), now=110.0), GiveUp()),
    ("held, no connection flag", seen(now=111.0, no_connection=True), GiveUp()),
    (
        "no connection of the pool",
        seen(reply=None, now=110.0, no_connection=True),
        RaiseNoConnection(),
    ),
    (
        "no connection, unanswered",
        seen(reply=None, unanswered=LATE, late_since=105.0, now=110.0, no_connection=True),
        RaiseNoConnection(),
    ),
    ("cut off at the deadline", seen(reply=None, now=110.0), RaiseUnanswered(None)),
    (
        "unanswered at the deadline",
        seen(reply=None, unanswered=LATE, late_since=105.0, now=110.5),
        RaiseUnanswered(LATE),
    ),
    # Unanswered without a deadline: for one lease.
    (
        "unanswered for a whole lease",
        seen(reply=None, unanswered=LATE, late_since=90.0, now=100.0, deadline=None),
        RaiseLate(LATE),
    ),
    (
        "unanswered for a whole lease, cancelled",
        seen(reply=None, unanswered=LATE, late_since=90.0, deadline=None, cancelled=True),
        RaiseLate(LATE),
    ),
    (
        "unanswered for less than a lease",
        seen(reply=None, unanswered=LATE, late_since=95.0, deadline=None),
        Poll(-1),
    ),
    (
        "unanswered for long, before the deadline",
        seen(reply=None, unanswered=LATE, late_since=50.0),
        Poll(-1),
    ),
    ("cut off before the deadline", seen(reply=None), Poll(-1)),
    ("cut off, queued, live", seen(reply=None, queued=True, notifications=LIVE), Poll(-1)),
    # A failed attempt, before the deadline.
    ("a bare attempt failed", seen(reply=(0, RETRY)), RetryNow()),
    ("a bare attempt failed, queued", seen(reply=(0, RETRY), queued=True), RetryNow()),
    ("held, not queued", seen(), Poll(500)),
    ("held, not queued, live", seen(notifications=LIVE), Poll(500)),
    ("held without a deadline", seen(deadline=None), Poll(500)),
    ("the key vanished", seen(reply=(0, -2)), Poll(-2)),
    ("held with no known end", seen(reply=(0, -1)), Poll(-1)),
    ("not held by anyone", seen(reply=(0, NOT_HELD)), Poll(NOT_HELD)),
    ("queued, not subscribed", seen(queued=True), Subscribe()),
    ("queued, notifications live", seen(queued=True, notifications=LIVE), WaitInQueue(500)),
    ("queued, notifications down", seen(queued=True, notifications=DOWN), Poll(500)),
    (
        "queued behind a foreign key without expiry",
        seen(reply=(0, -1), queued=True, notifications=LIVE),
        Poll(-1),
    ),
    (
        "queued behind a key without expiry, not foreign",
        seen(reply=(0, -1), queued=True, notifications=LIVE, foreign_without_expiry=False),
        WaitInQueue(-1),
    ),
    (
        "queued, the key vanished",
        seen(reply=(0, -2), queued=True, notifications=LIVE),
        WaitInQueue(-2),
    ),
]


@pytest.mark.parametrize(("seen_", "step"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_names_the_step(seen_: Seen, step: Step) -> None:
    """Each situation after an attempt gives its step (a table that names every step)."""
    assert decide(seen_) == step
    assert type(decide(seen_)) is type(step)


def test_the_table_names_every_step() -> None:
    """The table above has a case for each kind of step, so none goes untested."""
    assert {type(step) for _, _, step in CASES} == set(get_args(Step))


# -- poll_delay, case by case ----------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "pttl", "deadline", "now", "delay"),
    [
        (0.5, -1, None, 0.0, 0.5),  # no known end: the backoff step
        (0.5, 100, None, 0.0, 0.101),  # the holder's lease ends first (and 1 ms)
        (0.05, 100, None, 0.0, 0.05),  # the step comes first
        (0.5, 0, None, 0.0, 0.001),  # the lease ends now
        (0.5, -2, None, 0.0, 0.0),  # the key vanished: at once
        (0.5, NOT_HELD, None, 0.0, 0.5),  # nobody's holding explains it: the step
        (0.5, -1, 10.2, 10.0, 0.2),  # the deadline comes first
        (0.5, 100, 10.05, 10.0, 0.05),  # the deadline before the holder's lease end
        (0.5, -1, 10.0, 10.0, 0.0),  # at the deadline
        (0.5, -1, 9.0, 10.0, 0.0),  # past it: never negative
        (0.0, -1, None, 0.0, 0.0),  # a zero step
    ],
)
def test_poll_delay(
    step: float, pttl: int, deadline: float | None, now: float, delay: float
) -> None:
    """A poll sleeps the backoff step, capped by the holder's lease end and by the deadline."""
    assert poll_delay(step, pttl, deadline, now) == pytest.approx(delay, abs=1e-12)


# -- Pacing -----------------------------------------------------------------------------


def test_pacing_takes_the_policy_steps_then_repeats_the_last() -> None:
    """A finite policy that ran out repeats its latest step."""
    pacing = Pacing(iter([0.1, 0.2]))
    assert [pacing.take() for _ in range(4)] == [0.1, 0.2, 0.2, 0.2]
    assert pacing.step == 0.2


def test_pacing_of_an_empty_policy_is_zero() -> None:
    """A policy that gives no step at all polls at once."""
    assert Pacing(iter([])).take() == 0.0


def test_pacing_checks_each_step() -> None:
    """A bad delay of a policy raises when the poll that needs it comes."""
    pacing = Pacing(iter([0.1, -1.0]))
    assert pacing.take() == 0.1
    with pytest.raises(ValueError, match="backoff delay"):
        pacing.take()


def test_pacing_gives_a_policy_s_delays_in_order() -> None:
    """Pacing of a real policy gives that policy's delays in order."""
    pacing = Pacing(backoff.exponential(0.01, factor=2, cap=0.05, jitter="none").delays())
    assert [pacing.take() for _ in range(5)] == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])


# -- properties ------------------------------------------------------------------------

instants = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
spans = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
wins = st.tuples(st.just(1), st.integers(min_value=0, max_value=2**53))
codes = st.sampled_from([RETRY, NOT_HELD, -2, -1]) | st.integers(min_value=0, max_value=10**9)
fails = st.tuples(st.just(0), codes)


@st.composite
def seens(draw: st.DrawFn, replies: st.SearchStrategy[Reply] = wins | fails) -> Seen:
    """Any consistent Seen: an error only without a reply, ``late_since`` with an error."""
    sent = draw(instants)
    now = sent + draw(spans)
    how = draw(st.sampled_from(["answered", "cut off", "unanswered"]))
    reply = draw(replies) if how == "answered" else None
    unanswered = LATE if how == "unanswered" else None
    late_since = now - draw(spans) if how == "unanswered" else None
    ttl = draw(st.floats(min_value=1e-3, max_value=1e3))
    return Seen(
        reply=reply,
        unanswered=unanswered,
        late_since=late_since,
        cancelled=draw(st.booleans()),
        sent=sent,
        now=now,
        deadline=draw(st.none() | instants),
        span=ttl * draw(st.floats(min_value=0.5, max_value=1.0)),
        ttl=ttl,
        queued=draw(st.booleans()),
        foreign_without_expiry=draw(st.booleans()),
        notifications=draw(st.sampled_from(Notifications)),
        no_connection=draw(st.booleans()),
    )


def past_deadline(s: Seen) -> bool:
    """Whether the attempt was judged at or past the call's deadline."""
    return s.deadline is not None and s.now >= s.deadline


@PROPERTY
@given(s=seens())
def test_a_win_within_its_lease_is_acquired(s: Seen) -> None:
    """A reply that won within its lease gives Acquired, deadline or not (unless cancelled)."""
    step = decide(s)
    won = s.reply is not None and s.reply[0] == 1
    if won and not s.cancelled and s.now < s.sent + s.span:
        assert step == Acquired()
    if isinstance(step, Acquired):  # and nothing else does
        assert won
        assert not s.cancelled
        assert s.now < s.sent + s.span


@PROPERTY
@given(s=seens())
def test_the_hot_path_s_shortcut_agrees_with_decide(s: Seen) -> None:
    """wins_at_once is decide's Acquired for every answered attempt, and never more."""
    at_once = wins_at_once(s.reply, s.unanswered, s.cancelled, s.sent, s.now, s.span)
    if at_once:
        assert isinstance(decide(s), Acquired)
    if s.unanswered is None:
        assert at_once == isinstance(decide(s), Acquired)


@PROPERTY
@given(s=seens())
def test_the_waiter_s_shortcut_agrees_with_decide(s: Seen) -> None:
    """queued_at_once is decide's rule 7 for every answered attempt, and never more."""
    at_once = queued_at_once(
        s.reply, s.unanswered, s.cancelled, s.deadline, s.now, s.queued, s.foreign_without_expiry
    )
    step = decide(s)
    if at_once:
        assert s.reply is not None
        if s.notifications is UNASKED:
            assert step == Subscribe()
        else:
            assert step == subscribed(s.reply[1], s.notifications is LIVE)
    if s.unanswered is None:
        rule_7 = isinstance(step, Subscribe | WaitInQueue) or (
            isinstance(step, Poll) and at_once and s.notifications is DOWN
        )
        assert at_once == rule_7


@pytest.mark.parametrize(
    ("pttl", "foreign", "queued"),
    [
        (500, False, True),
        (500, True, True),
        (-1, False, True),
        (-1, True, True),
        (500, False, False),
    ],
)
def test_the_waiter_s_shortcut_polls_a_foreign_key_without_expiry(
    pttl: int, foreign: bool, queued: bool
) -> None:
    """Queued: wait in the queue, except behind another library's key, which it polls."""
    expected = queued and not (pttl == -1 and foreign)
    assert queued_at_once((0, pttl), None, False, None, 1.0, queued, foreign) is expected


@PROPERTY
@given(s=seens(replies=fails), live=st.booleans())
def test_the_step_after_subscribing_is_what_decide_says(s: Seen, live: bool) -> None:
    """After Subscribe, ``subscribed`` is what decide says of the attempt, notifications known."""
    s = s._replace(notifications=UNASKED)
    if not isinstance(decide(s), Subscribe):
        return
    assert s.reply is not None
    known = s._replace(notifications=LIVE if live else DOWN)
    assert subscribed(s.reply[1], live) == decide(known)


@PROPERTY
@given(s=seens(replies=fails))
def test_held_past_the_deadline_gives_up(s: Seen) -> None:
    """Past the deadline with a verdict of "held", the call returns None (unless cancelled)."""
    if past_deadline(s) and s.reply is not None and not s.cancelled:
        assert decide(s) == GiveUp()


@PROPERTY
@given(s=seens())
def test_no_verdict_never_gives_up(s: Seen) -> None:
    """Without a verdict the call never says "not acquired": past the deadline it raises."""
    step = decide(s)
    if s.reply is None:
        assert not isinstance(step, GiveUp | Acquired)
        if past_deadline(s) and not s.cancelled:
            assert isinstance(step, RaiseNoConnection | RaiseUnanswered)
    if isinstance(step, GiveUp):
        assert s.reply is not None
        assert s.reply[0] == 0
        assert past_deadline(s)


@PROPERTY
@given(s=seens())
def test_a_cancelled_attempt_is_undone_if_it_won(s: Seen) -> None:
    """A cancelled call never holds: its win is undone (a call late for a lease raises first)."""
    step = decide(s)
    if s.cancelled and not isinstance(step, RaiseLate):
        assert step == Cancelled(undo=s.reply is not None and s.reply[0] == 1)


@PROPERTY
@given(s=seens())
def test_raising_needs_a_deadline_or_a_whole_lease(s: Seen) -> None:
    """Without a deadline the call raises only after one whole lease without an answer."""
    step = decide(s)
    if isinstance(step, RaiseNoConnection | RaiseUnanswered):
        assert past_deadline(s)
        assert s.reply is None
    if isinstance(step, RaiseLate):
        assert s.deadline is None
        assert s.unanswered is not None
        assert s.late_since is not None
        assert s.now - s.late_since >= s.ttl


@PROPERTY
@given(s=seens())
def test_only_a_queued_waiter_waits_in_the_queue(s: Seen) -> None:
    """WaitInQueue needs a queue entry and live notifications; Subscribe, an entry and none yet."""
    step = decide(s)
    if isinstance(step, WaitInQueue):
        assert s.queued
        assert s.notifications is LIVE
        assert not past_deadline(s)
    if isinstance(step, Subscribe):
        assert s.queued
        assert s.notifications is UNASKED
        assert not past_deadline(s)


@PROPERTY
@given(
    step=spans,
    pttl=codes,
    deadline=st.none() | instants,
    now=instants,
)
def test_a_poll_delay_is_never_negative_nor_past_the_deadline(
    step: float, pttl: int, deadline: float | None, now: float
) -> None:
    """A poll never sleeps less than nothing, longer than its step, or past the deadline."""
    delay = poll_delay(step, pttl, deadline, now)
    assert 0.0 <= delay <= step
    if deadline is not None:
        assert delay <= max(0.0, deadline - now)


@PROPERTY
@given(step=spans, pttl=st.integers(min_value=0, max_value=10**9), now=instants)
def test_the_holder_s_lease_caps_a_poll(step: float, pttl: int, now: float) -> None:
    """A poller wakes by the end of the holder's lease (and 1 ms): it sends no message."""
    assert poll_delay(step, pttl, None, now) <= pttl / 1000 + 0.001
    assert poll_delay(step, -2, None, now) == 0.0
    assert poll_delay(step, -1, None, now) == step


@PROPERTY
@given(s=seens(), step=spans)
def test_every_poll_of_decide_ends_by_the_deadline(s: Seen, step: float) -> None:
    """A Poll decided before the deadline sleeps no later than the deadline."""
    decided = decide(s)
    if isinstance(decided, Poll):
        delay = poll_delay(step, decided.pttl, s.deadline, s.now)
        assert delay >= 0.0
        if s.deadline is not None:
            assert s.now + delay <= s.deadline or math.isclose(s.now + delay, s.deadline)


# -- the loop over a fake lease ----------------------------------------------------------

#: What one scripted attempt does: answer, be cut off (None), raise, or run a function
#: of the lease, the call and the deadline that does one of these.
Answer = Reply | None | BaseException | Callable[["FakeLease", Call, float | None], Awaitable[Any]]


@dataclass
class FakeSubscription:
    """A subscription to the lock's channel, driven by the test."""

    live: bool = True
    stale: bool = False
    granted: tuple[int, int] | None = None
    closed: bool = False
    news: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the waiter waits on the channel.
    waiting: asyncio.Event = field(default_factory=asyncio.Event)

    def mark(self) -> None:
        """News from now on counts."""
        self.news.clear()

    def expect(self, token: str, entry: int) -> None:
        """The waiter waits for a grant to its entry (the fake grants through :attr:`granted`)."""

    def holder_until(self) -> float:
        """No grant to another waiter heard."""
        return 0.0

    async def wait(self, delay: float) -> bool:
        """Wait up to ``delay`` for news; whether there was some."""
        self.waiting.set()
        try:
            await asyncio.wait_for(self.news.wait(), max(delay, 0.0))
        except TimeoutError:
            return False
        return True

    def release(self) -> None:
        """A release on the channel: the waiter attempts again."""
        self.news.set()

    def close(self) -> None:
        """The waiter gave the channel back."""
        self.closed = True


@dataclass
class FakeQueueing:
    """The ``Queueing`` part of a :class:`FakeLease`, in memory: it records every call.

    A failed attempt with ``queue_up`` puts the call in the queue if it
    :attr:`enters` (a bare first attempt, say, does not).
    """

    notify: bool = True
    enters: bool = True
    accepts_grants: bool = True
    foreign_without_expiry: bool = True
    refresh_every: float = 60.0
    subscription: FakeSubscription = field(default_factory=FakeSubscription)
    left: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    subscribed: int = 0

    def per_call_waiting(self) -> int | None:
        """One local queue is shared."""
        return None

    def generation(self) -> int | None:
        """The channel's generation: nothing listened to yet."""
        return 0 if self.notify else None

    async def subscribe(self, seen: int | None) -> Subscription | None:
        """The test's subscription, or None without notifications."""
        self.subscribed += 1
        return cast(Subscription, self.subscription) if self.notify else None

    async def leave(self, call: Call) -> None:
        """Record that the call left the queue."""
        self.left.append(call.token)

    async def stop_waiting(self, call: Call) -> None:
        """Record that the call stopped waiting."""
        self.stopped.append(call.token)

    async def refresh(self, call: Call, until: float) -> tuple[bool | None, float]:
        """The entry stands."""
        return True, time.monotonic()

    async def remaining(self, call: Call, until: float) -> int | None:
        """The holder's lease is not known."""
        return None

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """Never handed over (the loop does not hand over)."""
        return None


#: The fake keeps the protocol (mypy checks this assignment).
_FAKE_QUEUEING: type[Queueing] = FakeQueueing


@dataclass
class FakeLease:
    """What ``_contend`` calls on a lease, in memory: attempts answer from :attr:`script`.

    The script's answers are taken in order; the last one is repeated.
    Without :attr:`queueing` it is a lease that does not queue (as
    Redlock's); with it, a failed attempt with ``queue_up`` puts the call
    in the queue (see :class:`FakeQueueing`). Every call the loop makes is
    recorded.
    """

    script: Sequence[Answer]
    queueing: FakeQueueing | None = None
    ttl: float = 10.0
    span: float = 10.0
    name: str = "fake"
    attempts: list[tuple[float | None, bool]] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    local: LocalQueue | None = None

    def queue(self, loop: asyncio.AbstractEventLoop) -> LocalQueue:
        """The local queue (one, for the test's loop)."""
        if self.local is None:
            self.local = LocalQueue({}, self.name, loop)
        return self.local

    async def attempt(self, deadline: float | None, queue_up: bool, call: Call) -> Reply | None:
        """The script's next answer."""
        index = len(self.attempts)
        self.attempts.append((deadline, queue_up))
        call.attempts += 1
        await asyncio.sleep(0)
        answer = self.script[min(index, len(self.script) - 1)]
        if callable(answer):
            answer = await answer(self, call, deadline)
        if isinstance(answer, BaseException):
            raise answer
        queueing = self.queueing
        if answer is not None and queue_up:
            # (As the one-server lease's scripted attempt: asked to queue up, it may be queued
            # from then on, and its keeper knows the token, whatever the answer.)
            assert queueing is not None  # (the loop asks only a lease that queues to queue up)
            if queueing.enters:
                call.queued = True
        return cast(Reply | None, answer)

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Record the undo."""
        self.undone.append(token)


async def acquire(fake: FakeLease, timeout: float | None, call: Call | None = None) -> Won | None:
    """Run the real wait loop over ``fake`` for the current task, as ``acquire()`` does."""
    task = asyncio.current_task()
    assert task is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    policy = backoff.constant(0.01)
    won = await obtain(cast(Lease, fake), task, policy, deadline, True, call or Call())
    if won is not None and won.timer is not None:
        won.timer.cancel()
    return won


def baton_free(fake: FakeLease) -> bool:
    """Whether the local queue's baton went on (nobody holds it)."""
    return fake.local is not None and fake.local.owner is None


#: A call that ends without standing in the queue on the server, over a lease without a
#: queueing part (Redlock's) and over one with it (told the call stopped waiting).
NOT_QUEUED: Final = pytest.mark.parametrize(
    "queues", [pytest.param(False, id="no-queueing"), pytest.param(True, id="not-queued")]
)


def not_queued(queues: bool) -> FakeQueueing | None:
    """No queueing part, or one without notifications whose attempts do not queue the call."""
    return FakeQueueing(notify=False, enters=False) if queues else None


async def test_a_first_attempt_that_wins_holds() -> None:
    """A win at the first attempt is the lock: one attempt, no pause, no queue left behind."""
    queueing = FakeQueueing()
    fake = FakeLease([(1, 7)], queueing)
    call = Call()
    won = await acquire(fake, 5.0, call)
    assert won is not None
    assert (won.token, won.fence, won.handed, won.span) == (call.token, 7, False, None)
    assert len(fake.attempts) == 1
    assert queueing.stopped == [call.token]
    assert queueing.left == fake.undone == []
    assert queueing.subscribed == 0
    assert fake.local is not None
    assert fake.local.owner is asyncio.current_task()
    fake.local.leave()


async def test_a_first_attempt_that_did_not_queue_wins_without_a_word_to_the_queue() -> None:
    """A win at a first attempt that could not queue the caller (``timeout=0``): no stop_waiting."""
    queueing = FakeQueueing()
    fake = FakeLease([(1, 3)], queueing)
    call = Call()
    won = await acquire(fake, 0.0, call)
    assert won is not None
    assert fake.attempts == [(fake.attempts[0][0], False)]
    assert not call.queued
    assert queueing.stopped == queueing.left == []
    assert fake.local is not None
    fake.local.leave()


async def test_a_failed_bare_attempt_is_followed_at_once() -> None:
    """RETRY (a bare first attempt that failed): the full attempt follows without a pause."""
    queueing = FakeQueueing()
    fake = FakeLease([(0, RETRY), (1, 0)], queueing)
    started = time.monotonic()
    won = await acquire(fake, None)
    assert won is not None
    assert len(fake.attempts) == 2
    assert queueing.subscribed == 0
    assert time.monotonic() - started < 0.5  # (no backoff step of 10 ms was needed)
    assert fake.local is not None
    fake.local.leave()


async def test_a_queued_waiter_attempts_again_when_a_release_is_heard() -> None:
    """Held: the waiter queues, subscribes, waits; a release on the channel makes it win."""
    queueing = FakeQueueing()
    fake = FakeLease([HELD, (1, 3)], queueing)
    call = Call()
    task = asyncio.create_task(acquire(fake, None, call))
    await asyncio.wait_for(queueing.subscription.waiting.wait(), 5)
    assert len(fake.attempts) == 1
    assert call.queued
    queueing.subscription.release()
    won = await asyncio.wait_for(task, 5)
    assert won is not None
    assert won.fence == 3
    assert len(fake.attempts) == 2
    assert queueing.subscribed == 1
    assert queueing.subscription.closed  # (a winner gives the channel back)
    assert queueing.stopped == [call.token]
    assert queueing.left == []
    assert fake.local is not None
    fake.local.leave()


async def test_a_grant_heard_on_the_channel_is_the_lock() -> None:
    """A queued waiter granted the lock holds it at once, its lease counted from its attempt."""
    queueing = FakeQueueing()
    fake = FakeLease([HELD], queueing)
    call = Call()
    task = asyncio.create_task(acquire(fake, None, call))
    await asyncio.wait_for(queueing.subscription.waiting.wait(), 5)
    queueing.subscription.granted = (10_000, 9)
    queueing.subscription.release()
    won = await asyncio.wait_for(task, 5)
    assert won is not None
    assert (won.fence, won.span) == (9, 10.0)
    assert len(fake.attempts) == 1
    assert queueing.stopped == [call.token]
    assert fake.local is not None
    fake.local.leave()


@NOT_QUEUED
async def test_a_deadline_that_passes_while_held_gives_none(queues: bool) -> None:
    """A poller whose lock stays held gets None at its deadline, and passes the baton on."""
    queueing = not_queued(queues)
    fake = FakeLease([HELD], queueing)
    call = Call()
    started = time.monotonic()
    assert await acquire(fake, 0.1, call) is None
    assert time.monotonic() - started >= 0.1
    assert len(fake.attempts) >= 2
    assert fake.undone == []
    if queueing is not None:
        assert queueing.stopped == [call.token]
        assert queueing.left == []
    assert baton_free(fake)


async def test_a_queued_waiter_leaves_the_queue_at_its_deadline() -> None:
    """A queued waiter still held at its deadline gets None and takes its entry out."""
    queueing = FakeQueueing()
    fake = FakeLease([HELD], queueing)
    call = Call()
    assert await acquire(fake, 0.1, call) is None
    assert len(fake.attempts) == 2  # (one at the start, one at the deadline)
    assert queueing.left == [call.token]
    assert queueing.subscription.closed
    assert baton_free(fake)


@NOT_QUEUED
async def test_unanswered_at_the_deadline_raises_the_attempt_s_error(queues: bool) -> None:
    """No verdict at the deadline: the attempt's own error, never "not acquired"."""
    error = RedisTimeoutError("no answer from node 0")
    queueing = not_queued(queues)
    fake = FakeLease([Unanswered(error)], queueing)
    call = Call()
    with pytest.raises(RedisTimeoutError) as raised:
        await acquire(fake, 0.05, call)
    assert raised.value is error
    assert len(fake.attempts) >= 2  # (tried again while the deadline allowed)
    if queueing is not None:
        assert queueing.stopped == [call.token]
    assert baton_free(fake)


async def cut_off_at_the_deadline(fake: FakeLease, call: Call, deadline: float | None) -> None:
    """An attempt still unanswered at the deadline, then cut off."""
    assert deadline is not None
    sent = time.monotonic()
    while time.monotonic() < deadline:  # (a loop's timer may fire a little early)
        await asyncio.sleep(deadline - time.monotonic())
    call.unanswered = time.monotonic() - sent


async def waited_for_a_connection(fake: FakeLease, call: Call, deadline: float | None) -> None:
    """An attempt that waited for a connection of the pool until the deadline, sending nothing."""
    await cut_off_at_the_deadline(fake, call, deadline)
    call.waiting = True


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param(
            cut_off_at_the_deadline,
            r"^lock 'fake': the server did not answer within \S+ s; not acquired, "
            r"and whether anyone holds it is not known$",
            id="cut-off",
        ),
        pytest.param(
            waited_for_a_connection,
            r"^lock 'fake': no connection of the client's pool came free within \S+ s "
            r"\(other commands of the client hold them all\); not acquired, and nothing was sent$",
            id="no-connection",
        ),
    ],
)
async def test_an_attempt_cut_off_at_the_deadline_raises(answer: Answer, message: str) -> None:
    """An attempt cut off at the deadline raises redis-py's TimeoutError saying why."""
    fake = FakeLease([answer])
    call = Call()
    with pytest.raises(RedisTimeoutError, match=message):
        await acquire(fake, 0.05, call)
    assert len(fake.attempts) == 1
    assert baton_free(fake)


async def test_unanswered_for_a_whole_lease_raises_without_a_deadline() -> None:
    """Without a deadline, attempts unanswered for one whole lease raise the latest error."""
    error = RedisTimeoutError("no answer")
    fake = FakeLease([Unanswered(error)], ttl=0.1, span=0.1)
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError) as raised:
        await acquire(fake, None)
    assert raised.value is error
    assert time.monotonic() - started >= 0.1
    assert len(fake.attempts) >= 2
    assert baton_free(fake)


async def win_too_late(fake: FakeLease, call: Call, deadline: float | None) -> Reply:
    """A win whose answer came after the lease it granted had run out."""
    await asyncio.sleep(fake.span * 1.5)
    return (1, 0)


async def test_a_win_that_came_too_late_is_undone() -> None:
    """A win answered after its lease is not a lock: undone, and the waiter attempts again."""
    fake = FakeLease([win_too_late, (1, 5)], span=0.05, ttl=0.05)
    call = Call()
    won = await acquire(fake, 5.0, call)
    assert won is not None
    assert won.fence == 5
    assert fake.undone == [call.token]
    assert call.unanswered >= 0.05
    assert len(fake.attempts) == 2
    assert fake.local is not None
    fake.local.leave()


async def test_a_queued_waiter_that_is_cancelled_leaves_the_queue() -> None:
    """Cancelled while it waits in the queue, the waiter leaves it and passes the baton on."""
    queueing = FakeQueueing()
    fake = FakeLease([HELD], queueing)
    call = Call()
    task = asyncio.create_task(acquire(fake, None, call))
    await asyncio.wait_for(queueing.subscription.waiting.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queueing.left == [call.token]
    assert fake.undone == []
    assert queueing.subscription.closed
    assert baton_free(fake)


async def cancelled_as_it_wins(fake: FakeLease, call: Call, deadline: float | None) -> Reply:
    """The caller is cancelled while the attempt runs, and the attempt wins all the same."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    return (1, 0)


@NOT_QUEUED
async def test_a_win_whose_caller_was_cancelled_is_undone(queues: bool) -> None:
    """An attempt that won for a cancelled caller is undone, and the cancellation raised."""
    queueing = not_queued(queues)
    fake = FakeLease([cancelled_as_it_wins], queueing)
    call = Call()
    task = asyncio.create_task(acquire(fake, 5.0, call))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.undone == [call.token]
    if queueing is not None:
        assert queueing.stopped == [call.token]
    assert baton_free(fake)
