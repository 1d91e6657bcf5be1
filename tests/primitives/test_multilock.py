"""MultiLock: several names held all together or not at all, on the lock engine.

What every primitive keeps (the cancellation windows, loss, renewal, the
observers, bad timeouts...) is proved for MultiLock by the contract suite
(``test_contract.py``). Here: what only a MultiLock does: all of its
names or none, excluding ``AsyncLock`` on any of them; a waiter that holds
none of its names; "processes" over overlapping names in opposite orders
that neither deadlock nor overlap; cancellation at random moments; a lost
name losing the whole; one fence for the holding; its arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis
from support.checkout import start_python
from support.timing import eventually

from aiolock import AsyncLock, LockError, LockLostError, MultiLock, Semaphore, backoff
from aiolock._keys import Keys
from aiolock.testing import FaultProxy, RedisServer

pytestmark = pytest.mark.usefixtures("no_leaks")


def lock_key(name: str) -> str:
    """The lock key of ``name`` under the default prefix."""
    return Keys(name).lock


async def keys_left(admin: redis.Redis, name: str) -> list[str]:
    """The keys of the test's names left on the server, fencing counters aside (kept)."""
    return sorted(str(k) for k in await admin.keys(f"*{name}*") if not str(k).endswith(":fence"))


@pytest.fixture
async def processes(server: RedisServer) -> AsyncIterator[list[redis.Redis]]:
    """Four client objects: four "processes" (each its own local queue and connections)."""
    made = [redis.Redis.from_url(server.url) for _ in range(4)]
    try:
        yield made
    finally:
        for c in made:
            await c.aclose()


# --- all or none ---------------------------------------------------------------------------------


