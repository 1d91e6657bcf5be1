"""One worker process of the soak run (:mod:`benchmarks.soak`).

A worker runs ``coroutines`` coroutines on one lock client (connected through
the coordinator's fault proxy) and one resource client (straight to the
resource server, which is never faulted). Each coroutine loops until told to
stop: it picks a random name and, holding ``AsyncLock(..., fencing=True)``:

1. adds its mark to the name's set of holders *inside* on the resource
   server (:data:`ENTER`); if other marks are already there, that is an
   **overlap** (two holders in the critical section at once), recorded with
   both holders' ids, for every other holder;
2. read-modify-writes an *unfenced* counter (``GET``, a pause, ``SET``);
3. read-modify-writes a *fenced* counter through two scripts that carry the
   holding's fence (see :data:`FENCED_READ` and :data:`FENCED_WRITE`): the
   resource turns away a stale or reused fence;
4. removes its mark.

Every write the resource acknowledged is counted per name; the coordinator
compares these counts with the final counters (lost updates).

Errors never end a coroutine: they are counted by phase and type, with an
example message, and the loop goes on. ``aiolock``'s own log records (losses
and their reasons, failed renewals, interrupted release notifications) are
counted, not printed. On ``("block", seconds)`` from the coordinator the
worker's event loop is blocked with ``time.sleep`` (a holder frozen past its
lease). After ``stop`` the coroutines finish their iteration (bounded), and
the worker checks for leaks (tasks still running, connections still checked
out, locks still held) and reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing.queues
import os
import queue
import random
import signal
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from aiolock import AcquireTimeout, AsyncLock, LockError, LockLostError

from ._runner import run
from ._subjects import SOAK

__all__ = [
    "ENTER",
    "FENCED_READ",
    "FENCED_WRITE",
    "WorkerConfig",
    "WorkerReport",
    "resource_keys",
    "worker_main",
]

#: Milliseconds a mark stays inside at most (a safety net: it is always removed).
MARK_MS: Final = 30_000
#: How many overlap records a worker keeps in full.
RECORDS_CAP: Final = 2000
#: Seconds between progress messages to the coordinator.
PROGRESS_EVERY: Final = 1.0
#: Seconds the worker waits for tasks to end by themselves after the coroutines are done.
LEAK_WAIT: Final = 3.0

# FENCED_READ: the read half of a fenced read-modify-write.
#   KEYS[1]  the counter
#   KEYS[2]  a hash: the highest fence seen ('fence') and the acquisition that sent it ('holder')
#   ARGV[1]  the holding's fence
#   ARGV[2]  the acquisition's id (unique per acquisition)
# A fence lower than the highest seen is stale: {0, 0}. The same fence from
# another acquisition (fences start over when the lock server restarts
# empty) is reused: {2, 0}. Otherwise the fence is recorded as the highest
# seen, and {1, counter} is returned. Recording the fence at the read, not
# only at the write, is what makes the read-modify-write safe: a stale
# holder's write landing between a newer holder's read and write is refused.
FENCED_READ: Final = """
local seen = redis.call('HMGET', KEYS[2], 'fence', 'holder')
local last = tonumber(seen[1] or '0')
local fence = tonumber(ARGV[1])
if fence < last then
    return {0, 0}
end
if fence == last and seen[2] ~= ARGV[2] then
    return {2, 0}
end
redis.call('HSET', KEYS[2], 'fence', ARGV[1], 'holder', ARGV[2])
return {1, tonumber(redis.call('GET', KEYS[1]) or '0')}
"""

# FENCED_WRITE: the write half.
#   KEYS[1]  the counter
#   KEYS[2]  the hash of FENCED_READ
#   ARGV[1]  the holding's fence
#   ARGV[2]  the acquisition's id
#   ARGV[3]  the new value of the counter
# Returns 1 if written; 0 (stale) or 2 (reused) as in FENCED_READ, and then
# nothing is written.
FENCED_WRITE: Final = """
local seen = redis.call('HMGET', KEYS[2], 'fence', 'holder')
local last = tonumber(seen[1] or '0')
local fence = tonumber(ARGV[1])
if fence < last then
    return 0
end
if fence == last and seen[2] ~= ARGV[2] then
    return 2
