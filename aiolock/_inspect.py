"""Who holds a name, who waits for it, and freeing it on purpose: what an operator asks.

:func:`inspect` reads a name's key and queues in one read-only script
(``status/inspect.lua``) and names each holder and waiter by the identity
its token carries (:mod:`aiolock._identity`). :func:`held_names` lists the
names held on a server (every master of a cluster), and :func:`force_release`
frees a name for ``aiolock release --force``: the kind's force script takes
the key from its holders, marks each of their tokens with the forcer's name
(their next renewal or release reads it: "released by force by …") and
grants the next waiters at once, by the same grant rule as a release.
"""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Final, final

from ._checks import check_client
from ._identity import UNKNOWN, identity_of, marks_of, minted_at
from ._keys import DEFAULT_PREFIX, QUEUES, Keys
from ._scripts import FORCE, RW_FORCE, RW_INDEX_SUFFIX, SEMAPHORE_FORCE, STATUS_INSPECT
from ._types import Client, is_cluster
from ._wire import Wire

__all__ = [
    "HolderInfo",
    "LockInfo",
    "WaiterInfo",
    "force_release",
    "held_names",
    "inspect",
]

#: The most waiters :func:`inspect` reads from a queue by default.
WAITERS_MOST: Final = 1000
#: The kind of a queue, by its number in the inspect script's reply (1 to 3).
_QUEUE_KINDS: Final = {1: "lock", 2: "semaphore", 3: "rwlock"}
#: The kind of a key, by its type on the server.
_KEY_KINDS: Final = {"string": "lock", "zset": "semaphore", "hash": "rwlock"}
#: What a holder's role letter says, in words.
_ROLES: Final = {"": "holder", "p": "permit", "r": "reader", "w": "writer"}


@final
@dataclass(frozen=True, slots=True)
class HolderInfo:
    """One holder of a name, as the server sees it (see :func:`inspect`).

    Attributes:
        identity: who holds it: the holder's ``identity=``, else its default
            ``host:pid:task-name`` (the task that called ``acquire()``);
            ``"unknown"`` for a token that carries none (an older version's).
        acquired_at: when the holder's ``acquire()`` call began, in seconds
            since the epoch by the holder's clock: its token is minted then.
            For a holder that waited, the time it started waiting, not the
            time it was granted; None for a token that does not say.
        remaining: seconds left of its lease by the server's clock (None: a
            key without expiry, which aiolock never writes).
        fence: its fencing number: a lock's or an election's holder that
            acquired with ``fencing=True`` (every election term); else None.
        role: ``"holder"`` (a lock, an election), ``"permit"`` (a
            semaphore), ``"reader"`` or ``"writer"`` (a read-write lock).
    """

    identity: str
    acquired_at: float | None
    remaining: float | None
    fence: int | None
    role: str = "holder"


@final
@dataclass(frozen=True, slots=True)
class WaiterInfo:
    """One waiter in a name's queue on the server (see :func:`inspect`).

    Attributes:
        identity: who waits, as :attr:`HolderInfo.identity`.
    """

    identity: str


@final
@dataclass(frozen=True, slots=True)
class LockInfo:
    """A name as the server sees it: what :func:`inspect` returns.

    Attributes:
        name: the name asked about.
        kind: ``"lock"`` (an :class:`~aiolock.AsyncLock`, a
            :class:`~aiolock.MultiLock`'s name, a node of a
            :class:`~aiolock.Redlock`), ``"election"``, ``"semaphore"`` or
            ``"rwlock"``.
        holders: its holders, first ending first (a lock and an election
            have one at most).
        waiters: the waiters in its queue on the server, in the order they
            will be served. Tasks that wait inside their process behind
            another task of the same client are not in it (they are not on
            the server); ``fair=True`` puts every waiting task there.
    """

    name: str
    kind: str
    holders: list[HolderInfo] = field(default_factory=list)
    waiters: list[WaiterInfo] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def inspect(
    client: Client, name: str, *, prefix: str = DEFAULT_PREFIX, waiters: int = WAITERS_MOST
) -> LockInfo | None:
    """Who holds ``name`` and who waits for it, as the server sees it now; None if nobody.

    One read-only script on the server (it changes nothing). Works for
    every primitive on a name; a name's holders are named by the identity
    each acquisition carries (``identity=``, by default
    ``host:pid:task-name``).

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        name: the name, as given to the primitive.
        prefix: the key prefix the primitive was given.
        waiters: the most waiters read from the queue (the first ones).

    Returns:
        A :class:`LockInfo`, or None for a name that nobody holds or waits for.

    Raises:
        TypeError: ``client`` is not a redis.asyncio client, or ``name`` /
            ``prefix`` not a str, or ``waiters`` not an int.
        ValueError: an empty name, or ``waiters`` below 1.
        redis.exceptions.RedisError: the server failed.
    """
    client = check_client(client)
    if isinstance(waiters, bool) or not isinstance(waiters, int):
        raise TypeError(f"waiters must be an int, got {waiters!r}")
    if waiters < 1:
        raise ValueError(f"waiters must be at least 1, got {waiters!r}")
    keys = Keys(name, prefix)
    lock = keys.lock
    named, args = STATUS_INSPECT.call(
        lock=lock,
        fence=keys.fence,
        queue=keys.queue,
        semaphore_queue=f"{lock}:queue{QUEUES['semaphore']}",
        rw_queue=f"{lock}:queue{QUEUES['rw']}",
        most=str(waiters),
    )
    _, key_type, raw_holders, raw_waiters, raw_fence = await Wire(client).run(
        STATUS_INSPECT, named, args
    )
    key_type = _text(key_type)
    holders: list[HolderInfo] = []
    election = False
    for i in range(0, len(raw_holders), 3):
        token = _text(raw_holders[i])
        role = _text(raw_holders[i + 1])
        ms = int(raw_holders[i + 2])
        marks = marks_of(token)
        election = election or "e" in marks
        fence = None
        if role == "" and "f" in marks and raw_fence is not None:
            try:
                fence = int(raw_fence)
            except ValueError:
                fence = None
        holders.append(
            HolderInfo(
                identity_of(token) or UNKNOWN,
                minted_at(token),
                ms / 1000 if ms >= 0 else None,
                fence,
                _ROLES.get(role, role),
            )
        )
    holders.sort(key=lambda h: float("inf") if h.remaining is None else h.remaining)
    queued: list[WaiterInfo] = []
    queue_kind = None
    for i in range(0, len(raw_waiters), 2):
        number = int(raw_waiters[i])
        token = _text(raw_waiters[i + 1])
        if queue_kind is None:
            queue_kind = _QUEUE_KINDS.get(number)
            election = election or (not holders and "e" in marks_of(token))
        queued.append(WaiterInfo(identity_of(token) or UNKNOWN))
    if not holders and not queued:
        return None
    kind = _KEY_KINDS.get(key_type) or queue_kind or "lock"
    if kind == "lock" and election:
        kind = "election"
    return LockInfo(name, kind, holders, queued)


