"""The lease of a MultiLock: the locks of several names, held as one.

A :class:`MultiLease` is a :class:`~aiolock._lease.Lease` over the ordinary
lock keys of several names (``<prefix>{<name>}`` each, as ``AsyncLock``
keeps them), so a ``MultiLock`` and an ``AsyncLock`` on a shared name
exclude each other. Its names fall into *groups*: on one server, one group
of them all; on a cluster, one group per hash slot, in the order of the
slots (names in a group by name). That order is the same for every
``MultiLock`` of the cluster.

* An attempt takes each group with one script (``MULTI_ACQUIRE``): every
  key free, then every key set to the token with the lease, or nothing at
  all. Groups are taken one after the other, in order; if one is busy, the
  groups taken before it are given back before the attempt answers. So a
  waiter holds none of its names while it waits, and two ``MultiLock`` s
  over the same names can never wait for each other.
* A release, an undo and the give-back free each group's keys that hold the
  token (``MULTI_RELEASE``) and announce each release on the name's channel.
* A renewal extends every key with the lock's own ``EXTEND_MANY`` script,
  one call per group (the holdings of one client due together share the
  calls: :meth:`MultiLease.extend_many`). A key found no longer ours loses
  the whole holding: its other keys are given back at once.
* Fencing: every name's fencing counter moves to one fence, greater than
  every fence any of the names had before (see ``MULTI_ACQUIRE``); across
  slots, the counters of the groups taken first are raised to the largest
  group's fence (``MULTI_FENCE``) before the acquisition counts.

It never stands in a queue on the server: a failed attempt leaves nothing
behind, and its waiter polls with its backoff policy, woken early by the
release of the name that kept it out longest (:attr:`MultiLease.queueing`
is the lease itself, for the subscription; it queues nobody). Waiters of an
ordinary lock queued on one of the names go first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, Self, cast, final

from redis.crc import key_slot
from redis.exceptions import ClusterError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _notify
from ._cancel import run_shielded
from ._checks import check_ttl, to_ms
from ._keys import keys_for
from ._lease import CLEANUP_BOUND, Call, Extension, Reply, Unanswered
from ._queue import LocalQueue, existing_queue, queue_for
from ._scripts import (
    EXTEND_MANY,
    MULTI_ACQUIRE,
    MULTI_FENCE,
    MULTI_RELEASE,
    renewals,
)
from ._site import site_of
from ._timers import Cutoff
from ._wire import ReplyLost

if TYPE_CHECKING:
    from ._keys import Keys
    from ._types import Client

__all__ = ["MultiLease", "order"]

logger = logging.getLogger("aiolock")

#: The key of a MultiLock's local queue in its lease's own dict.
_QUEUE_KEY: Final = "multi"
#: How a MultiLock's renewals share calls: one batch per client.
_BATCH: Final = "multi"


@final
class _Group:
    """The names of one hash slot (all of them, on one server), as the scripts take them."""

    __slots__ = ("acquire_keys", "channels", "fences", "locks", "slot")

    def __init__(self, slot: int | None, keys: Sequence[Keys]) -> None:
        self.slot = slot
        #: The lock keys, in order.
        self.locks = tuple(k.lock for k in keys)
        #: Each name's lock key, queue and fencing counter: MULTI_ACQUIRE's keys.
        self.acquire_keys = tuple(key for k in keys for key in (k.lock, k.queue, k.fence))
        self.channels = tuple(k.channel for k in keys)
        self.fences = tuple(k.fence for k in keys)


def order(names: Sequence[str], prefix: str, cluster: bool) -> list[list[Keys]]:
    """The names' keys in groups, in the order a MultiLock takes them.

    One group on one server; on a cluster, one per hash slot, by slot
    number. Names within a group are sorted.
    """
    keys = [keys_for(n, prefix) for n in sorted(names)]
    if not cluster:
        return [keys]
    slots: dict[int, list[Keys]] = {}
    for k in keys:
        slots.setdefault(key_slot(k.lock.encode()), []).append(k)
    return [slots[slot] for slot in sorted(slots)]


def _extended(answer: object) -> bool | Exception:
    """One holding's outcome from its keys' ``EXTEND_MANY`` replies (or the call's error)."""
    if isinstance(answer, Exception):
        return answer
    replies = cast(list[int], answer)
    if any(int(r) == 0 for r in replies):
        return False
    if any(int(r) == -1 for r in replies):
        return ResponseError("the server could not renew this holding now (its slot migrating?)")
    return True


@final
class MultiLease:
    """The locks of several names held as one (see the module and :class:`Lease`)."""

    __slots__ = (
        "_cleanup",
        "_groups",
        "_listeners",
        "_ms",
        "_noted_channel",
        "_queues",
        "_seen_channel",
        "_sharded",
        "_site",
        "accepts_grants",
        "fencing",
        "foreign_without_expiry",
        "gone",
        "key",
        "keys",
        "name",
        "names",
        "refresh_every",
        "span",
        "ttl",
        "wire",
    )

    def __init__(
        self,
        client: Client,
        names: Sequence[str],
        prefix: str,
        ttl: float,
        *,
        notify: bool = True,
        fencing: bool = False,
    ) -> None:
        site = site_of(client)
        self._site = site
        self.wire = site.wire
        grouped = order(names, prefix, self.wire.cluster)
        self._groups = tuple(
            _Group(key_slot(g[0].lock.encode()) if self.wire.cluster else None, g) for g in grouped
        )
        #: Every name's keys, in the order they are taken.
        self.keys: tuple[Keys, ...] = tuple(k for g in grouped for k in g)
        #: The names, in the order they are taken.
        self.names = tuple(sorted(names))
        self.name = ", ".join(self.names)
        self.key = self.keys[0].lock
        self.fencing = fencing
        self.ttl = self.span = ttl
        self._ms = to_ms(ttl)
        self._cleanup = min(ttl, CLEANUP_BOUND)
        self._sharded = "1" if self.wire.cluster else "0"
        self.gone = "the key of one of its names was gone or held by another holder"
        self._queues: dict[str, LocalQueue] = {}
        self._listeners = site.listeners if notify else None
        #: The channel of the name that kept the latest attempt out longest.
        self._seen_channel: str | None = None
        #: The channel whose generation :meth:`generation` noted last.
        self._noted_channel: str | None = None
        # The waiting side (it never queues on the server: see the module).
        self.accepts_grants = False
        self.foreign_without_expiry = True
        self.refresh_every = ttl

    # -- what the engine reads ---------------------------------------------------------

    @property
    def queueing(self) -> Self:
        """The lease itself: it queues nobody, but its waiters hear releases."""
        return self

    @property
    def groups(self) -> int:
        """How many calls an attempt takes at most: one per hash slot of the names."""
        return len(self._groups)

    def check_ttl(self, value: object, name: str = "ttl") -> float:
        """Check a lease: a finite number of seconds, at least 1 ms."""
        return check_ttl(value, name)

    def counted(self, ttl: float) -> float:
        """The holder counts the whole lease (from when it sent the first command)."""
        return ttl

    def queue(self, loop: asyncio.AbstractEventLoop) -> LocalQueue:
        """This object's own local queue (for ``loop``'s tasks)."""
        return queue_for(self._queues, _QUEUE_KEY, loop)

    def existing_queue(self) -> LocalQueue | None:
        """This object's local queue, if there is one (it may be idle)."""
        return existing_queue(self._queues, _QUEUE_KEY)

    # -- acquire -----------------------------------------------------------------------

    async def attempt(self, deadline: float | None, queue_up: bool, call: Call) -> Reply | None:
        """Take every group in order: ``(1, fence)``, or ``(0, pttl)`` with nothing held.

        ``pttl`` is how long the name that kept us out longest stays held
        (its holder's ``PTTL``). An attempt still in flight at the deadline
        is awaited as long as the link needs (per group), and never past the
        lease it asks for; then it is cut off (None). Whatever interrupts the
        attempt (cancellation, an error, the cut-off), every key that may
        hold the token is given back before this returns or raises.
        (``queue_up`` is not used: nobody queues.)

        Raises:
            LockError: a name is in use by another kind of primitive.
            Unanswered: the cluster kept redirecting (a slot migrating).
        """
        wire = self.wire
        if wire.cluster:
            await wire.ready()
        token = call.token
        call.attempts += 1
        call.reached = False
        call.waiting = False
        sent = time.monotonic()
        reply: Reply | None = None
        try:
            if deadline is None:
                reply = await self._take(token, call)
            else:
                when = sent + self.span
                if wire.allowance is not None:
                    link = max(deadline, sent) + wire.allowance * len(self._groups)
                    when = min(when, link)
                with Cutoff(when, call.task, call.spare, lend=True) as cutoff:
                    reply = await self._take(token, call)
                if cutoff.expired:
                    reply = None
        except ClusterError as exc:
            await self.undo(token, call)
            raise Unanswered(exc) from exc
        except BaseException:
            if call.reached:
                await self.undo(token, call)
            raise
        if reply is None:
            call.unanswered = time.monotonic() - sent
            # Cut off: past the deadline the call is ending, and this is its cleanup;
            # before it (a lease shorter than the wait), a routine undo.
            if call.reached:
                ending = deadline is not None and time.monotonic() >= deadline
                await self.undo(token, call if ending else None)
            return None
        wire.observe((time.monotonic() - sent) / len(self._groups))
        return reply

    async def _take(self, token: str, call: Call) -> Reply:
        """The groups, one after the other; the ones taken are given back if one is busy."""
        wire = self.wire
        fencing = "1" if self.fencing else "0"
        fences: list[int] = []
        for taken, group in enumerate(self._groups):
            args = (token, self._ms, fencing, self._sharded, *group.channels)
            reply = await wire.run(MULTI_ACQUIRE, group.acquire_keys, args, trace=call)
            code = int(reply[0])
            if code == -1:
                raise await wire.wrong_kind(group.locks[int(reply[1]) - 1])
            if code == 0:
                self._seen_channel = group.channels[int(reply[2]) - 1]
                call.contended = True
                if taken:
                    await self._give_back(token, self._groups[:taken])
                return (0, int(reply[1]))
            fences.append(int(reply[1]))
        fence = max(fences)
        if self.fencing and len(self._groups) > 1:
            for group, drawn in zip(self._groups, fences, strict=True):
                if drawn < fence:
                    await wire.run(MULTI_FENCE, group.fences, (fence,))
        return (1, fence)

    async def _give_back(self, token: str, groups: Sequence[_Group]) -> int:
        """Free the keys of ``groups`` that hold ``token``: how many did.

        Each group's script is sent once; if its reply is lost, it is sent
        again, and the keys it finds no longer ours count as freed by the
        first (see ``ServerHolding._release_once``).
        """
        freed = 0
        for group in groups:
            args = (token, self._sharded, *group.channels)
            try:
                freed += int(await self.wire.run(MULTI_RELEASE, group.locks, args, once=True))
            except ReplyLost as lost:
                again = int(await self.wire.run(MULTI_RELEASE, group.locks, args))
                if not again:
                    logger.info(
                        "the reply to the release of %r was lost (%s); the keys were no "
                        "longer ours when asked again, so the release had run",
                        self.name,
                        lost.__cause__ or lost,
                    )
                    again = len(group.locks)
                freed += again
        return freed

    async def undo(self, token: str, call: Call | None = None) -> None:
        """Free every key that holds ``token``: shielded, bounded, best effort.

        Bounded by ``call``'s cleanup budget when given, else by
        ``min(ttl, 1)``; what it has no time for expires with the lease.
        """
        bound = self._cleanup if call is None else call.cleanup(self._cleanup)
        if bound <= 0:
            logger.debug("no time left to undo an attempt on %r (the lease expires it)", self.name)
            return
        try:
            await run_shielded(lambda: self._give_back(token, self._groups), bound)
        except Exception as exc:
            logger.debug(
                "could not undo an attempt on %r: %r (the lease will expire it)", self.name, exc
            )

    # -- the waiting side: releases heard, nobody queued --------------------------------

    def per_call_waiting(self) -> None:
        """One local queue per object: None."""
        return None

    def generation(self) -> int | None:
        """The generation of the channel the latest attempt saw busy, if this process listens."""
        channel = self._seen_channel
        self._noted_channel = channel
        if not self._listeners or channel is None:
            return None
        return _notify.generation_in(self._listeners, channel)

    async def subscribe(self, seen: int | None) -> _notify.Subscription | None:
        """Listen for the release of the name that kept the latest attempt out longest.

        None with ``notify=False``, or before any attempt was kept out.
        """
        channel = self._seen_channel
        if self._listeners is None or channel is None:
            return None
        if channel != self._noted_channel:
            seen = None  # noted on another channel: whatever this one had may be news
        return await _notify.subscribe(self.wire.client, channel, seen)

    async def leave(self, call: Call) -> None:
        """Nothing to leave: it never queues."""

    async def stop_waiting(self, call: Call) -> None:
        """Nothing to stop: it never queues."""

    async def refresh(self, call: Call, until: float) -> tuple[bool | None, float]:
        """Never queued, never refreshed: not known."""
        return None, 0.0

    async def remaining(self, call: Call, until: float) -> int | None:
        """Not asked (only a queued waiter watches the holder's lease)."""
        return None

    async def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Reply | None:
        """No hand-over in one script: None (released, then the next local task attempts)."""
        return None

    # -- holding -----------------------------------------------------------------------

    async def release(self, token: str, cutoff: Cutoff) -> bool:
        """Free every key of ours and announce it: True if every name was still ours.

        Bounded by ``cutoff``; completes (shielded) if cancelled.

        Raises:
            redis.exceptions.TimeoutError: no answer before the cut-off (the
                lease end and GRACE): the server expires the keys by itself.
        """
        try:
            with cutoff:
                freed = await self._give_back(token, self._groups)
        except asyncio.CancelledError:
            await self.undo(token)
            raise
        if cutoff.expired:
            raise RedisTimeoutError(
                f"releasing lock {self.name!r}: no answer before its lease ended; "
                "the server expires the keys by itself"
            )
        return freed == len(self.keys)

    def _extend_calls(
        self, items: Sequence[tuple[MultiLease, str, int]]
    ) -> tuple[
        list[list[int]],
        list[tuple[tuple[str, ...], tuple[Any, ...]]],
    ]:
        """The ``EXTEND_MANY`` calls renewing ``items`` (lease, token, ms): one per slot and ms.

        Returns, per call, the item each of its keys belongs to, and the
        calls' keys and arguments.
        """
        # One call per slot and lease asked (most batches ask one: their ttl).
        by_call: dict[tuple[int | None, int], tuple[list[str], list[str], list[int]]] = {}
        for index, (lease, token, ms) in enumerate(items):
            for group in lease._groups:
                locks, tokens, where = by_call.setdefault((group.slot, ms), ([], [], []))
                for lock in group.locks:
                    where.append(index)
                    locks.append(lock)
                    tokens.append(token)
        plan = [where for _, _, where in by_call.values()]
        suffix = self.keys[0].queue[len(self.key) :]
        calls = [
            EXTEND_MANY.call(locks=locks, ms=ms, suffix=suffix, tokens=tokens)
            for (_, ms), (locks, tokens, _) in by_call.items()
        ]
        return plan, calls

    async def _extend_items(
        self, items: Sequence[tuple[MultiLease, str, int]]
    ) -> list[bool | Exception]:
        """Extend every key of every item; each item's outcome (see :meth:`extend_many`)."""
        plan, calls = self._extend_calls(items)
        sent = time.monotonic()
        if len(calls) == 1:
            keys, args = calls[0]
            answers: list[Any] = [await self.wire.run(EXTEND_MANY, keys, args, urgent=True)]
        else:
            answers = await self.wire.run_each(EXTEND_MANY, calls, urgent=True)
        self.wire.observe(time.monotonic() - sent)
        replies: list[list[object]] = [[] for _ in items]
        for where, answer in zip(plan, answers, strict=True):
            if isinstance(answer, Exception):
                for index in where:
                    replies[index].append(answer)
                continue
            for index, renewal in zip(where, renewals(answer, len(where)), strict=True):
                replies[index].append(renewal)
        outcomes: list[bool | Exception] = []
        for reply in replies:
            failed = next((r for r in reply if isinstance(r, Exception)), None)
            outcomes.append(failed if failed is not None else _extended(reply))
        # A holding with a name lost is lost whole: its other keys go back at once.
        for (lease, token, _), outcome in zip(items, outcomes, strict=True):
            if outcome is False:
                await lease.undo(token)
        return outcomes

    async def extend(self, token: str, ttl: float) -> bool:
        """Reset the lease of every key of ``token`` to ``ttl``; False if one is not ours.

        Then the keys still ours are given back: the holding is lost whole.
        """
        [outcome] = await self._extend_items([(self, token, to_ms(ttl))])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def batch_key(self) -> Hashable:
        """The client: every MultiLock of one client renews in the same calls."""
        return (self._site, _BATCH)

    async def extend_many(self, batch: Sequence[Extension]) -> list[bool | Exception]:
        """Extend every item of ``batch``: one ``EXTEND_MANY`` call per hash slot for all.

        An item is renewed if every key of it was ours, lost (False) if one
        was not (its other keys are given back), else the error that leaves
        it open.
        """
        items = [(cast(MultiLease, lease), token, to_ms(ttl)) for lease, token, ttl in batch]
        return await self._extend_items(items)

    async def forced_by(self, token: str) -> str | None:
        """Who released one of the names of ``token`` by force (its mark), or None."""
        for keys in self.keys:
            forcer = await self.wire.get(keys.forced(token))
            if isinstance(forcer, bytes):
                return forcer.decode("utf-8", "replace")
            if forcer is not None:
                return str(forcer)
        return None

    async def held(self) -> bool:
        """Whether any of the names is held now (asks the server): an acquire would wait."""
        for group in self._groups:
            for lock in group.locks:
                if await self.wire.exists(lock):
                    return True
        return False

    async def holds(self, token: str) -> bool:
        """Whether every name's key holds ``token`` now (asks the server)."""
        for group in self._groups:
            for lock in group.locks:
                value = await self.wire.get(lock)
                if value is None or value not in (token, token.encode()):
                    return False
        return True
