"""Tests for the topology builders of aiolock.testing: cluster, sentinel, replication.

Everything runs against real server processes started by the builders; each
test also checks that the builder leaves no process and no working directory
behind.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.crc
from support.timing import pid_gone

from aiolock import testing
from aiolock.testing import LocalCluster, RedisServer, ReplicatedServer, SentinelGroup

#: The servers' behaviour, not the loop's: on asyncio's loop only (see conftest.py).
pytestmark = pytest.mark.one_loop

TOPOLOGIES = [LocalCluster, ReplicatedServer, SentinelGroup]


# --- helpers -------------------------------------------------------------------------------------


def _children() -> set[int]:
    """The pids of this process's children, zombies included (empty without /proc)."""
    me = os.getpid()
    found: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended while we looked
        if len(fields) > 1 and int(fields[1]) == me:
            found.add(int(stat.parent.name))
    return found


class _Footprint:
    """The pids and working directories of servers, to check that nothing outlives a stop."""

    def __init__(self, servers: Iterable[RedisServer]) -> None:
        self.pids: list[int] = []
        self.dirs: list[str] = []
        for server in servers:
            assert server.pid is not None, f"{server!r} is not running"
            assert server.workdir is not None
            self.pids.append(server.pid)
            self.dirs.append(server.workdir)

    def assert_gone(self) -> None:
        alive = [pid for pid in self.pids if not pid_gone(pid)]
        assert alive == [], "server processes outlived stop()"
        left = [d for d in self.dirs if os.path.exists(d)]
        assert left == [], "working directories outlived stop()"


def _unique(prefix: str) -> str:
    return f"{prefix}:{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def no_orphans() -> Iterator[None]:
    """Every test ends with no child process it started."""
    before = _children()
    yield
    assert _children() - before == set(), "a child process outlived the test"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three masters, no replicas, built the default way (the cli when it is there)."""
    with LocalCluster(masters=3) as built:
        footprint = _Footprint(built.nodes)
        yield built
    footprint.assert_gone()


def _keys_on_each_master(cluster: LocalCluster, prefix: str) -> dict[int, str]:
    """One key per master: master port -> key."""
    wanted = {master.port for master in cluster.masters()}
    keys: dict[int, str] = {}
    for i in range(1000):
        key = f"{prefix}:{i}"
        keys.setdefault(cluster.node_for_key(key).port, key)
        if keys.keys() == wanted:
            return keys
    raise AssertionError("could not find a key for every master")


# --- API surface ---------------------------------------------------------------------------------


def test_builders_are_exported_and_documented() -> None:
    """The builders are in aiolock.testing.__all__ and every public member has a docstring."""
    for cls in TOPOLOGIES:
        assert cls.__name__ in testing.__all__
        assert (cls.__doc__ or "").strip()
        missing = [
            name
            for name, _ in inspect.getmembers(cls)
            if not name.startswith("_") and not (getattr(cls, name).__doc__ or "").strip()
        ]
        assert missing == [], cls.__name__


@pytest.mark.parametrize(
    "build",
    [
        lambda: LocalCluster(masters=0),
        lambda: LocalCluster(masters=2, use_cli=True),
        lambda: LocalCluster(node_timeout_ms=0),
        lambda: ReplicatedServer(replicas=0),
        lambda: SentinelGroup(sentinels=3, quorum=4),
        lambda: SentinelGroup(sentinels=0),
        lambda: SentinelGroup(down_after_ms=0),
    ],
)
def test_bad_sizes_are_value_errors(build: Callable[[], object]) -> None:
    """Impossible sizes are refused before any process starts."""
    with pytest.raises(ValueError, match=r"\w"):
        build()


def test_slot_for_key_matches_redis_py() -> None:
    """slot_for_key() gives the slot redis-py computes, hash tags included."""
    keys = ["foo", "{user1000}.following", "a{}b", "{}x", "x{y}z", "abc{", "{a}{b}", "ünï"]
    keys += [f"lock:{i}" for i in range(200)]
    for key in keys:
        assert LocalCluster.slot_for_key(key) == redis.crc.key_slot(key.encode()), key
    assert LocalCluster.slot_for_key(b"{tag}1") == LocalCluster.slot_for_key("x{tag}2")


# --- LocalCluster --------------------------------------------------------------------------------


def test_cluster_slots_are_spread_evenly(cluster: LocalCluster) -> None:
    """Three masters own 16384 slots in three contiguous, equal (+-1) ranges."""
    masters = cluster.masters()
    assert len(masters) == 3
    assert sorted(m.port for m in masters) == sorted(n.port for n in cluster.nodes)
    assert [cluster.node_for_slot(s) for s in (0, 5460, 5461, 10922, 10923, 16383)] == [
        masters[0],
        masters[0],
        masters[1],
        masters[1],
        masters[2],
        masters[2],
    ]
    for master in masters:
        assert cluster.replicas_of(master) == []
    assert cluster.startup_nodes == [(n.host, n.port) for n in cluster.nodes]
    assert cluster.urls[0] == cluster.url
    with pytest.raises(ValueError, match="slot"):
        cluster.node_for_slot(16384)


async def test_cluster_serves_keys_on_every_master(cluster: LocalCluster) -> None:
    """RedisCluster writes keys in three slots on three masters, and multi-key ops on a {tag}."""
    keys = _keys_on_each_master(cluster, _unique("spread"))
    assert len({cluster.slot_for_key(k) for k in keys.values()}) == 3
    client = redis.asyncio.RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        for port, key in keys.items():
            assert await client.set(key, str(port)) is True
        for port, key in keys.items():
            owner = redis.asyncio.Redis(port=port, decode_responses=True)
            try:
                assert await owner.get(key) == str(port)  # no MOVED: it lives there
            finally:
                await owner.aclose()

        tag = _unique("{acct}")
        a, b = f"{tag}:a", f"{tag}:b"
        assert await client.mset({a: "1", b: "2"}) is True
        assert await client.mget([a, b]) == ["1", "2"]
        script = "return redis.call('INCRBY', KEYS[1], 1) + redis.call('INCRBY', KEYS[2], 1)"
        assert await client.eval(script, 2, a, b) == 5
        assert await client.delete(a, b) == 2
        await client.delete(*keys.values())
    finally:
        await client.aclose()


async def test_cluster_sharded_pubsub(cluster: LocalCluster) -> None:
    """SSUBSCRIBE/SPUBLISH through redis.asyncio's cluster pub/sub reach channels on 3 masters."""
    channels = list(_keys_on_each_master(cluster, _unique("chan")).values())
    client = redis.asyncio.RedisCluster.from_url(cluster.url, decode_responses=True)
    await client.initialize()  # ClusterPubSub.ssubscribe needs the slot map loaded
    pubsub = client.pubsub()
    try:
        await pubsub.ssubscribe(*channels)
        confirmed: set[str] = set()
        received: dict[str, str] = {}
        deadline = time.monotonic() + 10
        while len(confirmed) < len(channels):
            assert time.monotonic() < deadline, f"subscriptions confirmed: {confirmed}"
            message = await pubsub.get_sharded_message(timeout=0.1)
            if message is not None and message["type"] == "ssubscribe":
                confirmed.add(message["channel"])
        for channel in channels:
            assert await client.spublish(channel, f"to {channel}") == 1
        while len(received) < len(channels):
            assert time.monotonic() < deadline, f"received: {received}"
            message = await pubsub.get_sharded_message(timeout=0.1)
            if message is not None and message["type"] == "smessage":
                received[message["channel"]] = message["data"]
        assert received == {channel: f"to {channel}" for channel in channels}
    finally:
        await pubsub.aclose()
        await client.aclose()


