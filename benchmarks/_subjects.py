"""What the benchmarks measure: each subject's library, options and label, and the registry.

A *subject* is a frozen dataclass: its class says which library it is
(:class:`Library`: aiolock, redis-py's lock, or a *floor*, the least a lock can
send, written here), its fields hold that library's options, and its
``label`` is what the tables, the charts and the JSON call it. A subject makes
what a benchmark drives:

* :meth:`Subject.lockers` gives ``count`` objects of the :class:`Locker`
  protocol on one lock name, one per coroutine: acquire within a bound,
  release. Every benchmark that sets subjects side by side drives them this way;
* an aiolock subject's ``make()`` gives the aiolock object itself
  (``AsyncLock``, ``Semaphore``, a ``ReadWriteLock``'s side), with its options
  and the ones the caller adds, for the benchmarks that use aiolock's own
  calls (``async with``, ``on_lost=``, a uvicorn app).

The registry at the end names every subject once; each benchmark takes its
subjects from there (:data:`CONTENTION`, :data:`W1`, :data:`REDLOCK`,
:data:`SECKILL`, :func:`semaphore`, ...) and picks them on its command line by
label or key, never by taking a label apart.

Subjects are picklable (the multi-process workloads send them to their
processes) and work with older aiolocks too: an option left at its default is
not passed (``benchmarks.compare`` runs these against an aiolock exported from
an earlier revision).

Adding a subject: add a constant to the registry (a new class only for a new
library or a new way to use one), and add it to the tuple of the benchmark
that runs it.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.lock import Lock as RedisPyLock
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from aiolock import AcquireTimeout, AsyncLock, ReadWriteLock, Redlock, Semaphore, backoff

if TYPE_CHECKING:
    from aiolock._rwlock import RWSide

__all__ = [
    "AIOLOCK",
    "AIOLOCK_FAIR",
    "AIOLOCK_FRESH",
    "ARTICLE_ROWS",
    "CONTENTION",
    "DEFAULT_ROWS",
    "FLOOR",
    "FLOOR_RAW",
    "LEASE",
    "REDIS_PY_FAST",
    "REDIS_PY_REUSED",
    "REDIS_PY_SLOW",
    "REDLOCK",
    "RW_READER",
    "RW_WRITER",
    "SECKILL",
    "SET_DEL_FLOOR",
    "SOAK",
    "W1",
    "AiolockLock",
    "AiolockReadWrite",
    "AiolockRedlock",
    "AiolockSemaphore",
    "Floor",
    "Library",
    "Locker",
    "RedisPy",
    "Subject",
    "ZsetFloor",
    "by_label",
    "semaphore",
    "zset_floor",
]

#: The lease every subject gives its key unless told otherwise, in seconds.
LEASE: Final = 10.0
#: The floors' polling interval while the lock (every permit) is taken.
FLOOR_POLL: Final = 0.001
_LEASE_MS: Final = int(LEASE * 1000)

#: Compare-and-delete: the floor's release.
#:   KEYS[1] the lock's key; ARGV[1] the holder's token. Returns 1 if deleted, else 0.
FLOOR_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

#: The counting semaphore's floor: drop expired holders, add the caller while fewer hold.
#:   KEYS[1] the sorted set of holders (scored with their lease's end, in ms)
#:   ARGV[1] the caller's token; ARGV[2] the limit; ARGV[3] the lease in ms.
#:   Returns 1 if the caller now holds a permit, else 0.
ZSET_FLOOR_ACQUIRE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return 1
end
return 0
"""


class Library(enum.Enum):
    """Whose code a subject runs."""

    AIOLOCK = "aiolock"
    REDIS_PY = "redis-py"
    #: Written here: the least a lock of its kind can send, the baseline.
    FLOOR = "floor"


class Locker(Protocol):
    """What one coroutine uses to take and give back the lock."""

    async def acquire(self, timeout: float | None) -> bool:  # noqa: ASYNC109 - a bound per attempt
        """Wait up to ``timeout`` seconds (None: for ever) for the lock; True once held."""

    async def release(self) -> None:
        """Give the lock back."""


@dataclass(frozen=True)
class Subject(abc.ABC):
    """One thing a benchmark measures: a library, its options, a label.

    Attributes:
        label: its name in the tables, the charts and the JSON.
        key: the key (or, for aiolock, the name) used for a lock name: a
            format with ``{name}``.
    """

    label: str
    key: str = field(default="{name}", kw_only=True)

    #: Whose code it runs.
    library: ClassVar[Library]

    @property
    def servers(self) -> int:
        """How many servers it runs on: one client each to :meth:`lockers`."""
        return 1

    @abc.abstractmethod
    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """One locker per coroutine on the lock ``name``.

        Args:
            clients: a client of each of its servers (see :attr:`servers`).
            name: the lock's name (the key follows :attr:`key`).
            count: how many lockers.

        Returns:
            ``count`` lockers.
        """


