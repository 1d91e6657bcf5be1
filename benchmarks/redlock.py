"""Redlock on 3 and 5 nodes against AsyncLock on one: latency and throughput, same run.

What a quorum costs. Every subject (:data:`benchmarks._subjects.REDLOCK`)
runs on private servers on loopback, interleaved round by round so that
drift in the machine's speed hits all of them alike:

* ``floor``: a bare ``SET NX PX`` then ``DEL`` on one server (the round-trip floor);
* ``redis-py Lock``: ``redis.asyncio.lock.Lock`` on one server, its default 0.1 s polling;
* ``AsyncLock``: one server;
* ``AsyncLock replicas=1``: a master whose one replica must acknowledge (``WAIT``);
* ``Redlock 3`` and ``Redlock 5``: ``aiolock.Redlock`` over 3 and 5 independent servers.

Two measurements per subject:

* **latency**: one task acquires and releases, uncontended, over and over;
  the time ``acquire()`` takes (p50, p99) and the whole cycle, as a ratio to
  the floor's ``SET``;
* **throughput**: 40 tasks over 8 names, on 8 client objects (or client
  sets, for Redlock) like 8 processes, for a fixed time: acquisitions per
  second, and overlaps (two holders of one name at once; must be 0).

The servers share the machine's 2 cores with the client, so a Redlock on 5
nodes also pays for 5 server processes: the figures are what one machine
sees, not a distributed deployment.

    .venv/bin/python -m benchmarks.redlock            # about a minute
    .venv/bin/python -m benchmarks.redlock --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import redis.asyncio as redis

from aiolock.testing import RedisServer, ReplicatedServer

from ._measure import percentiles
from ._runner import Benchmark, Session, overlapping, print_table
from ._subjects import REDLOCK, SET_DEL_FLOOR, AiolockLock, Library, Locker, Subject

BENCHMARK: Final = Benchmark("redlock", __doc__.split("\n")[0])
TASKS: Final = 40
NAMES: Final = 8
PROCESSES: Final = 8


@dataclass
class Result:
    """What one subject measured."""

    subject: str
    acquire_s: list[float] = field(default_factory=list)
    cycle_s: list[float] = field(default_factory=list)
    acquired: int = 0
    seconds: float = 0.0
    failures: int = 0
    overlaps: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def per_second(self) -> float:
        """Throughput: acquisitions per second."""
        return self.acquired / self.seconds if self.seconds else 0.0


@contextlib.contextmanager
def servers() -> Iterator[tuple[list[RedisServer], ReplicatedServer]]:
    """Five independent servers and a master with one replica; all stopped on exit."""
    started: list[RedisServer] = []
    group = ReplicatedServer(replicas=1)
    try:
        started.extend(RedisServer().start() for _ in range(5))
        group.start()
        yield started, group
    finally:
        group.stop()
        for server in started:
            server.stop()


Cycle = Callable[[], Awaitable[float]]  # one acquire + release; returns the acquire's seconds


class Placed:
    """A subject on its servers: makes its cycles, with clients of its own."""

    def __init__(self, subject: Subject, urls: Sequence[str]) -> None:
        self.subject = subject
        self.urls = list(urls)
        self.clients: list[redis.Redis] = []

    @property
    def name(self) -> str:
        """The subject's label."""
        return self.subject.label

    def _clients(self) -> list[redis.Redis]:
        made = [redis.Redis.from_url(url) for url in self.urls]
        self.clients.extend(made)
        return made

    def locker(self, lock_name: str, clients: list[redis.Redis] | None = None) -> Locker:
        """A locker of ``lock_name`` (on fresh clients if None)."""
        clients = self._clients() if clients is None else clients
        (locker,) = self.subject.lockers(clients, lock_name, 1)
        return locker

    def cycle(self, lock_name: str, clients: list[redis.Redis] | None = None) -> Cycle:
        """A function that takes and gives back ``lock_name`` once (on fresh clients if None)."""
        locker = self.locker(lock_name, clients)

        async def cycle() -> float:
            started = time.perf_counter()
            assert await locker.acquire(None)
            took = time.perf_counter() - started
            await locker.release()
            return took

        return cycle

    async def aclose(self) -> None:
        """Close every client made."""
        for c in self.clients:
            await c.aclose()


