"""Soak run: many holders on a few locks while faults hit the lock server, its network and holders.

``--processes`` worker processes (default 4) x ``--coroutines`` coroutines
(default 100) take ``AsyncLock(..., fencing=True)`` on ``--names`` names
(default 20), with a short lease (``--ttl``, default 1 s; ``--quick``: 0.5 s
and 14 s of load). Two private
embedded Valkey servers run on loopback:

* the **lock server**, which the workers reach only through a fault proxy
  (``aiolock.testing.FaultProxy``, run in this process on a
  loopback port);
* the **resource server**, reached directly and never faulted, which holds
  each name's set of holders inside (the mutual-exclusion check), an
  unfenced counter and a fenced counter (see :mod:`benchmarks._soak_worker`).

After a fault-free start (a tenth of the run, at least 2 s; 1 s with
``--quick``), one fault is injected every ``--fault-gap`` seconds (random,
default 2-5 s; 0.3-0.8 s with ``--quick``); timed faults last
``--fault-length`` leases (1.5 by default); the kinds are
drawn from a shuffled bag, so every kind comes up before any repeats:

* ``kill``: SIGKILL the lock server, restart it empty on the same port;
* ``pause``: SIGSTOP the lock server for longer than the lease, then SIGCONT;
* ``blackhole``: the proxy forwards nothing for longer than the lease;
* ``reset``: the proxy resets (RST) every connection;
* ``latency``: the proxy delays every chunk for a few seconds;
* ``hold_replies``: the proxy holds every reply for longer than the lease
  (the server still runs the commands: grants arrive late);
* ``loop_block``: one worker's event loop is blocked with ``time.sleep``
  for longer than the lease (a holder frozen mid-write);
* ``pubsub_reset``: the lock server closes every pub/sub connection
  (``CLIENT KILL TYPE pubsub``: release notifications break).

At the end every fault is healed, the coroutines finish their iteration, and
the summary is printed: acquisitions, faults per kind, overlaps (a holder
entering found another inside), losses declared by aiolock, errors by type,
and lost updates (acknowledged increments minus the final counter), unfenced
and fenced. Events are also sorted into those within a fault's window (from
its start to ``ttl + socket_timeout + 0.5`` s after its end) and those
outside any, and every overlap is checked for the invariant a defect would
break: aiolock told at least one of the two holders that it had lost the
lock (only lost data, a restart, can hide a double holding from both).

Expected under these faults: overlaps and unfenced lost updates (a holder
frozen or cut off past its lease keeps writing), losses, errors, fenced
rejections. The fenced read-modify-write records the fence at the read as
well as the write, so a stale holder's write that lands between a newer
holder's read and write is refused (a resource that checks only at the
write would lose that update). A restart with empty data starts the fencing
counters over, so fenced writes are rejected as stale until the new fences
pass the highest the resource has seen: those are rejections, not lost
updates. Not expected: fenced lost updates, crashed workers or coroutines,
exceptions that are neither redis-py's nor aiolock's, tasks or connections
left behind, overlaps that neither holder was told of without a restart.

Exit status: 1 if fenced updates were lost, or a worker or coroutine crashed,
or the run overran its bound; otherwise 0 (other anomalies are printed as
WARN lines and kept in the JSON).

    .venv/bin/python -m benchmarks.soak                  # 300 s (at most 600)
    .venv/bin/python -m benchmarks.soak --quick          # ~20 s smoke run
    .venv/bin/python -m benchmarks.soak --duration 120 --draw 7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.queues
import os
import queue
import random
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from aiolock.testing import FaultProxy, RedisServer

from ._runner import Benchmark, print_table
from ._soak_worker import WorkerConfig, resource_keys, worker_main

BENCHMARK: Final = Benchmark("soak", __doc__.split("\n")[0])
ROOT: Final = Path(__file__).resolve().parent.parent

#: The longest run ``--duration`` allows, in seconds.
MAX_DURATION: Final = 600.0
#: The run's length with ``--quick`` (unless ``--duration`` is given).
QUICK_DURATION: Final = 14.0

FAULT_KINDS: Final = (
    "kill",
    "pause",
    "blackhole",
    "reset",
    "latency",
    "hold_replies",
    "loop_block",
    "pubsub_reset",
)

FAULT_HELP: Final = {
    "kill": "lock server SIGKILL, restarted empty",
    "pause": "lock server SIGSTOP past the lease, then SIGCONT",
    "blackhole": "proxy forwards nothing past the lease",
    "reset": "proxy resets every connection",
    "latency": "proxy delays every chunk",
    "hold_replies": "proxy holds replies past the lease",
    "loop_block": "a worker's event loop blocked past the lease",
    "pubsub_reset": "lock server drops its pub/sub connections",
}


# -- the fault proxy (aiolock.testing.FaultProxy) -------------------------------------

#: The fault proxy in front of the lock server.
Proxy = FaultProxy


def make_proxy(host: str, port: int) -> Proxy:
    """Return a (not yet started) fault proxy to ``host:port``.

    Args:
        host: the upstream server's address.
        port: its port.

    Returns:
        An ``aiolock.testing.FaultProxy``.
    """
    return FaultProxy(host, port)


# -- configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What one soak run does.

    Attributes:
        duration: seconds of load (faults from ``calm`` on).
        calm: fault-free seconds at the start.
        processes: worker processes.
        coroutines: coroutines per process.
        names: how many lock names.
        ttl: the lease, in seconds.
        acquire_timeout: the bound of one acquisition, in seconds.
        socket_timeout: the lock client's socket timeout, in seconds.
        fault_gap: the range of seconds between two faults.
        fault_length: how long a timed fault lasts, in leases.
        long_hold: the probability of a holding that pauses for much of its lease.
        draw: the number every random choice is drawn from.
        loop: ``"asyncio"`` or ``"uvloop"``.
    """

    duration: float
    calm: float
    processes: int
    coroutines: int
    names: int
    ttl: float
    acquire_timeout: float
    socket_timeout: float
    fault_gap: tuple[float, float]
    fault_length: float
    long_hold: float
    draw: int
    loop: str

    @property
    def drain(self) -> float:
        """Seconds the coroutines get to finish after stop: one slow iteration."""
        return self.acquire_timeout + 2 * self.ttl + 4 * self.socket_timeout + 5.0

    @property
    def bound(self) -> float:
        """Seconds the whole run may take: start-up, load, drain, final checks, margins."""
        return 60.0 + self.duration + self.drain + 30.0 + self.ttl + 30.0

    @property
    def slack(self) -> float:
        """Seconds after a fault's end during which events still count as its effects.

        A holder cut off at the fault's end notices within a lease; a command
        sent into it fails within a socket timeout.
        """
        return self.ttl + self.socket_timeout + 0.5


