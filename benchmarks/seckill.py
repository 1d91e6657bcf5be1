"""The "seckill" load test of an article: five retry strategies against aiolock's default.

The article 「分布式」实现分布式锁的正确姿势 ("the right way to do a distributed
lock") load-tested a flash-sale endpoint guarded by a Redis lock with
``ab -n 2000 -c 1000`` and compared five ways to wait between attempts: spinning
overloaded Redis, long sleeps starved waiters. This benchmark reproduces it:

* a FastAPI app (:mod:`benchmarks._seckill_app`) runs under uvicorn in a
  subprocess, with ``--workers`` processes (default 2) on one lock named
  ``seckill``; each request takes the lock, reads the stock, sells one unit if
  any is left, and releases (503 when the lock timeout passes first);
* an aiohttp load generator (``TCPConnector(limit=1000)``, a new connection per
  request, like ``ab`` without ``-k``) sends ``--requests`` requests from
  ``--concurrency`` clients (2000 / 1000, like the article), on stock 500;
* one row per strategy: the article's five as aiolock policies with
  ``notify=False`` (pure polling), then aiolock's defaults (release
  notifications, exponential backoff). ``--strategies`` also offers the control
  row ``polling`` (the defaults with ``notify=False``). Each row is
  ``--repeat`` full runs (fresh stock, fresh uvicorn), interleaved in rounds
  and pooled; the spread of the runs' means is shown, as this 2-core machine
  runs the load generator, the workers and the server at once.

With one Redis client per worker (``--clients 1``, the default), aiolock
queues a worker's waiters locally and only the head of each queue polls Redis,
so at most ``--workers`` waiters contend on the server, however many requests
wait. ``--clients N`` gives each worker N clients (N local queues) taken in
turn, so up to ``workers * N`` waiters poll at once, as the article's 1000
threads each did.

Columns follow ``ab``: failed requests (non-2xx, errors, and requests cut off
by the run's time bound), mean time per request, the percentile table and
requests per second, with ratios against the default. A second table gives
Redis commands per acquisition (lock commands the app's clients sent, i.e. all
sent minus the endpoint's own ``GET``/``DECR``/``INCR``; and every command the
server ran, from ``INFO commandstats``), how often the lock passed to another
worker and the mean gap between holdings (cross-worker and local), units sold,
oversold (must be 0), and overlapping holdings (must be 0; checked from the
``(acquired_at, released_at)`` pairs every worker reports on ``GET /stats``).

Exit status: 0, or 1 when any run oversold, overlapped, sold a different
number of units than it answered ``{"ok": true}`` for, stopped short of the
stock after answering "sold out", or could not collect every worker's figures.
Whether the default met its target is printed, not part of the status.

    .venv/bin/python -m benchmarks.seckill              # the full run (~3 minutes)
    .venv/bin/python -m benchmarks.seckill --quick      # a smoke run
    .venv/bin/python -m benchmarks.seckill --clients 50 --repeat 1   # article-like pollers
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import redis.asyncio as redis

from aiolock.testing import free_port
from benchmarks._measure import (
    PERCENTILES,
    count_overlaps,
    embedded_server,
    fmt_ms,
    percentiles,
    server_commands,
)
from benchmarks._runner import Benchmark, Session, in_turn, print_table
from benchmarks._seckill_app import LOCK_NAME
from benchmarks._subjects import ARTICLE_ROWS, DEFAULT_ROWS, SECKILL

__all__ = ["main"]

BENCHMARK: Final = Benchmark(
    "seckill",
    "The seckill load test of the article 「分布式」实现分布式锁的正确姿势 "
    "(ab -n 2000 -c 1000): its five retry strategies as aiolock policies "
    "without notifications, against aiolock's default.",
)
_ROOT = Path(__file__).resolve().parent.parent
_STOCK_KEY = "seckill:stock"
_SOLD_KEY = "seckill:sold"
_LOCK_KEY = f"aiolock:{{{LOCK_NAME}}}"
#: Seconds uvicorn may take to answer its first request.
_START_BOUND = 30.0
#: Seconds uvicorn may take to stop before it is killed.
_STOP_BOUND = 10.0
#: Seconds to spend polling ``/stats`` until every worker has answered.
_STATS_BOUND = 15.0
#: Seconds a client waits for one answer beyond the lock timeout.
_REQUEST_SLACK = 10.0


@dataclass
class _Run:
    """The figures of one full run of one strategy (fresh stock, fresh uvicorn)."""

    requests: int
    stock: int
    latencies: list[float] = field(default_factory=list)
    status: collections.Counter[str] = field(default_factory=collections.Counter)
    ok_true: int = 0
    ok_false: int = 0
    wall: float = 0.0
    cut_off: int = 0
    server_commands: int = 0
    client_sent: int = 0
    business: int = 0
    acquisitions: int = 0
    lock_timeouts: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)
    workers_complete: bool = False
    overlaps: int = 0
    handoffs: dict[str, Any] = field(default_factory=dict)
    sold: int = 0
    stock_left: int = 0

    @property
    def failed(self) -> int:
        """Requests not answered 200 (non-2xx, errors, cut off), as ``ab`` counts them."""
        return self.requests - self.ok_true - self.ok_false

    @property
    def oversold(self) -> int:
        """Units sold beyond the stock (must be 0)."""
        return max(0, self.sold - self.stock)

    @property
    def sales_consistent(self) -> bool:
        """Units sold match the "ok" answers, and a "sold out" answer means all stock went."""
        return self.sold == self.ok_true and (self.ok_false == 0 or self.sold == self.stock)

    @property
    def correct(self) -> bool:
        """No overselling, no overlap, consistent sales, every worker's holdings checked."""
        return (
            self.oversold == 0
            and self.overlaps == 0
            and self.sales_consistent
            and self.workers_complete
        )

    @property
    def mean(self) -> float:
        """Mean time per request in seconds (every answered request, like ``ab``)."""
        return statistics.fmean(self.latencies) if self.latencies else math.nan


