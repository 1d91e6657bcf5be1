"""The contract suite's subjects: every primitive, made and watched the same way.

Each contract test runs once per primitive (:data:`PRIMITIVES`):
:class:`~aiolock.AsyncLock` on one server, :class:`~aiolock.Redlock` over
three independent servers, :class:`~aiolock.Semaphore` with ``limit=1`` and
``limit=3``, and the two sides of a :class:`~aiolock.ReadWriteLock`. A
:class:`Subject` makes the primitive over one "process" (a set of client
objects) and gives an admin view of its servers in the contract's own words;
the :func:`subject` fixture checks after each test that no task, connection
or key was left. ``conftest.py`` loads this module as a plugin, so its fixtures
serve every test module.

An :class:`~aiolock.Election` is not one of the primitives: its surface is
``lead()``/``resign()``, not ``acquire()``/``release()``. Its subject
(:data:`ELECTION`, the ``election_subject`` fixture) has the same admin view
and checks, and ``test_contract_election.py`` the contract items that apply to it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import pytest
import redis.asyncio as redis

from aiolock import (
    AsyncLock,
    Election,
    MultiLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
)
from aiolock._keys import Keys
from aiolock._rwlock import RWSide
from aiolock._scripts import RW_INDEX_SUFFIX
from aiolock.testing import RedisServer
from support.leaks import in_use_connections, listeners_gone, other_tasks
from support.locks import all_keys, keys_of
from support.servers import blocked_client_ids, started_servers, wait_for_paused_client
from support.timing import eventually

#: A lock under the contract (a new primitive joins this union).
Lock = AsyncLock | Redlock | Semaphore | RWSide | MultiLock

#: The semaphores under the contract, by subject: their ``limit``.
SEMAPHORES = {"Semaphore": 1, "Semaphore3": 3}

#: The sides of a read-write lock under the contract: a ReadWriteLock's ``reader``, its ``writer``.
SIDES = ("Reader", "Writer")

#: The primitives the contract runs over.
PRIMITIVES = ["AsyncLock", "Redlock", *SEMAPHORES, *SIDES, "MultiLock"]

#: The primitives that run the contract on the asyncio loop only (the suite's time budget;
#: ``AIOLOCK_TEST_BOTH_LOOPS=1``, as ``make loops`` sets it, runs them on uvloop too).
ASYNCIO_ONLY = {"Redlock", *SEMAPHORES, *SIDES, "MultiLock"}

#: The election under the contract (tests/primitives/test_contract_election.py). Not one of
#: :data:`PRIMITIVES`: its public surface is ``lead()``/``run()``/``resign()``, not a lock's
#: ``acquire()``/``release()``/``extend()``, so the contract items that apply to it are
#: written there in its words, over this subject's admin view (a lock's: one server, one
#: string key, a queue). Its fencing counter is kept by design (not a key left over).
ELECTION = "Election"

#: A MultiLock under the contract holds the test's name and this one beside it: its
#: ``key`` (the one the admin side looks at) is the test's name's, taken first.
MULTI_SECOND = ":second"

#: Redlock's masters in this suite: a quorum of two.
REDLOCK_NODES = 3

#: Scheduling slack for timing bounds (2 loaded cores, two loop flavours).
SLACK = 0.25


NAN = float("nan")
INF = float("inf")

# --- the primitive under test --------------------------------------------------------------------


@pytest.fixture(scope="module")
def contract_servers() -> Iterator[list[RedisServer]]:
    """Private servers for the module (tests pause them with CLIENT PAUSE)."""
    with started_servers(REDLOCK_NODES) as started:
        yield started


#: The default of :meth:`Subject.make_lock`'s ``name``: the test's own name.
_TEST_NAME = object()

#: How long a lease taken away with "PEXPIRE 1" stays in a semaphore's set or a
#: read-write lock's hash, ended (ms): as it would while other holders keep the key
#: alive. The holder must see it as over.
ENDED_STAYS_MS = 500

# The server's time in ms, as the library's scripts read it (the admin scripts start so).
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A semaphore's key is a sorted set: each holder's token, scored with the server time
# (ms) at which its lease ends; a member whose score is not after the server's now
# holds nothing. These scripts read and change it as the admin of the contract does a
# lock's string key (KEYS[1]: the semaphore's key).

# The unexpired holders: {token, ms left, token, ms left, ...}.
_HOLDERS = (
    _NOW
    + """
