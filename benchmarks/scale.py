"""Many at once: thousands of held locks, thousands of waiters, and the server's cost per operation.

Three workloads, each on private servers on loopback:

* ``held``: one process holds N ``AsyncLock`` s (``ttl=3``) on one client
  made with ``redis.asyncio.Redis.from_url(url)`` (redis-py's default pool:
  at most 100 connections, ``MaxConnectionsError`` beyond), for
  ``--hold`` seconds, then releases them all at once (one ``gather``, as a
  service that shuts down). Reported: holdings declared lost, releases
  that raised and how long they took together, the server's CPU while
  holding (``INFO cpu``: what holding adds to the servers' idle CPU,
  measured for 3 s before and shown beside it) and the client's
  (``time.process_time``), as a share of one core, the server's commands
  per second (``INFO commandstats``, those inside scripts included) and its
  top-level calls per second, the client's memory per held lock (the
  growth of its resident memory, the lock objects included; the pool's
  connections are opened beforehand, and not counted), and the client's
  connections. N = 1,000, 5,000 and 10,000 on one server, and 1,000 on a
  three-master cluster (``RedisCluster.from_url``).
* ``waiters``: 2,000 tasks on one client wait on one primitive and cycle
  through it (each holds it about a millisecond): a ``Semaphore(limit=10)``,
  an ``AsyncLock(fair=True)``, and a ``ReadWriteLock`` (one task in ten a
  writer). First the primitive is held elsewhere for a few seconds while
  every task waits: the server's commands per second then are what waiting
  costs. Then it is let go and the tasks cycle for ``--window`` seconds:
  acquisitions per second, errors raised into the tasks (by type), the most
  tasks ever inside at once (a semaphore's limit, one writer or only
  readers), and the keys left on the server once every task has ended. Each
  on a client made with ``max_connections=20`` (a ``ConnectionPool`` that
  raises when exhausted) and, as the baseline, on a ``BlockingConnectionPool``
  of 100.
* ``floor``: what the server spends on one command on this machine, to
  judge the renewal's cost by: ``PING``, ``PEXPIRE`` (the cheapest write a
  renewal could be, without its owner check) and ``SET key token IFEQ token
  PX ms`` (the server's compare-and-extend, where it has one), each sent
  10,000 times a second in pipelines of 100 over 10,000 keys; reported in
  microseconds of server CPU per command.
* ``cost``: the server's CPU for one acquire + release of a reader of a
  ``ReadWriteLock`` and of a permit of a ``Semaphore`` while 0, 1,000 and
  3,000 others hold it (they hold with ``auto_renew=False`` and a long
  lease: no traffic of theirs is counted), in microseconds.

Run ``python -m benchmarks.scale`` (``--quick``: small sizes, about a minute;
``--workload held`` and so on for one workload). ``python -m
benchmarks.compare --bench scale`` compares it with an earlier revision.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster

from aiolock._gate import MAX_SLOTS
from aiolock.testing import LocalCluster

from ._measure import embedded_server, server_commands
from ._runner import Benchmark, mark, print_table, run
from ._subjects import (
    AIOLOCK,
    AIOLOCK_FAIR,
    RW_READER,
    RW_WRITER,
    AiolockLock,
    AiolockReadWrite,
    AiolockSemaphore,
    semaphore,
)

BENCHMARK: Final = Benchmark("scale", __doc__.split("\n\n")[0])
WORKLOADS: Final = ("held", "waiters", "cost", "floor")
#: The lease of the held locks.
HELD_TTL: Final = 3.0
#: The bounds the held workload is judged by (a share of one core; bytes per held lock).
SERVER_SHARE: Final = 0.02
CLIENT_SHARE: Final = 0.15
BYTES_PER_LOCK: Final = 2048
#: Seconds of the servers' idle CPU measured before the locks are taken.
IDLE_S: Final = 3.0
#: How long each waiter keeps what it acquired.
INSIDE: Final = 0.001
#: Acquisition timeout of each waiting task (a task that times out counts as an error).
WAIT_TIMEOUT: Final = 30.0


# -- measuring -------------------------------------------------------------------------------


async def _cpu(admins: Sequence[Redis | RedisCluster]) -> float:
    """The servers' CPU seconds so far (user + system, every thread), summed."""
    total = 0.0
    for admin in admins:
        for info in await _infos(admin, "cpu"):
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


