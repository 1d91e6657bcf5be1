"""Election: one leader at a time, terms with fences, resignation, observers, re-campaigns.

Every test runs against real servers; the process tests run candidates in
processes of their own (``_test_election_worker.py``) and watch them with a
witness counter on the server that a second leader would push above 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from support.servers import Own, connected
from support.timing import Lateness, eventually

from aiolock import Election, LockError, LockEvent, LockLostError, Semaphore, Term
from aiolock._identity import check_identity, default_identity, identity_of, token_with
from aiolock._keys import Keys
from aiolock.testing import FaultProxy, RedisServer

WORKER = Path(__file__).with_name("_test_election_worker.py")


@contextlib.asynccontextmanager
async def cleaned(admin: redis.Redis, name: str) -> AsyncIterator[None]:
    """Delete the election's fencing counter after the test (it persists by design)."""
    try:
        yield
    finally:
        await admin.delete(Keys(name).fence)


async def leader_is(election: Election, expected: str | None) -> None:
    """Until ``election.leader()`` says ``expected``."""

    async def check() -> bool:
        return await election.leader() == expected

    await eventually(check, f"the leader to be {expected!r}", timeout=5.0)


# --- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": "10"}, TypeError, "ttl"),
        ({"identity": 42}, TypeError, "identity"),
        ({"identity": ""}, ValueError, "identity"),
        ({"identity": "a\nb"}, ValueError, "identity"),
        ({"identity": "x" * 257}, ValueError, "identity"),
        ({"backoff": "fast"}, TypeError, "backoff"),
        ({"prefix": 3}, TypeError, "prefix"),
    ],
)
async def test_bad_arguments_name_the_argument(
    client: redis.Redis, options: dict[str, object], error: type[Exception], named: str
) -> None:
    """Bad options fail at construction with a TypeError/ValueError naming the argument."""
    with pytest.raises(error, match=named):
        Election(client, "e", **options)  # type: ignore[arg-type]


async def test_bad_client_name_and_job(client: redis.Redis) -> None:
    """A client that is not redis.asyncio, an empty name and a job that is not callable fail."""
    with pytest.raises(TypeError, match="client"):
        Election(object(), "e")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        Election(client, "")
    with pytest.raises(TypeError, match="job"):
        await Election(client, "e").run(42)  # type: ignore[arg-type]


def test_identity_travels_in_the_token() -> None:
    """A token carries its identity after 128 random bits, spaces and all, and reads back."""
    token = token_with("host a:42:Task 7 é")
    head, _, _ = token.partition(":")
    assert len(head) == 32
    assert int(head, 16) >= 0
    assert " " not in token
    assert identity_of(token) == "host a:42:Task 7 é"
    assert identity_of(token.encode()) == "host a:42:Task 7 é"
    assert identity_of(os.urandom(16).hex()) is None
    assert token_with("a") != token_with("a")


async def test_a_default_identity_is_always_a_valid_one() -> None:
    """A task name with a newline, or very long, still gives a printable identity of <= 256."""

    async def noop() -> None:
        await asyncio.sleep(0)

    for task_name in ("line\nbreak", "x" * 400):
        task = asyncio.create_task(noop(), name=task_name)
        identity = default_identity(task)
        await task
        assert check_identity(identity) == identity
    assert check_identity("y" * 256) == "y" * 256


# --- terms ----------------------------------------------------------------------------------------