local held = {}
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
    local left = tonumber(all[i + 1]) - now
    if left > 0 then
        table.insert(held, all[i])
        table.insert(held, left)
    end
end
return held
"""
)

# Every unexpired holder's lease ends ARGV[1] ms from now; the set then expires with its
# longest lease, or ARGV[2] ms from now if that is later. Returns how many holders.
_SET_LEASES = (
    _NOW
    + """
local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for _, token in ipairs(held) do
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), token)
end
if #held > 0 then
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[1], math.max(tonumber(last[2]), now + tonumber(ARGV[2])))
end
return #held
"""
)

# ARGV[1] takes the place of every unexpired holder, with a lease of ARGV[2] ms (the set
# is made if need be, and expires with its longest lease).
_OVERWRITE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1
"""
)

# A read-write lock's key is a hash: each holder's token -> 'r<ends>' (a reader) or
# 'w<ends>' (the writer), <ends> the server time (ms) at which its lease ends, and the
# field '=w' naming the writer; a field whose end is not after the server's now holds
# nothing. Its index, '<key>:ends', scores each holder's token with the same end. Both
# expire with the longest lease and vanish with the last holder. These scripts are the
# sorted-set ones above for the hash and its index (KEYS[1]: the read-write lock's key).

# The unexpired holders, readers and writer: {token, ms left, token, ms left, ...}.
_RW_HOLDERS = (
    _NOW
    + """
local held = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '=' then
        local left = tonumber(string.sub(all[i + 1], 2)) - now
        if left > 0 then
            table.insert(held, all[i])
            table.insert(held, left)
        end
    end
end
return held
"""
)

# Every unexpired holder's lease ends ARGV[1] ms from now, its kind kept (in the hash and
# in the index); both then expire with the longest lease, or ARGV[2] ms from now if that
# is later. Returns how many holders.
_RW_SET_LEASES = (
    _NOW
    + """
local index = KEYS[1] .. ':ends'
local all = redis.call('HGETALL', KEYS[1])
local ends = now + tonumber(ARGV[1])
local last = 0
local held = 0
for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '=' then
        local kind = string.sub(all[i + 1], 1, 1)
        local was = tonumber(string.sub(all[i + 1], 2))
        if was > now then
            redis.call('HSET', KEYS[1], all[i], kind .. string.format('%d', ends))
            redis.call('ZADD', index, ends, all[i])
            was = ends
            held = held + 1
        end
        last = math.max(last, was)
    end
end
if held > 0 then
    local at = string.format('%d', math.max(last, now + tonumber(ARGV[2])))
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', index, at)
end
return held
"""
)

# ARGV[1] takes the place of every unexpired holder, as the writer with a lease of
# ARGV[2] ms (the hash and its index are made if need be; they expire with that lease,
# the longest: the other fields left have ended).
_RW_OVERWRITE = (
    _NOW
    + """
local index = KEYS[1] .. ':ends'
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '=' and tonumber(string.sub(all[i + 1], 2)) > now then
        redis.call('HDEL', KEYS[1], all[i])
        redis.call('ZREM', index, all[i])
    end
end
local ends = now + tonumber(ARGV[2])
local at = string.format('%d', ends)
redis.call('HSET', KEYS[1], ARGV[1], 'w' .. at, '=w', ARGV[1])
redis.call('ZADD', index, ends, ARGV[1])
redis.call('PEXPIREAT', KEYS[1], at)
redis.call('PEXPIREAT', index, at)
return 1
"""
)