@dataclass
class _Row:
    """One strategy: its runs (``--repeat`` of them) and the figures pooled over them."""

    key: str
    label: str
    runs: list[_Run] = field(default_factory=list)

    def _sum(self, name: str) -> int:
        return sum(int(getattr(run, name)) for run in self.runs)

    @property
    def latencies(self) -> list[float]:
        """Every answered request's time, over all runs."""
        return [value for run in self.runs for value in run.latencies]

    @property
    def failed(self) -> int:
        """Failed requests over all runs."""
        return self._sum("failed")

    @property
    def mean(self) -> float:
        """Mean time per request over all runs, in seconds."""
        latencies = self.latencies
        return statistics.fmean(latencies) if latencies else math.nan

    @property
    def p99(self) -> float:
        """The 99th percentile of the time per request over all runs, in seconds."""
        return percentiles(self.latencies, (99,))[99]

    @property
    def rate(self) -> float:
        """Requests answered per second of wall time, over all runs."""
        wall = sum(run.wall for run in self.runs)
        return len(self.latencies) / wall if wall > 0 else math.nan

    def per_acquisition(self, name: str) -> float:
        """A command count summed over the runs, divided by the acquisitions (NaN if none)."""
        acquisitions = self._sum("acquisitions")
        return self._sum(name) / acquisitions if acquisitions else math.nan

    @property
    def lock_commands_per_acquisition(self) -> float:
        """Commands the app's clients sent for locking (all sent minus the endpoint's own)."""
        acquisitions = self._sum("acquisitions")
        lock = self._sum("client_sent") - self._sum("business")
        return lock / acquisitions if acquisitions else math.nan

    def handoff(self, kind: str) -> tuple[int, float]:
        """The count of ``kind`` (local/cross) hand-offs and their mean gap in seconds."""
        count = sum(int(run.handoffs.get(f"{kind}_count", 0)) for run in self.runs)
        total = sum(
            run.handoffs.get(f"{kind}_count", 0) * run.handoffs[f"{kind}_gap_mean_ms"] / 1000
            for run in self.runs
            if run.handoffs.get(f"{kind}_count")
        )
        return count, (total / count if count else math.nan)

    @property
    def correct(self) -> bool:
        """Every run was correct."""
        return all(run.correct for run in self.runs)


# -- uvicorn in a subprocess ---------------------------------------------------------


async def _drain(stream: asyncio.StreamReader, tail: collections.deque[str]) -> None:
    """Keep the last lines of uvicorn's output (so a full pipe never blocks it)."""
    async for line in stream:
        tail.append(line.decode(errors="replace").rstrip())


