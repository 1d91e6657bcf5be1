"""AsyncLock on a real Redis/Valkey Cluster through ``redis.asyncio.RedisCluster``.

Every test runs against a :class:`~aiolock.testing.LocalCluster` on loopback:
three masters (module scope), and for the failover test a separate cluster
with a replica behind each master. Several ``RedisCluster`` objects stand for
several processes (each has its own local queue and its own pub/sub
listeners). What is proved:

- contention over names spread on every master never lets two holders in,
  and every acquisition path (bare ``SET``, the acquire script with and
  without fencing, the local hand-over script, release, renewal) runs on the
  master owning the lock's slot, with all of its keys in that one slot;
- a release wakes a waiter of another client through sharded pub/sub
  (``SSUBSCRIBE`` on the owning node), even when waiting is the first thing
  that client ever did;
- a lock key and its companions share one slot for names and prefixes with
  braces or unicode;
- a failover of the lock's master either keeps the lock (renewals go on on
  the promoted replica) or tells the holder it lost it, before anyone else
  can acquire it;
- nothing is left behind: no task, no connection checked out, no pub/sub
  connection on any node, no key but the fencing counters, and no
  connection at all once the clients are closed.

Strict xfails pin three defects: names that empty the hash tag (``"}x"``)
split a lock over slots; a release listener with channels in several slots
of one node sends them in one SSUBSCRIBE (CROSSSLOT, so its waiters only
poll); and a burst of first acquisitions on a fresh client runs into redis-py
re-initializing under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Final

import anyio
import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.leaks import listeners_gone, other_tasks
from support.locks import holds_on_server, keys_of
from support.servers import calls, has, needs
from support.timing import eventually, finish

import aiolock
from aiolock import (
    AsyncLock,
    Election,
    LockError,
    LockLostError,
    MultiLock,
    ReadWriteLock,
    Semaphore,
    backoff,
)
from aiolock import _scripts as scripts
from aiolock._cli._admin import held_rows
from aiolock._inspect import force_release, held_names
from aiolock._keys import DEFAULT_PREFIX, Keys
from aiolock.testing import LocalCluster, RedisServer

#: The servers' behaviour, not the loop's: on asyncio's loop only (see conftest.py).
pytestmark = pytest.mark.one_loop

#: The backoff step of notified waiters: anything much faster came from a notification.
LONG_STEP: Final = 5.0
#: How soon a notified waiter must hold the lock (generous: 2 loaded cores).
WAKE_BOUND: Final = 1.0
#: The suffix of the fencing counter, the one key a released lock may leave (docs/design.md).
FENCE_SUFFIX: Final = Keys("x").fence.removeprefix(Keys("x").lock)
SLOTS: Final = 16384


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three masters without replicas, shared by the module's tests (each uses its own names)."""
    with LocalCluster(masters=3) as built:
        yield built


@pytest.fixture(scope="module")
def failover_cluster() -> Iterator[LocalCluster]:
    """Four masters, each with one replica: one failover per test run, four in all."""
    with LocalCluster(masters=4, replicas_per_master=1) as built:
        yield built


@pytest.fixture
def tag() -> str:
    """A string every key of the test contains, and no other test's key does."""
    return f"t{uuid.uuid4().hex[:12]}"


def masters_of(cluster: LocalCluster) -> list[RedisServer]:
    """The running masters of ``cluster`` now."""
    return [m for m in cluster.masters() if m.running]


def direct(node: RedisServer) -> redis.Redis:
    """A plain client of one node, for assertions (never used by a lock)."""
    return redis.Redis(host=node.host, port=node.port, decode_responses=True)


#: redis-py before 8 leaks a node's pool connection on every write-side error of its
#: cluster client (redis-py#4110, fixed by #4111; 8.1 has the fix): a failover leaves
#: connections checked out that no aiolock call holds.
LEAKS_ON_WRITE_ERRORS: Final = int(version("redis").split(".")[0]) < 8


def in_use(client: RedisCluster) -> int:
    """How many connections of ``client``'s node pools are checked out."""
    busy = 0
    for node in client.get_nodes():
        free = set(node._free)
        busy += sum(1 for conn in node._connections if conn not in free)
    return busy


class Clients:
    """Makes ``RedisCluster`` clients ("processes") and checks, after the test, what they left.

    Every connection of these clients, the release listeners' included (they
    copy the node's connection settings), carries the test's tag as its
    client name, so the servers can say which connections are the test's.
    The check after the test is the cluster's counterpart of conftest's
    ``no_leaks``: no task left running, every release-notification listener
    ended, no connection checked out of any node pool, no pub/sub connection
    of the test left on any node, and no key containing the test's tag on
    any master but fencing counters (kept by design, docs/design.md; deleted
    here). After the clients are closed, no connection of the test is left
    on any node.
    """

    def __init__(self, tag: str) -> None:
        self._tag = tag
        self._made: list[RedisCluster] = []
        self._clusters: list[LocalCluster] = []
        #: A node died under the clients (a failover test): with redis-py before 8,
        #: connections its cluster client leaked (:data:`LEAKS_ON_WRITE_ERRORS`) are let be.
        self.failover = False

    def __call__(self, cluster: LocalCluster) -> RedisCluster:
        """A new client of ``cluster`` that knows every node (it has run no command yet)."""
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in cluster.startup_nodes],
            client_name=self._tag,
        )
        self._made.append(client)
        if cluster not in self._clusters:
            self._clusters.append(cluster)
        return client

    async def connections(self, kind: str | None = None) -> dict[int, list[str]]:
        """Running node port -> the connections named with the tag it has (of ``kind``)."""
        found: dict[int, list[str]] = {}
        for cluster in self._clusters:
            for node in cluster.nodes:
                if not node.running:
                    continue
                admin = direct(node)
                try:
                    listed = await (admin.client_list(_type=kind) if kind else admin.client_list())
                finally:
                    await admin.aclose()
                if mine := [
                    f"last command {c['cmd']}, age {c['age']} s, flags {c['flags']}"
                    for c in listed
                    if c["name"] == self._tag
                ]:
                    found[node.port] = mine
        return found

    async def _none_left(self, kind: str | None, what: str) -> None:
        left: dict[int, list[str]] = {}

        async def none() -> bool:
            nonlocal left
            left = await self.connections(kind)
            return left == {}

        try:
            await eventually(none, what, 3.0)
        except pytest.fail.Exception:
            pytest.fail(f"{what}: {left}")

    async def check_no_leaks(self) -> None:
        assert await other_tasks() == set(), "a task outlived the test"
        assert await listeners_gone(), "a release-notification listener did not stop by itself"
        if not (self.failover and LEAKS_ON_WRITE_ERRORS):
            for client in self._made:
                assert in_use(client) == 0, "a connection was left checked out"
        await self._none_left("pubsub", "no pub/sub connection of the test left on any node")
        left: list[str] = []
        for cluster in self._clusters:
            for master in masters_of(cluster):
                admin = direct(master)
                try:
                    keys = [k async for k in admin.scan_iter(match=f"*{self._tag}*")]
                    for key in keys:  # one by one: they are in different slots
                        await admin.delete(key)
                finally:
                    await admin.aclose()
                left += [k for k in keys if not k.endswith(FENCE_SUFFIX)]
        assert left == [], "keys were left on the cluster"

    async def close(self) -> None:
        for client in self._made:
            await client.aclose()
            # redis-py 8.1: after a ConnectionError flagged the client for re-initialization
            # (a failover), aclose() does nothing and every pooled connection stays open (on
            # uvloop, closing the loop then hung). Close the nodes' connections ourselves.
            nodes = {
                **client.nodes_manager.startup_nodes,
                **client.nodes_manager.nodes_cache,
            }
            for node in nodes.values():
                with contextlib.suppress(RedisError, OSError):
                    await node.disconnect()

    async def check_closed(self) -> None:
        # redis-py 8.1 also leaks the connections it opens for CLUSTER SLOTS while it
        # re-initializes during a failover: nothing references them but the garbage. Those
        # may be left (then closed here); any other connection of the test is a leak.
        # (Before 7.0, CLIENT LIST names no subcommand: "cluster".)
        if self.failover and LEAKS_ON_WRITE_ERRORS:
            await self._close_lost_connections()  # redis-py lost track of them
        left = await self.connections()
        slots = ("last command cluster|slots,", "last command cluster,")
        others = {
            port: [c for c in found if not c.startswith(slots)] for port, found in left.items()
        }
        assert {port: found for port, found in others.items() if found} == {}, (
            f"connections of the test left open: {left}"
        )
        await self._close_lost_connections()
        await self._none_left(None, "no connection of the test left on any node")

    async def _close_lost_connections(self) -> None:
        """Close every connection of the test that is only garbage now."""
        for obj in gc.get_objects():
            if isinstance(obj, AbstractConnection) and obj.client_name == self._tag:
                with contextlib.suppress(RedisError, OSError):
                    await obj.disconnect()


