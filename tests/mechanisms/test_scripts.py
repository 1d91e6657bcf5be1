"""Each Lua script, called with named KEYS and ARGV on a real server, leaves the state it should.

A case is a table row: the state before (keys, values, leases, queue
entries), one call of a script with its keys and arguments by name
(:meth:`aiolock._scripts.Script.call`), the reply, and the state after.
The state after is every key of the case's name: a key the row does not
list must not be there. Leases are checked within bounds (the server's
clock runs while the test does). The rows are the scripts' rules as
docs/server-queue.md states them: owner checks, the grant rule of the queue
(the first live waiter gets the lock; dead and unreadable entries are
dropped), fences and their floor, kinds that clash on one name, a
semaphore's permits and limit, a read-write lock's readers and writer, and
batched renewal.

The module also pins the bindings (a missing or unknown name is a
``TypeError``), the header and include rules, and the queue entry's one
format: a Python-written entry read by the Lua parser on the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as redis
from redis.exceptions import ResponseError

from aiolock._keys import keys_for
from aiolock._scripts import (
    ACQUIRE,
    ACQUIRE_LEAD,
    EXTEND,
    EXTEND_MANY,
    FORCE,
    FORCED_MARK_MS,
    HANDOVER,
    KEEP,
    KEEPER_MARK_MS,
    LEAVE,
    MULTI_ACQUIRE,
    MULTI_FENCE,
    MULTI_RELEASE,
    QUEUE_SLACK_MS,
    RELEASE,
    RW_ACQUIRE,
    RW_EXTEND,
    RW_EXTEND_MANY,
    RW_FORCE,
    RW_INDEX_SUFFIX,
    RW_LEAVE,
    RW_RELEASE,
    RW_STATE,
    SCRIPTS,
    SEMAPHORE_ACQUIRE,
    SEMAPHORE_EXTEND,
    SEMAPHORE_EXTEND_MANY,
    SEMAPHORE_FORCE,
    SEMAPHORE_HANDOVER,
    SEMAPHORE_LEAVE,
    SEMAPHORE_RELEASE,
    SEMAPHORE_STATE,
    STATUS_HOLDERS,
    STATUS_INSPECT,
    Entry,
    Script,
    decode_holders,
    encode_entry,
    parse_entry,
    parse_header,
    resolve,
)

# --- what a row says -------------------------------------------------------------------


@dataclass(frozen=True)
class Between:
    """A number from ``low`` to ``high`` (both included): a lease, a time left."""

    low: int
    high: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and self.low <= other <= self.high

    def __hash__(self) -> int:
        return hash((self.low, self.high))


#: A fence floored by the server's clock in microseconds (no counter reaches it by INCR).
FLOORED = Between(10**15, 4 * 10**15)
#: A key without an expiry (PTTL -1).
NO_EXPIRY = Between(-1, -1)


@dataclass(frozen=True)
class Str:
    """A string key: its value, and its lease (ms) before or its PTTL's bounds after."""

    value: str | Between
    ms: int | Between | None = None


@dataclass(frozen=True)
class Lst:
    """A list key (the queue): its items; its lease (ms) before or bounds after."""

    items: list[str]
    ms: int | Between | None = None


@dataclass(frozen=True)
class Permits:
    """A semaphore's sorted set: each token and the ms its lease has left (before: sets it)."""

    left: dict[str, int | Between]


@dataclass(frozen=True)
class Holders:
    """A read-write lock's hash and its index: each token, its kind and the ms left."""

    left: dict[str, tuple[str, int | Between]]


State = dict[str, Str | Lst | Permits | Holders]


@dataclass(frozen=True)
class Case:
    """One row: the state before, one call, the reply (or the error), the state after."""

    id: str
    script: Script
    kind: str
    before: State
    call: dict[str, Any]
    reply: Any
    after: State
    raises: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


def entry(
    ms: int = 2000, letter: str = "", number: int = 1, tag: str = "t1", keeper: str = ""
) -> Str:
    """A live queue entry written as aiolock writes it, with its own life."""
    return Str(encode_entry(ms, letter, number, tag, keeper), 2000)


# --- the table ----------------------------------------------------------------------

TTL = 10_000
SOON = Between(1, TTL)
ENTRY = Between(1, 2000)


def queue_left(ms: int) -> Between:
    """The queue's life after a grant or an extend of ``ms``: that plus its slack."""
    return Between(1, ms + QUEUE_SLACK_MS)


def acquire(**values: Any) -> dict[str, Any]:
    """ACQUIRE's arguments by name: a plain attempt unless told otherwise."""
    base = {"token": "me", "ms": TTL, "entry": "", "entry_ms": 2000, "looks": "2", "fencing": "0"}
    return base | values


def sem_acquire(**values: Any) -> dict[str, Any]:
    """SEMAPHORE_ACQUIRE's arguments by name (limit 2 unless told otherwise)."""
    base = {"token": "me", "ms": TTL, "entry": "", "entry_ms": 2000, "looks": "2", "limit": "2"}
    return base | values


def rw_acquire(**values: Any) -> dict[str, Any]:
    """RW_ACQUIRE's arguments by name (a reader unless told otherwise)."""
    base = {"token": "me", "ms": TTL, "entry": "", "entry_ms": 2000, "looks": "2", "kind": "r"}
    return base | values


