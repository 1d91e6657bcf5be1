"""AsyncLock on a real server: contract, keys and scripts, waiting rules, ownership.

What docs/design.md states of the public contract, of keys, tokens and scripts, of
waiting (backoff is slept, waits are capped by the remaining timeout and the holder's
PTTL, the local FIFO) and of ownership inside a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import redis.asyncio as redis
from redis.crc import key_slot
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.leaks import connections_made, in_use_connections
from support.locks import CriticalSection, all_keys, keys_of
from support.servers import calls, connected
from support.timing import Lateness, eventually

import aiolock
from aiolock import AsyncLock, LockError, LockNotOwnedError, backoff
from aiolock._keys import Keys
from aiolock._scripts import ACQUIRE, EXTEND
from aiolock.testing import FaultProxy, RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")

#: 128 random bits, the mint time (ms, 12 hex digits), marks, ``:``, the identity.
TOKEN = re.compile(r"[0-9a-f]{32}[0-9a-f]{12}[ef]*:[^ ]+")
WORKER = Path(__file__).with_name("_test_lock_worker.py")


# --- helpers -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def held_elsewhere(c: redis.Redis, lock_name: str) -> AsyncIterator[AsyncLock]:
    """Hold ``lock_name`` through another client object (another "process") meanwhile."""
    holder = AsyncLock(c, lock_name)
    assert await holder.acquire()
    try:
        yield holder
    finally:
        await holder.release()


async def waits_while_held_elsewhere(
    lock: AsyncLock, acquire: Coroutine[Any, Any, bool], elsewhere: redis.Redis, held_for: float
) -> None:
    """``acquire`` of ``lock`` waits while another client holds it, and gets it after release."""
    async with held_elsewhere(elsewhere, lock.name):
        waiter = asyncio.create_task(acquire)
        done, _ = await asyncio.wait({waiter}, timeout=held_for)
        assert not done, "acquire() gave up or got a held lock"
    with anyio.fail_after(2):
        assert await waiter
    await asyncio.create_task(lock.release())  # a hand-off ends the waiter's holding
    assert not await lock.locked()


async def int_value(admin: redis.Redis, key: str) -> int:
    value = await admin.get(key)
    assert isinstance(value, str), (key, value)
    return int(value)


async def stored_token(admin: redis.Redis, lock: AsyncLock) -> str:
    value = await admin.get(lock.key)
    assert isinstance(value, str)
    return value


# --- 1. basics -----------------------------------------------------------------------------------


async def test_locked_and_owned_ask_the_server(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """locked() is True whoever holds the key; owned() is False for another holder's key."""
    mine = AsyncLock(client, name)
    theirs = AsyncLock(other_client, name)
    assert await theirs.acquire()
    try:
        assert await mine.locked()
        assert not await mine.owned()
        assert await theirs.owned()
        # owned() compares tokens on the server: another token in the key means "not ours".
        await admin.set(theirs.key, "f" * 32, xx=True, keepttl=True)
        assert not await theirs.owned()
        assert await theirs.locked()
    finally:
        with pytest.raises(LockNotOwnedError):
            await theirs.release()
        await admin.delete(theirs.key)
    assert not await mine.locked()


