"""Coroutines sharing the acquisitions of one key, in rounds: ``contention`` and ``family``.

A :class:`Workload` says how many processes (spawned, one client each) run
how many coroutines, and how many acquisitions they share in all, split into
rounds. :func:`run_rounds` measures every subject round by round, the
subjects taking turns (:func:`benchmarks._runner.in_turn`), and
:func:`summarize` adds a subject's rounds up into its :class:`Outcome`.

In a round every coroutine takes the lock through its own locker
(:meth:`benchmarks._subjects.Subject.lockers`), records
``(acquired_at, released_at)``, holds across one event-loop turn and releases,
until the round's acquisitions are done or its time bound passes (a
collapsing subject is reported, not waited for). Each acquisition is bounded
(a timeout counts as a failure). Every subject gets the same shared client
per process, its pool sized so that no coroutine waits for a connection, and
warms up (connects, loads its scripts) before the round starts.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from redis.asyncio import Redis

from ._measure import CountingConnection, count_overlaps, percentiles, server_commands
from ._runner import in_turn, run
from ._subjects import Locker, Subject

__all__ = [
    "ACQUIRE_TIMEOUT",
    "Outcome",
    "Part",
    "Round",
    "Workload",
    "run_rounds",
    "summarize",
]

#: The longest one acquisition may wait before it counts as a failure.
ACQUIRE_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class Workload:
    """One contention pattern.

    Attributes:
        name: short name (``W1`` ...).
        processes: how many processes run coroutines (1: the benchmark's own).
        coroutines: coroutines per process.
        acquisitions: acquisitions in all, shared by every coroutine.
        rounds: how many rounds the acquisitions are split into (the subjects
            take turns round by round).
    """

    name: str
    processes: int
    coroutines: int
    acquisitions: int
    rounds: int = 1

    @property
    def label(self) -> str:
        """A one-line description, e.g. ``W4 4x50 coroutines, 2000 acq``."""
        shape = (
            f"{self.processes}x{self.coroutines}" if self.processes > 1 else str(self.coroutines)
        )
        noun = "coroutine" if self.coroutines == 1 and self.processes == 1 else "coroutines"
        return f"{self.name} {shape} {noun}, {self.acquisitions} acq"


# -- driving one process's share -----------------------------------------------------------


@dataclass
class Part:
    """What one process measured (all times on ``time.monotonic()``).

    Attributes:
        started: when the coroutines were let go.
        ended: when the last coroutine finished.
        acquired: successful acquisitions.
        timeouts: acquisitions that gave up after their bound.
        errors: acquisitions or releases that raised.
        cut: acquisitions never attempted because the time bound passed.
        hung: coroutines cancelled by the safety net (the bound plus a margin).
        waits: seconds from asking for the lock to holding it, per success.
        intervals: ``(acquired_at, released_at)`` per success.
        client_commands: commands this process's client sent.
        first_error: the first error's text, if any.
    """

    started: float = 0.0
    ended: float = 0.0
    acquired: int = 0
    timeouts: int = 0
    errors: int = 0
    cut: int = 0
    hung: int = 0
    waits: list[float] = field(default_factory=list)
    intervals: list[tuple[float, float]] = field(default_factory=list)
    client_commands: int = 0
    first_error: str = ""


@dataclass(frozen=True)
class _Share:
    """One process's share of a round: what it drives, where, how long.

    Attributes:
        url: the server.
        subject: what the coroutines take.
        key: the lock's name.
        coroutines: how many coroutines.
        acquisitions: how many acquisitions they share.
        time_limit: seconds after which no acquisition starts.
    """

    url: str
    subject: Subject
    key: str
    coroutines: int
    acquisitions: int
    time_limit: float


def _client(url: str, coroutines: int) -> Redis:
    """The process's one client: counting, its pool large enough for every coroutine."""
    return Redis.from_url(url, connection_class=CountingConnection, max_connections=coroutines + 16)


async def _warm_up(client: Redis, subject: Subject, key: str) -> None:
    """Connect and load the subject's scripts, so the measured run starts warm."""
    await client.ping()
    for locker in subject.lockers([client], key, 2):
        if await locker.acquire(ACQUIRE_TIMEOUT):
            await locker.release()


async def _drive(client: Redis, share: _Share) -> Part:
    """Run the share's coroutines until they have made its acquisitions (or time is up)."""
    part = Part()
    remaining = share.acquisitions
    time_limit = share.time_limit
    lockers = share.subject.lockers([client], share.key, share.coroutines)
    part.started = time.monotonic()
    deadline = part.started + time_limit

    async def worker(locker: Locker) -> None:
        nonlocal remaining
        while remaining > 0:
            now = time.monotonic()
            if now >= deadline:
                break
            remaining -= 1
            asked = time.monotonic()
            try:
                held = await locker.acquire(min(ACQUIRE_TIMEOUT, deadline - now))
            except Exception as exc:
                part.errors += 1
                part.first_error = part.first_error or f"acquire: {exc!r}"
                continue
            if not held:
                part.timeouts += 1
                continue
            acquired_at = time.monotonic()
            await asyncio.sleep(0)  # hold across one loop turn, so overlaps would show
            released_at = time.monotonic()
            part.acquired += 1
            part.waits.append(acquired_at - asked)
            part.intervals.append((acquired_at, released_at))
            try:
                await locker.release()
            except Exception as exc:
                part.errors += 1
                part.first_error = part.first_error or f"release: {exc!r}"

    sent_before = CountingConnection.sent
    tasks = [asyncio.create_task(worker(locker)) for locker in lockers]
    _, pending = await asyncio.wait(tasks, timeout=time_limit + ACQUIRE_TIMEOUT + 5)
    for task in pending:
        task.cancel()
    part.hung = len(pending)
    if pending:
        await asyncio.wait(pending, timeout=5)
    part.ended = time.monotonic()
    part.cut = remaining
    part.client_commands = CountingConnection.sent - sent_before
    return part


# -- several processes ---------------------------------------------------------------------


async def _child_main(share: _Share, ready: Any, go: Any) -> Part:
    client = _client(share.url, share.coroutines)
    try:
        await _warm_up(client, share.subject, f"{share.key}:warm")
        ready.put("ready")
        if not await asyncio.to_thread(go.wait, 60.0):
            raise RuntimeError("the parent never said go")
        return await _drive(client, share)
    finally:
        await client.aclose()


def _child(share: _Share, loop: str, ready: Any, go: Any, results: Any) -> None:
    """Entry point of a process: warm up, wait for go, drive, send the ``Part`` back."""
    try:
        part = run(lambda: _child_main(share, ready, go), loop)
        results.put(asdict(part))
    except BaseException as exc:
        results.put({"error": repr(exc)})
        raise


async def _run_processes(
    shares: Sequence[_Share], loop: str, before_go: Callable[[], Awaitable[None]]
) -> list[Part]:
    """Run one process per share; ``before_go()`` once all are warm, just before they start."""
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    results = context.Queue()
    go = context.Event()
    processes = [
        context.Process(target=_child, args=(share, loop, ready, go, results), daemon=True)
        for share in shares
    ]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            await asyncio.to_thread(ready.get, True, 60.0)
        await before_go()
        go.set()
        parts: list[Part] = []
        for share in shares:
            bound = share.time_limit + ACQUIRE_TIMEOUT + 30
            raw = await asyncio.to_thread(results.get, True, bound)
            if "error" in raw:
                raise RuntimeError(f"a W4 process failed: {raw['error']}")
            raw["intervals"] = [tuple(pair) for pair in raw["intervals"]]
            parts.append(Part(**raw))
        return parts
    finally:
        for process in processes:
            await asyncio.to_thread(process.join, 10.0)
            if process.is_alive():
                process.kill()
                process.join()


# -- one measurement -----------------------------------------------------------------------


@dataclass
class Outcome:
    """The figures of one (workload, subject) run."""

    workload: str
    subject: str
    processes: int
    coroutines: int
    attempted: int
    wall: float
    acquired: int
    timeouts: int
    errors: int
    cut: int
    hung: int
    failures: int
    acq_per_s: float
    wait_ms: dict[int, float]
    client_cmds_per_acq: float
    server_cmds_per_acq: float
    overlaps: int
    first_error: str
    round_cycle_us: list[float]

    @property
    def cycle_us(self) -> float:
        """The median round's microseconds per acquisition (wall / acquisitions)."""
        return statistics.median(self.round_cycle_us)


@dataclass
class Round:
    """One measured run of a (workload, subject): the processes' parts and server commands."""

    parts: list[Part]
    server_commands: int

    @property
    def wall(self) -> float:
        """Seconds from the first coroutine let go to the last one finished."""
        return max(p.ended for p in self.parts) - min(p.started for p in self.parts)

    @property
    def acquired(self) -> int:
        """Successful acquisitions."""
        return sum(p.acquired for p in self.parts)


def _split(total: int, ways: int) -> list[int]:
    """``total`` in ``ways`` shares; where it does not divide, the first ones one larger."""
    return [total // ways + (1 if index < total % ways else 0) for index in range(ways)]


async def _measure_round(
    url: str,
    admin: Redis,
    workload: Workload,
    subject: Subject,
    acquisitions: int,
    time_limit: float,
    loop: str,
) -> Round:
    key = f"bench:{workload.name}:{subject.label.replace(' ', '-')}"
    if workload.processes == 1:
        share = _Share(url, subject, key, workload.coroutines, acquisitions, time_limit)
        client = _client(url, workload.coroutines)
        try:
            await _warm_up(client, subject, f"{key}:warm")
            server_before = await server_commands(admin)
            parts = [await _drive(client, share)]
        finally:
            await client.aclose()
    else:
        # The children connect and warm up before they report ready; the
        # snapshot is taken when all are ready, just before "go".
        snapshot: list[int] = []

        async def before_go() -> None:
            snapshot.append(await server_commands(admin))

        shares = [
            _Share(url, subject, key, workload.coroutines, count, time_limit)
            for count in _split(acquisitions, workload.processes)
        ]
        parts = await _run_processes(shares, loop, before_go)
        server_before = snapshot[0]
    # One INFO (the "before" snapshot) is counted between the two snapshots.
    return Round(parts, await server_commands(admin) - server_before - 1)


async def run_rounds(
    url: str,
    admin: Redis,
    workload: Workload,
    subjects: Sequence[Subject],
    time_limit: float,
    loop: str,
) -> dict[Subject, list[Round]]:
    """Measure every subject on ``workload``, round by round, the subjects taking turns.

    Args:
        url: the server.
        admin: a client of it, to count the commands it runs.
        workload: the processes, coroutines, acquisitions and rounds.
        subjects: what is measured.
        time_limit: seconds each (round, subject) run may take.
        loop: the processes' event loop: ``"asyncio"`` or ``"uvloop"``.

    Returns:
        Each subject's rounds, in order.
    """
    rounds: dict[Subject, list[Round]] = {subject: [] for subject in subjects}
    for index, share in enumerate(_split(workload.acquisitions, workload.rounds)):
        for subject in in_turn(subjects, index):
            rounds[subject].append(
                await _measure_round(url, admin, workload, subject, share, time_limit, loop)
            )
    return rounds


def summarize(workload: Workload, subject: Subject, rounds: Sequence[Round]) -> Outcome:
    """Add up the rounds of one (workload, subject) into its figures."""
    parts = [p for r in rounds for p in r.parts]
    acquired = sum(p.acquired for p in parts)
    timeouts = sum(p.timeouts for p in parts)
    errors = sum(p.errors for p in parts)
    cut = sum(p.cut for p in parts)
    hung = sum(p.hung for p in parts)
    wall = sum(r.wall for r in rounds)
    waits = [w for p in parts for w in p.waits]
    # Rounds run one after another, so their intervals can be checked together.
    intervals = [i for p in parts for i in p.intervals]
    per = max(acquired, 1)
    return Outcome(
        workload=workload.name,
        subject=subject.label,
        processes=workload.processes,
        coroutines=workload.coroutines,
        attempted=workload.acquisitions - cut,
        wall=wall,
        acquired=acquired,
        timeouts=timeouts,
        errors=errors,
        cut=cut,
        hung=hung,
        failures=timeouts + errors + cut + hung,
        acq_per_s=acquired / wall if wall > 0 else math.nan,
        wait_ms={k: v * 1000 for k, v in percentiles(waits).items()},
        client_cmds_per_acq=sum(p.client_commands for p in parts) / per,
        server_cmds_per_acq=sum(r.server_commands for r in rounds) / per,
        overlaps=count_overlaps(intervals),
        first_error=next((p.first_error for p in parts if p.first_error), ""),
        round_cycle_us=[r.wall / r.acquired * 1e6 if r.acquired else math.nan for r in rounds],
    )
