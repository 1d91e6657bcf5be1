"""Release notifications: one shared pub/sub connection per client (and server).

A release with nobody queued publishes an empty message on
``<key>:released`` (``SPUBLISH`` on a cluster); a release that hands the lock
to a queued waiter publishes a grant (below). A task that waits for a lock
held elsewhere subscribes to that channel: a queued waiter then waits for
its grant, a polling one for a message or its backoff step, whichever comes
first (an expiring holder sends no message: the holder's lease as last
known bounds every wait).

Every lock of one client (and of the clients that connect alike) shares
one :class:`_Listener`: one dedicated connection (made like the client's
own, outside its pool) and one task that reads it. Subscriptions are
counted per channel; a channel nobody waits on is unsubscribed after
:data:`LINGER` seconds (so a queue of local waiters taking turns does not
churn), and the connection and its task end once no channel is left.
Nothing runs while nobody waits. The replies to (un)subscriptions come in
the order asked, and each answers the oldest request of its name: a channel
subscribed again while its unsubscription is on its way stays live, and
only an unsubscription nobody asked for (the server dropped the channel) is
taken for one. A waiter whose channel the listener no longer serves
subscribes again.

A waiter never depends on the listener for progress. If the connection
breaks, every waiter is woken at once and goes on polling with its backoff
policy; the listener reconnects with backoff, subscribes again, and wakes the
waiters once more (a release may have been missed meanwhile). If the server
refuses the subscription (``NOPERM``: a user without rights to the channel),
the listener logs one WARNING that names the right to grant, stops, and
waiters poll; it asks again after :data:`REFUSED_RETRY` seconds. A cluster
node without sharded pub/sub (``SSUBSCRIBE``: Redis 7.0, Valkey 7.2) is told
alike, with one WARNING that names the command and the version it needs.

Generations make missed wake-ups impossible: every event on a channel (a
release message, a confirmed subscription, a broken connection) bumps its
generation. A waiter notes the generation before each attempt and, if it
moved by the time it would sleep, tries again at once.

A *grant* (``g <token> <ms> <fence> <n>``: the lock was handed to the queued
waiter with that token, see :mod:`aiolock._scripts`) goes out on the grant
channel of the heir's process: each listener has a random :attr:`tag
<_Listener.tag>`, subscribes ``<channel>:<tag>`` with every channel, and a
queued waiter names the tag in its entry. So a grant wakes one process,
whatever the number of processes waiting. Only if nobody listens there (the
heir's process died) does it go out on the lock's channel, to everyone. A
grant is news only to the subscription that expects that token
(:meth:`Subscription.expect`), and bumps no generation: the other waiters
of the process do not wake; the channel notes how long the new holder's
first lease runs (:meth:`Subscription.holder_until`), which they read when
they wake. The last few grants are remembered, so that a waiter that
expects its token only after the message came still finds it.

Plain clients of one process that connect alike share their listeners
(:func:`listeners_of`): one pub/sub connection per server, whatever the
number of client objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, final

import anyio
import anyio.lowlevel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError, RedisError, ResponseError, SlotNotCoveredError

from ._channel import Channel, State, Subscription
from ._types import is_cluster

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from ._types import Client

__all__ = ["LINGER", "Subscription", "generation_in", "grant_tag", "listeners_of", "subscribe"]

logger = logging.getLogger("aiolock")

#: Seconds a channel stays subscribed after its last waiter left.
LINGER = 0.25
#: Seconds without any traffic after which the listener sends a PING.
IDLE_PING = 15.0
#: Seconds a subscription, or a PING, may go unanswered before the
#: connection counts as broken.
REPLY_BOUND = 2.0
#: Seconds a connection attempt may take.
CONNECT_BOUND = 2.0
#: The reconnection delays: the first, and the cap of the doubling.
RECONNECT_FIRST = 0.05
RECONNECT_CAP = 2.0
#: Seconds before a listener whose subscription the server refused asks again.
REFUSED_RETRY = 60.0

TASK_PREFIX = "aiolock-notify"


#: The WARNING for a cluster without sharded pub/sub was logged (once per process).
_told_unsupported = False


def _unknown_command(exc: Exception) -> bool:
    """Whether ``exc`` is the server's "unknown command" (one too old for it)."""
    return isinstance(exc, ResponseError) and str(exc).lower().startswith("unknown command")