async def _infos(admin: Redis | RedisCluster, section: str) -> list[dict[str, Any]]:
    """``INFO section`` of every server ``admin`` reaches (each master of a cluster)."""
    if isinstance(admin, RedisCluster):
        replies = await admin.info(section, target_nodes=RedisCluster.PRIMARIES)
        return [dict(v) for v in replies.values()]
    return [dict(await admin.info(section))]


async def _commands(admins: Sequence[Redis | RedisCluster]) -> tuple[int, int]:
    """(every command run, top-level ``EVALSHA``/``EVAL`` calls), summed over the servers."""
    commands = scripts = 0
    for admin in admins:
        for stats in await _infos(admin, "commandstats"):
            for key, value in stats.items():
                if isinstance(value, dict) and "calls" in value:
                    commands += int(value["calls"])
                    if key in ("cmdstat_evalsha", "cmdstat_eval"):
                        scripts += int(value["calls"])
    return commands, scripts


async def _connections(admin: Redis | RedisCluster) -> int:
    """Connected clients over the servers, less the admin's own."""
    infos = await _infos(admin, "clients")
    return sum(int(info["connected_clients"]) for info in infos) - len(infos)


async def _keys(admin: Redis | RedisCluster, pattern: str) -> int:
    if isinstance(admin, RedisCluster):
        replies = await admin.keys(pattern, target_nodes=RedisCluster.PRIMARIES)
        return len(replies)
    return len(await admin.keys(pattern))


async def _in_chunks(
    make: Callable[[int], Awaitable[Any]], count: int, chunk: int = 200
) -> list[Any]:
    """``make(i)`` for every i < count, ``chunk`` at a time; each outcome or its exception."""
    outcomes: list[Any] = []
    for start in range(0, count, chunk):
        outcomes += await asyncio.gather(
            *(make(i) for i in range(start, min(start + chunk, count))), return_exceptions=True
        )
    return outcomes


# -- held ------------------------------------------------------------------------------------


def _resident() -> float:
    """This process's resident memory in bytes (Linux's ``/proc``; NaN elsewhere).

    Not ``tracemalloc``: tracing every allocation slows the client about
    twelvefold, enough to lose locks it would keep. A resident size counts
    what the allocator keeps besides the objects: an upper bound.
    """
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return math.nan
    return float(pages * os.sysconf("SC_PAGE_SIZE"))


