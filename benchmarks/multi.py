"""Several names at once: a MultiLock of N names against N AsyncLocks taken in sequence.

For N = 1, 3 and 10 names, one coroutine acquires and releases, over and
over (2000 cycles a subject and setting; ``--quick``: 200), uncontended:

* ``multilock N``: ``aiolock.MultiLock(client, names)``: one script takes
  every name, one gives them all back (one server here: one hash slot group);
* ``asynclocks N``: ``aiolock.AsyncLock`` on each of the same names,
  acquired one after the other in sorted order, released in reverse (what
  code without a MultiLock writes, deadlock-prone in any other order).

The baseline is the round trip of a ``PING`` on the same client, measured
in the same run, before each setting. Reported per acquire + release cycle:
p50 and p99 in ms and in PING round trips, commands the client sent (round
trips), commands the server ran (those inside scripts included), and the
ratio of the MultiLock's p50 to the AsyncLocks'. The subjects take turns,
round by round (2 rounds, 1 with ``--quick``). After every round no key of
the names may be left (the run exits 1 if one is). Target: for 3 names and
more, the MultiLock's p50 cycle below the AsyncLocks' (the run exits 3 if
missed; the ``--quick`` sizes judge none).

Run ``python -m benchmarks.multi`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from redis.asyncio import Redis

from aiolock import AsyncLock, MultiLock

from ._measure import CountingConnection, embedded_server, percentiles, server_commands
from ._runner import Benchmark, Session, print_table

BENCHMARK: Final = Benchmark("multi", __doc__.split("\n")[0])

#: The numbers of names.
SIZES: Final = (1, 3, 10)
#: Acquire + release cycles per subject, setting and round.
CYCLES: Final = 2000
CYCLES_QUICK: Final = 200
#: Rounds in which the subjects take turns.
ROUNDS: Final = 2
ROUNDS_QUICK: Final = 1
#: PINGs that measure the round trip before each setting.
PINGS: Final = 500
PINGS_QUICK: Final = 100
#: The subjects, in the order they take turns.
SUBJECTS: Final = ("multilock", "asynclocks")


@dataclass
class Row:
    """The figures of one subject with so many names."""

    subject: str
    names: int
    cycles: int
    cycle_ms: dict[int, float]
    p50_rtt: float
    ping_ms: float
    client_cmds_per_cycle: float
    server_cmds_per_cycle: float
    keys_left: int


async def _ping_rtt(client: Redis, count: int) -> float:
    """The median round trip of ``count`` sequential PINGs (seconds)."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await client.ping()
        samples.append(time.perf_counter() - started)
    return percentiles(samples, (50,))[50]


async def _cycles(subject: str, client: Redis, names: Sequence[str], cycles: int) -> list[float]:
    """Time ``cycles`` acquire + release cycles of ``subject`` over ``names`` (seconds each)."""
    samples: list[float] = []
    if subject == "multilock":
        multi = MultiLock(client, names, ttl=10.0)
        for _ in range(cycles):
            started = time.perf_counter()
            await multi.acquire()
            await multi.release()
            samples.append(time.perf_counter() - started)
        return samples
    locks = [AsyncLock(client, name, ttl=10.0) for name in sorted(names)]
    for _ in range(cycles):
        started = time.perf_counter()
        for lock in locks:
            await lock.acquire()
        for lock in reversed(locks):
            await lock.release()
        samples.append(time.perf_counter() - started)
    return samples


