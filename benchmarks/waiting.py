"""What waiting costs the server: 1,000 clients queued on one lock.

One holder takes a lock and keeps it; ``--processes`` worker processes make
``--clients`` client objects between them, each waiting for the lock with a
default ``AsyncLock`` (so each is one waiter in the queue on the server, as
1,000 processes would be). Once every one of them is queued, for
``--window`` seconds nothing happens but waiting, and the server counts what
the waiters send (``INFO commandstats``, commands inside scripts included):
that is the cost of waiting, in commands per second (the issue's bound:
at most one per waiting client per second). The server's memory is read
before the waiters came and once they are all queued (that includes each
client's own connection), and what the queue's keys take is added up with
``MEMORY USAGE``.

Then the holder releases, and the lock passes through all the waiters,
each holding it about a millisecond: the hand-offs per second, and the
lock's server commands per hand-off while the rest still wait (connection
handshakes not counted: a heir whose last refresh is older than a third of
its first lease renews at once, beside its body, and its pool opens a
second connection for it). Every holding is checked against a witness counter
on the server (it must read 1 inside every holding).

Run ``python -m benchmarks.waiting`` (``--quick``: 100 clients, a 3 s window).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis

from aiolock._keys import keys_for

from ._measure import embedded_server, server_commands
from ._runner import Benchmark, print_table
from ._subjects import AIOLOCK

BENCHMARK: Final = Benchmark("waiting", __doc__.split("\n\n")[0])
ROOT: Final = Path(__file__).resolve().parent.parent
#: The issue's bound: commands per second per waiting client.
TARGET_PER_CLIENT: Final = 1.0
#: The issue's bound on a hand-off between clients (server commands).
TARGET_HANDOFF: Final = 12.0

#: A worker process: its clients each wait for the lock (the registry's ``AIOLOCK``).
WORKER = """
import asyncio, sys, time
import redis.asyncio as redis
from benchmarks._subjects import AIOLOCK
async def main(url, name, count):
    clients = [redis.Redis.from_url(url) for _ in range(int(count))]
    overlaps = 0
    async def wait_then_hold(client):
        nonlocal overlaps
        async with AIOLOCK.make(client, name):
            if await client.incr(name + ":inside") != 1:
                overlaps += 1
            await asyncio.sleep(0.001)
            await client.decr(name + ":inside")
    print("ready", flush=True)
    await asyncio.gather(*(wait_then_hold(c) for c in clients))
    for c in clients:
        await c.aclose()
    print("overlaps", overlaps, flush=True)