def _connection_for(client: Client, channel: str) -> tuple[str, Any, dict[str, Any]]:
    """Return ``(listener id, connection class, kwargs)`` for ``channel`` on ``client``."""
    if is_cluster(client):
        node = client.get_node_from_key(channel)
        if node is None:
            raise LookupError(f"no cluster node serves {channel!r} yet")
        return node.name, node.connection_class, dict(node.connection_kwargs)
    pool = client.connection_pool
    return "", pool.connection_class, dict(pool.connection_kwargs)


@final
class _Listener:
    """One pub/sub connection and the task that reads it."""

    __slots__ = (
        "__weakref__",
        "_channels",
        "_confirmed",
        "_conn",
        "_connection_class",
        "_encoding",
        "_grants",
        "_heard",
        "_kwargs",
        "_pending",
        "_ping_sent",
        "_refused_until",
        "_sharded",
        "_task",
        "_warned",
        "_write_lock",
        "label",
        "loop",
        "tag",
    )

    def __init__(
        self, label: str, connection_class: Any, kwargs: dict[str, Any], sharded: bool
    ) -> None:
        self.label = label
        #: The event loop whose tasks it serves (it is made inside one).
        self.loop = asyncio.get_running_loop()
        self._connection_class = connection_class
        # A connection of its own, outside the pool: RESP2 (messages as plain
        # arrays), no socket timeout (it waits for messages), no hidden retries.
        kwargs.update(
            protocol=2,
            socket_timeout=None,
            socket_connect_timeout=kwargs.get("socket_connect_timeout") or CONNECT_BOUND,
            health_check_interval=0,
            retry=Retry(NoBackoff(), 0),
        )
        if "maint_notifications_config" in kwargs:
            # redis-py 8 refuses maintenance notifications on a RESP2 connection without
            # hiredis (a pure-Python install): this connection only reads pub/sub messages.
            kwargs["maint_notifications_config"] = None
        self._kwargs = kwargs
        self._sharded = sharded
        self._channels: dict[bytes, Channel] = {}
        #: The same channels by the name of their grant channel.
        self._grants: dict[bytes, Channel] = {}
        #: How many (un)subscribe requests of each name are unanswered on the connection.
        #: Replies come in the order asked: a reply answers the oldest request of its
        #: name, and only one that answers none is the server's own doing.
        self._pending: dict[bytes, int] = {}
        #: What names this listener's grant channels (``<channel>:<tag>``): random, so
        #: that a grant reaches the heir's process alone.
        self.tag = os.urandom(4).hex()
        self._conn: AbstractConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._ping_sent: float | None = None
        self._heard = time.monotonic()
        self._confirmed = False
        self._encoding = str(kwargs.get("encoding") or "utf-8")
        self._refused_until = 0.0  # the server refused our subscriptions until then
        self._warned = False  # the refusal was logged (once per listener)

    # -- waiters' side ------------------------------------------------------------------

    def refused(self) -> bool:
        """Whether the server refused this listener's subscriptions a short while ago."""
        return time.monotonic() < self._refused_until

    def generation(self, name: str) -> int | None:
        channel = self._channels.get(name.encode(self._encoding))
        return None if channel is None else channel.generation

    async def subscribe(self, name: str, seen: int | None) -> Subscription:
        raw = name.encode(self._encoding)
        channel = self._channels.get(raw)
        if channel is None:
            channel = self._channels[raw] = Channel(name, raw, self.tag.encode())
            self._grants[channel.grants] = channel
            seen = 0  # the confirmation will bump it: try again once subscribed
        elif seen is None:
            seen = -1  # it appeared since the attempt: something may have been missed
        channel.refs += 1
        subscription = Subscription(self, channel, seen)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"{TASK_PREFIX}:{self.label or 'client'}"
            )
        elif channel.state is State.NEW and self._conn is not None:
            channel.state = State.PENDING
            channel.since = time.monotonic()
            try:
                await self._send_channels(self._conn, "SUBSCRIBE", [channel])
            except BaseException:
                subscription.close()
                raise
        return subscription

    def serves(self, channel: Channel) -> bool:
        """Whether ``channel`` is still read here (the server may have dropped it)."""
        return self._channels.get(channel.raw) is channel

    def unref(self, channel: Channel) -> None:
        channel.refs -= 1
        if channel.refs == 0:
            channel.since = time.monotonic()

    # -- the listener task --------------------------------------------------------------

    def _command(self, verb: str) -> str:
        return f"S{verb}" if self._sharded else verb

    async def _send(self, conn: AbstractConnection, *args: Any) -> None:
        """Send one command on ``conn``; a failure breaks the connection (the reader sees it)."""
        await self._send_all(conn, [args])

    async def _send_all(self, conn: AbstractConnection, commands: list[tuple[Any, ...]]) -> None:
        """Send ``commands`` on ``conn`` in one write; a failure breaks the connection."""
        try:
            async with self._write_lock:
                await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except (RedisError, OSError) as exc:
            logger.debug("aiolock: pub/sub send failed: %r", exc)
            await conn.disconnect(nowait=True)

    async def _send_channels(
        self, conn: AbstractConnection, verb: str, channels: list[Channel]
    ) -> None:
        """(Un)subscribe ``channels`` and their grant channels.

        One command, or on a cluster one per channel in one write.

        A sharded command with channels of several slots fails with CROSSSLOT,
        and the channels of one node's listener may lie in many slots.
        """
        command = self._command(verb)
        raws = [raw for channel in channels for raw in (channel.raw, channel.grants)]
        pending = self._pending
        for raw in raws:
            pending[raw] = pending.get(raw, 0) + 1
        if self._sharded:
            await self._send_all(conn, [(command, raw) for raw in raws])
        else:
            await self._send(conn, command, *raws)

    async def _run(self) -> None:
        failures = 0
        try:
            while self._channels:
                self._confirmed = False
                conn = None
                try:
                    conn = self._connection_class(**self._kwargs)
                    with anyio.fail_after(CONNECT_BOUND):
                        await conn.connect()
                    self._conn = conn
                    self._ping_sent = None
                    self._heard = time.monotonic()
                    await self._subscribe_new(conn)
                    await self._read(conn)
                except NoPermissionError as exc:
                    self._refuse(exc)
                    return
                except Exception as exc:
                    if self._sharded and _unknown_command(exc):
                        self._unsupported()
                        return
                    if failures == 0 or self._confirmed:
                        logger.warning(
                            "aiolock: release notifications interrupted (%r); "
                            "waiters poll until the connection is back",
                            exc,
                        )
                finally:
                    self._conn = None
                    self._broken()
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.disconnect(nowait=True)
                if self._confirmed:
                    failures = 0  # it worked: the next break retries fast
                if self._channels:
                    await anyio.sleep(min(RECONNECT_CAP, RECONNECT_FIRST * 2**failures))
                    failures += 1
        finally:
            self._task = None
            self._conn = None
            self._broken()

    def _refuse(self, exc: NoPermissionError) -> None:
        """The server refused a subscription: waiters poll; ask again later."""
        self._refused_until = time.monotonic() + REFUSED_RETRY
        if self._warned:
            return
        self._warned = True
        channel = next(iter(self._channels.values()), None)
        name = channel.name if channel is not None else "<prefix>{<name>}:released"
        prefix = name.split("{", 1)[0]
        logger.warning(
            "aiolock: the server refused release notifications on %r (%s); waiters "
            "of this client's locks poll with their backoff policy instead. Grant "
            "the user the channel right (ACL SETUSER <user> &%s*), or make the "
            "locks with notify=False",
            name,
            exc,
            prefix,
        )

    def _unsupported(self) -> None:
        """A cluster node without sharded pub/sub: waiters poll; ask again later.

        Told once per process: it is a fact about the servers, not this client.
        """
        global _told_unsupported
        self._refused_until = time.monotonic() + REFUSED_RETRY
        if _told_unsupported:
            return
        _told_unsupported = True
        logger.warning(
            "aiolock: the cluster has no sharded pub/sub (SSUBSCRIBE is an unknown "
            "command), which release notifications on a cluster need (Redis 7.0 or "
            "later; Valkey 7.2 or later); waiters poll with their backoff policy "
            "instead. Upgrade the cluster, or make the locks with notify=False"
        )

    async def _subscribe_new(self, conn: AbstractConnection) -> None:
        new = [c for c in self._channels.values() if c.state is State.NEW]
        now = time.monotonic()
        for channel in new:
            channel.state = State.PENDING
            channel.since = now
        if new:
            await self._send_channels(conn, "SUBSCRIBE", new)

    def _broken(self) -> None:
        """The connection is gone: nothing is subscribed; wake every waiter to poll.

        Channels nobody waits on are forgotten at once: reconnecting is only
        worth it for waiters.
        """
        self._pending.clear()
        for channel in list(self._channels.values()):
            channel.state = State.NEW
            if channel.refs == 0:
                self._forget(channel)
            channel.bump()

    async def _read(self, conn: AbstractConnection) -> None:
        """Read pushed replies until no channel is wanted; raise when the connection fails."""
        while True:
            await self._drop_idle(conn)
            if not self._channels:
                return
            reply = await conn.read_response(
                disable_decoding=True, timeout=self._read_bound(), disconnect_on_error=True
            )
            if reply is None:
                await self._check_health(conn)
            else:
                self._heard = time.monotonic()
                self._ping_sent = None
                self._dispatch(reply)

    def _read_bound(self) -> float:
        """How long the next read may wait before some housekeeping is due."""
        now = time.monotonic()
        # At most LINGER: a channel whose last waiter leaves meanwhile (nothing on the
        # wire tells us) is then dropped within two LINGERs.
        bound = min(LINGER, self._heard + IDLE_PING - now)
        for channel in self._channels.values():
            if channel.state is State.PENDING:
                bound = min(bound, channel.since + REPLY_BOUND - now)
            if channel.refs == 0:
                bound = min(bound, channel.since + LINGER - now)
        if self._ping_sent is not None:
            bound = min(bound, self._ping_sent + REPLY_BOUND - now)
        return max(bound, 0.001)

    async def _check_health(self, conn: AbstractConnection) -> None:
        """A read timed out: raise if an answer is overdue; PING if the line was quiet."""
        now = time.monotonic()
        if self._ping_sent is not None and now - self._ping_sent >= REPLY_BOUND:
            raise TimeoutError("the pub/sub connection stopped answering")
        for channel in self._channels.values():
            if channel.state is State.PENDING and now - channel.since >= REPLY_BOUND:
                raise TimeoutError("the pub/sub connection stopped answering")
        if self._ping_sent is None and now - self._heard >= IDLE_PING:
            self._ping_sent = now
            await self._send(conn, "PING")

    async def _drop_idle(self, conn: AbstractConnection) -> None:
        """Forget channels nobody has wanted for :data:`LINGER` seconds; unsubscribe them."""
        now = time.monotonic()
        idle = [c for c in self._channels.values() if c.refs == 0 and now - c.since >= LINGER]
        if not idle:
            return
        for channel in idle:
            self._forget(channel)
            channel.bump()
        if self._channels:  # otherwise the connection is closed, which unsubscribes all
            asked = [c for c in idle if c.state is not State.NEW]
            if asked:
                await self._send_channels(conn, "UNSUBSCRIBE", asked)

    def _forget(self, channel: Channel) -> None:
        """Stop serving ``channel`` (and its grant channel)."""
        del self._channels[channel.raw]
        del self._grants[channel.grants]

    def _dispatch(self, reply: Any) -> None:
        """Handle one pushed reply."""
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = bytes(reply[0]).lower()
        name = reply[1]
        if not isinstance(name, bytes):
            return  # a PONG
        if kind in (b"message", b"smessage"):
            channel = self._grants.get(name) or self._channels.get(name)
            if channel is None:
                return  # news of a channel already forgotten
            payload = reply[2] if len(reply) > 2 else b""
            if isinstance(payload, bytes) and payload.startswith(b"g "):
                channel.granted(payload)
            else:
                channel.bump()
            return
        subscribed = kind in (b"subscribe", b"ssubscribe")
        if not subscribed and kind not in (b"unsubscribe", b"sunsubscribe"):
            return
        asked = self._pending.get(name, 0)
        if asked > 1:
            self._pending[name] = asked - 1
        elif asked == 1:
            del self._pending[name]
        channel = self._grants.get(name) or self._channels.get(name)
        if channel is None:
            return  # about a channel already forgotten
        if subscribed:
            # Both channels were asked for in this order: live once the second is, and
            # no request of it is left unanswered (a channel dropped and asked for
            # again meanwhile is live only once the new request is answered).
            if (
                channel.state is State.PENDING
                and name == channel.grants
                and name not in self._pending
            ):
                channel.state = State.LIVE
                self._confirmed = True
                channel.bump()
        elif not asked:
            # An unsubscribe that answers no request of ours: the server dropped the
            # channel (its slot moved, say). Its waiters poll; the next waiter
            # subscribes again.
            self._forget(channel)
            channel.bump()


