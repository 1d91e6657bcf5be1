"""Throughput and waiting under contention: aiolock against redis-py's lock and a raw floor.

Four workloads, each run with every subject on a private embedded Valkey:

* W1: 1 coroutine, 3000 uncontended acquire + release cycles on one key, in
  60 rounds of 50 with the subjects taking turns (each round starts with the
  next subject in line). A cycle's cost is the median round's wall time per
  cycle; a ratio to the floor is the median over rounds of (the subject's
  cycle / the floor's cycle in the same round). W1 measures both ways a lock
  object is used: *reused* (one lock object for all 3000 cycles, as a worker
  holds one) and *fresh* (a new lock object per acquisition, as a web handler
  makes one: ``async with AsyncLock(client, name): ...`` per request), against
  the one floor;
* W2: 1000 coroutines sharing 2000 acquisitions of one key;
* W3: 50 coroutines sharing 2000 acquisitions;
* W4: 4 processes (spawned, one client each) x 50 coroutines, 2000 acquisitions in all.

Subjects (W2-W4 run ``aiolock``, both ``redis-py`` and ``floor``; W1 also runs
``aiolock fresh`` and ``redis-py reused``):

* ``aiolock``: ``AsyncLock(client, name)`` with every default; one client per
  process shared by all coroutines, one ``AsyncLock`` object per coroutine,
  reused for all its acquisitions (W1 *reused*);
* ``aiolock fresh`` (W1 only): ``async with AsyncLock(client, name, timeout=...)``
  with a new ``AsyncLock`` per acquisition (W1 *fresh*);
* ``redis-py 0.1``/``redis-py 0.001``: ``redis.asyncio.lock.Lock`` with
  ``sleep=0.1`` (its default) and ``sleep=0.001``, a fresh ``Lock`` per
  acquisition (its token is thread-local); ``redis-py 0.1`` is W1's *fresh*
  redis-py (uncontended, the two never sleep);
* ``redis-py reused`` (W1 only): one ``redis.asyncio.lock.Lock`` (``sleep=0.1``)
  for all the coroutine's acquisitions (W1 *reused*);
* ``floor``: one ``SET key token NX PX`` per attempt plus one ``EVALSHA``
  compare-and-delete per release, polling every 1 ms while contended: the
  least a lock can send, written with redis-py's usual API
  (``client.set(key, token, nx=True, px=...)`` and a registered script);
* ``floor raw`` (W1 only): the same two commands sent with
  ``execute_command``, skipping redis-py's argument checks: the least the
  client itself can spend (aiolock sends its commands this way).

Every subject gets the same shared client per process (its pool sized so no
coroutine waits for a connection), the same 10 s lease, a 10 s bound on each
acquisition (a timeout counts as a failure) and a time bound per run, so a
collapsing baseline is reported rather than waited for. Each holder records
``(acquired_at, released_at)`` and holds across one event-loop turn; sorted
intervals must never overlap.

After the main table, a "W1 both ways" table gives, for *reused* and *fresh*,
each subject's cycle in microseconds and its median ratio to the floor; the
targets checked are: one reused ``AsyncLock`` at most 1.2x the floor, and a
fresh ``AsyncLock`` per acquisition at most 1.05x the floor and cheaper than
redis-py's fresh ``Lock`` (median over rounds of the two side by side).

Run ``python -m benchmarks.contention`` (``--quick`` for a smoke run, 10
rounds of 40 W1 cycles); ``--workload W1`` runs only W1, both ways (about
10 s; ``--quick`` about 2 s); ``--w1-rounds N`` changes W1's number of rounds
(50 cycles each, 40 with ``--quick``). The JSON's ``w1`` list holds the
rows of the "W1 both ways" table. To compare two revisions of aiolock in
one run, see ``python -m benchmarks.compare``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from redis.asyncio import Redis
from redis.asyncio.lock import Lock as RedisPyLock
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from aiolock import AcquireTimeout, AsyncLock

from ._common import (
    CountingConnection,
    add_common_args,
    count_overlaps,
    embedded_server,
    finish,
    mark,
    out_dir,
    percentiles,
    print_table,
    repro_command,
    run,
    server_commands,
    write_json,
)

NAME: Final = "contention"
MODULE: Final = "benchmarks.contention"

#: The lease every subject gives its key, in seconds.
LEASE: Final = 10.0
#: The longest one acquisition may wait before it counts as a failure.
ACQUIRE_TIMEOUT: Final = 10.0
#: The floor's polling interval while the key is held.
FLOOR_POLL: Final = 0.001

#: The subjects of every workload.
SUBJECTS: Final = ("aiolock", "redis-py 0.1", "redis-py 0.001", "floor")
#: W1's subjects: every workload's, plus the other way of using each lock.
W1_SUBJECTS: Final = (
    "aiolock",
    "aiolock fresh",
    "redis-py 0.1",
    "redis-py 0.001",
    "redis-py reused",
    "floor",
    "floor raw",
)
#: W1's two ways of using a lock object: (way, aiolock's subject, redis-py's subject).
W1_WAYS: Final = (
    ("reused", "aiolock", "redis-py reused"),
    ("fresh", "aiolock fresh", "redis-py 0.1"),
)
#: W1's cycles per round (the full run's and ``--quick``'s).
W1_ROUND_CYCLES: Final = 50
W1_ROUND_CYCLES_QUICK: Final = 40

#: Compare-and-delete: the floor's release.
_FLOOR_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


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


FULL_WORKLOADS: Final = (
    Workload("W1", 1, 1, 60 * W1_ROUND_CYCLES, rounds=60),
    Workload("W2", 1, 1000, 2000),
    Workload("W3", 1, 50, 2000),
    Workload("W4", 4, 50, 2000),
)
QUICK_WORKLOADS: Final = (
    Workload("W1", 1, 1, 10 * W1_ROUND_CYCLES_QUICK, rounds=10),
    Workload("W2", 1, 50, 100),
    Workload("W3", 1, 10, 100),
    Workload("W4", 2, 5, 50),
)


# -- subjects ------------------------------------------------------------------------------


class Locker(Protocol):
    """What one coroutine uses to take and give back the lock."""

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bound per attempt
        """Wait up to ``timeout`` seconds for the lock; True once held."""

    async def release(self) -> None:
        """Give the lock back."""


class AiolockLocker:
    """aiolock with every default: one ``AsyncLock`` object for the coroutine's life."""

    def __init__(self, client: Redis, key: str, *, fair: bool = False) -> None:
        # `fair` only when set: benchmarks.compare runs this against older aiolocks too.
        options: dict[str, Any] = {"fair": True} if fair else {}
        self._lock = AsyncLock(client, key, ttl=LEASE, **options)

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Acquire with aiolock's own timeout."""
        return await self._lock.acquire(timeout=timeout)

    async def release(self) -> None:
        """Release (aiolock publishes the release to waiters)."""
        await self._lock.release()


