"""The contract for batched renewal, for every primitive (see ``support/contract.py``).

The holdings of one event loop are renewed together: those due in the same
window go out in one server call per client and hash slot (one per node for
Redlock), at most a hundred a call. Batching must change nothing a holder can
see. Each holding keeps its own outcome: a member whose key was taken away is
lost with its own reason while the others renew; a batch call that fails is
retried within each member's lease end, and nobody is lost if it succeeds by
then; a member released while its batch is in flight is released, and the
late reply neither brings its key back nor reports it lost; a holder cancelled
during a batch, and an event loop that shuts down during one, end as they do
without batching.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from support.contract import SLACK, Lock, Subject, is_lost
from support.leaks import other_tasks
from support.timing import eventually

from aiolock import LockEvent
from aiolock._lease import CLEANUP_BOUND
from aiolock._multi_lease import MultiLease
from aiolock._quorum import QuorumLease
from aiolock._scripts import EXTEND_MANY
from aiolock._server_lease import ServerLease
from aiolock.testing import FaultProxy, RedisServer

#: The lease of these tests: renewals every 0.1 s.
TTL = 0.3
#: How many holdings each test keeps on one client.
MEMBERS = 6


@pytest.fixture(autouse=True)
def _asyncio_only(request: pytest.FixtureRequest) -> None:
    """Each primitive once, on asyncio (the suite's time budget).

    The renewer is the same on both loops (a loop that shuts down is the
    exception: that runs on both). A semaphore of three permits renews as
    one of one, and a writer as a reader (the same lease, script and
    batch): "Semaphore" and "Reader" stand for them.
    """
    node = request.node.name
    if "[uvloop-" in node and "shuts_down" not in node:
        pytest.skip("batched renewal is the same on both loops: asyncio's only")
    if "-Semaphore3]" in node or "-Writer]" in node:
        pytest.skip("renewed as Semaphore and Reader are: the same lease and batch")


def names(subject: Subject, count: int = MEMBERS) -> list[str]:
    """``count`` lock names of the test's own."""
    return [f"{subject.name}-{index}" for index in range(count)]


async def acquire_all(subject: Subject, *, clients: list[redis.Redis] | None = None) -> list[Lock]:
    """:data:`MEMBERS` locks of the test, each acquired, on one "process" (``clients``)."""
    locks = [subject.make_lock(name, ttl=TTL, clients=clients) for name in names(subject)]
    for lock in locks:
        assert await lock.acquire()
    return locks


def extend_many_sha(lock: Lock) -> bytes:
    """The bytes that name ``lock``'s batch renewal script in an ``EVALSHA``."""
    lease: Any = lock._lease
    if isinstance(lease, MultiLease):
        return EXTEND_MANY.sha.encode()  # (the lock's own, over every name's key)
    node = lease._nodes[0] if isinstance(lease, QuorumLease) else lease
    assert isinstance(node, ServerLease)
    return node._EXTEND_MANY.sha.encode()


async def evalsha_calls(subject: Subject) -> int:
    """How many ``EVALSHA`` calls the subject's servers have run, in all."""
    total = 0
    for admin in subject.admins:
        stats = await admin.info("commandstats")
        total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


async def hold_throughout(subject: Subject, locks: list[Lock], seconds: float) -> None:
    """For ``seconds``: each of ``locks`` keeps its key on every server, none declared lost."""
    tokens = {lock.key: await subject.holders(lock.key) for lock in locks}
    for lock in locks:
        assert () not in tokens[lock.key], f"{lock.key!r} is not held at the start"
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        await asyncio.sleep(0.03)
        for lock in locks:
            assert not is_lost(lock), f"{lock.key!r} was declared lost: {lock}"
            assert await subject.holders(lock.key) == tokens[lock.key], (
                f"{lock.key!r} lapsed or changed hands while held"
            )


async def nothing_left(subject: Subject, count: int = MEMBERS) -> None:
    """No key of the test's locks is left on any server."""
    for name in names(subject, count):
        pattern = f"*{{{name}}}*"
        for admin in subject.admins:
            assert await admin.keys(pattern) == [], f"a key of {name!r} was left"


def renewer_tasks() -> list[asyncio.Task[Any]]:
    """The live renewal tasks of this loop (aiolock names them "aiolock renewal...")."""
    return [
        t for t in asyncio.all_tasks() if t.get_name().startswith("aiolock renew") and not t.done()
    ]


async def test_holdings_of_one_client_renew_together(subject: Subject) -> None:
    """Held for ten renewal periods, six holdings cost the servers a few calls per period.

    One script call per holding per period would be sixty calls a server;
    batched, the holdings due in the same window share one. And one task
    renews them all: it ends with the last release.
    """
    locks = await acquire_all(subject)
    await asyncio.sleep(2 * TTL)  # past every first renewal
    assert len([t for t in renewer_tasks() if t.get_name() == "aiolock renewals"]) == 1
    before = await evalsha_calls(subject)
    periods = 10
    await asyncio.sleep(periods * TTL / 3)
    calls = (await evalsha_calls(subject) - before) / len(subject.admins)
    assert calls <= periods * 2 + 2, f"{calls:g} renewal calls a server for {MEMBERS} holdings"
    for lock in locks:
        assert not is_lost(lock)
        await lock.release()
    assert renewer_tasks() == [], "a renewal task outlived the last holding"
    await nothing_left(subject)


async def test_a_member_lost_while_the_others_renew(
    subject: Subject, events: list[LockEvent]
) -> None:
    """One key taken away: that holding alone is lost, with its reason; the others hold."""
    lost: list[Lock] = []
    locks = [subject.make_lock(name, ttl=TTL, on_lost=lost.append) for name in names(subject)]
    for lock in locks:
        assert await lock.acquire()
    await asyncio.sleep(2 * TTL)  # renewing together by now
    victim, others = locks[2], [*locks[:2], *locks[3:]]
    await subject.take_away(victim.key, "overwrite")

    async def declared() -> bool:
        return is_lost(victim)

    await eventually(declared, "the loss to be declared", timeout=TTL + SLACK)

    async def told() -> bool:
        return lost == [victim]

    # (Told once one read says whether a forced release took it: within that read's bound.)
    await eventually(told, "on_lost called for the victim alone", timeout=CLEANUP_BOUND + SLACK)
    assert lost == [victim]
    (event,) = [e for e in events if e.kind == "lost"]
    assert event.lock is victim
    assert "held by another holder at renewal" in str(event.reason)
    await hold_throughout(subject, others, 3 * TTL)
    for lock in others:
        await lock.release()
    await subject.delete(victim.key)
    await nothing_left(subject)


@pytest.fixture
async def proxies(
    subject: Subject, start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]]
) -> list[FaultProxy]:
    """A fault proxy in front of each of the subject's servers."""
    return [await start_proxy(s) for s in subject.servers]