@contextlib.asynccontextmanager
async def _uvicorn(redis_url: str, strategy: str, args: argparse.Namespace) -> AsyncIterator[str]:
    """Run the seckill app under uvicorn; yield its base URL once it answers; always stop it.

    Raises:
        RuntimeError: uvicorn exited or did not answer within the start bound.
    """
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
        "SECKILL_REDIS_URL": redis_url,
        "SECKILL_STRATEGY": strategy,
        "SECKILL_LOCK_TIMEOUT": str(args.lock_timeout),
        "SECKILL_CLIENTS": str(args.clients),
        "SECKILL_STOCK_KEY": _STOCK_KEY,
        "SECKILL_SOLD_KEY": _SOLD_KEY,
    }
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "benchmarks._seckill_app:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(args.workers),
        "--loop",
        args.loop,
        "--log-level",
        "warning",
        "--no-access-log",
        "--backlog",
        "4096",
        "--timeout-graceful-shutdown",
        "3",
    ]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=_ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group: the workers go with it
    )
    tail: collections.deque[str] = collections.deque(maxlen=40)
    assert process.stdout is not None
    drain = asyncio.create_task(_drain(process.stdout, tail))
    base = f"http://127.0.0.1:{port}"
    try:
        await _wait_until_up(base, process, tail)
        yield base
    finally:
        await _stop(process)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drain, _STOP_BOUND)
        if tail:  # warnings only (--log-level warning): aiolock's lost locks, errors
            print(
                f"uvicorn ({strategy}, exit status {process.returncode}) said:\n  "
                + "\n  ".join(tail),
                file=sys.stderr,
            )


async def _wait_until_up(
    base: str, process: asyncio.subprocess.Process, tail: collections.deque[str]
) -> None:
    """Poll ``GET /stats`` until uvicorn answers.

    Raises:
        RuntimeError: uvicorn exited, or did not answer within the start bound.
    """
    deadline = time.monotonic() + _START_BOUND
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                break
            try:
                async with session.get(f"{base}/stats") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
    said = "\n  ".join(tail)
    raise RuntimeError(
        f"uvicorn did not come up at {base} (exit status {process.returncode}):\n  {said}"
    )


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Stop uvicorn gracefully (SIGTERM), and kill its process group if it lingers."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_BOUND)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # a worker the supervisor left behind


# -- the load ------------------------------------------------------------------------


async def _load(row: _Run, base: str, concurrency: int, lock_timeout: float, budget: float) -> None:
    """Send ``row.requests`` POST /buy from ``concurrency`` clients, ``ab``-style.

    Every request gets a new connection (``ab`` without ``-k``). The whole run
    is bounded by ``budget`` seconds; requests still unanswered then count as
    failed ("cut off").
    """
    issued = itertools.count()
    url = f"{base}/buy"

    async def client(session: aiohttp.ClientSession) -> None:
        while next(issued) < row.requests:
            started = time.perf_counter()
            try:
                async with session.post(url) as response:
                    body = await response.json(content_type=None)
                    status = str(response.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
                body = None
            row.latencies.append(time.perf_counter() - started)
            row.status[status] += 1
            if status == "200" and isinstance(body, dict):
                if body.get("ok") is True:
                    row.ok_true += 1
                else:
                    row.ok_false += 1

    connector = aiohttp.TCPConnector(limit=1000, force_close=True)
    timeout = aiohttp.ClientTimeout(total=lock_timeout + _REQUEST_SLACK)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(budget):
                await asyncio.gather(*(client(session) for _ in range(concurrency)))
        except TimeoutError:
            pass
        row.wall = time.perf_counter() - started
    row.cut_off = row.requests - len(row.latencies)


async def _collect_stats(row: _Run, base: str, workers: int) -> None:
    """Poll ``GET /stats`` on fresh connections until every worker (pid) has answered."""
    seen: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + _STATS_BOUND
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while len(seen) < workers and time.monotonic() < deadline:
            try:
                async with session.get(f"{base}/stats") as response:
                    stats = await response.json()
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.05)
                continue
            seen[int(stats["pid"])] = stats
            if len(seen) < workers:
                await asyncio.sleep(0.01)
    row.workers_complete = len(seen) == workers
    holdings = sorted(
        (float(a), float(b), pid) for pid, s in seen.items() for a, b in s["intervals"]
    )
    row.overlaps = count_overlaps((a, b) for a, b, _ in holdings)
    row.handoffs = _handoffs(holdings)
    row.client_sent = sum(int(s["sent"]) for s in seen.values())
    row.business = sum(int(s["business"]) for s in seen.values())
    row.acquisitions = sum(int(s["acquisitions"]) for s in seen.values())
    row.lock_timeouts = sum(int(s["timeouts"]) for s in seen.values())
    row.workers = [
        {k: v for k, v in s.items() if k != "intervals"} | {"holdings": len(s["intervals"])}
        for s in seen.values()
    ]


