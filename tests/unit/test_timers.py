"""The shared loop timer of ``aiolock._timers``: ``call_at``, ``Timer`` and ``Cutoff``.

Pure tests: no server. Deadlines are ``time.monotonic()`` seconds a few tens of
milliseconds ahead; a callback must never run before its deadline and, on an
idle loop, not much after it (:data:`SLACK`). Some tests look inside the
per-loop scheduler (``_timers._schedulers[loop]()``) to check the heap stays
bounded and the registry lets go of closed loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import anyio
import pytest
from support.loops import LOOPS
from support.timing import eventually

from aiolock import _timers
from aiolock._timers import Cutoff, Timer, call_at

#: How late a callback may run after its deadline on an idle loop.
SLACK: Final = 0.05

#: A log of fired callbacks: (name, time.monotonic() when it ran).
Log = list[tuple[str, float]]


def record(log: Log, name: str) -> None:
    """A timer callback: note that ``name`` ran, and when."""
    log.append((name, time.monotonic()))


def names(log: Log) -> list[str]:
    """The names in ``log``, in the order they ran."""
    return [name for name, _ in log]


def ran_at(log: Log, name: str) -> float:
    """When the callback ``name`` ran (it must have run exactly once)."""
    times = [at for n, at in log if n == name]
    assert len(times) == 1, f"{name!r} ran {len(times)} times"
    return times[0]


def assert_on_time(log: Log, name: str, when: float) -> None:
    """``name`` ran not before ``when`` and at most :data:`SLACK` after it."""
    at = ran_at(log, name)
    assert when <= at, f"{name!r} ran {when - at:.4f} s early"
    assert at <= when + SLACK, f"{name!r} ran {at - when:.4f} s late"


def scheduler() -> Any:
    """The running loop's scheduler (created by the first ``call_at`` on it)."""
    return _timers._schedulers[asyncio.get_running_loop()]()


