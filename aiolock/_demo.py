"""The contention demo behind ``aiolock demo`` and ``make demo``.

Several worker processes, each with many coroutines, take turns on one lock.
Inside the critical section every holder increments a shared "busy" counter
on the server and checks that it is alone (a result other than 1 would be an
overlap: two holders at once). The parent shows a progress bar and prints a
summary: acquisitions, wait percentiles, lock round trips per acquisition
(from the server's ``INFO commandstats``) and overlaps.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import redis.asyncio as redis

from ._lock import AsyncLock

__all__ = ["DemoConfig", "run_demo"]

#: Commands a lock sends itself (scripts); everything else is the demo's bookkeeping.
_LOCK_COMMANDS = ("evalsha", "eval", "script|load", "script")


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs."""

    url: str | None = None
    processes: int = 3
    coroutines: int = 50
    rounds: int = 4
    hold: float = 0.001
    name: str = "demo"
    ttl: float = 5.0


@dataclass(frozen=True)
class _WorkerResult:
    waits: list[float]
    overlaps: int


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


async def _worker_main(url: str, config: DemoConfig, worker: int) -> _WorkerResult:
    client = redis.Redis.from_url(url)
    busy = f"aiolock-demo:{{{config.name}}}:busy"
    progress = f"aiolock-demo:{{{config.name}}}:progress"
    waits: list[float] = []
    overlaps = 0

    async def coroutine() -> None:
        nonlocal overlaps
        lock = AsyncLock(client, config.name, ttl=config.ttl)
        for _ in range(config.rounds):
            started = time.perf_counter()
            async with lock:
                waits.append(time.perf_counter() - started)
                if await client.incr(busy) != 1:
                    overlaps += 1
                await asyncio.sleep(config.hold)
                await client.decr(busy)
            await client.incr(progress)

    try:
        await asyncio.gather(*(coroutine() for _ in range(config.coroutines)))
    finally:
        await client.aclose()
    return _WorkerResult(waits, overlaps)


def _worker(url: str, config: DemoConfig, worker: int, results: Any) -> None:
    """Entry point of one worker process."""
    try:
        results.put(asyncio.run(_worker_main(url, config, worker)))
    except BaseException as exc:
        results.put(exc)
        raise


async def _command_counts(client: redis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in stats.items()
        if isinstance(value, dict)
    }


class _Progress:
    """A rich progress bar when rich is installed, plain lines otherwise."""

    def __init__(self, total: int, out: TextIO) -> None:
        self._total = total
        self._out = out
        self._last_line = -1
        self._bar: Any = None
        self._task: Any = None
        try:
            # rich is optional (the demo extra): plain lines without it.
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:
            return
        self._bar = Progress(
            TextColumn("acquisitions"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
        )

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.__enter__()
            self._task = self._bar.add_task("acquisitions", total=self._total)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc_info)

    def update(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        decile = done * 10 // max(self._total, 1)
        if decile != self._last_line:
            self._last_line = decile
            print(f"  {done}/{self._total} acquisitions", file=self._out, flush=True)


@contextmanager
def _server_for(url: str | None, out: TextIO) -> Iterator[str]:
    if url:
        yield url
        return
    from .testing import RedisServer, server_version  # only needed without a URL

    with RedisServer() as server:
        print(f"started {server_version()} on {server.host}:{server.port}", file=out)
        yield server.url
    print("stopped the server", file=out)


async def _run(url: str, config: DemoConfig, out: TextIO) -> int:
    admin = redis.Redis.from_url(url, decode_responses=True)
    progress_key = f"aiolock-demo:{{{config.name}}}:progress"
    busy_key = f"aiolock-demo:{{{config.name}}}:busy"
    total = config.processes * config.coroutines * config.rounds
    try:
        await admin.delete(progress_key, busy_key)
        before = await _command_counts(admin)
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        workers = [
            context.Process(target=_worker, args=(url, config, i, results), daemon=True)
            for i in range(config.processes)
        ]
        print(
            f"{config.processes} processes x {config.coroutines} coroutines x "
            f"{config.rounds} rounds on lock {config.name!r}",
            file=out,
        )
        started = time.perf_counter()
        for process in workers:
            process.start()
        gathered: list[_WorkerResult | BaseException] = []
        with _Progress(total, out) as bar:
            while len(gathered) < len(workers):
                bar.update(int(await admin.get(progress_key) or 0))
                while not results.empty():
                    gathered.append(results.get())
                if len(gathered) < len(workers):
                    if not any(p.is_alive() for p in workers) and results.empty():
                        break
                    await asyncio.sleep(0.1)
            bar.update(int(await admin.get(progress_key) or 0))
        elapsed = time.perf_counter() - started
        for process in workers:
            process.join(timeout=10)
        after = await _command_counts(admin)
        await admin.delete(progress_key, busy_key)
    finally:
        await admin.aclose()

    failures = [r for r in gathered if isinstance(r, BaseException)]
    done = [r for r in gathered if isinstance(r, _WorkerResult)]
    waits = sorted(w for r in done for w in r.waits)
    overlaps = sum(r.overlaps for r in done)
    lock_calls = sum(after.get(c, 0) - before.get(c, 0) for c in _LOCK_COMMANDS)
    acquisitions = len(waits)
    print(file=out)
    print("summary", file=out)
    rows = [
        ("acquisitions", f"{acquisitions} of {total}"),
        ("wall time", f"{elapsed:.2f} s ({acquisitions / elapsed:.0f} acquisitions/s)"),
        ("wait p50", f"{_percentile(waits, 0.50) * 1000:.1f} ms"),
        ("wait p99", f"{_percentile(waits, 0.99) * 1000:.1f} ms"),
        ("wait mean", f"{(statistics.fmean(waits) if waits else 0.0) * 1000:.1f} ms"),
        ("lock commands per acquisition", f"{lock_calls / max(acquisitions, 1):.2f}"),
        ("overlaps detected", str(overlaps)),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}", file=out)
    for failure in failures:
        print(f"worker failed: {failure!r}", file=out)
    ok = not failures and overlaps == 0 and acquisitions == total
    return 0 if ok else 1


def run_demo(config: DemoConfig, out: TextIO = sys.stdout) -> int:
    """Run the demo; return the exit status (0: every acquisition done, no overlap)."""
    url = config.url or os.environ.get("AIOLOCK_URL") or None
    with _server_for(url, out) as server_url:
        return asyncio.run(_run(server_url, config, out))