async def test_a_batch_call_that_fails_is_retried_within_each_lease(
    subject: Subject,
    proxies: list[FaultProxy],
    events: list[LockEvent],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection of a batch call breaks (no retry in redis-py): retried, nobody lost.

    Every member is told of the failed renewal (a ``renewal_failed`` event
    each), one WARNING names the batch, and the retry renews them all well
    within their leases.
    """
    clients = subject.connect([p.url for p in proxies], retry=Retry(NoBackoff(), 0))
    locks = await acquire_all(subject, clients=clients)
    await asyncio.sleep(2 * TTL)
    for p in proxies:
        p.drop_reply(extend_many_sha(locks[0]))
    with caplog.at_level(logging.WARNING, logger="aiolock"):

        async def broken() -> bool:
            return sum(p.replies_dropped for p in proxies) == len(proxies)

        await eventually(broken, "a batch call to break", timeout=1.0)
        await hold_throughout(subject, locks, 3 * TTL)
    told = {e.lock.name for e in events if e.kind == "renewal_failed"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    batches = [
        match
        for w in warnings
        if (match := re.match(r"renewal of lock '([^']*)' and (\d+) more \('([^']*)'", w))
    ]
    assert batches, warnings
    # Which holdings share a batch depends on when each came due (a loaded
    # machine spreads them out): every member a warning names was told, and
    # at least as many as the batch had.
    for batch in batches:
        assert {batch[1], batch[3]} <= told, (batch[0], told)
        assert len(told) >= 1 + int(batch[2]), (batch[0], told)
    assert not [e for e in events if e.kind == "lost"]
    for lock in locks:
        await lock.release()
    await nothing_left(subject)


async def test_a_member_released_while_its_batch_is_in_flight(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """Released mid-batch: released (no loss), its key gone for good; the others renew."""
    clients = subject.connect([p.url for p in proxies])
    locks = await acquire_all(subject, clients=clients)
    await asyncio.sleep(2 * TTL)
    leaving = locks[0]
    holding: Any = leaving._current

    async def between_renewals() -> bool:
        return holding.flight is None

    # The server runs every command but its replies wait in the proxy: a batch
    # sent from now on stays in flight, however loaded the machine, until they
    # go. (Held between two renewals: a batch sent before might have its reply
    # on the way already.)
    await eventually(between_renewals, "a moment between renewals", timeout=1.0, every=0.001)
    for p in proxies:
        p.hold_replies(new_connections=True)

    async def in_flight() -> bool:
        return holding.flight is not None and not holding.flight.done()

    await eventually(in_flight, "a renewal of the member in flight", timeout=1.0, every=0.001)
    flight = holding.flight
    releasing = asyncio.ensure_future(leaving.release())
    await asyncio.sleep(0.02)  # the release is under way while the batch is in flight
    assert not flight.done()
    assert not releasing.done()
    for p in proxies:
        p.release_replies()
    await releasing
    await asyncio.sleep(0.1)  # the batch has landed
    assert flight.done()
    assert holding.renewer is None, "the landed batch took the released holding back"
    assert not any(await subject.present(leaving.key)), "the late renewal brought the key back"
    assert not [e for e in events if e.kind == "lost"]
    for p in proxies:
        p.pass_through()
    await hold_throughout(subject, locks[1:], 2 * TTL)
    for lock in locks[1:]:
        await lock.release()
    await nothing_left(subject)


async def test_a_holder_cancelled_during_a_batch_releases_and_the_others_renew(
    subject: Subject, proxies: list[FaultProxy], events: list[LockEvent]
) -> None:
    """``async with`` cancelled while a batch is in flight: released; the others hold."""
    clients = subject.connect([p.url for p in proxies])
    locks = await acquire_all(subject, clients=clients)
    others = locks[1:]
    for lock in locks:
        await lock.release()
    entered = asyncio.Event()

    async def body() -> None:
        async with subject.make_lock(names(subject)[0], ttl=TTL, clients=clients):
            entered.set()
            await asyncio.sleep(30)

    for lock in others:
        assert await lock.acquire()
    holder = asyncio.create_task(body())
    await entered.wait()
    await asyncio.sleep(2 * TTL)
    for p in proxies:
        p.set_latency(0.01)
    holdings = [lock._current for lock in others]

    async def in_flight() -> bool:
        return any(h.flight is not None and not h.flight.done() for h in holdings if h is not None)

    await eventually(in_flight, "a batch in flight", timeout=1.0, every=0.001)
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder

    # Released: gone at once from a single server. A quorum's nodes that miss
    # node_timeout on a loaded machine (its release then fails, and the
    # cancellation still wins) keep the key until its lease ends: nothing
    # renews it any more.
    present = await subject.present(locks[0].key)
    if len(present) == 1:
        assert present == [False]

    async def gone() -> bool:
        return not any(await subject.present(locks[0].key))

    await eventually(gone, "the cancelled holder's key gone", timeout=TTL + SLACK)
    for p in proxies:
        p.pass_through()
    await hold_throughout(subject, others, 2 * TTL)
    for lock in others:
        await lock.release()
    assert not [e for e in events if e.kind == "lost"]
    assert await other_tasks() == set()
    await nothing_left(subject)


async def test_a_loop_that_shuts_down_during_a_batch_reports_every_member(
    subject: Subject,
) -> None:
    """``asyncio.run`` ends while a batch is in flight: each member is "never released".

    A ResourceWarning names each (the loop runs in a thread of its own
    here); nothing of the renewal survives the loop, and the keys expire
    with their leases.
    """
    urls = [s.url for s in subject.servers]
    outcome: list[Any] = []

    async def hold_and_leave() -> None:
        clients = [redis.Redis.from_url(url) for url in urls]
        locks = [subject.make_lock(name, ttl=TTL, clients=clients) for name in names(subject)]
        for lock in locks:
            assert await lock.acquire()
        await asyncio.sleep(2 * TTL)
        holdings = [lock._current for lock in locks]
        deadline = time.monotonic() + 5.0  # (a renewal every 0.1 s; a loaded machine's later)
        while not any(h.flight is not None for h in holdings if h is not None):
            assert time.monotonic() < deadline, "no batch went out"
            await asyncio.sleep(0)
        outcome.append(locks)  # (kept: collected locks would be reported for that instead)
        # The loop ends here, with the batch in flight and every lock held.

    def run() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            asyncio.run(hold_and_leave())
        return [str(w.message) for w in caught if w.category is ResourceWarning]

    warned = await asyncio.wait_for(asyncio.to_thread(run), 10)
    assert outcome, "the loop in the thread did not get as far as the batch"
    reported = {
        n
        for n in names(subject)
        if any(f"lock {subject.shown_for(n)!r} was never released" in w for w in warned)
    }
    assert reported == set(names(subject)), warned
    assert all("shut down" in w for w in warned)

    async def expired() -> bool:
        return not any([any(await subject.present(lock.key)) for lock in outcome[0]])

    await eventually(expired, "the keys to expire with their leases", timeout=TTL + 1.0)
