"""The lock contract, kept by an Election: its terms are holdings on the lock engine.

An :class:`~aiolock.Election`'s public surface is ``lead()``, ``run()`` and
``resign()``, not a lock's ``acquire()``/``release()``, so it is not one of
the contract's :data:`~support.contract.PRIMITIVES`. The items of the contract
that apply to it are written here in its words: ``lead()``'s enter is the
acquire (a campaign), its exit and ``resign()`` the release. They use the
suite's subject (``election_subject``: a lock's admin view, one server, with
the same leak checks) and its helpers. What is proved: the cancellation
windows of a campaign (while it waits in the queue; before the server ran
its acquire: ``CLIENT PAUSE WRITE``; after it ran, before the reply: a
:class:`FaultProxy` holding replies) and of a term's exit; loss (the body
cancelled at once, ``LockLostError``, the body's own exception kept with the
loss as a note); renewal past the lease, and batched with the other terms of
one client; a user without channel rights; the observer events of its
``ElectionLock``; bad arguments.

The contract items that do not apply to an election, and why:

- ``extend()``, ``owned()``, ``locked()``, ``release()`` from another task (a
  hand-off), ``reentrant``, ``max_hold``, ``on_lost``: an election has none
  of them (a term is owned by the task that campaigned; ``resign()`` ends it
  from anywhere, tested here as a release).
- ``timeout``/``blocking`` of an acquire, ``not_acquired`` by a timeout: a
  candidate campaigns until it leads (a caller bounds it with its own
  timeout: tested here as a cancellation); ``aiolock run --elect --timeout``
  is the CLI's (tests/project/test_cli.py).
- ``backoff`` of an acquire, a waiter killed mid-backoff: a candidate waits
  in the queue and is notified; ``backoff`` paces ``run()``'s re-campaigns
  (tests/primitives/test_election.py).
- a server that stops answering mid-wait: the election's own link watch
  (tests/primitives/test_election.py), not the lock's bound.
- a forgotten lock (garbage-collected while held): a term is held only by
  the body of ``async with election.lead()``.
- what the lease does on the link (a slow link, lost replies, hand-overs,
  the longest ``ttl``): a term's lease is the one-server lease of an
  ``AsyncLock`` (``fair=True``), proved over AsyncLock in test_contract.py
  and test_contract_in_apps.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
from support.contract import INF, NAN, Subject
from support.leaks import assert_nothing_leaked, connections_made
from support.locks import cancel_once_the_key_exists, kinds, names, names_value
from support.servers import blocked_client_ids, user_without_channels
from support.timing import Lateness, eventually, finish

from aiolock import Election, LockEvent, LockLostError, backoff
from aiolock._election import ElectionLock
from aiolock._identity import identity_of
from aiolock._keys import Keys
from aiolock.testing import FaultProxy, RedisServer

# --- holding and renewal ------------------------------------------------------------------------


async def test_lead_holds_the_term_and_its_exit_releases_it(
    election_subject: Subject, events: list[LockEvent]
) -> None:
    """lead() holds the key with a token naming the candidate; exit deletes it, ends the term."""
    s = election_subject
    election = s.make_election(identity="candidate a")
    async with election.lead() as term:
        [(token,)] = await s.holders(election.key)
        assert identity_of(token) == "candidate a"
        assert term.identity == "candidate a"
        assert not term.ended.is_set()
        assert await election.leader() == "candidate a"
    assert term.ended.is_set()
    await s.assert_absent_and_stays(election.key)
    assert kinds(events, s.name) == ["acquired", "released"]


async def test_renewal_keeps_the_term_past_its_ttl_and_each_renewal_is_reported(
    election_subject: Subject, events: list[LockEvent]
) -> None:
    """A ttl=0.3 term held 1.2 s: same token, the lease never runs out, 'renewed' events."""
    s = election_subject
    election = s.make_election(ttl=0.3)
    async with election.lead() as term:
        tokens = await s.holders(election.key)
        assert () not in tokens
        held_until = time.monotonic() + 1.2
        lowest = 300
        while time.monotonic() < held_until:
            await asyncio.sleep(0.02)
            lowest = min(lowest, *await s.leases(election.key))
            assert await s.holders(election.key) == tokens, "the term changed hands while held"
        assert lowest > 0, f"the term ran out of lease while held (lowest PTTL {lowest} ms)"
        assert min(await s.leases(election.key)) > 150, "the lease was not renewed near the end"
        assert not term.ended.is_set()
    assert set(kinds(events, s.name)) == {"acquired", "renewed", "released"}
    assert kinds(events, s.name).count("renewed") >= 3


async def waiting_in_queue(s: Subject) -> None:
    """Until a candidate's entry stands in the election's queue (not a client's keeper mark)."""
    queue = Keys(s.name).queue

    async def entered() -> bool:
        keys = [str(k) for k in await s.admins[0].keys(f"{queue}:*")]
        return any(not k.startswith(f"{queue}:@") for k in keys)

    await eventually(entered, "a candidate to queue up", timeout=3.0)


async def hold_term(election: Election, leading: asyncio.Event, leave: asyncio.Event) -> None:
    """Lead ``election`` until ``leave`` is set (``leading`` says it leads)."""
    async with election.lead():
        leading.set()
        await leave.wait()


async def test_a_user_without_channel_rights_leads_and_ends_terms_without_error(
    election_subject: Subject,
) -> None:
    """A least-privilege user (no channel rights) leads, ends its term, and leads after another."""
    s = election_subject
    async with user_without_channels(s.admins) as (user, password):
        urls = [f"redis://{user}:{password}@{server.host}:{server.port}" for server in s.servers]
        election = s.make_election(clients=s.connect(urls), ttl=2.0)
        async with election.lead():
            assert await s.held_everywhere(election.key)
        await s.assert_absent_and_stays(election.key)
        leader = s.make_election(process=1, ttl=2.0)
        first, second, first_leaves, second_leaves = (asyncio.Event() for _ in range(4))
        holder = asyncio.create_task(hold_term(leader, first, first_leaves))
        waiter: asyncio.Task[None] | None = None
        try:
            with anyio.fail_after(5):
                await first.wait()
            waiter = asyncio.create_task(hold_term(election, second, second_leaves))
            await waiting_in_queue(s)
            assert not second.is_set()
            first_leaves.set()
            with anyio.fail_after(5):  # its grant message is refused to it: it polls
                await holder
                await second.wait()
            assert await s.held_everywhere(election.key)
            second_leaves.set()
            await waiter
        finally:
            first_leaves.set()
            second_leaves.set()
            await finish(holder)
            if waiter is not None:
                await finish(waiter)
        assert await s.keys_left() == []


# --- cancellation while waiting to lead --------------------------------------------------------


@pytest.mark.parametrize("how", ["Task.cancel", "asyncio.timeout", "anyio.move_on_after"])
async def test_a_candidate_cancelled_while_waiting_to_lead_leaves_no_entry_and_no_term(
    election_subject: Subject, events: list[LockEvent], how: str
) -> None:
    """Cancelled in the queue: its entry goes, the leader's end hands it nothing; not_acquired."""
    s = election_subject
    leader = s.make_election(process=1, identity="leader")
    candidate = s.make_election(identity="candidate")
    leading, leave = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_term(leader, leading, leave))
    entered: list[bool] = []

    async def campaign() -> None:
        async with candidate.lead():
            entered.append(True)

    try:
        await leading.wait()
        queue = Keys(s.name).queue
        if how == "Task.cancel":
            task = asyncio.create_task(campaign())
            await waiting_in_queue(s)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "asyncio.timeout":
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await campaign()
        else:
            with anyio.move_on_after(0.3) as scope:
                await campaign()
            assert scope.cancelled_caught
        assert entered == []
        assert not any(await s.present(queue)), "the cancelled candidate's queue was left"
        leave.set()
        await holder
    finally:
        leave.set()
        await finish(holder)
    await s.assert_absent_and_stays(s.make_election().key)
    assert candidate._terms == {}
    outcomes = [e for e in events if e.name == s.name and e.lock is candidate._lock]
    assert [e.kind for e in outcomes] == ["not_acquired"]
    assert isinstance(outcomes[0].error, asyncio.CancelledError)
    assert outcomes[0].contended is True
    with anyio.fail_after(2):  # nothing stuck locally: the same object leads at once
        async with candidate.lead():
            pass