def test_cluster_with_replicas_by_hand_fails_over_and_stops_clean() -> None:
    """A hand-joined 3x2 cluster pairs replicas, replicates, fails over, and stops clean."""
    cluster = LocalCluster(masters=3, replicas_per_master=1, use_cli=False)
    with cluster:
        footprint = _Footprint(cluster.nodes)
        masters, replicas = list(cluster.nodes[:3]), list(cluster.nodes[3:])
        assert cluster.masters() == masters
        for master, replica in zip(masters, replicas, strict=True):
            assert cluster.replicas_of(master) == [replica]

        key = _keys_on_each_master(cluster, _unique("failover"))[masters[0].port]
        owner = redis.Redis(port=masters[0].port, socket_timeout=5)
        reader = redis.Redis(port=replicas[0].port, socket_timeout=5)
        try:
            owner.set(key, "v")
            assert owner.wait(1, 1000) == 1
            reader.readonly()
            assert reader.get(key) == b"v"
        finally:
            owner.close()
        try:
            masters[0].kill()
            cluster.wait_until_stable(timeout=20)
            assert cluster.node_for_key(key) is replicas[0]
            assert cluster.masters() == [replicas[0], *masters[1:]]
            assert reader.get(key) == b"v"
        finally:
            reader.close()
    footprint.assert_gone()  # the killed master included


# --- ReplicatedServer ----------------------------------------------------------------------------