async def held(url: str, count: int, hold: float, *, cluster: bool) -> dict[str, Any]:
    """Hold ``count`` locks on one default client for ``hold`` s; see the module's text."""
    client: Redis | RedisCluster = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
    admin: Redis | RedisCluster = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
    lost: list[object] = []
    try:
        await admin.ping()
        # The pool's connections first (they are the client's, not the locks'): as
        # many as aiolock may use at once, to each server (a cluster's pools are per
        # master, and each may grow to that many), and the code paths warmed.
        warm = [AIOLOCK.make(client, f"bench:scale:warm:{i}", ttl=HELD_TTL) for i in range(200)]
        await asyncio.gather(*(lock.acquire() for lock in warm))
        await asyncio.gather(*(lock.release() for lock in warm))
        del warm
        if isinstance(client, RedisCluster):
            for node in client.get_primaries():
                await asyncio.gather(
                    *(client.execute_command("PING", target_nodes=node) for _ in range(MAX_SLOTS))
                )
        else:
            await asyncio.gather(*(client.ping() for _ in range(MAX_SLOTS)))
        # What the servers spend with nothing held (a cluster's nodes talk to each
        # other): the renewal's share is what holding adds to it. (Measured before the
        # memory's base: the admin's first INFO opens its connections to every master.)
        idle0 = await _cpu([admin])
        t0 = time.monotonic()
        await asyncio.sleep(IDLE_S)
        idle = (await _cpu([admin]) - idle0) / (time.monotonic() - t0)
        gc.collect()
        base = _resident()
        on_lost = lost.append  # (one callback for all, as a service passes its function)
        locks = [
            AIOLOCK.make(client, f"bench:scale:{i}", ttl=HELD_TTL, on_lost=on_lost)
            for i in range(count)
        ]
        started = time.monotonic()
        acquired = await _in_chunks(lambda i: locks[i].acquire(timeout=30), count)
        acquire_s = time.monotonic() - started
        failed = sum(1 for a in acquired if a is not True)
        # Past every first renewal: the renewal machinery holds what it holds for good.
        await asyncio.sleep(HELD_TTL / 3 + 0.5)
        gc.collect()
        memory = _resident() - base
        cpu0 = await _cpu([admin])
        commands0, scripts0 = await _commands([admin])
        own0 = time.process_time()
        t0 = time.monotonic()
        await asyncio.sleep(hold)
        wall = time.monotonic() - t0
        own = time.process_time() - own0
        cpu = await _cpu([admin]) - cpu0
        commands, scripts = await _commands([admin])
        connections = await _connections(admin)
        lost_while_held = len(lost)
        errors: Counter[str] = Counter()
        # All at once, as a service that shuts down lets go of everything it holds.
        started = time.monotonic()
        outcomes = await asyncio.gather(*(lock.release() for lock in locks), return_exceptions=True)
        release_s = time.monotonic() - started
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                errors[type(outcome).__name__] += 1
        left = await _keys(admin, "*bench:scale:*")
    finally:
        await client.aclose()
        await admin.aclose()
    return {
        "count": count,
        "cluster": cluster,
        "hold_s": wall,
        "acquire_s": acquire_s,
        "acquire_failures": failed,
        "release_s": release_s,
        "lost": lost_while_held,
        "release_errors": dict(errors),
        "server_cpu_share": cpu / wall - idle,
        "server_idle_share": idle,
        "client_cpu_share": own / wall,
        "commands_per_s": (commands - commands0) / wall,
        "script_calls_per_s": (scripts - scripts0) / wall,
        "bytes_per_lock": memory / count,
        "connections": connections,
        "keys_left": left,
    }


@contextlib.contextmanager
def _cluster() -> Iterator[str]:
    with LocalCluster(masters=3) as cluster:
        yield cluster.url


# -- waiters ---------------------------------------------------------------------------------


def _client(url: str, pool: str) -> Redis:
    if pool == "blocking100":
        return Redis(connection_pool=BlockingConnectionPool.from_url(url, max_connections=100))
    return Redis.from_url(url, max_connections=20)


@dataclass(frozen=True)
class Crowd:
    """A row of the waiters workload: the primitive its tasks wait on and cycle through.

    Attributes:
        kind: the row's name.
        subject: what the tasks take.
        writer: what every tenth task takes instead (from the first), if anything.
        most: how many may hold at once (None: any number, while no writer holds).
    """

    kind: str
    subject: AiolockLock | AiolockSemaphore | AiolockReadWrite
    writer: AiolockReadWrite | None = None
    most: int | None = None

    def exclusive(self, index: int) -> bool:
        """Whether the ``index``-th task holds alone."""
        return self.most == 1 or (self.writer is not None and index % 10 == 0)


#: The waiters workload's rows: a semaphore of 10 permits, a fair lock, a read-write lock
#: whose every tenth task is a writer.
CROWDS: Final = (
    Crowd("semaphore", semaphore(10), most=10),
    Crowd("fair", AIOLOCK_FAIR, most=1),
    Crowd("rw", RW_READER, writer=RW_WRITER),
)