# --- cancellation window 1: before the server ran the campaign's command ----------------------


async def test_cancel_before_the_server_ran_the_campaign_leaves_no_key(
    election_subject: Subject,
) -> None:
    """Cancelled while CLIENT PAUSE WRITE holds the campaign's acquire back: no key, ever."""
    s = election_subject
    election = s.make_election()
    for c in s.process(0):
        await c.ping()  # the pool has a connection: the first command is not a connect
    entered = asyncio.Event()

    async def campaign() -> None:
        async with election.lead():
            entered.set()

    await s.cancel_while_paused(campaign())
    assert not entered.is_set()
    await s.assert_absent_and_stays(election.key)
    with anyio.fail_after(2):  # the local queue is free again: the same object leads at once
        async with election.lead():
            pass


# --- cancellation window 2: after the server ran it, before the reply --------------------------


async def test_cancel_after_the_server_ran_the_campaign_undoes_it(
    election_subject: Subject, start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]]
) -> None:
    """Cancelled after the server granted the term but before the reply: the key is undone."""
    s = election_subject
    proxies = [await start_proxy(server) for server in s.servers]
    clients = s.connect([p.url for p in proxies])
    election = s.make_election(clients=clients)
    async with election.lead():  # scripts loaded, a pooled connection through the proxy
        pass
    entered: list[bool] = []

    async def campaign() -> None:
        async with election.lead():
            entered.append(True)

    await cancel_once_the_key_exists(proxies, s.admins, election.key, campaign())
    assert entered == []
    await s.assert_absent_and_stays(election.key)
    await assert_nothing_leaked(*clients)
    with anyio.fail_after(2):  # nothing stuck locally either
        async with election.lead():
            pass