@dataclass
class Fault:
    """One injected fault.

    Attributes:
        kind: one of :data:`FAULT_KINDS`.
        start: ``time.monotonic()`` when it began.
        end: when it was healed (the same as ``start`` for instant faults).
        detail: what exactly was done.
        connections: client connections open through the proxy just before
            (a leak would show as growth from fault to fault).
    """

    kind: str
    start: float
    end: float
    detail: str
    connections: int = 0


@dataclass
class Soak:
    """The state of a run, as the coordinator sees it.

    Attributes:
        config: the run's configuration.
        lock_server: the lock server (the faults kill, pause and restart it).
        proxy: the fault proxy in front of it.
        controls: one queue per worker for the coordinator's messages.
        faults: the faults injected so far.
        progress: each worker's latest counts.
        reports: each worker's final report.
        crashes: each crashed worker's traceback or exit code.
        ready: the workers that reported ready.
        started: ``time.monotonic()`` when the workers were let go.
    """

    config: Config
    lock_server: RedisServer
    proxy: Proxy
    controls: list[multiprocessing.queues.Queue[Any]]
    faults: list[Fault] = field(default_factory=list)
    progress: dict[int, dict[str, int]] = field(default_factory=dict)
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    crashes: dict[int, str] = field(default_factory=dict)
    ready: set[int] = field(default_factory=set)
    started: float = 0.0


# -- faults ----------------------------------------------------------------------------


async def _hold(seconds: float, until: float) -> None:
    """Sleep ``seconds``, but not past ``until``."""
    await asyncio.sleep(max(0.0, min(seconds, until - time.monotonic())))


async def _inject(soak: Soak, kind: str, rng: random.Random, until: float, admin: Redis) -> str:
    """Inject one fault of ``kind`` and heal it; return what was done."""
    config = soak.config
    length = config.fault_length * config.ttl
    server, proxy = soak.lock_server, soak.proxy
    if kind == "kill":
        down = rng.uniform(0.0, config.ttl / 2)
        server.kill()
        await asyncio.sleep(down)
        server.restart()
        return f"SIGKILL, down {down:.2f} s, restarted empty"
    if kind == "pause":
        server.pause()
        try:
            await _hold(length, until)
        finally:
            server.resume()
        return f"SIGSTOP for {length:.2f} s"
    if kind == "blackhole":
        proxy.black_hole()
        try:
            await _hold(length, until)
        finally:
            proxy.pass_through()
        return f"black hole for {length:.2f} s"
    if kind == "reset":
        count = proxy.connections
        await proxy.reset_all()
        return f"reset {count} connections"
    if kind == "latency":
        delay = rng.uniform(0.05, 0.3) * config.ttl
        proxy.set_latency(delay)
        try:
            await _hold(length, until)
        finally:
            proxy.set_latency(0.0)
        return f"{delay * 1000:.0f} ms each way for {length:.2f} s"
    if kind == "hold_replies":
        proxy.hold_replies(new_connections=True)
        try:
            await _hold(length, until)
        finally:
            proxy.release_replies()
        return f"replies held for {length:.2f} s"
    if kind == "loop_block":
        worker = rng.randrange(len(soak.controls))
        soak.controls[worker].put(("block", length))
        await _hold(length, until)
        return f"worker {worker} blocked for {length:.2f} s"
    if kind == "pubsub_reset":
        killed = await admin.client_kill_filter(_type="pubsub", skipme=True)
        return f"closed {killed} pub/sub connections"
    raise ValueError(f"unknown fault kind {kind!r}")


