"""The lock family: the Semaphore's throughput and waits against a floor and AsyncLock.

For each ``limit`` in 1, 4 and 16, 4 processes (spawned, one client each)
x 50 coroutines share 2000 acquisitions (``--quick``: 10 coroutines of this
process, 60), each held across one event-loop turn, as in
``benchmarks.contention``'s W4. Subjects:

* ``semaphore N``: ``aiolock.Semaphore(client, name, limit=N)``, one object
  per coroutine, reused;
* ``zset floor N``: the classic counting semaphore, written here: a sorted
  set of holders scored with their lease's end, one script that drops the
  expired ones and adds the caller if fewer than N hold, polled every 1 ms
  while full; a release is one ``ZREM``;
* ``aiolock`` (``limit`` 1 only): ``AsyncLock`` with every default, the lock
  a semaphore of one permit should cost no more than.

Then the read-write lock, in this process: the readers' throughput with 1,
2, 4, 8 and 16 concurrent readers (each reads, holds one loop turn, and
reads again, for 2 s; 0.5 s with ``--quick``), against one coroutine's; and
a writer's wait while 8 readers read without a gap (each holds 50 ms), the
writer asking 20 times (5 with ``--quick``) at random moments.

The subjects take turns, round by round (2 rounds, 1 with ``--quick``). Each
holder records when it held; the most holders at once must never pass the
limit (the run exits 1 if it does). Reported: acquisitions per second,
wait percentiles (asking to holding), server commands per acquisition, the
most holders seen at once. Targets: the semaphore of one permit within 1.1x
of AsyncLock's throughput; at every limit, the semaphore ahead of the floor
in throughput, with a lower p99 wait (the run exits 3 if one is missed; the
``--quick`` sizes judge none).

Run ``python -m benchmarks.family`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from aiolock import ReadWriteLock, Semaphore
from aiolock._notify import LINGER

from ._common import (
    add_common_args,
    embedded_server,
    finish,
    mark,
    out_dir,
    print_table,
    repro_command,
    run,
    write_json,
)
from .contention import LEASE, Locker, Round, Workload, _measure_round, _summarize

NAME: Final = "family"
MODULE: Final = "benchmarks.family"

#: The numbers of permits measured.
LIMITS: Final = (1, 4, 16)
#: The numbers of concurrent readers measured.
READERS: Final = (1, 2, 4, 8, 16)
#: The floor's polling interval while every permit is taken.
FLOOR_POLL: Final = 0.001
#: The workloads: 4 processes x 50 coroutines (10 coroutines in this process with ``--quick``).
FULL: Final = Workload("S", 4, 50, 2000, rounds=2)
QUICK: Final = Workload("S", 1, 10, 60, rounds=1)
#: Targets: the semaphore of one permit at least this share of AsyncLock's throughput.
TARGET_SHARE: Final = 1 / 1.1

#: The floor's acquire: drop expired holders, add the caller if fewer than the limit hold.
_FLOOR_ACQUIRE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return 1
end
return 0
"""