async def _main(quick: bool) -> list[Row]:
    cycles = CYCLES_QUICK if quick else CYCLES
    rounds = ROUNDS_QUICK if quick else ROUNDS
    pings = PINGS_QUICK if quick else PINGS
    samples: dict[tuple[str, int], list[float]] = {}
    sent: dict[tuple[str, int], int] = {}
    ran: dict[tuple[str, int], int] = {}
    left: dict[tuple[str, int], int] = {}
    rtts: dict[int, list[float]] = {}
    with embedded_server() as server:
        admin = Redis.from_url(server.url, decode_responses=True)
        client = Redis.from_url(server.url, connection_class=CountingConnection)
        try:
            for subject in SUBJECTS:  # warm: scripts loaded, connections made
                await _cycles(subject, client, ["bench:multi:warm"], 10)
            for _ in range(rounds):
                for size in SIZES:
                    names = [f"bench:multi:{size}:{i}" for i in range(size)]
                    rtts.setdefault(size, []).append(await _ping_rtt(client, pings))
                    for subject in SUBJECTS:
                        key = (subject, size)
                        before = await server_commands(admin)
                        CountingConnection.reset()
                        samples.setdefault(key, []).extend(
                            await _cycles(subject, client, names, cycles)
                        )
                        sent[key] = sent.get(key, 0) + CountingConnection.sent
                        # (The INFO of the first count is counted in the second.)
                        ran[key] = ran.get(key, 0) + await server_commands(admin) - before - 1
                        found = await admin.keys("bench:multi:*")
                        left[key] = left.get(key, 0) + len(
                            [k for k in map(str, found) if not k.endswith(":fence")]
                        )
        finally:
            await client.aclose()
            await admin.aclose()
    rows = []
    for size in SIZES:
        rtt = sorted(rtts[size])[len(rtts[size]) // 2]
        for subject in SUBJECTS:
            key = (subject, size)
            count = len(samples[key])
            quantiles = percentiles(samples[key], (50, 99, 100))
            rows.append(
                Row(
                    subject=subject,
                    names=size,
                    cycles=count,
                    cycle_ms={k: v * 1000 for k, v in quantiles.items()},
                    p50_rtt=quantiles[50] / rtt if rtt else math.nan,
                    ping_ms=rtt * 1000,
                    client_cmds_per_cycle=sent[key] / count,
                    server_cmds_per_cycle=ran[key] / count,
                    keys_left=left[key],
                )
            )
    return rows


def _ratio(rows: Sequence[Row], size: int) -> float:
    """The MultiLock's p50 cycle over the AsyncLocks' for ``size`` names."""
    mine = {r.subject: r.cycle_ms[50] for r in rows if r.names == size}
    return mine["multilock"] / mine["asynclocks"]


def _chart(session: Session, rows: Sequence[Row]) -> None:
    with session.chart(figsize=(8, 4.5)) as (_, ax):
        width = 0.38
        for index, subject in enumerate(SUBJECTS):
            mine = [r for r in rows if r.subject == subject]
            xs = [SIZES.index(r.names) + (index - 0.5) * width for r in mine]
            ax.bar(xs, [r.cycle_ms[50] for r in mine], width, label=f"{subject} (p50)")
            ax.scatter(xs, [r.cycle_ms[99] for r in mine], marker="v", color="black", s=14)
        ax.set_xticks(range(len(SIZES)), [f"{n} name{'s' if n > 1 else ''}" for n in SIZES])
        ax.set_ylabel("acquire + release, ms; bar p50, triangle p99")
        ax.set_title("MultiLock against AsyncLocks in sequence (embedded Valkey, loopback)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        1 if a key was left behind, else 3 if a target was missed, else 0.
    """
    args = BENCHMARK.parser().parse_args(argv)
    session = BENCHMARK.session(args, argv)
    session.banner("MultiLock benchmark")
    rows = session.run(lambda: _main(args.quick))
    print_table(
        "One coroutine, uncontended: acquire + release of N names",
        [
            "subject",
            "names",
            "cycles",
            "p50 ms",
            "p99 ms",
            "max ms",
            "p50 / RTT",
            "client cmd/cycle",
            "server cmd/cycle",
            "keys left",
        ],
        [
            [
                r.subject,
                r.names,
                r.cycles,
                f"{r.cycle_ms[50]:.3f}",
                f"{r.cycle_ms[99]:.3f}",
                f"{r.cycle_ms[100]:.2f}",
                f"{r.p50_rtt:.1f}x",
                f"{r.client_cmds_per_cycle:.1f}",
                f"{r.server_cmds_per_cycle:.1f}",
                r.keys_left,
            ]
            for r in rows
        ],
    )
    targets: list[dict[str, Any]] = []
    for size in SIZES:
        ratio = _ratio(rows, size)
        if size == 1:
            print(f"info  1 name: MultiLock p50 / AsyncLock p50 = {ratio:.2f}x")
            continue
        passed = ratio < 1.0
        targets.append({"name": f"{size} names", "passed": passed, "ratio": ratio})
        session.judge(
            passed,
            f"{size} names: MultiLock p50 / {size} AsyncLocks in sequence p50 = {ratio:.2f}x "
            "(target below 1)",
        )
    left = sum(r.keys_left for r in rows)
    _chart(session, rows)
    session.write_json(
        {**session.header(), "rows": [asdict(r) for r in rows], "targets": targets, "left": left}
    )
    return session.finish(broken=f"{left} keys left behind" if left else "")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