asyncio.run(main(*sys.argv[1:]))
"""


#: Not the lock's commands: a connection's set-up (redis-py's handshake on every new
#: connection: the pools open a second one when a renewal runs beside the body), the
#: holdings' witness, and this benchmark's own questions.
_NOT_THE_LOCKS: Final = ("hello", "client|", "incrby", "decrby", "info", "memory|", "scan", "llen")


async def _lock_commands(admin: Redis) -> int:
    """The server's command count so far, less :data:`_NOT_THE_LOCKS` (scripts' included)."""
    stats: dict[str, Any] = await admin.info("commandstats")
    return sum(
        int(value["calls"])
        for key, value in stats.items()
        if not key.removeprefix("cmdstat_").startswith(_NOT_THE_LOCKS)
    )


async def _sets(admin: Redis) -> int:
    """How many ``SET`` commands the server has run (scripts' included)."""
    stats: dict[str, Any] = await admin.info("commandstats")
    return int(stats.get("cmdstat_set", {}).get("calls", 0))


async def _memory(admin: Redis) -> int:
    info: dict[str, Any] = await admin.info("memory")
    return int(info["used_memory"])


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    name = "bench:waiting"
    keys = keys_for(name)
    per = [
        args.clients // args.processes + (i < args.clients % args.processes)
        for i in range(args.processes)
    ]
    with embedded_server() as server:
        admin = Redis.from_url(server.url)
        holder_client = Redis.from_url(server.url)
        workers: list[asyncio.subprocess.Process] = []
        try:
            holder = AIOLOCK.make(holder_client, name)
            assert await holder.acquire()
            await asyncio.sleep(0.2)
            memory_before = await _memory(admin)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            workers += [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    WORKER,
                    server.url,
                    name,
                    str(count),
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                )
                for count in per
            ]
            started = time.monotonic()
            while await admin.llen(keys.queue) < args.clients:
                if time.monotonic() - started > 120:
                    raise RuntimeError("the waiters did not all queue within 120 s")
                await asyncio.sleep(0.1)
            queued_in = time.monotonic() - started
            # A queued waiter may attempt once more when its process's channel is
            # confirmed (a slow machine lags): every attempt writes with SET, and
            # waiting never does. Settled: a whole second without one.
            sets = await _sets(admin)
            while True:
                await asyncio.sleep(1.0)
                sets, last = await _sets(admin), sets
                if sets == last:
                    break
                if time.monotonic() - started > 120:
                    raise RuntimeError("the waiters did not settle within 120 s")
            memory_queued = await _memory(admin)
            before = await server_commands(admin)
            await asyncio.sleep(args.window)
            waiting_commands = await server_commands(admin) - before - 1
            per_second = waiting_commands / args.window
            # What the queue itself takes: the list and every entry (not the connections).
            key_bytes = int(await admin.memory_usage(keys.queue) or 0)
            async for entry in admin.scan_iter(match=f"{keys.queue}:*", count=1000):
                key_bytes += int(await admin.memory_usage(entry) or 0)
            # The drain: the lock passes through every waiter.
            before = await _lock_commands(admin)
            released = time.monotonic()
            await holder.release()
            overlaps = 0
            for worker in workers:
                assert worker.stdout is not None
                output = (await asyncio.wait_for(worker.stdout.read(), 300)).decode()
                await worker.wait()
                for line in output.splitlines():
                    if line.startswith("overlaps"):
                        overlaps += int(line.split()[1])
            drained = time.monotonic() - released
            drain_commands = await _lock_commands(admin) - before
            left = await admin.keys(f"*{{{name}}}*")
        finally:
            for worker in workers:
                if worker.returncode is None:
                    worker.kill()
                    await worker.wait()
            await admin.delete(f"{name}:inside")
            await admin.aclose()
            await holder_client.aclose()
    return {
        "clients": args.clients,
        "processes": args.processes,
        "window_s": args.window,
        "queued_in_s": queued_in,
        "waiting_commands_per_s": per_second,
        "waiting_commands_per_s_per_client": per_second / args.clients,
        "memory_before_bytes": memory_before,
        "memory_queued_bytes": memory_queued,
        "memory_per_waiter_bytes": (memory_queued - memory_before) / args.clients,
        "queue_bytes_per_waiter": key_bytes / args.clients,
        "drain_s": drained,
        "handoffs_per_s": args.clients / drained,
        "commands_per_handoff": drain_commands / args.clients,
        "overlaps": overlaps,
        "keys_left": [str(k) for k in left],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the waiting benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        1 on an overlap or a key left, 3 (``EXIT_MISSED``) if a target was missed
        (not judged with ``--quick``), else 0.
    """
    parser = BENCHMARK.parser()
    parser.add_argument("--clients", type=int, default=None, help="waiting clients (1000)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (4)")
    parser.add_argument("--window", type=float, default=None, help="seconds of waiting (10)")
    args = parser.parse_args(argv)
    args.clients = args.clients or (100 if args.quick else 1000)
    args.window = args.window or (3.0 if args.quick else 10.0)
    if args.clients < args.processes or args.processes < 1:
        parser.error("want at least one client per process")
    session = BENCHMARK.session(args, argv)
    print(f"waiting benchmark: {args.clients} clients in {args.processes} processes")
    result = session.run(lambda: _main(args))
    per_client = result["waiting_commands_per_s_per_client"]
    handoff = result["commands_per_handoff"]
    print_table(
        f"Waiting: {args.clients} clients queued on one lock, {args.window:g} s",
        ["figure", "value"],
        [
            ["queued in", f"{result['queued_in_s']:.2f} s"],
            ["server commands per second while waiting", f"{result['waiting_commands_per_s']:.0f}"],
            ["  per waiting client", f"{per_client:.3f}"],
            [
                "server memory per waiter: the queue",
                f"{result['queue_bytes_per_waiter']:.0f} bytes",
            ],
            [
                "  with its client's connection",
                f"{result['memory_per_waiter_bytes']:.0f} bytes",
            ],
            ["drain: hand-offs per second", f"{result['handoffs_per_s']:.0f}"],
            ["drain: server commands per hand-off", f"{handoff:.1f}"],
            ["overlaps", result["overlaps"]],
            ["keys left", len(result["keys_left"])],
        ],
    )
    session.judge(
        per_client <= TARGET_PER_CLIENT,
        f"at most {TARGET_PER_CLIENT:g} command per second per waiting client: {per_client:.3f}",
    )
    session.judge(
        handoff <= TARGET_HANDOFF,
        f"at most {TARGET_HANDOFF:g} commands per hand-off among them: {handoff:.1f}",
    )
    session.write_json(
        {"benchmark": BENCHMARK.name, "command": session.command, "loop": session.loop, **result}
    )
    broken = result["overlaps"] or result["keys_left"]
    return session.finish(
        broken="overlapping holdings or keys left" if broken else "",
        missed="a target was missed (see the FAIL lines above)" if session.missed else "",
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
