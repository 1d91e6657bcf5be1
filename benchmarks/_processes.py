"""Hand-off between processes: the ``aiolock processes`` rows of ``benchmarks.handoff``.

Every member of the chain is a process of its own, with its own client and
its own event loop, as uvicorn workers or pods are: a release wakes the
heir's process through the server and nothing else. The chain's rules are
those of :mod:`benchmarks.handoff`: the holder releases once every other
member waits, after a uniform 1-5 ms hold; ``t0`` is noted just before
``release()`` and ``t1`` when the next ``acquire()`` returns, in another
process (``time.monotonic()`` is one clock for every process on Linux).
The members share their counters through ``multiprocessing`` values; only
the holder (before ``t0``) and the member that released (2 ms after it)
look at them.

The baseline of these rows is the floor of any notification between
processes here: a ``PUBLISH`` sent by one process (its round trip
included, as a release's) until another process's subscriber has the
message, measured by :func:`publish_floor` in the same run, with the same
idle pause before each, to as many processes in turn as the chain has
members (a process that slept through the others' turns wakes slower).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import queue
import random
import time
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Final

from redis.asyncio import Redis

from ._measure import count_overlaps, server_commands
from ._subjects import Subject

#: Spawned, not forked: the parent runs an event loop (and maybe uvloop).
_CONTEXT: Final = multiprocessing.get_context("spawn")
#: The longest one acquisition may wait before it counts as a failure.
ACQUIRE_TIMEOUT: Final = 10.0
#: How long a member may take to start (import, connect, warm up).
START_TIMEOUT: Final = 120.0


@dataclass
class Shared:
    """The chain's state, shared by its processes."""

    waiting: Synchronized[int]
    holdings: Synchronized[int]
    released_at: Synchronized[float]
    done: Synchronized[int]
    ready: Synchronized[int]

    @classmethod
    def make(cls) -> Shared:
        """New shared values, all zero."""
        return cls(
            _CONTEXT.Value("i", 0),
            _CONTEXT.Value("i", 0),
            _CONTEXT.Value("d", 0.0),
            _CONTEXT.Value("i", 0),
            _CONTEXT.Value("i", 0),
        )


@dataclass
class MemberResult:
    """What one member process saw."""

    samples: list[float]
    intervals: list[tuple[float, float]]
    failures: int
    first_error: str


@dataclass(frozen=True)
class Plan:
    """What every member of a chain is told.

    Attributes:
        url: the server.
        subject: the lock the members take.
        key: its name.
        members: how many members the chain has.
        wanted: the holdings after which the chain is done.
        deadline: ``time.monotonic()`` after which it is done.
        hold: how long a holder keeps the lock once every other member waits:
            uniform in this range, in seconds.
    """

    url: str
    subject: Subject
    key: str
    members: int
    wanted: int
    deadline: float
    hold: tuple[float, float]


def member(plan: Plan, shared: Shared, start: Any, results: Any) -> None:
    """One member process: acquire, hold, release until the chain is done (spawn target)."""
    results.put(asyncio.run(_member(plan, shared, start)))


async def _member(plan: Plan, shared: Shared, start: Any) -> MemberResult:
    client = Redis.from_url(plan.url)
    (lock,) = plan.subject.lockers([client], plan.key, 1)
    result = MemberResult([], [], 0, "")
    try:
        # Connect and load the scripts before the chain starts.
        if await lock.acquire(ACQUIRE_TIMEOUT):
            await lock.release()
        with shared.ready.get_lock():
            shared.ready.value += 1
        await asyncio.to_thread(start.wait, START_TIMEOUT)
        while not shared.done.value:
            with shared.waiting.get_lock():
                shared.waiting.value += 1
            try:
                held = await lock.acquire(ACQUIRE_TIMEOUT)
            except Exception as exc:
                result.first_error = result.first_error or f"acquire: {exc!r}"
                held = False
            acquired_at = time.monotonic()
            with shared.waiting.get_lock():
                shared.waiting.value -= 1
            if not held:
                result.failures += 1
                continue
            with shared.holdings.get_lock():
                shared.holdings.value += 1
                mine = shared.holdings.value
            if shared.released_at.value > 0:
                result.samples.append(acquired_at - shared.released_at.value)
                shared.released_at.value = 0.0
            if mine > plan.wanted or acquired_at >= plan.deadline:
                shared.done.value = 1
            else:
                while shared.waiting.value < plan.members - 1 and not shared.done.value:  # noqa: ASYNC110 - set by other processes
                    await asyncio.sleep(0.0005)
                await asyncio.sleep(random.uniform(*plan.hold))
            released_at = time.monotonic()
            result.intervals.append((acquired_at, released_at))
            shared.released_at.value = 0.0 if shared.done.value else released_at
            try:
                await lock.release()
            except Exception as exc:
                result.failures += 1
                result.first_error = result.first_error or f"release: {exc!r}"
            # Back into acquire() only once someone else took the lock; look after the
            # hand-off, not during it.
            await asyncio.sleep(0.002)
            while shared.holdings.value == mine and not shared.done.value:  # noqa: ASYNC110 - set by other processes
                await asyncio.sleep(0.001)
    finally:
        await client.aclose()
    return result


@dataclass
class ProcessChain:
    """The figures of one chain of processes."""

    samples: list[float]
    overlaps: int
    failures: int
    first_error: str
    wall: float
    server_cmds_per_handoff: float
    server_cmds_per_steady_handoff: float