def _handoffs(holdings: Sequence[tuple[float, float, int]]) -> dict[str, Any]:
    """Describe how the lock passed between holders: busy time and the gaps between holdings.

    A hand-off is the gap from one holding's end to the next one's start; it is
    "local" when both holdings are in the same worker process (aiolock's local
    queue passes the baton) and "cross" when the lock moved to another worker
    (which only the waiting strategy decides).

    Args:
        holdings: ``(acquired_at, released_at, pid)``, sorted.

    Returns:
        The busy fraction of the span from the first holding to the last, and
        the count, mean and p99 (ms) of local and cross-worker gaps.
    """
    if not holdings:
        return {}
    span = holdings[-1][1] - holdings[0][0]
    busy = sum(b - a for a, b, _ in holdings)
    gaps: dict[str, list[float]] = {"local": [], "cross": []}
    for (_, end, pid), (start, _, next_pid) in itertools.pairwise(holdings):
        gaps["local" if pid == next_pid else "cross"].append(start - end)
    figures: dict[str, Any] = {"busy_fraction": busy / span if span > 0 else math.nan}
    for kind, values in gaps.items():
        figures[f"{kind}_count"] = len(values)
        figures[f"{kind}_gap_mean_ms"] = statistics.fmean(values) * 1000 if values else math.nan
        figures[f"{kind}_gap_p99_ms"] = percentiles(values, (99,))[99] * 1000
    figures["hold_mean_ms"] = busy / len(holdings) * 1000
    return figures


async def _run_once(admin: redis.Redis, redis_url: str, key: str, args: argparse.Namespace) -> _Run:
    """One full run of one strategy: fresh stock, a fresh uvicorn, the load, the figures."""
    result = _Run(args.requests, args.stock)
    await admin.delete(_LOCK_KEY)
    await admin.set(_STOCK_KEY, args.stock)
    await admin.set(_SOLD_KEY, 0)
    async with _uvicorn(redis_url, key, args) as base:
        before = await server_commands(admin)
        await _load(result, base, args.concurrency, args.lock_timeout, args.row_budget)
        result.server_commands = await server_commands(admin) - before - 1  # minus our INFO
        await _collect_stats(result, base, args.workers)
    result.sold = int(await admin.get(_SOLD_KEY) or 0)
    result.stock_left = int(await admin.get(_STOCK_KEY) or 0)
    return result


async def _bench(args: argparse.Namespace, redis_url: str) -> list[_Row]:
    """Run every strategy ``--repeat`` times, in rounds, against the server at ``redis_url``.

    Each round runs every strategy once, starting one further along the list
    than the round before, so a drift of the machine does not favour any row.
    A new round starts only while the time budget lasts (the first always runs).
    """
    admin = redis.Redis.from_url(redis_url)
    rows = {key: _Row(key, SECKILL[key].label) for key in args.strategies}
    keys = list(rows)
    started = time.monotonic()
    try:
        for round_ in range(args.repeat):
            elapsed = time.monotonic() - started
            if round_ and elapsed * (round_ + 1) / round_ > args.time_budget:
                print(f"stopping after {round_} rounds: the next would pass --time-budget")
                break
            for key in in_turn(keys, round_):
                result = await _run_once(admin, redis_url, key, args)
                rows[key].runs.append(result)
                print(
                    f"round {round_ + 1}, {rows[key].label}: "
                    f"{len(result.latencies)}/{result.requests} answered in {result.wall:.1f} s, "
                    f"mean {fmt_ms(result.mean, 0)} ms, {result.failed} failed, "
                    f"sold {result.sold}/{result.stock}, overlaps {result.overlaps}",
                    flush=True,
                )
    finally:
        await admin.aclose()
    return list(rows.values())


# -- report --------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> str:
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return "-"
    return f"{numerator / denominator:.2f}x"