# -- aiolock -------------------------------------------------------------------------------


class _Acquirable(Protocol):
    async def acquire(self, *, timeout: float | None) -> bool: ...  # noqa: ASYNC109

    async def release(self) -> None: ...


class _Held:
    """An aiolock object kept for the coroutine's life: its own ``acquire`` and ``release``."""

    def __init__(self, lock: _Acquirable) -> None:
        self._lock = lock

    async def acquire(self, timeout: float | None) -> bool:  # noqa: ASYNC109
        """Acquire with aiolock's own timeout."""
        return await self._lock.acquire(timeout=timeout)

    async def release(self) -> None:
        """Release (aiolock hands the lock to the next waiter)."""
        await self._lock.release()


class _Fresh:
    """aiolock as a web handler uses it: ``async with AsyncLock(...)``, a new object each time."""

    def __init__(self, subject: AiolockLock, client: Redis, name: str) -> None:
        self._subject = subject
        self._client = client
        self._name = name
        self._lock: AsyncLock | None = None

    async def acquire(self, timeout: float | None) -> bool:  # noqa: ASYNC109
        """Make a new ``AsyncLock`` with ``timeout`` and enter it as ``async with`` does."""
        self._lock = self._subject.make(self._client, self._name, timeout=timeout)
        try:
            await self._lock.__aenter__()
        except AcquireTimeout:
            return False
        return True

    async def release(self) -> None:
        """Leave the ``async with`` block (a release)."""
        assert self._lock is not None
        await self._lock.__aexit__(None, None, None)


@dataclass(frozen=True)
class AiolockLock(Subject):
    """aiolock's ``AsyncLock``.

    Attributes:
        ttl: the lease (None: aiolock's default).
        fair: ``fair=True``.
        fencing: ``fencing=True``.
        replicas: ``replicas=N``: replicas that acknowledge every write.
        notify: False for ``notify=False`` (polling only).
        backoff: makes the ``backoff=`` policy of each lock (None: aiolock's).
        fresh: a new ``AsyncLock`` per acquisition, entered with ``async with``
            (as a web handler does), instead of one for the coroutine's life.
        description: what the subject does, in a sentence (for the JSON).
    """

    ttl: float | None = LEASE
    fair: bool = False
    fencing: bool = False
    replicas: int = 0
    notify: bool = True
    backoff: Callable[[], backoff.Backoff] | None = None
    fresh: bool = False
    description: str = ""

    library: ClassVar[Library] = Library.AIOLOCK

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``AsyncLock`` it sets (those left at their default are not)."""
        options: dict[str, Any] = {}
        if self.ttl is not None:
            options["ttl"] = self.ttl
        if self.fair:
            options["fair"] = True
        if self.fencing:
            options["fencing"] = True
        if self.replicas:
            options["replicas"] = self.replicas
        if not self.notify:
            options["notify"] = False
        if self.backoff is not None:
            options["backoff"] = self.backoff()
        return options

    def make(self, client: Redis | RedisCluster, name: str, **options: Any) -> AsyncLock:
        """An ``AsyncLock`` on ``name`` with this subject's options, and ``options`` over them."""
        return AsyncLock(client, self.key.format(name=name), **{**self.options(), **options})

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers: each with its own ``AsyncLock`` (or a new one per acquisition)."""
        if self.fresh:
            return [_Fresh(self, clients[0], name) for _ in range(count)]
        return [_Held(self.make(clients[0], name)) for _ in range(count)]


@dataclass(frozen=True)
class AiolockSemaphore(Subject):
    """aiolock's ``Semaphore`` of ``limit`` permits.

    Attributes:
        limit: how many hold at once.
        ttl: the lease.
    """

    limit: int = 1
    ttl: float = LEASE

    library: ClassVar[Library] = Library.AIOLOCK

    def make(self, client: Redis | RedisCluster, name: str, **options: Any) -> Semaphore:
        """A ``Semaphore`` on ``name`` with this subject's limit and lease, and ``options``."""
        return Semaphore(
            client, self.key.format(name=name), self.limit, **{"ttl": self.ttl, **options}
        )

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers, each with its own ``Semaphore`` object."""
        return [_Held(self.make(clients[0], name)) for _ in range(count)]


@dataclass(frozen=True)
class AiolockReadWrite(Subject):
    """One side of aiolock's ``ReadWriteLock``: its readers, or its writer.

    Attributes:
        writer: the writer's side (else the readers').
        ttl: the lease.
    """

    writer: bool = False
    ttl: float = LEASE

    library: ClassVar[Library] = Library.AIOLOCK

    def make(self, client: Redis | RedisCluster, name: str, **options: Any) -> RWSide:
        """A new ``ReadWriteLock`` on ``name`` (lease and ``options``); its side."""
        rw = ReadWriteLock(client, self.key.format(name=name), **{"ttl": self.ttl, **options})
        return rw.writer if self.writer else rw.reader

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers, each the side of its own ``ReadWriteLock`` object."""
        return [_Held(self.make(clients[0], name)) for _ in range(count)]