LOCK_CASES = [
    # -- ACQUIRE: taking a free lock, owner checks, queueing, the grant rule, fences
    Case("acquire a free lock", ACQUIRE, "lock", {}, acquire(), [1, 0], {"lock": Str("me", SOON)}),
    Case(
        "acquire again after a lost reply: the lease starts again",
        ACQUIRE,
        "lock",
        {"lock": Str("me", 500)},
        acquire(),
        [1, 0],
        {"lock": Str("me", Between(501, TTL))},
    ),
    Case(
        "acquire a held lock without queueing: the holder's lease, nothing touched",
        ACQUIRE,
        "lock",
        {"lock": Str("other", 5000)},
        acquire(),
        [0, Between(1, 5000)],
        {"lock": Str("other", Between(1, 5000))},
    ),
    Case(
        "acquire a held lock and queue: the entry and a queue that outlives the lease",
        ACQUIRE,
        "lock",
        {"lock": Str("other", 5000)},
        acquire(entry=encode_entry(2000, "", 1, "t1")),
        [0, Between(1, 5000)],
        {
            "lock": Str("other", Between(1, 5000)),
            "queue": Lst(["me"], Between(5000, 5000 + QUEUE_SLACK_MS)),
            "entry:me": Str("2000 1 t1", ENTRY),
        },
    ),
    Case(
        "acquire a lock without expiry: pttl -1",
        ACQUIRE,
        "lock",
        {"lock": Str("other")},
        acquire(),
        [0, -1],
        {"lock": Str("other", NO_EXPIRY)},
    ),
    Case(
        "a free lock with a live waiter first goes to that waiter, not the caller",
        ACQUIRE,
        "lock",
        {"queue": Lst(["w1"]), "entry:w1": entry(1500)},
        acquire(),
        [0, 1500],
        {"lock": Str("w1", Between(1, 1500))},
    ),
    Case(
        "dead waiters before the caller are dropped: the caller, next in line, takes it",
        ACQUIRE,
        "lock",
        {
            "queue": Lst(["dead", "unreadable", "me"]),
            "entry:unreadable": Str("x y z"),
            "entry:me": entry(),
        },
        acquire(looks="1", entry=encode_entry(2000, "", 2, "t1")),
        [1, 0],
        {"lock": Str("me", SOON), "entry:unreadable": Str("x y z", NO_EXPIRY)},
    ),
    Case(
        "a kept entry whose keeper's mark is gone is a dead waiter's: dropped and deleted",
        ACQUIRE,
        "lock",
        {"queue": Lst(["kept", "me"]), "entry:kept": entry(keeper="k1"), "entry:me": entry()},
        acquire(looks="1"),
        [1, 0],
        {"lock": Str("me", SOON)},
    ),
    Case(
        "a kept entry whose mark is there is alive: it is granted",
        ACQUIRE,
        "lock",
        {"queue": Lst(["kept", "me"]), "entry:kept": entry(keeper="k1"), "mark:k1": Str("1", 2000)},
        acquire(looks="1"),
        [0, 2000],
        {
            "lock": Str("kept", Between(1, 2000)),
            "queue": Lst(["me"], queue_left(2000)),
            "mark:k1": Str("1", Between(1, 2000)),
        },
    ),
    Case(
        "with fencing, a free lock's fence is floored by the server's clock",
        ACQUIRE,
        "lock",
        {"fence": Str("5")},
        acquire(fencing="1"),
        [1, FLOORED],
        {"lock": Str("me", SOON), "fence": Str(FLOORED, NO_EXPIRY)},
    ),
    Case(
        "with fencing, a counter above the floor goes on by one",
        ACQUIRE,
        "lock",
        {"fence": Str(str(5 * 10**15))},
        acquire(fencing="1"),
        [1, 5 * 10**15 + 1],
        {"lock": Str("me", SOON), "fence": Str(str(5 * 10**15 + 1), NO_EXPIRY)},
    ),
    Case(
        "a lock's name held by a semaphore raises the kind error",
        ACQUIRE,
        "lock",
        {"lock": Permits({"p1": 5000})},
        acquire(),
        None,
        {"lock": Permits({"p1": Between(1, 5000)})},
        raises="WRONGTYPE",
    ),
    # -- RELEASE
    Case(
        "release of a lock that is someone else's touches nothing",
        RELEASE,
        "lock",
        {"lock": Str("other", 5000)},
        {"token": "me"},
        0,
        {"lock": Str("other", Between(1, 5000))},
    ),
    Case(
        "release with nobody queued deletes the key",
        RELEASE,
        "lock",
        {"lock": Str("me", 5000)},
        {"token": "me"},
        1,
        {},
    ),
    Case(
        "release hands the lock to the first live waiter, skipping the dead",
        RELEASE,
        "lock",
        {
            "lock": Str("me", 5000),
            "queue": Lst(["dead", "w1", "w2"]),
            "entry:w1": entry(1500),
            "entry:w2": entry(),
        },
        {"token": "me"},
        2,
        {
            "lock": Str("w1", Between(1, 1500)),
            "queue": Lst(["w2"], queue_left(1500)),
            "entry:w2": Str("2000 1 t1", ENTRY),
        },
    ),
    Case(
        "release to a waiter that wants a fence issues it",
        RELEASE,
        "lock",
        {
            "lock": Str("me", 5000),
            "queue": Lst(["w1"]),
            "entry:w1": entry(letter="f"),
            "fence": Str("7"),
        },
        {"token": "me"},
        2,
        {"lock": Str("w1", Between(1, 2000)), "fence": Str(FLOORED, NO_EXPIRY)},
    ),
    Case(
        "release of a semaphore's name raises the kind error",
        RELEASE,
        "lock",
        {"lock": Permits({"me": 5000})},
        {"token": "me"},
        None,
        {"lock": Permits({"me": Between(1, 5000)})},
        raises="WRONGTYPE",
    ),
    # -- LEAVE
    Case(
        "a waiter that leaves is taken out of the queue; its entry goes",
        LEAVE,
        "lock",
        {
            "lock": Str("other", 5000),
            "queue": Lst(["me", "w2"]),
            "entry:me": entry(),
            "entry:w2": entry(),
        },
        {"token": "me"},
        0,
        {
            "lock": Str("other", Between(1, 5000)),
            "queue": Lst(["w2"]),
            "entry:w2": Str("2000 1 t1", ENTRY),
        },
    ),
    Case(
        "a waiter granted the lock as it left passes it on",
        LEAVE,
        "lock",
        {"lock": Str("me", 2000), "queue": Lst(["w2"]), "entry:w2": entry()},
        {"token": "me"},
        1,
        {"lock": Str("w2", ENTRY)},
    ),
    Case(
        "a waiter granted the lock as it left, nobody queued: the key goes",
        LEAVE,
        "lock",
        {"lock": Str("me", 2000)},
        {"token": "me"},
        1,
        {},
    ),
    # -- EXTEND
    Case(
        "extend resets the holder's lease and keeps the queue that long plus its slack",
        EXTEND,
        "lock",
        {"lock": Str("me", 500), "queue": Lst(["w1"], 600), "entry:w1": entry()},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        1,
        {
            "lock": Str("me", Between(501, TTL)),
            "queue": Lst(["w1"], Between(TTL, TTL + QUEUE_SLACK_MS)),
            "entry:w1": Str("2000 1 t1", ENTRY),
        },
    ),
    Case(
        "extend of a lock that is someone else's touches nothing",
        EXTEND,
        "lock",
        {"lock": Str("other", 500)},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        0,
        {"lock": Str("other", Between(1, 500))},
    ),
    Case(
        "extend of a lock that is gone answers 0",
        EXTEND,
        "lock",
        {},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        0,
        {},
    ),
    Case(
        "batched renewal answers the holdings not renewed: someone else's, gone, another kind",
        EXTEND_MANY,
        "lock",
        {
            "lock": Str("me", 500),
            "lock@b": Str("other", 500),
            "lock@d": Permits({"me": 500}),
            "lock@e": Str("me", 500),
        },
        {
            "locks": ["{lock}", "{lock@b}", "{lock@c}", "{lock@d}", "{lock@e}"],
            "ms": TTL,
            "suffix": ":queue",
            "tokens": ["me", "me", "me", "me", "me"],
        },
        [2, 3, 4],
        {
            "lock": Str("me", Between(501, TTL)),
            "lock@b": Str("other", Between(1, 500)),
            "lock@d": Permits({"me": Between(1, 500)}),
            "lock@e": Str("me", Between(501, TTL)),
        },
    ),
    Case(
        "batched renewal keeps the queue of a renewed holding that has one, like EXTEND",
        EXTEND_MANY,
        "lock",
        {
            "lock": Str("me", 500),
            "queue": Lst(["w1"], 400),
            "lock@b": Str("me", 500),
            "lock@c": Str("other", 500),
            "queue@c": Lst(["w2"], 400),
        },
        {
            "locks": ["{lock}", "{lock@b}", "{lock@c}"],
            "ms": TTL,
            "suffix": ":queue",
            "tokens": ["me", "me", "me"],
        },
        [3],
        {
            "lock": Str("me", Between(501, TTL)),
            "queue": Lst(["w1"], Between(TTL + 1, TTL + QUEUE_SLACK_MS)),
            "lock@b": Str("me", Between(501, TTL)),
            "lock@c": Str("other", Between(1, 500)),
            "queue@c": Lst(["w2"], Between(1, 400)),
        },
    ),
    # -- HANDOVER
    Case(
        "hand-over swaps the holder's token for the next holder's",
        HANDOVER,
        "lock",
        {"lock": Str("me", 500)},
        {"token": "me", "heir": "h", "heir_ms": TTL, "may_yield": "0", "heir_fencing": "0"},
        [1, 0],
        {"lock": Str("h", Between(501, TTL))},
    ),
    Case(
        "hand-over to a fencing heir issues its fence",
        HANDOVER,
        "lock",
        {"lock": Str("me", 500), "fence": Str("3")},
        {"token": "me", "heir": "h", "heir_ms": TTL, "may_yield": "0", "heir_fencing": "1"},
        [1, FLOORED],
        {"lock": Str("h", SOON), "fence": Str(FLOORED, NO_EXPIRY)},
    ),
    Case(
        "hand-over run again after it swapped: the same answer, the fence as it is",
        HANDOVER,
        "lock",
        {"lock": Str("h", 500), "fence": Str("42")},
        {"token": "me", "heir": "h", "heir_ms": TTL, "may_yield": "0", "heir_fencing": "1"},
        [1, 42],
        {"lock": Str("h", Between(1, 500)), "fence": Str("42", NO_EXPIRY)},
    ),
    Case(
        "hand-over of a lock that is someone else's touches nothing",
        HANDOVER,
        "lock",
        {"lock": Str("other", 500)},
        {"token": "me", "heir": "h", "heir_ms": TTL, "may_yield": "1", "heir_fencing": "0"},
        [0, 0],
        {"lock": Str("other", Between(1, 500))},
    ),
    Case(
        "hand-over that may yield goes to the queue's first live waiter",
        HANDOVER,
        "lock",
        {"lock": Str("me", 500), "queue": Lst(["dead", "w1"]), "entry:w1": entry(1500)},
        {"token": "me", "heir": "h", "heir_ms": TTL, "may_yield": "1", "heir_fencing": "0"},
        [2, 1500],
        {"lock": Str("w1", Between(1, 1500))},
    ),
    Case(
        "hand-over that may yield, nobody queued: to the next holder",
        HANDOVER,
        "lock",
        {"lock": Str("me", 500), "queue": Lst(["dead"])},
        {"token": "me", "heir": "h", "heir_ms": TTL, "may_yield": "1", "heir_fencing": "0"},
        [1, 0],
        {"lock": Str("h", Between(501, TTL))},
    ),
    # -- KEEP
    Case(
        "KEEP sets the mark, deletes, extends and looks at the entries",
        KEEP,
        "lock",
        {
            "entry:ended": entry(keeper="k1"),
            "entry:old": entry(keeper="k1"),
            "entry:young": entry(keeper="k1"),
        },
        {
            "keeper": "k1",
            "drop": 1,
            "extend": 1,
            "life": 45_000,
            "tokens": ["ended", "old", "young", "gone"],
        },
        [1, 1, 0],
        {
            "mark:k1": Str("1", Between(1, KEEPER_MARK_MS)),
            "entry:old": Str("2000 1 t1 k1", Between(2001, 45_000)),
            "entry:young": Str("2000 1 t1 k1", ENTRY),
        },
    ),
]