class FreshAiolockLocker:
    """aiolock as a web handler uses it: ``async with AsyncLock(...)``, a new object each time."""

    def __init__(self, client: Redis, key: str) -> None:
        self._client = client
        self._key = key
        self._lock: AsyncLock | None = None

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Make a new ``AsyncLock`` with ``timeout`` and enter it as ``async with`` does."""
        self._lock = AsyncLock(self._client, self._key, ttl=LEASE, timeout=timeout)
        try:
            await self._lock.__aenter__()
        except AcquireTimeout:
            return False
        return True

    async def release(self) -> None:
        """Leave the ``async with`` block (a release)."""
        assert self._lock is not None
        await self._lock.__aexit__(None, None, None)


class RedisPyLocker:
    """redis-py's ``Lock``, polling every ``sleep`` s: a fresh object per acquisition.

    With ``reuse=True``, one ``Lock`` object serves every acquisition instead.
    """

    def __init__(self, client: Redis, key: str, sleep: float, *, reuse: bool = False) -> None:
        self._client = client
        self._key = key
        self._sleep = sleep
        self._reuse = reuse
        self._lock: RedisPyLock | None = None
        if reuse:
            self._lock = RedisPyLock(client, key, timeout=LEASE, sleep=sleep)

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Acquire with ``blocking_timeout=timeout``."""
        if not self._reuse or self._lock is None:
            self._lock = RedisPyLock(self._client, self._key, timeout=LEASE, sleep=self._sleep)
        return bool(await self._lock.acquire(blocking_timeout=timeout))

    async def release(self) -> None:
        """Release with redis-py's Lua compare-and-delete."""
        assert self._lock is not None
        await self._lock.release()