async def waiters(
    url: str, crowd: Crowd, pool: str, count: int, hold: float, window: float
) -> dict[str, Any]:
    """``count`` tasks cycle through the primitive of ``crowd``; see the module's text."""
    kind = crowd.kind
    name = f"bench:scale:wait:{kind}:{pool}"
    client = _client(url, pool)
    other = Redis.from_url(url)
    admin = Redis.from_url(url)
    errors: Counter[str] = Counter()
    inside = {"r": 0, "w": 0, "most": 0, "bad": 0}
    done = 0
    stop = asyncio.Event()

    async def cycle(index: int) -> None:
        nonlocal done
        subject = crowd.writer if crowd.writer is not None and index % 10 == 0 else crowd.subject
        lock = subject.make(client, name, ttl=10.0)
        writer = crowd.exclusive(index)
        while not stop.is_set():
            try:
                if not await lock.acquire(timeout=WAIT_TIMEOUT):
                    errors["timed out"] += 1
                    continue
            except Exception as exc:
                errors[type(exc).__name__] += 1
                await asyncio.sleep(0.01)
                continue
            try:
                inside["w" if writer else "r"] += 1
                now = inside["r"] + inside["w"]
                inside["most"] = max(inside["most"], now)
                if (crowd.most is not None and now > crowd.most) or (inside["w"] and now > 1):
                    inside["bad"] += 1
                await asyncio.sleep(INSIDE)
                done += 1
            finally:
                inside["w" if writer else "r"] -= 1
                try:
                    await lock.release()
                except Exception as exc:
                    errors["release " + type(exc).__name__] += 1

    # Held elsewhere first, by its writer or as many holders as may hold: every task waits.
    first = crowd.writer or crowd.subject
    blockers = [first.make(other, name, ttl=30.0) for _ in range(crowd.most or 1)]
    for blocker in blockers:
        assert await blocker.acquire(timeout=10)
    tasks = [asyncio.create_task(cycle(i)) for i in range(count)]
    try:
        await asyncio.sleep(min(hold, 2.0))  # every task is waiting by now
        commands0 = await server_commands(admin)
        t0 = time.monotonic()
        await asyncio.sleep(hold)
        waiting_per_s = (await server_commands(admin) - commands0 - 1) / (time.monotonic() - t0)
        waiting_errors = sum(errors.values())
        for blocker in blockers:
            await blocker.release()
        done0 = done
        t0 = time.monotonic()
        await asyncio.sleep(window)
        elapsed = time.monotonic() - t0
        rate = (done - done0) / elapsed
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=WAIT_TIMEOUT + 5)
        for task in pending:  # still waiting: give up (a cancelled wait leaves nothing)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.5)  # entries of cancelled waiters are gone by their leave
        left = await _keys(admin, f"*{{{name}}}*")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in (client, other, admin):
            await c.aclose()
    return {
        "kind": kind,
        "pool": pool,
        "tasks": count,
        "waiting_commands_per_s": waiting_per_s,
        "waiting_errors": waiting_errors,
        "acquisitions_per_s": rate,
        "errors": dict(errors),
        "error_count": sum(errors.values()),
        "most_inside": inside["most"],
        "over_the_limit": inside["bad"],
        "keys_left": left,
    }


# -- cost ------------------------------------------------------------------------------------


#: The cost workload's rows: a reader of a read-write lock, a permit of a semaphore with 10
#: more permits than holders.
COSTS: Final[tuple[tuple[str, Callable[[int], AiolockSemaphore | AiolockReadWrite]], ...]] = (
    ("rw", lambda _: RW_READER),
    ("semaphore", lambda holders: semaphore(holders + 10)),
)