@dataclass(frozen=True)
class AiolockRedlock(Subject):
    """aiolock's ``Redlock`` over ``nodes`` independent servers.

    Attributes:
        nodes: how many servers.
        ttl: the lease.
    """

    nodes: int = 3
    ttl: float = LEASE

    library: ClassVar[Library] = Library.AIOLOCK

    @property
    def servers(self) -> int:
        """One per node."""
        return self.nodes

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers, each with its own ``Redlock`` over ``clients``."""
        key = self.key.format(name=name)
        return [_Held(Redlock(clients, key, ttl=self.ttl)) for _ in range(count)]


# -- redis-py ------------------------------------------------------------------------------


class _RedisPyLocker:
    """redis-py's ``Lock``: a fresh object per acquisition (its token is thread-local), or one."""

    def __init__(self, subject: RedisPy, client: Redis, key: str) -> None:
        self._subject = subject
        self._client = client
        self._key = key
        self._lock: RedisPyLock | None = self._make() if subject.reuse else None

    def _make(self) -> RedisPyLock:
        return RedisPyLock(self._client, self._key, timeout=LEASE, sleep=self._subject.sleep)

    async def acquire(self, timeout: float | None) -> bool:  # noqa: ASYNC109
        """Acquire with ``blocking_timeout=timeout``."""
        if not self._subject.reuse or self._lock is None:
            self._lock = self._make()
        return bool(await self._lock.acquire(blocking_timeout=timeout))

    async def release(self) -> None:
        """Release with redis-py's Lua compare-and-delete."""
        assert self._lock is not None
        await self._lock.release()


@dataclass(frozen=True)
class RedisPy(Subject):
    """redis-py's ``redis.asyncio.lock.Lock``, polling every ``sleep`` seconds.

    Attributes:
        sleep: its polling interval (redis-py's default is 0.1 s).
        reuse: one ``Lock`` object for every acquisition (else a fresh one each).
    """

    sleep: float = 0.1
    reuse: bool = False

    library: ClassVar[Library] = Library.REDIS_PY

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers on the key of ``name``."""
        key = self.key.format(name=name)
        return [_RedisPyLocker(self, clients[0], key) for _ in range(count)]


# -- the floors ----------------------------------------------------------------------------


class _Polling(abc.ABC):
    """A floor's locker: one attempt every :data:`FLOOR_POLL` while the lock is taken.

    The token of the next acquisition is drawn at the start and at each
    release, outside the acquisition, whose time then holds its commands alone.
    """

    def __init__(self) -> None:
        self._token = secrets.token_hex(16)

    @abc.abstractmethod
    async def _attempt(self) -> bool:
        """One attempt with ``self._token``: True if it now holds the lock."""

    @abc.abstractmethod
    async def _give_back(self) -> None:
        """Release the lock that ``self._token`` holds."""

    async def acquire(self, timeout: float | None) -> bool:  # noqa: ASYNC109
        """Try every millisecond until an attempt succeeds or ``timeout`` passes."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            if await self._attempt():
                return True
            if time.monotonic() + FLOOR_POLL > deadline:
                return False
            await asyncio.sleep(FLOOR_POLL)

    async def release(self) -> None:
        """Give the lock back; draw the next token."""
        try:
            await self._give_back()
        finally:
            self._token = secrets.token_hex(16)


