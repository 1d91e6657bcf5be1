"""Waiting inside one process: a FIFO queue per client and key (the local queue).

The coroutines of one process that want the same key through the same client
object line up here, first come first served. Only the task at the head of
the queue ("the baton holder") talks to Redis: it contends on the server
while someone elsewhere holds the lock, keeps the baton while it holds the
lock itself, and hands it to the next local waiter when it releases, gives
up, or loses the lock. Everyone else waits on a local future, sending no
commands at all. Two client objects have two queues, so they behave like two
processes.

A holder that releases while local tasks wait hands the lock straight to the
first of them (:meth:`LocalQueue.reserve` and :meth:`LocalQueue.give`): one
script swaps the token on the server, and the waiter wakes up holding the
lock (a :class:`Grant`) without sending a command of its own. Such a local run
yields to waiters in other processes once it has lasted :data:`LOCAL_RUN`
seconds: the releaser's script then hands the lock to the first live waiter
of the lock's queue on the server instead, if there is one
(docs/server-queue.md), and the next local task goes to that queue (a
:data:`Turn.CONTEND`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Final, Protocol, final

from redis.exceptions import TimeoutError as RedisTimeoutError

from ._checks import shared
from ._exceptions import LockError
from ._timers import GRACE, Cutoff, Timer

__all__ = [
    "LOCAL_RUN",
    "Entry",
    "Grant",
    "HandsOver",
    "Heir",
    "LocalQueue",
    "Releases",
    "Turn",
    "Undo",
    "existing_queue",
    "hand_over",
    "queue_for",
    "queues_of",
]

#: Seconds a run of local hand-overs may keep the lock while other processes wait.
LOCAL_RUN: Final = 0.1
#: How many queues a client keeps once they are empty (for the next acquisition of
#: the same key); beyond that an emptied queue is dropped.
_KEEP_IDLE: Final = 64


class Turn(enum.Enum):
    """Why a waiter got the baton without the lock."""

    CONTEND = "contend"  # try on the server at once


@dataclass(frozen=True, slots=True)
class Grant:
    """The lock itself, handed over by the releasing task of this process."""

    token: str
    sent: float  # when the hand-over was sent: the lease runs from there
    fence: int


@dataclass(frozen=True, slots=True)
class Undo:
    """A hand-over whose outcome is unknown (cut off at the releaser's lease end).

    It may have given the server ``token`` with a fresh lease: the waiter
    takes that back before it contends, so that the releaser need not wait
    for a server that does not answer.
    """

    token: str


Ticket = Grant | Turn | Undo


class Heir(Protocol):
    """What a waiting task waits through: the lease of its lock object.

    The queue needs only its ``undo``: a waiter that gives up after the lock
    was handed to it deletes the token it was given. A releaser that hands
    the lock over reads the rest of the heir's lease itself.
    """

    #: The lease (seconds) an acquisition through it asks for.
    ttl: float

    def undo(self, token: str) -> Awaitable[None]:
        """Delete the key if it holds ``token``: shielded, bounded, best effort."""
        ...


class Releases(Protocol):
    """What a releaser releases through: the lease of its lock object."""

    def release(self, token: str, cutoff: Cutoff) -> Awaitable[bool]:
        """Delete the key if it holds ``token``, within ``cutoff``; False if it no longer did."""
        ...

    def undo(self, token: str) -> Awaitable[None]:
        """Delete the key if it holds ``token``: shielded, bounded, best effort."""
        ...


class HandsOver(Protocol):
    """What hands a lock over on the server: the queueing part of a lease, if it has one."""

    def hand_over(
        self, token: str, heir: object, heir_token: str, may_yield: bool
    ) -> Awaitable[tuple[int, int] | None]:
        """Swap ``token`` for ``heir_token`` on the server; None if this lease cannot."""
        ...


@dataclass(eq=False, slots=True)
class Entry:
    """A task waiting in the queue, with the lease it waits through."""

    task: asyncio.Task[Any]
    heir: Heir
    future: asyncio.Future[Ticket]


@final
class LocalQueue:
    """The FIFO of local tasks that want one key through one client."""

    __slots__ = (
        "__weakref__",
        "_home",
        "_key",
        "_waiters",
        "holder",
        "loop",
        "owner",
        "pid",
        "reserved",
        "run_started",
        "thread",
    )

    def __init__(
        self, home: dict[str, LocalQueue], key: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._home = home
        self._key = key
        #: The event loop whose tasks use the queue (a queue belongs to one loop).
        self.loop = loop
        #: The process that made it (a forked child starts with its own).
        self.pid = shared(os.getpid())
        #: The thread whose event loop it belongs to (it is made there).
        self.thread = shared(threading.get_ident())
        # The baton holder: a task, or the holding of one that ended while it held.
        self.owner: object | None = None
        self.holder: object | None = None  # the baton holder, once it holds the lock
        self.run_started = 0.0  # when the lock last came from the server, not a hand-over
        self.reserved: Entry | None = None  # the waiter a hand-over in flight is for
        self._waiters: deque[Entry] | None = None  # (made at the first waiter: a held lock's
        # queue usually never has one, and an empty deque is 600 bytes)

    @property
    def waiting(self) -> int:
        """How many local tasks wait for the baton (one it is being handed to included)."""
        return len(self._waiters or ()) + (self.reserved is not None)

    def take(self, task: asyncio.Task[Any]) -> bool:
        """Take the baton at once if nobody has it or waits for it (the fast path)."""
        if self.owner is None and self.reserved is None and not self._waiters:
            self.owner = task
            return True
        return False

    async def enter(
        self,
        task: asyncio.Task[Any],
        heir: Heir,
        deadline: float | None,
        blocking: bool,
    ) -> Ticket | None:
        """Wait for the baton until ``deadline`` (``time.monotonic()``).

        Returns None if the deadline passed first, else what came with the
        baton: a :class:`Grant` (the lock, handed over), an :class:`Undo` or
        a :class:`Turn`.

        Raises:
            LockError: ``task`` already holds the baton (it holds or waits for
                the same key through another lock object: waiting would
                deadlock).
        """
        if self.owner is None and self.reserved is None and not self._waiters:
            self.owner = task
            return Turn.CONTEND
        if self.owner is task:
            raise LockError(
                f"this task already holds {self._key!r} through another lock object; "
                "waiting for it again would deadlock"
            )
        if not blocking:
            return None
        entry = Entry(task, heir, asyncio.get_running_loop().create_future())
        if self._waiters is None:
            self._waiters = deque()
        self._waiters.append(entry)
        try:
            if deadline is None:
                await entry.future
            else:
                with Cutoff(deadline):
                    await entry.future
        except BaseException:
            await self._abandon(entry)
            raise
        if entry.future.done() and not entry.future.cancelled():
            return entry.future.result()
        await self._abandon(entry)
        return None

    async def _abandon(self, entry: Entry) -> None:
        """Step out of the queue; pass on the baton (and undo a lock) handed to us meanwhile."""
        future = entry.future
        if future.done() and not future.cancelled():
            ticket = future.result()
            self.leave()
            if isinstance(ticket, Grant):
                await entry.heir.undo(ticket.token)
        else:
            future.cancel()
            if self._waiters is not None:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)

    def reserve(self) -> Entry | None:
        """Take the first live waiter out of the queue; the baton is in transit to it.

        Called by the baton holder as it releases; it then owes the waiter a
        :meth:`give`. Meanwhile nobody holds the baton, and nobody can take it.
        """
        while self._waiters:
            entry = self._waiters.popleft()
            if not entry.future.done():
                self.owner = None
                self.holder = None
                self.reserved = entry
                return entry
        return None

    def give(self, entry: Entry, ticket: Ticket) -> bool:
        """Hand the baton and ``ticket`` to the reserved waiter; False if it gave up meanwhile.

        The baton of a waiter that gave up goes on to the next one.
        """
        self.reserved = None
        if entry.future.done():
            self.leave()
            return False
        self.owner = entry.task
        entry.future.set_result(ticket)
        return True

    def leave(self) -> None:
        """Give the baton to the next waiter, or free the queue.

        A freed queue stays with its client for the next acquisition of the
        key while the client keeps few (:data:`_KEEP_IDLE`), else it is dropped.
        """
        self.holder = None
        while self._waiters:
            entry = self._waiters.popleft()
            if not entry.future.done():
                self.owner = entry.task
                entry.future.set_result(Turn.CONTEND)
                return
        self.owner = None
        home = self._home
        if len(home) > _KEEP_IDLE and home.get(self._key) is self:
            del home[self._key]


_queues: weakref.WeakKeyDictionary[Any, dict[str, LocalQueue]] = weakref.WeakKeyDictionary()


async def hand_over(
    lease: Releases,
    hands: HandsOver | None,
    queue: LocalQueue,
    entry: Entry,
    *,
    name: str,
    token: str,
    lease_end: float,
    task: asyncio.Task[Any],
    spare: Timer | None,
) -> bool:
    """Release the holding of ``token`` straight to the reserved local waiter ``entry``.

    ``hands`` is the lease's part that hands over on the server; without one
    (or when it cannot), the holding is released as without a waiter
    (``spare`` goes to that release's cut-off), and ``entry`` contends.
    Bounded by the releaser's lease, like a plain release (cut off at
    ``lease_end`` + :data:`~aiolock._timers.GRACE`). Returns
    whether the key was still ours. Whatever happens, ``entry`` gets the
    baton: with the lock (a :class:`Grant`), to contend for it, or, when the
    hand-over was cut off and may have run, to delete the token it may have
    been given first (an :class:`Undo`).

    Raises:
        redis.exceptions.TimeoutError: no answer before the cut-off; the key
            expires by itself.
    """
    if hands is not None:
        heir_token = os.urandom(16).hex()
        sent = time.monotonic()
        may_yield = sent - queue.run_started >= LOCAL_RUN
        try:
            with Cutoff(lease_end + GRACE, task, spare) as cutoff:
                reply = await hands.hand_over(token, entry.heir, heir_token, may_yield)
        except BaseException:
            # It may have run: make sure neither token keeps the key, then let the heir
            # contend.
            queue.give(entry, Turn.CONTEND)
            await lease.undo(heir_token)
            await lease.undo(token)
            raise
        if cutoff.expired:
            # It may have run and given the heir's token a fresh lease: the heir takes that
            # back before it contends (or we do, if it gave up meanwhile), so that this
            # release ends by the lease. Our own key has expired by now (its lease is over).
            if not queue.give(entry, Undo(heir_token)):
                await lease.undo(heir_token)
            raise RedisTimeoutError(
                f"releasing lock {name!r}: no answer before its lease ended; "
                "the server expires the key by itself"
            )
        if reply is not None:
            if reply[0] == 1:
                if not queue.give(entry, Grant(heir_token, sent, reply[1])):
                    await lease.undo(heir_token)  # the heir gave up meanwhile
                return True
            # 2: it went to the first waiter of the queue on the server; the heir queues up.
            queue.give(entry, Turn.CONTEND)
            return bool(reply[0])
        spare = None  # (spent by the hand-over's cut-off)
    # No hand-over: release, then let the heir contend.
    try:
        return await lease.release(token, Cutoff(lease_end + GRACE, task, spare))
    finally:
        queue.give(entry, Turn.CONTEND)


def queues_of(client: object) -> dict[str, LocalQueue]:
    """Return the queues of ``client`` by key (a lock keeps this dict for fast lookups)."""
    try:
        return _queues[client]
    except KeyError:
        home = _queues[client] = {}
        return home


def queue_for(home: dict[str, LocalQueue], key: str, loop: asyncio.AbstractEventLoop) -> LocalQueue:
    """Return the local queue of ``key`` in ``home`` for ``loop``'s tasks, making it.

    A queue left by an event loop that no longer runs (one that ended with the
    lock held, as in a script that ran ``asyncio.run`` once before), or by
    another process (the parent's, in a forked child), is replaced: its tasks
    and futures are of no use here. A queue of a loop that runs in another
    thread is kept and shared: a client serves one loop at a time.
    """
    queue = home.get(key)
    if queue is None or (
        queue.loop is not loop and (not queue.loop.is_running() or queue.pid != os.getpid())
    ):
        queue = home[key] = LocalQueue(home, key, loop)
    return queue


def existing_queue(home: dict[str, LocalQueue], key: str) -> LocalQueue | None:
    """Return the local queue of ``key`` in ``home`` if there is one (it may be idle)."""
    return home.get(key)