end
redis.call('HSET', KEYS[2], 'fence', ARGV[1], 'holder', ARGV[2])
redis.call('SET', KEYS[1], ARGV[3])
return 1
"""

# ENTER: step into the critical section and see who else is in it.
#   KEYS[1]  a sorted set of the holders inside, scored by the server's time in ms
#   ARGV[1]  this holder's mark
#   ARGV[2]  milliseconds after which a mark is dropped (a holder that never left)
# Returns the marks of the holders already inside (empty: we are alone).
# Leaving is a ZREM of our own mark.
ENTER: Final = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - tonumber(ARGV[2]))
local others = redis.call('ZRANGE', KEYS[1], 0, -1)
redis.call('ZADD', KEYS[1], ms, ARGV[1])
return others
"""


def resource_keys(name: str) -> dict[str, str]:
    """Return the resource server's keys for one lock name.

    Args:
        name: the lock's name.

    Returns:
        ``inside`` (the set of marks inside), ``unfenced`` and ``fenced`` (the counters) and
        ``fence`` (the hash of the highest fence seen).
    """
    return {
        "inside": f"soak:{name}:inside",
        "unfenced": f"soak:{name}:unfenced",
        "fenced": f"soak:{name}:fenced",
        "fence": f"soak:{name}:fence",
    }


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker runs (picklable: it crosses to a spawned process).

    Attributes:
        worker: the worker's index.
        lock_url: the lock server, through the fault proxy.
        resource_url: the resource server (never faulted).
        names: the lock names the coroutines pick from.
        coroutines: how many coroutines the worker runs.
        ttl: the lease of every lock, in seconds.
        acquire_timeout: how long one acquisition may wait, in seconds.
        socket_timeout: the lock client's socket (and connect) timeout.
        long_hold: the probability that a holding pauses for a large part of
            the lease (so renewal runs, and faults catch holders mid-write).
        draw: the number the coroutines draw their random choices from.
        loop: ``"asyncio"`` or ``"uvloop"``.
        deadline: a ``time.monotonic()`` after which the worker exits by
            itself whatever happens (the coordinator's hard bound).
        drain: seconds the coroutines get to finish after ``stop``.
    """

    worker: int
    lock_url: str
    resource_url: str
    names: tuple[str, ...]
    coroutines: int
    ttl: float
    acquire_timeout: float
    socket_timeout: float
    long_hold: float
    draw: int
    loop: str
    deadline: float
    drain: float


@dataclass
class WorkerReport:
    """What a worker measured; sent to the coordinator as a dict (``asdict``).

    Times are ``time.monotonic()`` readings, comparable between processes on
    Linux (the clock is system-wide).

    Attributes:
        worker: the worker's index.
        started: when the coroutines were let go.
        stopped: when they were told to stop.
        acquisitions: holdings that reached the critical section.
        acquire_timeouts: ``async with`` raised ``AcquireTimeout``.
        on_lost: ``on_lost`` callbacks (losses declared by aiolock).
        lost_errors: ``LockLostError`` raised by ``async with``.
        loss_times: when each ``on_lost`` ran.
        loss_reasons: aiolock's stated reason of each loss (its log), counted.
        renewal_failures: failed renewal attempts by error type (its log).
        notify_interruptions: release-notification connections that broke (its log).
        overlaps: holders that found another holder inside.
        overlap_records: the first overlaps in full (time, name, both marks),
            one per pair of holders.
        overlapped: the distinct marks found inside (holders overlapped by others).
        lost_holders: the ids of holdings aiolock declared lost (``lock.lost``
            after ``async with``, whatever it raised).
        errors: errors by ``"phase: module.Type"``.
        error_examples: the first message of each.
        error_times: ``(time, key)`` of each error.
        no_message: errors whose ``str()`` was empty, by key.
        unexpected: exceptions that are neither redis-py's nor aiolock's, by key.
        unexpected_tracebacks: their first tracebacks.
        unfenced_acked: acknowledged unfenced increments per name.
        fenced_acked: acknowledged fenced increments per name.
        fenced_rejected: fenced reads or writes turned away, by ``stale``/``reused``.
        rejection_times: ``(time, why)`` of each.
        blocks: ``(start, end)`` of each event-loop block.
        hung: coroutines still running at the drain bound (then cancelled).
        crashed: tracebacks of coroutines that ended by an exception.
        leaked_tasks: tasks still running after the coroutines and a grace period.
        held_at_end: locks this worker still held after its coroutines ended.
        connections_in_use: connections still checked out, lock and resource client.
    """

    worker: int
    started: float = 0.0
    stopped: float = 0.0
    acquisitions: int = 0
    acquire_timeouts: int = 0
    on_lost: int = 0
    lost_errors: int = 0
    loss_times: list[float] = field(default_factory=list)
    loss_reasons: dict[str, int] = field(default_factory=dict)
    renewal_failures: dict[str, int] = field(default_factory=dict)
    notify_interruptions: int = 0
    overlaps: int = 0
    overlap_records: list[dict[str, Any]] = field(default_factory=list)
    overlapped: list[str] = field(default_factory=list)
    lost_holders: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)
    error_times: list[tuple[float, str]] = field(default_factory=list)
    no_message: dict[str, int] = field(default_factory=dict)
    unexpected: dict[str, int] = field(default_factory=dict)
    unexpected_tracebacks: list[str] = field(default_factory=list)
    unfenced_acked: dict[str, int] = field(default_factory=dict)
    fenced_acked: dict[str, int] = field(default_factory=dict)
    fenced_rejected: dict[str, int] = field(default_factory=dict)
    rejection_times: list[tuple[float, str]] = field(default_factory=list)
    blocks: list[tuple[float, float]] = field(default_factory=list)
    hung: int = 0
    crashed: list[str] = field(default_factory=list)
    leaked_tasks: list[str] = field(default_factory=list)
    held_at_end: int = 0
    connections_in_use: list[int] = field(default_factory=list)


def _bump(counts: dict[str, int], key: str, by: int = 1) -> None:
    counts[key] = counts.get(key, 0) + by


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


class _LogTally(logging.Handler):
    """Counts aiolock's warnings (losses, failed renewals, broken notifications)."""

    def __init__(self, report: WorkerReport) -> None:
        super().__init__(logging.WARNING)
        self._report = report

    def emit(self, record: logging.LogRecord) -> None:
        """Count one record by what it says (never prints it)."""
        args = record.args if isinstance(record.args, tuple) else ()
        report = self._report
        if record.msg == "lost lock %r: %s" and len(args) == 2:
            _bump(report.loss_reasons, str(args[1]))
        elif str(record.msg).startswith("renewal of lock %r failed") and len(args) >= 2:
            _bump(report.renewal_failures, str(args[1]))
        elif "release notifications interrupted" in str(record.msg):
            report.notify_interruptions += 1
        elif record.levelno >= logging.ERROR:
            # e.g. "on_lost callback raised": a defect, not a fault.
            _bump(report.unexpected, f"log: {record.getMessage()[:120]}")


class _Worker:
    """The coroutines of one worker process and their bookkeeping."""

    def __init__(self, config: WorkerConfig, results: multiprocessing.queues.Queue[Any]) -> None:
        self.config = config
        self.results = results
        self.report = WorkerReport(worker=config.worker)
        self.stopping = False
        self.go = asyncio.Event()
        self.stop = asyncio.Event()
        self.exit = asyncio.Event()
        self.locks: list[AsyncLock] = []
        self.overlapped: set[str] = set()
        self.lock_client = Redis.from_url(
            config.lock_url,
            socket_timeout=config.socket_timeout,
            socket_connect_timeout=config.socket_timeout,
        )
        self.resource = Redis.from_url(config.resource_url, socket_timeout=30.0)
        self.fenced_read: AsyncScript = self.resource.register_script(FENCED_READ)
        self.fenced_write: AsyncScript = self.resource.register_script(FENCED_WRITE)
        self.enter: AsyncScript = self.resource.register_script(ENTER)

    # -- control from the coordinator (called in the loop) -----------------------------

    def block(self, seconds: float) -> None:
        """Block the event loop for ``seconds`` (the loop-block fault)."""
        started = time.monotonic()
        time.sleep(seconds)
        self.report.blocks.append((started, time.monotonic()))

    def on_lost(self, lock: AsyncLock) -> None:
        """Count a loss that aiolock declared."""
        self.report.on_lost += 1
        self.report.loss_times.append(time.monotonic())

    # -- one coroutine -----------------------------------------------------------------

    def _error(self, phase: str, exc: BaseException) -> None:
        report = self.report
        key = f"{phase}: {_type_name(exc)}"
        known = isinstance(exc, (RedisError, LockError))
        if not known:
            _bump(report.unexpected, key)
            if len(report.unexpected_tracebacks) < 5:
                report.unexpected_tracebacks.append("".join(traceback.format_exception(exc)))
        _bump(report.errors, key)
        report.error_times.append((time.monotonic(), key))
        message = str(exc)
        if not message.strip():
            _bump(report.no_message, key)
        report.error_examples.setdefault(key, message[:300] or "(empty message)")

    def _rejected(self, why: str) -> None:
        _bump(self.report.fenced_rejected, why)
        self.report.rejection_times.append((time.monotonic(), why))

    async def coroutine(self, index: int) -> None:
        """Take random locks and do checked read-modify-writes until told to stop."""
        config = self.config
        rng = random.Random(f"{config.draw}:{config.worker}:{index}")
        locks: dict[str, AsyncLock] = {}
        sequence = 0
        while not self.stopping:
            name = rng.choice(config.names)
            lock = locks.get(name)
            if lock is None:
                lock = locks[name] = SOAK.make(
                    self.lock_client,
                    name,
                    ttl=config.ttl,
                    timeout=config.acquire_timeout,
                    on_lost=self.on_lost,
                )
                self.locks.append(lock)
            sequence += 1
            holder = f"{config.worker}.{index}.{sequence}"
            phase = "acquire"
            try:
                async with lock:
                    phase = "body"
                    self.report.acquisitions += 1
                    await self._critical_section(lock, name, holder, rng)
                    phase = "release"
            except AcquireTimeout:
                self.report.acquire_timeouts += 1
            except LockLostError:
                self.report.lost_errors += 1
            except Exception as exc:
                self._error(phase, exc)
            if phase != "acquire" and lock.lost:  # this holding's: the object is ours alone
                self.report.lost_holders.append(holder)
            await asyncio.sleep(rng.uniform(0.0, 0.002))

    async def _critical_section(
        self, lock: AsyncLock, name: str, holder: str, rng: random.Random
    ) -> None:
        keys = resource_keys(name)
        fence = lock.fence
        if fence is None:
            raise LockError(f"lock {name!r} was made with fencing=True but has no fence")
        mark = f"{holder}/{fence}"
        resource = self.resource
        try:
            entered = await self.enter(keys=[keys["inside"]], args=[mark, MARK_MS])
            others = [other.decode() for other in entered]
            if others:
                report = self.report
                report.overlaps += 1
                for other in others:
                    if len(self.overlapped) < RECORDS_CAP:
                        self.overlapped.add(other)
                    if len(report.overlap_records) < RECORDS_CAP:
                        report.overlap_records.append(
                            {"t": time.monotonic(), "name": name, "holder": mark, "inside": other}
                        )
            if rng.random() < self.config.long_hold:
                pauses = [rng.uniform(0.25, 0.75) * self.config.ttl for _ in range(2)]
            else:
                pauses = [rng.uniform(0.0, 0.002) for _ in range(2)]
            # Unfenced: GET, pause, SET.
            value = int(await resource.get(keys["unfenced"]) or 0)
            await asyncio.sleep(pauses[0])
            await resource.set(keys["unfenced"], value + 1)
            _bump(self.report.unfenced_acked, name)
            # Fenced: the same, through the fence-checking scripts.
            counter_keys = [keys["fenced"], keys["fence"]]
            ok, value = await self.fenced_read(keys=counter_keys, args=[fence, holder])
            if ok != 1:
                self._rejected("stale" if ok == 0 else "reused")
                return
            await asyncio.sleep(pauses[1])
            written = await self.fenced_write(keys=counter_keys, args=[fence, holder, value + 1])
            if written == 1:
                _bump(self.report.fenced_acked, name)
            else:
                self._rejected("stale" if written == 0 else "reused")
        finally:
            await resource.zrem(keys["inside"], mark)

    # -- the worker's life --------------------------------------------------------------

    async def _progress(self) -> None:
        report = self.report
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            self.results.put(
                (
                    "progress",
                    self.config.worker,
                    {
                        "acquisitions": report.acquisitions,
                        "overlaps": report.overlaps,
                        "losses": report.on_lost,
                        "errors": sum(report.errors.values()),
                    },
                )
            )

    async def main(self) -> WorkerReport:
        """Warm up, report ready, run the coroutines until stop, drain, check for leaks."""
        config = self.config
        report = self.report
        tally = _LogTally(report)
        logger = logging.getLogger("aiolock")
        logger.addHandler(tally)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        try:
            await self.lock_client.ping()
            await self.resource.ping()
            self.results.put(("ready", config.worker, {}))
            await _wait_event(self.go, config.deadline)
            report.started = time.monotonic()
            tasks = [
                asyncio.create_task(self.coroutine(i), name=f"soak-coroutine-{i}")
                for i in range(config.coroutines)
            ]
            progress = asyncio.create_task(self._progress(), name="soak-progress")
            # Nothing ends a coroutine but stop; one that did end died of an exception.
            stop_wait = asyncio.create_task(_wait_event(self.stop, config.deadline))
            await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if not stop_wait.done():
                await stop_wait
            report.stopped = time.monotonic()
            self.stopping = True
            _, pending = await asyncio.wait(tasks, timeout=config.drain)
            report.hung = len(pending)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
            progress.cancel()
            await asyncio.wait([progress], timeout=1.0)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    assert exc is not None
                    report.crashed.append("".join(traceback.format_exception(exc))[-4000:])
            await self._check_leaks()
            report.overlapped = sorted(self.overlapped)
            self.results.put(("report", config.worker, asdict(report)))
            await _wait_event(self.exit, config.deadline)
        finally:
            with contextlib.suppress(Exception):
                await self.lock_client.aclose()
            with contextlib.suppress(Exception):
                await self.resource.aclose()
            logger.removeHandler(tally)
        return report

    async def _check_leaks(self) -> None:
        """Tasks left running, connections left checked out, locks left held."""
        me = asyncio.current_task()
        deadline = time.monotonic() + LEAK_WAIT
        while True:
            left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
            if not left or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        self.report.leaked_tasks = sorted(t.get_name() for t in left)
        self.report.held_at_end = sum(1 for lock in self.locks if lock.statistics().held)
        self.report.connections_in_use = [
            len(self.lock_client.connection_pool._in_use_connections),
            len(self.resource.connection_pool._in_use_connections),
        ]


async def _wait_event(event: asyncio.Event, deadline: float) -> None:
    """Wait for ``event``, but not past ``deadline`` (then raise ``TimeoutError``)."""
    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
        await event.wait()


def _control(
    control: multiprocessing.queues.Queue[Any],
    loop: asyncio.AbstractEventLoop,
    worker: _Worker,
    parent: int,
    deadline: float,
) -> None:
    """Pass the coordinator's messages to the loop; exit if the coordinator is gone."""
    events = {"go": worker.go, "stop": worker.stop, "exit": worker.exit}
    while True:
        try:
            message = control.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent or time.monotonic() > deadline + 30:
                os._exit(3)  # orphaned or far past the bound: nobody will collect us
            continue
        kind = message[0]
        try:
            if kind == "block":
                loop.call_soon_threadsafe(worker.block, float(message[1]))
            elif kind in events:
                loop.call_soon_threadsafe(events[kind].set)
        except RuntimeError:  # the loop is closed: the worker is done
            return
        if kind == "exit":
            return


def worker_main(
    config: WorkerConfig,
    control: multiprocessing.queues.Queue[Any],
    results: multiprocessing.queues.Queue[Any],
    parent: int,
) -> None:
    """Entry point of a spawned worker process.

    Args:
        config: what to run.
        control: messages from the coordinator: ``("go",)``, ``("block",
            seconds)``, ``("stop",)``, ``("exit",)``.
        results: messages to the coordinator: ``("ready", worker, {})``,
            ``("progress", worker, counts)``, ``("report", worker, report)``,
            or ``("crash", worker, {"error": traceback})``.
        parent: the coordinator's pid (the worker exits if it goes away).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle

    async def main() -> WorkerReport:
        worker = _Worker(config, results)
        thread = threading.Thread(
            target=_control,
            args=(control, asyncio.get_running_loop(), worker, parent, config.deadline),
            name="soak-control",
            daemon=True,
        )
        thread.start()
        return await worker.main()

    try:
        run(main, config.loop)
    except BaseException as exc:
        results.put(("crash", config.worker, {"error": "".join(traceback.format_exception(exc))}))
        raise