async def test_holds_every_name_with_one_token_and_frees_them_all(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Acquired: every name's ordinary lock key holds one token with the lease; released: none."""
    names = [f"{name}:c", f"{name}:a", f"{name}:b"]
    lock = MultiLock(client, names, ttl=5.0)
    assert lock.names == tuple(sorted(names))
    async with lock:
        values = await admin.mget([lock_key(n) for n in names])
        assert None not in values
        assert len(set(values)) == 1
        for n in names:
            assert 4000 < await admin.pttl(lock_key(n)) <= 5000
        assert await lock.owned()
        assert await lock.locked()
    assert await keys_left(admin, name) == []
    assert not await lock.locked()


async def test_excludes_an_async_lock_on_any_of_its_names_both_ways(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A MultiLock over a, b keeps AsyncLock(b) out, and AsyncLock(b) keeps it out (a untaken)."""
    a, b = f"{name}:a", f"{name}:b"
    multi = MultiLock(client, [a, b], ttl=5.0)
    single = AsyncLock(other_client, b, ttl=5.0)
    async with multi:
        assert not await single.acquire(blocking=False)
    async with single:
        assert not await multi.acquire(blocking=False)
        assert await admin.exists(lock_key(a)) == 0, "the free name was left taken"
    assert await multi.acquire(timeout=1.0)
    await multi.release()
    assert await keys_left(admin, name) == []


async def test_a_waiting_multilock_holds_none_of_its_names(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """While b is held elsewhere, a MultiLock over a, b, c waits holding neither a nor c.

    Then b's release wakes it (a notification: its backoff step is 5 s).
    """
    a, b, c = f"{name}:a", f"{name}:b", f"{name}:c"
    single = AsyncLock(other_client, b, ttl=5.0)
    await single.acquire()
    multi = MultiLock(client, [c, b, a], ttl=5.0, backoff=backoff.constant(5.0))
    waiter = asyncio.create_task(multi.acquire(timeout=10.0))
    try:
        for _ in range(40):
            await asyncio.sleep(0.005)
            held = await admin.exists(lock_key(a), lock_key(c))
            assert held == 0, "a waiting MultiLock held some of its names"
        assert not waiter.done()
        await single.release()
        async with asyncio.timeout(2.0):
            assert await waiter
        assert await multi.owned()
    finally:
        if not waiter.done():
            waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        if single._current is not None:
            await single.release()
    await multi.release()
    assert await keys_left(admin, name) == []


async def test_four_processes_in_opposite_orders_neither_deadlock_nor_overlap(
    processes: list[redis.Redis], admin: redis.Redis, name: str
) -> None:
    """4 "processes" take overlapping name sets given in opposite orders: all finish, none overlap.

    A witness per name on the server (``SET NX`` on entry, ``DEL`` on exit)
    and one in the process both see at most one holder of each name at a time.
    """
    n = [f"{name}:{i}" for i in range(4)]
    sets = [[n[0], n[1], n[2]], [n[2], n[1], n[0]], [n[3], n[1]], [n[1], n[3], n[0]]]
    inside: dict[str, int] = dict.fromkeys(n, 0)
    overlaps: list[str] = []
    rounds = 15

    async def worker(index: int) -> int:
        rng = random.Random(index)
        lock = MultiLock(processes[index], sets[index], ttl=5.0, timeout=20.0)
        done = 0
        for _ in range(rounds):
            async with lock:
                for each in sets[index]:
                    inside[each] += 1
                    if inside[each] > 1:
                        overlaps.append(each)
                    if not await admin.set(f"witness:{each}", index, nx=True, px=10_000):
                        overlaps.append(f"server witness {each}")
                await asyncio.sleep(rng.uniform(0, 0.003))
                for each in sets[index]:
                    inside[each] -= 1
                    await admin.delete(f"witness:{each}")
            done += 1
        return done

    async with asyncio.timeout(40):
        finished = await asyncio.gather(*(worker(i) for i in range(4)))
    assert finished == [rounds] * 4
    assert overlaps == []
    assert await keys_left(admin, name) == []


#: One "process" of the test below: takes its MultiLock ``ROUNDS`` times, and inside
#: counts, per name, the holders a witness on the server saw (INCR: 1 when alone).
OPPOSITE_WORKER = """
import asyncio, json, sys
import redis.asyncio as redis
from aiolock import MultiLock
async def main(url, names, rounds, go):
    client = redis.Redis.from_url(url)
    lock = MultiLock(client, json.loads(names), ttl=5.0, timeout=30.0)
    overlaps = holdings = 0
    print("ready", flush=True)
    await client.blpop([go], timeout=20)
    for _ in range(int(rounds)):
        async with lock:
            for name in lock.names:
                if await client.incr("witness:" + name) != 1:
                    overlaps += 1
            await asyncio.sleep(0.002)
            for name in lock.names:
                await client.decr("witness:" + name)
            holdings += 1
    await client.aclose()
    print(json.dumps({"overlaps": overlaps, "holdings": holdings}), flush=True)
asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.heavy
@pytest.mark.one_loop
async def test_four_os_processes_in_opposite_orders_neither_deadlock_nor_overlap(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """4 OS processes take overlapping name sets in opposite orders: all finish, none overlap.

    A witness per name on the server (``INCR`` on entry, ``DECR`` on exit)
    never sees two holders of one name.
    """
    n = [f"{name}:{i}" for i in range(4)]
    sets = [[n[0], n[1], n[2]], [n[2], n[1], n[0]], [n[3], n[1]], [n[1], n[3], n[0]]]
    rounds = 20
    go = f"go:{name}"
    procs = [
        await start_python(
            OPPOSITE_WORKER,
            server.url,
            json.dumps(s),
            str(rounds),
            go,
            stdout=asyncio.subprocess.PIPE,
        )
        for s in sets
    ]
    try:
        async with asyncio.timeout(60):
            for proc in procs:
                assert proc.stdout is not None
                assert await proc.stdout.readline() == b"ready\n"
            await admin.rpush(go, *range(len(procs)))
            outputs = [await proc.communicate() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    reports = [json.loads(out) for out, _ in outputs]
    assert [r["holdings"] for r in reports] == [rounds] * len(procs)
    assert [r["overlaps"] for r in reports] == [0] * len(procs)
    assert [await admin.get(f"witness:{each}") for each in n] == ["0"] * len(n)
    await admin.delete(*(f"witness:{each}" for each in n))
    assert await keys_left(admin, name) == []


# --- cancellation and loss -----------------------------------------------------------------------


async def test_cancelled_at_random_moments_leaves_no_key(
    proxy: FaultProxy,
    proxied: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
) -> None:
    """60 acquisitions cancelled at random moments, half of them contended: no key is left.

    Through a link with 1 ms each way, so that many cancellations land while
    a script is in flight (it may have run: the token is taken back); others
    land before it, while it polls, or while it holds. Another "process"
    takes and gives back one of the names meanwhile.
    """
    client = proxied
    proxy.set_latency(0.001)
    rng = random.Random(4321)
    names = [f"{name}:a", f"{name}:b", f"{name}:c"]
    rival = AsyncLock(other_client, names[1], ttl=5.0)
    outcomes: dict[str, int] = {}

    async def one() -> None:
        lock = MultiLock(client, names, ttl=5.0, backoff=backoff.constant(0.001))
        async with lock:
            await asyncio.sleep(rng.uniform(0, 0.002))

    for trial in range(60):
        contended = trial % 2 == 1
        if contended:
            await rival.acquire()
        task = asyncio.create_task(one())
        await asyncio.sleep(rng.uniform(0, 0.008))
        if contended and rng.random() < 0.5:
            await rival.release()
        task.cancel()
        try:
            await task
            kind = "finished"
        except asyncio.CancelledError:
            kind = "cancelled"
        outcomes[kind] = outcomes.get(kind, 0) + 1
        if rival._current is not None:
            await rival.release()
        left = await keys_left(admin, name)
        assert left == [], f"trial {trial}: {left}"
    assert outcomes.get("cancelled", 0) >= 30, outcomes


async def test_deleting_one_name_loses_the_whole_and_frees_the_others(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """One key deleted behind the holder's back: lost (on_lost, body cancelled), the rest freed."""
    names = [f"{name}:a", f"{name}:b", f"{name}:c"]
    lost: list[MultiLock] = []
    lock = MultiLock(client, names, ttl=0.6, cancel_on_lost=True, on_lost=lost.append)

    async def hold() -> None:
        async with lock:
            await admin.delete(lock_key(names[1]))
            await asyncio.sleep(5)  # cancelled at the first renewal

    with pytest.raises(LockLostError, match="lost"):
        await hold()
    assert lost == [lock]
    assert lock.lost
    assert await keys_left(admin, name) == [], "the other names were left held"


async def test_a_name_of_another_kind_is_told(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A name held by a Semaphore: LockError naming the kind, and none of the names taken."""
    names = [f"{name}:a", f"{name}:b"]
    sem = Semaphore(client, names[1], limit=2, ttl=5.0)
    async with sem:
        with pytest.raises(LockError, match="in use by a Semaphore"):
            await MultiLock(client, names, ttl=5.0).acquire(blocking=False)
        assert await admin.exists(lock_key(names[0])) == 0


# --- renewal and fencing -------------------------------------------------------------------------


async def test_renewal_keeps_every_name_past_several_leases(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """ttl 0.3 s, held 1.2 s: every name is still ours, and an AsyncLock on one still out."""
    names = [f"{name}:a", f"{name}:b"]
    lock = MultiLock(client, names, ttl=0.3)
    async with lock:
        assert not await AsyncLock(other_client, names[0]).acquire(timeout=1.2)
        assert not lock.lost
        assert await lock.owned()
        await lock.extend(ttl=2.0)

        async def every_name_extended() -> bool:
            return all([await admin.pttl(lock_key(n)) > 1000 for n in names])

        # (A renewal sent just before the extend may land after it with 0.3 s; the
        # holder then renews at once with the new lease.)
        await eventually(every_name_extended, "every name's lease at the extended 2 s", 1.0)


async def test_one_fence_above_every_earlier_and_below_every_later_fence_of_its_names(
    client: redis.Redis, name: str
) -> None:
    """fencing=True: the holding's fence beats each name's earlier fences; later ones beat it."""
    a, b = f"{name}:a", f"{name}:b"
    before = []
    for n in (a, b, b):
        single = AsyncLock(client, n, fencing=True)
        async with single:
            before.append(single.fence)
    multi = MultiLock(client, [a, b], fencing=True)
    async with multi:
        first = multi.fence
    assert first is not None
    assert first > max(f for f in before if f is not None)
    async with multi:
        second = multi.fence
    assert second is not None
    assert second > first
    for n in (a, b):
        single = AsyncLock(client, n, fencing=True)
        async with single:
            assert single.fence is not None
            assert single.fence > second


# --- arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "error", "match"),
    [
        ([], ValueError, "names must hold at least one name"),
        ("ab", TypeError, "names must be a list or tuple of str"),
        (None, TypeError, "names must be a list or tuple of str"),
        (["a", "a"], ValueError, r"names holds 'a' twice \(names\[1\]\)"),
        (["a", 1], TypeError, r"each name must be a str, got 1 \(names\[1\]\)"),
        (["a", ""], ValueError, r"names\[1\]: name must not be empty"),
        (["}x"], ValueError, r"names\[0\]: .*empty hash tag"),
    ],
)
def test_bad_names_are_refused_naming_the_argument(
    client: redis.Redis, names: object, error: type[Exception], match: str
) -> None:
    """Empty, a str, duplicates, non-str or invalid names: TypeError/ValueError naming ``names``."""
    with pytest.raises(error, match=match):
        MultiLock(client, names, ttl=1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": float("nan")}, ValueError, "ttl"),
        ({"ttl": "1"}, TypeError, "ttl"),
        ({"timeout": -1}, ValueError, "timeout"),
        ({"timeout": "x"}, TypeError, "timeout"),
        ({"fencing": 1}, TypeError, "fencing"),
        ({"notify": None}, TypeError, "notify"),
        ({"fair": True}, TypeError, "MultiLock does not take fair"),
        ({"replicas": 1}, TypeError, "MultiLock does not take replicas"),
        ({"colour": 1}, TypeError, "unexpected keyword argument 'colour'"),
    ],
)
def test_bad_options_are_refused_naming_them(
    client: redis.Redis, options: dict[str, object], error: type[Exception], match: str
) -> None:
    """Bad ttl or timeout, non-bool flags, fair and the replica options: refused by name."""
    with pytest.raises(error, match=match):
        MultiLock(client, ["a", "b"], **options)  # type: ignore[arg-type]


def test_a_client_that_is_not_redis_asyncio_is_refused() -> None:
    """A client of the wrong kind: TypeError naming ``client``."""
    with pytest.raises(TypeError, match=r"client must be a redis\.asyncio"):
        MultiLock(object(), ["a"])  # type: ignore[arg-type]