def _one_decimal(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _spread(values: Sequence[float]) -> str:
    """``min-max`` in ms of the runs' means (one value for one run)."""
    if not values:
        return "-"
    low, high = fmt_ms(min(values), 0), fmt_ms(max(values), 0)
    return low if low == high else f"{low}-{high}"


def _sold(row: _Row) -> str:
    sold = sorted({f"{run.sold}/{run.stock}" for run in row.runs})
    return ", ".join(sold)


def _report(rows: Sequence[_Row], args: argparse.Namespace) -> tuple[list[str], bool]:
    """Print both tables; return the target verdict lines and whether the target is met."""
    runs = max((len(row.runs) for row in rows), default=0)
    default = next((row for row in rows if row.key == "default"), None)
    d_mean = default.mean if default is not None else math.nan
    d_p99 = default.p99 if default is not None else math.nan
    table_ms = [
        [
            row.label,
            row.failed,
            fmt_ms(row.mean, 1),
            *(fmt_ms(p, 1) for p in percentiles(row.latencies).values()),
            f"{row.rate:.0f}",
            _spread([run.mean for run in row.runs]),
            _ratio(row.mean, d_mean),
            _ratio(row.p99, d_p99),
        ]
        for row in rows
    ]
    print_table(
        f"seckill: like ab -n {args.requests} -c {args.concurrency}, stock {args.stock}, "
        f"{args.workers} uvicorn workers x {args.clients} client(s), "
        f"lock timeout {args.lock_timeout:g} s; {runs} run(s) per row, pooled; times in ms; "
        "ratios: this row / aiolock default (> 1: the default is faster)",
        [
            "strategy",
            "failed",
            "mean",
            *(f"{p}%" for p in PERCENTILES),
            "req/s",
            "run means",
            "mean ratio",
            "p99 ratio",
        ],
        table_ms,
    )
    table_load = []
    for row in rows:
        cross, cross_gap = row.handoff("cross")
        local, _ = row.handoff("local")
        table_load.append(
            [
                row.label,
                _one_decimal(row.lock_commands_per_acquisition),
                _one_decimal(row.per_acquisition("server_commands")),
                f"{cross}/{cross + local}",
                fmt_ms(cross_gap, 2),
                _sold(row),
                max((run.oversold for run in row.runs), default=0),
                sum(run.overlaps for run in row.runs)
                if all(run.workers_complete for run in row.runs)
                else "unchecked",
            ]
        )
    print_table(
        "seckill: Redis commands per acquisition (lock commands sent / all server "
        "commands), hand-offs to another worker, correctness",
        [
            "strategy",
            "lock cmd/acq",
            "srv cmd/acq",
            "cross hand-offs",
            "cross gap ms",
            "sold",
            "oversold",
            "overlaps",
        ],
        table_load,
    )
    return _verdict(rows, default)


def _verdict(rows: Sequence[_Row], default: _Row | None) -> tuple[list[str], bool]:
    """Check the target: the default has 0 failures, 0 oversold, a lower mean and p99.

    The default is compared with the article's five rows only (not control rows).
    """
    if default is None:
        return ["target: not checked (the default row was not run)"], False
    misses: list[str] = []
    if default.failed:
        misses.append(f"{default.failed} failed requests")
    oversold = sum(run.oversold for run in default.runs)
    if oversold:
        misses.append(f"{oversold} units oversold")
    for row in rows:
        if row.key not in ARTICLE_ROWS:
            continue
        if not default.mean < row.mean:
            misses.append(
                f"mean {fmt_ms(default.mean, 1)} ms not below {row.label}'s {fmt_ms(row.mean, 1)}"
            )
        if not default.p99 < row.p99:
            misses.append(
                f"p99 {fmt_ms(default.p99, 1)} ms not below {row.label}'s {fmt_ms(row.p99, 1)}"
            )
    compared = sum(row.key in ARTICLE_ROWS for row in rows)
    met = not misses and compared == len(ARTICLE_ROWS)
    if compared < len(ARTICLE_ROWS):
        misses.append(f"only {compared} of the article's {len(ARTICLE_ROWS)} rows were run")
    head = (
        "target: the default row has 0 failures, 0 oversold, and a lower mean and p99 "
        f"than every one of the article's strategies: {'MET' if met else 'NOT MET'}"
    )
    return [head, *(f"  - {miss}" for miss in misses)], met


def _plot(session: Session, rows: Sequence[_Row], args: argparse.Namespace) -> None:
    """Latency percentile curves per strategy, and Redis commands per acquisition."""
    points = list(range(1, 101))
    widths = {"width_ratios": [3, 2]}
    with session.chart(1, 2, figsize=(14, 5.5), gridspec_kw=widths) as (_, (curves, bars)):
        for row in rows:
            latencies = row.latencies
            if not latencies:
                continue
            values = percentiles(latencies, points)
            style: dict[str, Any] = (
                {"linewidth": 2.8, "color": "black"} if row.key == "default" else {"linewidth": 1.5}
            )
            curves.plot(points, [values[p] * 1000 for p in points], label=row.label, **style)
        curves.set_xlim(1, 100)
        curves.set_xlabel("percentage of the requests served within a certain time (%)")
        curves.set_ylabel("time per request (ms)")
        curves.set_title(
            f"seckill, like ab -n {args.requests} -c {args.concurrency}: "
            f"{args.workers} uvicorn workers, stock {args.stock}"
        )
        curves.grid(True, alpha=0.3)
        curves.legend(fontsize="small", loc="upper left")
        labels = [row.label for row in rows]
        client = [row.lock_commands_per_acquisition for row in rows]
        server = [row.per_acquisition("server_commands") for row in rows]
        positions = list(range(len(rows)))
        bars.barh([p - 0.2 for p in positions], client, height=0.4, label="lock commands sent")
        bars.barh([p + 0.2 for p in positions], server, height=0.4, label="all server commands")
        bars.set_yticks(positions, labels, fontsize="small")
        bars.invert_yaxis()
        bars.set_xlabel("Redis commands per acquisition")
        bars.set_title("load on Redis")
        bars.legend(fontsize="small", loc="lower right")


def _run_json(result: _Run, concurrency: int) -> dict[str, Any]:
    """Every figure of one run (holdings summarised as hand-off figures).

    ``ab_time_per_request_ms`` is ``ab``'s own "Time per request" (concurrency x
    wall time / answered requests); ``mean_ms`` is the mean of each request's time.
    """
    answered = len(result.latencies)
    return {
        "requests": result.requests,
        "answered": answered,
        "cut_off": result.cut_off,
        "failed": result.failed,
        "status": dict(result.status),
        "ok_true": result.ok_true,
        "ok_false": result.ok_false,
        "wall_s": result.wall,
        "requests_per_s": answered / result.wall if result.wall > 0 else math.nan,
        "mean_ms": result.mean * 1000,
        "ab_time_per_request_ms": concurrency * result.wall * 1000 / max(answered, 1),
        "percentiles_ms": {p: v * 1000 for p, v in percentiles(result.latencies).items()},
        "acquisitions": result.acquisitions,
        "lock_timeouts": result.lock_timeouts,
        "client_commands_sent": result.client_sent,
        "client_business_commands": result.business,
        "server_commands": result.server_commands,
        "stock": result.stock,
        "sold": result.sold,
        "stock_left": result.stock_left,
        "oversold": result.oversold,
        "sales_consistent": result.sales_consistent,
        "overlaps": result.overlaps,
        "workers_complete": result.workers_complete,
        "handoffs": result.handoffs,
        "workers": result.workers,
    }


def _row_json(row: _Row, concurrency: int) -> dict[str, Any]:
    """Every figure of one strategy: pooled over its runs, then each run."""
    cross, cross_gap = row.handoff("cross")
    local, local_gap = row.handoff("local")
    return {
        "key": row.key,
        "label": row.label,
        "description": SECKILL[row.key].description,
        "runs": len(row.runs),
        "failed": row.failed,
        "mean_ms": row.mean * 1000,
        "percentiles_ms": {p: v * 1000 for p, v in percentiles(row.latencies).items()},
        "curve_ms": {p: v * 1000 for p, v in percentiles(row.latencies, range(1, 101)).items()},
        "requests_per_s": row.rate,
        "lock_commands_per_acquisition": row.lock_commands_per_acquisition,
        "server_commands_per_acquisition": row.per_acquisition("server_commands"),
        "cross_worker_handoffs": cross,
        "cross_worker_gap_mean_ms": cross_gap * 1000,
        "local_handoffs": local,
        "local_gap_mean_ms": local_gap * 1000,
        "oversold": sum(run.oversold for run in row.runs),
        "overlaps": sum(run.overlaps for run in row.runs),
        "correct": row.correct,
        "per_run": [_run_json(run, concurrency) for run in row.runs],
    }


# -- entry point ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = BENCHMARK.parser()
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (default 2)")
    parser.add_argument(
        "--clients",
        type=int,
        default=1,
        help="redis clients (so local queues) per worker, taken in turn by requests; "
        "more than 1 lets several coroutines per worker poll Redis at once, as the "
        "article's threads did (default 1)",
    )
    parser.add_argument("--requests", type=int, help="requests per run (default 2000; quick 100)")
    parser.add_argument(
        "--concurrency", type=int, help="concurrent clients (default 1000; quick 50)"
    )
    parser.add_argument("--stock", type=int, help="units on sale per run (default 500; quick 25)")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        help="seconds a request may wait for the lock before a 503 (default 10; quick 3)",
    )
    parser.add_argument(
        "--row-budget",
        type=float,
        help="seconds one run's load may take; requests unanswered then fail "
        "(default 30; quick 10)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help="runs per strategy, interleaved in rounds and pooled (default 8; quick 1)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=240.0,
        help="seconds after which no new round starts (default 240; the first always runs)",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_ROWS),
        help=f"comma-separated rows to run, of {','.join(SECKILL)} "
        f"(default: {','.join(DEFAULT_ROWS)})",
    )
    return parser