async def run_chain(
    url: str,
    admin: Redis,
    subject: Subject,
    key: str,
    waiters: int,
    handoffs: int,
    time_limit: float,
    hold: tuple[float, float],
) -> ProcessChain:
    """Run ``waiters + 1`` member processes, each taking ``subject``, until ``handoffs`` hand-offs.

    The chain also ends when ``time_limit`` has passed.

    Server commands are counted over the whole chain and, for the steady
    state, between the holdings number ``members + 1`` and ``members + 1 +
    max(handoffs // 2, members)``, read from the shared counter.
    """
    members = waiters + 1
    shared = Shared.make()
    start = _CONTEXT.Event()
    results = _CONTEXT.Queue()
    first = members + 1
    last = first + max(handoffs // 2, members)
    plan = Plan(url, subject, key, members, max(handoffs, last + 1), math.inf, hold)
    processes = [
        _CONTEXT.Process(target=member, args=(plan, shared, start, results), daemon=True)
        for _ in range(members)
    ]
    for process in processes:
        process.start()
    outcomes: list[MemberResult] = []
    try:
        # Every member warms up (one acquisition) before the start.
        waited = time.monotonic()
        while shared.ready.value < members:
            if time.monotonic() - waited > START_TIMEOUT:
                raise RuntimeError(f"{members - shared.ready.value} member processes did not start")
            await asyncio.sleep(0.01)
        before = await server_commands(admin)
        started = time.monotonic()
        start.set()
        counts: list[tuple[int, int]] = []
        for mark in (first, last):
            while shared.holdings.value < mark and not shared.done.value:
                if time.monotonic() - started > time_limit:
                    shared.done.value = 1
                    break
                await asyncio.sleep(0.002)
            if not shared.done.value:
                seen = shared.holdings.value
                counts.append((await server_commands(admin), seen))
        while not shared.done.value and time.monotonic() - started <= time_limit:  # noqa: ASYNC110 - set by other processes
            await asyncio.sleep(0.005)
        shared.done.value = 1
        outcomes += [
            await asyncio.to_thread(results.get, True, ACQUIRE_TIMEOUT + 30) for _ in processes
        ]
        wall = time.monotonic() - started
        total = await server_commands(admin) - before - 1 - len(counts)
    finally:
        for process in processes:
            await asyncio.to_thread(process.join, 10)
            if process.is_alive():
                process.kill()
    samples = [s for o in outcomes for s in o.samples]
    steady = math.nan
    if len(counts) == 2 and counts[1][1] > counts[0][1]:
        # The first count's INFO is counted in the second.
        steady = (counts[1][0] - counts[0][0] - 1) / (counts[1][1] - counts[0][1])
    return ProcessChain(
        samples=samples,
        overlaps=count_overlaps(i for o in outcomes for i in o.intervals),
        failures=sum(o.failures for o in outcomes),
        first_error=next((o.first_error for o in outcomes if o.first_error), ""),
        wall=wall,
        server_cmds_per_handoff=total / max(len(samples), 1),
        server_cmds_per_steady_handoff=steady,
    )


def subscriber(url: str, channel: str, ready: Any, results: Any) -> None:
    """The other process of :func:`publish_floor`: note when each message arrives (spawn target)."""
    results.put(asyncio.run(_subscriber(url, channel, ready)))


async def _subscriber(url: str, channel: str, ready: Any) -> list[float]:
    client = Redis.from_url(url)
    pubsub = client.pubsub()
    delays: list[float] = []
    try:
        await pubsub.subscribe(channel)
        while (await pubsub.get_message(timeout=1.0)) is None:
            pass  # the subscription's confirmation
        ready.set()
        while True:
            message = await pubsub.get_message(timeout=None)
            if message is None or message["type"] != "message":
                continue
            arrived = time.monotonic()
            if message["data"] == b"stop":
                return delays
            delays.append(arrived - float(message["data"]))
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()


async def publish_floor(
    url: str, count: int, hold: tuple[float, float], processes: int
) -> list[float]:
    """Time ``count`` notifications from this process to others: ``PUBLISH`` to arrival.

    ``processes`` subscriber processes take the messages in turn (each has
    its own channel), as the members of a chain of that many take the lock:
    each message wakes a process that has slept through the others. Each is
    sent after a ``hold`` pause (as a holder releases after one); the time
    runs from just before the ``PUBLISH`` is sent to when the subscriber
    process has the message.
    """
    results = _CONTEXT.Queue()
    prefix = f"bench:handoff:floor:{random.getrandbits(32):08x}"
    readies = [_CONTEXT.Event() for _ in range(processes)]
    children = [
        _CONTEXT.Process(
            target=subscriber, args=(url, f"{prefix}:{i}", ready, results), daemon=True
        )
        for i, ready in enumerate(readies)
    ]
    for child in children:
        child.start()
    client = Redis.from_url(url)
    try:
        for ready in readies:
            if not await asyncio.to_thread(ready.wait, START_TIMEOUT):
                raise RuntimeError("a subscriber process did not start")
        for index in range(count):
            await asyncio.sleep(random.uniform(*hold))
            await client.publish(f"{prefix}:{index % processes}", repr(time.monotonic()))
        delays: list[float] = []
        for i in range(processes):
            await client.publish(f"{prefix}:{i}", "stop")
        try:
            for _ in children:
                delays += await asyncio.to_thread(results.get, True, 30)
        except queue.Empty:
            raise RuntimeError("a subscriber process sent nothing back") from None
        return delays
    finally:
        await client.aclose()
        for child in children:
            await asyncio.to_thread(child.join, 10)
            if child.is_alive():
                child.kill()


__all__ = ["ProcessChain", "publish_floor", "run_chain"]