def _heal(soak: Soak) -> None:
    """Undo whatever fault may be in force (idempotent)."""
    soak.proxy.pass_through()
    server = soak.lock_server
    if server.paused:
        server.resume()
    if not server.running:
        server.restart()


async def _fault_loop(soak: Soak, rng: random.Random, until: float, admin: Redis) -> None:
    """Inject faults one after another, at random gaps, until ``until``."""
    config = soak.config
    bag: list[str] = []
    await asyncio.sleep(max(0.0, soak.started + config.calm - time.monotonic()))
    while True:
        gap = rng.uniform(*config.fault_gap)
        if time.monotonic() + gap >= until - 0.5:
            return
        await asyncio.sleep(gap)
        if not bag:
            bag = list(FAULT_KINDS)
            rng.shuffle(bag)
        kind = bag.pop()
        fault = Fault(kind, time.monotonic(), 0.0, "", soak.proxy.connections)
        soak.faults.append(fault)
        try:
            async with asyncio.timeout(config.fault_length * config.ttl + 20.0):
                fault.detail = await _inject(soak, kind, rng, until, admin)
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            fault.detail = f"could not inject: {exc!r}"
        fault.end = time.monotonic()
        _print_progress(soak, f"fault {len(soak.faults):>3} {kind:<12} {fault.detail}")


def _print_progress(soak: Soak, what: str) -> None:
    totals = {
        key: sum(p.get(key, 0) for p in soak.progress.values())
        for key in ("acquisitions", "overlaps", "losses", "errors")
    }
    elapsed = time.monotonic() - soak.started
    print(
        f"[{elapsed:6.1f} s] {what:<62} | acq {totals['acquisitions']:>8,} "
        f"overlaps {totals['overlaps']:>4} losses {totals['losses']:>5} "
        f"errors {totals['errors']:>5}",
        flush=True,
    )


# -- workers ---------------------------------------------------------------------------


async def _read_results(soak: Soak, results: multiprocessing.queues.Queue[Any]) -> None:
    """Collect the workers' messages until cancelled."""
    while True:
        try:
            kind, worker, data = await asyncio.to_thread(results.get, True, 0.2)
        except queue.Empty:
            continue
        if kind == "ready":
            soak.ready.add(worker)
        elif kind == "progress":
            soak.progress[worker] = data
        elif kind == "report":
            soak.reports[worker] = data
        elif kind == "crash":
            soak.crashes[worker] = data["error"]


async def _until(check: Callable[[], bool], bound: float, alive: Callable[[], bool]) -> bool:
    """Wait until ``check()``; False after ``bound`` seconds or when ``alive()`` turns False."""
    deadline = time.monotonic() + bound
    while not check():
        if time.monotonic() >= deadline or not alive():
            return check()
        await asyncio.sleep(0.05)
    return True


def _stop_processes(processes: Sequence[multiprocessing.process.BaseProcess], grace: float) -> None:
    """Join the workers for up to ``grace`` seconds, then kill any still alive."""
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5.0)


async def _final_state(
    soak: Soak, resource: Redis, admin: Redis, names: Sequence[str]
) -> dict[str, Any]:
    """Read the counters, and the lock keys left a lease after the coroutines ended."""
    unfenced: dict[str, int] = {}
    fenced: dict[str, int] = {}
    for name in names:
        keys = resource_keys(name)
        raw_unfenced, raw_fenced = await resource.mget([keys["unfenced"], keys["fenced"]])
        unfenced[name] = int(raw_unfenced or 0)
        fenced[name] = int(raw_fenced or 0)
    # Every holding has ended: after one more lease no lock key may remain
    # (one still there would be renewed by a task that outlived its holding).
    await asyncio.sleep(soak.config.ttl + 0.3)
    left = [
        key.decode() if isinstance(key, bytes) else str(key)
        async for key in admin.scan_iter(match="aiolock:*")
    ]
    return {
        "unfenced": unfenced,
        "fenced": fenced,
        "lock_keys_left": sorted(k for k in left if not k.endswith(":fence")),
    }