async def cost(
    url: str,
    kind: str,
    subject: AiolockSemaphore | AiolockReadWrite,
    holders: int,
    cycles: int,
) -> dict[str, Any]:
    """The server's CPU per acquire + release of one more holder, ``holders`` holding."""
    name = f"bench:scale:cost:{kind}:{holders}"
    client = Redis.from_url(url)
    admin = Redis.from_url(url)

    def make() -> Any:
        return subject.make(client, name, ttl=120.0, auto_renew=False)

    others = [make() for _ in range(holders)]
    try:
        await _in_chunks(lambda i: others[i].acquire(timeout=30), holders)
        one = make()
        for _ in range(20):  # warm: scripts loaded, connections made
            assert await one.acquire(timeout=5)
            await one.release()
        cpu0 = await _cpu([admin])
        for _ in range(cycles):
            assert await one.acquire(timeout=5)
            await one.release()
        cpu = await _cpu([admin]) - cpu0
        await _in_chunks(lambda i: others[i].release(), holders)
    finally:
        await client.aclose()
        await admin.aclose()
    return {"kind": kind, "holders": holders, "cycles": cycles, "us_per_cycle": cpu / cycles * 1e6}


# -- main ------------------------------------------------------------------------------------


def _share(value: float) -> str:
    return f"{value * 100:.2f} %"


async def _held_apart(url: str, count: int, hold: float, *, cluster: bool) -> dict[str, Any]:
    """:func:`held` in a process of its own: its memory grows from a fresh start.

    (In one process, a run would reuse the memory an earlier one freed, and
    seem to need none.) The child runs this very module, with the same
    interpreter flags and environment (``benchmarks.compare``'s choice of
    aiolock included), and prints its row as JSON.
    """
    command = [sys.executable, *(["-P"] if sys.flags.safe_path else [])]
    command += ["-m", BENCHMARK.module, "--held-one", str(count), "--url", url, "--hold", str(hold)]
    if cluster:
        command.append("--on-cluster")
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=hold + 300, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the held run of {count} failed:\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if "held" in args.workload:
        rows = []
        with embedded_server() as server:
            for count in args.held:
                print(f"  held: {count} locks on one server ...", flush=True)
                rows.append(await _held_apart(server.url, count, args.hold, cluster=False))
        if args.cluster_held:
            with _cluster() as url:
                print(f"  held: {args.cluster_held} locks on a cluster ...", flush=True)
                rows.append(await _held_apart(url, args.cluster_held, args.hold, cluster=True))
        result["held"] = rows
    if "waiters" in args.workload:
        rows = []
        with embedded_server() as server:
            for crowd in CROWDS:
                for pool in ("max20", "blocking100"):
                    print(f"  waiters: {crowd.kind} on {pool} ...", flush=True)
                    rows.append(
                        await waiters(
                            server.url, crowd, pool, args.waiters, args.wait_hold, args.window
                        )
                    )
        result["waiters"] = rows
    if "cost" in args.workload:
        rows = []
        with embedded_server() as server:
            for kind, subject_of in COSTS:
                for holders in args.holders:
                    print(f"  cost: {kind} with {holders} holders ...", flush=True)
                    subject = subject_of(holders)
                    rows.append(await cost(server.url, kind, subject, holders, args.cycles))
        result["cost"] = rows
    if "floor" in args.workload:
        with embedded_server() as server:
            print("  floor: PING, PEXPIRE, SET IFEQ ...", flush=True)
            result["floor"] = await floor(server.url, 10_000, 3.0 if args.quick else 8.0)
    return result


# -- floor -----------------------------------------------------------------------------------