@pytest.fixture
async def clients(tag: str) -> AsyncIterator[Clients]:
    """A factory of cluster clients; after the test, the leak checks of :class:`Clients`."""
    made = Clients(tag)
    try:
        yield made
        await made.check_no_leaks()
    finally:
        await made.close()
    await made.check_closed()


# --- helpers -------------------------------------------------------------------------------------


def key_of(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The key aiolock uses for ``name`` (``aiolock._keys``)."""
    return Keys(name, prefix).lock


def names_of(keys: Keys) -> tuple[str, ...]:
    """The lock key and every companion key or channel of one lock."""
    return (keys.lock, keys.queue, keys.entry("token"), keys.fence, keys.channel)


def spread_names(cluster: LocalCluster, tag: str, per_master: int) -> list[str]:
    """``per_master`` lock names on each master, grouped by master, each in its own slot."""
    masters = cluster.masters()
    count = len(masters)
    picked: dict[int, list[str]] = {i: [] for i in range(count)}
    slots: set[int] = set()
    for i in range(10_000):
        name = f"{tag}:n{i}"
        slot = LocalCluster.slot_for_key(key_of(name))
        group = slot * count // SLOTS  # the masters own equal contiguous ranges, in order
        if slot not in slots and len(picked[group]) < per_master:
            picked[group].append(name)
            slots.add(slot)
        if all(len(names) == per_master for names in picked.values()):
            break
    names = [name for group in range(count) for name in picked[group]]
    owners = [cluster.node_for_key(key_of(name)) for name in names]
    for group, master in enumerate(masters):
        assert owners[group * per_master : (group + 1) * per_master] == [master] * per_master
    return names


async def reset_stats(cluster: LocalCluster) -> None:
    """CONFIG RESETSTAT on every master."""
    for master in masters_of(cluster):
        admin = direct(master)
        try:
            await admin.config_resetstat()
        finally:
            await admin.aclose()


async def node_calls(node: RedisServer, command: str) -> int:
    """How many times ``node`` ran ``command`` since the last CONFIG RESETSTAT."""
    admin = direct(node)
    try:
        return await calls(admin, command)
    finally:
        await admin.aclose()


@dataclass(frozen=True, slots=True)
class Errors:
    """The error replies of one master since the last CONFIG RESETSTAT."""

    by_code: dict[str, int]  # INFO errorstats
    rejected: dict[str, int]  # commands refused before they ran (CROSSSLOT, MOVED...)
    failed: dict[str, int]  # commands that ran and failed (NOSCRIPT, script errors...)


async def error_replies(node: RedisServer) -> Errors:
    """What went wrong on ``node`` since the last CONFIG RESETSTAT."""
    admin = direct(node)
    try:
        errors = await admin.info("errorstats")
        commands = await admin.info("commandstats")
    finally:
        await admin.aclose()
    by_code = {name.removeprefix("errorstat_"): int(v["count"]) for name, v in errors.items()}
    rejected: dict[str, int] = {}
    failed: dict[str, int] = {}
    for name, v in commands.items():
        command = name.removeprefix("cmdstat_")
        if int(v.get("rejected_calls", 0)):
            rejected[command] = int(v["rejected_calls"])
        if int(v.get("failed_calls", 0)):
            failed[command] = int(v["failed_calls"])
    return Errors(by_code, rejected, failed)


#: The commands of the release-notification listener (see the xfail on SSUBSCRIBE).
LISTENER_COMMANDS: Final = frozenset({"ssubscribe", "sunsubscribe"})


def assert_lock_commands_clean(port: int, errors: Errors, *, fresh_clients: int = 0) -> None:
    """No lock command was refused (CROSSSLOT...) or failed, but for NOSCRIPT.

    A NOSCRIPT is answered by redis-py (it loads the script and calls it
    again). ``ERR`` replies come from redis-py's connection handshake
    (``CLIENT MAINT_NOTIFICATIONS``, unknown to this server) and are not
    counted against any command, so a script that failed would show in
    ``failed`` (as an ``evalsha`` failure beyond the NOSCRIPTs). A client
    that has not loaded the slot map yet sends its first command to any
    node, which may answer MOVED (redis-py follows it): up to one per
    ``fresh_clients``. Before 7.2 the handshake's ``CLIENT SETINFO`` fails
    too (redis-py ignores it): ``client`` failures are not lock commands.
    """
    rejected = {c: n for c, n in errors.rejected.items() if c not in LISTENER_COMMANDS}
    failed = {c: n for c, n in errors.failed.items() if c != "client"}
    moved = errors.by_code.get("MOVED", 0)
    assert sum(rejected.values()) == moved <= fresh_clients, (
        f"master {port} refused lock commands: {errors}"
    )
    assert sum(failed.values()) == errors.by_code.get("NOSCRIPT", 0), (
        f"master {port}: a lock command failed: {errors}"
    )


SCRIPT_NAMES: Final = {
    scripts.ACQUIRE.sha: "acquire",
    scripts.HANDOVER.sha: "handover",
    scripts.RELEASE.sha: "release",
    scripts.EXTEND.sha: "extend",
    scripts.LEAVE.sha: "leave",
}


@dataclass(frozen=True, slots=True)
class Ran:
    """One command a master ran, as MONITOR shows it."""

    port: int
    by_script: bool
    args: tuple[str, ...]


class Monitors:
    """``MONITOR`` on every master while the block runs; ``ran`` lists what they ran.

    On exit it sends an ``ECHO`` to each master and waits until its monitor
    has seen it, so that every command sent inside the block is in ``ran``.
    """

    def __init__(self, masters: list[RedisServer]) -> None:
        self._masters = masters
        self._tasks: list[asyncio.Task[None]] = []
        self._echo = f"end-{uuid.uuid4().hex}"
        self._ended: dict[int, asyncio.Event] = {}
        self.ran: list[Ran] = []

    async def _watch(self, node: RedisServer, ready: asyncio.Event) -> None:
        conn = direct(node)
        try:
            async with conn.monitor() as monitor:
                ready.set()
                while True:
                    seen = await monitor.next_command()
                    args = tuple(seen["command"].split(" "))
                    if args == ("ECHO", self._echo):
                        self._ended[node.port].set()
                    self.ran.append(Ran(node.port, seen["client_type"] == "lua", args))
        finally:
            await conn.aclose()

    async def __aenter__(self) -> Monitors:
        for node in self._masters:
            ready = asyncio.Event()
            self._ended[node.port] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._watch(node, ready)))
            await asyncio.wait_for(ready.wait(), 5.0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        exc = exc_info[1]
        try:
            if exc is None:
                for node in self._masters:
                    admin = direct(node)
                    try:
                        await admin.echo(self._echo)
                    finally:
                        await admin.aclose()
                    await asyncio.wait_for(self._ended[node.port].wait(), 10.0)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Paths:
    """What the masters ran for the locks of a test, classified by acquisition path."""

    counts: Counter[str]
    extends_by_key: Counter[str]
    misplaced: list[Ran]  # a command that ran on a master not owning its slot
    cross_slot: list[Ran]  # a script whose keys (or channel) are not all in one slot


def classify(ran: list[Ran], tag: str, owners: dict[int, int]) -> Paths:
    """Sort the MONITOR records of the lock commands on ``tag``'s keys by path.

    ``owners`` maps a slot to the port of the master serving it.
    """
    counts: Counter[str] = Counter()
    extends: Counter[str] = Counter()
    misplaced: list[Ran] = []
    cross: list[Ran] = []
    for record in ran:
        args = record.args
        verb = args[0].upper()
        if record.by_script:
            if verb == "SPUBLISH" and tag in args[1]:
                counts["spublish"] += 1
                if owners[LocalCluster.slot_for_key(args[1])] != record.port:
                    cross.append(record)
            elif len(args) > 1 and tag in args[1]:
                # Every key a script touches, the queue's entries (named in the script,
                # not in KEYS) included, is in the slot of the master that runs it.
                if verb == "GETDEL":
                    counts["grant"] += 1
                if owners.get(LocalCluster.slot_for_key(args[1])) != record.port:
                    cross.append(record)
            continue
        if verb == "SET" and tag in args[1] and "NX" in (a.upper() for a in args):
            counts["bare set"] += 1
            keys: tuple[str, ...] = (args[1],)
        elif verb == "EVALSHA" and args[1] in SCRIPT_NAMES and tag in args[3]:
            keys = args[3 : 3 + int(args[2])]
            label = SCRIPT_NAMES[args[1]]
            # The fencing flag: ACQUIRE's ARGV[6] (of 8), HANDOVER's ARGV[7] (the heir's, of
            # 7). Counted from the end: MONITOR's command is split at spaces, and a queue
            # entry (ACQUIRE's ARGV[3]) has some.
            flag = {"acquire": -3, "handover": -1}.get(label)
            if flag is not None:
                fenced = args[flag] == "1"
                label += " with fence" if fenced else " without fence"
            counts[label] += 1
            if label == "extend":
                extends[keys[0]] += 1
        else:
            continue
        slots = {LocalCluster.slot_for_key(key) for key in keys}
        if len(slots) != 1:
            cross.append(record)
        elif owners[slots.pop()] != record.port:
            misplaced.append(record)
    return Paths(counts, extends, misplaced, cross)


# --- 1. contention over names on every master ----------------------------------------------------

CLIENTS: Final = 3
TASKS_PER_CLIENT: Final = 6
ROUNDS: Final = 14
PER_MASTER: Final = 4
#: The lease and the hold of the long holdings that must be renewed: held past 3 leases.
SHORT_TTL: Final = 0.5
LONG_HOLD: Final = 1.6


async def test_contention_over_names_on_every_master(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """Many tasks of several clients on 12 names in 12 slots of 3 masters: never two holders.

    Every acquisition path runs on the master that owns the lock's slot, with
    all keys of each script in that slot: the bare ``SET`` of a first attempt,
    the acquire script without and with fencing, the local hand-over script
    (to tasks of the same client) with and without fencing, release
    (announced by ``SPUBLISH``), grants to waiters in the queue (whose entry
    keys the scripts name themselves), and renewal of holdings kept past
    three leases. No master refused a lock command (CROSSSLOT, MOVED...) or failed
    one but for NOSCRIPT (which redis-py answers), no task failed, and fences
    only went up.
    """
    names = spread_names(cluster, tag, PER_MASTER)
    assert len(names) == 12
    assert len({LocalCluster.slot_for_key(key_of(n)) for n in names}) == 12
    masters = masters_of(cluster)
    assert {cluster.node_for_key(key_of(n)).port for n in names} == {m.port for m in masters}
    # slot -> the port of its master, for the lock keys and their companions
    owners: dict[int, int] = {}
    for name in names:
        port = cluster.node_for_key(key_of(name)).port
        for key in names_of(Keys(name)):
            owners[LocalCluster.slot_for_key(key)] = port

    inside: Counter[str] = Counter()
    overlaps: list[str] = []
    fences: dict[str, int] = {}
    held = Counter[str]()
    long_holds: list[str] = []
    made = [clients(cluster) for _ in range(CLIENTS)]
    # Load the slot maps first: a burst of first commands on a fresh client trips redis-py
    # (see test_a_burst_of_first_acquisitions_on_a_fresh_client).
    await asyncio.gather(*(client.initialize() for client in made))

    async def work(c: int, i: int) -> None:
        rng = random.Random(c * 1000 + i)
        for r in range(ROUNDS):
            # Tasks i and i+3 of a client share a name each round (local queue, hand-over),
            # and so do two tasks of every other client (contention on the server).
            name = names[(r + (i % 3) * PER_MASTER + c * PER_MASTER) % len(names)]
            long = r == 0 and i == 0  # one long holding per client, on a different master
            lock = AsyncLock(
                made[c],
                name,
                ttl=SHORT_TTL if long else 10.0,
                timeout=30.0,
                fencing=(r + c + i) % 2 == 0,
            )
            async with lock:
                if inside[name]:
                    overlaps.append(f"{name}: client {c} task {i} round {r}")
                inside[name] += 1
                if lock.fence is not None:
                    assert lock.fence > fences.get(name, 0), name
                    fences[name] = lock.fence
                if long:
                    long_holds.append(lock.key)
                    await asyncio.sleep(LONG_HOLD)
                else:
                    await asyncio.sleep(rng.uniform(0, 0.004))
                assert not lock.lost, f"{name}: {lock!r}"
                assert await lock.owned(), f"{name}: the server says the key is not ours"
                inside[name] -= 1
                held[name] += 1

    await reset_stats(cluster)
    async with Monitors(masters) as monitors:
        await asyncio.gather(*(work(c, i) for c in range(CLIENTS) for i in range(TASKS_PER_CLIENT)))

    assert overlaps == []
    assert sum(held.values()) == CLIENTS * TASKS_PER_CLIENT * ROUNDS
    assert set(held) == set(names)
    for master in masters:
        assert_lock_commands_clean(master.port, await error_replies(master))

    paths = classify(monitors.ran, tag, owners)
    assert paths.cross_slot == []
    assert paths.misplaced == []
    for path in (
        "bare set",
        "acquire without fence",
        "acquire with fence",
        "handover without fence",
        "handover with fence",
        "release",
        *(["spublish"] if has("sharded pub/sub") else []),  # else the waiters poll
        "extend",
        "grant",  # a release (or a long local run) hands the lock to a queued waiter
    ):
        assert paths.counts[path] > 0, f"the {path!r} path never ran: {dict(paths.counts)}"
    assert len(long_holds) == CLIENTS
    assert {cluster.node_for_key(key).port for key in long_holds} == {m.port for m in masters}
    for key in long_holds:
        # Held for LONG_HOLD with a lease of SHORT_TTL: renewed every SHORT_TTL/3.
        assert paths.extends_by_key[key] >= 3, (key, dict(paths.extends_by_key))


# --- 2. release notifications on a cluster -------------------------------------------------------


async def shard_subscribers(cluster: LocalCluster, lock: AsyncLock) -> int:
    """How many connections the master owning ``lock``'s slot has SSUBSCRIBEd to its channel."""
    admin = direct(cluster.node_for_key(lock.key))
    try:
        [(_, count)] = await admin.pubsub_shardnumsub(keys_of(lock).channel)
    finally:
        await admin.aclose()
    return int(count)


async def shard_subscribed(cluster: LocalCluster, lock: AsyncLock, timeout: float = 5.0) -> None:
    """Wait until a connection has SSUBSCRIBEd to ``lock``'s channel on the slot's master."""

    async def check() -> bool:
        return await shard_subscribers(cluster, lock) == 1

    await eventually(check, f"SSUBSCRIBE {keys_of(lock).channel} on its master", timeout)


async def release_wakes(holders: list[AsyncLock], waits: list[asyncio.Task[bool]]) -> None:
    """Release each holder in turn; its waiter must hold the lock within WAKE_BOUND."""
    for lock, task in zip(holders, waits, strict=True):
        assert not task.done(), f"{lock.name}: the waiter stopped waiting"
        released = time.monotonic()
        await lock.release()
        assert await asyncio.wait_for(task, 10.0) is True
        woke = time.monotonic() - released
        assert woke < WAKE_BOUND, f"{lock.name}: woken {woke:.3f} s after the release"


async def cancel(tasks: list[asyncio.Task[bool]]) -> None:
    """Cancel whatever of ``tasks`` still runs, and wait for all of them."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@needs("sharded pub/sub")
@pytest.mark.parametrize("fencing", [False, True], ids=["bare-set-first", "script-first"])
async def test_release_wakes_a_fresh_clients_waiter_through_sharded_pubsub(
    cluster: LocalCluster, clients: Clients, tag: str, fencing: bool
) -> None:
    """A waiter with a 5 s step, on a client that never ran a command, wakes within 1 s.

    One lock on each master is held by one client. A brand-new client (no
    slot map loaded) first waits for one of them: waiting is the first thing
    it ever does. Then it waits for the two others too. Its release
    listeners subscribe with SSUBSCRIBE on the master owning each lock's
    slot (one listener per master; never a plain SUBSCRIBE), and each
    release wakes its waiter far sooner than the backoff step would. Runs
    with both first attempts: a bare ``SET``, and (``fencing=True``) the
    acquire script.
    """
    names = spread_names(cluster, tag, 1)
    holder_client = clients(cluster)
    waiter_client = clients(cluster)
    assert not waiter_client.nodes_manager.slots_cache, "the waiter's client must be fresh"
    holders = [AsyncLock(holder_client, n, ttl=30.0) for n in names]
    for lock in holders:
        assert await lock.acquire(blocking=False)
    await reset_stats(cluster)
    waiters = [
        AsyncLock(
            waiter_client, n, ttl=30.0, timeout=20.0, fencing=fencing, backoff=backoff.constant(5.0)
        )
        for n in names
    ]
    waits = [asyncio.create_task(waiters[0].acquire())]
    try:
        await shard_subscribed(cluster, holders[0])
        waits += [asyncio.create_task(w.acquire()) for w in waiters[1:]]
        for lock in holders[1:]:
            await shard_subscribed(cluster, lock)
        # One listener per master, named like the client's own connections.
        listening = await clients.connections("pubsub")
        assert {port: len(found) for port, found in listening.items()} == {
            m.port: 1 for m in masters_of(cluster)
        }
        await asyncio.sleep(0.3)  # the waiters are asleep in their 5 s step by now
        await release_wakes(holders, waits)
    finally:
        await cancel(waits)
    for master in masters_of(cluster):
        assert await node_calls(master, "ssubscribe") >= 1, master.port
        assert await node_calls(master, "subscribe") == 0, master.port
        errors = await error_replies(master)
        assert_lock_commands_clean(master.port, errors, fresh_clients=1)
    for waiter in waiters:
        await waiter.release()


@needs("sharded pub/sub")
async def test_waiters_on_several_slots_of_one_master_are_notified(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """Waiters of one client on locks in different slots of one master all get notified.

    Four locks in four slots of the first master are held by one client;
    another client waits for all four at once with a 5 s step, so its
    listener for that master has several channels to subscribe. Each channel
    is SSUBSCRIBEd on the master (also after the pub/sub connection is cut
    with CLIENT KILL, which makes the listener subscribe them all again), and
    each release wakes its waiter within 1 s.

    Regression test for a defect this file found: the listener sent one
    SSUBSCRIBE for all the channels it (re)subscribed on a node; channels in
    different slots got CROSSSLOT, the listener reconnected and failed again,
    and the waiters only polled. It now sends one command per channel.
    """
    names = spread_names(cluster, tag, 4)[:4]  # the first master's
    holder_client, waiter_client = clients(cluster), clients(cluster)
    await asyncio.gather(holder_client.initialize(), waiter_client.initialize())
    holders = [AsyncLock(holder_client, n, ttl=30.0) for n in names]
    for lock in holders:
        assert await lock.acquire(blocking=False)
    waiters = [
        AsyncLock(waiter_client, n, ttl=30.0, timeout=20.0, backoff=backoff.constant(5.0))
        for n in names
    ]
    waits = [asyncio.create_task(w.acquire()) for w in waiters]
    try:
        for lock in holders:
            await shard_subscribed(cluster, lock, 2.0)
        admin = direct(cluster.node_for_key(holders[0].key))
        try:
            assert await admin.client_kill_filter(_type="pubsub") == 1
        finally:
            await admin.aclose()
        for lock in holders:
            await shard_subscribed(cluster, lock, 2.0)
        await asyncio.sleep(0.3)
        await release_wakes(holders, waits)
    finally:
        await cancel(waits)
        for lock in holders:
            if lock.statistics().held:
                await lock.release()
    for waiter in waiters:
        await waiter.release()


async def test_a_burst_of_first_acquisitions_on_a_fresh_client(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """Forty tasks take forty free locks at once through a fresh client: all cleanly.

    Nobody else holds any of them, so each ``acquire(timeout=1)`` must return
    True, each release must succeed (no ``LockLostError``), no error may
    escape, and no key may be left behind.

    Regression test for a defect this file found (redis-py 8.1, reached
    through aiolock): commands sent while a fresh ``RedisCluster`` loaded its
    slot map lost replies and were retried (a ``SET NX`` that had succeeded
    then said nil, a release said 0) or raised ``AttributeError``. aiolock
    now loads the slot map before its first attempt.
    """
    client = clients(cluster)
    admin = clients(cluster)
    await admin.initialize()
    locks = [AsyncLock(client, f"{tag}:burst{i}", ttl=10.0, timeout=1.0) for i in range(40)]

    async def take(lock: AsyncLock) -> str:
        try:
            async with lock:
                pass
        except Exception as exc:  # what a caller of aiolock would see
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    try:
        outcomes = Counter(await asyncio.gather(*(take(lock) for lock in locks)))
        left = [lock.key for lock in locks if await admin.exists(lock.key)]
    finally:
        for lock in locks:
            await admin.delete(lock.key)
    assert left == []
    assert outcomes == Counter({"ok": len(locks)})


# --- 3. one slot per lock, whatever the name -----------------------------------------------------

#: Name templates ("@" is the test's tag): braces, unicode, spaces.
NAMES: Final = ("@", "a{@", "@}b", "{@}", "{@", "@}", "{}@", "a{}@", "ünï@", "日本語@", "🔒 @ x")
#: Prefixes under which all of NAMES keep their keys in one slot.
PREFIXES: Final = ("aiolock:", "", "app:", "p{q}:", "p{", "p}:", "ünï:", "{t}")
#: (prefix, name) pairs whose companions fall in another slot than the key (see the xfail).
BAD: Final = (("aiolock:", "}@"), ("", "}@"), ("app:", "}@}"), ("{}", "@"), ("a{}b:", "@"))


async def exercise(client_a: RedisCluster, client_b: RedisCluster, name: str, prefix: str) -> str:
    """Take the lock, contend from another client (the fencing script), release; return the key."""
    holder = AsyncLock(client_a, name, prefix=prefix, ttl=5.0)
    waiter = AsyncLock(client_b, name, prefix=prefix, ttl=5.0, fencing=True)
    assert await holder.acquire(blocking=False)
    try:
        try:
            got = await waiter.acquire(timeout=0.02)  # acquire script, the queue
        except RedisTimeoutError:
            # No verdict within 20 ms (and its grace) on a loaded machine, the script
            # loaded on first use: ask again with time to answer.
            got = await waiter.acquire(timeout=1.0)
        assert got is False
    finally:
        await holder.release()  # release script, SPUBLISH
    assert await waiter.acquire(blocking=False)
    await waiter.release()
    return holder.key


async def test_lock_keys_and_companions_share_one_slot(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """For names with braces or unicode and prefixes with braces, a lock's keys share one slot.

    ``<key>``, ``<key>:queue``, its entries, ``<key>:fence`` and ``<key>:released``
    hash to one slot (as the cluster computes it), and acquiring, contending
    with fencing, and releasing run on that slot's master without error.
    """
    a, b = clients(cluster), clients(cluster)
    for prefix in PREFIXES:
        for template in (*NAMES, *(["}@"] if "{" in prefix else [])):
            name = template.replace("@", tag)
            key = key_of(name, prefix)
            slots = {LocalCluster.slot_for_key(k) for k in names_of(Keys(name, prefix))}
            assert slots == {LocalCluster.slot_for_key(key)}, (prefix, name)
            assert a.keyslot(key) == LocalCluster.slot_for_key(key), (prefix, name)
            assert await exercise(a, b, name, prefix) == key
            owner = direct(cluster.node_for_key(key))
            try:
                # The fencing counter lives on the slot's master: no MOVED.
                assert await owner.exists(Keys(name, prefix).fence) == 1, (prefix, name)
            finally:
                await owner.aclose()


async def test_names_that_empty_the_hash_tag_are_refused(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """A name and prefix that would leave the key an empty hash tag are refused at once.

    Regression test for a defect this file found: ``AsyncLock(client, "}x")``
    had the key ``aiolock:{}x}``, whose hash tag ``{}`` is empty, so the
    cluster hashed the whole key and ``aiolock:{}x}:waiting`` landed in
    another slot: the acquire script failed with a cross-slot error, and
    release deleted the key and then failed. Such names are now a
    ``ValueError`` naming the name and prefix (on every client type, so that
    moving to a cluster later cannot break), and nothing reaches the server.
    """
    a = clients(cluster)
    for prefix, template in BAD:
        name = template.replace("@", tag)
        with pytest.raises(ValueError, match="empty hash tag") as raised:
            AsyncLock(a, name, prefix=prefix)
        assert repr(name) in str(raised.value)
        assert repr(prefix) in str(raised.value)


# --- 4. many holdings, many slots ----------------------------------------------------------------


#: The primitives renewed in batches, made on a client for a name (ttl 1.5 s).
RENEWED_KINDS: Final[dict[str, Callable[[RedisCluster, str, Callable[..., Any]], Any]]] = {
    "AsyncLock": lambda c, name, lost: AsyncLock(c, name, ttl=1.5, on_lost=lost),
    "Semaphore": lambda c, name, lost: Semaphore(c, name, limit=2, ttl=1.5, on_lost=lost),
    "reader": lambda c, name, lost: ReadWriteLock(c, name, ttl=1.5, on_lost=lost).reader,
}


@pytest.mark.parametrize("kind", RENEWED_KINDS)
async def test_holdings_in_many_slots_are_renewed_in_one_pipeline_per_master(
    cluster: LocalCluster, clients: Clients, tag: str, kind: str
) -> None:
    """Sixty holdings, each in its own slot, renew without a connection apiece.

    A renewal script may only touch one slot, so each slot gets its own call;
    the calls due together go out in one pipeline, each master its share on
    one connection. Every holding is renewed (none lost, every lease longer
    than it would be unrenewed), each master runs one renewal call per
    holding of its slots per round, and the client never has more than three
    connections open to a master (the one its topology discovery opened, the
    renewals' pipeline, and this test's PTTL reads while a pipeline is in
    flight, which a loaded machine makes likely): sent one by one, the sixty
    calls of a round would open about twenty to each. A member whose key
    goes is lost alone.
    """
    client = clients(cluster)
    await client.initialize()
    names = [f"{tag}:many{i}" for i in range(60)]
    assert len({LocalCluster.slot_for_key(key_of(name)) for name in names}) == 60
    lost: list[object] = []
    locks = [RENEWED_KINDS[kind](client, name, lost.append) for name in names]
    for lock in locks:
        # One at a time (a connection to each master is all it takes), each in a task
        # of its own that ends: the holding joins the renewer at once, so that the
        # first renewals are due together too.
        assert await asyncio.create_task(lock.acquire(timeout=2))
    try:
        await reset_stats(cluster)
        await asyncio.sleep(1.2)  # two renewals each (every 0.5 s)
        per_master = {
            master.port: sum(1 for lock in locks if cluster.node_for_key(lock.key) is master)
            for master in masters_of(cluster)
        }
        for master in masters_of(cluster):
            assert await node_calls(master, "evalsha") >= 2 * per_master[master.port]
        pttls = [await client.pttl(lock.key) for lock in locks]
        assert min(pttls) > 1500 - 1200 + 100, pttls  # renewed (unrenewed: under 300 ms)
        open_to = await clients.connections()
        assert max(len(found) for found in open_to.values()) <= 3, open_to
        assert lost == []
        # One member's key gone: it alone is lost, at its next renewal; the others of
        # its pipeline (and of its master) renew on.
        await client.delete(locks[7].key)
        await eventually(lambda: len(lost) == 1, "the member whose key went is lost", 2.0)
        await asyncio.sleep(0.6)
        assert len(lost) == 1
        assert [lock.lost for lock in locks].count(True) == 1
        assert locks[7].lost
    finally:
        for lock in locks:
            if lock.lost:  # (only the member whose key went, unless a check above failed)
                with pytest.raises(LockLostError):
                    await lock.release()
            else:
                await lock.release()


# --- 5. failover of the lock's master ------------------------------------------------------------


async def name_on_master_with_replica(
    cluster: LocalCluster, tag: str
) -> tuple[str, RedisServer, RedisServer]:
    """A lock name whose slot is served by a master that still has a replica."""
    for master in masters_of(cluster):
        replicas = cluster.replicas_of(master)
        if not replicas:
            continue
        for i in range(1000):
            name = f"{tag}:fo{i}"
            if cluster.node_for_key(key_of(name)) is master:
                return name, master, replicas[0]
    raise AssertionError("no master with a replica is left")


@pytest.mark.parametrize(
    "ttl", [1.5, 8.0], ids=["lease-ends-before-failover", "lease-outlasts-failover"]
)
async def test_failover_of_the_locks_master(
    failover_cluster: LocalCluster, clients: Clients, tag: str, ttl: float
) -> None:
    """Killing the master of a held lock never gives it to two holders unbeknownst to one.

    The lock's key has reached the replica; the master is killed. With a
    lease shorter than a failover, the holder is told it lost the lock
    (``LockLostError``) before the waiter on another client gets it. With a
    longer lease, the holder keeps it on the promoted replica (renewals go
    on there) and the waiter gets it only after the release. Either way the
    waiter acquires once the cluster is stable, its fence is above the
    holder's, and every error on the way is a redis-py error with a message.
    """
    cluster = failover_cluster
    clients.failover = True
    name, master, replica = await name_on_master_with_replica(cluster, tag)
    holder_client, waiter_client = clients(cluster), clients(cluster)
    holder = AsyncLock(holder_client, name, ttl=ttl, cancel_on_lost=True, fencing=True)
    waiter = AsyncLock(waiter_client, name, ttl=ttl, fencing=True)
    held, release_now, holder_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    outcome: list[str] = []
    fences: list[int | None] = []
    errors: list[BaseException] = []
    at_waiters_acquisition: list[tuple[bool, bool]] = []

    async def hold() -> None:
        try:
            async with holder:
                fences.append(holder.fence)
                held.set()
                await release_now.wait()
            outcome.append("released")
        except LockLostError as exc:
            outcome.append(f"lost: {exc}")
        finally:
            holder_done.set()

    async def wait() -> None:
        deadline = time.monotonic() + 40.0
        while True:
            try:
                acquired = await waiter.acquire(timeout=max(0.0, deadline - time.monotonic()))
            except (RedisError, RedisClusterException) as exc:
                # A command on the dead master: redis-py's error; the application retries.
                errors.append(exc)
                await asyncio.sleep(0.1)
                continue
            assert acquired, "the waiter never acquired the lock"
            at_waiters_acquisition.append((holder.lost, holder_done.is_set()))
            fences.append(waiter.fence)
            await waiter.release()
            return

    holding = asyncio.create_task(hold())
    waiting: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(held.wait(), 5.0)
        token = await holder_client.get(holder.key)
        reader = direct(replica)
        try:
            await reader.readonly()

            async def replicated() -> bool:
                return await reader.get(holder.key) == (
                    token.decode() if isinstance(token, bytes) else token
                )

            await eventually(replicated, "the key on the replica")
        finally:
            await reader.aclose()
        waiting = asyncio.create_task(wait())
        await asyncio.sleep(0.3)  # the waiter waits on the old master
        master.kill()
        await asyncio.to_thread(cluster.wait_until_stable, 30.0)
        assert cluster.node_for_key(holder.key) is replica

        if ttl < 2.0:
            # No failover completes within cluster-node-timeout (2 s): the lease ran out.
            await asyncio.wait_for(holder_done.wait(), 10.0)
            [told] = outcome
            assert told.startswith(f"lost: lock {name!r} was lost"), told
        else:
            promoted = direct(replica)
            try:
                last = int(await promoted.pttl(holder.key))
                assert last > 0, "the key did not survive the failover"

                async def renewed() -> bool:
                    # The PTTL only goes down between renewals, and jumps up at one.
                    nonlocal last
                    now, previous = int(await promoted.pttl(holder.key)), last
                    last = now
                    return now > previous + 100

                await eventually(renewed, "a renewal on the promoted replica", ttl)
            finally:
                await promoted.aclose()
            assert not holder.lost
            assert await holds_on_server(holder)
            assert not waiting.done(), "the waiter got the lock while it was held"
            release_now.set()
            await asyncio.wait_for(holding, 10.0)
            assert outcome == ["released"]
        await asyncio.wait_for(waiting, 30.0)
    finally:
        release_now.set()
        for task in (holding, waiting):
            if task is not None:
                task.cancel()
        await asyncio.gather(holding, *([waiting] if waiting else []), return_exceptions=True)

    # Lost or released: the holder knew before the waiter held the lock.
    [(lost, done)] = at_waiters_acquisition
    assert lost or done
    assert lost is (ttl < 2.0)
    [fence_before, fence_after] = fences
    assert fence_before is not None
    assert fence_after is not None
    assert fence_after > fence_before
    for exc in errors:
        assert type(exc).__module__.startswith("redis."), repr(exc)
        assert str(exc), repr(exc)


async def test_a_semaphore_on_every_master_keeps_its_limit(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """One Semaphore (limit 2) per master, 6 tasks on 2 clients each: 2 at once, never 3.

    Its sorted set, its queue and its entries share the name's slot: no
    CROSSSLOT, nothing left behind (the leak checks of ``clients``).
    """
    names = spread_names(cluster, tag, 1)
    made = [clients(cluster), clients(cluster)]
    most: Counter[str] = Counter()
    inside: Counter[str] = Counter()

    async def work(client: RedisCluster, name: str) -> None:
        semaphore = Semaphore(client, name, limit=2, ttl=5.0)
        for _ in range(5):
            async with semaphore:
                inside[name] += 1
                most[name] = max(most[name], inside[name])
                await asyncio.sleep(0.005)
                inside[name] -= 1

    await asyncio.gather(*(work(c, n) for n in names for c in made for _ in range(3)))
    assert dict(most) == dict.fromkeys(names, 2)
    for master in masters_of(cluster):
        assert_lock_commands_clean(master.port, await error_replies(master))


async def test_ls_and_inspect_see_the_names_held_on_every_master(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """Two names held on each master: ls (SCAN on every master) lists all six, inspect names them.

    A waiter queued on one of them is listed; release --force frees one on
    any master and grants its waiter there.
    """
    names = spread_names(cluster, tag, 2)
    client, other = clients(cluster), clients(cluster)
    locks = [AsyncLock(client, name, ttl=5.0, identity=f"holder-{name}") for name in names]
    for lock in locks:
        assert await lock.acquire()
    waiter = AsyncLock(other, names[-1], ttl=5.0, fair=True, identity="waiter")
    waiting = asyncio.create_task(waiter.acquire())
    try:
        await eventually(
            lambda: _waiters(client, names[-1]), "the waiter queued on the last master"
        )
        assert sorted([n async for n in held_names(client, f"{tag}:*")]) == sorted(names)
        assert [n async for n in held_names(client, f"{tag}:n?x")] == []
        rows, more = await held_rows(client, f"{tag}:*", DEFAULT_PREFIX, 6)
        assert not more
        assert [(r["name"], r["kind"], r["holders"], r["waiters"]) for r in rows] == sorted(
            (name, "lock", 1, int(name == names[-1])) for name in names
        )
        assert (await held_rows(client, f"{tag}:*", DEFAULT_PREFIX, 5))[1]  # (more than 5)
        for name in names:
            info = await aiolock.inspect(client, name)
            assert info is not None
            assert info.holders[0].identity == f"holder-{name}"
        done = await force_release(client, names[-1], "ops")
        assert (done.holders, done.granted) == ([f"holder-{names[-1]}"], 1)
        assert await asyncio.wait_for(waiting, 1.0)
        with pytest.raises(LockLostError, match="released by force by ops"):
            await locks[-1].release()
        await waiter.release()
    finally:
        await finish(waiting)
        for lock in locks[:-1]:
            await lock.release()
        for master in masters_of(cluster):  # (the forced release's mark, kept by design)
            admin = direct(master)
            try:
                for key in [k async for k in admin.scan_iter(match=f"*{tag}*:forced:*")]:
                    await admin.delete(key)
            finally:
                await admin.aclose()


async def _waiters(client: RedisCluster, name: str) -> bool:
    info = await aiolock.inspect(client, name)
    return info is not None and len(info.waiters) == 1


async def test_an_election_on_every_master_hands_over_and_is_observed(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """An Election per master: the term passes from a to b, observe() and leader() see it.

    The observers read the key and its PTTL in one pipeline on the name's
    slot, and listen to its sharded channel: no CROSSSLOT, nothing left.
    """
    names = spread_names(cluster, tag, 1)
    first, second = clients(cluster), clients(cluster)

    async def one(name: str) -> list[str | None]:
        seen: list[str | None] = []
        a = Election(first, name, ttl=2.0, identity="a")
        b = Election(second, name, ttl=2.0, identity="b")
        async with contextlib.aclosing(b.observe()) as changes:
            seen.append(await anext(changes))
            async with a.lead():
                seen.append(await anext(changes))
                assert await b.leader() == "a"
                waiting = asyncio.create_task(b.run(lambda term: b.leader()))
                await asyncio.sleep(0.05)
            seen.append(await waiting)
        return seen

    with anyio.fail_after(20):
        results = await asyncio.gather(*(one(name) for name in names))
    assert results == [[None, "a", "b"]] * len(names)
    for master in masters_of(cluster):
        assert_lock_commands_clean(master.port, await error_replies(master))


async def test_a_read_write_lock_on_every_master_keeps_readers_and_writers_apart(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """One ReadWriteLock per master; readers and writers on 2 clients: never together.

    Its hash, its queue and its entries share the name's slot: no
    CROSSSLOT, nothing left behind (the leak checks of ``clients``).
    """
    names = spread_names(cluster, tag, 1)
    made = [clients(cluster), clients(cluster)]
    readers: Counter[str] = Counter()
    writers: Counter[str] = Counter()
    bad: list[str] = []
    shared: Counter[str] = Counter()

    async def read(client: RedisCluster, name: str) -> None:
        rw = ReadWriteLock(client, name, ttl=5.0)
        for _ in range(5):
            async with rw.reader:
                readers[name] += 1
                shared[name] = max(shared[name], readers[name])
                if writers[name]:
                    bad.append(name)
                await asyncio.sleep(0.005)
                readers[name] -= 1

    async def write(client: RedisCluster, name: str) -> None:
        rw = ReadWriteLock(client, name, ttl=5.0)
        for _ in range(3):
            async with rw.writer:
                writers[name] += 1
                if writers[name] > 1 or readers[name]:
                    bad.append(name)
                await asyncio.sleep(0.005)
                writers[name] -= 1

    await asyncio.gather(
        *(read(c, n) for n in names for c in made for _ in range(3)),
        *(write(c, n) for n in names for c in made),
    )
    assert bad == []
    assert all(shared[n] > 1 for n in names), dict(shared)
    for master in masters_of(cluster):
        assert_lock_commands_clean(master.port, await error_replies(master))


# --- a slot migration ----------------------------------------------------------------------------


#: The primitives a migration is tried with, made on a client for a name (ttl 0.6 s).
MIGRATING_KINDS: Final[dict[str, Callable[[RedisCluster, str], Any]]] = {
    "AsyncLock": lambda c, name: AsyncLock(c, name, ttl=1.2),
    "Semaphore": lambda c, name: Semaphore(c, name, limit=1, ttl=1.2),
    "ReadWriteLock": lambda c, name: ReadWriteLock(c, name, ttl=1.2).writer,
}


async def command(admin: redis.Redis, *args: object) -> Any:
    """One raw command on a node (the cluster's own: CLUSTER SETSLOT, MIGRATE)."""
    return await admin.execute_command(*args)  # type: ignore[no-untyped-call]


async def migrate_slot(cluster: LocalCluster, key: str, *, hold: float) -> None:
    """Move ``key``'s slot to another master as a reshard does, slowly.

    ``MIGRATING`` on the source and ``IMPORTING`` on the target for ``hold``
    seconds with the keys still on the source; then ``MIGRATE`` of every key
    of the slot, ``hold`` seconds more; then ``SETSLOT NODE`` on both.
    """
    source = cluster.node_for_key(key)
    target = next(m for m in masters_of(cluster) if m is not source)
    slot = cluster.slot_for_key(key)
    a_source, a_target = direct(source), direct(target)
    try:
        source_id = await command(a_source, "CLUSTER", "MYID")
        target_id = await command(a_target, "CLUSTER", "MYID")
        await command(a_target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        await command(a_source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        await asyncio.sleep(hold)
        for moved in await command(a_source, "CLUSTER", "GETKEYSINSLOT", slot, 1000):
            await command(a_source, "MIGRATE", target.host, target.port, moved, 0, 5000)
        await asyncio.sleep(hold)
        for admin in (a_source, a_target):
            await command(admin, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    finally:
        await a_source.aclose()
        await a_target.aclose()


@pytest.mark.parametrize("kind", list(MIGRATING_KINDS))
async def test_a_held_lock_survives_its_slots_migration_and_a_waiter_gets_it_after(
    cluster: LocalCluster, clients: Clients, tag: str, kind: str
) -> None:
    """A holding renews through a 2.4 s migration of its slot (two leases); nothing is lost.

    While the slot migrates, a script whose declared keys are split between
    the nodes is refused (TRYAGAIN): the renewal scripts declare the lock's
    key alone, so they run wherever it is. Before, the renewals failed with
    redis-py's ``ClusterError`` ("TTL exhausted") and the holding was lost
    after one lease. A waiter of another client meanwhile has no verdict (its
    attempts are refused too): it waits, without an error, and gets the lock
    once the holder releases it on the new master.
    """
    name = f"{tag}:migrating"
    holder_client, waiter_client = clients(cluster), clients(cluster)
    make = MIGRATING_KINDS[kind]
    lock = make(holder_client, name)
    assert await lock.acquire()
    waiter = make(waiter_client, name)
    waiting = asyncio.create_task(waiter.acquire(timeout=20.0))
    try:
        await migrate_slot(cluster, key_of(name), hold=1.2)
        assert not lock.lost, "the holding was lost in the migration"
        assert await lock.owned()
        assert not waiting.done(), "the waiter got a lock that is still held"
        await lock.release()
        assert await asyncio.wait_for(waiting, 20.0)
        await waiter.release()
    finally:
        await finish(waiting)  # (a failure above: the waiter does not outlive the test)
        for held in (lock, waiter):
            if held.statistics().held:
                with contextlib.suppress(LockError):
                    await held.release()


# --- MultiLock across slots ----------------------------------------------------------------------


async def _multi_keys_left(cluster: LocalCluster, names: list[str]) -> list[str]:
    """The lock keys of ``names`` still on their masters."""
    left = []
    for n in names:
        admin = direct(cluster.node_for_key(key_of(n)))
        try:
            if await admin.exists(key_of(n)):
                left.append(n)
        finally:
            await admin.aclose()
    return left


async def test_multilocks_across_slots_in_opposite_orders_neither_deadlock_nor_overlap(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """3 clients take names on 3 masters in opposite orders, slot by slot: all finish, no overlap.

    Each name is in a slot of its own, so each acquisition takes three
    groups one after the other and gives back what it took when a later one
    is busy. An ``AsyncLock`` on one of the names is kept out meanwhile.
    """
    names = spread_names(cluster, tag, 1)
    sets = [names, list(reversed(names)), [names[2], names[0]]]
    inside = dict.fromkeys(names, 0)
    overlaps: list[str] = []
    rounds = 8

    async def worker(index: int) -> int:
        lock = MultiLock(clients(cluster), sets[index], ttl=5.0, timeout=30.0)
        assert len(lock.keys) == len(sets[index])
        for _ in range(rounds):
            async with lock:
                for n in sets[index]:
                    inside[n] += 1
                    overlaps.extend([n] if inside[n] > 1 else [])
                await asyncio.sleep(0.002)
                for n in sets[index]:
                    inside[n] -= 1
        return rounds

    async with asyncio.timeout(60):
        done = await asyncio.gather(*(worker(i) for i in range(3)))
    assert done == [rounds] * 3
    assert overlaps == []
    holder = MultiLock(clients(cluster), names, ttl=5.0)
    async with holder:
        assert not await AsyncLock(clients(cluster), names[1]).acquire(blocking=False)
    assert await _multi_keys_left(cluster, names) == []


async def test_a_multilock_waiting_across_slots_holds_none_of_its_names(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """The last slot's name held elsewhere: between attempts the waiter holds none of the others."""
    names = spread_names(cluster, tag, 1)
    multi = MultiLock(clients(cluster), names, ttl=5.0, notify=False, backoff=backoff.constant(0.5))
    last = multi.keys[-1].removeprefix(DEFAULT_PREFIX)[1:-1]  # the name taken last
    single = AsyncLock(clients(cluster), last, ttl=5.0)
    await single.acquire()
    waiting = asyncio.create_task(multi.acquire(timeout=10.0))
    try:
        await asyncio.sleep(0.1)  # its first attempt went out: it takes the others ...

        async def given_back() -> bool:
            return await _multi_keys_left(cluster, names) == [last]

        # ... and gives them back (on a loaded machine, later than 0.1 s); then, until its
        # next attempt (0.5 s on), it holds none of them.
        await eventually(given_back, "the first attempt to give the other names back", 3.0)
        for _ in range(5):
            assert await _multi_keys_left(cluster, names) == [last]
            await asyncio.sleep(0.02)
        assert not waiting.done()
        await single.release()
        assert await asyncio.wait_for(waiting, 5.0)
        assert await multi.owned()
        await multi.release()
    finally:
        await finish(waiting)
        if single.statistics().held:
            await single.release()
    assert await _multi_keys_left(cluster, names) == []


async def test_multilock_cancelled_at_random_moments_across_slots_leaves_no_key(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """30 acquisitions over 3 slots cancelled at random moments (half contended): no key left."""
    names = spread_names(cluster, tag, 1)
    client = clients(cluster)
    rival = AsyncLock(clients(cluster), names[2], ttl=5.0)
    rng = random.Random(77)

    async def one() -> None:
        async with MultiLock(client, names, ttl=5.0, backoff=backoff.constant(0.001)):
            await asyncio.sleep(rng.uniform(0, 0.002))

    await client.initialize()  # (the slot map loaded: the trials start with the attempt)
    for trial in range(30):
        if trial % 2:
            await rival.acquire()
        task = asyncio.create_task(one())
        await asyncio.sleep(rng.uniform(0, 0.006))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if rival.statistics().held:
            await rival.release()
        assert await _multi_keys_left(cluster, names) == [], f"trial {trial}"


async def test_multilock_across_slots_loses_the_whole_and_fences_every_name(
    cluster: LocalCluster, clients: Clients, tag: str
) -> None:
    """One fence above every name's, later fences above it; one key deleted loses the whole."""
    names = spread_names(cluster, tag, 1)
    client = clients(cluster)
    # One name's counter far above the clock's floor: its slot draws the largest fence,
    # and the other slots' counters must be raised to it.
    high = 4 * 10**15
    admin = direct(cluster.node_for_key(Keys(names[2]).fence))
    try:
        await admin.set(Keys(names[2]).fence, high)
    finally:
        await admin.aclose()
    before = [high]
    for n in names[:2]:
        single = AsyncLock(client, n, fencing=True)
        async with single:
            before.append(single.fence or 0)
    lost: list[MultiLock] = []
    multi = MultiLock(client, names, ttl=0.6, fencing=True, on_lost=lost.append)
    fences: list[int] = []

    async def hold() -> None:
        async with multi:
            fences.append(multi.fence or 0)
            admin = direct(cluster.node_for_key(key_of(names[1])))
            try:
                await admin.delete(key_of(names[1]))
            finally:
                await admin.aclose()
            await eventually(lambda: bool(lost), "the loss to be reported", timeout=3.0)

    with pytest.raises(LockLostError):
        await hold()
    fence = fences[0]
    assert fence > max(before)
    assert await _multi_keys_left(cluster, names) == []
    for n in names:
        single = AsyncLock(client, n, fencing=True)
        async with single:
            assert (single.fence or 0) > fence