def _fill_defaults(args: argparse.Namespace) -> None:
    """Fill the size options left unset, from the full or the quick sizes."""
    full: dict[str, float] = {
        "requests": 2000,
        "concurrency": 1000,
        "stock": 500,
        "lock_timeout": 10.0,
        "row_budget": 30.0,
        "repeat": 8,
    }
    quick: dict[str, float] = {
        "requests": 100,
        "concurrency": 50,
        "stock": 25,
        "lock_timeout": 3.0,
        "row_budget": 10.0,
        "repeat": 1,
    }
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the seckill benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        0, or 1 if any run oversold, overlapped, sold inconsistently, or could
        not collect every worker's figures; 3 (``EXIT_MISSED``) if the target
        was missed (not judged with ``--quick``); 130 if interrupted (SIGINT, SIGTERM).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    _fill_defaults(args)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in SECKILL]
    if unknown:
        parser.error(f"unknown strategies {unknown}; choose from {', '.join(SECKILL)}")
    if min(args.workers, args.clients, args.requests, args.concurrency, args.repeat) < 1:
        parser.error("--workers, --clients, --requests, --concurrency, --repeat must be >= 1")
    if args.stock < 0:
        parser.error("--stock must be >= 0")
    session = BENCHMARK.session(args, argv)
    # SIGTERM stops the run like Ctrl-C does: uvicorn and the server are stopped on the way out.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with embedded_server() as server:
            url = server.url
            rows = session.run(lambda: _bench(args, url))
    except KeyboardInterrupt:
        print("interrupted: uvicorn and the server were stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    verdict, met = _report(rows, args)
    verdict[0] = session.judge(met, verdict[0])
    for line in verdict[1:]:
        print(line)
    _plot(session, rows, args)
    session.write_json(
        {
            "benchmark": BENCHMARK.name,
            "command": session.command,
            "config": {
                "requests": args.requests,
                "concurrency": args.concurrency,
                "stock": args.stock,
                "workers": args.workers,
                "clients_per_worker": args.clients,
                "lock_timeout_s": args.lock_timeout,
                "row_budget_s": args.row_budget,
                "repeat": args.repeat,
                "loop": args.loop,
                "quick": args.quick,
                "cpus": os.cpu_count(),
            },
            "rows": [_row_json(row, args.concurrency) for row in rows],
            "target": {"met": met, "verdict": verdict},
        }
    )
    for row in rows:
        for number, one in enumerate(row.runs, 1):
            if not one.workers_complete:
                print(f"{row.label} run {number}: not every worker answered /stats")
            if not one.sales_consistent:
                print(
                    f"{row.label} run {number}: sold {one.sold} units but answered ok "
                    f"{one.ok_true} times and sold out {one.ok_false} times"
                )
    bad = [row.label for row in rows if not row.correct]
    return session.finish(
        broken=f"correctness failure in: {', '.join(bad)}" if bad else "",
        missed="" if met else "the target was missed (see the FAIL line above)",
    )


if __name__ == "__main__":
    sys.exit(main())
