"""The lock family: the Semaphore's throughput and waits against a floor and AsyncLock.

For each ``limit`` in 1, 4 and 16, 4 processes (spawned, one client each)
x 50 coroutines share 2000 acquisitions (``--quick``: 10 coroutines of this
process, 60), each held across one event-loop turn, as in
``benchmarks.contention``'s W4 (:mod:`benchmarks._rounds`). Subjects
(:mod:`benchmarks._subjects`):

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
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from redis.asyncio import Redis

from aiolock._notify import LINGER

from ._measure import embedded_server
from ._rounds import Workload, run_rounds, summarize
from ._runner import Benchmark, Session, overlapping, print_table
from ._subjects import AIOLOCK, RW_READER, RW_WRITER, Subject, semaphore, zset_floor

BENCHMARK: Final = Benchmark("family", __doc__.split("\n")[0])

#: The numbers of permits measured.
LIMITS: Final = (1, 4, 16)
#: The numbers of concurrent readers measured.
READERS: Final = (1, 2, 4, 8, 16)
#: The workloads: 4 processes x 50 coroutines (10 coroutines in this process with ``--quick``).
FULL: Final = Workload("S", 4, 50, 2000, rounds=2)
QUICK: Final = Workload("S", 1, 10, 60, rounds=1)
#: Targets: the semaphore of one permit at least this share of AsyncLock's throughput.
TARGET_SHARE: Final = 1 / 1.1


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
    reader_side = RW_READER.make(client, f"bench:family:read:{readers}")
    reads = 0
    inside = most = 0
    try:
        async with reader_side:  # connect and load the scripts
            pass
        stop = time.monotonic() + seconds
        started = time.monotonic()

        async def reader() -> None:
            nonlocal reads, inside, most
            while time.monotonic() < stop:
                async with reader_side:
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
    reader_side = RW_READER.make(client, name)
    writer = RW_WRITER.make(other, name)
    waits: list[float] = []
    done = False

    async def reader() -> None:
        while not done:
            async with reader_side:
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


def _subjects(limit: int) -> list[Subject]:
    subjects: list[Subject] = [semaphore(limit), zset_floor(limit)]
    return [*subjects, AIOLOCK] if limit == 1 else subjects


async def _main(args: argparse.Namespace) -> tuple[list[Row], list[ReadRow], list[float]]:
    workload = QUICK if args.quick else FULL
    time_limit = 3.0 if args.quick else 30.0
    rows: list[Row] = []
    with embedded_server() as server:
        admin = Redis.from_url(server.url)
        try:
            for limit in args.limits:
                subjects = _subjects(limit)
                rounds = await run_rounds(
                    server.url, admin, workload, subjects, time_limit, args.loop
                )
                for subject in subjects:
                    outcome = summarize(workload, subject, rounds[subject])
                    intervals = [i for r in rounds[subject] for p in r.parts for i in p.intervals]
                    row = Row(
                        limit=limit,
                        subject=subject.label,
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
                        f"  limit {limit:<2} {subject.label:<14} {row.acq_per_s:8.0f} acq/s  "
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


def _targets(session: Session, rows: Sequence[Row]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    by = {(r.limit, r.subject): r for r in rows}
    one = by.get((1, semaphore(1).label))
    lock = by.get((1, AIOLOCK.label))
    if one is not None and lock is not None:
        share = one.acq_per_s / lock.acq_per_s if lock.acq_per_s else math.nan
        passed = share >= TARGET_SHARE
        targets.append({"name": "semaphore 1 vs AsyncLock", "passed": passed, "share": share})
        session.judge(
            passed,
            f"a semaphore of 1 permit has {share:.2f}x "
            f"AsyncLock's throughput (target >= {TARGET_SHARE:.2f}x, i.e. within 1.1x)",
        )
    for limit in sorted({r.limit for r in rows}):
        sem = by.get((limit, semaphore(limit).label))
        floor = by.get((limit, zset_floor(limit).label))
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
        session.judge(
            faster and calmer,
            f"limit {limit}: semaphore "
            f"{sem.acq_per_s:.0f} acq/s, p99 {sem.wait_ms[99]:.1f} ms; floor "
            f"{floor.acq_per_s:.0f} acq/s, p99 {floor.wait_ms[99]:.1f} ms",
        )
    return targets


#: The chart's bars: each legend's subject for a limit.
_KINDS: Final[tuple[tuple[str, Callable[[int], Subject]], ...]] = (
    ("semaphore", semaphore),
    ("zset floor", zset_floor),
    ("AsyncLock", lambda _: AIOLOCK),
)


def _chart(session: Session, rows: Sequence[Row]) -> None:
    limits = sorted({r.limit for r in rows})
    with session.chart(1, 2, figsize=(11, 4.5)) as (figure, (left, right)):
        width = 0.8 / len(_KINDS)
        for index, (label, subject_of) in enumerate(_KINDS):
            mine = [r for r in rows if r.subject == subject_of(r.limit).label]
            xs = [limits.index(r.limit) + (index - (len(_KINDS) - 1) / 2) * width for r in mine]
            left.bar(xs, [r.acq_per_s for r in mine], width, label=label)
            right.bar(xs, [max(r.wait_ms[99], 1e-3) for r in mine], width, label=label)
        for axis, title in ((left, "acquisitions per second"), (right, "wait p99, ms (log)")):
            axis.set_xticks(range(len(limits)), [f"limit {n}" for n in limits])
            axis.set_title(title)
            axis.grid(axis="y", alpha=0.3)
            axis.legend(fontsize=8)
        right.set_yscale("log")
        figure.suptitle("Semaphore, 4 processes x 50 coroutines (embedded Valkey, loopback)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the family benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        1 if more holders than the limit held at once, else 3 on a missed target, else 0.
    """
    parser = BENCHMARK.parser()
    parser.add_argument(
        "--limits",
        type=_limits,
        default=LIMITS,
        metavar="N,N,...",
        help=f"the numbers of permits (default {','.join(map(str, LIMITS))})",
    )
    args = parser.parse_args(argv)
    session = BENCHMARK.session(args, argv)
    session.banner("family benchmark")
    rows, reads, waits = session.run(lambda: _main(args))
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
    targets = _targets(session, rows)
    writer_ms = {
        "p50": statistics.median(waits) * 1000,
        "max": max(waits) * 1000,
        "asks": len(waits),
    }
    passed = writer_ms["max"] <= 1000
    targets.append({"name": "writer behind readers within 1 s", "passed": passed, **writer_ms})
    session.judge(
        passed,
        f"a writer behind 8 readers reading without a gap "
        f"got in within {writer_ms['max']:.0f} ms at most (p50 {writer_ms['p50']:.0f} ms; "
        "target 1 s)",
    )
    # The lock admits one holder; a semaphore, its limit.
    over = sum(1 for r in rows if r.most_at_once > (1 if r.subject == AIOLOCK.label else r.limit))
    over += sum(1 for r in reads if r.most_at_once > r.readers)
    _chart(session, rows)
    session.write_json(
        {
            **session.header(),
            "rows": [asdict(r) for r in rows],
            "readers": [asdict(r) for r in reads],
            "writer_wait_ms": writer_ms,
            "targets": targets,
            "overlaps": over,
        }
    )
    return session.finish(broken=overlapping(over))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
