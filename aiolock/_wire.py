"""What aiolock sends to one server, and the one place redis-py's errors are translated.

Every command a lease sends goes through a :class:`Wire`: one per client,
over that client. ``execute_command`` is looked up at each call, so that
an instrumentation that wraps it later (OpenTelemetry's) sees aiolock's
commands too. Commands are sent with
``execute_command``, not redis-py's typed helpers: the same bytes on the
wire without their argument checks, which cost as much as the rest of an
uncontended acquire. Scripts are called by SHA and loaded on ``NOSCRIPT``.

The translation: on a connection the server reset, redis-py turns
``OSError`` into its ``ConnectionError``, but uvloop raises a bare
``RuntimeError("unable to perform operation on <TCPTransport closed=True
...>")`` instead, which would reach callers who catch ``RedisError``. Here it
becomes redis-py's ``ConnectionError``. A ``WRONGTYPE`` reply (a name used
by two kinds of primitive: an ``AsyncLock`` and a ``Semaphore`` on ``"x"``)
becomes a :class:`~aiolock.LockError` that names the kind holding the key.
Other errors pass unchanged.
"""

from __future__ import annotations

from typing import Any, Final, final

from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from ._exceptions import LockError
from ._scripts import Script
from ._types import Client

__all__ = ["KINDS", "MIN_ALLOWANCE", "Wire", "translated"]

#: The least time an answer is given past a deadline, however fast the link has been.
MIN_ALLOWANCE: Final = 0.1


def translated(exc: RuntimeError) -> BaseException:
    """redis-py's ``ConnectionError`` for uvloop's closed-transport error, else ``exc``."""
    if "unable to perform operation on" in str(exc):
        error = RedisConnectionError(f"the connection to the server was closed: {exc}")
        error.__cause__ = exc
        return error
    return exc


#: Which primitive makes a key of each type (``TYPE``): the lock's kind, in words.
KINDS: Final = {
    "string": "an AsyncLock (or a Redlock)",
    "zset": "a Semaphore",
    "hash": "a ReadWriteLock",
}


@final
class Wire:
    """The commands of one client (a plain one or a cluster), errors translated.

    It also learns how long the link takes to answer (:meth:`observe`,
    :attr:`allowance`): an attempt in flight at its caller's deadline is
    awaited that long, so that a slow link is not taken for contention.
    """

    __slots__ = ("_rttvar", "_srtt", "allowance", "client", "cluster")

    def __init__(self, client: Client) -> None:
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
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

    async def ready(self) -> None:
        """Load a cluster's slot map before the first command (at once once loaded).

        A fresh ``RedisCluster`` that loads its slot map while many commands
        are in flight loses replies (redis-py 8.1).
        """
        if self.cluster:
            try:
                await self.client.initialize()
            except RuntimeError as exc:
                raise translated(exc) from None

    async def set_nx(self, key: str, token: str, ms: int) -> bool:
        """``SET key token NX PX ms``: whether it was set."""
        try:
            return bool(await self.client.execute_command("SET", key, token, "NX", "PX", ms))
        except RuntimeError as exc:
            raise translated(exc) from None

    async def run(self, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """Run ``script`` by SHA (loading it on ``NOSCRIPT``); return its reply.

        If the server still does not know the script after loading it (a
        cluster client that loaded it on another node), the text is sent
        with ``EVAL``, which runs where the keys are.

        Raises:
            LockError: the key is of another kind of primitive (``WRONGTYPE``).
        """
        try:
            try:
                return await self.client.execute_command(
                    "EVALSHA", script.sha, len(keys), *keys, *args
                )
            except NoScriptError:
                await self.client.execute_command("SCRIPT LOAD", script.text)
                try:
                    return await self.client.execute_command(
                        "EVALSHA", script.sha, len(keys), *keys, *args
                    )
                except NoScriptError:
                    # Loaded, yet unknown where the key is: seen with redis-py 7.4's
                    # cluster client after a failover (every renewal got NOSCRIPT and
                    # the lease ran out). EVAL carries the text to the key's node.
                    return await self.client.execute_command(
                        "EVAL", script.text, len(keys), *keys, *args
                    )
        except RuntimeError as exc:
            raise translated(exc) from None
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise await self.wrong_kind(keys[0]) from exc

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
        pooled connection it would return at once.
        """
        try:
            for _ in range(2):
                pipe = self.client.pipeline(transaction=False)
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                pipe.execute_command(*then)
                try:
                    first, second = await pipe.execute()
                except NoScriptError:  # a restarted or flushed server: load it, then again
                    await self.client.execute_command("SCRIPT LOAD", script.text)
                    continue
                return first, second
        except RuntimeError as exc:
            raise translated(exc) from None
        raise NoScriptError(f"the script {script!r} could not be loaded")

    async def get(self, key: str) -> Any:
        """``GET key``.

        Raises:
            LockError: the key is of another kind of primitive (``WRONGTYPE``).
        """
        try:
            return await self.client.execute_command("GET", key)
        except RuntimeError as exc:
            raise translated(exc) from None
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise await self.wrong_kind(key) from exc

    async def pexpire(self, key: str, ms: int) -> bool:
        """``PEXPIRE key ms``: whether the key was there."""
        try:
            return bool(await self.client.execute_command("PEXPIRE", key, ms))
        except RuntimeError as exc:
            raise translated(exc) from None

    async def pttl(self, key: str) -> int:
        """``PTTL key``: ms left, -1 without expiry, -2 when there is no key."""
        try:
            return int(await self.client.execute_command("PTTL", key))
        except RuntimeError as exc:
            raise translated(exc) from None

    async def exists(self, key: str) -> bool:
        """``EXISTS key``: whether the key is there."""
        try:
            return bool(await self.client.execute_command("EXISTS", key))
        except RuntimeError as exc:
            raise translated(exc) from None