async def test_wait_counts_the_replica_only_while_it_runs() -> None:
    """WAIT 1 -> 1 with the replica up, 0 while it is paused, 1 again after resume."""
    group = ReplicatedServer(replicas=1)
    with group:
        footprint = _Footprint(group.servers)
        client = redis.asyncio.Redis.from_url(group.url, decode_responses=True)
        replica = redis.asyncio.Redis.from_url(group.replicas[0].url, decode_responses=True)
        key = _unique("wait")
        try:
            await client.set(key, "1")
            assert await client.wait(1, 1000) == 1
            group.replicas[0].pause()
            await client.set(key, "2")
            started = time.monotonic()
            assert await client.wait(1, 200) == 0
            assert time.monotonic() - started >= 0.15
            group.replicas[0].resume()
            assert await client.wait(1, 1000) == 1
            assert await replica.get(key) == "2"
        finally:
            await client.aclose()
            await replica.aclose()
    footprint.assert_gone()


def test_wait_timeout_says_what_is_missing_with_log_tails() -> None:
    """A wait that times out raises RuntimeError naming the stage, the problem and the logs."""
    with ReplicatedServer(replicas=1) as group:
        group.replicas[0].pause()
        with pytest.raises(RuntimeError) as info:
            group.wait_until_synced(timeout=0.5)
        group.replicas[0].resume()
    message = str(info.value)
    assert message.startswith("replication: not reached within 0.5s (")
    assert f"--- 127.0.0.1:{group.replicas[0].port} ---" in message
    assert "<-> REPLICA sync" in message  # a line of the replica's log (MASTER or PRIMARY)


def test_two_replicas_one_paused_one_restarted() -> None:
    """With two replicas, WAIT counts only the running ones, and a restarted replica rejoins."""
    with ReplicatedServer(replicas=2) as group:
        before_restart = _Footprint(group.replicas[1:])
        client = redis.Redis.from_url(group.url, socket_timeout=5)
        try:
            client.set("k", "v")
            assert client.wait(2, 1000) == 2
            group.replicas[0].pause()
            client.set("k", "w")
            assert client.wait(2, 200) == 1
            group.replicas[0].resume()
            group.replicas[1].restart()
            before_restart.assert_gone()
            group.wait_until_synced(timeout=10)
            assert client.wait(2, 1000) == 2
        finally:
            client.close()
        footprint = _Footprint(group.servers)
    footprint.assert_gone()


# --- SentinelGroup -------------------------------------------------------------------------------


async def test_sentinel_failover_promotes_a_replica_master_for_follows() -> None:
    """master_for writes; the master is killed, a replica is promoted, master_for reaches it."""
    group = SentinelGroup(replicas=1, sentinels=3, quorum=2)
    with group:
        footprint = _Footprint([*group.servers, *group.sentinels])
        old = group.current_master()
        assert old is group.servers[0]
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            group.sentinel_addresses, socket_timeout=1
        )
        master = sentinel.master_for(group.service_name, socket_timeout=1, decode_responses=True)
        key = _unique("failover")
        try:
            await master.set(key, "before")
            assert await master.wait(1, 1000) == 1

            # The helper blocks; keep the loop free while it waits.
            new = await asyncio.to_thread(group.failover_by_killing_master, timeout=15)

            assert new is group.servers[1]
            assert not old.running
            assert group.master_address() == (new.host, new.port)
            assert await sentinel.discover_master(group.service_name) == (new.host, new.port)
            assert await master.get(key) == "before"  # reconnected to the new master
            await master.set(key, "after")
            direct = redis.asyncio.Redis.from_url(new.url, decode_responses=True)
            try:
                assert await direct.get(key) == "after"
                assert (await direct.info("replication"))["role"] == "master"
            finally:
                await direct.aclose()
        finally:
            await master.aclose()
            for client in sentinel.sentinels:
                await client.aclose()
    footprint.assert_gone()  # the killed master included


# --- failed builds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "ran"),
    [
        (lambda: LocalCluster(args=["--no-such-directive", "1"]), 1),
        (lambda: ReplicatedServer(args=["--no-such-directive", "1"]), 1),
        (lambda: SentinelGroup(sentinel_config=["sentinel no-such-directive 1"]), 2),
    ],
    ids=["cluster", "replicated", "sentinel"],
)
def test_failed_build_stops_what_it_started(
    build: Callable[[], LocalCluster | ReplicatedServer | SentinelGroup], ran: int
) -> None:
    """A build that fails raises with the server's error text and leaves no process behind."""
    topology = build()
    with pytest.raises(RuntimeError, match="no-such-directive"):
        topology.start(timeout=10)
    servers = topology.nodes if isinstance(topology, LocalCluster) else topology.servers
    assert not any(server.running for server in servers)
    assert all(server.workdir is None for server in servers)
    # The servers that ran (and failed, or were stopped) keep their last log lines.
    assert len([server for server in servers if server.log_tail(1)]) == ran
