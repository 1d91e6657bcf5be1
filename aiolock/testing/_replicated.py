"""A master with replicas on loopback: :class:`ReplicatedServer`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import aiolock.testing._resp as _resp  # (not `from . import`: no edge to the package)

from ._base import ServerLife
from ._server import RedisServer, stop_together
from ._wait import wait_until


def _online_replica_ports(replication: dict[str, str]) -> set[int]:
    """The ports of the replicas a master's ``INFO replication`` lists as ``online``."""
    ports: set[int] = set()
    for key, value in replication.items():
        if key.startswith("slave") and key[5:].isdigit():
            entry = dict(item.partition("=")[::2] for item in value.split(","))
            if entry.get("state") == "online":
                ports.add(int(entry.get("port", "0")))
    return ports


@final
class ReplicatedServer(ServerLife):
    """A master :class:`RedisServer` with replicas, all on loopback.

    :meth:`start` starts the master, then each replica with ``--replicaof``,
    and waits until every replica reports ``master_link_status:up`` and the
    master lists it ``online``. Each server is a :class:`RedisServer`, so a
    replica can be paused: while the only replica is paused, ``WAIT 1 100``
    on the master returns 0. A replica that is restarted replicates again.

    Example:
        .. code-block:: python

            from aiolock.testing import ReplicatedServer

            with ReplicatedServer(replicas=1) as group:
                print(group.url)  # the master
                group.replicas[0].pause()  # WAIT 1 <ms> now returns 0
                group.replicas[0].resume()

    Args:
        replicas: How many replicas (at least 1).
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for every server.
        host: The address to bind and connect to.

    Raises:
        ValueError: ``replicas`` is below 1.
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        master: The master.
        replicas: The replicas.
    """

    def __init__(
        self,
        replicas: int = 1,
        *,
        binary: str | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, not {replicas}")
        self._args = tuple(args)
        self.master: RedisServer = RedisServer(binary=binary, args=self._args, host=host)
        self.replicas: tuple[RedisServer, ...] = tuple(
            RedisServer(binary=self.master.binary, args=self._args, host=host)
            for _ in range(replicas)
        )

    def __repr__(self) -> str:
        return f"<ReplicatedServer master={self.master!r} replicas={list(self.replicas)!r}>"

    @property
    def servers(self) -> tuple[RedisServer, ...]:
        """The master, then the replicas."""
        return (self.master, *self.replicas)

    @property
    def url(self) -> str:
        """The ``redis://host:port`` URL of the master."""
        return self.master.url

    def start(self, *, timeout: float = 30.0) -> ReplicatedServer:
        """Start the master and the replicas and wait until replication is up.

        If anything fails, every server started so far is stopped.

        Args:
            timeout: Seconds allowed for each server to start, and for the
                replicas to be in sync.

        Returns:
            The group itself, for chaining.

        Raises:
            RuntimeError: The group is already running, a server did not
                start, or replication did not come up in time; the message
                ends with the servers' last log lines.
        """
        return self._start(lambda: self._launch(timeout))

    def _any_running(self) -> bool:
        return any(server.running for server in self.servers)

    def _launch(self, timeout: float) -> None:
        self.master.start(timeout=timeout)
        for replica in self.replicas:
            # Set now: the master may have moved to another port when it started.
            replica.args = (*self._args, "--replicaof", self.master.host, str(self.master.port))
            replica.start(timeout=timeout)
        self.wait_until_synced(timeout=timeout)

    def wait_until_synced(self, timeout: float = 30.0) -> None:
        """Wait until every running replica is linked to the master and listed ``online``.

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: A server exited or replication did not come up in
                time; the message ends with the servers' last log lines.
        """
        master = self.master
        replicas = [replica for replica in self.replicas if replica.running]

        def check() -> str | None:
            for replica in replicas:
                info = _resp.info(replica, "replication")
                link = info.get("master_link_status")
                if link != "up" or info.get("master_port") != str(master.port):
                    return f"replica {replica.port}: master_link_status={link}"
            online = _online_replica_ports(_resp.info(master, "replication"))
            missing = sorted(r.port for r in replicas if r.port not in online)
            if missing:
                return f"the master does not list replica(s) {missing} online"
            return None

        wait_until(check, what="replication", timeout=timeout, servers=[master, *replicas])

    def stop(self) -> None:
        """Stop every server and remove their working directories; idempotent."""
        stop_together(self.servers)
