"""Leader failover: from a SIGKILL of the leader to the standby's term.

A leader (an :class:`~aiolock.Election` candidate in a process of its own)
leads; a standby in this process campaigns and waits in the queue on the
server. The leader is killed with SIGKILL (it releases nothing: its term
ends when its lease runs out on the server), and the time until the
standby's ``lead()`` returns is the failover. It is bounded by what was
left of the dead leader's lease when it died (read with ``PTTL`` just
before the kill) plus how long the standby takes to notice: the column
"after the lease" is that overhead. Settings: ``ttl`` of 1, 5 and 10 s
(``--quick``: 1 and 5), ``--rounds`` kills each. The target: every
failover within ``ttl`` + 1 s.

Run ``python -m benchmarks.failover`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis

from aiolock import Election
from aiolock._keys import keys_for

from ._measure import embedded_server
from ._runner import Benchmark, print_table

BENCHMARK: Final = Benchmark("failover", __doc__.split("\n\n")[0])
ROOT: Final = Path(__file__).resolve().parent.parent
#: The target: a failover within the lease plus this (seconds).
TARGET_PAST_TTL: Final = 1.0

#: The leader's process: leads one term and stays in it until killed.
LEADER = """
import asyncio, sys
import redis.asyncio as redis
from aiolock import Election
async def main(url, name, ttl):
    client = redis.Redis.from_url(url)
    async with Election(client, name, ttl=float(ttl), identity="leader").lead():
        print("leading", flush=True)
        await asyncio.Event().wait()
asyncio.run(main(*sys.argv[1:]))
"""


async def _one(url: str, admin: Redis, name: str, ttl: float) -> dict[str, float]:
    """Kill a leader once; how long until the standby led, and what was left of the lease."""
    keys = keys_for(name)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    leader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LEADER, url, name, str(ttl), stdout=asyncio.subprocess.PIPE, env=env
    )
    client = Redis.from_url(url)
    standby = Election(client, name, ttl=ttl, identity="standby")
    led = asyncio.Event()
    done = asyncio.Event()

    async def campaign() -> None:
        async with standby.lead():
            led.set()
            await done.wait()

    task: asyncio.Task[None] | None = None
    try:
        assert leader.stdout is not None
        line = await asyncio.wait_for(leader.stdout.readline(), 30)
        if line.strip() != b"leading":
            raise RuntimeError(f"the leader did not lead: {line!r}")
        task = asyncio.create_task(campaign())
        queued = time.monotonic()
        while not await admin.llen(keys.queue):
            if time.monotonic() - queued > 30:
                raise RuntimeError("the standby did not queue within 30 s")
            await asyncio.sleep(0.005)
        # At a random point of a renewal period (ttl/3): the lease left at the kill varies.
        await asyncio.sleep(ttl / 3 * random.uniform(0.25, 0.75))
        left = int(await admin.pttl(keys.lock)) / 1000
        leader.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.wait_for(led.wait(), ttl + 30)
        failover = time.monotonic() - killed
        done.set()
        await task
        if await admin.exists(keys.lock):
            raise RuntimeError("the standby's term was not released")
    finally:
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if leader.returncode is None:
            leader.kill()
        await leader.wait()
        await client.aclose()
    return {"failover_s": failover, "lease_left_s": left, "after_lease_s": failover - left}


async def _main(ttls: Sequence[float], rounds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with embedded_server() as server:
        admin = Redis.from_url(server.url)
        try:
            for ttl in ttls:
                name = f"bench:failover:{ttl:g}"
                runs = [await _one(server.url, admin, name, ttl) for _ in range(rounds)]
                await admin.delete(keys_for(name).fence)
                failovers = [run["failover_s"] for run in runs]
                rows.append(
                    {
                        "ttl_s": ttl,
                        "rounds": rounds,
                        "failover_median_s": statistics.median(failovers),
                        "failover_max_s": max(failovers),
                        "lease_left_median_s": statistics.median(r["lease_left_s"] for r in runs),
                        "after_lease_max_s": max(r["after_lease_s"] for r in runs),
                        "runs": runs,
                    }
                )
        finally:
            await admin.aclose()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the failover benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        3 (``EXIT_MISSED``) if a failover took longer than ``ttl`` + 1 s (not
        judged with ``--quick``), else 0.
    """
    parser = BENCHMARK.parser()
    parser.add_argument("--rounds", type=int, default=None, help="kills per ttl (3; quick: 1)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    ttls = (1.0, 5.0) if args.quick else (1.0, 5.0, 10.0)
    session = BENCHMARK.session(args, argv)
    session.banner("failover benchmark: a SIGKILLed leader, a standby waiting")
    rows = session.run(lambda: _main(ttls, rounds))
    print_table(
        "Leader failover: SIGKILL to the standby's term",
        ["ttl", "failover (median)", "failover (max)", "lease left at the kill", "after the lease"],
        [
            [
                f"{row['ttl_s']:g} s",
                f"{row['failover_median_s']:.3f} s",
                f"{row['failover_max_s']:.3f} s",
                f"{row['lease_left_median_s']:.3f} s",
                f"{row['after_lease_max_s'] * 1000:.0f} ms",
            ]
            for row in rows
        ],
    )
    for row in rows:
        session.judge(
            row["failover_max_s"] <= row["ttl_s"] + TARGET_PAST_TTL,
            f"ttl {row['ttl_s']:g} s: every failover within ttl + {TARGET_PAST_TTL:g} s: "
            f"{row['failover_max_s']:.3f} s",
        )
    with session.chart(1, 1, figsize=(6, 3.5)) as (_, axes):
        labels = [f"ttl {row['ttl_s']:g} s" for row in rows]
        axes.bar(labels, [row["failover_max_s"] for row in rows], label="failover (max)")
        axes.scatter(
            labels, [row["ttl_s"] + TARGET_PAST_TTL for row in rows], color="red", label="target"
        )
        axes.set_ylabel("seconds from SIGKILL to the standby's term")
        axes.legend()
    session.write_json({**session.header(), "ttls": rows})
    return session.finish()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