class _FloorLocker(_Polling):
    """``SET key token NX PX`` per attempt; ``DEL`` or a compare-and-delete to release."""

    def __init__(self, subject: Floor, client: Redis, key: str, script: AsyncScript) -> None:
        super().__init__()
        self._subject = subject
        self._client = client
        self._key = key
        self._script = script

    async def _attempt(self) -> bool:
        if self._subject.raw:
            send = self._client.execute_command
            return bool(await send("SET", self._key, self._token, "NX", "PX", _LEASE_MS))  # type: ignore[no-untyped-call]
        return bool(await self._client.set(self._key, self._token, nx=True, px=_LEASE_MS))

    async def _give_back(self) -> None:
        if not self._subject.compare:
            await self._client.delete(self._key)
        elif not self._subject.raw:
            await self._script(keys=[self._key], args=[self._token])
        else:  # EVALSHA, loading the script if missing
            args = ("EVALSHA", self._script.sha, 1, self._key, self._token)
            try:
                await self._client.execute_command(*args)  # type: ignore[no-untyped-call]
            except NoScriptError:
                await self._client.script_load(FLOOR_RELEASE)
                await self._client.execute_command(*args)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Floor(Subject):
    """The least a lock can send: one ``SET NX PX`` per attempt, one command to release.

    Attributes:
        compare: release with a compare-and-delete script (``EVALSHA``), as a
            lock must; else a bare ``DEL``.
        raw: send the commands with ``execute_command``, without redis-py's
            argument checks (the least the client itself can spend; aiolock
            sends its commands this way); else with redis-py's usual API
            (``client.set(..., nx=True, px=...)`` and a registered script).
    """

    compare: bool = True
    raw: bool = False

    library: ClassVar[Library] = Library.FLOOR

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers sharing one registered release script."""
        client = clients[0]
        script = client.register_script(FLOOR_RELEASE)
        key = self.key.format(name=name)
        return [_FloorLocker(self, client, key, script) for _ in range(count)]


class _ZsetFloorLocker(_Polling):
    """One :data:`ZSET_FLOOR_ACQUIRE` script per attempt; one ``ZREM`` to release."""

    def __init__(self, client: Redis, key: str, limit: int, script: AsyncScript) -> None:
        super().__init__()
        self._client = client
        self._key = key
        self._limit = limit
        self._script = script

    async def _attempt(self) -> bool:
        args: list[EncodableT] = [self._token, self._limit, _LEASE_MS]
        return bool(await self._script(keys=[self._key], args=args))

    async def _give_back(self) -> None:
        await self._client.zrem(self._key, self._token)


@dataclass(frozen=True)
class ZsetFloor(Subject):
    """The classic counting semaphore, the floor of aiolock's ``Semaphore``.

    A sorted set of holders scored with their lease's end; one script drops
    the expired ones and adds the caller if fewer than ``limit`` hold
    (:data:`ZSET_FLOOR_ACQUIRE`).

    Attributes:
        limit: how many hold at once.
    """

    limit: int = 1

    library: ClassVar[Library] = Library.FLOOR

    def lockers(self, clients: Sequence[Redis], name: str, count: int) -> list[Locker]:
        """``count`` lockers sharing one registered acquire script."""
        client = clients[0]
        script = client.register_script(ZSET_FLOOR_ACQUIRE)
        key = self.key.format(name=name)
        return [_ZsetFloorLocker(client, key, self.limit, script) for _ in range(count)]


def by_label(subjects: Sequence[Subject], labels: Sequence[str]) -> list[Subject]:
    """The subjects whose labels are among ``labels``, in their own order.

    Args:
        subjects: a benchmark's subjects.
        labels: the labels chosen (on the command line, where argparse has
            checked each against the subjects' labels).
    """
    chosen = set(labels)
    return [subject for subject in subjects if subject.label in chosen]


# -- the registry ----------------------------------------------------------------------------

#: ``AsyncLock(client, name)`` with every default but its lease: one object reused.
AIOLOCK: Final = AiolockLock("aiolock")
#: A new ``AsyncLock`` per acquisition, entered with ``async with``.
AIOLOCK_FRESH: Final = AiolockLock("aiolock fresh", fresh=True)
#: ``AsyncLock(..., fair=True)``: every acquisition through the queue on the server.
AIOLOCK_FAIR: Final = AiolockLock("aiolock fair", fair=True)
#: redis-py's ``Lock`` with its default polling, a fresh object per acquisition.
REDIS_PY_SLOW: Final = RedisPy("redis-py 0.1", sleep=0.1)
#: redis-py's ``Lock`` polling every millisecond, a fresh object per acquisition.
REDIS_PY_FAST: Final = RedisPy("redis-py 0.001", sleep=0.001)
#: redis-py's ``Lock`` with its default polling, one object reused.
REDIS_PY_REUSED: Final = RedisPy("redis-py reused", sleep=0.1, reuse=True)
#: ``SET NX PX`` and a compare-and-delete ``EVALSHA``, with redis-py's usual API.
FLOOR: Final = Floor("floor")
#: The same two commands with ``execute_command``.
FLOOR_RAW: Final = Floor("floor raw", raw=True)

#: ``benchmarks.contention``: the subjects of every workload.
CONTENTION: Final = (AIOLOCK, REDIS_PY_SLOW, REDIS_PY_FAST, FLOOR)
#: ``benchmarks.contention``: W1's, the other way of using each lock too.
W1: Final = (
    AIOLOCK,
    AIOLOCK_FRESH,
    REDIS_PY_SLOW,
    REDIS_PY_FAST,
    REDIS_PY_REUSED,
    FLOOR,
    FLOOR_RAW,
)


#: ``benchmarks.family``: the readers' side of a ``ReadWriteLock``, and the writer's.
RW_READER: Final = AiolockReadWrite("ReadWriteLock reader")
RW_WRITER: Final = AiolockReadWrite("ReadWriteLock writer", writer=True)


def semaphore(limit: int) -> AiolockSemaphore:
    """``benchmarks.family``: aiolock's ``Semaphore`` of ``limit`` permits, ``semaphore N``."""
    return AiolockSemaphore(f"semaphore {limit}", limit=limit)


def zset_floor(limit: int) -> ZsetFloor:
    """``benchmarks.family``: the sorted-set semaphore of ``limit`` permits, ``zset floor N``."""
    return ZsetFloor(f"zset floor {limit}", limit=limit)


#: ``benchmarks.redlock``'s baseline: a bare ``SET NX PX``, then ``DEL``.
SET_DEL_FLOOR: Final = Floor("floor", compare=False, key="floor:{{{name}}}")
#: ``benchmarks.redlock``, each on its own servers: the baseline, redis-py's lock (one
#: object, default polling), aiolock on one server, with a replica's acknowledgement,
#: and Redlock over 3 and 5 servers.
REDLOCK: Final = (
    SET_DEL_FLOOR,
    RedisPy("redis-py Lock", sleep=0.1, reuse=True, key="redispy:{{{name}}}"),
    AiolockLock("AsyncLock"),
    AiolockLock("AsyncLock replicas=1", replicas=1),
    AiolockRedlock("Redlock 3", nodes=3),
    AiolockRedlock("Redlock 5", nodes=5),
)


def _polling(label: str, policy: Callable[[], backoff.Backoff], description: str) -> AiolockLock:
    """One of the article's strategies: an ``AsyncLock`` that only polls, with ``policy``."""
    return AiolockLock(label, ttl=None, notify=False, backoff=policy, description=description)


#: ``benchmarks.seckill``'s rows, by their key on its command line: the article's five
#: retry strategies (pure polling: ``notify=False``), aiolock's defaults (release
#: notifications and exponential backoff), and a control row. Each with aiolock's
#: default lease.
SECKILL: Final[dict[str, AiolockLock]] = {
    "no1": _polling(
        "No1 spin then yield",
        backoff.spin,
        "retry at once (the article yields only after 600 ms): backoff.spin()",
    ),
    "no2": _polling(
        "No2 yield then sleep",
        partial(backoff.yield_then_sleep, 0.6, 0.2),
        "yield for 600 ms, then sleep 200 ms: backoff.yield_then_sleep(0.6, 0.2)",
    ),
    "no3": _polling(
        "No3 sleep 200 ms",
        partial(backoff.constant, 0.2),
        "sleep 200 ms between attempts: backoff.constant(0.2)",
    ),
    "no4": _polling(
        "No4 sleep 2 s",
        partial(backoff.constant, 2.0),
        "sleep 2 s between attempts: backoff.constant(2.0)",
    ),
    "no5": _polling("No5 yield only", backoff.spin, "only yield between attempts: backoff.spin()"),
    "default": AiolockLock(
        "aiolock default",
        ttl=None,
        description="AsyncLock defaults: release notifications, exponential backoff",
    ),
    "polling": AiolockLock(
        "default, no notify",
        ttl=None,
        notify=False,
        description="a control row (not run by default): exponential backoff, notify=False",
    ),
}
#: The article's five strategies.
ARTICLE_ROWS: Final = ("no1", "no2", "no3", "no4", "no5")
#: The rows run unless asked otherwise: the article's five, then the default.
DEFAULT_ROWS: Final = (*ARTICLE_ROWS, "default")

#: ``benchmarks.soak``: a fenced ``AsyncLock`` (its lease, timeout and ``on_lost`` are the run's).
SOAK: Final = AiolockLock("aiolock fencing", ttl=None, fencing=True)