async def _soak(config: Config) -> dict[str, Any]:
    """Run the servers, the proxy, the workers and the faults; return the raw results."""
    rng = random.Random(config.draw)
    names = tuple(f"soak-{i:02d}" for i in range(config.names))
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.queues.Queue[Any] = context.Queue()
    controls: list[multiprocessing.queues.Queue[Any]] = [
        context.Queue() for _ in range(config.processes)
    ]
    processes: list[multiprocessing.process.BaseProcess] = []
    lock_server = RedisServer()
    resource_server = RedisServer()
    reader: asyncio.Task[None] | None = None
    proxy: Proxy | None = None
    clients: list[Redis] = []
    try:
        # The whole run is bounded: start-up, load, drain and the final checks.
        async with asyncio.timeout(config.bound):
            lock_server.start()
            resource_server.start()
            proxy = make_proxy(lock_server.host, lock_server.port)
            await proxy.start()
            # The coordinator's own clients retry: the lock server restarts under the admin.
            admin = Redis.from_url(lock_server.url, socket_timeout=5.0, retry=_retry())
            resource = Redis.from_url(resource_server.url, socket_timeout=30.0, retry=_retry())
            clients += [admin, resource]
            soak = Soak(config, lock_server, proxy, controls)
            reader = asyncio.create_task(_read_results(soak, results))
            # Workers exit by themselves past the run's bound (an orphan never lingers).
            hard_deadline = time.monotonic() + config.bound
            for index in range(config.processes):
                worker = WorkerConfig(
                    worker=index,
                    lock_url=f"redis://127.0.0.1:{proxy.port}",
                    resource_url=resource_server.url,
                    names=names,
                    coroutines=config.coroutines,
                    ttl=config.ttl,
                    acquire_timeout=config.acquire_timeout,
                    socket_timeout=config.socket_timeout,
                    long_hold=config.long_hold,
                    draw=config.draw,
                    loop=config.loop,
                    deadline=hard_deadline,
                    drain=config.drain,
                )
                process = context.Process(
                    target=worker_main,
                    args=(worker, controls[index], results, os.getpid()),
                    name=f"soak-worker-{index}",
                    daemon=True,
                )
                process.start()
                processes.append(process)

            def alive() -> bool:
                return not soak.crashes and all(p.is_alive() for p in processes)

            if not await _until(lambda: len(soak.ready) == config.processes, 60.0, alive):
                raise RuntimeError(f"workers not ready within 60 s: {_crash_text(soak, processes)}")
            for control in controls:
                control.put(("go",))
            soak.started = time.monotonic()
            until = soak.started + config.duration
            print(
                f"go: {config.processes} processes x {config.coroutines} coroutines on "
                f"{config.names} names, ttl {config.ttl:g} s, {config.duration:g} s "
                f"(faults after {config.calm:g} s)",
                flush=True,
            )
            try:
                await _fault_loop(soak, rng, until, admin)
                await asyncio.sleep(max(0.0, until - time.monotonic()))
            finally:
                _heal(soak)
            ended = time.monotonic()
            _print_progress(soak, "stop: every fault healed, coroutines finishing")
            for control in controls:
                control.put(("stop",))
            await _until(
                lambda: len(soak.reports) + len(soak.crashes) == config.processes,
                config.drain + 30.0,
                lambda: all(p.is_alive() for p in processes),
            )
            final = await _final_state(soak, resource, admin, names)
            for control in controls:
                control.put(("exit",))
            await asyncio.to_thread(_stop_processes, processes, 10.0)
            for index, finished in enumerate(processes):
                if index not in soak.reports and index not in soak.crashes:
                    soak.crashes[index] = f"no report (exit code {finished.exitcode})"
            return {
                "names": names,
                "elapsed": ended - soak.started,
                "faults": soak.faults,
                "reports": soak.reports,
                "crashes": soak.crashes,
                "exit_codes": [p.exitcode for p in processes],
                **final,
            }
    finally:
        if reader is not None:
            reader.cancel()
        # Reached with workers alive only on an error or Ctrl-C: no need to wait for them.
        _stop_processes(processes, 0.0)
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        if proxy is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proxy.aclose(), 10.0)
        lock_server.stop()
        resource_server.stop()


def _retry() -> Retry:
    """Five retries with backoff (``from_url`` clients of redis-py 8 do not retry by default)."""
    return Retry(ExponentialBackoff(cap=0.5, base=0.05), 5)