class FloorLocker:
    """The least a lock can send: ``SET NX PX`` per attempt, one ``EVALSHA`` to release.

    ``floor`` sends them as a hand-written lock would, with redis-py's usual
    API (``client.set(..., nx=True, px=...)`` and a registered script);
    ``floor raw`` (W1 only) sends the same commands with ``execute_command``,
    without redis-py's argument checks: the least the client can spend.
    """

    def __init__(self, client: Redis, key: str, script: AsyncScript, *, raw: bool) -> None:
        self._client = client
        self._key = key
        self._script = script
        self._raw = raw
        self._token = ""

    async def _set(self, token: str, lease_ms: int) -> bool:
        if self._raw:
            send = self._client.execute_command
            return bool(await send("SET", self._key, token, "NX", "PX", lease_ms))  # type: ignore[no-untyped-call]
        return bool(await self._client.set(self._key, token, nx=True, px=lease_ms))

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Try ``SET NX PX`` every millisecond until it succeeds or ``timeout`` passes."""
        token = secrets.token_hex(16)
        deadline = time.monotonic() + timeout
        lease_ms = int(LEASE * 1000)
        while True:
            if await self._set(token, lease_ms):
                self._token = token
                return True
            if time.monotonic() + FLOOR_POLL > deadline:
                return False
            await asyncio.sleep(FLOOR_POLL)

    async def release(self) -> None:
        """Compare-and-delete in one ``EVALSHA`` (the script is loaded once if missing)."""
        if not self._raw:
            await self._script(keys=[self._key], args=[self._token])
            return
        args = ("EVALSHA", self._script.sha, 1, self._key, self._token)
        try:
            await self._client.execute_command(*args)  # type: ignore[no-untyped-call]
        except NoScriptError:
            await self._client.script_load(_FLOOR_RELEASE)
            await self._client.execute_command(*args)  # type: ignore[no-untyped-call]


def _make_lockers(subject: str, client: Redis, key: str, count: int) -> list[Locker]:
    """Return one locker per coroutine for ``subject``.

    Besides this module's subjects, ``benchmarks.family`` runs ``semaphore N``
    (an aiolock ``Semaphore`` of N permits) and ``zset floor N`` (its floor).
    """
    lockers: list[Locker] = []
    if subject.startswith(("semaphore ", "zset floor ")):
        from .family import semaphore_lockers  # imported here: family imports this module

        lockers.extend(semaphore_lockers(subject, client, key, count))
    elif subject in ("floor", "floor raw"):
        script = client.register_script(_FLOOR_RELEASE)
        raw = subject == "floor raw"
        lockers.extend(FloorLocker(client, key, script, raw=raw) for _ in range(count))
    elif subject == "redis-py reused":
        lockers.extend(RedisPyLocker(client, key, 0.1, reuse=True) for _ in range(count))
    elif subject.startswith("redis-py "):
        sleep = float(subject.removeprefix("redis-py "))
        lockers.extend(RedisPyLocker(client, key, sleep) for _ in range(count))
    elif subject == "aiolock":
        lockers.extend(AiolockLocker(client, key) for _ in range(count))
    elif subject == "aiolock fresh":
        lockers.extend(FreshAiolockLocker(client, key) for _ in range(count))
    else:
        raise ValueError(f"unknown subject {subject!r}")
    return lockers


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


def _client(url: str, coroutines: int) -> Redis:
    """The process's one client: counting, its pool large enough for every coroutine."""
    return Redis.from_url(url, connection_class=CountingConnection, max_connections=coroutines + 16)


async def _warm_up(client: Redis, subject: str, key: str) -> None:
    """Connect and load the subject's scripts, so the measured run starts warm."""
    await client.ping()
    for locker in _make_lockers(subject, client, key, 2):
        if await locker.acquire(ACQUIRE_TIMEOUT):
            await locker.release()