async def finished(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """Wait for ``task`` to end, without raising what it raised; return it."""
    await asyncio.wait([task], timeout=2.0)
    assert task.done(), "the task did not end in time"
    return task


# --- call_at / Timer ---------------------------------------------------------------------------


async def test_timers_fire_in_deadline_order_not_creation_order() -> None:
    """Timers created out of order run sorted by deadline (ties by creation), each on time."""
    log: Log = []
    now = time.monotonic()
    deadlines = {"c": now + 0.04, "a": now + 0.01, "b1": now + 0.025, "b2": now + 0.025}
    for name, when in deadlines.items():  # created in the order c, a, b1, b2
        call_at(when, record, log, name)
    await eventually(lambda: len(log) == len(deadlines), timeout=1.0, every=0.002)
    assert names(log) == ["a", "b1", "b2", "c"]
    for name, when in deadlines.items():
        assert_on_time(log, name, when)


async def test_an_earlier_deadline_re_arms_the_loop_timer() -> None:
    """A timer earlier than the one the loop timer waits for still fires on time."""
    log: Log = []
    late = call_at(time.monotonic() + 0.5, record, log, "late")
    await asyncio.sleep(0)  # the loop timer is armed for "late" now
    early_when = time.monotonic() + 0.02
    early = call_at(early_when, record, log, "early")
    await eventually(lambda: early.done, timeout=1.0, every=0.002)
    assert names(log) == ["early"]
    assert_on_time(log, "early", early_when)
    assert not late.done
    late.cancel()


async def test_a_cancelled_timer_never_runs_and_cancel_after_running_is_a_no_op() -> None:
    """``cancel()`` keeps the callback from running; after it ran, cancel() changes nothing."""
    log: Log = []
    now = time.monotonic()
    cancelled = call_at(now + 0.01, record, log, "cancelled")
    kept = call_at(now + 0.02, record, log, "kept")
    assert [cancelled.done, kept.done] == [False, False]
    counted = scheduler()._cancelled
    cancelled.cancel()
    cancelled.cancel()  # twice: counted once
    assert [cancelled.done, kept.done] == [True, False]
    assert scheduler()._cancelled == counted + 1
    await eventually(lambda: kept.done, timeout=1.0, every=0.002)
    await asyncio.sleep(0.02)  # well past both deadlines
    assert names(log) == ["kept"]
    counted = scheduler()._cancelled
    kept.cancel()  # it ran: a no-op
    assert kept.done
    assert scheduler()._cancelled == counted
    assert names(log) == ["kept"]


async def test_a_timer_cancelled_by_an_earlier_callback_of_the_same_turn_does_not_run() -> None:
    """Two timers due together: if the first cancels the second, the second does not run."""
    log: Log = []
    when = time.monotonic() + 0.01

    def cancel_second() -> None:
        record(log, "first")
        second.cancel()

    first = call_at(when, cancel_second)
    second = call_at(when, record, log, "second")
    await eventually(lambda: first.done, timeout=1.0, every=0.002)
    await asyncio.sleep(0.01)
    assert names(log) == ["first"]
    assert second.done


async def test_many_cancelled_timers_keep_the_heap_bounded() -> None:
    """10 000 timers added and cancelled: the heap is compacted; a live one among them fires."""
    log: Log = []
    live_when = time.monotonic() + 0.1
    live = call_at(live_when, record, log, "live")
    sched = scheduler()
    bound = 2 * _timers._COMPACT_MIN + 2
    now = time.monotonic()

    # One at a time: add, cancel. Deadlines before and after the live one's.
    peak = 0
    for i in range(10_000):
        call_at(now + 0.001 * (i % 300), record, log, "cancelled").cancel()
        peak = max(peak, len(sched._heap))
    assert peak <= bound, f"the heap grew to {peak} entries"

    # All at once: the heap grows, then cancelling most of it shrinks it again.
    timers = [call_at(now + 0.001 * (i % 300), record, log, "cancelled") for i in range(10_000)]
    assert len(sched._heap) > 10_000
    for timer in timers:
        timer.cancel()
    assert len(sched._heap) <= bound, f"{len(sched._heap)} entries left after cancelling"
    assert any(entry[2] is live for entry in sched._heap)

    await eventually(lambda: live.done, timeout=1.0, every=0.002)
    assert names(log) == ["live"]
    assert live_when <= ran_at(log, "live")
    assert sched._cancelled == sum(1 for entry in sched._heap if entry[2].done)


@pytest.mark.parametrize("pending", [False, True], ids=["alone", "with-a-later-timer"])
@pytest.mark.parametrize("delay", [0.02, -0.01], ids=["ahead", "already-due"])
async def test_a_callback_can_schedule_another_timer(pending: bool, delay: float) -> None:
    """A timer scheduled from inside a timer callback fires, on time.

    With a later timer pending or not (the loop timer is re-armed at the end of
    the firing), and for a deadline ahead or already passed.
    """
    log: Log = []
    now = time.monotonic()
    later = call_at(now + 0.5, record, log, "later") if pending else None
    inner_when = 0.0
    inner: list[Timer] = []

    def outer() -> None:
        nonlocal inner_when
        record(log, "outer")
        inner_when = time.monotonic() + delay
        inner.append(call_at(inner_when, record, log, "inner"))

    call_at(now + 0.01, outer)
    await eventually(lambda: len(log) >= 2, timeout=1.0, every=0.002)
    assert names(log) == ["outer", "inner"]
    assert inner[0].done
    assert_on_time(log, "inner", max(inner_when, ran_at(log, "outer")))
    if later is not None:
        assert not later.done
        later.cancel()


async def test_a_callback_adding_a_later_timer_does_not_delay_an_earlier_one() -> None:
    """A callback schedules a far timer while a nearer one waits: the nearer one is still on time.

    The loop timer must be re-armed for the earliest deadline in the heap, not
    for the one just added.
    """
    log: Log = []
    now = time.monotonic()
    far: list[Timer] = []

    def first() -> None:
        record(log, "first")
        far.append(call_at(time.monotonic() + 5, record, log, "far"))

    call_at(now + 0.01, first)
    call_at(now + 0.05, record, log, "second")
    await eventually(lambda: len(log) >= 2, timeout=1.0, every=0.002)
    assert names(log) == ["first", "second"]
    assert_on_time(log, "second", now + 0.05)
    far[0].cancel()


async def test_a_callback_that_compacts_the_heap_does_not_delay_a_new_timer() -> None:
    """A callback that cancels many timers (compacting the heap) and adds one: it fires on time.

    The cancellations replace ``_Scheduler._heap`` by a compacted list while
    ``_fire`` still walks the old one; a timer added to the new list is then
    re-armed for the old list's head, and fires that late.
    """
    log: Log = []
    now = time.monotonic()
    others = [call_at(now + 10, record, log, "other") for _ in range(2 * _timers._COMPACT_MIN)]
    later = call_at(now + 0.3, record, log, "later")
    inner_when = now + 0.03

    def outer() -> None:
        record(log, "outer")
        for timer in others:
            timer.cancel()
        call_at(inner_when, record, log, "inner")

    call_at(now + 0.01, outer)
    await eventually(lambda: len(log) >= 2, timeout=1.0, every=0.002)
    later.cancel()
    assert_on_time(log, "inner", inner_when)
    assert names(log) == ["outer", "inner"]


async def test_compaction_inside_a_firing_keeps_the_cancelled_count_right() -> None:
    """After a callback compacted the heap, the cancelled count matches the heap.

    ``_fire`` goes on popping the old list: the cancelled entries it drops there
    are subtracted from the count the compaction reset, which goes negative.
    """
    now = time.monotonic()
    others = [call_at(now + 10, print) for _ in range(2 * _timers._COMPACT_MIN)]
    keep = call_at(now + 20, print)

    def cancel_others() -> None:
        for timer in others:
            timer.cancel()

    fired = call_at(now + 0.01, cancel_others)
    await eventually(lambda: fired.done, timeout=1.0, every=0.002)
    await asyncio.sleep(0)
    sched = scheduler()
    dead = sum(1 for entry in sched._heap if entry[2].done)
    counted = sched._cancelled
    keep.cancel()
    assert counted == dead, f"{counted} counted cancelled, {dead} in the heap"


# --- Cutoff ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prior", [0, 1], ids=["fresh-task", "task-that-swallowed-a-cancel"])
async def test_cutoff_cuts_the_block_at_its_deadline(prior: int) -> None:
    """The block is cancelled at ``when``; the cancellation is swallowed and ``expired`` set.

    Afterwards the task's ``cancelling()`` count is back where it was (also for
    a task that caught an earlier cancellation without uncancelling it), and it
    can await again.
    """
    result: dict[str, Any] = {}

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None
        if prior:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # no uncancel(): cancelling() is 1
                await asyncio.sleep(1)
        result["before"] = task.cancelling()
        never = asyncio.get_running_loop().create_future()
        when = time.monotonic() + 0.02
        with Cutoff(when) as cutoff:
            await never
        result["late"] = time.monotonic() - when
        result["expired"] = cutoff.expired
        result["never_cancelled"] = never.cancelled()
        result["after"] = task.cancelling()
        await asyncio.sleep(0.01)  # the task goes on normally
        result["slept"] = True

    task = await finished(asyncio.create_task(body()))
    assert not task.cancelled(), "a CancelledError escaped the Cutoff block"
    task.result()
    assert result["before"] == prior
    assert 0 <= result["late"] <= SLACK
    assert result["expired"] is True
    assert result["never_cancelled"]
    assert result["after"] == result["before"]
    assert result["slept"]


async def test_cutoff_with_a_passed_deadline_cuts_at_the_first_await() -> None:
    """A deadline already passed: a block that awaits is cut at once; one that does not is not."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    with Cutoff(time.monotonic() - 1) as untouched:
        pass
    assert not untouched.expired
    started = time.monotonic()
    with Cutoff(time.monotonic() - 1) as cut:
        await asyncio.sleep(1)
    assert cut.expired
    assert time.monotonic() - started <= SLACK
    assert task.cancelling() == before
    await asyncio.sleep(0.01)  # neither cutoff left a cancellation behind


async def test_an_exception_the_cut_block_raises_instead_is_not_swallowed() -> None:
    """A block that turns the cutoff's cancellation into another exception: that propagates."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    never = asyncio.get_running_loop().create_future()
    cutoff = Cutoff(time.monotonic() + 0.01)

    async def block() -> None:
        with cutoff:
            try:
                await never
            except asyncio.CancelledError:
                raise LookupError("raised instead") from None

    with pytest.raises(LookupError, match="raised instead"):
        await block()
    assert cutoff.expired
    assert task.cancelling() == before


async def test_cutoff_not_reached_cancels_its_timer() -> None:
    """A block that ends before ``when``: not expired, and the task is never cancelled later."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    when = time.monotonic() + 0.02
    with Cutoff(when) as cutoff:
        await asyncio.sleep(0)
    assert not cutoff.expired
    assert cutoff._timer is not None
    assert cutoff._timer.done
    await asyncio.sleep(when - time.monotonic() + 0.02)  # past the deadline: no cancellation
    assert time.monotonic() > when
    assert not cutoff.expired
    assert task.cancelling() == before


@pytest.mark.parametrize("ends", ["before-the-spare", "between", "never"])
async def test_cutoff_reusing_a_spare_timer_cuts_at_its_own_deadline(ends: str) -> None:
    """A Cutoff given an earlier spare timer cuts at ``when``, not at the spare's deadline.

    The spare's own callback never runs; a block that ends before the spare
    is due leaves no timer armed; one still running when the spare is due is
    cut at ``when`` exactly as without a spare.
    """
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    ran: list[str] = []
    now = time.monotonic()
    spare = call_at(now + 0.02, ran.append, "the spare's own callback")
    when = now + 0.06
    never = asyncio.get_running_loop().create_future()
    with Cutoff(when, task, spare) as cutoff:
        if ends == "before-the-spare":
            await asyncio.sleep(0)
        elif ends == "between":
            await asyncio.sleep(0.04)
        else:
            await never
    ended = time.monotonic()
    assert cutoff.expired is (ends == "never")
    if ends == "never":
        assert when <= ended <= when + SLACK
    else:
        assert ended < when
    assert spare.done
    assert cutoff._timer is not None
    assert cutoff._timer.done
    await asyncio.sleep(when - time.monotonic() + 0.02)  # past both deadlines
    assert ran == []
    assert task.cancelling() == before


async def test_a_done_spare_timer_is_not_reused() -> None:
    """A spare that already fired (or was cancelled): the Cutoff arms a timer of its own."""
    task = asyncio.current_task()
    assert task is not None
    spare = call_at(time.monotonic() - 1, print)
    spare.cancel()
    when = time.monotonic() + 0.02
    with Cutoff(when, task, spare) as cutoff:
        await asyncio.get_running_loop().create_future()
    assert cutoff.expired
    assert cutoff._timer is not spare
    assert time.monotonic() >= when


async def test_call_at_on_a_given_loop_fires_there() -> None:
    """``call_at(..., loop=...)`` schedules on that loop without asking for the running one."""
    fired = asyncio.get_running_loop().create_future()
    call_at(time.monotonic() + 0.005, fired.set_result, "fired", loop=asyncio.get_running_loop())
    assert await asyncio.wait_for(fired, 1) == "fired"


async def test_task_cancel_propagates_through_a_far_cutoff() -> None:
    """An outer ``Task.cancel()`` inside a Cutoff block is not swallowed."""
    cutoffs: list[Cutoff] = []

    async def body() -> None:
        with Cutoff(time.monotonic() + 10) as cutoff:
            cutoffs.append(cutoff)
            await asyncio.get_running_loop().create_future()

    task = asyncio.create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    await finished(task)
    assert task.cancelled()
    assert not cutoffs[0].expired
    assert cutoffs[0]._timer is not None
    assert cutoffs[0]._timer.done


@pytest.mark.parametrize("outer_first", [True, False], ids=["outer-first", "cutoff-first"])
async def test_task_cancel_propagates_when_the_cutoff_fires_in_the_same_turn(
    outer_first: bool,
) -> None:
    """An outer cancel and the cutoff due at the same instant: the task ends cancelled.

    Both are timers of the same shared heap with the same deadline, so they
    run in the same firing, in the order given, before the task resumes.
    """
    when = time.monotonic() + 0.02
    cutoffs: list[Cutoff] = []

    async def body() -> None:
        with Cutoff(when) as cutoff:
            cutoffs.append(cutoff)
            await asyncio.get_running_loop().create_future()

    task = asyncio.create_task(body())
    if outer_first:
        call_at(when, task.cancel)
    await asyncio.sleep(0)  # the task enters its Cutoff
    assert cutoffs
    if not outer_first:
        call_at(when, task.cancel)
    await finished(task)
    assert task.cancelled(), "the outer cancellation was swallowed"
    assert cutoffs[0].expired


@pytest.mark.parametrize("cutoff_first", [True, False], ids=["cutoff-first", "outer-first"])
async def test_task_cancel_during_the_cleanup_of_a_cut_block_propagates(cutoff_first: bool) -> None:
    """The cutoff and an outer cancel arrive one after the other, the second during cleanup.

    Whichever comes first, the task ends cancelled: the cutoff swallows only a
    cancellation nothing else asked for.
    """
    loop = asyncio.get_running_loop()
    cutoff_delay, outer_delay = (0.01, 0.03) if cutoff_first else (0.03, 0.01)
    cutoffs: list[Cutoff] = []

    async def body() -> None:
        with Cutoff(time.monotonic() + cutoff_delay) as cutoff:
            cutoffs.append(cutoff)
            try:
                await loop.create_future()
            finally:
                await asyncio.sleep(0.1)  # the second cancellation lands here

    task = asyncio.create_task(body())
    loop.call_later(outer_delay, task.cancel)
    await finished(task)
    assert task.cancelled(), "the outer cancellation was swallowed"
    assert cutoffs[0].expired


@pytest.mark.parametrize("cutoff_inside", [True, False], ids=["cutoff-inside", "cutoff-outside"])
async def test_cutoff_nested_with_an_expiring_asyncio_timeout(cutoff_inside: bool) -> None:
    """``asyncio.timeout`` expiring first raises TimeoutError; the Cutoff does not expire."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    never = asyncio.get_running_loop().create_future()
    cutoff = Cutoff(time.monotonic() + 0.5)

    async def nested() -> None:
        if cutoff_inside:
            async with asyncio.timeout(0.02):
                with cutoff:
                    await never
        else:
            with cutoff:
                async with asyncio.timeout(0.02):
                    await never

    with pytest.raises(TimeoutError):
        await nested()
    assert not cutoff.expired
    assert cutoff._timer is not None
    assert cutoff._timer.done
    assert task.cancelling() == before


async def test_cutoff_expiring_inside_an_asyncio_timeout_does_not_make_it_raise() -> None:
    """A Cutoff expiring first inside ``asyncio.timeout``: swallowed, and no TimeoutError."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    async with asyncio.timeout(0.5) as timeout:
        with Cutoff(time.monotonic() + 0.02) as cutoff:
            await asyncio.get_running_loop().create_future()
    assert cutoff.expired
    assert not timeout.expired()
    assert task.cancelling() == before


@pytest.mark.parametrize("how", ["move_on_after", "CancelScope.cancel", "CancelScope-deadline"])
async def test_cutoff_inside_a_firing_anyio_scope_lets_the_scope_handle_it(how: str) -> None:
    """An anyio scope cancelled first: the scope catches its cancellation, the Cutoff stays out."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    never = asyncio.get_running_loop().create_future()
    reached = False
    scope: anyio.CancelScope
    if how == "move_on_after":
        scope = anyio.move_on_after(0.02)
    elif how == "CancelScope-deadline":
        scope = anyio.CancelScope(deadline=anyio.current_time() + 0.02)
    else:
        scope = anyio.CancelScope()
        asyncio.get_running_loop().call_later(0.02, scope.cancel)
    with scope:
        with Cutoff(time.monotonic() + 0.5) as cutoff:
            await never
        reached = True  # only if the Cutoff swallowed the scope's cancellation
    assert not reached
    assert scope.cancel_called
    assert scope.cancelled_caught
    assert not cutoff.expired
    assert task.cancelling() == before
    await asyncio.sleep(0.01)


async def test_cutoff_inside_anyio_fail_after_raises_timeout_error() -> None:
    """``anyio.fail_after`` firing first turns the cancellation into TimeoutError."""
    never = asyncio.get_running_loop().create_future()
    with (
        pytest.raises(TimeoutError),
        anyio.fail_after(0.02),
        Cutoff(time.monotonic() + 0.5) as cutoff,
    ):
        await never
    assert not cutoff.expired


# --- no loop kept alive -------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [pytest.param(f, id=n) for n, f in LOOPS.items()])
@pytest.mark.parametrize(
    "leftover",
    [
        pytest.param("nothing", id="all-deadlines-passed"),
        pytest.param("cancelled", id="a-cutoff-not-reached"),
        pytest.param("pending", id="a-pending-timer"),
    ],
)
def test_the_registry_does_not_keep_a_closed_loop_alive(
    factory: Callable[[], asyncio.AbstractEventLoop], leftover: str
) -> None:
    """A loop that used Cutoffs and timers is freed, with its scheduler, once closed and dropped.

    Whether all its deadlines passed before it closed, or one was still in the
    heap: a Cutoff left before its deadline (cancelled, so only marked), or a
    timer still pending.
    """

    async def use() -> bool:
        with Cutoff(time.monotonic() + 0.005) as cut:
            await asyncio.get_running_loop().create_future()
        fired = call_at(time.monotonic() + 0.005, record, [], "fired")
        await eventually(lambda: fired.done, timeout=1.0, every=0.002)
        if leftover == "cancelled":
            with Cutoff(time.monotonic() + 10):
                await asyncio.sleep(0)
        elif leftover == "pending":
            call_at(time.monotonic() + 60, print)
        return cut.expired

    loop = factory()
    try:
        assert loop.run_until_complete(use())
        assert loop in _timers._schedulers
        scheduler_ref = _timers._schedulers[loop]
    finally:
        loop.close()
    loop_ref = weakref.ref(loop)
    del loop
    gc.collect()
    assert loop_ref() is None, "the closed loop is still alive"
    assert scheduler_ref() is None, "the scheduler of a dead loop is still alive"