# --- a cancelled exit still ends the term ------------------------------------------------------


@pytest.mark.parametrize("how", ["Task.cancel", "anyio.move_on_after"])
async def test_a_term_whose_exit_is_cancelled_still_ends(
    election_subject: Subject, events: list[LockEvent], how: str
) -> None:
    """The exit's release, held back by the server and cancelled, completes: one 'released'."""
    s = election_subject
    election = s.make_election()
    may_leave = asyncio.Event()
    trigger: list[Callable[[], None]] = []

    async def lead() -> None:
        async with election.lead():
            await may_leave.wait()

    def cancel_task() -> None:
        task.cancel()

    async def run() -> None:
        if how == "Task.cancel":
            trigger.append(cancel_task)
            await lead()
        else:
            with anyio.move_on_after(None) as scope:
                trigger.append(scope.cancel)
                await lead()
            assert scope.cancelled_caught

    task = asyncio.create_task(run())
    try:
        await s.wait_until_held(election.key)
        await s.pause()  # WRITE: the release is held back
        may_leave.set()
        await s.wait_until_paused()
        first = await blocked_client_ids(s.admins[0])
        trigger[0]()

        # Cancelling closed that connection, so the server dropped the held-back command:
        # only a release sent again, on another connection, can still delete the key.
        async def sent_again() -> bool:
            now = await blocked_client_ids(s.admins[0])
            return bool(now) and not now & first

        await eventually(sent_again, "the cancelled release to be sent again", timeout=3.0)
        await s.unpause()
        if how == "Task.cancel":
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await task
    finally:
        await s.unpause()
        await finish(task)
    await s.assert_absent_and_stays(election.key)
    assert election._terms == {}
    assert kinds(events, s.name) == ["acquired", "released"]


async def test_resign_is_a_release_that_hands_the_term_to_the_next_candidate(
    election_subject: Subject, events: list[LockEvent]
) -> None:
    """resign() from another task: 'released' for the leader, then the next leads at once."""
    s = election_subject
    first = s.make_election(identity="first")
    second = s.make_election(process=1, identity="second")
    leading, leave = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_term(first, leading, leave))
    next_leading, next_leave = asyncio.Event(), asyncio.Event()
    try:
        await leading.wait()
        waiter = asyncio.create_task(hold_term(second, next_leading, next_leave))
        try:
            await waiting_in_queue(s)
            with anyio.fail_after(3):
                assert await first.resign() is True
                await holder  # its body ended quietly
                await next_leading.wait()
            assert await first.leader() == "second"
            next_leave.set()
            await waiter
        finally:
            await finish(waiter)
    finally:
        leave.set()
        await finish(holder)
    await s.assert_absent_and_stays(first.key)
    # (Per lock: the grant may reach the next candidate before the releasing task reports.)
    assert [e.kind for e in events if e.lock is first._lock] == ["acquired", "released"]
    assert [e.kind for e in events if e.lock is second._lock] == ["acquired", "released"]


