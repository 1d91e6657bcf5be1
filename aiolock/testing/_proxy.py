"""A TCP proxy that puts network faults between a client and a real server: :class:`FaultProxy`.

The proxy runs in the event loop of the code under test (asyncio or uvloop)
and is built on protocols and transports, so it needs no task per
connection: the only tasks are the short-lived upstream connects, which are
tracked and cancelled on close.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
from types import TracebackType
from typing import Final, cast, final

#: Seconds :meth:`FaultProxy.aclose` and :meth:`FaultProxy.reset_all` wait for each connection.
_CLOSE_TIMEOUT: Final = 5.0


class _Pipe:
    """One direction of a proxied connection: ordered, optionally delayed writes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._close_when_drained = False

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._pump()

    def send(self, data: bytes, delay: float) -> None:
        self._queue.append((self._loop.time() + max(0.0, delay), data))
        self._pump()

    def close_when_drained(self) -> None:
        """Close the destination once everything queued has been written."""
        self._close_when_drained = True
        self._pump()

    def abort(self) -> None:
        self._queue.clear()
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _pump(self) -> None:
        self._cancel_timer()
        transport = self.transport
        if transport is None:
            return  # not connected yet: keep everything queued
        if transport.is_closing():
            self._queue.clear()
            return
        now = self._loop.time()
        while self._queue and self._queue[0][0] <= now:
            transport.write(self._queue.popleft()[1])
        if self._queue:
            self._timer = self._loop.call_at(self._queue[0][0], self._pump)
        elif self._close_when_drained:
            transport.close()


class _Conn:
    """A client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        self.proxy = proxy
        self.client = client
        self.upstream: asyncio.Transport | None = None
        self.to_server = _Pipe(loop)
        self.to_client = _Pipe(loop)
        self.to_client.attach(client)
        self.held = proxy._hold_new
        self.held_chunks: list[bytes] = []
        #: The next reply on this connection is dropped and the connection reset.
        self.drop_next_reply = False
        #: The client subscribed on this connection (its replies may be delayed more).
        self.pubsub = False
        self.client_closed = loop.create_future()
        self.upstream_closed = loop.create_future()
        self.connect_task: asyncio.Task[None] | None = None

    @property
    def bytes_held(self) -> int:
        return sum(len(chunk) for chunk in self.held_chunks)

    # --- data --------------------------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        proxy = self.proxy
        if proxy._black_hole:
            return
        if not self.pubsub and b"SUBSCRIBE" in data.upper():
            self.pubsub = True
        if proxy._drops and not self.drop_next_reply:
            for pattern, left in list(proxy._drops.items()):
                if pattern in data:
                    self.drop_next_reply = True
                    if left > 1:
                        proxy._drops[pattern] = left - 1
                    else:
                        del proxy._drops[pattern]
                    break
        self.to_server.send(data, proxy._latency)

    def from_server(self, data: bytes) -> None:
        proxy = self.proxy
        if proxy._black_hole:
            return
        if self.drop_next_reply:
            # The server ran the command: its reply is lost, and the connection reset.
            self.drop_next_reply = False
            proxy.replies_dropped += 1
            self.abort()
            return
        if self.held:
            self.held_chunks.append(data)
            return
        proxy._replies_forwarded += 1
        delay = proxy._latency + (proxy._pubsub_delay if self.pubsub else 0.0)
        self.to_client.send(data, delay)

    def release(self) -> None:
        self.held = False
        chunks, self.held_chunks = self.held_chunks, []
        for chunk in chunks:
            self.proxy._replies_forwarded += 1
            self.to_client.send(chunk, self.proxy._latency)

    # --- life cycle --------------------------------------------------------------------------

    async def connect(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: _UpstreamProtocol(self), host, port)
        except OSError:
            # Could not reach the server: drop the client.
            self._no_upstream()
            return
        except asyncio.CancelledError:
            self._no_upstream()
            raise
        if self.client.is_closing():
            transport.abort()
            return
        self.upstream = transport
        self.to_server.attach(self.upstream)

    def _no_upstream(self) -> None:
        _set_done(self.upstream_closed)
        self.client.abort()
        self._maybe_forget()

    def _maybe_forget(self) -> None:
        if self.client_closed.done() and self.upstream_closed.done():
            self.proxy._all.discard(self)

    def client_lost(self) -> None:
        _set_done(self.client_closed)
        self.to_client.abort()
        self.held_chunks.clear()
        if self.connect_task is not None and not self.connect_task.done():
            self.connect_task.cancel()
        if self.upstream is not None:
            self.to_server.close_when_drained()
        self.proxy._conns.discard(self)
        self._maybe_forget()

    def upstream_lost(self) -> None:
        _set_done(self.upstream_closed)
        self.to_server.abort()
        # Deliver what the server sent before closing, unless it is held.
        self.held_chunks.clear()
        self.to_client.close_when_drained()
        self._maybe_forget()

    def abort(self) -> None:
        """Close both sides at once, with an RST where the platform allows it."""
        self.to_client.abort()
        self.to_server.abort()
        self.held_chunks.clear()
        if self.connect_task is not None and not self.connect_task.done():
            self.connect_task.cancel()
        for transport in (self.client, self.upstream):
            if transport is not None and not transport.is_closing():
                _set_linger_zero(transport)
                transport.abort()

    async def wait_closed(self) -> None:
        """Wait (up to ``_CLOSE_TIMEOUT`` seconds) until both sides and the connect are done."""
        waits: list[asyncio.Future[None]] = [self.client_closed]
        if self.upstream is not None:
            waits.append(self.upstream_closed)
        if self.connect_task is not None:
            waits.append(self.connect_task)
        # asyncio.wait() neither raises the futures' exceptions nor cancels them on timeout.
        await asyncio.wait(waits, timeout=_CLOSE_TIMEOUT)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_linger_zero(transport: asyncio.BaseTransport) -> None:
    """Make closing the socket send an RST instead of a FIN (best effort)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError, TypeError, NotImplementedError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, proxy: FaultProxy) -> None:
        self._proxy = proxy
        self._conn: _Conn | None = None

    def connection_made(self, base_transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base_transport)  # uvloop: not a subclass
        proxy = self._proxy
        if proxy._closing:
            transport.abort()
            return
        conn = _Conn(proxy, transport)
        self._conn = conn
        proxy._conns.add(conn)
        proxy._all.add(conn)
        task = asyncio.get_running_loop().create_task(
            conn.connect(proxy.upstream_host, proxy.upstream_port)
        )
        conn.connect_task = task

    def data_received(self, data: bytes) -> None:
        if self._conn is not None:
            self._conn.from_client(data)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost closes the other side

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._conn.client_lost()

    def pause_writing(self) -> None:
        if self._conn is not None and self._conn.upstream is not None:
            _pause(self._conn.upstream)

    def resume_writing(self) -> None:
        if self._conn is not None and self._conn.upstream is not None:
            _resume(self._conn.upstream)