SEMAPHORE_CASES = [
    Case(
        "a free permit is taken",
        SEMAPHORE_ACQUIRE,
        "semaphore",
        {"lock": Permits({"p1": 5000})},
        sem_acquire(),
        [1, 0],
        {"lock": Permits({"p1": Between(1, 5000), "me": SOON})},
    ),
    Case(
        "all permits held: the first lease's end, and the caller queued",
        SEMAPHORE_ACQUIRE,
        "semaphore",
        {"lock": Permits({"p1": 5000, "p2": 3000})},
        sem_acquire(entry=encode_entry(2000, "", 1, "t1")),
        [0, Between(1, 3000)],
        {
            "lock": Permits({"p1": Between(1, 5000), "p2": Between(1, 3000)}),
            "queue": Lst(["me"], Between(1, 5000 + QUEUE_SLACK_MS)),
            "entry:me": Str("2000 1 t1", ENTRY),
        },
    ),
    Case(
        "a permit whose lease ended is free: purged, and taken",
        SEMAPHORE_ACQUIRE,
        "semaphore",
        {"lock": Permits({"p1": 5000, "ended": -1000})},
        sem_acquire(),
        [1, 0],
        {"lock": Permits({"p1": Between(1, 5000), "me": SOON})},
    ),
    Case(
        "a free permit goes to the live waiter queued first, not the caller",
        SEMAPHORE_ACQUIRE,
        "semaphore",
        {"lock": Permits({"p1": 5000}), "queue": Lst(["dead", "w1"]), "entry:w1": entry(1500)},
        sem_acquire(),
        [0, Between(1, 1500)],
        {"lock": Permits({"p1": Between(1, 5000), "w1": Between(1, 1500)})},
    ),
    Case(
        "a semaphore's name held by a lock raises the kind error",
        SEMAPHORE_ACQUIRE,
        "semaphore",
        {"lock": Str("other", 5000)},
        sem_acquire(),
        None,
        {"lock": Str("other", Between(1, 5000))},
        raises="WRONGTYPE",
    ),
    Case(
        "release grants the freed permit to the first live waiter",
        SEMAPHORE_RELEASE,
        "semaphore",
        {
            "lock": Permits({"me": 5000, "p2": 5000}),
            "queue": Lst(["w1", "w2"]),
            "entry:w1": entry(),
            "entry:w2": entry(),
        },
        {"token": "me", "limit": "2"},
        2,
        {
            "lock": Permits({"p2": Between(1, 5000), "w1": ENTRY}),
            "queue": Lst(["w2"], queue_left(2000)),
            "entry:w2": Str("2000 1 t1", ENTRY),
        },
    ),
    Case(
        "release with nobody queued: the last permit's key goes",
        SEMAPHORE_RELEASE,
        "semaphore",
        {"lock": Permits({"me": 5000})},
        {"token": "me", "limit": "2"},
        1,
        {},
    ),
    Case(
        "release of a permit not held (its lease over) answers 0",
        SEMAPHORE_RELEASE,
        "semaphore",
        {"lock": Permits({"me": -100, "p2": 5000})},
        {"token": "me", "limit": "2"},
        0,
        {"lock": Permits({"p2": Between(1, 5000)})},
    ),
    Case(
        "a waiter granted a permit as it left gives it on",
        SEMAPHORE_LEAVE,
        "semaphore",
        {"lock": Permits({"me": 2000}), "queue": Lst(["w1"]), "entry:w1": entry()},
        {"token": "me", "limit": "1"},
        1,
        {"lock": Permits({"w1": ENTRY})},
    ),
    Case(
        "hand-over of the one permit to the next holder",
        SEMAPHORE_HANDOVER,
        "semaphore",
        {"lock": Permits({"me": 500})},
        {"token": "me", "heir": "h", "heir_ms": TTL, "limit": "1", "may_yield": "0"},
        [1, 0],
        {"lock": Permits({"h": Between(501, TTL)})},
    ),
    Case(
        "hand-over that may yield: the permit goes to the queue's first live waiter",
        SEMAPHORE_HANDOVER,
        "semaphore",
        {"lock": Permits({"me": 500}), "queue": Lst(["w1"]), "entry:w1": entry()},
        {"token": "me", "heir": "h", "heir_ms": TTL, "limit": "1", "may_yield": "1"},
        [2, 0],
        {"lock": Permits({"w1": ENTRY})},
    ),
    Case(
        "hand-over of a permit not held touches nothing",
        SEMAPHORE_HANDOVER,
        "semaphore",
        {"lock": Permits({"p1": 500})},
        {"token": "me", "heir": "h", "heir_ms": TTL, "limit": "1", "may_yield": "0"},
        [0, 0],
        {"lock": Permits({"p1": Between(1, 500)})},
    ),
    Case(
        "extend of a held permit",
        SEMAPHORE_EXTEND,
        "semaphore",
        {"lock": Permits({"me": 500, "p2": 700})},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        1,
        {"lock": Permits({"me": Between(501, TTL), "p2": Between(1, 700)})},
    ),
    Case(
        "extend of a permit whose lease ended answers 0",
        SEMAPHORE_EXTEND,
        "semaphore",
        {"lock": Permits({"me": -100, "p2": 700})},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        0,
        {"lock": Permits({"me": Between(-10_000, 0), "p2": Between(1, 700)})},
    ),
    Case(
        "batched renewal of permits: held, not held",
        SEMAPHORE_EXTEND_MANY,
        "semaphore",
        {"lock": Permits({"me": 500}), "lock@b": Permits({"other": 500})},
        {
            "locks": ["{lock}", "{lock@b}"],
            "ms": TTL,
            "suffix": ":queue:semaphore",
            "tokens": ["me", "me"],
        },
        [2],
        {"lock": Permits({"me": Between(501, TTL)}), "lock@b": Permits({"other": Between(1, 500)})},
    ),
    Case(
        "state: permits held, time to the first end, whether the token holds",
        SEMAPHORE_STATE,
        "semaphore",
        {"lock": Permits({"me": 5000, "p2": 3000})},
        {"limit": "2", "token": "me"},
        [2, Between(1, 3000), 1],
        {"lock": Permits({"me": Between(1, 5000), "p2": Between(1, 3000)})},
    ),
    Case(
        "state: a free permit has nothing to wait for",
        SEMAPHORE_STATE,
        "semaphore",
        {"lock": Permits({"p2": 3000})},
        {"limit": "2", "token": "me"},
        [1, -2, 0],
        {"lock": Permits({"p2": Between(1, 3000)})},
    ),
]