async def latency(placed: Placed, result: Result, cycles: int) -> None:
    """One task, uncontended: ``cycles`` acquire + release pairs."""
    cycle = placed.cycle(f"latency:{secrets.token_hex(4)}")
    await cycle()  # connect, load scripts
    for _ in range(cycles):
        started = time.perf_counter()
        result.acquire_s.append(await cycle())
        result.cycle_s.append(time.perf_counter() - started)


async def throughput(placed: Placed, result: Result, seconds: float) -> None:
    """``TASKS`` tasks over ``NAMES`` names for ``seconds``: acquisitions and overlaps."""
    names = [f"busy:{secrets.token_hex(4)}:{i}" for i in range(NAMES)]
    held: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    processes = [placed._clients() for _ in range(PROCESSES)]
    cycles = [placed.cycle(names[i % NAMES], processes[i % PROCESSES]) for i in range(TASKS)]
    # Connected before the clock starts: connection set-up is not what is measured.
    await asyncio.gather(*(c.ping() for mine in processes for c in mine))
    stop = time.monotonic() + seconds

    async def work(name: str, cycle: Cycle) -> None:
        while time.monotonic() < stop:
            try:
                started = time.monotonic()
                await cycle()
                held[name].append((started, time.monotonic()))
            except Exception as exc:  # counted, and the run goes on
                result.failures += 1
                result.errors[f"{type(exc).__module__}.{type(exc).__qualname__}"] += 1

    began = time.perf_counter()
    await asyncio.gather(*(work(names[i % NAMES], cycles[i]) for i in range(TASKS)))
    result.seconds += time.perf_counter() - began
    result.acquired += sum(len(spans) for spans in held.values())


async def _overlaps(placed: Placed, seconds: float) -> int:
    """Count two-holders-at-once on one name, by marking inside the lock (not by clocks).

    aiolock's subjects only: the floor and redis-py's lock are the baselines.
    """
    name = f"check:{secrets.token_hex(4)}"
    inside = 0
    overlaps = 0
    stop = time.monotonic() + seconds
    clients = [placed._clients() for _ in range(8)]
    await asyncio.gather(*(c.ping() for mine in clients for c in mine))

    async def work(mine: list[redis.Redis]) -> None:
        nonlocal inside, overlaps
        if placed.subject.library is not Library.AIOLOCK:
            return
        locker = placed.locker(name, mine)
        while time.monotonic() < stop:
            assert await locker.acquire(None)
            try:
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0)
                inside -= 1
            finally:
                await locker.release()

    await asyncio.gather(*(work(c) for c in clients))
    return overlaps


def _urls(subject: Subject, independent: list[RedisServer], group: ReplicatedServer) -> list[str]:
    """Where ``subject`` runs: a master and its replica, or the first of the independent servers."""
    if isinstance(subject, AiolockLock) and subject.replicas:
        return [group.url]
    return [server.url for server in independent[: subject.servers]]


@contextlib.asynccontextmanager
async def placed(
    independent: list[RedisServer], group: ReplicatedServer
) -> AsyncIterator[list[Placed]]:
    """Each subject of ``REDLOCK`` on its servers; clients closed on exit."""
    made = [Placed(subject, _urls(subject, independent, group)) for subject in REDLOCK]
    try:
        yield made
    finally:
        for one in made:
            await one.aclose()


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 2 if args.quick else 5
    cycles = 50 if args.quick else 400
    seconds = 0.3 if args.quick else 2.0
    with servers() as (independent, group):
        async with placed(independent, group) as made:
            results = {p.name: Result(p.name) for p in made}
            for _ in range(rounds):
                for one in made:
                    await latency(one, results[one.name], cycles)
                for one in made:
                    await throughput(one, results[one.name], seconds)
            for one in made:
                results[one.name].overlaps = await _overlaps(one, seconds)
    return {"results": results, "rounds": rounds, "cycles": cycles, "seconds": seconds}


