"""A one-server lease as a holder: release, extend, renew in batches, and the raw operations.

:class:`ServerHolding` is a part of :class:`~aiolock._server_lease.ServerLease`:
what a holding asks of its lease once it holds (release, extend, the
renewal of many holdings in one call, whether it still holds), and the raw
operations a quorum of leases (:mod:`aiolock._quorum`) sends to each node.
A release or a hand-over is never sent twice blindly: after a lost reply the
same script is asked again, knowingly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._checks import to_ms
from ._lease import Extension
from ._scripts import Call as ScriptCall
from ._scripts import Script, renewals
from ._server_state import ServerState
from ._wire import ReplyLost

if TYPE_CHECKING:
    from ._lease import Call
    from ._timers import Cutoff

__all__ = ["CONTENDED_HINT", "ServerHolding"]

logger = logging.getLogger("aiolock")

#: A release that handed the lock on makes the next attempt through the same lease
#: skip the bare ``SET`` for this long (the lock is taken: go straight to the queue).
CONTENDED_HINT: Final = 0.05


def _extend_calls(
    script: Script, batch: Sequence[Extension], suffix: str
) -> tuple[list[ScriptCall], list[list[int]]]:
    """The ``*_EXTEND_MANY`` calls renewing ``batch``: one per hash slot and lease asked.

    On one server every holding is in one slot (None). Most batches ask one
    lease of all (their ttl); a holding whose lease is cut at its cap asks
    another, in a call of its own. Returns the calls, and for each the
    indices of ``batch`` it renews, in order.
    """
    groups: dict[tuple[int | None, int], list[int]] = {}
    for i, (lease, _, ttl) in enumerate(batch):
        where = (cast("ServerHolding", lease)._slot, to_ms(ttl))
        group = groups.get(where)
        if group is None:
            groups[where] = [i]
        else:
            group.append(i)
    calls = [
        script.call(
            locks=[cast("ServerHolding", batch[i][0]).key for i in group],
            ms=ms,
            suffix=suffix,
            tokens=[batch[i][1] for i in group],
        )
        for (_, ms), group in groups.items()
    ]
    return calls, list(groups.values())


def _extended(reply: int) -> bool | Exception:
    """One holding's outcome (see :func:`~aiolock._scripts.renewals`)."""
    if reply == -1:
        return ResponseError("the server could not renew this holding now (its slot migrating?)")
    return bool(reply)


