"""A quorum of one-server leases: the lease of Redlock (docs/design.md, Beyond one server).

The algorithm is the one of the Redis documentation's page *Distributed Locks
with Redis*, with the node calls of a step sent to every node at once:

1. Note the monotonic time; the wait loop draws a fresh 128-bit token.
2. Send ``SET key token NX PX ttl`` to every node, each call cut off after
   ``node_timeout``.
3. The lock is held if a majority (``N // 2 + 1``) of the nodes granted it
   and some validity is left: ``ttl - elapsed - drift > 0``, where
   ``drift = ttl * 0.01 + 0.002`` allows for the nodes' clocks running fast.
4. Otherwise the token is deleted again from every node (a compare-and-delete
   script: only a key that holds this token is touched), and the wait loop
   tries again after a pause.

Renewal, release and the queries talk to every node at once as well, each
call bounded by ``node_timeout``. Each node is a
:class:`~aiolock._server_lease.ServerLease` without notifications; this lease only
counts their answers. It has no :class:`~aiolock._lease.Queueing` part
(:attr:`QuorumLease.queueing` is None): its waiters poll at their backoff
steps, and a release hands nothing over to a local waiter.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Final, cast, final

from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._checks import MAX_SECONDS, check_seconds, too_long, warn_long_ttl
from ._lease import NOT_HELD, Call, Extension, Reply, Unanswered
from ._queue import LocalQueue, queue_for
from ._server_lease import ServerLease
from ._types import Client

if TYPE_CHECKING:
    from ._timers import Cutoff

__all__ = ["MIN_TTL", "QuorumLease", "address", "drift"]

logger = logging.getLogger("aiolock")

#: The clock drift allowance of the Redlock specification: ``ttl * 0.01 + 2 ms``.
_DRIFT_FACTOR: Final = 0.01
_DRIFT_FLOOR: Final = 0.002
#: The smallest lease: the drift allowance alone is 2 ms.
MIN_TTL: Final = 0.01
#: A node call that was cut off and has not ended yet is cancelled again this often
#: (a cancellation swallowed inside redis-py, CPython gh-86296, must not let it run on
#: to redis-py's own socket timeout and retries).
_RECANCEL: Final = 0.05

_QUEUE_KEY: Final = "redlock"


def drift(ttl: float) -> float:
    """The clock drift allowance of a lease of ``ttl`` seconds."""
    return ttl * _DRIFT_FACTOR + _DRIFT_FLOOR


def address(client: Client) -> str:
    """The server a client talks to, for messages: ``host:port`` or the socket path."""
    if not isinstance(client, Redis):  # pragma: no cover - Redlock's nodes are plain clients
        return repr(client)
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _text(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value


#: A call to one node.
_Command = Callable[[ServerLease], Awaitable[object]]


class _NodeLate(RedisTimeoutError):
    """A node did not answer within ``node_timeout`` (redis-py's ``TimeoutError`` to callers)."""


async def _call(command: _Command, node: ServerLease) -> object:
    """Run one node call; an error is returned as a value (a failure of that node)."""
    try:
        return await command(node)
    except Exception as exc:
        return exc


@final
class QuorumLease:
    """A lock held on a majority of independent servers (see :class:`~aiolock._lease.Lease`)."""

    __slots__ = (
        "_node_timeout",
        "_nodes",
        "_queues",
        "fencing",
        "gone",
        "key",
        "name",
        "quorum",
        "span",
        "ttl",
    )

    #: No queue on a quorum: its waiters race (a queue would need one order on a majority),
    #: and poll after their backoff pause (no notifications). A release hands nothing over
    #: locally: the next local task contends after it.
    queueing: Final = None

    def __init__(self, nodes: Sequence[ServerLease], name: str, node_timeout: float) -> None:
        self._nodes = tuple(nodes)
        self.ttl = self._nodes[0].ttl
        self.span = self.counted(self.ttl)
        self.name = name
        self._node_timeout = node_timeout
        self.key = self._nodes[0].key
        #: How many nodes must agree: a majority.
        self.quorum = len(self._nodes) // 2 + 1
        self.fencing = False
        self.gone = "a majority of the nodes no longer held our key"
        # The tasks of this object wait here; the first one talks to the nodes.
        self._queues: dict[str, LocalQueue] = {}

    def check_ttl(self, value: object, name: str = "ttl") -> float:
        """Check a lease: a finite number of seconds >= 0.01, above ``node_timeout``."""
        return check_lease(value, self._node_timeout, name)

    def counted(self, ttl: float) -> float:
        """The holder counts the lease minus the drift allowance."""
        return ttl - drift(ttl)

    def queue(self, loop: asyncio.AbstractEventLoop) -> LocalQueue:
        """This lock object's own local queue (for ``loop``'s tasks)."""
        return queue_for(self._queues, _QUEUE_KEY, loop)

    def existing_queue(self) -> LocalQueue | None:
        """This lock object's local queue, if there is one (it may be idle)."""
        return self._queues.get(_QUEUE_KEY)

    # -- node calls --------------------------------------------------------------------

    async def _on_every_node(
        self, command: _Command, *, patient: bool, limit: float | None = None
    ) -> list[object]:
        """Run ``command(node)`` on every node at once, each within ``node_timeout``.

        ``limit`` (seconds), when given and shorter, bounds the calls instead.

        Returns one outcome per node, in order: the reply, or the exception
        the call raised (a node that did not answer in time gives a
        ``redis.exceptions.TimeoutError``). The calls run in tasks of their
        own, and never outlive this call. If the caller is cancelled
        meanwhile, the calls are let finish when ``patient`` (a ``SET`` or a
        delete, whose outcome matters), else cut off at once; then the
        cancellation is raised.
        """
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(_call(command, node)) for node in self._nodes]
        bound = self._node_timeout if limit is None else min(limit, self._node_timeout)
        deadline = time.monotonic() + bound
        interrupted: asyncio.CancelledError | None = None
        while pending := [t for t in tasks if not t.done()]:
            wait = deadline - time.monotonic()
            if wait <= 0:
                for task in pending:
                    task.cancel()
                wait = _RECANCEL
            try:
                # An anyio scope cancels again at every step: `pending` is recomputed.
                await asyncio.wait(pending, timeout=wait)
            except asyncio.CancelledError as exc:
                interrupted = interrupted or exc
                if not patient:
                    deadline = 0.0
        outcomes: list[object] = []
        for index, task in enumerate(tasks):
            if task.cancelled():
                outcomes.append(
                    _NodeLate(
                        f"Redlock node {index} ({address(self._nodes[index].wire.client)}) "
                        f"did not answer within node_timeout ({self._node_timeout:g} s)"
                        if bound == self._node_timeout
                        else f"did not answer within the call's cleanup budget ({bound:.3g} s)"
                    )
                )
            else:
                outcomes.append(task.result())
        if interrupted is not None:
            raise interrupted
        return outcomes

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Delete ``token``'s key from every node: finishes even if cancelled, bounded.

        Each node call is bounded by ``node_timeout``, and by ``call``'s
        cleanup budget when given.
        """
        limit = None if call is None else call.cleanup(self._node_timeout)
        if limit is not None and limit <= 0:
            logger.debug("no time left to clear an attempt on %r (the lease expires it)", self.name)
            return
        outcomes = await self._on_every_node(
            lambda node: node.delete(token), patient=True, limit=limit
        )
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            logger.debug(
                "could not clear an attempt on %r from %d node(s): %r (the lease expires it)",
                self.name,
                len(failed),
                failed[-1],
            )

    # -- acquire -----------------------------------------------------------------------

    async def attempt(self, deadline: float | None, queue_up: bool, call: Call) -> Reply:
        """One attempt on every node: ``(1, 0)`` if it won, else ``(0, -1 or NOT_HELD)``.

        A lost attempt, an interrupted one and one that every node failed
        are cleared from every node (a ``SET`` that timed out or failed may
        still have landed) before this returns or raises. The deadline is
        not used: every node call is bounded by ``node_timeout`` already
        (nor is ``queue_up``, which a lease without a queueing part is never
        given).

        Raises:
            Unanswered: every node failed, some by missing ``node_timeout``.
            Exception: every node failed with an error; the last node's.
        """
        ttl = self.ttl
        token = call.token
        call.attempts += 1
        sent = time.monotonic()
        try:
            outcomes = await self._on_every_node(lambda node: node.take(token), patient=True)
        except BaseException:
            await self.undo(token, call)
            raise
        elapsed = time.monotonic() - sent
        granted = sum(1 for o in outcomes if o is True)
        held_elsewhere = any(o is False for o in outcomes)
        if held_elsewhere:
            call.contended = True  # a node had another holder's key, even if we won
        validity = ttl - elapsed - drift(ttl)
        if granted >= self.quorum and validity > 0:
            return (1, 0)
        await self.undo(token)  # a lost attempt: routine, with a budget of its own
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if len(failed) == len(outcomes):
            late = [o for o in failed if isinstance(o, _NodeLate)]
            if late:
                # A node that was late (a busy event loop, say) may well be up.
                raise Unanswered(late[-1])
            raise failed[-1]
        if granted >= self.quorum:
            logger.debug(
                "lock %r: a majority granted it but the attempt took %.3f s of a %.3f s lease",
                self.name,
                elapsed,
                ttl,
            )
        # A node had another holder's key: held, for how long is not known.
        return (0, -1) if held_elsewhere else (0, NOT_HELD)

    # -- holding -----------------------------------------------------------------------

    async def release(self, token: str, cutoff: Cutoff) -> bool:
        """Delete our key from every node: True if a majority did, False if it was gone.

        Each node call is bounded by ``node_timeout``: ``cutoff`` is not used.

        Raises:
            redis.exceptions.RedisError: fewer than a majority deleted our key
                and failed nodes leave it open whether we still held it (the
                last failed node's error).
        """
        outcomes = await self._on_every_node(lambda node: node.delete(token), patient=True)
        deleted = sum(1 for o in outcomes if o is True)
        if deleted >= self.quorum:
            return True
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if deleted + len(failed) >= self.quorum:
            raise failed[-1]
        return False

    async def extend(self, token: str, ttl: float) -> bool:
        """Set the lease of ``token``'s key to ``ttl`` on every node that holds it.

        Returns True if a majority did so with validity left, False if the
        lock is lost for sure (too few nodes can still hold our key).

        Raises:
            Exception: failed nodes leave it open (the last one's error, or a
                ``redis.exceptions.TimeoutError`` if the validity ran out).
        """
        sent = time.monotonic()
        outcomes = await self._on_every_node(lambda node: node.extend(token, ttl), patient=False)
        verdict = self._extended(outcomes, ttl, time.monotonic() - sent)
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    def _extended(self, outcomes: Sequence[object], ttl: float, elapsed: float) -> bool | Exception:
        """What the nodes' ``outcomes`` of an extend to ``ttl`` that took ``elapsed`` s say.

        True: a majority extended, with validity left; False: too few nodes
        can still hold our key; else the error that leaves it open.
        """
        extended = sum(1 for o in outcomes if o is True)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if extended + len(failed) < self.quorum:
            return False
        if extended >= self.quorum:
            if ttl - elapsed - drift(ttl) > 0:
                return True
            return RedisTimeoutError(
                f"extending lock {self.name!r} took {elapsed:.3f} s, more than the "
                f"{ttl:g} s lease it asked for"
            )
        return failed[-1]

    def batch_key(self) -> Hashable:
        """The nodes' batch keys, in order: Redlocks over the same servers renew together."""
        return tuple(node.batch_key() for node in self._nodes)

    async def extend_many(self, batch: Sequence[Extension]) -> list[bool | Exception]:
        """Extend every item of ``batch`` with one call per node (see ``Lease.extend_many``).

        Each node renews its part of every item at once, within
        ``node_timeout``; each item is then judged on its own as
        :meth:`extend` judges one.
        """
        leases = [cast(QuorumLease, lease) for lease, _, _ in batch]  # (their batch key says so)
        where = {id(node): index for index, node in enumerate(self._nodes)}

        async def on(node: ServerLease) -> list[bool | Exception]:
            index = where[id(node)]
            parts = zip(leases, batch, strict=True)
            return await node.extend_many(
                [(lease._nodes[index], token, ttl) for lease, (_, token, ttl) in parts]
            )

        sent = time.monotonic()
        outcomes = await self._on_every_node(on, patient=False)
        elapsed = time.monotonic() - sent
        verdicts: list[bool | Exception] = []
        for item, lease in enumerate(leases):
            answers = [
                o if isinstance(o, Exception) else cast(list[object], o)[item] for o in outcomes
            ]
            verdicts.append(lease._extended(answers, batch[item][2], elapsed))
        return verdicts

    async def _values(self) -> list[object]:
        """GET the key on every node: one value (or None) per node that answered.

        Raises:
            Exception: every node failed (the last one's error).
        """
        outcomes = await self._on_every_node(lambda node: node.value(), patient=False)
        answered = [_text(o) for o in outcomes if not isinstance(o, Exception)]
        if not answered:
            failed = outcomes[-1]
            assert isinstance(failed, Exception)  # noqa: S101 - none answered
            raise failed
        return answered

    async def forced_by(self, token: str) -> str | None:
        """Who released ``token`` by force on one of the nodes (the first mark found), or None."""
        for node in self._nodes:
            try:
                forcer = await node.forced_by(token)
            except (RedisError, OSError):
                continue
            if forcer is not None:
                return forcer
        return None

    async def held(self) -> bool:
        """Whether one token is on a majority of the nodes (asks them).

        Raises:
            redis.exceptions.RedisError: every node failed (the last one's error).
        """
        counts = collections.Counter(v for v in await self._values() if v is not None)
        return any(n >= self.quorum for n in counts.values())

    async def holds(self, token: str) -> bool:
        """Whether ``token`` is on a majority of the nodes (asks them).

        Raises:
            redis.exceptions.RedisError: every node failed (the last one's error).
        """
        return sum(1 for v in await self._values() if v == token) >= self.quorum


def check_lease(value: object, node_timeout: float | None, name: str = "ttl") -> float:
    """Check a Redlock lease: seconds >= 0.01, at most ``MAX_SECONDS``, above ``node_timeout``."""
    ttl = check_seconds(name, value)
    assert ttl is not None  # noqa: S101 - allow_none is False
    if not math.isfinite(ttl) or ttl < MIN_TTL:
        raise ValueError(
            f"{name} must be a finite number of seconds >= {MIN_TTL} (Redlock allows "
            f"{_DRIFT_FLOOR} s of clock drift on top of 1%), got {value!r}"
        )
    if ttl > MAX_SECONDS:  # each node stores it as PX
        raise ValueError(too_long(name, value))
    if node_timeout is not None and ttl <= node_timeout:
        raise ValueError(
            f"{name} must be longer than node_timeout ({node_timeout!r} s), got {value!r}"
        )
    if name == "ttl":
        warn_long_ttl(ttl)
    return ttl