async def floor(url: str, keys: int, seconds: float) -> list[dict[str, Any]]:
    """Server CPU per command of a few single-key commands, 10,000 a second in pipelines of 100."""
    client = Redis.from_url(url)
    rows: list[dict[str, Any]] = []
    try:
        names = [f"bench:scale:floor:{{{i}}}" for i in range(keys)]
        token = os.urandom(16).hex()  # (a holder's token)
        for start in range(0, keys, 1000):
            pipe = client.pipeline(transaction=False)
            for name in names[start : start + 1000]:
                pipe.set(name, token, px=600_000)
            await pipe.execute()
        info = await client.info("server")
        version = tuple(int(p) for p in str(info.get("valkey_version") or "0.0").split(".")[:2])
        kinds = ["PING", "PEXPIRE"]
        if version >= (8, 1):  # (SET ... IFEQ: Valkey 8.1 on; Redis 8.4)
            kinds.append("SET IFEQ")
        for kind in kinds:
            cpu0 = await _cpu([client])
            sent = 0
            started = time.monotonic()
            due = started
            while time.monotonic() - started < seconds:
                pipe = client.pipeline(transaction=False)
                for name in names[sent % keys : sent % keys + 100]:
                    if kind == "PING":
                        pipe.execute_command("PING")
                    elif kind == "PEXPIRE":
                        pipe.execute_command("PEXPIRE", name, 600_000)
                    else:
                        pipe.execute_command("SET", name, token, "IFEQ", token, "PX", 600_000)
                await pipe.execute()
                sent += 100
                due += 0.01
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            wall = time.monotonic() - started
            cpu = await _cpu([client]) - cpu0
            rows.append(
                {
                    "command": kind,
                    "per_s": sent / wall,
                    "us_per_command": cpu / sent * 1e6,
                    "server_cpu_share": cpu / wall,
                }
            )
        for start in range(0, keys, 1000):
            await client.delete(*names[start : start + 1000])
    finally:
        await client.aclose()
    return rows


