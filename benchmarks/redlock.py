"""Redlock on 3 and 5 nodes against AsyncLock on one: latency and throughput, same run.

What a quorum costs. Every subject runs on private servers on loopback,
interleaved round by round so that drift in the machine's speed hits all of
them alike:

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
from pathlib import Path
from typing import Any, Final

import redis.asyncio as redis
from redis.asyncio.lock import Lock as RedisPyLock

from aiolock import AsyncLock, Redlock
from aiolock.testing import RedisServer, ReplicatedServer

from ._common import (
    add_common_args,
    finish,
    out_dir,
    percentiles,
    print_table,
    run,
    write_json,
)

MODULE: Final = "benchmarks.redlock"
SUBJECTS: Final = (
    "floor",
    "redis-py Lock",
    "AsyncLock",
    "AsyncLock replicas=1",
    "Redlock 3",
    "Redlock 5",
)
TTL: Final = 10.0
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


class Subject:
    """Makes cycles of one kind of lock on its servers, with its own clients."""

    def __init__(self, name: str, urls: Sequence[str]) -> None:
        self.name = name
        self.urls = list(urls)
        self.clients: list[redis.Redis] = []

    def _clients(self) -> list[redis.Redis]:
        made = [redis.Redis.from_url(url) for url in self.urls]
        self.clients.extend(made)
        return made

    def cycle(self, lock_name: str, clients: list[redis.Redis] | None = None) -> Cycle:
        """A function that takes and gives back ``lock_name`` once (on fresh clients if None)."""
        clients = self._clients() if clients is None else clients
        first = clients[0]
        if self.name == "floor":
            key = f"floor:{{{lock_name}}}"

            async def floor() -> float:
                token = secrets.token_hex(16)
                started = time.perf_counter()
                while not await first.set(key, token, nx=True, px=10_000):  # noqa: ASYNC110 - polls
                    await asyncio.sleep(0.001)
                took = time.perf_counter() - started
                await first.delete(key)
                return took

            return floor
        if self.name == "redis-py Lock":
            lock: Any = RedisPyLock(first, f"redispy:{{{lock_name}}}", timeout=TTL)  # sleep 0.1
        elif self.name == "AsyncLock":
            lock = AsyncLock(first, lock_name, ttl=TTL)
        elif self.name == "AsyncLock replicas=1":
            lock = AsyncLock(first, lock_name, ttl=TTL, replicas=1)
        else:
            lock = Redlock(clients, lock_name, ttl=TTL)

        async def cycle() -> float:
            started = time.perf_counter()
            assert await lock.acquire()
            took = time.perf_counter() - started
            await lock.release()
            return took

        return cycle

    async def aclose(self) -> None:
        """Close every client made."""
        for c in self.clients:
            await c.aclose()


async def latency(subject: Subject, result: Result, cycles: int) -> None:
    """One task, uncontended: ``cycles`` acquire + release pairs."""
    cycle = subject.cycle(f"latency:{secrets.token_hex(4)}")
    await cycle()  # connect, load scripts
    for _ in range(cycles):
        started = time.perf_counter()
        result.acquire_s.append(await cycle())
        result.cycle_s.append(time.perf_counter() - started)


async def throughput(subject: Subject, result: Result, seconds: float) -> None:
    """``TASKS`` tasks over ``NAMES`` names for ``seconds``: acquisitions and overlaps."""
    names = [f"busy:{secrets.token_hex(4)}:{i}" for i in range(NAMES)]
    held: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    processes = [subject._clients() for _ in range(PROCESSES)]
    cycles = [subject.cycle(names[i % NAMES], processes[i % PROCESSES]) for i in range(TASKS)]
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


async def _overlaps(subject: Subject, seconds: float) -> int:
    """Count two-holders-at-once on one name, by marking inside the lock (not by clocks)."""
    name = f"check:{secrets.token_hex(4)}"
    inside = 0
    overlaps = 0
    stop = time.monotonic() + seconds
    clients = [subject._clients() for _ in range(8)]
    await asyncio.gather(*(c.ping() for mine in clients for c in mine))

    async def work(mine: list[redis.Redis]) -> None:
        nonlocal inside, overlaps
        if subject.name == "floor" or subject.name == "redis-py Lock":
            return
        if subject.name.startswith("Redlock"):
            lock: Any = Redlock(mine, name, ttl=TTL)
        else:
            lock = AsyncLock(mine[0], name, ttl=TTL, replicas=int("replicas" in subject.name))
        while time.monotonic() < stop:
            async with lock:
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0)
                inside -= 1

    await asyncio.gather(*(work(c) for c in clients))
    return overlaps


@contextlib.asynccontextmanager
async def subjects(
    independent: list[RedisServer], group: ReplicatedServer
) -> AsyncIterator[list[Subject]]:
    """The subjects of :data:`SUBJECTS`, each on its servers; clients closed on exit."""
    one = [independent[0].url]
    made = [
        Subject("floor", one),
        Subject("redis-py Lock", one),
        Subject("AsyncLock", one),
        Subject("AsyncLock replicas=1", [group.url]),
        Subject("Redlock 3", [s.url for s in independent[:3]]),
        Subject("Redlock 5", [s.url for s in independent]),
    ]
    try:
        yield made
    finally:
        for subject in made:
            await subject.aclose()


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 2 if args.quick else 5
    cycles = 50 if args.quick else 400
    seconds = 0.3 if args.quick else 2.0
    with servers() as (independent, group):
        async with subjects(independent, group) as made:
            results = {s.name: Result(s.name) for s in made}
            for _ in range(rounds):
                for subject in made:
                    await latency(subject, results[subject.name], cycles)
                for subject in made:
                    await throughput(subject, results[subject.name], seconds)
            for subject in made:
                results[subject.name].overlaps = await _overlaps(subject, seconds)
    return {"results": results, "rounds": rounds, "cycles": cycles, "seconds": seconds}


def _chart(path: Path, results: Sequence[Result]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.subject for r in results]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
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
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return 1 if any subject let two holders in at once, else 0.

    Args:
        argv: command-line options (``sys.argv[1:]`` when None).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    add_common_args(parser)
    args = parser.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    directory = out_dir(args)
    print(f"redlock benchmark (loop={args.loop}{', quick' if args.quick else ''})", flush=True)
    outcome = run(lambda: _main(args), args.loop)
    results: dict[str, Result] = outcome["results"]
    floor = results["floor"]
    floor_p50 = percentiles(floor.acquire_s)[50]
    floor_cycle = percentiles(floor.cycle_s)[50]
    rows = []
    for name in SUBJECTS:
        r = results[name]
        acquire = percentiles(r.acquire_s)
        cycle = percentiles(r.cycle_s)
        rows.append(
            [
                name,
                f"{acquire[50] * 1000:.3f}",
                f"{acquire[99] * 1000:.3f}",
                f"{acquire[50] / floor_p50:.2f}x",
                f"{cycle[50] * 1000:.3f}",
                f"{cycle[50] / floor_cycle:.2f}x",
                f"{r.per_second:,.0f}",
                f"{r.per_second / floor.per_second:.2f}x",
                r.failures,
                "-" if name in ("floor", "redis-py Lock") else r.overlaps,
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
    chart = directory / "redlock.png"
    data = directory / "redlock.json"
    ordered = [results[name] for name in SUBJECTS]
    _chart(chart, ordered)
    write_json(
        data,
        {
            "benchmark": "redlock",
            "loop": args.loop,
            "quick": args.quick,
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
        },
    )
    overlaps = sum(r.overlaps for r in ordered)
    return finish(MODULE, argv_list, chart, data, overlaps)


if __name__ == "__main__":
    sys.exit(main())