async def test_terms_have_increasing_fences_and_show_their_leader(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Each term's fence is above the last; leader() names the leader during a term, None after."""
    election = Election(client, name, ttl=2.0, identity="host-a:4242")
    fences = []
    async with cleaned(admin, name):
        assert await election.leader() is None
        for _ in range(3):
            async with election.lead() as term:
                assert isinstance(term, Term)
                assert term.identity == "host-a:4242"
                assert await election.leader() == "host-a:4242"
                fences.append(term.fence)
            assert term.ended.is_set()
            assert await election.leader() is None
    assert all(b > a for a, b in itertools.pairwise(fences)), fences


async def test_a_term_reports_to_the_observers(
    client: redis.Redis, admin: redis.Redis, name: str, events: list[LockEvent], no_leaks: None
) -> None:
    """A term gives one "acquired" and one "released" event of its ElectionLock, with its fence."""
    election = Election(client, name, ttl=2.0, identity="a")
    async with cleaned(admin, name), election.lead() as term:
        pass
    mine = [e for e in events if e.name == name]
    assert [e.kind for e in mine] == ["acquired", "released"]
    assert {type(e.lock).__name__ for e in mine} == {"ElectionLock"}
    assert {e.fence for e in mine} == {term.fence}


async def test_default_identity_is_host_pid_and_task(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Without identity=, the leader is named host:pid:task-name of the campaigning task."""
    election = Election(client, name, ttl=2.0)

    async def campaign() -> str:
        async with election.lead() as term:
            assert await election.leader() == term.identity
            return term.identity

    async with cleaned(admin, name):
        identity = await asyncio.create_task(campaign(), name="the-scheduler")
    assert identity == f"{socket.gethostname()}:{os.getpid()}:the-scheduler"


async def test_two_candidates_never_lead_together(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Candidates on two clients waiting on each other: one leader at a time, in turn."""
    inside: list[str] = []
    overlaps = 0

    async def candidate(c: redis.Redis, who: str) -> None:
        nonlocal overlaps
        election = Election(c, name, ttl=2.0, identity=who)
        for _ in range(5):
            async with election.lead():
                inside.append(who)
                overlaps += len(inside) > 1
                await asyncio.sleep(0.002)
                inside.remove(who)

    async with cleaned(admin, name):
        with anyio.fail_after(20):
            await asyncio.gather(candidate(client, "a"), candidate(other_client, "b"))
    assert overlaps == 0


async def test_body_is_cancelled_when_the_term_is_lost(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """A term whose key is taken away: the body is cancelled at the next renewal, LockLostError."""
    election = Election(client, name, ttl=0.6, identity="a")
    cancelled = asyncio.Event()

    async def lead() -> None:
        async with election.lead():
            await admin.set(Keys(name).lock, "someone-else", px=5000)
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async with cleaned(admin, name):
        with pytest.raises(LockLostError), anyio.fail_after(5):
            await lead()
        assert cancelled.is_set()
        await admin.delete(Keys(name).lock)


async def test_resign_hands_over_within_half_a_second(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """resign() from another task ends the leader's body quietly; the next leads within 0.5 s."""
    first = Election(client, name, ttl=10.0, identity="host a:1 é")
    second = Election(other_client, name, ttl=10.0, identity="host b:2 %20")
    leading = asyncio.Event()
    body_ended_quietly = False
    took_over = 0.0
    seen_leader = None

    async def lead_a() -> None:
        nonlocal body_ended_quietly
        async with first.lead():
            leading.set()
            await asyncio.sleep(30)
        body_ended_quietly = True

    async def lead_b() -> None:
        nonlocal took_over, seen_leader
        async with second.lead():
            took_over = time.monotonic()
            seen_leader = await first.leader()

    async with cleaned(admin, name), Lateness() as lateness:
        a = asyncio.create_task(lead_a())
        await leading.wait()
        b = asyncio.create_task(lead_b())
        await eventually(lambda: admin.exists(Keys(name).queue), "b to queue up")
        asked = time.monotonic()
        assert await first.resign() is True
        assert first._terms == {}
        with anyio.fail_after(5):
            await asyncio.gather(a, b)
        assert body_ended_quietly
        # (Identities with spaces travel in grant messages, whose fields spaces separate.)
        assert took_over - asked < 0.5 + lateness.between(asked, took_over)
        assert seen_leader == "host b:2 %20"
        assert await first.resign() is False


async def test_resign_in_the_body_ends_it_there(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """resign() called in the body does not return: lead() exits without error, the term ends."""
    election = Election(client, name, ttl=2.0, identity="a")
    after = False
    async with cleaned(admin, name):
        async with election.lead() as term:
            await election.resign()
            after = True
        assert not after
        assert term.ended.is_set()
        assert await election.leader() is None


async def test_observe_shows_terms_and_vacancies(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Two terms with gaps are observed as [None, "a", None, "b", None]."""
    watcher = Election(admin, name, ttl=2.0)
    seen: list[str | None] = []

    async def watch() -> None:
        async with contextlib.aclosing(watcher.observe()) as changes:
            async for leader in changes:
                seen.append(leader)
                if len(seen) == 5:
                    return

    async def term(c: redis.Redis, who: str) -> None:
        async with Election(c, name, ttl=2.0, identity=who).lead():
            await eventually(lambda: seen[-1:] == [who], f"{who} to be observed")

    async with cleaned(admin, name):
        watching = asyncio.create_task(watch())
        await eventually(lambda: seen == [None], "the vacancy to be observed")
        await term(client, "a")
        await eventually(lambda: seen[-1:] == [None], "the vacancy after a")
        await term(other_client, "b")
        with anyio.fail_after(5):
            await watching
    assert seen == [None, "a", None, "b", None]


async def test_observe_never_shows_a_leader_whose_lease_ended(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """A leader that vanishes without a release (its key expires) is reported gone by its PTTL."""
    watcher = Election(admin, name, ttl=1.0)
    async with cleaned(admin, name), contextlib.aclosing(watcher.observe()) as changes:
        assert await anext(changes) is None
        await admin.set(Keys(name).lock, token_with("ghost"), px=1000)
        with anyio.fail_after(2):
            assert await anext(changes) == "ghost"
        asked = time.monotonic()  # (the key expires at least PTTL after this)
        expires = asked + (await admin.pttl(Keys(name).lock)) / 1000
        with anyio.fail_after(3):
            assert await anext(changes) is None
        assert time.monotonic() >= expires
        assert not await admin.exists(Keys(name).lock)


# --- run() ----------------------------------------------------------------------------------------


async def test_run_campaigns_again_after_the_job_raises(
    client: redis.Redis,
    admin: redis.Redis,
    name: str,
    no_leaks: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed job is logged; run() leads again (a newer fence), returns the next job's value."""
    election = Election(client, name, ttl=2.0, identity="a", backoff=lambda attempt: 0.01)
    fences: list[int] = []

    async def job(term: Term) -> str:
        fences.append(term.fence)
        if len(fences) < 3:
            raise RuntimeError("the job failed")
        return "done"

    async with cleaned(admin, name):
        with caplog.at_level(logging.WARNING, "aiolock"), anyio.fail_after(5):
            assert await election.run(job) == "done"
    assert len(fences) == 3
    assert fences[0] < fences[1] < fences[2]
    assert sum("the job failed" in r.getMessage() for r in caplog.records) == 2


async def test_run_campaigns_again_after_a_loss(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """A term lost under run(): the job is cancelled, and run() leads again with a newer fence."""
    election = Election(client, name, ttl=0.6, identity="a", backoff=lambda attempt: 0.01)
    fences: list[int] = []
    cancelled = 0

    async def job(term: Term) -> int:
        nonlocal cancelled
        fences.append(term.fence)
        if len(fences) == 2:
            return term.fence
        await admin.set(Keys(name).lock, "taken-away", px=100)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled += 1
            raise
        return 0  # pragma: no cover - cancelled first

    async with cleaned(admin, name):
        with anyio.fail_after(5):
            assert await election.run(job) == fences[1]
    assert cancelled == 1
    assert fences[0] < fences[1]


async def test_cancelling_run_leaves_nothing(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Cancelling run() while leading, and a waiting candidate's run(): no key and no entry left."""
    leading = asyncio.Event()

    async def job(term: Term) -> None:
        leading.set()
        await asyncio.sleep(30)

    async with cleaned(admin, name):
        leader = asyncio.create_task(Election(client, name, ttl=2.0).run(job))
        await leading.wait()
        standby = asyncio.create_task(Election(other_client, name, ttl=2.0).run(job))
        await eventually(lambda: admin.exists(Keys(name).queue), "the standby to queue up")
        standby.cancel()
        leader.cancel()
        with anyio.fail_after(5):
            results = await asyncio.gather(leader, standby, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)


async def test_run_on_another_kind_s_name_raises_instead_of_campaigning_for_ever(
    client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """run() on a semaphore's name: the campaign's LockError ends it (no retry loop)."""
    calls = 0

    async def job(term: Term) -> None:
        nonlocal calls
        calls += 1

    async with Semaphore(client, name, limit=2, ttl=2.0):
        with pytest.raises(LockError, match="in use by a Semaphore"), anyio.fail_after(5):
            await Election(client, name, ttl=2.0).run(job)
    assert calls == 0


# --- faults ---------------------------------------------------------------------------------------


@pytest.mark.one_loop
async def test_a_candidate_whose_server_is_silent_stops_campaigning(
    client: redis.Redis,
    admin: redis.Redis,
    name: str,
    start_proxy: Callable[..., object],
    server: RedisServer,
) -> None:
    """A queued candidate whose link goes silent raises ConnectionError, not waiting for ever."""
    proxy: FaultProxy = await start_proxy(server)  # type: ignore[misc]
    leader = Election(client, name, ttl=0.5, identity="a")
    async with cleaned(admin, name), connected(proxy.url) as through_proxy:
        candidate = Election(through_proxy, name, ttl=0.5, identity="b")
        async with leader.lead():
            assert await candidate.leader() == "a"
            campaign = asyncio.create_task(candidate.run(lambda term: asyncio.sleep(0)))
            await eventually(lambda: admin.exists(Keys(name).queue), "b to queue up")
            proxy.black_hole()
            started = time.monotonic()
            with (
                pytest.raises(RedisConnectionError, match="stopped campaigning"),
                anyio.fail_after(10),
            ):
                await campaign
            # Two leases, at least 2 s, plus the loop's lateness.
            assert time.monotonic() - started >= 2.0 - 0.05
        proxy.pass_through()


@pytest.mark.one_loop
async def test_a_server_restart_ends_the_term_within_the_lease(own: Own, name: str) -> None:
    """A restart without data ends the term: the body is cancelled within the lease."""
    ttl = 1.0
    election = Election(own.client, name, ttl=ttl, identity="a")
    cancelled_at: float | None = None
    restarted = 0.0

    async def lead() -> None:
        nonlocal restarted, cancelled_at
        async with election.lead():
            await asyncio.to_thread(own.server.restart)
            restarted = time.monotonic()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled_at = time.monotonic()
                raise

    async with Lateness() as lateness:
        with pytest.raises(LockLostError), anyio.fail_after(10):
            await lead()
    assert cancelled_at is not None
    assert cancelled_at - restarted < ttl + lateness.between(restarted, cancelled_at)


# --- processes ------------------------------------------------------------------------------------


async def start_worker(*args: str) -> asyncio.subprocess.Process:
    """A candidate in a process of its own (see ``_test_election_worker.py``)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args, stdout=asyncio.subprocess.PIPE
    )


async def line_of(proc: asyncio.subprocess.Process) -> str:
    """The worker's next line of output."""
    assert proc.stdout is not None
    return (await proc.stdout.readline()).decode().strip()


@contextlib.asynccontextmanager
async def workers() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Processes started in the block; killed (and reaped) after it, whatever happened."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                await proc.wait()


@pytest.mark.heavy
async def test_three_processes_in_turn_never_have_two_leaders(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """3 processes campaigning in turn: the witness never sees two leaders; fences increase."""
    rounds = 10
    busy, fences, go = (f"test:{{{name}}}:{s}" for s in ("busy", "fences", "go"))
    async with cleaned(admin, name), workers() as procs:
        for i in range(3):
            procs.append(await start_worker("turns", server.url, name, str(rounds), f"p{i}"))
        with anyio.fail_after(30):
            for proc in procs:
                assert await line_of(proc) == "ready"
            await admin.rpush(go, 1, 2, 3)
            reports = [json.loads(await line_of(proc)) for proc in procs]
            for proc in procs:
                await proc.wait()
        assert [r["overlaps"] for r in reports] == [0, 0, 0]
        seen = [entry.split() for entry in await admin.lrange(fences, 0, -1)]
        await admin.delete(busy, fences, go)
    assert len(seen) == 3 * rounds
    numbers = [int(fence) for _, fence in seen]
    assert all(b > a for a, b in itertools.pairwise(numbers)), numbers
    assert {who for who, _ in seen} == {"p0", "p1", "p2"}


@pytest.mark.heavy
@pytest.mark.one_loop
async def test_a_killed_leader_is_replaced_within_its_lease(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A SIGKILLed leader's term passes to the waiting candidate within ttl + 1 s."""
    ttl = 1.0
    standby = Election(client, name, ttl=ttl, identity="standby")
    async with cleaned(admin, name), workers() as procs:
        procs.append(await start_worker("hold", server.url, name, str(ttl), "doomed"))
        with anyio.fail_after(10):
            assert (await line_of(procs[0])).startswith("leading")
        took_over = asyncio.Event()

        async def campaign() -> None:
            async with standby.lead():
                took_over.set()

        waiting = asyncio.create_task(campaign())
        await eventually(lambda: admin.exists(Keys(name).queue), "the standby to queue up")
        procs[0].kill()
        killed = time.monotonic()
        async with Lateness() as lateness:
            with anyio.fail_after(ttl + 5):
                await took_over.wait()
        replaced = time.monotonic()
        await waiting
        assert replaced - killed < ttl + 1.0 + lateness.between(killed, replaced)


@pytest.mark.heavy
@pytest.mark.one_loop
async def test_a_paused_leader_is_cancelled_when_it_resumes(
    server: RedisServer, client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A SIGSTOPped leader loses its term to the standby; on SIGCONT its body is cancelled."""
    ttl = 0.5
    standby = Election(client, name, ttl=ttl, identity="standby")
    async with cleaned(admin, name), workers() as procs:
        procs.append(await start_worker("hold", server.url, name, str(ttl), "paused"))
        proc = procs[0]
        with anyio.fail_after(10):
            assert (await line_of(proc)).startswith("leading")
        os.kill(proc.pid, signal.SIGSTOP)
        with anyio.fail_after(10):
            async with standby.lead():
                assert await standby.leader() == "standby"
                os.kill(proc.pid, signal.SIGCONT)
                assert await line_of(proc) == "cancelled"
                assert await line_of(proc) == "lost"
                assert await proc.wait() == 0
                assert await standby.leader() == "standby"