# --- loss -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["PEXPIRE 1", "DEL", "overwrite"])
async def test_a_lost_term_cancels_the_body_at_once_and_raises_lost(
    election_subject: Subject, events: list[LockEvent], how: str
) -> None:
    """The term taken away: the body is cancelled within a lease, LockLostError, 'lost' reported."""
    s = election_subject
    election = s.make_election(ttl=0.3)
    taken: list[float] = []
    finished: list[bool] = []
    terms: list[Any] = []

    async def body() -> None:
        async with election.lead() as term:
            terms.append(term)
            await s.take_away(election.key, how)
            taken.append(time.monotonic())
            await asyncio.sleep(10)
            finished.append(True)

    async with Lateness() as lateness:
        with pytest.raises(LockLostError), anyio.fail_after(5):
            await body()
        raised = time.monotonic()
    assert finished == []
    after_loss = raised - taken[0]
    assert after_loss < 0.3 + lateness.between(taken[0], raised), f"{after_loss:.3f} s"
    assert terms[0].ended.is_set()
    assert election._terms == {}
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0, "the loss left a cancellation behind"
    await asyncio.sleep(0)  # the test task itself is not cancelled
    # another holder's key is never touched
    someone_else = ("someone else",) if how == "overwrite" else ()
    assert await s.holders(election.key) == [someone_else]
    await s.delete(election.key)
    assert kinds(events, s.name) == ["acquired", "lost"]


async def test_body_exception_wins_and_carries_the_loss_as_note(
    election_subject: Subject,
) -> None:
    """The body's own exception propagates from a lost term, with the loss attached as a note."""
    s = election_subject
    election = s.make_election(ttl=0.3)

    async def body() -> None:
        async with election.lead():
            await s.take_away(election.key, "DEL")
            raise ValueError("body failed")

    with pytest.raises(ValueError, match="body failed") as caught:
        await body()
    assert str(caught.value) == "body failed"
    notes: list[str] = getattr(caught.value, "__notes__", [])
    said = f"aiolock: lock {s.name!r} was no longer held"
    assert any(note.startswith(said) for note in notes), notes


#: The terms of the batched renewal test: six on one client, renewed every 0.1 s.
BATCH_TTL = 0.3
MEMBERS = 6


async def evalsha_calls(s: Subject) -> int:
    """How many ``EVALSHA`` calls the subject's server has run, in all."""
    stats = await s.admins[0].info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_terms_of_one_client_renew_together_and_a_lost_one_ends_alone(
    election_subject: Subject,
) -> None:
    """Six terms on one client renew in shared calls; one taken away: its body alone ends, lost."""
    s = election_subject
    elections = [s.make_election(f"{s.name}-{i}", ttl=BATCH_TTL) for i in range(MEMBERS)]
    leading = [asyncio.Event() for _ in elections]
    leave = asyncio.Event()
    outcomes: dict[int, str] = {}

    async def lead(i: int) -> None:
        try:
            async with elections[i].lead():
                leading[i].set()
                await leave.wait()
        except LockLostError:
            outcomes[i] = "lost"
        else:
            outcomes[i] = "ended"

    tasks = [asyncio.create_task(lead(i)) for i in range(MEMBERS)]
    try:
        with anyio.fail_after(5):
            for event in leading:
                await event.wait()
        await asyncio.sleep(2 * BATCH_TTL)  # past every first renewal
        before = await evalsha_calls(s)
        periods = 10
        await asyncio.sleep(periods * BATCH_TTL / 3)
        calls = await evalsha_calls(s) - before
        assert calls <= periods * 2 + 2, f"{calls} renewal calls for {MEMBERS} terms"
        tokens = {e.key: await s.holders(e.key) for e in elections}
        victim = elections[2]
        await s.take_away(victim.key, "overwrite")
        async with Lateness() as lateness:
            taken = time.monotonic()
            with anyio.fail_after(5):
                await tasks[2]
            ended = time.monotonic()
        assert outcomes == {2: "lost"}
        assert ended - taken < BATCH_TTL + lateness.between(taken, ended)
        for election in elections:
            if election is not victim:
                assert await s.holders(election.key) == tokens[election.key]
        leave.set()
        await asyncio.gather(*tasks)
        assert outcomes == {i: "lost" if i == 2 else "ended" for i in range(MEMBERS)}
    finally:
        leave.set()
        for task in tasks:
            await finish(task)
        for election in elections:
            await s.admins[0].delete(election.key, Keys(election.name).fence)