RW_CASES = [
    Case(
        "a reader comes in beside readers",
        RW_ACQUIRE,
        "rw",
        {"lock": Holders({"r1": ("r", 5000)})},
        rw_acquire(),
        [1, 0],
        {"lock": Holders({"r1": ("r", Between(1, 5000)), "me": ("r", SOON)})},
    ),
    Case(
        "a writer waits for the readers; it is queued",
        RW_ACQUIRE,
        "rw",
        {"lock": Holders({"r1": ("r", 5000)})},
        rw_acquire(kind="w", entry=encode_entry(2000, "w", 1, "t1")),
        [0, Between(1, 5000)],
        {
            "lock": Holders({"r1": ("r", Between(1, 5000))}),
            "queue": Lst(["me"], Between(1, 5000 + QUEUE_SLACK_MS)),
            "entry:me": Str("2000w 1 t1", ENTRY),
        },
    ),
    Case(
        "a reader waits while a writer holds",
        RW_ACQUIRE,
        "rw",
        {"lock": Holders({"w1": ("w", 5000)})},
        rw_acquire(),
        [0, Between(1, 5000)],
        {"lock": Holders({"w1": ("w", Between(1, 5000))})},
    ),
    Case(
        "a reader that comes after a waiting writer waits behind it",
        RW_ACQUIRE,
        "rw",
        {"lock": Holders({"r1": ("r", 5000)}), "queue": Lst(["w1"]), "entry:w1": entry(letter="w")},
        rw_acquire(entry=encode_entry(2000, "r", 1, "t1")),
        [0, Between(1, 5000)],
        {
            "lock": Holders({"r1": ("r", Between(1, 5000))}),
            "queue": Lst(["w1", "me"]),
            "entry:w1": Str("2000w 1 t1", ENTRY),
            "entry:me": Str("2000r 1 t1", ENTRY),
        },
    ),
    Case(
        "a holding whose lease ended is dropped: the writer comes in",
        RW_ACQUIRE,
        "rw",
        {"lock": Holders({"r1": ("r", -100)})},
        rw_acquire(kind="w"),
        [1, 0],
        {"lock": Holders({"me": ("w", SOON)})},
    ),
    Case(
        "a read-write lock's name held by a lock raises the kind error",
        RW_ACQUIRE,
        "rw",
        {"lock": Str("other", 5000)},
        rw_acquire(),
        None,
        {"lock": Str("other", Between(1, 5000))},
        raises="WRONGTYPE",
    ),
    Case(
        "the last reader's release grants the waiting writer",
        RW_RELEASE,
        "rw",
        {
            "lock": Holders({"me": ("r", 5000)}),
            "queue": Lst(["w1", "r2"]),
            "entry:w1": entry(letter="w"),
            "entry:r2": entry(letter="r"),
        },
        {"token": "me"},
        2,
        {
            "lock": Holders({"w1": ("w", ENTRY)}),
            "queue": Lst(["r2"], queue_left(2000)),
            "entry:r2": Str("2000r 1 t1", ENTRY),
        },
    ),
    Case(
        "the writer's release lets the queued readers in together, up to the next writer",
        RW_RELEASE,
        "rw",
        {
            "lock": Holders({"me": ("w", 5000)}),
            "queue": Lst(["r1", "dead", "r2", "w2", "r3"]),
            "entry:r1": entry(letter="r"),
            "entry:r2": entry(letter="r"),
            "entry:w2": entry(letter="w"),
            "entry:r3": entry(letter="r"),
        },
        {"token": "me"},
        2,
        {
            "lock": Holders({"r1": ("r", ENTRY), "r2": ("r", ENTRY)}),
            "queue": Lst(["w2", "r3"], queue_left(2000)),
            "entry:w2": Str("2000w 1 t1", ENTRY),
            "entry:r3": Str("2000r 1 t1", ENTRY),
        },
    ),
    Case(
        "a reader's release with other readers left: nothing granted",
        RW_RELEASE,
        "rw",
        {
            "lock": Holders({"me": ("r", 5000), "r2": ("r", 3000)}),
            "queue": Lst(["w1"]),
            "entry:w1": entry(letter="w"),
        },
        {"token": "me"},
        1,
        {
            "lock": Holders({"r2": ("r", Between(1, 3000))}),
            "queue": Lst(["w1"]),
            "entry:w1": Str("2000w 1 t1", ENTRY),
        },
    ),
    Case(
        "release of a holding not held answers 0",
        RW_RELEASE,
        "rw",
        {"lock": Holders({"r2": ("r", 3000)})},
        {"token": "me"},
        0,
        {"lock": Holders({"r2": ("r", Between(1, 3000))})},
    ),
    Case(
        "a writer that leaves the head of the queue lets the readers behind it in",
        RW_LEAVE,
        "rw",
        {
            "lock": Holders({"r1": ("r", 5000)}),
            "queue": Lst(["me", "r2"]),
            "entry:me": entry(letter="w"),
            "entry:r2": entry(letter="r"),
        },
        {"token": "me"},
        0,
        {"lock": Holders({"r1": ("r", Between(1, 5000)), "r2": ("r", ENTRY)})},
    ),
    Case(
        "extend of a reader's holding, in the hash and the index",
        RW_EXTEND,
        "rw",
        {"lock": Holders({"me": ("r", 500), "r2": ("r", 700)})},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        1,
        {"lock": Holders({"me": ("r", Between(501, TTL)), "r2": ("r", Between(1, 700))})},
    ),
    Case(
        "extend of a holding not held answers 0",
        RW_EXTEND,
        "rw",
        {"lock": Holders({"r2": ("r", 700)})},
        {"token": "me", "ms": TTL, "queue": "{queue}"},
        0,
        {"lock": Holders({"r2": ("r", Between(1, 700))})},
    ),
    Case(
        "batched renewal of holdings: held, gone",
        RW_EXTEND_MANY,
        "rw",
        {"lock": Holders({"me": ("w", 500)})},
        {
            "locks": ["{lock}", "{lock@b}"],
            "ms": TTL,
            "suffix": ":queue:rw",
            "tokens": ["me", "me"],
        },
        [2],
        {"lock": Holders({"me": ("w", Between(501, TTL))})},
    ),
    Case(
        "state: readers, the writer, time to the first end, whether the token holds",
        RW_STATE,
        "rw",
        {"lock": Holders({"me": ("r", 5000), "r2": ("r", 3000)})},
        {"token": "me", "asking": "w"},
        [2, 0, Between(1, 3000), 1],
        {"lock": Holders({"me": ("r", Between(1, 5000)), "r2": ("r", Between(1, 3000))})},
    ),
    Case(
        "state: a reader asking while readers hold is admitted now (-2)",
        RW_STATE,
        "rw",
        {"lock": Holders({"r2": ("r", 3000)})},
        {"token": "", "asking": "r"},
        [1, 0, -2, 0],
        {"lock": Holders({"r2": ("r", Between(1, 3000))})},
    ),
]


