"""A release channel a process listens to, and one waiter's subscription to it.

A :class:`Channel` is one lock's release channel as this process's listener
(:mod:`aiolock._notify`) reads it: its state on the current connection
(:class:`State`), a generation that every release or break bumps, the
waiters asleep on it, and the latest grants heard on the process's grant
channel. A :class:`Subscription` is one waiter's hold on a channel: it
notes the generation before each attempt, sleeps until news or its own
grant (:meth:`Subscription.wait`), and gives the channel back when it closes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import Protocol, final

import anyio.lowlevel

from ._timers import call_at

__all__ = ["Channel", "Listening", "State", "Subscription"]

logger = logging.getLogger("aiolock")

#: How many grants a channel remembers for waiters that expect them late.
_RECENT_GRANTS = 64


class State(enum.Enum):
    """A channel's subscription on the listener's current connection."""

    NEW = "new"  # not asked for on the current connection (or none yet)
    PENDING = "pending"  # SUBSCRIBE sent, not confirmed
    LIVE = "live"  # confirmed: releases reach us


@final
class Channel:
    """One lock's release channel as this process reads it (see the module)."""

    __slots__ = (
        "expected",
        "generation",
        "grants",
        "holder_until",
        "name",
        "raw",
        "recent",
        "refs",
        "since",
        "state",
        "waiters",
    )

    def __init__(self, name: str, raw: bytes, tag: bytes) -> None:
        self.name = name
        self.raw = raw
        #: The channel of this process's grants on the lock: ``<channel>:<tag>``.
        self.grants = raw + b":" + tag
        self.refs = 0
        self.generation = 0
        self.state = State.NEW
        self.since = time.monotonic()  # when it was sent (PENDING) or last left (refs == 0)
        self.waiters: set[asyncio.Future[None]] = set()
        #: The subscriptions that wait for a grant, by token.
        self.expected: dict[bytes, Subscription] = {}
        #: The latest grants: token -> (lease ms, fence, the number of the granted entry).
        self.recent: dict[bytes, tuple[int, int, int]] = {}
        #: When the first lease of the latest grant heard ends (monotonic; 0: none heard).
        self.holder_until = 0.0

    def granted(self, payload: bytes) -> None:
        """A grant message: wake the waiter it names, if it is ours; wake nobody else."""
        try:
            _, token, ms_text, fence_text, written_text = payload.split(b" ")
            ms = int(ms_text)
            fence = int(fence_text)
            written = int(written_text)
        except ValueError:
            logger.debug("aiolock: a malformed grant on %r: %r", self.name, payload)
            return
        self.holder_until = time.monotonic() + ms / 1000
        if len(self.recent) >= _RECENT_GRANTS:
            del self.recent[next(iter(self.recent))]
        self.recent[token] = (ms, fence, written)
        subscription = self.expected.get(token)
        if subscription is not None and subscription.entry == written:
            subscription.granted = (ms, fence)
            future = subscription.future
            if future is not None and not future.done():
                future.set_result(None)

    def bump(self) -> None:
        """Record an event and wake everyone waiting on this channel."""
        self.generation += 1
        for future in self.waiters:
            if not future.done():
                future.set_result(None)
        self.waiters.clear()


class Listening(Protocol):
    """What a subscription asks of the listener it holds a channel of."""

    def refused(self) -> bool:
        """Whether the server refused this listener's subscriptions."""
        ...

    def serves(self, channel: Channel) -> bool:
        """Whether the listener still reads ``channel`` (the server may have dropped it)."""
        ...

    def unref(self, channel: Channel) -> None:
        """One subscription fewer to ``channel``."""
        ...


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@final
class Subscription:
    """One waiter's hold on a channel of a listener (see the module)."""

    __slots__ = (
        "_channel",
        "_closed",
        "_listener",
        "_seen",
        "_token",
        "entry",
        "future",
        "granted",
    )

    def __init__(self, listener: Listening, channel: Channel, seen: int) -> None:
        self._listener = listener
        self._channel = channel
        self._seen = seen
        self._closed = False
        self._token: bytes | None = None
        #: What :meth:`wait` awaits, while it waits.
        self.future: asyncio.Future[None] | None = None
        #: ``(lease ms, fence)`` once a grant to the expected entry was heard, else None.
        self.granted: tuple[int, int] | None = None
        #: The number of the expected entry (the attempt that wrote it).
        self.entry = -1

    def mark(self) -> None:
        """Note the channel's generation: call it before each attempt."""
        self._seen = self._channel.generation

    def expect(self, token: str, entry: int) -> None:
        """Wake for a grant to ``token``'s entry number ``entry`` too (one heard already counts).

        A grant of another entry of the same token (one it missed, whose
        lease ran out before it queued again) is not this one.
        """
        raw = token.encode()
        if self._token != raw:
            self._forget_token()
            self._token = raw
            self._channel.expected[raw] = self
        self.entry = entry
        heard = self._channel.recent.get(raw)
        self.granted = heard[:2] if heard is not None and heard[2] == entry else None

    @property
    def live(self) -> bool:
        """Whether releases can reach us: subscribed, or asked and not refused nor broken."""
        return (
            self._channel.state is not State.NEW and not self._listener.refused() and not self.stale
        )

    @property
    def stale(self) -> bool:
        """Whether the listener no longer serves this channel (dropped by the server, say).

        Its messages are not read any more: the waiter subscribes again.
        """
        return not self._listener.serves(self._channel)

    def holder_until(self) -> float:
        """When the first lease of the latest grant heard on the channel ends (monotonic)."""
        return self._channel.holder_until

    async def wait(self, delay: float) -> bool:
        """Sleep up to ``delay`` seconds, less if the channel has news or our grant came.

        Returns True if it had (then :attr:`granted` tells which). A grant to
        another waiter does not wake it: it looks at :meth:`holder_until`
        when it wakes for its own reasons.
        """
        channel = self._channel
        if channel.generation != self._seen or self.granted is not None:
            await anyio.lowlevel.checkpoint()
            return True
        if delay <= 0:
            await anyio.lowlevel.checkpoint()
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        channel.waiters.add(future)
        self.future = future
        # A timer of the loop's one scheduler ends the sleep (a cancel scope would
        # cost the heir's wake-up more; the await is a cancellation point all the same).
        timer = call_at(time.monotonic() + delay, _settle, future, loop=loop)
        try:
            await future
        finally:
            timer.cancel()
            self.future = None
            channel.waiters.discard(future)
            if not future.done():
                future.cancel()
        return channel.generation != self._seen or self.granted is not None

    def _forget_token(self) -> None:
        if self._token is not None:
            if self._channel.expected.get(self._token) is self:
                del self._channel.expected[self._token]
            self._token = None

    def close(self) -> None:
        """Give the channel back (idempotent)."""
        if not self._closed:
            self._closed = True
            self._forget_token()
            self._listener.unref(self._channel)