# --- observer events ------------------------------------------------------------------------------


async def test_an_uncontended_term_is_acquired_then_released_by_its_election_lock(
    election_subject: Subject, events: list[LockEvent]
) -> None:
    """A term gives 'acquired' (not contended, with the wait, its fence) and 'released' (held)."""
    s = election_subject
    election = s.make_election(ttl=5.0)
    async with election.lead() as term:
        await asyncio.sleep(0.05)
    acquired, released = (e for e in events if e.name == s.name)
    for event in (acquired, released):
        assert event.lock is election._lock
        assert isinstance(event.lock, ElectionLock)
        assert type(event.lock).__name__ == "ElectionLock"
        assert event.fence == term.fence
    assert acquired.kind == "acquired"
    assert acquired.contended is False
    assert acquired.waited is not None
    assert 0 <= acquired.waited < 1.0
    assert acquired.held is None
    assert released.kind == "released"
    assert released.held is not None
    assert 0.05 <= released.held < 2.0


# --- bad arguments --------------------------------------------------------------------------------


async def assert_nothing_sent(s: Subject) -> None:
    """The failed call made no client connect and left no key of the test's name."""
    for clients in s.client_sets:
        assert all(connections_made(c) == 0 for c in clients), "a bad argument made a connection"
    assert await s.keys_left() == []


@pytest.mark.parametrize(
    ("bad_name", "error"),
    [("", ValueError), (42, TypeError), (5, TypeError), (b"x", TypeError), (None, TypeError)],
    ids=["empty", "int", "5", "bytes", "None"],
)
async def test_bad_name(
    election_subject: Subject, bad_name: object, error: type[Exception]
) -> None:
    """An empty name is a ValueError; a name that is not a str is a TypeError; both name it."""
    with pytest.raises(error, match=names_value("name", bad_name)):
        election_subject.make_election(bad_name)
    await assert_nothing_sent(election_subject)


def _option_cases() -> Iterator[Any]:
    """(option, value, error, shown in the message) for the options an Election takes."""
    for value, error in [
        (0, ValueError),
        (-1.0, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (0.0001, ValueError),
        ("10", TypeError),
        (True, TypeError),
        (None, TypeError),
    ]:
        yield pytest.param("ttl", value, error, repr(value), id=f"ttl={value!r}")
    for value, error, shown in [
        (42, TypeError, "42"),
        (b"a", TypeError, "b'a'"),
        ("", ValueError, "''"),
        ("a\nb", ValueError, repr("a\nb")),
        ("x" * 257, ValueError, "257"),
    ]:
        yield pytest.param("identity", value, error, shown, id=f"identity={value!r:.8}")
    for value in [42, "fast", 0.5]:
        yield pytest.param("backoff", value, TypeError, repr(value), id=f"backoff={value!r}")
    for label, policy, shown in [
        ("lambda:-1.0", lambda n: -1.0, "-1.0"),
        ("from_callable:nan", backoff.from_callable(lambda n: NAN), "nan"),
    ]:
        yield pytest.param("backoff", policy, ValueError, shown, id=f"backoff={label}")
    for value in [None, 3, b"app:"]:
        yield pytest.param("prefix", value, TypeError, repr(value), id=f"prefix={value!r}")


@pytest.mark.parametrize(("option", "value", "error", "shown"), list(_option_cases()))
async def test_bad_option_fails_at_construction(
    election_subject: Subject, option: str, value: object, error: type[Exception], shown: str
) -> None:
    """Each bad keyword option raises at construction, naming the option and the bad value."""
    kwargs: dict[str, Any] = {option: value}
    with pytest.raises(error, match=names(option, shown)):
        election_subject.make_election(**kwargs)
    await assert_nothing_sent(election_subject)


@pytest.mark.parametrize(
    "bad_client", [None, "redis://localhost", object()], ids=["None", "url", "object"]
)
async def test_a_client_that_is_not_redis_asyncio_fails_at_construction(
    election_subject: Subject, bad_client: object
) -> None:
    """A client that is not a redis.asyncio client is a TypeError naming the argument."""
    with pytest.raises(TypeError, match=r"\bclient\b"):
        Election(bad_client, election_subject.name)  # type: ignore[arg-type]
    await assert_nothing_sent(election_subject)