def _chart(session: Session, results: Sequence[Result]) -> None:
    names = [r.subject for r in results]
    with session.chart(1, 2, figsize=(12, 4.5)) as (figure, (left, right)):
        p50 = [percentiles(r.acquire_s)[50] * 1000 for r in results]
        p99 = [percentiles(r.acquire_s)[99] * 1000 for r in results]
        left.bar(names, p50, label="p50")
        left.scatter(names, p99, marker="v", color="black", zorder=3, label="p99")
        left.set_ylabel("uncontended acquire(), ms")
        left.set_title("latency")
        left.legend(fontsize=8)
        right.bar(names, [r.per_second for r in results])
        right.set_ylabel(f"acquisitions/s ({TASKS} tasks, {NAMES} names, {PROCESSES} clients)")
        right.set_title("throughput")
        for ax in (left, right):
            ax.tick_params(axis="x", rotation=30, labelsize=8)
            ax.grid(axis="y", alpha=0.3)
        figure.suptitle("Redlock vs AsyncLock (private servers on loopback, 2 cores)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Redlock benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        1 if any subject let two holders in at once, else 0.
    """
    parser = BENCHMARK.parser()
    args = parser.parse_args(argv)
    session = BENCHMARK.session(args, argv)
    session.banner("redlock benchmark")
    outcome = session.run(lambda: _main(args))
    results: dict[str, Result] = outcome["results"]
    floor = results[SET_DEL_FLOOR.label]
    floor_p50 = percentiles(floor.acquire_s)[50]
    floor_cycle = percentiles(floor.cycle_s)[50]
    rows = []
    for subject in REDLOCK:
        r = results[subject.label]
        acquire = percentiles(r.acquire_s)
        cycle = percentiles(r.cycle_s)
        rows.append(
            [
                subject.label,
                f"{acquire[50] * 1000:.3f}",
                f"{acquire[99] * 1000:.3f}",
                f"{acquire[50] / floor_p50:.2f}x",
                f"{cycle[50] * 1000:.3f}",
                f"{cycle[50] / floor_cycle:.2f}x",
                f"{r.per_second:,.0f}",
                f"{r.per_second / floor.per_second:.2f}x",
                r.failures,
                r.overlaps if subject.library is Library.AIOLOCK else "-",
            ]
        )
    print_table(
        f"Redlock vs AsyncLock: {outcome['rounds']} rounds of {outcome['cycles']} uncontended "
        f"cycles and {outcome['seconds']:g} s of {TASKS} tasks on {NAMES} names per subject",
        [
            "subject",
            "acquire p50 ms",
            "acquire p99 ms",
            "vs floor SET",
            "cycle p50 ms",
            "vs floor cycle",
            "acq/s",
            "vs floor acq/s",
            "failures",
            "overlaps",
        ],
        rows,
    )
    ordered = [results[subject.label] for subject in REDLOCK]
    _chart(session, ordered)
    session.write_json(
        {
            "benchmark": BENCHMARK.name,
            "loop": session.loop,
            "quick": session.quick,
            "rounds": outcome["rounds"],
            "cycles_per_round": outcome["cycles"],
            "throughput_seconds_per_round": outcome["seconds"],
            "tasks": TASKS,
            "processes": PROCESSES,
            "names": NAMES,
            "subjects": {
                r.subject: {
                    "acquire_ms": {k: v * 1000 for k, v in percentiles(r.acquire_s).items()},
                    "cycle_ms": {k: v * 1000 for k, v in percentiles(r.cycle_s).items()},
                    "acq_per_s": r.per_second,
                    "failures": r.failures,
                    "errors": dict(r.errors),
                    "overlaps": r.overlaps,
                }
                for r in ordered
            },
        }
    )
    return session.finish(broken=overlapping(sum(r.overlaps for r in ordered)))


if __name__ == "__main__":
    sys.exit(main())
