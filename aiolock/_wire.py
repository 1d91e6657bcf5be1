"""What aiolock sends to one server, and the one place redis-py's errors are translated.

Every command a lease sends goes through a :class:`Wire`: one per client,
over that client. Commands are sent raw (``SET``, ``EVALSHA``, ...), not
with redis-py's typed helpers: the same bytes on the wire without their
argument checks. Scripts are called by SHA and loaded on ``NOSCRIPT``.

**Sending once.** redis-py retries a command whose connection failed
(``retry=`` of the client; by default up to ten times). For most of
aiolock's commands that is harmless: an attempt, a renewal, a queue
entry's refresh or a leave answers the same when it runs twice (the
scripts recognise the caller's own token). A release or a hand-over does
not: run again after its reply was lost, it finds the lock already given
on and would report a loss that did not happen. So on a plain client
(``redis.asyncio.Redis``, Sentinel's ``master_for()`` included) the wire
sends each command itself on a connection of the client's pool, drives
the client's own retry policy (its ``Retry`` object: count and backoff),
and refuses to send a command marked ``once`` again after it may have
reached the server: it raises :class:`ReplyLost` instead, and the caller
finds out what happened. On a cluster client a ``once`` command is sent
to the key's node with redis-py's cluster retries off (``target_nodes``),
and a connection error is a :class:`ReplyLost` alike. A client made with
``single_connection_client=True`` is sent to through
``execute_command``, with redis-py's retries.

Sending the commands on the pool's connections also tells whether an
attempt can have reached the server at all (:class:`Trace`): an attempt
still waiting for a connection at its deadline is abandoned there, and
nothing needs undoing. (An instrumentation that wraps the client's
``execute_command`` does not see the commands of a plain client; aiolock's
own events and OpenTelemetry spans report them.)

**Translation.** On a connection the server reset, redis-py turns
``OSError`` into its ``ConnectionError``, but uvloop raises a bare
``RuntimeError("unable to perform operation on <TCPTransport closed=True
...>")`` instead, and CPython 3.13's selector transport an ``AttributeError``;
either would reach callers who catch ``RedisError``. Here both become
redis-py's ``ConnectionError``. A ``WRONGTYPE`` reply (a name used
by two kinds of primitive: an ``AsyncLock`` and a ``Semaphore`` on ``"x"``)
becomes a :class:`~aiolock.LockError` that names the kind holding the key. A
command the server's ACL refuses (``NOPERM``, or a script's "ACL failure")
stays redis-py's error, with a note that says where the rights aiolock
needs are listed.
redis-py's cluster client lets an ``AttributeError`` or ``KeyError`` of its
own escape while a slot migrates (a node it no longer knows); that becomes
redis-py's ``ClusterError``. Other errors pass unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any, Final, Protocol, cast, final

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._exceptions import LockError
from ._gate import AHEAD, Ahead, Gate, slots_of
from ._packing import REDIS_PACK, packed
from ._scripts import Script
from ._types import Client, is_cluster

__all__ = [
    "KINDS",
    "MIN_ALLOWANCE",
    "ReplyLost",
    "Trace",
    "Wire",
    "slot_ahead",
    "translated",
]

#: The least time an answer is given past a deadline, however fast the link has been.
MIN_ALLOWANCE: Final = 0.1
#: The most calls :meth:`Wire.run_each` sends in one pipeline (then the next, in turn): a
#: cluster's pipeline costs the client about a kilobyte a call while it is out, and a
#: renewal on a cluster is a call per slot.
PIPELINE_MOST: Final = 16
#: A pool with no connection free: the first pause before asking again, and the longest.
EXHAUSTED_FIRST = 0.001
EXHAUSTED_CAP = 0.05


class ReplyLost(RedisConnectionError):
    """A command that must not run twice lost its reply: it may or may not have run.

    Raised by :meth:`Wire.run` for a ``once`` command instead of sending it
    again; the caller asks the server what became of it. A subclass of
    redis-py's ``ConnectionError``, which is what the caller sees if it
    cannot find out.
    """


class Trace(Protocol):
    """What a sender is told: whether its command may have reached the server.

    ``reached`` is set once a command goes out on a connected socket; it
    stays False while the wire is still getting a connection. ``waiting``
    is True while the command waits in the process: for a slot of the
    client's share of its pool, or for a connection of an exhausted pool.
    """

    reached: bool
    waiting: bool


def translated(exc: BaseException, cluster: bool = False) -> BaseException:
    """redis-py's own error for what escapes it untranslated; else ``exc`` itself.

    uvloop's closed-transport ``RuntimeError``, and the ``AttributeError`` of
    CPython 3.13's selector transport written to after it closed, become a
    ``ConnectionError``; on a ``cluster`` client, an ``AttributeError`` or
    ``KeyError`` from inside redis-py (seen while a slot migrates) becomes a
    ``ClusterError``.
    """
    if (isinstance(exc, RuntimeError) and "unable to perform operation on" in str(exc)) or (
        isinstance(exc, AttributeError) and _raised_in(exc, "/asyncio/")
    ):
        # (CPython 3.13's selector transport, written to after it closed, fails with
        # "'NoneType' object has no attribute '_add_writer'".)
        error: BaseException = RedisConnectionError(
            f"the connection to the server was closed: {exc}"
        )
    elif cluster and isinstance(exc, AttributeError | KeyError) and _raised_in(exc, "/redis/"):
        error = ClusterError(f"redis-py's cluster client failed inside ({exc!r})")
    else:
        return exc
    error.__cause__ = exc
    return error


#: What may escape redis-py untranslated (:func:`translated` tells which ones it does).
STRAY: Final = (RuntimeError, AttributeError, KeyError)


@final
class Translating:
    """``with``: what escapes redis-py untranslated leaves as redis-py's own error.

    The one boundary where :func:`translated` is applied: uvloop's
    closed-transport ``RuntimeError`` and CPython 3.13's ``AttributeError``
    become a ``ConnectionError``, a cluster client's inner ``AttributeError``
    or ``KeyError`` a ``ClusterError``; anything else passes unchanged.
    """

    __slots__ = ("cluster",)

    def __init__(self, cluster: bool) -> None:
        self.cluster = cluster

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and isinstance(exc, STRAY):
            error = translated(exc, self.cluster)
            if error is not exc:
                raise error from None


def _raised_in(exc: BaseException, package: str) -> bool:
    """Whether ``exc`` was raised inside ``package`` (``"/redis/"``): its innermost frame's file."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return package in tb.tb_frame.f_code.co_filename.replace("\\", "/")