#: A forced release's mark: the forcer, for the holder's lease left plus FORCED_MARK_MS.
def marked(left: int) -> Str:
    """The mark left for a holder whose lease had ``left`` ms."""
    return Str("ops", Between(FORCED_MARK_MS + left - 1000, FORCED_MARK_MS + left))


FORCE_CASES = [
    Case(
        "force a held lock with a live waiter: granted at once, the holder's token marked",
        FORCE,
        "lock",
        {"lock": Str("stuck", 5000), "queue": Lst(["w1"]), "entry:w1": entry(1500)},
        {"forcer": "ops"},
        ["stuck", 1500],
        {"lock": Str("w1", Between(1, 1500)), "forced:stuck": marked(5000)},
    ),
    Case(
        "force a held lock nobody waits for: deleted, marked",
        FORCE,
        "lock",
        {"lock": Str("stuck", 5000)},
        {"forcer": "ops"},
        ["stuck", None],
        {"forced:stuck": marked(5000)},
    ),
    Case(
        "force a free lock: nothing",
        FORCE,
        "lock",
        {"queue": Lst(["w1"]), "entry:w1": entry()},
        {"forcer": "ops"},
        [None, None],
        {"queue": Lst(["w1"]), "entry:w1": Str("2000 1 t1", ENTRY)},
    ),
    Case(
        "force a semaphore: every permit taken and marked, as many waiters granted",
        SEMAPHORE_FORCE,
        "semaphore",
        {
            "lock": Permits({"a": 5000, "b": 4000}),
            "queue": Lst(["w1", "w2", "w3"]),
            "entry:w1": entry(),
            "entry:w2": entry(),
            "entry:w3": entry(),
        },
        {"forcer": "ops"},
        [["b", "a"], 2],
        {
            "lock": Permits({"w1": ENTRY, "w2": ENTRY}),
            "queue": Lst(["w3"], queue_left(2000)),
            "entry:w3": Str("2000 1 t1", ENTRY),
            "forced:a": marked(5000),
            "forced:b": marked(4000),
        },
    ),
    Case(
        "force a read-write lock: its readers taken and marked, the waiting writer granted",
        RW_FORCE,
        "rw",
        {
            "lock": Holders({"r1": ("r", 5000), "r2": ("r", 4000)}),
            "queue": Lst(["w"]),
            "entry:w": entry(letter="w"),
        },
        {"forcer": "ops"},
        [["r1", "r2"], 1],
        {
            "lock": Holders({"w": ("w", ENTRY)}),
            "forced:r1": marked(5000),
            "forced:r2": marked(4000),
        },
    ),
]

CASES = LOCK_CASES + SEMAPHORE_CASES + RW_CASES + FORCE_CASES


# --- running a row ------------------------------------------------------------------


def _ms(value: int | Between) -> int:
    """A lease of the state before: a number (bounds are for the state after)."""
    assert isinstance(value, int), value
    return value


class Table:
    """The keys of one row's name, by role, and the server's clock."""

    def __init__(self, admin: redis.Redis, name: str, kind: str) -> None:
        self.admin: Any = admin  # (decode_responses=True: str replies, which its types do not say)
        self.name = name
        self.kind = kind

    def key(self, role: str) -> str:
        """The key of ``role``: lock, queue, fence, index, entry:<token>, mark:<id>, lock@<n>."""
        base, _, other = role.partition("@")
        keys = keys_for(f"{self.name}.{other}" if other else self.name, kind=self.kind)
        what, _, arg = base.partition(":")
        if what == "entry":
            return keys.entry(arg)
        if what == "mark":
            return keys.mark(arg)
        if what == "forced":
            return keys.forced(arg)
        if what == "index":
            return keys.lock + RW_INDEX_SUFFIX
        return str(getattr(keys, what))

    async def now(self) -> int:
        """The server's clock in ms."""
        seconds, micros = await self.admin.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def write(self, state: State) -> None:
        """Set up ``state``."""
        now = await self.now()
        for role, value in state.items():
            key = self.key(role)
            if isinstance(value, Str):
                assert isinstance(value.value, str)
                await self.admin.set(key, value.value, px=value.ms)
            elif isinstance(value, Lst):
                await self.admin.rpush(key, *value.items)
                if value.ms is not None:
                    await self.admin.pexpire(key, value.ms)
            elif isinstance(value, Permits):
                ends = {token: now + _ms(left) for token, left in value.left.items()}
                await self.admin.zadd(key, ends)
                await self.admin.pexpireat(key, max(max(ends.values()), now + 1000))
            else:
                index = self.key("index")
                for token, (kind, left) in value.left.items():
                    end = now + _ms(left)
                    await self.admin.hset(key, token, f"{kind}{end}")
                    await self.admin.zadd(index, {token: end})
                    if kind == "w":
                        await self.admin.hset(key, "=w", token)
                last = max(now + _ms(left) for _, left in value.left.values())
                await self.admin.pexpireat(key, max(last, now + 1000))
                await self.admin.pexpireat(index, max(last, now + 1000))

    async def read(self, roles: list[str]) -> tuple[set[str], dict[str, Any]]:
        """Every key of the row's names, and what ``roles`` hold (as the State classes say)."""
        found = set(await self.admin.keys(f"*{self.name}*"))
        now = await self.now()
        seen: dict[str, Any] = {}
        for role in roles:
            key = self.key(role)
            kind = await self.admin.type(key)
            pttl = await self.admin.pttl(key)
            if kind == "string":
                seen[role] = Str(await self.admin.get(key), pttl)
            elif kind == "list":
                seen[role] = Lst(await self.admin.lrange(key, 0, -1), pttl)
            elif kind == "zset":
                members = await self.admin.zrange(key, 0, -1, withscores=True)
                seen[role] = Permits({m: int(score) - now for m, score in members})
            elif kind == "hash":
                fields = await self.admin.hgetall(key)
                writer = fields.pop("=w", None)
                index = await self.admin.zrange(self.key("index"), 0, -1, withscores=True)
                assert {t: f"{fields[t][:1]}{int(s)}" for t, s in index} == fields, (
                    "the index and the hash disagree"
                )
                writers = [t for t, v in fields.items() if v.startswith("w")]
                assert writers == ([writer] if writer else []), "the writer's mark is wrong"
                seen[role] = Holders({t: (v[:1], int(v[1:]) - now) for t, v in fields.items()})
        return found, seen