async def test_key_is_prefix_braced_name(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """The key is `aiolock:{<name>}` by default and `<prefix>{<name>}` with prefix=."""
    default = AsyncLock(client, name)
    assert default.key == f"aiolock:{{{name}}}"
    async with default:
        assert await admin.keys(f"*{{{name}}}*") == [f"aiolock:{{{name}}}"]
    custom = AsyncLock(client, name, prefix="shop:locks:")
    assert custom.key == f"shop:locks:{{{name}}}"
    async with custom:
        assert await admin.keys(f"*{{{name}}}*") == [f"shop:locks:{{{name}}}"]
        assert not await default.locked()


async def test_token_is_fresh_128_bits_per_acquisition(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Each acquisition stores a new token (128 fresh random bits first), also across tasks."""
    lock = AsyncLock(client, name)
    tokens: list[str] = []
    for _ in range(2):
        async with lock:
            tokens.append(await stored_token(admin, lock))

    async def take() -> None:
        async with lock:
            tokens.append(await stored_token(admin, lock))

    for _ in range(2):
        await asyncio.create_task(take())
    assert all(TOKEN.fullmatch(t) for t in tokens), tokens
    assert len(set(tokens)) == len(tokens), tokens


async def test_release_leaves_nothing(client: redis.Redis, admin: redis.Redis, name: str) -> None:
    """A released lock leaves no key of its name on the server (acquire/extend/release)."""
    lock = AsyncLock(client, name, ttl=5.0)
    assert await lock.acquire()
    await lock.extend()
    assert 0 < await admin.pttl(lock.key) <= 5000
    await lock.release()
    assert await admin.keys(all_keys(name)) == []


async def test_fencing_counter_is_the_only_key_left_and_increases(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """With fencing=True only `<key>:fence` remains, and fences increase across clients."""
    mine = AsyncLock(client, name, fencing=True)
    theirs = AsyncLock(other_client, name, fencing=True)
    fence_key = Keys(name).fence
    fences: list[int] = []
    try:
        for lock in (mine, theirs, mine, mine, theirs):
            async with lock:
                assert lock.fence is not None
                fences.append(lock.fence)
            assert await admin.keys(all_keys(name)) == [fence_key]
        assert fences == sorted(set(fences)), fences
        assert await int_value(admin, fence_key) == fences[-1]
    finally:
        await admin.delete(fence_key)


async def test_all_keys_of_a_lock_share_one_hash_slot(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """The lock key, the fence counter and the release channel hash to the same slot."""
    lock = AsyncLock(client, name, fencing=True)
    pubsub = admin.pubsub()
    fence_key = keys_of(lock).fence
    try:
        await pubsub.psubscribe(all_keys(name))
        async with lock:
            keys = await admin.keys(all_keys(name))
        message = None
        with anyio.move_on_after(2.0):
            while message is None:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        assert message is not None, "release published nothing"
        names = [*keys, message["channel"]]
        assert sorted(keys) == sorted([lock.key, fence_key])
        assert {key_slot(n.encode()) for n in names} == {key_slot(lock.key.encode())}, names
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await admin.delete(fence_key)


# --- 2. scripts by SHA ---------------------------------------------------------------------------


async def test_scripts_are_called_by_sha(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """An uncontended cycle is a bare SET, then EVALSHA for extend and release; never EVAL."""
    lock = AsyncLock(client, name)
    async with lock:  # loads the scripts on this server
        pass
    await admin.config_resetstat()
    assert await lock.acquire()
    await lock.extend()
    await lock.release()
    assert await calls(admin, "set") == 1
    assert await calls(admin, "evalsha") == 2
    assert await calls(admin, "eval") == 0


async def test_lock_works_after_script_flush(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """After SCRIPT FLUSH the scripts are loaded again (NOSCRIPT fallback), still without EVAL.

    With fencing, even an uncontended acquire runs a script (SET NX and INCR in one).
    """
    lock = AsyncLock(client, name, fencing=True)
    async with lock:
        pass
    await admin.script_flush()
    await admin.config_resetstat()
    assert await lock.acquire()
    assert await lock.owned()
    await admin.script_flush()
    await lock.extend()
    await admin.script_flush()
    await lock.release()
    assert not await lock.locked()
    assert await calls(admin, "script|load") >= 3
    assert await calls(admin, "eval") == 0
    await admin.delete(keys_of(lock).fence)  # the fencing counter is meant to stay


# --- 3. mutual exclusion -------------------------------------------------------------------------


@pytest.mark.parametrize("fencing", [False, True])
async def test_mutual_exclusion_across_processes(
    server: RedisServer, admin: redis.Redis, name: str, fencing: bool
) -> None:
    """3 processes x 30 coroutines (one lock object each) never overlap in the critical section.

    With ``fencing=True`` the fences, taken in the order of the holdings
    (each holder appends its own inside the critical section), strictly
    increase across all processes.
    """
    processes, coroutines, rounds = 3, 30, 3
    busy, total, go, fences = (
        f"test:{{{name}}}:{suffix}" for suffix in ("busy", "total", "go", "fences")
    )
    procs: list[asyncio.subprocess.Process] = []
    try:
        for _ in range(processes):
            procs.append(  # noqa: PERF401 - each started process is kept for the finally
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(WORKER),
                    server.url,
                    name,
                    str(coroutines),
                    str(rounds),
                    *(["fencing"] if fencing else []),
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        with anyio.fail_after(15):
            for proc in procs:
                assert proc.stdout is not None
                assert await proc.stdout.readline() == b"ready\n"
            await admin.rpush(go, *range(processes))
            outputs = [await proc.communicate() for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * processes
        reports = [json.loads(out) for out, _ in outputs]
        assert [r["overlaps"] for r in reports] == [0] * processes
        assert [r["holdings"] for r in reports] == [coroutines * rounds] * processes
        assert await int_value(admin, total) == processes * coroutines * rounds
        assert await int_value(admin, busy) == 0
        if fencing:
            seen = [int(fence) for fence in await admin.lrange(fences, 0, -1)]
            assert len(seen) == processes * coroutines * rounds
            steps = [b - a for a, b in itertools.pairwise(seen)]
            assert all(step >= 1 for step in steps), f"fences did not strictly increase: {seen}"
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await admin.delete(busy, total, go, fences, Keys(name).fence)


async def test_mutual_exclusion_in_process_over_two_clients(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """50 coroutines on two client objects, each with its own lock object, never overlap."""
    section = CriticalSection()

    async def worker(c: redis.Redis) -> None:
        lock = AsyncLock(c, name, timeout=10.0)
        for _ in range(2):
            async with lock:
                await section.stay()

    await asyncio.gather(*(worker((client, other_client)[i % 2]) for i in range(50)))
    assert section.overlaps == 0
    assert section.holdings == 100


# --- 4. ownership inside a process ---------------------------------------------------------------


async def test_shared_lock_object_excludes_tasks(client: redis.Redis, name: str) -> None:
    """Tasks sharing one AsyncLock object exclude each other."""
    lock = AsyncLock(client, name, timeout=10.0)
    section = CriticalSection()

    async def worker() -> None:
        for _ in range(3):
            async with lock:
                await section.stay()

    await asyncio.gather(*(worker() for _ in range(20)))
    assert section.overlaps == 0
    assert section.holdings == 60


async def test_second_task_waits_while_first_holds(client: redis.Redis, name: str) -> None:
    """Another task using the same object waits while the first task holds it."""
    lock = AsyncLock(client, name)
    assert await lock.acquire()
    assert not await asyncio.create_task(lock.acquire(timeout=0.1))
    waiter = asyncio.create_task(lock.acquire())
    done, _ = await asyncio.wait({waiter}, timeout=0.2)
    assert not done, "the second task got a lock the first task holds"
    await lock.release()
    with anyio.fail_after(2):
        assert await waiter

    async def let_go() -> None:
        await lock.release()  # a hand-off ends the waiter's holding

    await asyncio.create_task(let_go())
    assert not await lock.locked()


async def test_same_key_through_second_object_raises(client: redis.Redis, name: str) -> None:
    """Acquiring a key the task holds through another lock object on one client raises LockError."""
    first = AsyncLock(client, name)
    second = AsyncLock(client, name)
    async with first:
        with anyio.fail_after(1), pytest.raises(LockError):
            await second.acquire()
        with anyio.fail_after(1), pytest.raises(LockError):
            await second.acquire(timeout=5)
        assert await first.owned()
    async with second:
        assert await second.owned()


# --- 5. timeouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["timeout=0", "blocking=False"])
async def test_try_once(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, how: str
) -> None:
    """timeout=0 and blocking=False send exactly one SET NX (no PTTL) and return False at once."""
    async with held_elsewhere(other_client, name):
        lock = AsyncLock(client, name)
        async with AsyncLock(client, f"{name}:warm"):  # the scripts are loaded
            pass
        await admin.config_resetstat()
        started = time.monotonic()
        if how == "timeout=0":
            assert not await lock.acquire(timeout=0)
        else:
            assert not await lock.acquire(blocking=False)
        assert time.monotonic() - started < 0.1
        assert (await calls(admin, "set"), await calls(admin, "pttl")) == (1, 0)
        assert not await AsyncLock(client, name, timeout=0).acquire()
        assert not await AsyncLock(client, name, blocking=False).acquire()
        assert (await calls(admin, "set"), await calls(admin, "pttl")) == (3, 0)
        assert await calls(admin, "evalsha") == 0


async def test_long_backoff_is_capped_by_remaining_timeout(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """A waiter with backoff.constant(10) still returns at its 0.3 s timeout, not after 10 s."""
    async with held_elsewhere(other_client, name):
        lock = AsyncLock(client, name, backoff=backoff.constant(10))
        started = time.monotonic()
        assert not await lock.acquire(timeout=0.3)
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < 0.45, elapsed


async def test_long_backoff_is_capped_by_holder_pttl(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """A waiter with backoff.constant(10) and no timeout gets the lock soon after the lease ends."""
    ttl = 0.3
    holder = AsyncLock(other_client, name, ttl=ttl, auto_renew=False)
    started = time.monotonic()
    assert await holder.acquire()
    lock = AsyncLock(client, name, backoff=backoff.constant(10))
    with anyio.fail_after(3):
        assert await lock.acquire()
    elapsed = time.monotonic() - started
    try:
        assert ttl - 0.05 <= elapsed < ttl + 0.2, elapsed
        assert await lock.owned()
    finally:
        await lock.release()
        with pytest.raises(LockNotOwnedError):  # its lease ran out; the key is not touched
            await holder.release()


async def test_timeout_none_waits_until_release(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """timeout=None waits as long as the lock is held and gets it after the release."""
    lock = AsyncLock(client, name, timeout=None)
    await waits_while_held_elsewhere(lock, lock.acquire(), other_client, held_for=0.3)


# --- 6. local FIFO -------------------------------------------------------------------------------


async def test_other_client_gets_the_lock_after_local_waiters(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """A waiter on another client object is not shut out by a local queue: it gets the lock."""
    holder = AsyncLock(client, name)
    order: list[str] = []
    freed_at: list[float] = []

    async def local(i: int) -> None:
        async with AsyncLock(client, name, timeout=5.0):
            order.append(f"local{i}")
            await asyncio.sleep(0.02)
        freed_at.append(time.monotonic())

    async def remote() -> float:
        lock = AsyncLock(other_client, name, timeout=3.0)
        async with lock:
            order.append("remote")
            return time.monotonic()

    assert await holder.acquire()
    locals_ = []
    for i in range(5):
        locals_.append(asyncio.create_task(local(i)))
        await asyncio.sleep(0.005)
    far = asyncio.create_task(remote())
    await asyncio.sleep(0.05)
    await holder.release()
    with anyio.fail_after(5):
        remote_at = await far
        await asyncio.gather(*locals_)
    assert sorted(order) == sorted(["remote", *(f"local{i}" for i in range(5))]), order
    # Once the local queue has drained, the remote waiter's next attempt (the default
    # backoff is capped at 0.5 s) takes the lock.
    assert remote_at - max(freed_at) < 0.6, (order, remote_at - max(freed_at))


# --- 7. backoff policies are used ----------------------------------------------------------------


class CountingPolicy(backoff.Backoff):
    """A custom policy: a constant delay, counting iterators made and delays drawn."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.iterators = 0
        self.drawn = 0

    def delays(self) -> Iterator[float]:
        self.iterators += 1
        while True:
            self.drawn += 1
            yield self.delay


async def test_custom_policy_delays_are_slept(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A Backoff subclass gives a fresh iterator per acquisition and its delays are slept.

    The waiter polls (``notify=False``): a notified waiter in the queue on the
    server waits for its grant, and draws no delay.
    """
    async with held_elsewhere(other_client, name):
        policy = CountingPolicy(0.05)
        lock = AsyncLock(client, name, backoff=policy, notify=False)
        policy.iterators = policy.drawn = 0  # forget what the constructor probed
        await admin.config_resetstat()
        assert not await lock.acquire(timeout=0.27)
        # The first attempt is a bare SET; each later one is the acquire script, which
        # runs PTTL when it fails.
        attempts = 1 + await calls(admin, "pttl")
        assert policy.iterators == 1
        # 0.27 s of 0.05 s pauses: about 6 pauses and 8 attempts (the bare SET is followed
        # at once by the script); spinning would be hundreds. The lower bounds leave room
        # for a loaded machine, whose late wake-ups make fewer pauses fit (it flaked at 4).
        assert 3 <= policy.drawn <= 7, policy.drawn
        assert 4 <= attempts <= 10, attempts
        assert not await lock.acquire(timeout=0.06)
        assert policy.iterators == 2


async def test_callable_backoff_gets_attempt_numbers(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """A plain callable `attempt -> seconds` is called with 1, 2, 3, ... and its delays slept."""
    seen: list[int] = []

    def pause(attempt: int) -> float:
        seen.append(attempt)
        return 0.05

    async with held_elsewhere(other_client, name):
        lock = AsyncLock(client, name, backoff=pause, notify=False)
        seen.clear()  # forget what the constructor probed
        started = time.monotonic()
        assert not await lock.acquire(timeout=0.22)
        assert time.monotonic() - started >= 0.22
        assert seen == list(range(1, len(seen) + 1)), seen
        assert 3 <= len(seen) <= 6, seen
        seen.clear()
        assert not await lock.acquire(timeout=0.06)
        assert seen[:1] == [1], seen  # a fresh count for each acquisition


async def test_spin_waiter_gets_the_lock(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """A backoff.spin() waiter still lets the loop run and gets the lock after the release."""
    lock = AsyncLock(client, name, backoff=backoff.spin())
    await waits_while_held_elsewhere(lock, lock.acquire(timeout=3.0), other_client, held_for=0.05)


async def test_default_backoff_is_bounded_and_wakes_at_expiry(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """The default policy sends few attempts over a 0.5 s lease and acquires right after it ends."""
    ttl = 0.5
    holder = AsyncLock(other_client, name, ttl=ttl, auto_renew=False)
    async with AsyncLock(client, f"{name}:warm"):  # the scripts are loaded
        pass
    async with Lateness() as late:
        started = time.monotonic()
        assert await holder.acquire()
        await admin.config_resetstat()
        lock = AsyncLock(client, name)
        with anyio.fail_after(3):
            assert await lock.acquire()
        got = time.monotonic()
    elapsed = got - started
    attempts = await calls(admin, "set")  # one SET per attempt, bare or in a script
    try:
        # The machine's load meanwhile (this loop's timers late, summed) adds to the bound.
        bound = ttl + 0.05 + late.between(started, got)
        assert ttl - 0.05 <= elapsed < bound, (elapsed, bound)
        assert attempts < 40, attempts
    finally:
        await lock.release()
        with pytest.raises(LockNotOwnedError):
            await holder.release()


# --- 8. exceptions -------------------------------------------------------------------------------


async def test_exception_hierarchy() -> None:
    """AcquireTimeout is a TimeoutError and a LockError, LockLostError < LockNotOwnedError < it."""
    assert issubclass(aiolock.AcquireTimeout, TimeoutError)
    assert issubclass(aiolock.AcquireTimeout, aiolock.LockError)
    assert issubclass(aiolock.LockLostError, aiolock.LockNotOwnedError)
    assert issubclass(aiolock.LockNotOwnedError, aiolock.LockError)
    assert issubclass(aiolock.LockError, Exception)
    assert not issubclass(aiolock.LockNotOwnedError, TimeoutError)


# --- 9. connection hygiene -----------------------------------------------------------------------


async def test_uncontended_cycles_do_not_leak_connections(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """200 uncontended cycles leave no connection checked out and no extra server connection."""
    before = len(await admin.client_list())
    lock = AsyncLock(client, name)
    for i in range(200):
        if i % 2:
            async with lock:
                pass
        else:
            assert await lock.acquire()
            await lock.release()
    assert in_use_connections(client) == 0
    created = connections_made(client)
    assert 1 <= created <= 2, created
    after = len(await admin.client_list())
    assert after - before <= created, (before, after, created)


async def test_a_grant_that_arrives_after_its_lease_is_not_a_lock(
    proxy: FaultProxy, proxied: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A reply slower than the lease it grants is undone, and is no answer.

    The attempt is cut off at its lease end (a later grant would have run
    out already): at the deadline the server has not answered in time,
    which is not "held" (``False``) but redis-py's ``TimeoutError``.
    """
    await proxied.ping()  # the connection is ready; now every reply comes 0.15 s late
    proxy.set_latency(0.15)
    lock = AsyncLock(proxied, name, ttl=0.1)
    with pytest.raises(RedisTimeoutError, match="did not answer within"):
        await lock.acquire(timeout=0.5)
    assert not lock.lost
    assert await admin.exists(lock.key) == 0
    proxy.pass_through()
    assert await lock.acquire(timeout=1.0)  # a fast enough server: held as usual
    await lock.release()


@pytest.mark.parametrize(("each_way", "acquired"), [(0.1, True), (0.15, False)])
async def test_a_fresh_client_needs_four_round_trips_within_the_lease(
    proxy: FaultProxy, admin: redis.Redis, name: str, each_way: float, acquired: bool
) -> None:
    """Before its first answer a client's attempt may take the whole lease, and no more.

    Its first command also sets up the connection: with redis-py 8.1 about
    four round trips in all. With ``ttl=1``: at 0.2 s round trips (0.8 s) a
    free lock is taken; at 0.3 s (1.2 s) the attempt is cut off at the lease
    end, undone, and the call says the server did not answer (the documented
    rule: the defaults, ``ttl=10``, tolerate 2.5 s round trips from a fresh
    client).
    """
    proxy.set_latency(each_way)
    async with connected(proxy.url) as fresh:
        # No renewal, no release: at 0.8 s little of the lease is left for either.
        lock = AsyncLock(fresh, name, ttl=1.0, auto_renew=False)
        started = time.monotonic()
        if acquired:
            assert await lock.acquire(blocking=False)
            assert time.monotonic() - started >= 4 * 2 * each_way
        else:
            with pytest.raises(RedisTimeoutError, match=r"did not answer within 1(\.\d)? s"):
                await lock.acquire(blocking=False)
            took = time.monotonic() - started
            # The lease, then the one cleanup budget (min(ttl, 1 s)).
            assert 1.0 <= took <= 2.0 + 0.25, f"took {took:.3f} s"  # 0.25 s: scheduling

    async def none_left() -> bool:
        return await admin.exists(lock.key) == 0

    await eventually(none_left, "the key to be gone (undone, or expired)", timeout=2.0)


class RecordingConnection(redis.Connection):
    """Records every command this process sends through it (what is on the wire)."""

    sent: ClassVar[list[tuple[Any, ...]]] = []

    def pack_command(self, *args: Any) -> Any:
        RecordingConnection.sent.append(args)
        return super().pack_command(*args)


@pytest.mark.parametrize("ttl", [1.005, 2.01, 0.3])
async def test_leases_on_the_wire_are_never_shorter_than_the_holder_counts(
    server: RedisServer, admin: redis.Redis, name: str, ttl: float
) -> None:
    """Every PX (acquire, acquire script, extend) is ``ttl`` in ms rounded up, never down.

    Regression test for a defect found in review: ``int(1.005 * 1000)`` is
    1004, so the server could expire the key up to 1 ms before the holder's
    own lease end.
    """
    pool = redis.ConnectionPool(
        connection_class=RecordingConnection, host=server.host, port=server.port
    )
    c = redis.Redis.from_pool(pool)
    expected = str(math.ceil(round(ttl * 1000, 6)))
    try:
        RecordingConnection.sent.clear()
        plain = AsyncLock(c, name, ttl=ttl)
        assert await plain.acquire()
        await plain.extend()
        await plain.release()
        fenced = AsyncLock(c, name, ttl=ttl, fencing=True)
        assert await fenced.acquire()
        await fenced.release()
        sets = [args for args in RecordingConnection.sent if args[0] == "SET"]
        scripts = [args for args in RecordingConnection.sent if args[0] == "EVALSHA"]
        assert [str(args[5]) for args in sets] == [expected]  # SET key token NX PX ms
        # EVALSHA sha numkeys keys... token ms: the extend and the fenced acquire.
        shas = {EXTEND.sha, ACQUIRE.sha}
        with_lease = [args for args in scripts if args[1] in shas]
        assert len(with_lease) >= 2  # more if NOSCRIPT made one be sent again
        leases = {str(args[3 + int(args[2]) + 1]) for args in with_lease}
        assert leases == {expected}, leases
    finally:
        await c.aclose()
        await admin.delete(Keys(name).fence)


def test_a_lock_used_from_another_thread_s_loop_does_not_mistake_the_holder(
    server: RedisServer, name: str
) -> None:
    """Regression (review of the lease engine): looking up the running task through the loop of the
    lock's last holding must not find another thread's task.

    A task of a loop in thread A holds a reentrant lock and blocks its loop for
    a moment; a task of another loop, in this thread, tries the same lock
    object: it is not the holder, so it must not count a re-entry.
    """
    box: dict[str, AsyncLock] = {}
    held = threading.Event()

    async def hold_and_block() -> None:
        async with redis.Redis.from_url(server.url) as c:
            lock = AsyncLock(c, name, ttl=5.0, reentrant=True)
            box["lock"] = lock
            assert await lock.acquire()
            held.set()
            time.sleep(0.5)  # the holder's loop is busy in one step, on purpose
            await lock.release()

    thread = threading.Thread(target=lambda: asyncio.run(hold_and_block()))
    thread.start()
    try:
        assert held.wait(5)

        async def try_it() -> bool:
            return await box["lock"].acquire(timeout=0.1)

        assert asyncio.run(try_it()) is False
    finally:
        thread.join(5)