class Holder:
    """Every permit of the primitive, held by one "process": the lock, or a semaphore's all.

    A lock has one permit; a semaphore of ``limit`` N has N, held here by N
    objects (a task may hold one permit of an object). ``acquire`` and
    ``release`` take and give back all of them, in order. What keeps a
    read-write lock's reader out is its writer: a reader's holder is the
    writer side (see :meth:`Subject.excluder`).
    """

    def __init__(self, locks: list[Lock]) -> None:
        self.locks = locks

    @property
    def key(self) -> str:
        """The primitive's key (every lock here has the same)."""
        return self.locks[0].key

    async def acquire(self) -> bool:
        """Take every permit (each ``acquire()`` waits as the lock's own would)."""
        return all([await lock.acquire() for lock in self.locks])

    async def release(self) -> None:
        """Give every permit back."""
        for lock in self.locks:
            await lock.release()

    async def owned(self) -> bool:
        """Whether every permit is still held here."""
        return all([await lock.owned() for lock in self.locks])


class Subject:
    """One primitive under the contract: how to make it, and an admin view of its servers.

    ``make_lock`` builds the primitive over one "process" (a set of client
    objects, one per server); the admin side says what the servers hold in
    the contract's own words, the same for every primitive: the holders'
    tokens, their remaining lease, whether the key is there; and takes a
    lease away behind the holder's back, or shortens it. A lock's key holds
    its holder's token with the lease as its PTTL; a semaphore's is a sorted
    set of holders, a read-write lock's a hash of them (see the scripts above).
    """

    def __init__(self, kind: str, servers: list[RedisServer], name: str) -> None:
        self.kind = kind
        self.name = name
        #: Over a quorum of independent servers (Redlock); else one server and its queue.
        self.quorum = kind == "Redlock"
        #: A waiter stands in a queue on the server (not a quorum's, nor a MultiLock's).
        self.queues = not self.quorum and kind != "MultiLock"
        #: An election: its term is a lock's key; its fencing counter stays (every term's
        #: fence is above every earlier one's, for the election's whole life).
        self.election = kind == ELECTION
        #: How many hold it when it is held elsewhere: a lock's one, a semaphore's
        #: ``limit``, a read-write lock's writer (for a reader too: readers share).
        self.limit = SEMAPHORES.get(kind, 1)
        self.semaphore = kind in SEMAPHORES
        #: A side of a read-write lock: its key is a hash of holders.
        self.side = kind in SIDES
        self.servers = servers[:REDLOCK_NODES] if self.quorum else servers[:1]
        self.admins = [
            redis.Redis.from_url(s.url, decode_responses=True, socket_timeout=5.0)
            for s in self.servers
        ]
        self.client_sets: list[list[redis.Redis]] = []
        self._processes: dict[int, list[redis.Redis]] = {}

    @property
    def shown(self) -> str:
        """The name the primitive made on the test's name goes by in events and messages."""
        return self.shown_for(self.name)

    def shown_for(self, name: str) -> str:
        """The name the primitive made on ``name`` goes by: a MultiLock's is its names, joined."""
        if self.kind == "MultiLock":
            return f"{name}, {name}{MULTI_SECOND}"
        return name

    def connect(self, urls: list[str] | None = None, **options: Any) -> list[redis.Redis]:
        """A new set of client objects (one per server, or per URL): a "process" of its own.

        ``options`` go to each client (``retry=``, say).
        """
        clients = [
            redis.Redis.from_url(u, **options) for u in urls or [s.url for s in self.servers]
        ]
        self.client_sets.append(clients)
        return clients

    def process(self, index: int) -> list[redis.Redis]:
        """The clients of "process" ``index`` (made on first use, then shared)."""
        if index not in self._processes:
            self._processes[index] = self.connect()
        return self._processes[index]

    @property
    def polling(self) -> dict[str, Any]:
        """Options that make the primitive's waiters poll with their backoff policy.

        A notified waiter in a queue on the server waits for its grant and
        draws no delay; Redlock's waiters always poll.
        """
        return {} if self.quorum else {"notify": False}

    def make_lock(
        self,
        name: object = _TEST_NAME,
        *,
        process: int = 0,
        clients: list[redis.Redis] | None = None,
        node_timeout: float | None = None,
        **options: Any,
    ) -> Lock:
        """The primitive on ``name`` (the test's by default), in "process" ``process``.

        ``node_timeout`` is for primitives over a quorum of servers; the others ignore it.
        """
        on = clients if clients is not None else self.process(process)
        lock_name: Any = self.name if name is _TEST_NAME else name
        if self.kind == "AsyncLock":
            return AsyncLock(on[0], lock_name, **options)
        if self.kind == "MultiLock":
            names = (
                [lock_name, f"{lock_name}{MULTI_SECOND}"]
                if isinstance(lock_name, str)
                else [lock_name]
            )
            return MultiLock(on[0], names, **options)
        if self.semaphore:
            return Semaphore(on[0], lock_name, self.limit, **options)
        if self.side:
            rw = ReadWriteLock(on[0], lock_name, **options)
            return rw.reader if self.kind == "Reader" else rw.writer
        ttl = options.get("ttl", 10.0)
        if node_timeout is not None:
            options["node_timeout"] = node_timeout
        elif isinstance(ttl, int | float) and not isinstance(ttl, bool) and 0 < ttl < INF:
            # A node limit with room for a loaded machine and for the pauses below.
            options.setdefault("node_timeout", min(1.0, ttl / 3))
        return Redlock(on, lock_name, **options)

    def make_election(
        self,
        name: object = _TEST_NAME,
        *,
        process: int = 0,
        clients: list[redis.Redis] | None = None,
        **options: Any,
    ) -> Election:
        """An Election on ``name`` (the test's by default), in "process" ``process``."""
        assert self.election, "make_election is the Election subject's"
        on = clients if clients is not None else self.process(process)
        election_name: Any = self.name if name is _TEST_NAME else name
        return Election(on[0], election_name, **options)

    def excluder(self, lock: Lock) -> Lock:
        """What of ``lock``'s own makes it wait when held elsewhere: ``lock``, or a reader's writer.

        Readers share, so a reader waits for the writer of its read-write lock
        (the writer side of the same ReadWriteLock object).
        """
        if self.kind == "Reader":
            assert isinstance(lock, RWSide)
            return lock.lock.writer
        return lock

    def make_holder(self, *, process: int = 1, leave: int = 0, **options: Any) -> Holder:
        """What holds every permit but ``leave`` in "process" ``process`` (not yet acquired).

        With ``leave=0``: the primitive held elsewhere, whatever its limit (for
        a reader: the writer).
        """
        return Holder(
            [
                self.excluder(self.make_lock(process=process, **options))
                for _ in range(self.limit - leave)
            ]
        )

    # The admin view: what the servers hold, in the contract's words.

    async def _semaphore_holders(self, admin: redis.Redis, key: str) -> dict[str, int]:
        """A semaphore's (or read-write lock's) unexpired holders on ``admin``'s server.

        token -> ms left.
        """
        flat = await admin.eval(_RW_HOLDERS if self.side else _HOLDERS, 1, key)
        return {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    @property
    def _many(self) -> bool:
        """Whether the key holds a set of holders (a semaphore's, a read-write lock's)."""
        return self.semaphore or self.side

    async def holders(self, key: str) -> list[tuple[str, ...]]:
        """The tokens holding a lease of ``key`` on every server (sorted; ``()``: none)."""
        if self._many:
            return [tuple(sorted(await self._semaphore_holders(a, key))) for a in self.admins]
        values = [_str(await a.get(key)) for a in self.admins]
        return [() if v is None else (v,) for v in values]

    async def leases(self, key: str) -> list[int]:
        """The holder's remaining lease of ``key`` on every server (ms), as PTTL says it.

        -2 where nobody holds it. A semaphore's or a read-write lock's is its
        shortest unexpired lease, to the server's millisecond (worked out on
        the server).
        """
        if self._many:
            return [
                min((await self._semaphore_holders(a, key)).values(), default=-2)
                for a in self.admins
            ]
        return [await a.pttl(key) for a in self.admins]

    async def held_everywhere(self, key: str) -> bool:
        """Whether every server has a holder of ``key``."""
        return () not in await self.holders(key)

    async def wait_until_held(self, key: str) -> None:
        """Until every server has a holder of ``key``."""

        async def held() -> bool:
            return await self.held_everywhere(key)

        await eventually(held, f"{key!r} to be held everywhere", timeout=3.0, every=0.002)

    async def present(self, key: str) -> list[bool]:
        """Whether ``key`` is there, on every server."""
        return [bool(await a.exists(key)) for a in self.admins]

    async def assert_absent_and_stays(self, key: str) -> None:
        """``key`` is on no server, and still on none a moment later."""
        assert not any(await self.present(key)), f"{key!r} was left on a server"
        await asyncio.sleep(0.05)
        assert not any(await self.present(key)), f"{key!r} appeared after the cancellation"

    def holding_keys(self, key: str) -> set[str]:
        """The keys on a server while ``key`` is held (a read-write lock's index with it)."""
        if self.kind == "MultiLock":
            return set(self._every_key(key))
        return {key, key + RW_INDEX_SUFFIX} if self.side else {key}

    async def keys_left(self) -> list[str]:
        """The keys of the test's name still on any server."""
        patterns = [all_keys(self.name)]
        if self.kind == "MultiLock":
            patterns.append(all_keys(self.name + MULTI_SECOND))
        kept = {Keys(self.name).fence} if self.election else set()
        return [
            str(k)
            for a in self.admins
            for p in patterns
            for k in await a.keys(p)
            if str(k) not in kept
        ]

    async def queued(self, lock: Lock) -> bool:
        """Whether the queue of ``lock``'s waiters is there (on its one server)."""
        return any(await self.present(keys_of(lock).queue))

    def _every_key(self, key: str) -> list[str]:
        """``key``, and for a MultiLock the key of its second name too (a holding's keys)."""
        if self.kind == "MultiLock" and key.endswith("}"):
            return [key, f"{key[:-1]}{MULTI_SECOND}}}"]
        return [key]

    async def take_away(self, key: str, how: str, lease_ms: int = 5000) -> None:
        """Take the lease away behind the holder's back, on every server.

        ``how``: "PEXPIRE 1" ends it now (a semaphore's or a read-write lock's
        ended lease stays in its key a while, ended); "DEL" deletes the key;
        "overwrite" gives it to "someone else" for ``lease_ms`` (a read-write
        lock's, as its writer).
        """
        if how == "PEXPIRE 1":
            await self.set_lease(key, 0)
            return
        for a, each in [(a, k) for a in self.admins for k in self._every_key(key)]:
            if how == "DEL":
                await a.delete(each)
            elif self._many:
                overwrite = _RW_OVERWRITE if self.side else _OVERWRITE
                await a.eval(overwrite, 1, each, "someone else", lease_ms)
            else:
                await a.set(each, "someone else", px=lease_ms)

    async def set_lease(self, key: str, ms: int) -> None:
        """The holder's lease ends ``ms`` from now, on every server (``PEXPIRE key ms``).

        With ``ms=0`` a lock's key expires within the millisecond (``PEXPIRE key
        1``); a semaphore's (a read-write lock's) holder's lease ends now, its
        token still a member (a field).
        """
        for a, each in [(a, k) for a in self.admins for k in self._every_key(key)]:
            if self._many:
                set_leases = _RW_SET_LEASES if self.side else _SET_LEASES
                await a.eval(set_leases, 1, each, ms, ENDED_STAYS_MS if ms == 0 else 0)
            else:
                await a.pexpire(each, max(ms, 1))

    async def delete(self, key: str) -> None:
        """Delete ``key`` on every server (and a read-write lock's index beside it).

        A MultiLock's: the key of each of its names.
        """
        for a in self.admins:
            await a.delete(*self._every_key(key))
            if self.side:
                await a.delete(key + RW_INDEX_SUFFIX)

    async def pause(self, ms: int = 5000) -> None:
        """``CLIENT PAUSE ms WRITE`` on every server: lock commands are held back."""
        for a in self.admins:
            await a.client_pause(ms, all=False)

    async def unpause(self) -> None:
        """``CLIENT UNPAUSE`` on every server."""
        for a in self.admins:
            await a.client_unpause()

    async def wait_until_paused(self) -> None:
        """Until every server holds a client's command back."""
        for a in self.admins:
            await wait_for_paused_client(a)

    async def cancel_while_paused(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` until its command is held back by a pause, cancel it, unpause.

        The task must end cancelled; afterwards no server holds a client blocked
        (the paused command was dropped or ran). The window before the server ran
        the command.
        """
        await self.pause()  # WRITE: SET and EVALSHA are held back
        task = asyncio.create_task(coroutine)
        try:
            await self.wait_until_paused()
            task.cancel()
            await self.unpause()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await self.unpause()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for a in self.admins:

            async def none_blocked(a: redis.Redis = a) -> bool:
                return not await blocked_client_ids(a)

            await eventually(none_blocked, "the paused command to be dropped or run", timeout=3.0)

    async def aclose(self) -> None:
        """Close every client and admin."""
        for clients in self.client_sets:
            for c in clients:
                await c.aclose()
        for a in self.admins:
            await a.aclose()


def on_uvloop() -> bool:
    """Whether the running event loop is uvloop's."""
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


@pytest.fixture(params=PRIMITIVES)
async def subject(
    request: pytest.FixtureRequest, contract_servers: list[RedisServer], name: str
) -> AsyncIterator[Subject]:
    """The primitive under test; after the test: no task, connection or key left.

    Redlock, the semaphores and the read-write lock's sides run on the
    asyncio loop only (the suite's time budget); AsyncLock, on the same
    engine, runs on both loops.
    """
    both = bool(os.environ.get("AIOLOCK_TEST_BOTH_LOOPS"))
    if request.param in ASYNCIO_ONLY and on_uvloop() and not both:
        pytest.skip(f"{request.param} runs the contract on the asyncio loop only")
    s = Subject(request.param, contract_servers, name)
    try:
        yield s
        await _nothing_left(s)
    finally:
        await s.unpause()
        await s.aclose()


async def _nothing_left(s: Subject) -> None:
    """After a contract test: no task, listener, checked-out connection or key of it left."""
    assert await other_tasks() == set(), "a task outlived the test"
    assert await listeners_gone(), "a release-notification listener did not stop by itself"
    for clients in s.client_sets:
        for c in clients:
            assert in_use_connections(c) == 0, "a connection was left checked out"
    assert await s.keys_left() == [], "a key was left on a server"


@pytest.fixture
async def election_subject(
    contract_servers: list[RedisServer], name: str
) -> AsyncIterator[Subject]:
    """The election under the contract; after the test: no task, connection or key left.

    It runs on the asyncio loop only, as the primitives of :data:`ASYNCIO_ONLY`
    (``AIOLOCK_TEST_BOTH_LOOPS=1`` runs it on uvloop too). Its fencing counter,
    kept by design, is deleted after the checks.
    """
    both = bool(os.environ.get("AIOLOCK_TEST_BOTH_LOOPS"))
    if on_uvloop() and not both:
        pytest.skip(f"{ELECTION} runs the contract on the asyncio loop only")
    s = Subject(ELECTION, contract_servers, name)
    try:
        yield s
        await _nothing_left(s)
    finally:
        await s.unpause()
        for a in s.admins:
            await a.delete(Keys(name).fence)
        await s.aclose()


def _str(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def is_lost(lock: Lock) -> bool:
    """``lock.lost``, read through a call so type checkers do not narrow it across awaits."""
    return lock.lost