class ServerHolding(ServerState):
    """The holding side of a one-server lease (a base of ``ServerLease``; see the module)."""

    __slots__ = ()

    if TYPE_CHECKING:  # (ServerQueueing's, through ServerLease)

        async def undo(self, token: str, call: Call | None = None) -> None:
            """Free the lock if it holds ``token`` and leave the queue: shielded, bounded."""

    async def take(self, token: str) -> bool:
        """One bare ``SET NX PX``: whether it took the lock (no undo, no cut-off).

        A ``SET`` that found the key taken looks whose it is: ours (the same
        ``SET`` ran before and its reply was lost) counts as taken, and
        another kind of primitive's key raises :class:`~aiolock.LockError`.
        """
        if await self.wire.set_nx(self.key, token, self._ms):
            return True
        value = await self.wire.get(self.key)
        return value is not None and value in (token, token.encode())

    async def delete(self, token: str) -> bool:
        """The release script: free the key if it holds ``token`` (by the grant rule).

        Sent once; if its reply is lost, the key found no longer ours counts
        as freed by it (see :meth:`_release_once`).
        """
        return bool(await self._release_once(token))

    async def _release_once(self, token: str) -> Any:
        """Run a release script for ``token`` once; after a lost reply, ask again.

        The script is never sent twice blindly: run again after it freed (or
        handed on) the lock, it would find the key no longer ours. So a lost
        reply is followed by the same script, asked knowingly: if it frees
        the lock now, the first one never ran; if it finds the key no longer
        ours, the first one freed it (answered as a plain release, 1). (A
        holder that had lost the key in that very moment is then told it
        released; nothing else can tell the two apart.)
        """
        release = self._release
        if release is None:
            release = self._releasing()
        script = release.script
        keys, args = release.only(token)  # (the one argument left: the token)
        try:
            return await self.wire.run(script, keys, args, once=True)
        except ReplyLost as lost:
            reply = await self.wire.run(script, keys, args)
            if not reply:
                logger.info(
                    "the reply to the release of lock %r was lost (%s); the key was no "
                    "longer ours when asked again, so the release had run",
                    self.name,
                    lost.__cause__ or lost,
                )
                return 1
            return reply

    async def value(self) -> Any:
        """The token that holds the lock now (``GET``), or None."""
        return await self.wire.get(self.key)

    async def release(self, token: str, cutoff: Cutoff) -> bool:
        """Delete the key if it holds ``token`` and announce it; bounded by ``cutoff``.

        Raises:
            redis.exceptions.TimeoutError: no answer before the cut-off (the
                lease end and GRACE): the server expires the key by itself.
        """
        try:
            with cutoff:
                reply = await self._release_once(token)
        except asyncio.CancelledError:
            await self.undo(token)
            raise
        if cutoff.expired:
            raise RedisTimeoutError(
                f"releasing lock {self.name!r}: no answer before its lease ended; "
                "the server expires the key by itself"
            )
        if reply == 2:  # handed on: the lock is taken, our next attempt goes to the queue
            self._contended_until = time.monotonic() + CONTENDED_HINT
        return bool(reply)

    async def extend(self, token: str, ttl: float) -> bool:
        """Reset the lease of ``token``'s key to ``ttl``; False if it is not ours."""
        sent = time.monotonic()
        keys, args = self._EXTEND.call(
            lock=self.key, token=token, ms=to_ms(ttl), queue=self.keys.queue
        )
        extended = bool(await self.wire.run(self._EXTEND, keys, args, urgent=True))
        self.wire.observe(time.monotonic() - sent)
        return extended

    def batch_key(self) -> Hashable:
        """The client and the kind's extend script."""
        return (self._site, self._EXTEND_MANY)

    async def extend_many(self, batch: Sequence[Extension]) -> list[bool | Exception]:
        """Extend every item of ``batch`` (see :meth:`Lease.extend_many`).

        ``batch`` holds at most :data:`BATCH_MOST` items; one item is one
        :meth:`extend`. One script call renews them all (one per lease asked,
        if they ask different ones); on a cluster, one call per hash slot,
        sent in pipelines (:meth:`~aiolock._wire.Wire.run_each`).
        """
        if len(batch) == 1:
            lease, token, ttl = batch[0]
            return [await lease.extend(token, ttl)]
        suffix = self.keys.queue[len(self.key) :]  # the kind's queue suffix
        script = self._EXTEND_MANY
        calls, groups = _extend_calls(script, batch, suffix)
        sent = time.monotonic()
        if len(calls) == 1 and not self.wire.cluster:
            answers: list[Any] = [await self.wire.run(script, *calls[0], urgent=True)]
        else:
            answers = await self.wire.run_each(script, calls, urgent=True)
        self.wire.observe(time.monotonic() - sent)
        outcomes: list[bool | Exception] = [False] * len(batch)
        for group, answer in zip(groups, answers, strict=True):
            if isinstance(answer, Exception):
                for i in group:
                    outcomes[i] = answer
                continue
            for i, reply in zip(group, renewals(answer, len(group)), strict=True):
                outcomes[i] = _extended(reply)
        return outcomes

    async def held(self) -> bool:
        """Whether the key exists (asks the server)."""
        return await self.wire.exists(self.key)

    async def forced_by(self, token: str) -> str | None:
        """Who released ``token``'s holding by force, from its mark; None if not marked."""
        return _text_or_none(await self.wire.get(self.keys.forced(token)))

    async def holds(self, token: str) -> bool:
        """Whether the key holds ``token`` (asks the server)."""
        value = await self.wire.get(self.key)
        return value is not None and value in (token, token.encode())


def _text_or_none(value: object) -> str | None:
    """A reply read as text (None stays None)."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