async def held_names(
    client: Client, pattern: str = "*", *, prefix: str = DEFAULT_PREFIX, count: int = 500
) -> AsyncGenerator[str, None]:
    """Yield the names whose key exists (held, or its queue's), ``SCAN`` over every master.

    ``pattern`` is a glob over the names (``*``, ``?``, ``[...]``, as
    ``SCAN MATCH``). Each name comes once per master that has it (once, on
    a cluster, where a key lives on one master). The companion keys (queues,
    fences, marks) are not names and are left out.
    """
    match = f"{_glob_escape(prefix)}{{{pattern}}}"
    if is_cluster(client):
        await client.initialize()  # (a fresh client knows no node yet)
        for node in client.get_primaries():
            cursor = 0
            while True:
                # (A cluster client answers ({node name: next cursor}, keys).)
                reply: Any = await client.scan(cursor, match=match, count=count, target_nodes=node)
                cursors, found = reply
                cursor = cursors[node.name]
                for key in found:
                    name = _name_of(_text(key), prefix, pattern)
                    if name is not None:
                        yield name
                if int(cursor) == 0:
                    break
        return
    async for key in client.scan_iter(match=match, count=count):
        name = _name_of(_text(key), prefix, pattern)
        if name is not None:
            yield name


def _glob_escape(text: str) -> str:
    """``text`` matched as it is by a ``SCAN MATCH`` glob."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _name_of(key: str, prefix: str, pattern: str) -> str | None:
    """The name whose lock key is ``key``, or None for a companion key (or a mismatch)."""
    if not (key.startswith(f"{prefix}{{") and key.endswith("}")):
        return None
    name = key[len(prefix) + 1 : -1]
    if not fnmatch.fnmatchcase(name, pattern):
        return None
    return name


@final
@dataclass(frozen=True, slots=True)
class Forced:
    """What :func:`force_release` did.

    Attributes:
        kind: the kind of the name it freed (as :attr:`LockInfo.kind`), or
            None if nobody held it.
        holders: the identities it took the name from (empty: it was not held).
        granted: how many waiters it granted the name (or permits) to at once.
    """

    kind: str | None
    holders: list[str]
    granted: int


async def force_release(
    client: Client, name: str, forcer: str, *, prefix: str = DEFAULT_PREFIX
) -> Forced:
    """Free ``name`` from all of its holders, on purpose; grant its next waiters at once.

    Each holder's token is marked with ``forcer``: its next renewal (or
    release, or extend) finds the key gone and reports the loss as
    "released by force by <forcer>". A semaphore loses every permit held
    (and grants at most as many), a read-write lock its readers or writer.
    """
    client = check_client(client)
    keys = Keys(name, prefix)
    wire = Wire(client)
    sharded = "1" if wire.cluster else "0"
    key_type = _text(await client.type(keys.lock))
    kind = _KEY_KINDS.get(key_type)
    if kind == "lock":
        named, args = FORCE.call(
            lock=keys.lock,
            queue=keys.queue,
            fence=keys.fence,
            forcer=forcer,
            channel=keys.channel,
            sharded=sharded,
        )
        token, granted = await wire.run(FORCE, named, args)
        if not token:
            return Forced(None, [], 0)
        text = _text(token)
        kind = "election" if "e" in marks_of(text) else "lock"
        return Forced(kind, [identity_of(text) or UNKNOWN], 1 if granted else 0)
    if kind == "semaphore":
        sem_keys = Keys(name, prefix, kind="semaphore")
        named, args = SEMAPHORE_FORCE.call(
            lock=keys.lock,
            queue=sem_keys.queue,
            forcer=forcer,
            channel=keys.channel,
            sharded=sharded,
        )
    elif kind == "rwlock":
        rw_keys = Keys(name, prefix, kind="rw")
        named, args = RW_FORCE.call(
            lock=keys.lock,
            queue=rw_keys.queue,
            index=f"{keys.lock}{RW_INDEX_SUFFIX}",
            forcer=forcer,
            channel=keys.channel,
            sharded=sharded,
        )
    else:
        return Forced(None, [], 0)
    script = SEMAPHORE_FORCE if kind == "semaphore" else RW_FORCE
    tokens, granted = await wire.run(script, named, args)
    if not tokens:
        return Forced(None, [], 0)
    return Forced(kind, [identity_of(_text(t)) or UNKNOWN for t in tokens], int(granted))