def _expected_keys(table: Table, after: State) -> set[str]:
    keys = {table.key(role) for role in after}
    keys |= {
        table.key("index") for value in after.values() if isinstance(value, Holders) and value.left
    }
    return keys


def _matches(seen: Any, want: Str | Lst | Permits | Holders) -> bool:
    if isinstance(want, Str | Lst):
        body = want.value if isinstance(want, Str) else want.items
        got = seen.value if isinstance(seen, Str) else getattr(seen, "items", None)
        if isinstance(body, Between) and isinstance(got, str) and got.isdigit():
            got = int(got)
        return type(seen) is type(want) and got == body and (want.ms is None or seen.ms == want.ms)
    return type(seen) is type(want) and seen.left == want.left


def _named(table: Table, script: Script, call: dict[str, Any]) -> dict[str, Any]:
    """The row's call with the script's keys, channel and ``sharded`` filled in by name."""
    values: dict[str, Any] = {}
    for name in script.keys:
        values[name] = table.key(name)
    if "channel" in script.args:
        values["channel"] = keys_for(table.name, kind=table.kind).channel
    if "sharded" in script.args:
        values["sharded"] = "0"
    for name, value in call.items():
        if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
            value = table.key(value[1:-1])
        elif isinstance(value, list):
            value = [
                table.key(v[1:-1]) if isinstance(v, str) and v.startswith("{") else v for v in value
            ]
        values[name] = value
    return values


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_script(admin: redis.Redis, name: str, case: Case) -> None:
    """The row's script, called by name on the state before, answers and leaves the state after."""
    table = Table(admin, name, case.kind)
    try:
        await table.write(case.before)
        keys, args = case.script.call(**_named(table, case.script, case.call))
        if case.raises is None:
            reply = await admin.evalsha(
                await admin.script_load(case.script.text), len(keys), *keys, *args
            )
            assert reply == case.reply, f"{case.script.name} answered {reply!r}"
        else:
            with pytest.raises(ResponseError, match=case.raises):
                await admin.evalsha(
                    await admin.script_load(case.script.text), len(keys), *keys, *args
                )
        found, seen = await table.read(list(case.after))
        assert found == _expected_keys(table, case.after), "the keys after are not the row's"
        for role, want in case.after.items():
            assert _matches(seen.get(role), want), f"{role}: {seen.get(role)!r}, wanted {want!r}"
    finally:
        leftover = await admin.keys(f"*{name}*")
        if leftover:
            await admin.delete(*leftover)


def test_every_script_has_rows() -> None:
    """Each script of the package (but those over several names, tested below) has rows."""
    called = {case.script.name for case in CASES}
    below = {"STATUS_HOLDERS", "STATUS_INSPECT", "MULTI_ACQUIRE", "MULTI_RELEASE", "MULTI_FENCE"}
    assert {s.name for s in SCRIPTS.values()} - called == below


async def test_status_holders_lists_every_holder_with_its_end(
    admin: redis.Redis, name: str
) -> None:
    """STATUS_HOLDERS gives the server's clock and each permit's, reader's or writer's end."""
    sem = Table(admin, f"{name}.s", "semaphore")
    rw = Table(admin, f"{name}.r", "rw")
    try:
        await sem.write({"lock": Permits({"p1": 5000, "p2": 3000})})
        await rw.write({"lock": Holders({"w1": ("w", 4000)})})
        for table, want in ((sem, {("p", 5000), ("p", 3000)}), (rw, {("w", 4000)})):
            keys, args = STATUS_HOLDERS.call(lock=table.key("lock"))
            now, holders = decode_holders(
                await admin.eval(STATUS_HOLDERS.text, len(keys), *keys, *args)
            )
            got = {(kind, at - now) for kind, at in holders}
            assert {kind for kind, _ in got} == {kind for kind, _ in want}
            assert all(any(k == kind and 0 < left <= ms for k, ms in want) for kind, left in got), (
                got
            )
            assert len(got) == len(want)
    finally:
        leftover = await admin.keys(f"*{name}*")
        if leftover:
            await admin.delete(*leftover)


async def test_status_inspect_reads_holders_and_live_waiters_and_writes_nothing(
    admin: redis.Redis, name: str
) -> None:
    """STATUS_INSPECT: the holder, its lease, the fence; live waiters in order; no write.

    A dead waiter (no entry) and a kept one whose keeper's mark is gone are
    left out, and left where they are (a release's grant drops them).
    """
    table = Table(admin, name, "lock")
    sem_queue = keys_for(name, kind="semaphore").queue
    rw_queue = keys_for(name, kind="rw").queue
    try:
        await table.write(
            {
                "lock": Str("holder", 5000),
                "fence": Str("42"),
                "queue": Lst(["dead", "w1", "kept", "w2"]),
                "entry:w1": entry(),
                "entry:kept": entry(keeper="k1"),
                "entry:w2": entry(keeper="k2"),
                "mark:k2": Str("1", 2000),
            }
        )
        before = sorted(await admin.keys(f"*{name}*"))
        keys, args = STATUS_INSPECT.call(
            lock=table.key("lock"),
            fence=table.key("fence"),
            queue=table.key("queue"),
            semaphore_queue=sem_queue,
            rw_queue=rw_queue,
            most="10",
        )
        _, kind, holders, waiters, fence = await admin.eval(
            STATUS_INSPECT.text, len(keys), *keys, *args
        )
        assert (kind, holders[:2], fence) == ("string", ["holder", ""], "42")
        assert 0 < int(holders[2]) <= 5000
        assert waiters == ["1", "w1", "1", "w2"]
        assert sorted(await admin.keys(f"*{name}*")) == before
    finally:
        leftover = await admin.keys(f"*{name}*")
        if leftover:
            await admin.delete(*leftover)


# --- the queue entry's one format ---------------------------------------------------

ROUND_TRIP = [
    Entry(2000, "", 1),
    Entry(2000, "f", 3, "a1b2"),
    Entry(10_000, "r", 12, "t9", "k1"),
    Entry(1500, "w", 2, "", "k2"),  # kept, with no grant channel: the tag stays, empty
]

#: A script that reads ARGV[1] with lib/entry.lua's parser and answers its five parts.
_PARSE = resolve(
    "--@include entry\nlocal ms, letter, n, tag, keeper = parse_entry(ARGV[1])\n"
    "if not ms then return false end\nreturn {ms, letter, n, tag, keeper}\n"
)