class _UpstreamProtocol(asyncio.Protocol):
    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def data_received(self, data: bytes) -> None:
        self._conn.from_server(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn.upstream_lost()

    def pause_writing(self) -> None:
        _pause(self._conn.client)

    def resume_writing(self) -> None:
        _resume(self._conn.client)


def _pause(transport: asyncio.Transport) -> None:
    if not transport.is_closing():
        with contextlib.suppress(RuntimeError):
            transport.pause_reading()


def _resume(transport: asyncio.Transport) -> None:
    if not transport.is_closing():
        with contextlib.suppress(RuntimeError):
            transport.resume_reading()


@final
class FaultProxy:
    """A TCP proxy in front of a Redis/Valkey server, with faults to switch on and off.

    Point the client under test at :attr:`url` and keep a second client on
    the server itself for assertions. Each fault is one of the network's
    ways of losing an answer, for testing what code does on
    ``LockLostError``, in ``on_lost`` or when a call is cancelled:

    - :meth:`hold_replies` / :meth:`release_replies`: the server runs the
      commands, their replies wait (a slow or stalled network; the window
      between "the server ran it" and "the client heard it");
    - :meth:`drop_reply`: the server runs a command, its reply is lost and
      the connection reset (a load balancer restarting);
    - :meth:`black_hole`: nothing is forwarded either way (a partition);
    - :meth:`set_latency`, :meth:`delay_pubsub_replies`: everything, or the
      subscribed connections only, comes late;
    - :meth:`reset_all`: every connection is cut at once;
    - :meth:`pass_through`: back to forwarding as is.

    A fault applies to the connections that exist when it is set *and* to
    new ones, except :meth:`hold_replies`, which by default holds only the
    connections open at the time of the call.

    The proxy is asynchronous: start it (``async with``, or :meth:`start`
    and :meth:`aclose`) in the event loop that the client under test uses.
    The pytest plugin's ``aiolock_proxy`` fixture gives one, started, in
    front of the ``aiolock_server`` fixture's server.

    Example:
        .. code-block:: python

            from aiolock.testing import FaultProxy

            async with FaultProxy(server.host, server.port) as proxy:
                client = redis.asyncio.Redis.from_url(proxy.url)
                proxy.hold_replies()  # commands run, replies wait
                ...
                proxy.release_replies()

    Args:
        upstream_host: The server's address.
        upstream_port: The server's port.
        host: The address to listen on.

    Attributes:
        upstream_host: The server's address.
        upstream_port: The server's port.
        host: The address the proxy listens on.
        port: The port the proxy listens on (0 until started).
        replies_dropped: How many replies :meth:`drop_reply` dropped.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()  # connections whose client side is open
        self._all: set[_Conn] = set()  # every connection not yet fully closed (for aclose)
        self._latency = 0.0
        self._black_hole = False
        self._hold_new = False
        self._closing = False
        self._replies_forwarded = 0
        self._drops: dict[bytes, int] = {}
        self._pubsub_delay = 0.0
        self.replies_dropped = 0

    @property
    def url(self) -> str:
        """The ``redis://host:port`` URL to connect through the proxy."""
        return f"redis://{self.host}:{self.port}"

    async def start(self) -> FaultProxy:
        """Listen on a free port of :attr:`host` (sets :attr:`port`).

        Returns:
            The proxy itself, for chaining.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ClientProtocol(self), self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        """Stop listening and close every connection, both sides; nothing is left running."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        conns = list(self._all)
        for conn in conns:
            conn.abort()
        for conn in conns:
            await conn.wait_closed()
        self._all.clear()
        self._conns.clear()
        if self._server is not None:
            # Bounded: from Python 3.12 on this also waits for every accepted connection.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- modes ---------------------------------------------------------------------------------

    def pass_through(self) -> None:
        """Forward as is again: no latency, no drops, no black hole, held replies delivered."""
        self._latency = 0.0
        self._pubsub_delay = 0.0
        self._drops.clear()
        self._black_hole = False
        self.release_replies()

    def drop_reply(self, pattern: bytes, count: int = 1) -> None:
        """Lose the reply of the next ``count`` commands whose bytes contain ``pattern``.

        Each such command reaches the server, which runs it; its reply is
        dropped and the connection reset (an RST both ways), as when a load
        balancer restarts between the command and its reply. A client that
        retries sends the command again on a new connection.
        :attr:`replies_dropped` counts the replies lost so.

        Args:
            pattern: Bytes of the command as sent, e.g. ``b"EVALSHA"`` or a key.
            count: How many such commands lose their reply.
        """
        self._drops[pattern] = self._drops.get(pattern, 0) + count

    def delay_pubsub_replies(self, seconds: float) -> None:
        """Delay what the server sends on subscribed connections by ``seconds`` more.

        A connection counts as subscribed once its client sent ``SUBSCRIBE``
        (or ``SSUBSCRIBE``); replies to (un)subscriptions and messages alike
        come late, while other connections answer at once.

        Args:
            seconds: The extra delay.

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self._pubsub_delay = seconds

    def set_latency(self, seconds: float) -> None:
        """Delay every chunk forwarded in either direction by ``seconds`` (order is kept).

        Args:
            seconds: The delay each way.

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        self._latency = seconds

    def black_hole(self) -> None:
        """Accept connections and read from them, but forward nothing either way.

        Bytes read while in this mode are discarded, not delivered later.
        """
        self._black_hole = True

    async def reset_all(self) -> None:
        """Abort every open connection, both sides (an RST where it can), and wait until closed.

        New connections are still forwarded.
        """
        conns = list(self._all)
        for conn in conns:
            conn.abort()
        for conn in conns:
            await conn.wait_closed()

    def hold_replies(self, *, new_connections: bool = False) -> None:
        """Hold back what the server sends on the open connections, instead of delivering it.

        Client-to-server bytes are still forwarded, so the server runs the
        commands but the client gets no reply until :meth:`release_replies`
        (or :meth:`pass_through`). :attr:`bytes_held` says how much waits.

        Args:
            new_connections: Also hold replies on connections made later.
        """
        for conn in self._conns:
            conn.held = True
        self._hold_new = new_connections

    def release_replies(self) -> None:
        """Deliver every held reply and resume normal forwarding of replies."""
        self._hold_new = False
        for conn in list(self._conns):
            conn.release()

    @property
    def connections(self) -> int:
        """The number of client connections currently open."""
        return len(self._conns)

    @property
    def bytes_held(self) -> int:
        """The number of server-to-client bytes currently held back."""
        return sum(conn.bytes_held for conn in self._conns)

    @property
    def replies_forwarded(self) -> int:
        """How many server-to-client chunks have been passed on (queued for the client).

        With no latency a chunk counted here is already written to the client's
        socket, so a black hole set afterwards cannot stop the client reading it.
        """
        return self._replies_forwarded
