"""A Redis/Valkey Cluster on loopback: :class:`LocalCluster`."""

from __future__ import annotations

import binascii
import subprocess
from collections.abc import Sequence
from typing import Final, NamedTuple, final

import aiolock.testing._resp as _resp  # (not `from . import`: no edge to the package)

from ._base import ServerLife
from ._binary import cluster_cli
from ._server import RedisServer, start_all, stop_together
from ._wait import wait_until

_CLUSTER_SLOTS: Final = 16384
_BAD_NODE_FLAGS: Final = frozenset({"fail", "fail?", "handshake", "noaddr"})


class _NodeEntry(NamedTuple):
    """One line of ``CLUSTER NODES``."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]


def _cluster_nodes(server: RedisServer) -> list[_NodeEntry]:
    entries = []
    for line in _resp.text(server, "CLUSTER", "NODES").splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        # <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
        address = fields[1].partition("@")[0]
        port = address.rpartition(":")[2]
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot being migrated or imported
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        entries.append(
            _NodeEntry(
                node_id=fields[0],
                port=int(port) if port.isdigit() else 0,
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=tuple(sorted(slots)),
            )
        )
    return entries


@final
class LocalCluster(ServerLife):
    """A Redis/Valkey Cluster of :class:`RedisServer` nodes on loopback.

    The ``masters`` masters get the 16384 slots in equal contiguous ranges
    (in node order); each gets ``replicas_per_master`` replicas. Nodes run
    with ``--cluster-enabled yes`` on ports <= 55535 (the bus listens on
    ``port + 10000``) and a short ``--cluster-node-timeout``.

    The cluster is created with ``<cli> --cluster create`` when a
    ``valkey-cli``/``redis-cli`` lies next to the server binary and there are
    at least 3 masters (the cli's minimum); otherwise it is joined by hand
    with ``CLUSTER ADDSLOTS``, ``CLUSTER MEET`` and ``CLUSTER REPLICATE``.
    Either way :meth:`start` returns only once :meth:`wait_until_stable` holds,
    about 2 s after the nodes started: a new master reports
    ``cluster_state:ok`` no sooner (the server's ``CLUSTER_WRITABLE_DELAY``).

    To fail a master over, kill it and wait: ``cluster.masters()[0].kill()``
    then ``cluster.wait_until_stable()`` returns once its replica serves its
    slots (after about ``node_timeout_ms`` and an election). A restarted node
    comes back empty and outside the cluster (its ``nodes.conf`` is gone).

    Example:
        .. code-block:: python

            import redis.asyncio as redis
            from aiolock.testing import LocalCluster

            with LocalCluster(masters=3) as cluster:
                client = redis.RedisCluster.from_url(cluster.url)
                owner = cluster.node_for_key("{user:1}:lock")  # a RedisServer

    Args:
        masters: How many masters (at least 1).
        replicas_per_master: How many replicas each master gets.
        node_timeout_ms: ``cluster-node-timeout``: how long a node may be
            unreachable before it counts as failed (and its replica takes over).
        use_cli: ``True`` to require the cli, ``False`` to join the cluster by
            hand, ``None`` (the default) to use the cli when it can be.
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for every node.
        host: The address to bind and connect to.

    Raises:
        ValueError: A count is out of range, or ``use_cli=True`` with fewer
            than 3 masters.
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        nodes: Every node: the masters first, then the replicas (as created;
            :meth:`masters` asks the cluster for the current roles).
        master_count: How many masters the cluster was built with.
        replicas_per_master: How many replicas each master was given.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 0,
        *,
        node_timeout_ms: int = 2000,
        use_cli: bool | None = None,
        binary: str | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        if masters < 1 or replicas_per_master < 0:
            raise ValueError("masters must be at least 1 and replicas_per_master at least 0")
        if use_cli and masters < 3:
            raise ValueError("the cli creates clusters of at least 3 masters")
        if node_timeout_ms < 1:
            raise ValueError(f"node_timeout_ms must be positive, not {node_timeout_ms}")
        node_args = (
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            *args,
        )
        first = RedisServer(binary=binary, args=node_args, host=host)
        count = masters * (1 + replicas_per_master)
        self.nodes: tuple[RedisServer, ...] = (
            first,
            *(
                RedisServer(binary=first.binary, args=node_args, host=host)
                for _ in range(count - 1)
            ),
        )
        self.master_count: int = masters
        self.replicas_per_master: int = replicas_per_master
        self._use_cli = use_cli
        self._ids: dict[int, str] = {}  # pid -> node id

    def __repr__(self) -> str:
        return f"<LocalCluster nodes={list(self.nodes)!r}>"

    @property
    def url(self) -> str:
        """The URL of the first node, enough for ``RedisCluster.from_url``."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        """The URL of every node."""
        return [node.url for node in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """The ``(host, port)`` of every node."""
        return [(node.host, node.port) for node in self.nodes]

    def _cli(self) -> str | None:
        if self._use_cli is False:
            return None
        cli = cluster_cli(self.nodes[0].binary)
        if self._use_cli and cli is None:
            raise RuntimeError(
                f"use_cli=True but no valkey-cli/redis-cli next to {self.nodes[0].binary}"
            )
        return cli if self.master_count >= 3 else None

    def start(self, *, timeout: float = 30.0) -> LocalCluster:
        """Start every node, create the cluster and wait until it is stable.

        If anything fails, every node started so far is stopped.

        Args:
            timeout: Seconds allowed for each node to start, for the cli, and
                for each wait.

        Returns:
            The cluster itself, for chaining.

        Raises:
            RuntimeError: The cluster is already running, a node did not
                start, the cli failed, or a wait timed out; the message ends
                with the last log lines.
        """
        return self._start(lambda: self._launch(timeout))

    def _any_running(self) -> bool:
        return any(node.running for node in self.nodes)

    def _launch(self, timeout: float) -> None:
        start_all(self.nodes, timeout)
        cli = self._cli()
        if cli is None:
            self._join_by_hand(timeout)
        else:
            self._create_with_cli(cli, timeout)
        self.wait_until_stable(timeout=timeout)

    def _create_with_cli(self, cli: str, timeout: float) -> None:
        argv = [
            cli,
            "--cluster",
            "create",
            *(f"{node.host}:{node.port}" for node in self.nodes),
            "--cluster-replicas",
            str(self.replicas_per_master),
            "--cluster-yes",
        ]
        try:
            done = subprocess.run(  # noqa: S603 - argv list, no shell; the cli next to the binary
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{cli} --cluster create took more than {timeout:g}s") from exc
        except OSError as exc:
            raise RuntimeError(f"cannot run {cli}: {exc}") from exc
        if done.returncode != 0:
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise RuntimeError(
                f"{cli} --cluster create failed with exit code {done.returncode}:\n{output}"
            )

    def _join_by_hand(self, timeout: float) -> None:
        masters = self.nodes[: self.master_count]
        for epoch, node in enumerate(self.nodes, start=1):
            _resp.call(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for index, node in enumerate(masters):
            first = index * _CLUSTER_SLOTS // self.master_count
            last = (index + 1) * _CLUSTER_SLOTS // self.master_count - 1
            _resp.call(node, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
        for index, node in enumerate(self.nodes):
            for other in self.nodes[index + 1 :]:
                _resp.call(node, "CLUSTER", "MEET", other.host, other.port)
        ids = {self._node_id(node) for node in self.nodes}

        def everyone_met() -> str | None:
            for node in self.nodes:
                known = {e.node_id for e in _cluster_nodes(node) if "handshake" not in e.flags}
                if missing := ids - known:
                    return f"node {node.port} does not know {len(missing)} node(s) yet"
            return None

        wait_until(everyone_met, what="cluster meet", timeout=timeout, servers=self.nodes)
        for index, replica in enumerate(self.nodes[self.master_count :]):
            master = masters[index % self.master_count]
            _resp.call(replica, "CLUSTER", "REPLICATE", self._node_id(master))

    def _node_id(self, node: RedisServer) -> str:
        pid = node.pid
        if pid is None:
            raise RuntimeError(f"{node!r} is not running")
        if pid not in self._ids:
            self._ids[pid] = _resp.text(node, "CLUSTER", "MYID")
        return self._ids[pid]

    def wait_until_stable(self, timeout: float = 30.0) -> None:
        """Wait until the running nodes agree on a complete, healthy cluster.

        Every running node must say ``cluster_state:ok``, know every other
        running node (not flagged failing or in handshake), and have the same
        slot map and the same master of each replica; all 16384 slots must be
        served by running nodes, and every running replica must have its
        replication link up. After a node was killed this waits for the
        failover to settle.

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: A node exited or the wait timed out; the message ends
                with the nodes' last log lines.
        """
        running = [node for node in self.nodes if node.running]

        def check() -> str | None:
            ids = {self._node_id(node): node for node in running}
            views: dict[int, frozenset[tuple[str, str | None, tuple[tuple[int, int], ...]]]] = {}
            replicas: list[RedisServer] = []
            for node in running:
                if "cluster_state:ok" not in _resp.text(node, "CLUSTER", "INFO"):
                    return f"node {node.port}: cluster_state is not ok"
                entries = _cluster_nodes(node)
                for entry in entries:
                    if entry.node_id in ids and entry.flags & _BAD_NODE_FLAGS:
                        flags = ",".join(sorted(entry.flags))
                        return f"node {node.port} flags node {entry.port} {flags}"
                    if "myself" in entry.flags and entry.master_id is not None:
                        replicas.append(node)
                if missing := ids.keys() - {entry.node_id for entry in entries}:
                    return f"node {node.port} does not know {len(missing)} node(s)"
                views[node.port] = frozenset((e.node_id, e.master_id, e.slots) for e in entries)
            if len(set(views.values())) > 1:
                return "the nodes disagree on the slot map or on the roles"
            view = next(iter(views.values()))
            served = sum(last - first + 1 for node_id, _, slots in view for first, last in slots)
            if served != _CLUSTER_SLOTS:
                return f"{served} of {_CLUSTER_SLOTS} slots are served"
            if orphans := {node_id for node_id, _, slots in view if slots} - ids.keys():
                return f"slots are served by {len(orphans)} node(s) not running"
            for replica in replicas:
                link = _resp.info(replica, "replication").get("master_link_status")
                if link != "up":
                    return f"replica {replica.port}: master_link_status={link}"
            return None

        wait_until(check, what="cluster state", timeout=timeout, servers=running, logs=self.nodes)

    def _entries(self) -> list[_NodeEntry]:
        """``CLUSTER NODES`` as the first running node that answers sees it."""
        errors: list[str] = []
        for node in self.nodes:
            if node.running:
                try:
                    return _cluster_nodes(node)
                except (OSError, ValueError, _resp.ReplyError) as exc:
                    errors.append(f"{node.port}: {exc}")
        raise RuntimeError(f"no cluster node answered CLUSTER NODES ({'; '.join(errors)})")

    def _on_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RuntimeError(f"the cluster names a node on port {port} that is not one of these")

    def masters(self) -> list[RedisServer]:
        """Return the nodes that serve slots now, ordered by their first slot.

        Returns:
            The masters as the first running node that answers sees them.

        Raises:
            RuntimeError: No node answered.
        """
        owners = sorted((e.slots[0], e.port) for e in self._entries() if e.slots)
        return [self._on_port(port) for _, port in owners]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """Return the replicas of a running master, as the cluster sees them now.

        Args:
            master: One of :attr:`nodes`.

        Returns:
            Its replicas, in node order.

        Raises:
            RuntimeError: ``master`` is not running, or no node answered.
        """
        master_id = self._node_id(master)
        ports = {e.port for e in self._entries() if e.master_id == master_id}
        return [node for node in self.nodes if node.port in ports]

    @staticmethod
    def slot_for_key(key: str | bytes) -> int:
        """Return the hash slot of a key, honouring ``{hash tags}``.

        Args:
            key: The key (a ``str`` is encoded as UTF-8).

        Returns:
            A slot in ``0..16383``.
        """
        data = key.encode() if isinstance(key, str) else key
        start = data.find(b"{")
        if start != -1:
            end = data.find(b"}", start + 1)
            if end > start + 1:
                data = data[start + 1 : end]
        return binascii.crc_hqx(data, 0) % _CLUSTER_SLOTS

    def node_for_slot(self, slot: int) -> RedisServer:
        """Return the master that serves a slot now.

        Args:
            slot: A slot in ``0..16383``.

        Returns:
            The node, as the first running node that answers sees it.

        Raises:
            ValueError: ``slot`` is out of range.
            RuntimeError: No node answered, or none serves the slot.
        """
        if not 0 <= slot < _CLUSTER_SLOTS:
            raise ValueError(f"slot must be in 0..{_CLUSTER_SLOTS - 1}, not {slot}")
        for entry in self._entries():
            if any(first <= slot <= last for first, last in entry.slots):
                return self._on_port(entry.port)
        raise RuntimeError(f"no node serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """Return the master that serves a key now (see :meth:`slot_for_key`).

        Args:
            key: The key.

        Returns:
            The node.

        Raises:
            RuntimeError: No node answered, or none serves the key's slot.
        """
        return self.node_for_slot(self.slot_for_key(key))

    def stop(self) -> None:
        """Stop every node and remove their working directories; idempotent."""
        stop_together(self.nodes)
        self._ids.clear()