class SemaphoreLocker:
    """An aiolock ``Semaphore`` of ``limit`` permits, one object for the coroutine's life."""

    def __init__(self, client: Redis, key: str, limit: int) -> None:
        self._semaphore = Semaphore(client, key, limit, ttl=LEASE)

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` for a permit."""
        return await self._semaphore.acquire(timeout=timeout)

    async def release(self) -> None:
        """Give the permit back (a waiter is granted it)."""
        await self._semaphore.release()


class ZsetFloorLocker:
    """The classic counting semaphore: one script per attempt, polled every 1 ms; ``ZREM``."""

    def __init__(self, client: Redis, key: str, limit: int, script: AsyncScript) -> None:
        self._client = client
        self._key = key
        self._limit = limit
        self._script = script
        self._token = ""

    async def acquire(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Try every millisecond until a permit is free or ``timeout`` passes."""
        token = secrets.token_hex(16)
        deadline = time.monotonic() + timeout
        lease_ms = int(LEASE * 1000)
        while True:
            if await self._script(keys=[self._key], args=[token, self._limit, lease_ms]):
                self._token = token
                return True
            if time.monotonic() + FLOOR_POLL > deadline:
                return False
            await asyncio.sleep(FLOOR_POLL)

    async def release(self) -> None:
        """Remove our token (``ZREM``)."""
        await self._client.zrem(self._key, self._token)


def semaphore_lockers(subject: str, client: Redis, key: str, count: int) -> list[Locker]:
    """``count`` lockers of ``semaphore N`` or ``zset floor N`` (for ``contention._drive``)."""
    limit = int(subject.rsplit(" ", 1)[1])
    if subject.startswith("semaphore "):
        return [SemaphoreLocker(client, key, limit) for _ in range(count)]
    script = client.register_script(_FLOOR_ACQUIRE)
    return [ZsetFloorLocker(client, key, limit, script) for _ in range(count)]


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals that overlap at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    inside = most = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


@dataclass(frozen=True)
class Row:
    """One (limit, subject): its figures."""

    limit: int
    subject: str
    acquired: int
    failures: int
    acq_per_s: float
    wait_ms: dict[int, float]
    server_cmds_per_acq: float
    most_at_once: int
    first_error: str


@dataclass(frozen=True)
class ReadRow:
    """The readers' throughput with ``readers`` concurrent readers."""

    readers: int
    reads_per_s: float
    most_at_once: int


async def _reader_throughput(url: str, readers: int, seconds: float) -> ReadRow:
    """``readers`` coroutines read in a loop for ``seconds``; reads per second."""
    client = Redis.from_url(url, max_connections=readers + 8)
    rw = ReadWriteLock(client, f"bench:family:read:{readers}", ttl=LEASE)
    reads = 0
    inside = most = 0
    try:
        async with rw.reader:  # connect and load the scripts
            pass
        stop = time.monotonic() + seconds
        started = time.monotonic()

        async def reader() -> None:
            nonlocal reads, inside, most
            while time.monotonic() < stop:
                async with rw.reader:
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0)
                    inside -= 1
                    reads += 1

        await asyncio.gather(*(reader() for _ in range(readers)))
        wall = time.monotonic() - started
    finally:
        await client.aclose()
    return ReadRow(readers, reads / wall, most)


async def _writer_waits(url: str, asks: int) -> list[float]:
    """A writer's waits while 8 readers read without a gap (50 ms each)."""
    client = Redis.from_url(url)
    other = Redis.from_url(url)
    name = "bench:family:writer"
    rw = ReadWriteLock(client, name, ttl=LEASE)
    writer = ReadWriteLock(other, name, ttl=LEASE).writer
    waits: list[float] = []
    done = False

    async def reader() -> None:
        while not done:
            async with rw.reader:
                await asyncio.sleep(0.05)

    readers = [asyncio.create_task(reader()) for _ in range(8)]
    try:
        for _ in range(asks):
            await asyncio.sleep(random.uniform(0.05, 0.2))
            asked = time.monotonic()
            async with writer:
                waits.append(time.monotonic() - asked)
    finally:
        done = True
        await asyncio.gather(*readers, return_exceptions=True)
        await client.aclose()
        await other.aclose()
    return waits


def _subjects(limit: int) -> list[str]:
    subjects = [f"semaphore {limit}", f"zset floor {limit}"]
    return [*subjects, "aiolock"] if limit == 1 else subjects


async def _main(args: argparse.Namespace) -> tuple[list[Row], list[ReadRow], list[float]]:
    workload = QUICK if args.quick else FULL
    time_limit = 3.0 if args.quick else 30.0
    rows: list[Row] = []
    with embedded_server() as server:
        admin = Redis.from_url(server.url)
        try:
            for limit in args.limits:
                subjects = _subjects(limit)
                rounds: dict[str, list[Round]] = {s: [] for s in subjects}
                for index in range(workload.rounds):
                    share = workload.acquisitions // workload.rounds
                    turn = index % len(subjects)
                    for subject in subjects[turn:] + subjects[:turn]:
                        rounds[subject].append(
                            await _measure_round(
                                server.url, admin, workload, subject, share, time_limit, args.loop
                            )
                        )
                for subject in subjects:
                    outcome = _summarize(workload, subject, rounds[subject])
                    intervals = [i for r in rounds[subject] for p in r.parts for i in p.intervals]
                    row = Row(
                        limit=limit,
                        subject=subject,
                        acquired=outcome.acquired,
                        failures=outcome.failures,
                        acq_per_s=outcome.acq_per_s,
                        wait_ms=outcome.wait_ms,
                        server_cmds_per_acq=outcome.server_cmds_per_acq,
                        most_at_once=most_at_once(intervals),
                        first_error=outcome.first_error,
                    )
                    rows.append(row)
                    print(
                        f"  limit {limit:<2} {subject:<14} {row.acq_per_s:8.0f} acq/s  "
                        f"wait p99 {row.wait_ms[99]:8.1f} ms  at once {row.most_at_once}  "
                        f"failures {row.failures}",
                        flush=True,
                    )
            seconds = 0.5 if args.quick else 2.0
            reads = []
            for readers in READERS:
                read_row = await _reader_throughput(server.url, readers, seconds)
                reads.append(read_row)
                print(
                    f"  {readers:>2} readers: {read_row.reads_per_s:8.0f} reads/s "
                    f"(at most {read_row.most_at_once} at once)",
                    flush=True,
                )
            waits = await _writer_waits(server.url, 5 if args.quick else 20)
            # This process's release listeners linger after their last waiter: let them
            # end before the server does (else they warn of a broken connection).
            await asyncio.sleep(2 * LINGER + 0.1)
            print(
                f"  a writer behind 8 readers: wait p50 {statistics.median(waits) * 1000:.1f} ms, "
                f"max {max(waits) * 1000:.1f} ms",
                flush=True,
            )
        finally:
            await admin.aclose()
    return rows, reads, waits


def _limits(text: str) -> tuple[int, ...]:
    try:
        limits = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of ints: {text!r}") from None
    if not limits or min(limits) < 1:
        raise argparse.ArgumentTypeError(f"limits must be at least 1: {text!r}")
    return limits


def _targets(rows: Sequence[Row], quick: bool) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    by = {(r.limit, r.subject): r for r in rows}
    one = by.get((1, "semaphore 1"))
    lock = by.get((1, "aiolock"))
    if one is not None and lock is not None:
        share = one.acq_per_s / lock.acq_per_s if lock.acq_per_s else math.nan
        passed = share >= TARGET_SHARE
        targets.append({"name": "semaphore 1 vs AsyncLock", "passed": passed, "share": share})
        print(
            f"{mark(passed, quick)}  a semaphore of 1 permit has {share:.2f}x "
            f"AsyncLock's throughput (target >= {TARGET_SHARE:.2f}x, i.e. within 1.1x)"
        )
    for limit in sorted({r.limit for r in rows}):
        sem = by.get((limit, f"semaphore {limit}"))
        floor = by.get((limit, f"zset floor {limit}"))
        if sem is None or floor is None:
            continue
        faster = sem.acq_per_s > floor.acq_per_s
        calmer = sem.wait_ms[99] < floor.wait_ms[99]
        targets.append(
            {
                "name": f"semaphore {limit} vs floor",
                "passed": faster and calmer,
                "throughput_ratio": sem.acq_per_s / floor.acq_per_s if floor.acq_per_s else None,
                "p99_ms": [sem.wait_ms[99], floor.wait_ms[99]],
            }
        )
        print(
            f"{mark(faster and calmer, quick)}  limit {limit}: semaphore "
            f"{sem.acq_per_s:.0f} acq/s, p99 {sem.wait_ms[99]:.1f} ms; floor "
            f"{floor.acq_per_s:.0f} acq/s, p99 {floor.wait_ms[99]:.1f} ms"
        )
    return targets


def _chart(path: Path, rows: Sequence[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = sorted({r.limit for r in rows})
    kinds = ["semaphore", "zset floor", "aiolock"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / len(kinds)
    for index, kind in enumerate(kinds):
        mine = [
            r for r in rows if r.subject == (kind if kind == "aiolock" else f"{kind} {r.limit}")
        ]
        xs = [limits.index(r.limit) + (index - (len(kinds) - 1) / 2) * width for r in mine]
        label = "AsyncLock" if kind == "aiolock" else kind
        left.bar(xs, [r.acq_per_s for r in mine], width, label=label)
        right.bar(xs, [max(r.wait_ms[99], 1e-3) for r in mine], width, label=label)
    for axis, title in ((left, "acquisitions per second"), (right, "wait p99, ms (log)")):
        axis.set_xticks(range(len(limits)), [f"limit {n}" for n in limits])
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    right.set_yscale("log")
    figure.suptitle("Semaphore, 4 processes x 50 coroutines (embedded Valkey, loopback)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the family benchmark; 1 if more holders than the limit held at once, 3 on a miss.

    Args:
        argv: command-line options (``sys.argv[1:]`` when None).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    add_common_args(parser)
    parser.add_argument(
        "--limits",
        type=_limits,
        default=LIMITS,
        metavar="N,N,...",
        help=f"the numbers of permits (default {','.join(map(str, LIMITS))})",
    )
    args = parser.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    directory = out_dir(args)
    print(f"family benchmark (loop={args.loop}{', quick' if args.quick else ''})", flush=True)
    rows, reads, waits = run(lambda: _main(args), args.loop)
    print_table(
        "Semaphore: 4 processes x 50 coroutines share the acquisitions, each held one loop turn",
        [
            "limit",
            "subject",
            "acquired",
            "acq/s",
            "wait p50 ms",
            "p99 ms",
            "server cmd/acq",
            "most at once",
            "failures",
        ],
        [
            [
                r.limit,
                r.subject,
                r.acquired,
                f"{r.acq_per_s:.0f}",
                f"{r.wait_ms[50]:.2f}",
                f"{r.wait_ms[99]:.2f}",
                f"{r.server_cmds_per_acq:.1f}",
                r.most_at_once,
                r.failures,
            ]
            for r in rows
        ],
    )
    for r in rows:
        if r.first_error:
            print(f"  limit {r.limit} {r.subject}: first error: {r.first_error}")
    print_table(
        "ReadWriteLock: readers reading in a loop, one loop turn each, in one process",
        ["readers", "reads/s", "x one reader", "most at once"],
        [
            [
                r.readers,
                f"{r.reads_per_s:.0f}",
                f"{r.reads_per_s / reads[0].reads_per_s:.2f}x",
                r.most_at_once,
            ]
            for r in reads
        ],
    )
    targets = _targets(rows, args.quick)
    writer_ms = {
        "p50": statistics.median(waits) * 1000,
        "max": max(waits) * 1000,
        "asks": len(waits),
    }
    passed = writer_ms["max"] <= 1000
    targets.append({"name": "writer behind readers within 1 s", "passed": passed, **writer_ms})
    print(
        f"{mark(passed, args.quick)}  a writer behind 8 readers reading without a gap "
        f"got in within {writer_ms['max']:.0f} ms at most (p50 {writer_ms['p50']:.0f} ms; "
        "target 1 s)"
    )
    over = sum(1 for r in rows if r.most_at_once > (1 if r.subject == "aiolock" else r.limit))
    over += sum(1 for r in reads if r.most_at_once > r.readers)
    chart = directory / f"{NAME}.png"
    _chart(chart, rows)
    write_json(
        directory / f"{NAME}.json",
        {
            "benchmark": NAME,
            "command": repro_command(MODULE, argv_list),
            "loop": args.loop,
            "quick": args.quick,
            "rows": [asdict(r) for r in rows],
            "readers": [asdict(r) for r in reads],
            "writer_wait_ms": writer_ms,
            "targets": targets,
            "overlaps": over,
        },
    )
    missed = 0 if args.quick else sum(not target["passed"] for target in targets)
    return finish(MODULE, argv_list, chart, directory / f"{NAME}.json", over, missed)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
