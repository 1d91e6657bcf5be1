"""A least-privilege user: locks work, and tell the truth, without pub/sub rights.

And the ACL recipe of docs/production.md: its user, exactly as written, runs
every primitive with notifications, and is refused what the recipe leaves out.

Every user made on Redis 7+ without ``acl-pubsub-default allchannels`` gets
no channel rights (``resetchannels``). Such a user can take and release
locks, but the server refuses its release announcements and its
subscriptions. A release that deleted the key must still return normally,
waiters must still get the lock (by polling), and the one WARNING must name
the right to grant and the option that turns notifications off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as redis
from support.checkout import ROOT
from support.leaks import listeners_gone
from support.servers import calls, connected, started_servers, user_without_channels
from support.timing import eventually

from aiolock import AsyncLock, LockStatistics, ReadWriteLock, Redlock, Semaphore, backoff
from aiolock._queue import LOCAL_RUN
from aiolock.testing import RedisServer


@pytest.fixture
async def restricted(server: RedisServer, admin: redis.Redis) -> AsyncIterator[redis.Redis]:
    """A client of a user with every command and key but no channel (``resetchannels``)."""
    async with (
        user_without_channels([admin]) as (user, password),
        connected(server.url, username=user, password=password) as c,
    ):
        yield c


async def test_the_user_really_has_no_channel_rights(restricted: redis.Redis) -> None:
    """The fixture is what the tests claim: PUBLISH by this user is refused."""
    with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
        await restricted.publish("aiolock:{x}:released", "")


async def test_a_release_that_deleted_the_key_returns_normally(
    restricted: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression: a user without channel rights releases without an error.

    The release script deleted the key and then had its announcement refused;
    it used to raise ``ResponseError: ACL failure in script`` although the lock
    was released. ``async with`` whose body ended well must not raise either.
    """
    lock = AsyncLock(restricted, name)
    assert await lock.acquire()
    await lock.release()
    assert await admin.exists(lock.key) == 0
    async with lock:
        assert await admin.exists(lock.key) == 1
    assert await admin.exists(lock.key) == 0
    assert not lock.lost


