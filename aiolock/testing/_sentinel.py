"""A master with replicas watched by Sentinels, quick to fail over: :class:`SentinelGroup`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import aiolock.testing._resp as _resp  # (not `from . import`: no edge to the package)

from ._base import ServerLife
from ._replicated import ReplicatedServer
from ._server import RedisServer, start_all, stop_together
from ._wait import wait_until


@final
class SentinelGroup(ServerLife):
    """A master with replicas watched by Sentinels, tuned to fail over in seconds.

    Each sentinel is the server binary run with ``--sentinel`` and a
    configuration file in its own working directory (Sentinel rewrites it).
    The timings are short: the master counts as down after
    ``down_after_ms`` without an answer, and a stalled failover is retried
    after ``2 * failover_timeout_ms``, so killing the master gets a replica
    promoted in a few seconds.

    A killed data server that is restarted comes back empty; the sentinels
    then make it a replica of the current master (about 20 s later here:
    :meth:`wait_until_monitored` waits for it). A restarted sentinel starts
    again from its first configuration (it monitors the first master).

    Example:
        .. code-block:: python

            from aiolock.testing import SentinelGroup

            with SentinelGroup(replicas=1, sentinels=3) as group:
                # redis.asyncio.sentinel.Sentinel(group.sentinel_addresses)
                #     .master_for(group.service_name)
                new_master = group.failover_by_killing_master()

    Args:
        replicas: How many replicas (at least 1).
        sentinels: How many sentinels (at least 1).
        quorum: How many sentinels must agree that the master is down.
        service_name: The name the sentinels monitor the master under.
        down_after_ms: Sentinel ``down-after-milliseconds``.
        failover_timeout_ms: Sentinel ``failover-timeout``.
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for the master and the replicas.
        sentinel_config: Extra lines for every sentinel's configuration file.
        host: The address to bind and connect to.

    Raises:
        ValueError: A count is out of range (``quorum`` must be in
            ``1..sentinels``).
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        servers: The data servers: the first master, then the replicas. Which
            one is the master now is what :meth:`current_master` asks the
            sentinels.
        sentinels: The sentinels.
        service_name: The name the sentinels monitor the master under.
        quorum: The sentinel quorum.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        quorum: int = 2,
        service_name: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        binary: str | None = None,
        args: Sequence[str] = (),
        sentinel_config: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        if sentinels < 1:
            raise ValueError(f"sentinels must be at least 1, not {sentinels}")
        if not 1 <= quorum <= sentinels:
            raise ValueError(f"quorum must be in 1..{sentinels}, not {quorum}")
        if down_after_ms < 1 or failover_timeout_ms < 1:
            raise ValueError("down_after_ms and failover_timeout_ms must be positive")
        self._data = ReplicatedServer(replicas, binary=binary, args=args, host=host)
        self.servers: tuple[RedisServer, ...] = self._data.servers
        self.sentinels: tuple[RedisServer, ...] = tuple(
            RedisServer(binary=self._data.master.binary, args=("--sentinel",), host=host)
            for _ in range(sentinels)
        )
        self.service_name: str = service_name
        self.quorum: int = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._extra_config = tuple(sentinel_config)

    def __repr__(self) -> str:
        return (
            f"<SentinelGroup {self.service_name!r} servers={list(self.servers)!r} "
            f"sentinels={list(self.sentinels)!r}>"
        )

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The ``(host, port)`` of every sentinel, as ``redis.asyncio.sentinel.Sentinel`` takes."""
        return [(sentinel.host, sentinel.port) for sentinel in self.sentinels]

    def _sentinel_config(self, master: RedisServer) -> str:
        name = self.service_name
        lines = [
            f"sentinel monitor {name} {master.host} {master.port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}",
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
            *self._extra_config,
        ]
        return "\n".join(lines) + "\n"

    def start(self, *, timeout: float = 30.0) -> SentinelGroup:
        """Start the data servers and the sentinels and wait until they see each other.

        If anything fails, every process started so far is stopped.

        Args:
            timeout: Seconds allowed for each server to start, for replication,
                and for the sentinels to discover the replicas and each other.

        Returns:
            The group itself, for chaining.

        Raises:
            RuntimeError: The group is already running, a process did not
                start, or a wait timed out; the message ends with the last
                log lines.
        """
        return self._start(lambda: self._launch(timeout))

    def _any_running(self) -> bool:
        return any(server.running for server in (*self.servers, *self.sentinels))

    def _launch(self, timeout: float) -> None:
        self._data.start(timeout=timeout)
        config = self._sentinel_config(self._data.master)
        for sentinel in self.sentinels:
            sentinel.config = config
        start_all(self.sentinels, timeout)
        self.wait_until_monitored(timeout=timeout)

    def _running_sentinels(self) -> list[RedisServer]:
        running = [sentinel for sentinel in self.sentinels if sentinel.running]
        if not running:
            raise RuntimeError("no sentinel is running")
        return running

    def _server_on(self, port: int) -> RedisServer | None:
        return next((server for server in self.servers if server.port == port), None)

    def _reported_address(self, sentinel: RedisServer) -> tuple[str, int]:
        reply = _resp.call(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        if not (isinstance(reply, list) and len(reply) == 2):
            raise ValueError(f"sentinel {sentinel.port} knows no master {self.service_name!r}")
        host, port = reply
        if not (isinstance(host, bytes) and isinstance(port, bytes)):
            raise ValueError(f"sentinel {sentinel.port} replied {reply!r}")
        return host.decode(), int(port)

    def master_address(self) -> tuple[str, int]:
        """Return the master's ``(host, port)`` as the first sentinel that answers reports it.

        Returns:
            The address.

        Raises:
            RuntimeError: No sentinel answered.
        """
        errors: list[str] = []
        for sentinel in self._running_sentinels():
            try:
                return self._reported_address(sentinel)
            except (OSError, ValueError, _resp.ReplyError) as exc:
                errors.append(f"{sentinel.port}: {exc}")
        raise RuntimeError(f"no sentinel reported the master ({'; '.join(errors)})")

    def current_master(self) -> RedisServer:
        """Return the data server the sentinels report as the master.

        Returns:
            The server at :meth:`master_address`.

        Raises:
            RuntimeError: No sentinel answered, or the address is not one of
                :attr:`servers`.
        """
        host, port = self.master_address()
        server = self._server_on(port)
        if server is None:
            raise RuntimeError(f"the sentinels report a master {host}:{port} not of this group")
        return server

    def _agreed_master(self, sentinels: Sequence[RedisServer]) -> tuple[RedisServer | None, str]:
        """The master every sentinel reports, or ``None`` and why not."""
        ports = {sentinel.port: self._reported_address(sentinel)[1] for sentinel in sentinels}
        if len(set(ports.values())) != 1:
            return None, f"the sentinels disagree on the master port: {ports}"
        port = next(iter(ports.values()))
        master = self._server_on(port)
        if master is None or not master.running:
            return None, f"the sentinels report master port {port}, which is not running"
        role = _resp.info(master, "replication").get("role")
        if role != "master":
            return None, f"the reported master {port} has role {role}"
        return master, ""

    def wait_until_monitored(self, timeout: float = 30.0) -> None:
        """Wait until the sentinels agree on the master and see the replicas and each other.

        Every running sentinel must report the same running master, flag it
        ``master`` only (not down), know all the other sentinels, and list
        every other running data server as a replica of that master with its
        link ``ok``. After a failover this also waits until the remaining
        replicas follow the new master.

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: A process exited or the wait timed out; the message
                ends with the last log lines of the sentinels and servers.
        """
        sentinels = self._running_sentinels()
        servers = [server for server in self.servers if server.running]
        name = self.service_name

        def check() -> str | None:
            master, why = self._agreed_master(sentinels)
            if master is None:
                return why
            expected = {server.port for server in servers if server is not master}
            for sentinel in sentinels:
                state = _resp.fields(_resp.call(sentinel, "SENTINEL", "MASTER", name))
                if state.get("flags") != "master":
                    return f"sentinel {sentinel.port} flags the master {state.get('flags')}"
                others = int(state.get("num-other-sentinels", "0"))
                if others != len(self.sentinels) - 1:
                    return f"sentinel {sentinel.port} knows {others} other sentinel(s)"
                reply = _resp.call(sentinel, "SENTINEL", "REPLICAS", name)
                seen = {
                    int(fields["port"])
                    for fields in map(_resp.fields, reply if isinstance(reply, list) else [])
                    if fields.get("flags") == "slave"
                    and fields.get("master-link-status") == "ok"
                    and fields.get("master-port") == str(master.port)
                }
                if missing := sorted(expected - seen):
                    return f"sentinel {sentinel.port} does not see replica(s) {missing} yet"
            return None

        wait_until(
            check, what="sentinel monitoring", timeout=timeout, servers=[*servers, *sentinels]
        )

    def failover_by_killing_master(self, *, timeout: float = 30.0) -> RedisServer:
        """Kill the master with ``SIGKILL`` and wait until the sentinels promote a replica.

        Returns once every running sentinel reports the same new master, that
        server says ``role:master``, and (see :meth:`wait_until_monitored`)
        the remaining replicas follow it. The old master stays down; its data
        is lost.

        Args:
            timeout: Seconds to wait for the promotion, and again for the
                remaining replicas to follow.

        Returns:
            The new master.

        Raises:
            RuntimeError: No failover happened in time (the message ends with
                the sentinels' last log lines), or no sentinel is running.
        """
        old = self.current_master()
        old.kill()
        sentinels = self._running_sentinels()
        survivors = [server for server in self.servers if server.running]
        promoted: list[RedisServer] = []

        def check() -> str | None:
            master, why = self._agreed_master(sentinels)
            if master is None:
                return why
            promoted.append(master)
            return None

        wait_until(
            check,
            what=f"failover after killing the master on port {old.port}",
            timeout=timeout,
            servers=[*survivors, *sentinels],
            logs=[old],
        )
        self.wait_until_monitored(timeout=timeout)
        return promoted[-1]

    def stop(self) -> None:
        """Stop the sentinels, then the data servers, and remove their working directories."""
        stop_together(self.sentinels)
        self._data.stop()
