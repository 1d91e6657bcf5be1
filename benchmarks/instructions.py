"""Client instructions per operation, counted by callgrind: a count that load does not move.

Each workload runs in a child process under ``valgrind --tool=callgrind``
against a private server on loopback, on the chosen event loop:

* ``W1 aiolock``: one ``AsyncLock`` reused, ``acquire(timeout=5)`` then
  ``release()``, uncontended;
* ``W1 aiolock fresh``: the same with a new ``AsyncLock`` for each cycle, as
  a web handler makes one;
* ``W1 redis-py``: redis-py's ``Lock`` reused the same way
  (``blocking_timeout=5``): the baseline;
* ``hand-off aiolock``: two clients in one process, each with an
  ``AsyncLock`` on one name, taking turns with ``async with`` (one yield
  inside): every acquisition waits in the queue on the server for the
  other's release and is granted the lock;
* ``local hand-over aiolock``: ten tasks of one client, each with an
  ``AsyncLock`` on one name, taking turns with ``async with`` (one yield
  inside): a releaser hands the lock to the next task of its process (the
  path of W3 and W4, whose tasks mostly wait behind others of their
  process).

Each workload runs twice, a small and a large number of times, and the
figure is the difference of the two totals over the difference of the
numbers: the interpreter's start, the imports and the connections cancel
out. Reported: instructions per cycle (W1), per round of two hand-offs,
per acquisition (local hand-over),
and aiolock's W1 over redis-py's. The server's instructions are not
counted. No target is judged: the figures are for comparisons
(``python -m benchmarks.compare --bench instructions``), where a count,
unlike a time, is the same from one window to the next.

Needs ``valgrind`` on the PATH (the run exits 1 saying so otherwise). About
three minutes on two cores (one child at a time, the server on the other
core; more side by side on more cores), ``--quick`` about two.

Run ``python -m benchmarks.instructions`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from ._measure import embedded_server
from ._runner import Benchmark, print_table, run

BENCHMARK: Final = Benchmark("instructions", __doc__.split("\n")[0])

#: The workloads: their names, what one unit is, and the two numbers of units run
#: (full size, then ``--quick``).
WORKLOADS: Final = {
    "W1 aiolock": ("cycle", (200, 1200), (100, 400)),
    "W1 aiolock fresh": ("cycle", (200, 1200), (100, 400)),
    "W1 redis-py": ("cycle", (200, 1200), (100, 400)),
    "hand-off aiolock": ("round", (100, 600), (50, 200)),
    "local hand-over aiolock": ("acquisition", (500, 3000), (200, 800)),
}
#: The tasks taking turns in ``local hand-over aiolock``.
LOCAL_TASKS: Final = 10
#: The longest one child may take under valgrind, in seconds.
CHILD_TIMEOUT: Final = 600.0
_COLLECTED: Final = re.compile(r"Collected : (\d+)")


@dataclass
class Row:
    """One workload's count."""

    workload: str
    unit: str
    small: int
    large: int
    small_total: int
    large_total: int

    @property
    def per_unit(self) -> float:
        """Instructions per unit: the difference of the totals over that of the numbers."""
        return (self.large_total - self.small_total) / (self.large - self.small)


# -- the child: one workload, counted by callgrind from outside ------------------------------


async def _w1_aiolock(url: str, count: int) -> None:
    from redis.asyncio import Redis

    from aiolock import AsyncLock

    client = Redis.from_url(url)
    try:
        lock = AsyncLock(client, "bench:instructions:w1", ttl=10.0)
        for _ in range(count):
            await lock.acquire(timeout=5.0)
            await lock.release()
    finally:
        await client.aclose()


async def _w1_aiolock_fresh(url: str, count: int) -> None:
    from redis.asyncio import Redis

    from aiolock import AsyncLock

    client = Redis.from_url(url)
    try:
        for _ in range(count):
            lock = AsyncLock(client, "bench:instructions:w1-fresh", ttl=10.0)
            await lock.acquire(timeout=5.0)
            await lock.release()
    finally:
        await client.aclose()


async def _w1_redis_py(url: str, count: int) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        lock = client.lock("bench:instructions:w1-redis-py", timeout=10.0, blocking_timeout=5.0)
        for _ in range(count):
            await lock.acquire()
            await lock.release()
    finally:
        await client.aclose()


async def _handoff_aiolock(url: str, count: int) -> None:
    from redis.asyncio import Redis

    from aiolock import AsyncLock

    clients = [Redis.from_url(url) for _ in range(2)]
    try:
        locks = [AsyncLock(c, "bench:instructions:handoff", ttl=10.0) for c in clients]

        async def take_turns(lock: AsyncLock) -> None:
            for _ in range(count):
                async with lock:
                    await asyncio.sleep(0)

        await asyncio.gather(*(take_turns(lock) for lock in locks))
    finally:
        for client in clients:
            await client.aclose()