@pytest.mark.parametrize("written", ROUND_TRIP, ids=[repr(e) for e in ROUND_TRIP])
async def test_a_python_written_entry_reads_the_same_in_lua(
    admin: redis.Redis, written: Entry
) -> None:
    """encode_entry's text, read by lib/entry.lua on the server and by parse_entry: the same."""
    text = encode_entry(*written)
    assert parse_entry(text) == written
    parts = await admin.eval(_PARSE, 0, text)
    assert parts == [
        str(written.ms),
        written.letter,
        str(written.number),
        written.tag,
        written.keeper,
    ]


@pytest.mark.parametrize("text", ["", "x 1 t", "2000", "2000 x", "2000ff 1", "2000 1 t-1"])
async def test_an_unreadable_entry_is_unreadable_on_both_sides(
    admin: redis.Redis, text: str
) -> None:
    """What one parser refuses, the other does too."""
    assert parse_entry(text) is None
    assert await admin.eval(_PARSE, 0, text) is None


# --- the bindings and the headers ---------------------------------------------------

T, U = "t", "u"  # tokens


def test_a_call_builds_keys_and_arguments_in_the_headers_order() -> None:
    """Given by name in any order, the values come out as KEYS and ARGV in the header's order."""
    keys, args = RELEASE.call(sharded="0", channel="c", token=T, fence="f", queue="q", lock="l")
    assert keys == ("l", "q", "f")
    assert args == ("t", "c", "0")
    keys, args = EXTEND_MANY.call(tokens=["a", "b"], suffix=":queue", ms=1, locks=["k1", "k2"])
    assert keys == ("k1", "k2")
    assert args == (1, ":queue", "a", "b")


def test_a_missing_or_unknown_name_is_a_type_error() -> None:
    """A call missing a name, or naming one the script lacks, says which and fails."""
    with pytest.raises(TypeError, match=r"missing \['channel', 'sharded'\]"):
        RELEASE.call(lock="l", queue="q", fence="f", token=T)
    with pytest.raises(TypeError, match=r"unknown \['limit'\]"):
        RELEASE.call(lock="l", queue="q", fence="f", token=T, channel="c", sharded="0", limit="2")
    with pytest.raises(TypeError, match=r"has no key or argument named \['kind'\]"):
        RELEASE.bind(kind="r")
    with pytest.raises(TypeError, match=r"\['token'\] given again"):
        RELEASE.bind(token=T).call(
            token=U, lock="l", queue="q", fence="f", channel="c", sharded="0"
        )
    with pytest.raises(TypeError, match="takes a sequence"):
        KEEP.call(queue="q", keeper="k", drop=0, extend=0, life=1, tokens="abc")


def test_a_bound_script_fills_in_its_fixed_names() -> None:
    """bind() fixes some names; call() gives the rest."""
    bound = SEMAPHORE_RELEASE.bind(lock="l", queue="q", channel="c", sharded="1", limit="3")
    assert bound.call(token=T) == (("l", "q"), ("t", "c", "1", "3"))


def test_only_gives_the_one_argument_left_where_call_would_put_it() -> None:
    """only(v) is call(name=v) with every key bound and one argument left; else a TypeError."""
    sem = SEMAPHORE_RELEASE.bind(lock="l", queue="q", channel="c", sharded="1", limit="3")
    assert sem.only(T) == sem.call(token=T) == (("l", "q"), ("t", "c", "1", "3"))
    last = SEMAPHORE_RELEASE.bind(lock="l", queue="q", token=T, channel="c", sharded="1")
    assert last.only("3") == last.call(limit="3")
    with pytest.raises(TypeError, match=r"only\(\) needs every key bound and one argument left"):
        SEMAPHORE_RELEASE.bind(lock="l", queue="q", channel="c", sharded="1").only(T)
    with pytest.raises(TypeError, match=r"left: \['lock', 'token'\]"):
        SEMAPHORE_RELEASE.bind(queue="q", channel="c", sharded="1", limit="3").only(T)


@pytest.mark.parametrize("script", [ACQUIRE, SEMAPHORE_ACQUIRE, RW_ACQUIRE], ids=lambda s: s.name)
def test_every_acquire_script_opens_with_the_arguments_lead_fills_in(script: Script) -> None:
    """The waiter's hot path gives an acquire script's first five arguments by position."""
    assert script.args[: len(ACQUIRE_LEAD)] == ACQUIRE_LEAD
    named = {"lock": "l", "queue": "q", "fence": "f", "index": "i", "channel": "c"}
    fixed = {name: value for name, value in named.items() if name in script.keys + script.args}
    rest = {name: f"<{name}>" for name in script.args[len(ACQUIRE_LEAD) :]}
    bound = script.bind(**fixed, **{k: v for k, v in rest.items() if k not in fixed})
    values = ("tok", 2000, "2000 1 t", 1400, "1")
    assert bound.lead(*values) == bound.call(**dict(zip(ACQUIRE_LEAD, values, strict=True)))


def test_lead_needs_every_key_bound_and_the_first_arguments_left() -> None:
    """lead() refuses a key left, an argument left past the first ones, or a wrong count."""
    fixed = {"fencing": "0", "channel": "c", "sharded": "0"}
    bound = ACQUIRE.bind(lock="l", queue="q", fence="f", **fixed)
    with pytest.raises(TypeError, match=r"first 5 arguments given in order, got 4"):
        bound.lead("t", 1, "e", 2)
    with pytest.raises(TypeError, match=r"lead\(\) needs every key bound"):
        ACQUIRE.bind(queue="q", fence="f", **fixed).lead("t", 1, "e", 2, "1")
    later = ACQUIRE.bind(lock="l", queue="q", fence="f", token=T, **fixed)  # (ARGV[1] bound)
    with pytest.raises(TypeError, match=r"left: \['ms', 'entry', 'entry_ms', 'looks'\]"):
        later.lead(1, "e", 2, "1")


@pytest.mark.parametrize(
    ("header", "said"),
    [
        ("return 1\n", "first line"),
        ("-- X: y\n-- KEYS[2] a: b\n-- return 1\n", "out of order"),
        ("-- X: y\n-- KEYS[1] a: b\n-- ARGV[1] a: b\n-- return 1\n", "given twice"),
        ("-- X: y\n-- KEYS[1...] a: b\n-- KEYS[2] c: d\n-- return 1\n", "out of order"),
        ("-- X: y\n-- KEYS[1] a: b\n", "says nothing of the reply"),
        ("-- X: y\n-- KEYS[1]: b\n-- return 1\n", "cannot read"),
    ],
)
def test_a_bad_header_is_refused(header: str, said: str) -> None:
    """A header out of order, naming one thing twice, or without its reply is an error at load."""
    with pytest.raises(ValueError, match=said):
        parse_header(header + "return 1\n", "bad")


def test_includes_resolve_once_each_dependencies_first() -> None:
    """A library included twice (directly and through another) is declared once, users after."""
    text = resolve("-- X: y\n-- return 1\n--@include grant\n--@include fence\nreturn 1\n")
    assert text.count("local function next_fence") == 1
    assert text.count("local function parse_entry") == 1
    assert text.index("local function parse_entry") < text.index("local function read_entry")
    assert text.index("local function read_entry") < text.index("local function grant_next")
    assert "--@include" not in text


def test_constants_are_declared_where_named_and_only_there() -> None:
    """A Python constant the code names is a local in front of it; one it does not name is not."""
    assert f"local QUEUE_SLACK_MS = {QUEUE_SLACK_MS}\n" in RELEASE.text
    assert "KEEPER_MARK_MS" not in RELEASE.text
    assert f"local KEEPER_MARK_MS = {KEEPER_MARK_MS}\n" in KEEP.text
    assert f"local RW_INDEX_SUFFIX = '{RW_INDEX_SUFFIX}'\n" in RW_EXTEND.text