_listeners: weakref.WeakKeyDictionary[Any, dict[str, _Listener]] = weakref.WeakKeyDictionary()
#: The listeners of plain clients that connect alike (the same server, database and
#: credentials), shared: a process with several client objects on one server reads each
#: release or grant once, on one pub/sub connection.
_alike: dict[tuple[Any, ...], dict[str, _Listener]] = {}
_SIMPLE = (str, bytes, int, float, bool, type(None))


def listeners_of(client: Client) -> dict[str, _Listener]:
    """Return the listeners of ``client`` by node (a lock keeps this dict for fast lookups).

    A plain client shares its listeners with every other plain client of the
    process that connects alike (same connection class and same simple
    connection options: host, port, path, database, credentials, timeouts).
    A cluster client has its own, one per node.
    """
    try:
        return _listeners[client]
    except KeyError:
        pass
    if is_cluster(client):
        home: dict[str, _Listener] = {}
    else:
        pool = client.connection_pool
        options = tuple(
            sorted((k, v) for k, v in pool.connection_kwargs.items() if isinstance(v, _SIMPLE))
        )
        home = _alike.setdefault((pool.connection_class, options), {})
    _listeners[client] = home
    return home


def _listener(client: Client, channel: str) -> _Listener:
    home = listeners_of(client)
    if is_cluster(client):
        node = client.get_node_from_key(channel)
        if node is None:
            raise LookupError(f"no cluster node serves {channel!r} yet")
        listener = home.get(node.name)
    else:
        listener = home.get("")
    loop = asyncio.get_running_loop()
    if listener is None or listener.loop is not loop:
        # (A listener of another event loop, one that ended, is of no use here.)
        label, connection_class, kwargs = _connection_for(client, channel)
        sharded = is_cluster(client)
        listener = home[label] = _Listener(label, connection_class, kwargs, sharded)
    return listener