def _crash_text(soak: Soak, processes: Sequence[multiprocessing.process.BaseProcess]) -> str:
    if soak.crashes:
        worker, text = next(iter(soak.crashes.items()))
        return f"worker {worker} crashed:\n{text}"
    codes = [p.exitcode for p in processes]
    return f"exit codes {codes}"


# -- summary ---------------------------------------------------------------------------


def _sum_dicts(dicts: Sequence[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in dicts:
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
    return total


def _explainer(faults: Sequence[Fault], slack: float) -> Callable[[float], str | None]:
    """Return a function: a time -> the kinds of the faults whose windows cover it, or None.

    A window runs from a fault's start to ``slack`` seconds after its end;
    several kinds are joined with ``+`` (e.g. ``kill+loop_block``).
    """
    windows = sorted((f.start - 0.05, f.end + slack, f.kind) for f in faults)

    def explain(t: float) -> str | None:
        kinds = sorted({kind for start, end, kind in windows if start <= t <= end})
        return "+".join(kinds) or None

    return explain


def summarize(config: Config, raw: dict[str, Any]) -> dict[str, Any]:
    """Turn the raw results into the summary written to JSON.

    Args:
        config: the run's configuration.
        raw: what :func:`_soak` returned.

    Returns:
        The summary (JSON-ready).
    """
    reports: list[dict[str, Any]] = [raw["reports"][k] for k in sorted(raw["reports"])]
    faults: list[Fault] = raw["faults"]
    # A loop block's window is the worker's own record of it, when it has one.
    blocks = [tuple(b) for r in reports for b in r["blocks"]]
    for fault in faults:
        if fault.kind == "loop_block" and blocks:
            nearest = min(blocks, key=lambda b: abs(b[0] - fault.start))
            if abs(nearest[0] - fault.start) < config.fault_length * config.ttl + 5:
                fault.end = max(fault.end, nearest[1])
    explain = _explainer(faults, config.slack)
    restarts = sorted(f.start for f in faults if f.kind == "kill")

    def after_restart(t: float) -> bool:
        return bool(restarts) and restarts[0] <= t

    acquisitions = sum(r["acquisitions"] for r in reports)
    elapsed: float = raw["elapsed"]
    names: Sequence[str] = raw["names"]
    unfenced_acked = _sum_dicts([r["unfenced_acked"] for r in reports])
    fenced_acked = _sum_dicts([r["fenced_acked"] for r in reports])

    def lost(acked: dict[str, int], final: dict[str, int]) -> tuple[int, int]:
        missing = sum(max(0, acked.get(n, 0) - final.get(n, 0)) for n in names)
        extra = sum(max(0, final.get(n, 0) - acked.get(n, 0)) for n in names)
        return missing, extra

    unfenced_lost, unfenced_extra = lost(unfenced_acked, raw["unfenced"])
    fenced_lost, fenced_extra = lost(fenced_acked, raw["fenced"])

    overlap_records = [rec for r in reports for rec in r["overlap_records"]]
    overlaps = sum(r["overlaps"] for r in reports)
    overlap_by = _count(explain(rec["t"]) for rec in overlap_records)
    loss_times = [t for r in reports for t in r["loss_times"]]
    error_times = [(t, key) for r in reports for t, key in r["error_times"]]
    rejection_times = [(t, why) for r in reports for t, why in r["rejection_times"]]
    rejections = _sum_dicts([r["fenced_rejected"] for r in reports])

    def outside(times: Sequence[float]) -> int:
        return sum(1 for t in times if explain(t) is None)

    rejected_outside = sum(
        1 for t, _ in rejection_times if explain(t) is None and not after_restart(t)
    )
    errors = _sum_dicts([r["errors"] for r in reports])
    examples: dict[str, str] = {}
    for r in reports:
        for key, text in r["error_examples"].items():
            examples.setdefault(key, text)
    crashes = dict(raw["crashes"])
    coroutine_crashes = [c for r in reports for c in r["crashed"]]
    fault_kinds = dict.fromkeys(FAULT_KINDS, 0)
    fault_seconds = dict.fromkeys(FAULT_KINDS, 0.0)
    for fault in faults:
        fault_kinds[fault.kind] += 1
        fault_seconds[fault.kind] += fault.end - fault.start
    t0 = min((r["started"] for r in reports), default=0.0)
    covered = 0.0
    reach = t0
    for start, end in sorted((f.start - 0.05, f.end + config.slack) for f in faults):
        start, end = max(start, reach), min(end, t0 + elapsed)
        if end > start:
            covered += end - start
            reach = end
    overlapped = {mark for r in reports for mark in r["overlapped"]}
    # The invariant that matters: in every overlap, aiolock told at least one of
    # the two holders that it had lost the lock. Only lost data (a restart) can
    # hide a double holding from both.
    lost_holders = {holder for r in reports for holder in r["lost_holders"]}

    def told(record: dict[str, Any]) -> bool:
        ids = (record["holder"], record["inside"])
        return any(mark.split("/")[0] in lost_holders for mark in ids)

    untold = [rec for rec in overlap_records if not told(rec)]
    summary: dict[str, Any] = {
        "elapsed_s": elapsed,
        "acquisitions": acquisitions,
        "acq_per_s": acquisitions / elapsed if elapsed > 0 else 0.0,
        "acquire_timeouts": sum(r["acquire_timeouts"] for r in reports),
        "faults": fault_kinds,
        "fault_seconds": fault_seconds,
        "fault_log": [
            {
                "kind": f.kind,
                "at_s": f.start - t0,
                "lasted_s": f.end - f.start,
                "detail": f.detail,
                "connections": f.connections,
            }
            for f in faults
        ],
        "overlaps": overlaps,
        "overlapped_holders": len(overlapped),
        "overlaps_by_fault": overlap_by,
        "overlaps_untold": len(untold),
        "overlaps_untold_by_fault": _count(explain(rec["t"]) for rec in untold),
        "overlap_records": [
            {**rec, "at_s": rec["t"] - t0, "fault": explain(rec["t"]), "told": told(rec)}
            for rec in (overlap_records[:100] + untold[:100])
        ],
        "losses_declared": sum(r["on_lost"] for r in reports),
        "lock_lost_errors": sum(r["lost_errors"] for r in reports),
        "loss_reasons": _sum_dicts([r["loss_reasons"] for r in reports]),
        "renewal_failures": _sum_dicts([r["renewal_failures"] for r in reports]),
        "notify_interruptions": sum(r["notify_interruptions"] for r in reports),
        "errors": errors,
        "error_examples": examples,
        "errors_without_message": _sum_dicts([r["no_message"] for r in reports]),
        "unexpected_exceptions": _sum_dicts([r["unexpected"] for r in reports]),
        "unexpected_tracebacks": [t for r in reports for t in r["unexpected_tracebacks"]][:5],
        "lost_updates": {"unfenced": unfenced_lost, "fenced": fenced_lost},
        "extra_updates": {"unfenced": unfenced_extra, "fenced": fenced_extra},
        "acknowledged": {
            "unfenced": sum(unfenced_acked.values()),
            "fenced": sum(fenced_acked.values()),
        },
        "fenced_rejections": {
            "stale": rejections.get("stale", 0),
            "reused": rejections.get("reused", 0),
            "after_a_restart": sum(1 for t, _ in rejection_times if after_restart(t)),
        },
        "fault_free_s": elapsed - covered,
        "outside_fault_windows": {
            "overlaps": sum(1 for rec in overlap_records if explain(rec["t"]) is None),
            "losses": outside(loss_times),
            "errors": outside([t for t, _ in error_times]),
            "fenced_rejections_before_any_restart": rejected_outside,
        },
        "hung_coroutines": sum(r["hung"] for r in reports),
        "coroutine_crashes": coroutine_crashes[:5],
        "worker_crashes": crashes,
        "leaked_tasks": {str(r["worker"]): r["leaked_tasks"] for r in reports if r["leaked_tasks"]},
        "locks_held_at_end": sum(r["held_at_end"] for r in reports),
        "connections_in_use_at_end": sum(sum(r["connections_in_use"]) for r in reports),
        "lock_keys_left": raw["lock_keys_left"],
        "exit_codes": raw["exit_codes"],
    }
    failures: list[str] = []
    if fenced_lost:
        failures.append(f"{fenced_lost} fenced updates lost")
    if crashes:
        failures.append(f"{len(crashes)} worker processes crashed")
    if coroutine_crashes:
        failures.append(f"{len(coroutine_crashes)} coroutines crashed")
    summary["failures"] = failures
    summary["passed"] = not failures
    return summary


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        key = str(item) if item is not None else "none (outside any fault window)"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _by(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _connections(log: Sequence[dict[str, Any]]) -> str:
    counts = [int(entry["connections"]) for entry in log]
    return f"{counts[0]} / {max(counts)} / {counts[-1]}" if counts else "-"


def _warnings(summary: dict[str, Any]) -> list[str]:
    """Anomalies that do not fail the run but may be defects."""
    found: list[str] = []
    outside = summary["outside_fault_windows"]
    if outside["overlaps"]:
        found.append(f"{outside['overlaps']} overlaps outside any fault window")
    hidden = {
        k: v for k, v in summary["overlaps_untold_by_fault"].items() if "kill" not in k.split("+")
    }
    if hidden:
        found.append(
            f"overlaps that neither holder was told of, with no restart to explain them: {hidden}"
        )
    if outside["fenced_rejections_before_any_restart"]:
        found.append(
            f"{outside['fenced_rejections_before_any_restart']} fenced rejections outside any "
            "fault window and before any restart (a fence that did not increase?)"
        )
    if summary["unexpected_exceptions"]:
        found.append(
            f"exceptions neither redis-py's nor aiolock's: {summary['unexpected_exceptions']}"
        )
    if summary["errors_without_message"]:
        found.append(f"errors without a message: {summary['errors_without_message']}")
    if summary["hung_coroutines"]:
        found.append(f"{summary['hung_coroutines']} coroutines did not finish within the drain")
    if summary["leaked_tasks"]:
        found.append(f"tasks left running after the coroutines ended: {summary['leaked_tasks']}")
    if summary["locks_held_at_end"]:
        found.append(f"{summary['locks_held_at_end']} locks still held after the coroutines ended")
    if summary["connections_in_use_at_end"]:
        found.append(f"{summary['connections_in_use_at_end']} connections left checked out")
    if summary["lock_keys_left"]:
        found.append(f"lock keys left a lease after the end: {summary['lock_keys_left'][:5]}")
    return found


def _print_summary(config: Config, summary: dict[str, Any]) -> None:
    faults = summary["faults"]
    outside = summary["outside_fault_windows"]
    lost = summary["lost_updates"]
    rejected = summary["fenced_rejections"]
    overlap_by = _by(summary["overlaps_by_fault"])
    untold = f"{summary['overlaps_untold']:,}"
    if summary["overlaps_untold"]:
        untold += f" ({_by(summary['overlaps_untold_by_fault'])})"
    rows: list[tuple[str, object]] = [
        (
            "load",
            f"{config.processes} processes x {config.coroutines} coroutines, "
            f"{config.names} names, ttl {config.ttl:g} s",
        ),
        ("duration", f"{summary['elapsed_s']:.1f} s"),
        ("acquisitions", f"{summary['acquisitions']:,}"),
        ("acquisitions/s", f"{summary['acq_per_s']:,.0f}"),
        ("acquire timeouts", f"{summary['acquire_timeouts']:,}"),
        ("faults injected", f"{sum(faults.values())}"),
        *((f"  {kind}", f"{faults[kind]}  ({FAULT_HELP[kind]})") for kind in FAULT_KINDS),
        (
            "overlaps (two holders inside)",
            f"{summary['overlaps']:,} entries found another inside "
            f"({summary['overlapped_holders']:,} holders overlapped)",
        ),
        ("  found within the window of", overlap_by or "-"),
        ("  neither holder told of a loss", untold),
        ("losses declared (on_lost)", f"{summary['losses_declared']:,}"),
        ("LockLostError raised", f"{summary['lock_lost_errors']:,}"),
        ("errors", f"{sum(summary['errors'].values()):,}"),
        (
            "lost updates, unfenced",
            f"{lost['unfenced']:,} of {summary['acknowledged']['unfenced']:,}",
        ),
        ("lost updates, fenced", f"{lost['fenced']:,} of {summary['acknowledged']['fenced']:,}"),
        (
            "fenced rejections",
            f"{rejected['stale']:,} stale, {rejected['reused']:,} reused fence "
            f"({rejected['after_a_restart']:,} after a restart)",
        ),
        (
            f"outside fault windows ({summary['fault_free_s']:.0f} s)",
            f"overlaps {outside['overlaps']}, losses {outside['losses']}, "
            f"errors {outside['errors']}, "
            f"fenced rejections {outside['fenced_rejections_before_any_restart']}",
        ),
        (
            "hung coroutines / leaked tasks",
            f"{summary['hung_coroutines']} / {len(summary['leaked_tasks'])}",
        ),
        ("proxied connections (first / max / last fault)", _connections(summary["fault_log"])),
        ("worker crashes", f"{len(summary['worker_crashes'])}"),
    ]
    print_table("soak summary", ["", "value"], rows)
    if summary["errors"]:
        print_table(
            "errors by phase and type",
            ["phase: type", "count", "first message"],
            [
                (key, f"{count:,}", summary["error_examples"].get(key, "")[:90])
                for key, count in sorted(summary["errors"].items(), key=lambda kv: -kv[1])
            ],
        )
    reasons = summary["loss_reasons"]
    if reasons:
        print_table(
            "losses by aiolock's reason",
            ["reason", "count"],
            [(k, f"{v:,}") for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])],
        )
    print(
        "note: a restart with empty data starts the fencing counters over; fenced writes are "
        "then rejected as stale until the new fences pass the highest the resource has seen "
        "(counted as rejections, not lost updates)."
    )


# -- main ------------------------------------------------------------------------------


def _gap(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    try:
        first, second = float(low), float(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {text!r}") from None
    if not 0 < first <= second:
        raise argparse.ArgumentTypeError(f"expected 0 < MIN <= MAX, got {text!r}")
    return first, second


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    duration = (
        args.duration if args.duration is not None else (QUICK_DURATION if args.quick else 300.0)
    )
    if not 1 <= duration <= MAX_DURATION:
        parser.error(f"--duration must be in 1..{MAX_DURATION:g} seconds, got {duration:g}")
    ttl = args.ttl if args.ttl is not None else (0.5 if args.quick else 1.0)
    if ttl <= 0:
        parser.error(f"--ttl must be > 0, got {ttl:g}")
    gap = args.fault_gap or ((0.3, 0.8) if args.quick else (2.0, 5.0))
    if not 0 <= args.long_hold <= 1:
        parser.error(f"--long-hold must be a probability in 0..1, got {args.long_hold:g}")
    if args.fault_length <= 0:
        parser.error(f"--fault-length must be > 0 leases, got {args.fault_length:g}")
    for option, value in (
        ("--processes", args.processes),
        ("--coroutines", args.coroutines),
        ("--names", args.names),
    ):
        if value < 1:
            parser.error(f"{option} must be >= 1, got {value}")
    return Config(
        duration=duration,
        calm=min(max(2.0, duration / 10), duration / 2) if not args.quick else 1.0,
        processes=args.processes,
        coroutines=args.coroutines,
        names=args.names,
        ttl=ttl,
        acquire_timeout=args.acquire_timeout if args.acquire_timeout is not None else 2 * ttl,
        socket_timeout=args.socket_timeout if args.socket_timeout is not None else 2 * ttl,
        fault_gap=gap,
        fault_length=args.fault_length,
        long_hold=args.long_hold,
        draw=args.draw if args.draw is not None else secrets.randbelow(2**31),
        loop=args.loop,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        1 if fenced updates were lost or a worker or coroutine crashed, else 0.
    """
    parser = BENCHMARK.parser()
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds of load (default 300, {QUICK_DURATION:g} with --quick; at most 600)",
    )
    parser.add_argument("--processes", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument(
        "--coroutines", type=int, default=100, help="coroutines per process (default 100)"
    )
    parser.add_argument("--names", type=int, default=20, help="lock names (default 20)")
    parser.add_argument(
        "--ttl", type=float, default=None, help="the lease in seconds (default 1, 0.5 with --quick)"
    )
    parser.add_argument(
        "--acquire-timeout", type=float, default=None, help="bound of one acquisition (2 ttl)"
    )
    parser.add_argument(
        "--socket-timeout", type=float, default=None, help="lock client socket timeout (2 ttl)"
    )
    parser.add_argument(
        "--fault-gap",
        type=_gap,
        default=None,
        metavar="MIN,MAX",
        help="seconds between faults (default 2,5; 0.3,0.8 with --quick)",
    )
    parser.add_argument(
        "--fault-length",
        type=float,
        default=1.5,
        help="how long a timed fault lasts, in leases (default 1.5)",
    )
    parser.add_argument(
        "--long-hold",
        type=float,
        default=0.01,
        help="probability that a holding pauses for much of its lease (default 0.01)",
    )
    parser.add_argument(
        "--draw", type=int, default=None, help="the number every random choice is drawn from"
    )
    args = parser.parse_args(argv)
    config = _config(args, parser)
    session = BENCHMARK.session(args, argv)
    if args.draw is None:
        session.argv += ["--draw", str(config.draw)]
    print(
        f"soak (loop={config.loop}{', quick' if args.quick else ''}, draw {config.draw}): "
        f"lock server behind a fault proxy, resource server unfaulted",
        flush=True,
    )
    try:
        raw = session.run(lambda: _soak(config))
    except TimeoutError:
        print(f"ERROR: the soak did not finish within {config.bound:.0f} s", file=sys.stderr)
        return 1
    summary = summarize(config, raw)
    _print_summary(config, summary)
    session.write_json(
        {
            **session.header(),
            "config": {
                **{k: v for k, v in vars(config).items() if k != "fault_gap"},
                "fault_gap": list(config.fault_gap),
            },
            **summary,
        }
    )
    for line in _warnings(summary):
        print(f"WARN  {line}")
    code = session.finish(
        broken="; ".join(summary["failures"]),
        passed="PASS: no fenced update lost, no worker or coroutine crashed",
    )
    if code:
        for text in list(summary["worker_crashes"].values())[:2] + summary["coroutine_crashes"][:2]:
            print(text[-3000:], file=sys.stderr)
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: workers, proxy and servers stopped", file=sys.stderr)
        sys.exit(130)