async def _local_handover_aiolock(url: str, count: int) -> None:
    from redis.asyncio import Redis

    from aiolock import AsyncLock

    client = Redis.from_url(url)
    try:

        async def take_turns(times: int) -> None:
            lock = AsyncLock(client, "bench:instructions:local", ttl=10.0)
            for _ in range(times):
                async with lock:
                    await asyncio.sleep(0)

        await asyncio.gather(*(take_turns(count // LOCAL_TASKS) for _ in range(LOCAL_TASKS)))
    finally:
        await client.aclose()


_CHILDREN: Final = {
    "W1 aiolock": _w1_aiolock,
    "W1 aiolock fresh": _w1_aiolock_fresh,
    "W1 redis-py": _w1_redis_py,
    "hand-off aiolock": _handoff_aiolock,
    "local hand-over aiolock": _local_handover_aiolock,
}


def _child(argv: Sequence[str]) -> int:
    """``--child WORKLOAD COUNT URL LOOP``: run one workload (under valgrind, by :func:`count`)."""
    workload, count, url, loop = argv
    child = _CHILDREN[workload]
    run(lambda: child(url, int(count)), loop)
    return 0


# -- the parent ------------------------------------------------------------------------------


def count(workload: str, number: int, url: str, loop: str) -> int:
    """The instructions a child running ``workload`` ``number`` times executed, in all.

    Raises:
        RuntimeError: the child failed, or callgrind reported no total.
    """
    flags = ["-P"] if sys.flags.safe_path else []  # (import what this process imports)
    with tempfile.TemporaryDirectory(prefix="aiolock-instructions-") as scratch:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={Path(scratch) / 'callgrind.out'}",
            sys.executable,
            *flags,
            "-m",
            BENCHMARK.module,
            "--child",
            workload,
            str(number),
            url,
            loop,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False
        )
    found = _COLLECTED.search(done.stderr)
    if done.returncode or found is None:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise RuntimeError(f"{workload} x {number} exited {done.returncode}:\n{tail}")
    return int(found.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    """Count each workload's instructions; print and write them.

    Returns:
        0, or 1 when valgrind is missing or a child failed.
    """
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--child"]:
        return _child(given[1:])
    parser = BENCHMARK.parser()
    parser.add_argument(
        "--workload",
        action="append",
        choices=tuple(WORKLOADS),
        help="count only this workload (repeatable; default: all)",
    )
    args = parser.parse_args(given)
    session = BENCHMARK.session(args, given)
    session.banner("client instructions per operation, by callgrind")
    if shutil.which("valgrind") is None:
        print("ERROR: valgrind is not on the PATH (apt install valgrind)", file=sys.stderr)
        return 1
    sizes = {
        name: quick if session.quick else full
        for name, (_, full, quick) in WORKLOADS.items()
        if not args.workload or name in args.workload
    }
    runs = [(name, number) for name, pair in sizes.items() for number in pair]
    # The children run side by side, leaving a core to the server: a count does not depend
    # on the machine's load, but waiting for a starved server adds turns of the event loop.
    with (
        embedded_server() as server,
        ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1)) as pool,
    ):
        futures = {
            run: pool.submit(count, run[0], run[1], server.url, session.loop) for run in runs
        }
        try:
            totals = {run: future.result() for run, future in futures.items()}
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
    rows = [
        Row(name, WORKLOADS[name][0], small, large, totals[name, small], totals[name, large])
        for name, (small, large) in sizes.items()
    ]
    by_name = {row.workload: row.per_unit for row in rows}
    ratios = {}
    if "W1 aiolock" in by_name and "W1 redis-py" in by_name:
        ratios["aiolock_w1_vs_redispy"] = by_name["W1 aiolock"] / by_name["W1 redis-py"]
    print_table(
        "instructions per unit (difference of two runs)",
        ["workload", "unit", "runs", "per unit"],
        [
            [row.workload, row.unit, f"{row.small} / {row.large}", f"{row.per_unit:,.0f}"]
            for row in rows
        ],
    )
    if ratios:
        print(f"W1: aiolock / redis-py Lock = {ratios['aiolock_w1_vs_redispy']:.3f}x")
    session.write_json(
        {
            **session.header(),
            "rows": [{**asdict(row), "per_unit": row.per_unit} for row in rows],
            "ratios": ratios,
        }
    )
    return session.finish()


if __name__ == "__main__":
    sys.exit(main())