async def test_a_waiter_of_the_user_gets_the_lock_by_polling_and_one_warning_says_why(
    restricted: redis.Redis,
    client: redis.Redis,
    admin: redis.Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: a refused subscription degrades to polling, with one WARNING.

    The warning names the channel right to grant and ``notify=False``, and no
    longer says that waiters poll "until the connection is back" (it never is).
    """
    caplog.set_level(logging.WARNING, logger="aiolock")
    holder = AsyncLock(client, name)
    assert await holder.acquire()
    step = 0.1
    waiters = [AsyncLock(restricted, name, backoff=backoff.constant(step)) for _ in range(2)]
    tasks = [asyncio.ensure_future(w.acquire(timeout=5.0)) for w in waiters]
    await eventually(
        lambda: waiters[0].statistics().tasks_waiting == 2, "both tasks wait through the user"
    )
    await asyncio.sleep(3 * step)  # several polls, and the refused subscription
    released = time.monotonic()
    await holder.release()
    assert await tasks[0]
    assert time.monotonic() - released < step + 0.5, "the waiter did not poll"
    await waiters[0].release()  # hands over to the other local task
    assert await tasks[1]
    await waiters[1].release()
    assert await admin.exists(holder.key) == 0
    refusals = [r for r in caplog.records if "refused release notifications" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    message = refusals[0].getMessage()
    assert "&aiolock:*" in message
    assert "notify=False" in message
    assert not any("until the connection is back" in r.getMessage() for r in caplog.records)


async def test_a_local_run_of_the_user_hands_over_and_yields_without_errors(
    restricted: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression: hand-overs of such a user, yielding included, raise nothing.

    A run of local hand-overs longer than LOCAL_RUN counts the channel's
    listeners and may announce a release; both are refused to this user and
    must not fail the release.
    """
    lock = AsyncLock(restricted, name)
    order: list[int] = []

    async def take(i: int) -> None:
        async with lock:
            order.append(i)
            await asyncio.sleep(LOCAL_RUN / 2)

    await admin.config_resetstat()
    await asyncio.gather(*(take(i) for i in range(5)))
    assert order == list(range(5))
    assert await calls(admin, "evalsha") >= 4  # the hand-overs ran as scripts
    assert await admin.exists(lock.key) == 0
    assert lock.statistics() == LockStatistics(held=False, owner=None, tasks_waiting=0)


# --- the least-privilege recipe of docs/production.md -------------------------------------------

PRODUCTION = ROOT / "docs" / "production.md"
#: The marker above the recipe's block on the page.
RECIPE_MARKER = "<!-- the ACL recipe: tests/topologies/test_acl.py reads the block below -->"


def acl_recipe() -> list[str]:
    """The ``ACL SETUSER`` of docs/production.md, as its words (user and password included)."""
    text = PRODUCTION.read_text(encoding="utf-8")
    after = text.split(RECIPE_MARKER, 1)[1]
    block = after.split("```text\n", 1)[1].split("```", 1)[0]
    words = block.split()
    assert words[:2] == ["ACL", "SETUSER"], words[:2]
    return words


@contextlib.asynccontextmanager
async def recipe_user(admins: list[redis.Redis]) -> AsyncIterator[tuple[str, str]]:
    """The recipe's user, with its rules as written, on every server; ``(user, password)``."""
    words = acl_recipe()
    user = f"{words[2]}-{secrets.token_hex(4)}"
    rules = words[3:]
    password = next(rule[1:] for rule in rules if rule.startswith(">"))
    for admin in admins:
        await admin.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
    try:
        yield user, password
    finally:
        for admin in admins:
            await admin.acl_deluser(user)


async def test_the_recipes_user_is_restricted(server: RedisServer, admin: redis.Redis) -> None:
    """The recipe really is least privilege: other keys, other channels, other commands refused."""
    async with (
        recipe_user([admin]) as (user, password),
        connected(server.url, username=user, password=password) as c,
    ):
        with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
            await c.set("other:key", "x")
        with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
            await c.publish("other-channel", "x")
        with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
            await c.flushall()
        with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
            await c.keys("*")


async def test_the_recipes_user_runs_every_primitive(
    server: RedisServer, admin: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As the user of docs/production.md's ACL recipe, every primitive works, notified.

    AsyncLock (default, fencing, fair), Semaphore, ReadWriteLock: acquire,
    extend, owned, locked, release; a waiter of another client is woken by
    the release (its subscription is allowed); no WARNING (no refused
    subscription, no failed renewal) and nothing left on the server.
    """
    caplog.set_level(logging.WARNING, logger="aiolock")
    async with (
        recipe_user([admin]) as (user, password),
        connected(server.url, username=user, password=password) as one,
        connected(server.url, username=user, password=password) as two,
    ):
        makers: list[tuple[str, Callable[[redis.Redis, str], Any]]] = [
            ("lock", lambda c, n: AsyncLock(c, n, ttl=0.6)),
            ("fenced", lambda c, n: AsyncLock(c, n, ttl=0.6, fencing=True)),
            ("fair", lambda c, n: AsyncLock(c, n, ttl=0.6, fair=True)),
            ("semaphore", lambda c, n: Semaphore(c, n, 1, ttl=0.6)),
            ("writer", lambda c, n: ReadWriteLock(c, n, ttl=0.6).writer),
            ("reader", lambda c, n: ReadWriteLock(c, n, ttl=0.6).reader),
        ]
        for kind, make in makers:
            lock_name = f"{name}:{kind}"
            lock = make(one, lock_name)
            assert await lock.acquire(), kind
            assert await lock.owned(), kind
            assert await lock.locked(), kind
            assert await lock.extend() is True, kind
            await asyncio.sleep(0.3)  # a renewal
            if kind != "reader":
                waiter = make(two, lock_name)
                waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
                await asyncio.sleep(0.2)
                released = time.monotonic()
                await lock.release()
                assert await waiting, kind
                assert time.monotonic() - released < 0.5, f"{kind}: the waiter was not woken"
                await waiter.release()
            else:
                await lock.release()
            assert not lock.lost, kind
        # Waiters of one client: all but the first are kept together by its keeper.
        lock_name = f"{name}:kept"
        holder = AsyncLock(one, lock_name, ttl=2.0, fair=True)
        assert await holder.acquire()
        looked = await calls(admin, "mget")

        async def wait_then_hold() -> None:
            async with AsyncLock(two, lock_name, ttl=2.0, fair=True):
                await asyncio.sleep(0.01)

        kept = [asyncio.create_task(wait_then_hold()) for _ in range(3)]
        await asyncio.sleep(1.8)  # a KEEP for them
        assert await calls(admin, "mget") > looked, "the keeper's script did not run"
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*kept), 5.0)
        # (Its listener lingers a moment: gone before the user is, whose connections go.)
        assert await listeners_gone()
        keys = [k for k in await admin.keys(f"*{name}*") if not str(k).endswith(":fence")]
        assert keys == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_the_recipes_user_renews_many_holdings_in_batches(
    server: RedisServer, admin: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As the recipe's user, holdings of each kind renewed together (a queue among them) last.

    Five of each kind held through three renewal periods: one batch call per
    kind and period (MGET and EXISTS for the locks), none lost, no WARNING
    (no refused renewal).
    """
    caplog.set_level(logging.WARNING, logger="aiolock")
    async with (
        recipe_user([admin]) as (user, password),
        connected(server.url, username=user, password=password) as one,
        connected(server.url, username=user, password=password) as two,
    ):
        locks: list[Any] = []
        for i in range(5):
            locks.append(AsyncLock(one, f"{name}:lock:{i}", ttl=0.6))
            locks.append(Semaphore(one, f"{name}:semaphore:{i}", 2, ttl=0.6))
            locks.append(ReadWriteLock(one, f"{name}:rw:{i}", ttl=0.6).reader)
        assert all(await asyncio.gather(*(lock.acquire() for lock in locks)))
        # A waiter queued behind the first lock: its queue is kept by the batch.
        waiter = AsyncLock(two, f"{name}:lock:0", ttl=0.6, fair=True)
        waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
        await admin.config_resetstat()
        await asyncio.sleep(0.7)  # three renewal periods of 0.2 s
        assert await calls(admin, "mget") >= 2
        assert await calls(admin, "exists") >= 2
        assert not any(lock.lost for lock in locks)
        assert not waiting.done()
        await asyncio.gather(*(lock.release() for lock in locks))
        assert await waiting
        await waiter.release()
        assert await listeners_gone()
        keys = [k for k in await admin.keys(f"*{name}*") if not str(k).endswith(":fence")]
        assert keys == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_user_without_a_command_is_told_where_the_rights_are(
    server: RedisServer, admin: redis.Redis, name: str
) -> None:
    """The recipe without TIME: a Semaphore raises redis-py's error, with a note saying where.

    The command is refused inside a script: redis-py's ``ResponseError`` ("ACL
    failure in script"; a command refused outright is its ``NoPermissionError``).
    """
    async with recipe_user([admin]) as (user, password):
        await admin.acl_setuser(user, enabled=True, commands=["-time"])
        async with connected(server.url, username=user, password=password) as c:
            with pytest.raises(redis.ResponseError, match=r"no permissions.*'time'") as refused:
                await Semaphore(c, name, 2).acquire()
            notes = getattr(refused.value, "__notes__", [])
            assert any("docs/production.md" in note for note in notes), notes
        assert await admin.keys(f"*{name}*") == []


async def test_the_recipes_user_runs_a_redlock(name: str) -> None:
    """The recipe's user on three servers: a Redlock acquires, renews, waits and releases."""
    with started_servers(3) as servers:
        admins = [redis.Redis.from_url(s.url, decode_responses=True) for s in servers]
        try:
            async with recipe_user(admins) as (user, password):
                ones = [
                    redis.Redis.from_url(s.url, username=user, password=password) for s in servers
                ]
                twos = [
                    redis.Redis.from_url(s.url, username=user, password=password) for s in servers
                ]
                try:
                    lock = Redlock(ones, name, ttl=0.6, node_timeout=0.1)
                    assert await lock.acquire()
                    assert await lock.extend() is True
                    await asyncio.sleep(0.3)  # a renewal
                    assert await lock.owned()
                    other = Redlock(twos, name, ttl=0.6, node_timeout=0.1)
                    assert not await other.acquire(blocking=False)
                    await lock.release()
                    assert await other.acquire(timeout=2.0)
                    await other.release()
                    assert not lock.lost
                finally:
                    for c in (*ones, *twos):
                        await c.aclose()
            for admin in admins:
                assert await admin.keys(f"*{name}*") == []
        finally:
            for admin in admins:
                await admin.aclose()
