"""aiolock's share of a client's pool: its slots, the line for them, a slot taken ahead.

aiolock's commands of one client use at most :data:`POOL_SHARE` of the
pool's ``max_connections`` (at most :data:`MAX_SLOTS`) at once: the rest
wait in the process, in order, the urgent ones (renewals) first
(:class:`Gate`). An exhausted pool is then back-pressure, not failure. A
release that would wait in a crowded line can take its slot *ahead*
(:class:`Ahead`) while its holding is still renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from typing import Any, Final, final

from ._types import Client

__all__ = ["AHEAD", "MAX_SLOTS", "POOL_SHARE", "Ahead", "Gate", "slots_of"]

#: The most of a client's pool that aiolock's commands use at once: a share of its
#: ``max_connections``, and never more than this many connections.
POOL_SHARE: Final = 0.5
MAX_SLOTS: Final = 50


@final
class Gate:
    """At most ``slots`` of aiolock's commands of one client in flight; the rest wait here.

    First come, first served, the urgent ones before the others. It belongs
    to the event loop that uses it: a new loop starts with every slot free.
    """

    __slots__ = ("_free", "_loop", "_slots", "_urgent", "_waiters")

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._free = slots
        self._loop: asyncio.AbstractEventLoop | None = None
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """Take a slot if one is free and nobody waits for one: whether it did (no wait)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._free = self._slots
            self._urgent = deque()
            self._waiters = deque()
        if self._free > 0 and not self._waiters and not self._urgent:
            self._free -= 1
            return True
        return False

    async def enter(self, urgent: bool = False) -> None:
        """Take a slot, waiting in line for one; ``urgent`` goes to the head of the line.

        Renewals are urgent: each has a lease end to meet, and must not wait
        behind a crowd of attempts (nor behind renewals that came after it).
        """
        if self.take():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line = self._urgent if urgent else self._waiters
        line.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.leave()  # a slot was handed to us: hand it on
            else:
                future.cancel()
                # (A slot given back meanwhile may have passed over it already.)
                with contextlib.suppress(ValueError):
                    line.remove(future)
            raise

    def leave(self) -> None:
        """Give the slot back: to the first in line, if any (the urgent line first)."""
        if not self._urgent and not self._waiters:
            self._free += 1
            return
        for line in (self._urgent, self._waiters):
            while line:
                future = line.popleft()
                if not future.done():
                    future.set_result(None)
                    return
        self._free += 1

    @property
    def waiting(self) -> int:
        """How many commands wait for a slot."""
        return len(self._urgent) + len(self._waiters)

    def full(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a command of ``loop`` would wait for a slot now."""
        return self._loop is loop and (self._free <= 0 or bool(self._waiters or self._urgent))


@final
class Ahead:
    """A slot of a client taken ahead by one task for its next command (``Wire.ahead``)."""

    __slots__ = ("gate", "reset", "task", "used")

    def __init__(self, gate: Gate, task: asyncio.Task[Any]) -> None:
        self.gate = gate
        self.task = task
        #: Whether a command went out on it (and gave it back when it ended).
        self.used = False
        self.reset: contextvars.Token[Ahead | None] | None = None

    def give_back(self) -> None:
        """Return the slot if no command used it; forget it either way (in the taking task)."""
        if not self.used:
            self.used = True
            self.gate.leave()
        if self.reset is not None:
            with contextlib.suppress(ValueError):  # (another context: nothing to undo there)
                AHEAD.reset(self.reset)
            self.reset = None


#: The slot the running task took ahead, if any.
AHEAD: contextvars.ContextVar[Ahead | None] = contextvars.ContextVar(
    "aiolock_slot_ahead", default=None
)


def slots_of(client: Client) -> int:
    """How many connections of ``client``'s pool aiolock's commands may use at once."""
    pool = getattr(client, "connection_pool", None)
    most = getattr(pool, "max_connections", None)
    if not isinstance(most, int) or most <= 0:
        return MAX_SLOTS
    return max(1, min(int(most * POOL_SHARE), MAX_SLOTS))