#: Which primitive makes a key of each type (``TYPE``): the lock's kind, in words.
KINDS: Final = {
    "string": "an AsyncLock (or a Redlock)",
    "zset": "a Semaphore",
    "hash": "a ReadWriteLock",
}

#: The note on a command the server refused to the client's user (ACL ``NOPERM``).
NO_PERMISSION: Final = (
    "aiolock: the server's ACL refused a command aiolock needs to this user; the rights "
    "each primitive needs are listed under 'Permissions' in docs/production.md"
)

#: The errors of redis-py's cluster client that mean "not run": sent again as usual.
_NOT_RUN: Final = (ClusterDownError,)


def _closed_by_peer(conn: Any) -> bool:
    """Whether ``conn``'s server closed or reset it already (nothing read is pending)."""
    reader = getattr(conn, "_reader", None)
    if reader is None:
        return False
    try:
        # asyncio's StreamReader: at_eof() and exception(), read without their calls.
        return reader._exception is not None or bool(reader._eof and not reader._buffer)
    except AttributeError:  # pragma: no cover - a reader of another make
        try:
            return bool(reader.at_eof() or reader.exception() is not None)
        except Exception:
            return False


def _exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says the pool has no connection free (redis-py's ``MaxConnectionsError``)."""
    return type(exc).__name__ == "MaxConnectionsError" or str(exc) == "Too many connections"


def _pool_args(pool: Any) -> tuple[str, ...]:
    """What ``pool.get_connection()`` needs: a command name before redis-py 5.3, else nothing."""
    try:
        parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    except (TypeError, ValueError):  # pragma: no cover - a pool without a signature
        return ()
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return ("EVALSHA",)
    return ()


@final
class Wire:
    """The commands of one client (a plain one or a cluster), errors translated.

    It also learns how long the link takes to answer (:meth:`observe`,
    :attr:`allowance`): an attempt in flight at its caller's deadline is
    awaited that long, so that a slow link is not taken for contention.
    """

    __slots__ = (
        "_direct",
        "_gate",
        "_pool_args",
        "_redis",
        "_rttvar",
        "_srtt",
        "allowance",
        "client",
        "cluster",
        "translating",
    )

    def __init__(self, client: Client) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        #: Around every call into redis-py: its untranslated errors made its own.
        self.translating = Translating(self.cluster)
        #: Commands go out on the pool's connections, sent by the wire itself.
        self._direct = not self.cluster and not getattr(client, "single_connection_client", False)
        #: The client as a plain one, for the direct path (only used where it is one).
        self._redis = cast(Redis, client)
        self._pool_args = _pool_args(self._redis.connection_pool) if self._direct else ()
        #: aiolock's share of the client's pool: its commands beyond it wait in the process.
        self._gate = Gate(slots_of(client))
        self._srtt = 0.0  # smoothed round trip, seconds
        self._rttvar = 0.0  # its smoothed deviation
        #: How long an answer may take on this link; None before the first one came.
        #: Twice the smoothed round trip plus four deviations, at least
        #: :data:`MIN_ALLOWANCE`. A client's first round trips include its
        #: connection's set-up, so the estimate starts high and comes down.
        self.allowance: float | None = None

    def observe(self, seconds: float) -> None:
        """Count one command's round trip (smoothed as TCP does, RFC 6298)."""
        if self.allowance is None:
            srtt = seconds
            rttvar = seconds / 2
        else:
            rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - seconds)
            srtt = 0.875 * self._srtt + 0.125 * seconds
        self._srtt = srtt
        self._rttvar = rttvar
        allowance = 2 * srtt + 4 * rttvar
        self.allowance = allowance if allowance > MIN_ALLOWANCE else MIN_ALLOWANCE

    def reachable(self) -> bool:
        """Whether the client has a connection to the server: connected, or in its handshake.

        False only when none of its pool's connections has a socket to the
        server (it is down, or nothing listens there): a command still
        waiting for a connection then cannot have reached it. Where the pool
        cannot be looked into (a cluster, an unknown pool), True.
        """
        if not self._direct:
            return True
        pool = cast(Redis, self.client).connection_pool
        try:
            connections = [*pool._in_use_connections, *pool._available_connections]
        except (AttributeError, TypeError):  # pragma: no cover - a pool of another make
            return True
        return any(c.is_connected for c in connections)

    async def ready(self) -> None:
        """Load a cluster's slot map before the first command (at once once loaded).

        A fresh ``RedisCluster`` that loads its slot map while many commands
        are in flight loses replies (redis-py 8.1).
        """
        if self.cluster:
            with self.translating:
                await self.client.initialize()

    async def ahead(self, task: asyncio.Task[Any]) -> Ahead:
        """Wait in line for a slot of the client, and keep it for ``task``'s next command.

        ``task`` is the calling task. The next command it sends through this wire goes out
        on that slot without waiting again; :meth:`Ahead.give_back` returns it
        if none did. A release waits so while its holding is still renewed:
        behind a crowd of other commands, its lease does not run out in line.
        """
        await self._gate.enter()
        ahead = Ahead(self._gate, task)
        ahead.reset = AHEAD.set(ahead)
        return ahead

    # -- sending -----------------------------------------------------------------------

    async def _send(
        self,
        args: tuple[Any, ...],
        *,
        key: str | None = None,
        once: bool = False,
        trace: Trace | None = None,
        urgent: bool = False,
    ) -> Any:
        """Send one command and return its reply: the only way out to the server.

        ``once``: never send it again after it may have reached the server
        (:class:`ReplyLost` instead). ``key``: the key it acts on (a
        ``WRONGTYPE`` reply names the kind that holds it; a cluster sends a
        ``once`` command to its node). ``trace`` is told when the command
        goes out. ``urgent``: first in line for a slot of the client (a renewal).
        """
        # (What Translating does, as an except clause: the hot path enters no context.)
        try:
            ahead = AHEAD.get()
            if (
                ahead is not None
                and not ahead.used
                and ahead.gate is self._gate
                and ahead.task is asyncio.current_task()
            ):
                ahead.used = True  # this command goes out on the slot taken ahead
            elif not self._gate.take():
                if trace is not None:
                    trace.waiting = True
                await self._gate.enter(urgent)
                if trace is not None:
                    trace.waiting = False
            try:
                if self._direct:
                    return await self._send_direct(args, once, trace)
                if trace is not None:
                    trace.reached = True  # not known: assume the worst
                if once and self.cluster and key is not None:
                    return await self._send_to_node(args, key)
                return await self.client.execute_command(*args)
            finally:
                self._gate.leave()
        except STRAY as exc:
            error = translated(exc, self.cluster)
            if error is not exc:
                raise error from None
            raise
        except ResponseError as exc:
            if isinstance(exc, NoPermissionError) or str(exc).startswith("ACL failure"):
                # (A script's refused command is a plain "ACL failure in script" error.)
                exc.add_note(NO_PERMISSION)
                raise
            if key is None or "WRONGTYPE" not in str(exc):
                raise
            raise await self.wrong_kind(key) from exc

    async def _send_direct(self, args: tuple[Any, ...], once: bool, trace: Trace | None) -> Any:
        """Send on a connection of the client's pool, under the connection's retry policy."""
        client = self._redis
        pool = client.connection_pool
        # The pool hands out a connected connection: a failure here sent nothing. A pool
        # that has none free (the application's commands took them) is waited for: the
        # caller's deadline bounds the wait, not an error.
        pause = EXHAUSTED_FIRST
        while True:
            try:
                conn = await pool.get_connection(*self._pool_args)  # type: ignore[no-untyped-call]
                break
            except RedisConnectionError as exc:
                if not _exhausted(exc):
                    raise
            if trace is not None:
                trace.waiting = True
            await anyio.sleep(pause)
            pause = min(pause * 2, EXHAUSTED_CAP)
        if trace is not None:
            trace.waiting = False
        sent = False

        async def do() -> Any:
            nonlocal sent
            if once and _closed_by_peer(conn):
                # (redis-py 8 hands out a pooled connection whose server went away, a
                # restart say, without a look; its first command fails. A command that
                # must not run twice goes out on a live connection, so that a failure
                # afterwards means the server may have run it.)
                await conn.disconnect()
            if not conn.is_connected:
                await conn.connect()  # a failure here sent nothing either
            sent = True
            if trace is not None:
                trace.reached = True
            frames = (
                packed(args, conn.encoder.encoding, conn.encoder.encoding_errors)
                if conn.__class__.pack_command is REDIS_PACK  # (not a subclass's own)
                else None
            )
            if frames is None:
                await conn.send_command(*args)
            else:
                await conn.send_packed_command(frames)
            return await client.parse_response(conn, args[0])

        async def fail(error: BaseException) -> None:
            nonlocal sent
            await conn.disconnect()
            if once and sent:
                raise ReplyLost(
                    f"the connection failed after {args[0]} was sent ({error}); "
                    "not sent again, since it must not run twice"
                ) from error
            sent = False

        try:
            return await conn.retry.call_with_retry(do, fail)
        finally:
            await pool.release(conn)

    async def _send_to_node(self, args: tuple[Any, ...], key: str) -> Any:
        """A ``once`` command on a cluster: to ``key``'s node, without the cluster's retries."""
        client = cast(RedisCluster, self.client)
        try:
            node = client.get_node_from_key(key)
        except Exception:  # no slot map yet: redis-py's own routing (and retries)
            node = None
        if node is None:
            return await client.execute_command(*args)
        try:
            return await client.execute_command(*args, target_nodes=node)
        except _NOT_RUN:
            return await client.execute_command(*args)  # not run: send it as usual
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise ReplyLost(
                f"the connection to {node.name} failed while {args[0]} was in flight ({exc}); "
                "not sent again, since it must not run twice"
            ) from exc

    # -- commands ----------------------------------------------------------------------

    async def set_nx(self, key: str, token: str, ms: int, trace: Trace | None = None) -> bool:
        """``SET key token NX PX ms``: whether it was set.

        Sent again on a connection error like any command: a ``SET`` that
        ran and lost its reply answers "not set" the second time, and the
        full attempt that follows finds the token its own.
        """
        return bool(await self._send(("SET", key, token, "NX", "PX", ms), trace=trace))

    async def run(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        once: bool = False,
        trace: Trace | None = None,
        urgent: bool = False,
    ) -> Any:
        """Run ``script`` by SHA (loading it on ``NOSCRIPT``); return its reply.

        If the server still does not know the script after loading it (a
        cluster client that loaded it on another node), the text is sent
        with ``EVAL``, which runs where the keys are. ``once`` and ``urgent``:
        see :meth:`_send` (a ``NOSCRIPT`` reply means it did not run); the
        load and what follows it are urgent.

        Raises:
            LockError: the key is of another kind of primitive (``WRONGTYPE``).
            ReplyLost: a ``once`` script may have run, and its reply was lost.
        """
        key = keys[0] if keys else None
        evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self._send(evalsha, key=key, once=once, trace=trace, urgent=urgent)
        except NoScriptError:
            # What follows goes first in line: the call had its turn already. (Behind
            # a crowd of releases that each met NOSCRIPT, a load in line would come
            # only after every one of them.)
            await self._send(("SCRIPT LOAD", script.text), urgent=True)
        send = functools.partial(self._send, key=key, once=once, trace=trace, urgent=True)
        try:
            return await send(evalsha)
        except NoScriptError:
            # Loaded, yet unknown where the key is: seen with redis-py 7.4's cluster
            # client after a failover. EVAL carries the text to the key's node.
            return await send(("EVAL", script.text, len(keys), *keys, *args))

    async def run_each(
        self,
        script: Script,
        calls: Sequence[tuple[tuple[str, ...], tuple[Any, ...]]],
        *,
        urgent: bool = False,
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` of ``calls``, in pipelines.

        One pipeline of at most :data:`PIPELINE_MOST` calls after another. A
        cluster sends each master its share of a pipeline in one write, every
        master at once, and resends on its own a call that met a redirection
        (a slot migrating). Returns each call's reply, or the error it met, in order.
        A ``NOSCRIPT`` reply means the call did not run: the script is
        loaded and those calls are sent again. The pipelines take one slot of
        the client (see :meth:`_send`). Only for scripts that may run twice.
        """
        replies: list[Any] = [None] * len(calls)
        with self.translating:
            await self._gate.enter(urgent)
            try:
                for start in range(0, len(calls), PIPELINE_MOST):
                    todo = list(range(start, min(start + PIPELINE_MOST, len(calls))))
                    await self._run_todo(script, calls, todo, replies)
            finally:
                self._gate.leave()
        return replies

    async def _run_todo(
        self,
        script: Script,
        calls: Sequence[tuple[tuple[str, ...], tuple[Any, ...]]],
        todo: list[int],
        replies: list[Any],
    ) -> None:
        """Run the calls ``todo`` of ``calls`` in one pipeline, their replies into ``replies``."""
        for round_ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                keys, args = calls[i]
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            answers = await pipe.execute(raise_on_error=False)
            for i, answer in zip(todo, answers, strict=True):
                replies[i] = answer
            todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
            if not todo or round_:
                break
            # (A cluster loads it on every master: the unknown ones are among them.)
            if self.cluster:
                await self.client.execute_command(
                    "SCRIPT LOAD", script.text, target_nodes=RedisCluster.PRIMARIES
                )
            else:
                await self.client.execute_command("SCRIPT LOAD", script.text)

    async def wrong_kind(self, key: str) -> LockError:
        """The error for a command that met ``key`` holding another kind of primitive."""
        try:
            found = await self.client.execute_command("TYPE", key)
        except Exception:  # the answer is only for the message
            found = "?"
        kind = found.decode() if isinstance(found, bytes) else str(found)
        what = KINDS.get(kind, f"a key of type {kind!r} that aiolock did not make")
        return LockError(
            f"the key {key!r} is in use by {what}: one name cannot serve two kinds of "
            "lock (give this one another name or prefix)"
        )

    async def run_then(
        self, script: Script, keys: tuple[str, ...], args: tuple[Any, ...], then: tuple[Any, ...]
    ) -> tuple[Any, Any]:
        """Run ``script``, then the command ``then`` on the same connection (one pipeline).

        ``WAIT`` counts the writes of its own connection: sent on another
        pooled connection it would return at once. (The script answers the
        same when run twice, so redis-py's retry of the pipeline is harmless.)
        """
        with self.translating:
            for _ in range(2):
                pipe = self.client.pipeline(transaction=False)
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                pipe.execute_command(*then)
                try:
                    first, second = await pipe.execute()
                except NoScriptError:  # a restarted or flushed server: load it, then again
                    await self._send(("SCRIPT LOAD", script.text))
                    continue
                return first, second
        raise NoScriptError(f"the script {script!r} could not be loaded")

    async def get(self, key: str) -> Any:
        """``GET key``.

        Raises:
            LockError: the key is of another kind of primitive (``WRONGTYPE``).
        """
        return await self._send(("GET", key), key=key)

    async def pexpire(self, key: str, ms: int) -> bool:
        """``PEXPIRE key ms``: whether the key was there."""
        return bool(await self._send(("PEXPIRE", key, ms)))

    async def pttl(self, key: str) -> int:
        """``PTTL key``: ms left, -1 without expiry, -2 when there is no key."""
        return int(await self._send(("PTTL", key)))

    async def delete(self, *keys: str) -> int:
        """``DEL keys``: how many were there (the keys of one slot, on a cluster)."""
        return int(await self._send(("DEL", *keys), key=keys[0]))

    async def exists(self, key: str) -> bool:
        """``EXISTS key``: whether the key is there."""
        return bool(await self._send(("EXISTS", key)))


def slot_ahead(
    lease: object, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]
) -> Awaitable[Ahead | None] | None:
    """For a release: a wait for a slot of the lease's client, its holding renewed meanwhile.

    Behind thousands of other commands of the client (a service releasing
    everything it holds at once), the release waits in the process's line
    with its holding still renewed, so that its lease does not run out in
    line. None when nothing is in line (the release goes out at once); else
    the wait, which gives the slot, or None when it was cancelled while it
    waited (the release goes on as it would have without it, and is
    cancelled at its end).
    """
    wire = getattr(lease, "wire", None)
    if not isinstance(wire, Wire) or not wire._gate.full(loop):  # (would a command wait?)
        return None
    return _wait_ahead(wire, task)


async def _wait_ahead(wire: Wire, task: asyncio.Task[Any]) -> Ahead | None:
    """Wait in line for a slot of ``wire`` for ``task``; None if cancelled meanwhile."""
    try:
        return await wire.ahead(task)
    except asyncio.CancelledError:
        return None