async def _drive(
    client: Redis,
    subject: str,
    key: str,
    coroutines: int,
    acquisitions: int,
    time_limit: float,
) -> Part:
    """Run ``coroutines`` coroutines sharing ``acquisitions`` acquisitions of ``key``."""
    part = Part()
    remaining = acquisitions
    lockers = _make_lockers(subject, client, key, coroutines)
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


# -- W4: several processes -----------------------------------------------------------------


async def _child_main(
    url: str,
    subject: str,
    key: str,
    coroutines: int,
    acquisitions: int,
    time_limit: float,
    ready: Any,
    go: Any,
) -> Part:
    client = _client(url, coroutines)
    try:
        await _warm_up(client, subject, f"{key}:warm")
        ready.put("ready")
        if not await asyncio.to_thread(go.wait, 60.0):
            raise RuntimeError("the parent never said go")
        return await _drive(client, subject, key, coroutines, acquisitions, time_limit)
    finally:
        await client.aclose()


def _child(
    url: str,
    subject: str,
    key: str,
    coroutines: int,
    acquisitions: int,
    time_limit: float,
    loop: str,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """Entry point of a W4 process: warm up, wait for go, drive, send the ``Part`` back."""
    try:
        part = run(
            lambda: _child_main(url, subject, key, coroutines, acquisitions, time_limit, ready, go),
            loop,
        )
        results.put(asdict(part))
    except BaseException as exc:
        results.put({"error": repr(exc)})
        raise


async def _run_processes(
    url: str,
    subject: str,
    key: str,
    workload: Workload,
    time_limit: float,
    loop: str,
    before_go: Callable[[], Awaitable[None]],
) -> list[Part]:
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    results = context.Queue()
    go = context.Event()
    shares = [
        workload.acquisitions // workload.processes
        + (1 if i < workload.acquisitions % workload.processes else 0)
        for i in range(workload.processes)
    ]
    processes = [
        context.Process(
            target=_child,
            args=(
                *(url, subject, key, workload.coroutines, share, time_limit, loop),
                *(ready, go, results),
            ),
            daemon=True,
        )
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
        for _ in processes:
            raw = await asyncio.to_thread(results.get, True, time_limit + ACQUIRE_TIMEOUT + 30)
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


async def _measure_round(
    url: str,
    admin: Redis,
    workload: Workload,
    subject: str,
    acquisitions: int,
    time_limit: float,
    loop: str,
) -> Round:
    key = f"bench:{workload.name}:{subject.replace(' ', '-')}"
    if workload.processes == 1:
        client = _client(url, workload.coroutines)
        try:
            await _warm_up(client, subject, f"{key}:warm")
            server_before = await server_commands(admin)
            parts = [
                await _drive(client, subject, key, workload.coroutines, acquisitions, time_limit)
            ]
        finally:
            await client.aclose()
    else:
        # The children connect and warm up before they report ready; the
        # snapshot is taken when all are ready, just before "go".
        snapshot: list[int] = []

        async def before_go() -> None:
            snapshot.append(await server_commands(admin))

        share = Workload(workload.name, workload.processes, workload.coroutines, acquisitions)
        parts = await _run_processes(url, subject, key, share, time_limit, loop, before_go)
        server_before = snapshot[0]
    # One INFO (the "before" snapshot) is counted between the two snapshots.
    return Round(parts, await server_commands(admin) - server_before - 1)


def _summarize(workload: Workload, subject: str, rounds: Sequence[Round]) -> Outcome:
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
        subject=subject,
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


# -- report --------------------------------------------------------------------------------


@dataclass
class Target:
    """One of the issue's targets, checked against this run's figures."""

    name: str
    passed: bool
    detail: str


def _find(outcomes: Sequence[Outcome], workload: str, subject: str) -> Outcome | None:
    return next((o for o in outcomes if o.workload == workload and o.subject == subject), None)


def _paired(subject: Outcome, baseline: Outcome) -> float:
    """The median over rounds of the subject's cycle over the baseline's in the same round.

    Rounds of the subjects run side by side: the ratio of each pair sees the
    same background load, and their median ignores the odd disturbed pair.
    Rounds where either measured nothing are left out (NaN if none is left).
    """
    ratios = [
        a / b
        for a, b in zip(subject.round_cycle_us, baseline.round_cycle_us, strict=True)
        if math.isfinite(a) and math.isfinite(b) and b > 0
    ]
    return statistics.median(ratios) if ratios else math.nan


@dataclass
class W1Row:
    """One row of the "W1 both ways" table.

    Attributes:
        way: ``"reused"`` (one lock object for every cycle) or ``"fresh"`` (a new
            lock object per acquisition).
        subject: the subject's name.
        cycle_us: the median round's microseconds per cycle.
        best_us: the fastest round's microseconds per cycle.
        vs_floor: the median over rounds of the cycle over the floor's in the same round.
        rounds: how many rounds were measured.
    """

    way: str
    subject: str
    cycle_us: float
    best_us: float
    vs_floor: float
    rounds: int


def _w1_rows(outcomes: Sequence[Outcome]) -> list[W1Row]:
    """The "W1 both ways" rows: for each way, aiolock, redis-py and the floor."""
    floor = _find(outcomes, "W1", "floor")
    rows: list[W1Row] = []
    for way, ours, theirs in W1_WAYS:
        for subject in (ours, theirs, "floor", "floor raw"):
            found = _find(outcomes, "W1", subject)
            if found is None or not found.acquired:
                continue
            rows.append(
                W1Row(
                    way=way,
                    subject=subject,
                    cycle_us=found.cycle_us,
                    best_us=min(found.round_cycle_us),
                    vs_floor=math.nan if floor is None else _paired(found, floor),
                    rounds=len(found.round_cycle_us),
                )
            )
    return rows


def _targets(outcomes: Sequence[Outcome]) -> tuple[dict[str, float], list[Target]]:
    floor_w1 = _find(outcomes, "W1", "floor")
    ratios: dict[str, float] = {}
    targets: list[Target] = []
    if floor_w1 is None or not floor_w1.acquired:
        return ratios, targets
    floor_cycle = floor_w1.cycle_us / 1e6
    floor_rate = 1 / floor_cycle
    ratios["floor_w1_cycle_us"] = floor_cycle * 1e6
    ratios["floor_w1_cycles_per_s"] = floor_rate
    rounds = len(floor_w1.round_cycle_us)
    ours_w1 = _find(outcomes, "W1", "aiolock")
    if ours_w1 is not None and ours_w1.acquired:
        ours_cycle = ours_w1.cycle_us / 1e6
        paired = _paired(ours_w1, floor_w1)
        ratios["aiolock_w1_cycle_us"] = ours_cycle * 1e6
        ratios["aiolock_w1_cycle_vs_floor"] = paired
        ratios["aiolock_w1_cycle_vs_floor_best_rounds"] = min(ours_w1.round_cycle_us) / min(
            floor_w1.round_cycle_us
        )
        targets.append(
            Target(
                "W1 aiolock (one AsyncLock reused) cycle <= 1.2x floor",
                paired <= 1.2,
                f"{paired:.2f}x (median over {rounds} side-by-side rounds; "
                f"median cycle {ours_cycle * 1e6:.0f} us vs {floor_cycle * 1e6:.0f} us, "
                f"best {min(ours_w1.round_cycle_us):.0f} us "
                f"vs {min(floor_w1.round_cycle_us):.0f} us)",
            )
        )
    for subject, key in (
        ("aiolock fresh", "aiolock_fresh"),
        ("redis-py 0.1", "redispy_fresh"),
        ("redis-py reused", "redispy_reused"),
    ):
        found = _find(outcomes, "W1", subject)
        if found is not None and found.acquired:
            ratios[f"{key}_w1_cycle_us"] = found.cycle_us
            ratios[f"{key}_w1_cycle_vs_floor"] = _paired(found, floor_w1)
    fresh = _find(outcomes, "W1", "aiolock fresh")
    theirs = _find(outcomes, "W1", "redis-py 0.1")
    if fresh is not None and fresh.acquired and theirs is not None and theirs.acquired:
        fresh_ratio = _paired(fresh, floor_w1)
        theirs_ratio = _paired(theirs, floor_w1)
        vs_theirs = _paired(fresh, theirs)
        ratios["aiolock_fresh_w1_vs_redispy_fresh"] = vs_theirs
        targets.append(
            Target(
                "W1 aiolock fresh (a new AsyncLock per acquisition) cycle <= 1.05x floor "
                "and < redis-py's fresh Lock",
                fresh_ratio <= 1.05 and vs_theirs < 1,
                f"{fresh_ratio:.3f}x floor, redis-py {theirs_ratio:.3f}x floor, "
                f"aiolock/redis-py {vs_theirs:.3f}x (medians over {rounds} side-by-side rounds; "
                f"median cycle {fresh.cycle_us:.0f} us vs floor {floor_cycle * 1e6:.0f} us, "
                f"redis-py {theirs.cycle_us:.0f} us)",
            )
        )
    w2 = _find(outcomes, "W2", "aiolock")
    if w2 is not None:
        share = w2.acq_per_s / floor_rate
        ratios["aiolock_w2_rate_vs_floor_w1"] = share
        targets.append(
            Target(
                "W2 aiolock: 0 failures, 0 overlaps, <= 4 client cmds/acq, acq/s >= 0.6x floor W1",
                w2.failures == 0
                and w2.overlaps == 0
                and w2.client_cmds_per_acq <= 4
                and share >= 0.6,
                f"{w2.failures} failures, {w2.overlaps} overlaps, "
                f"{w2.client_cmds_per_acq:.2f} cmds/acq, {w2.acq_per_s:.0f} acq/s "
                f"= {share:.2f}x floor W1 ({floor_rate:.0f}/s)",
            )
        )
    w3 = _find(outcomes, "W3", "aiolock")
    if w3 is not None:
        share = w3.acq_per_s / floor_rate
        ratios["aiolock_w3_rate_vs_floor_w1"] = share
        p99 = w3.wait_ms[99]
        targets.append(
            Target(
                "W3 aiolock: acq/s >= 0.6x floor W1, p99 wait < 50 ms",
                share >= 0.6 and p99 < 50,
                f"{w3.acq_per_s:.0f} acq/s = {share:.2f}x floor W1, p99 wait {p99:.1f} ms",
            )
        )
    w4 = _find(outcomes, "W4", "aiolock")
    if w4 is not None:
        ratios["aiolock_w4_rate_vs_floor_w1"] = w4.acq_per_s / floor_rate
    return ratios, targets


def _print(outcomes: Sequence[Outcome], workloads: Sequence[Workload]) -> None:
    floor_w1 = _find(outcomes, "W1", "floor")
    floor_rate = 1e6 / floor_w1.cycle_us if floor_w1 is not None else math.nan
    rows: list[list[object]] = []
    for o in outcomes:
        fail = str(o.failures)
        if o.failures:
            fail += f" ({o.timeouts}t/{o.errors}e/{o.cut}c)"
        rows.append(
            [
                o.workload,
                o.subject,
                f"{o.wall:.2f}",
                f"{o.acquired}/{o.attempted + o.cut}",
                f"{o.acq_per_s:,.0f}",
                f"{o.acq_per_s / floor_rate:.2f}x",
                fail,
                f"{o.wait_ms[50]:.2f}",
                f"{o.wait_ms[99]:.2f}",
                f"{o.wait_ms[100]:.1f}",
                f"{o.client_cmds_per_acq:.2f}",
                f"{o.server_cmds_per_acq:.2f}",
                str(o.overlaps),
            ]
        )
    print_table(
        "Contention: " + "; ".join(w.label for w in workloads),
        [
            "load",
            "subject",
            "wall s",
            "acq ok",
            "acq/s",
            "vs floor W1",
            "failures",
            "wait p50 ms",
            "p99 ms",
            "max ms",
            "client cmd/acq",
            "server cmd/acq",
            "overlaps",
        ],
        rows,
    )
    errors = [o for o in outcomes if o.first_error]
    for o in errors:
        print(f"  {o.workload} {o.subject}: first error: {o.first_error}")
    print(
        "  failures = timeouts (t) + errors (e) + acquisitions cut by the time bound (c); "
        "vs floor W1 = acq/s over the floor's uncontended W1 cycles/s (median round)"
    )
    w1 = next((w for w in workloads if w.name == "W1"), None)
    w1_rows = _w1_rows(outcomes)
    if w1 is None or not w1_rows:
        return
    objects = {
        "aiolock": "one AsyncLock",
        "aiolock fresh": "new AsyncLock each",
        "redis-py reused": "one Lock",
        "redis-py 0.1": "new Lock each",
        "floor": "-",
        "floor raw": "-",
    }
    print_table(
        f"W1 both ways: 1 coroutine, uncontended acquire + release, {w1.rounds} rounds of "
        f"{w1.acquisitions // max(w1.rounds, 1)} cycles, subjects taking turns in each round",
        ["way", "subject", "lock object", "cycle us", "best us", "vs floor"],
        [
            [
                r.way,
                r.subject,
                objects.get(r.subject, ""),
                f"{r.cycle_us:.1f}",
                f"{r.best_us:.1f}",
                f"{r.vs_floor:.3f}x",
            ]
            for r in w1_rows
        ],
    )
    print(
        "  cycle us = the median round's microseconds per acquire + release; best us = the "
        "fastest round's; vs floor = the median over rounds of (cycle / the floor's cycle in "
        "the same round); fresh aiolock enters and leaves `async with` on a new AsyncLock"
    )


def _chart(path: Path, outcomes: Sequence[Outcome], workloads: Sequence[Workload]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate_ax, wait_ax) = plt.subplots(1, 2, figsize=(13, 5))
    # Each workload's bars are centred on it; W1 has more subjects than the others.
    present = {
        w.name: [s for s in W1_SUBJECTS if _find(outcomes, w.name, s) is not None]
        for w in workloads
    }
    width = 0.8 / max((len(names) for names in present.values()), default=1)
    for subject in W1_SUBJECTS:
        xs: list[float] = []
        rates: list[float] = []
        p99s: list[float] = []
        fails: list[int] = []
        for position, workload in enumerate(workloads):
            found = _find(outcomes, workload.name, subject)
            if found is None:
                continue
            names = present[workload.name]
            xs.append(position + (names.index(subject) - (len(names) - 1) / 2) * width)
            rates.append(max(found.acq_per_s, 0.1))
            p99s.append(max(found.wait_ms[99] if found.acquired else 0.0, 0.01))
            fails.append(found.failures)
        if not xs:
            continue
        rate_ax.bar(xs, rates, width, label=subject)
        wait_ax.bar(xs, p99s, width, label=subject)
        for x, rate, failed in zip(xs, rates, fails, strict=True):
            if failed:
                rate_ax.annotate(
                    f"{failed} fail",
                    (x, rate),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="red",
                    rotation=90,
                )
    labels = [w.label.replace(", ", "\n") for w in workloads]
    for ax in (rate_ax, wait_ax):
        ax.set_xticks(range(len(workloads)), labels, fontsize=8)
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    rate_ax.set_ylabel("acquisitions/s (log)")
    rate_ax.set_title("Throughput (higher is better)")
    wait_ax.set_ylabel("p99 wait, ms (log)")
    wait_ax.set_title("p99 wait to acquire (lower is better)")
    low, high = rate_ax.get_ylim()
    rate_ax.set_ylim(low, high * 12)  # room for the legend above the bars (log scale)
    rate_ax.legend(fontsize=8, ncols=3, loc="upper center")
    figure.suptitle("aiolock contention benchmark (embedded Valkey, loopback)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# -- main ----------------------------------------------------------------------------------


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    workloads: tuple[Workload, ...] = QUICK_WORKLOADS if args.quick else FULL_WORKLOADS
    if args.w1_rounds is not None:
        per_round = W1_ROUND_CYCLES_QUICK if args.quick else W1_ROUND_CYCLES
        workloads = tuple(
            Workload(w.name, w.processes, w.coroutines, args.w1_rounds * per_round, args.w1_rounds)
            if w.name == "W1"
            else w
            for w in workloads
        )
    if args.only_workload:
        workloads = tuple(w for w in workloads if w.name in args.only_workload)
    chosen = set(args.subject or W1_SUBJECTS)
    time_limit = args.time_limit if args.time_limit is not None else (2.0 if args.quick else 15.0)
    outcomes: list[Outcome] = []
    ran: list[str] = []
    with embedded_server() as server:
        admin = Redis.from_url(server.url)
        try:
            for workload in workloads:
                subjects = [
                    s for s in (W1_SUBJECTS if workload.name == "W1" else SUBJECTS) if s in chosen
                ]
                ran.extend(s for s in subjects if s not in ran)
                rounds: dict[str, list[Round]] = {subject: [] for subject in subjects}
                # Rounds interleave the subjects, so a burst of load elsewhere on
                # the machine does not fall on one subject only; each round starts
                # with the next subject in line, so none always runs first.
                for index in range(workload.rounds):
                    share = workload.acquisitions // workload.rounds + (
                        1 if index < workload.acquisitions % workload.rounds else 0
                    )
                    turn = index % len(subjects) if subjects else 0
                    for subject in subjects[turn:] + subjects[:turn]:
                        rounds[subject].append(
                            await _measure_round(
                                server.url, admin, workload, subject, share, time_limit, args.loop
                            )
                        )
                for subject in subjects:
                    outcome = _summarize(workload, subject, rounds[subject])
                    outcomes.append(outcome)
                    print(
                        f"  {workload.name} {subject:<16} {outcome.wall:6.2f} s "
                        f"{outcome.acq_per_s:9,.0f} acq/s  failures {outcome.failures}  "
                        f"overlaps {outcome.overlaps}",
                        flush=True,
                    )
        finally:
            await admin.aclose()
    return {
        "workloads": [asdict(w) for w in workloads],
        "subjects": ran,
        "time_limit_s": time_limit,
        "acquire_timeout_s": ACQUIRE_TIMEOUT,
        "lease_s": LEASE,
        "outcomes": outcomes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the contention benchmark; 1 if any run saw an overlap, 3 if a target was missed.

    Args:
        argv: command-line options (``sys.argv[1:]`` when None).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    add_common_args(parser)
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds each (workload, subject) run may take (default 15, 2 with --quick)",
    )
    parser.add_argument(
        "--workload",
        dest="only_workload",
        action="append",
        choices=("W1", "W2", "W3", "W4"),
        help="run only this workload (repeatable); W1 runs both ways (reused and fresh)",
    )
    parser.add_argument(
        "--subject",
        action="append",
        choices=W1_SUBJECTS,
        help="run only this subject (repeatable; 'aiolock fresh' and 'redis-py reused' "
        "are W1's only)",
    )
    parser.add_argument(
        "--w1-rounds",
        type=int,
        default=None,
        help=f"W1's rounds, of {W1_ROUND_CYCLES} cycles each ({W1_ROUND_CYCLES_QUICK} with "
        "--quick); default 30 (10 with --quick)",
    )
    args = parser.parse_args(argv)
    if args.w1_rounds is not None and args.w1_rounds < 1:
        parser.error("--w1-rounds must be at least 1")
    argv_list = list(sys.argv[1:] if argv is None else argv)
    directory = out_dir(args)
    print(f"contention benchmark (loop={args.loop}{', quick' if args.quick else ''})", flush=True)
    result = run(lambda: _main(args), args.loop)
    outcomes: list[Outcome] = result["outcomes"]
    workloads = [Workload(**w) for w in result["workloads"]]
    _print(outcomes, workloads)
    ratios, targets = _targets(outcomes)
    for target in targets:
        print(f"{mark(target.passed, args.quick)}  {target.name}: {target.detail}")
    missed = 0 if args.quick else sum(not target.passed for target in targets)
    overlaps = sum(o.overlaps for o in outcomes)
    chart = directory / f"{NAME}.png"
    _chart(chart, outcomes, workloads)
    write_json(
        directory / f"{NAME}.json",
        {
            "benchmark": NAME,
            "command": repro_command(MODULE, argv_list),
            "loop": args.loop,
            "quick": args.quick,
            **{k: v for k, v in result.items() if k != "outcomes"},
            "outcomes": [asdict(o) for o in outcomes],
            "ratios": ratios,
            "w1": [asdict(r) for r in _w1_rows(outcomes)],
            "targets": [asdict(t) for t in targets],
            "overlaps": overlaps,
        },
    )
    return finish(MODULE, argv_list, chart, directory / f"{NAME}.json", overlaps, missed)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