def _report(result: dict[str, Any], quick: bool) -> bool:
    """Print the tables; whether every bound held (shown as info with ``--quick``)."""
    ok = True
    for row in result.get("held", []):
        row_ok = (
            row["lost"] == 0
            and not row["release_errors"]
            and row["acquire_failures"] == 0
            and row["server_cpu_share"] <= SERVER_SHARE
            and row["client_cpu_share"] <= CLIENT_SHARE
            and row["bytes_per_lock"] <= BYTES_PER_LOCK
            and row["keys_left"] == 0
        )
        row["pass"] = row_ok
        ok = ok and row_ok
    if result.get("held"):
        print_table(
            f"Held: N AsyncLocks (ttl={HELD_TTL:g}) on one default client",
            [
                "N",
                "where",
                "lost",
                "release errors",
                "release all",
                "server CPU",
                "(idle)",
                "client CPU",
                "commands/s",
                "script calls/s",
                "bytes/lock",
                "connections",
                "bounds",
            ],
            [
                [
                    f"{r['count']:,}",
                    "cluster" if r["cluster"] else "server",
                    r["lost"],
                    sum(r["release_errors"].values()),
                    f"{r['release_s']:.1f} s",
                    _share(r["server_cpu_share"]),
                    _share(r["server_idle_share"]),
                    _share(r["client_cpu_share"]),
                    f"{r['commands_per_s']:,.0f}",
                    f"{r['script_calls_per_s']:,.0f}",
                    f"{r['bytes_per_lock']:,.0f}",
                    r["connections"],
                    mark(r["pass"], quick),
                ]
                for r in result["held"]
            ],
        )
    waiting = result.get("waiters", [])
    if waiting:
        baseline = {r["kind"]: r for r in waiting if r["pool"] == "blocking100"}
        for row in waiting:
            base = baseline[row["kind"]]["acquisitions_per_s"]
            row["vs_blocking100"] = row["acquisitions_per_s"] / base if base else math.nan
            row["pass"] = (
                row["error_count"] == 0
                and row["over_the_limit"] == 0
                and row["keys_left"] == 0
                and row["waiting_commands_per_s"] <= 1000
                and (row["pool"] != "max20" or row["vs_blocking100"] >= 0.5)
            )
            ok = ok and row["pass"]
        print_table(
            "Waiters: tasks on one client cycling through one primitive",
            [
                "primitive",
                "pool",
                "acq/s",
                "/ blocking 100",
                "errors",
                "most inside",
                "waiting cmds/s",
                "keys left",
                "bounds",
            ],
            [
                [
                    r["kind"],
                    r["pool"],
                    f"{r['acquisitions_per_s']:,.0f}",
                    f"{r['vs_blocking100']:.2f}",
                    ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0",
                    r["most_inside"],
                    f"{r['waiting_commands_per_s']:,.0f}",
                    r["keys_left"],
                    mark(r["pass"], quick),
                ]
                for r in waiting
            ],
        )
    costs = result.get("cost", [])
    if costs:
        alone = {r["kind"]: r["us_per_cycle"] for r in costs if r["holders"] == 0}
        for row in costs:
            row["vs_alone"] = (
                row["us_per_cycle"] / alone[row["kind"]] if row["kind"] in alone else math.nan
            )
            row["pass"] = not row["vs_alone"] > 2.0
            ok = ok and row["pass"]
        print_table(
            "Cost: server CPU per acquire + release while others hold",
            ["primitive", "holders", "us per cycle", "/ alone", "bounds"],
            [
                [
                    r["kind"],
                    f"{r['holders']:,}",
                    f"{r['us_per_cycle']:.1f}",
                    f"{r['vs_alone']:.2f}",
                    mark(r["pass"], quick),
                ]
                for r in costs
            ],
        )
    if result.get("floor"):
        print_table(
            "Floor: the server's CPU per command, 10,000 a second in pipelines of 100",
            ["command", "per second", "server CPU", "µs per command"],
            [
                [
                    r["command"],
                    f"{r['per_s']:,.0f}",
                    _share(r["server_cpu_share"]),
                    f"{r['us_per_command']:.2f}",
                ]
                for r in result["floor"]
            ],
        )
    return ok


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"want numbers separated by commas, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError(f"want numbers >= 0, got {text!r}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen workloads with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        3 (``EXIT_MISSED``) if a bound did not hold (not judged with ``--quick``), else 0.
    """
    parser = BENCHMARK.parser()
    parser.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="run only this workload (repeatable; default: all)",
    )
    parser.add_argument("--held", type=_sizes, help="held: N per run (1000,5000,10000)")
    parser.add_argument(
        "--cluster-held", type=int, help="held: N on a 3-master cluster, 0 for none (1000)"
    )
    parser.add_argument("--hold", type=float, help="held: seconds of holding (30)")
    parser.add_argument("--waiters", type=int, help="waiters: tasks (2000)")
    parser.add_argument("--wait-hold", type=float, help="waiters: seconds all wait (3)")
    parser.add_argument("--window", type=float, help="waiters: seconds of cycling (10)")
    parser.add_argument("--holders", type=_sizes, help="cost: holders per run (0,1000,3000)")
    parser.add_argument("--cycles", type=int, help="cost: acquire + release cycles (300)")
    # (One held run in this process, for _held_apart: its row as JSON on stdout.)
    parser.add_argument("--held-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--on-cluster", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.held_one is not None:
        row = run(
            lambda: held(args.url, args.held_one, args.hold or 30.0, cluster=args.on_cluster),
            args.loop,
        )
        print(json.dumps(row))
        return 0
    quick = args.quick
    args.workload = args.workload or list(WORKLOADS)
    args.held = args.held or ([200, 1000] if quick else [1000, 5000, 10000])
    if args.cluster_held is None:
        args.cluster_held = 200 if quick else 1000
    args.hold = args.hold or (5.0 if quick else 30.0)
    args.waiters = args.waiters or (300 if quick else 2000)
    args.wait_hold = args.wait_hold or (2.0 if quick else 3.0)
    args.window = args.window or (3.0 if quick else 10.0)
    args.holders = args.holders or ([0, 300] if quick else [0, 1000, 3000])
    args.cycles = args.cycles or (100 if quick else 300)
    session = BENCHMARK.session(args, argv)
    print(f"scale benchmark: {', '.join(args.workload)}")
    result = session.run(lambda: _main(args))
    ok = _report(result, quick)
    session.write_json(
        {"benchmark": BENCHMARK.name, "command": session.command, "loop": session.loop, **result}
    )
    if quick:
        passed = (
            f"info: {'every bound held' if ok else 'a bound did not hold'} (--quick: not judged)"
        )
    else:
        passed = "PASS: every bound held"
    return session.finish(
        missed="" if ok else "a bound did not hold (see the tables)", passed=passed
    )


if __name__ == "__main__":
    sys.exit(main())