def grant_tag(client: Client, channel: str) -> str:
    """The tag of the grant channel a waiter on ``channel`` will listen to ('' if none).

    A queued waiter writes it in its entry, so that its grant is published
    on ``<channel>:<tag>``, which only its process's listener reads. The
    listener is made here if need be (it connects when a waiter subscribes).
    """
    try:
        listener = _listener(client, channel)
    except (LookupError, SlotNotCoveredError):  # a cluster whose slot map is not loaded
        return ""
    return listener.tag


def generation_in(home: dict[str, _Listener], channel: str) -> int | None:
    """The generation of ``channel`` if this process is subscribed to it, else None.

    ``home`` is the client's listeners (see :func:`listeners_of`).
    """
    for listener in home.values():
        found = listener.generation(channel)
        if found is not None:
            return found
    return None


async def subscribe(client: Client, channel: str, seen: int | None) -> Subscription | None:
    """Subscribe to ``channel`` (or share the subscription); ``seen`` from :func:`generation_in`.

    Returns None when no listener can be made (a cluster that does not know
    the channel's node yet): the caller polls.
    """
    try:
        listener = _listener(client, channel)
    except (LookupError, SlotNotCoveredError):  # a cluster whose slot map is not loaded
        return None
    if listener.refused():
        return None
    return await listener.subscribe(channel, seen)