def test_a_circle_of_includes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Libraries that include each other are an error, not an endless loop."""
    from aiolock import _scripts

    sources = {"lib/a.lua": "--@include b\n", "lib/b.lua": "--@include a\n"}
    monkeypatch.setattr(_scripts, "lua_source", sources.__getitem__)
    with pytest.raises(ValueError, match="include each other"):
        resolve("-- X: y\n-- return 1\n--@include a\n")


# --- the scripts over several names (MultiLock) ------------------------------------------------


async def _run(
    admin: redis.Redis, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]
) -> Any:
    """Call ``script`` by SHA on the server."""
    return await admin.evalsha(await admin.script_load(script.text), len(keys), *keys, *args)


def _multi_acquire(
    names: list[str],
    token: str = "me",  # noqa: S107 - a lock token, not a password
    ms: int = TTL,
    fencing: str = "0",
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """MULTI_ACQUIRE's keys and arguments for ``names`` (each name's lock, queue, fence)."""
    every = [keys_for(n) for n in names]
    return MULTI_ACQUIRE.call(
        token=token,
        ms=ms,
        fencing=fencing,
        sharded="0",
        channels=[k.channel for k in every],
        names=[key for k in every for key in (k.lock, k.queue, k.fence)],
    )


@pytest.fixture
async def three(admin: redis.Redis, name: str) -> AsyncIterator[list[str]]:
    """Three names of the test's own (their keys deleted after)."""
    yield [f"{name}:a", f"{name}:b", f"{name}:c"]
    leftover = await admin.keys(f"*{name}*")
    if leftover:
        await admin.delete(*leftover)


async def test_multi_acquire_takes_every_free_lock_and_answers_the_same_again(
    admin: redis.Redis, three: list[str]
) -> None:
    """Every key free: each gets the token with the lease; run again: the same answer, renewed."""
    keys, args = _multi_acquire(three)
    assert await _run(admin, MULTI_ACQUIRE, keys, args) == [1, 0]
    for n in three:
        assert await admin.get(keys_for(n).lock) == "me"
        assert 0 < await admin.pttl(keys_for(n).lock) <= TTL
    assert await _run(admin, MULTI_ACQUIRE, keys, args) == [1, 0]


async def test_multi_acquire_takes_nothing_while_one_is_held_and_names_the_longest(
    admin: redis.Redis, three: list[str]
) -> None:
    """b held 3 s, c 6 s, a ours already: nothing taken, a given back, c named with its lease."""
    await admin.set(keys_for(three[0]).lock, "me", px=5000)
    await admin.set(keys_for(three[1]).lock, "other", px=3000)
    await admin.set(keys_for(three[2]).lock, "other2", px=6000)
    keys, args = _multi_acquire(three)
    taken, pttl, which = await _run(admin, MULTI_ACQUIRE, keys, args)
    assert (taken, which) == (0, 3)
    assert 3000 < pttl <= 6000
    assert await admin.exists(keys_for(three[0]).lock) == 0, "our own key was kept"
    assert await admin.get(keys_for(three[1]).lock) == "other"


async def test_multi_acquire_names_a_key_without_expiry_first(
    admin: redis.Redis, three: list[str]
) -> None:
    """A key without expiry (another library's lock) keeps it out for good: -1, that name."""
    await admin.set(keys_for(three[0]).lock, "other", px=9000)
    await admin.set(keys_for(three[1]).lock, "foreign")
    keys, args = _multi_acquire(three)
    assert await _run(admin, MULTI_ACQUIRE, keys, args) == [0, -1, 2]
    assert await admin.exists(keys_for(three[2]).lock) == 0


async def test_multi_acquire_leaves_a_free_lock_to_its_queued_waiters(
    admin: redis.Redis, three: list[str]
) -> None:
    """A free lock whose queue holds an ordinary lock's waiter: not taken; the queue's life said."""
    await admin.rpush(keys_for(three[1]).queue, "waiter")
    await admin.pexpire(keys_for(three[1]).queue, 4000)
    keys, args = _multi_acquire(three)
    taken, pttl, which = await _run(admin, MULTI_ACQUIRE, keys, args)
    assert (taken, which) == (0, 2)
    assert 0 < pttl <= 4000
    assert await admin.exists(*(keys_for(n).lock for n in three)) == 0


async def test_multi_acquire_moves_every_counter_to_one_fence_above_them_all(
    admin: redis.Redis, three: list[str]
) -> None:
    """Fencing: the fence is one above the largest counter, and every counter moves to it."""
    top = 4 * 10**15
    await admin.set(keys_for(three[0]).fence, top)
    await admin.set(keys_for(three[1]).fence, top + 7)
    keys, args = _multi_acquire(three, fencing="1")
    assert await _run(admin, MULTI_ACQUIRE, keys, args) == [1, top + 8]
    for n in three:
        assert await admin.get(keys_for(n).fence) == str(top + 8)


async def test_multi_acquire_tells_a_name_of_another_kind(
    admin: redis.Redis, three: list[str]
) -> None:
    """A name whose key is a semaphore's (a sorted set): [-1, its number], nothing taken."""
    await admin.zadd(keys_for(three[1]).lock, {"permit": 1})
    keys, args = _multi_acquire(three)
    assert await _run(admin, MULTI_ACQUIRE, keys, args) == [-1, 2]
    assert await admin.exists(keys_for(three[0]).lock, keys_for(three[2]).lock) == 0


async def test_multi_release_frees_only_the_keys_that_hold_the_token(
    admin: redis.Redis, three: list[str]
) -> None:
    """Two keys ours, one another's: 2 freed, the other's kept, each release announced."""
    a, b, c = (keys_for(n) for n in three)
    await admin.set(a.lock, "me", px=5000)
    await admin.set(b.lock, "other", px=5000)
    await admin.set(c.lock, "me", px=5000)
    pubsub = admin.pubsub()
    await pubsub.subscribe(a.channel, c.channel)
    try:
        keys, args = MULTI_RELEASE.call(
            token="me",  # noqa: S106 - a lock token, not a password
            sharded="0",
            channels=[a.channel, b.channel, c.channel],
            locks=[a.lock, b.lock, c.lock],
        )
        assert await _run(admin, MULTI_RELEASE, keys, args) == 2
        assert await admin.exists(a.lock, c.lock) == 0
        assert await admin.get(b.lock) == "other"
        heard: set[str] = set()
        for _ in range(100):  # (an ignored subscribe confirmation reads as None too)
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
            if message is not None:
                heard.add(message["channel"])
            if len(heard) == 2:
                break
        assert heard == {a.channel, c.channel}
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_multi_fence_raises_only_the_counters_below_the_fence(
    admin: redis.Redis, three: list[str]
) -> None:
    """Counters 5, 50 and none, fence 20: 20, 50 (left alone) and 20; two raised."""
    a, b, c = (keys_for(n) for n in three)
    await admin.set(a.fence, 5)
    await admin.set(b.fence, 50)
    keys, args = MULTI_FENCE.call(fence=20, fences=[a.fence, b.fence, c.fence])
    assert await _run(admin, MULTI_FENCE, keys, args) == 2
    assert [await admin.get(k.fence) for k in (a, b, c)] == ["20", "50", "20"]
