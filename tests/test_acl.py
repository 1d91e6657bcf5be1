"""A least-privilege user: locks work, and tell the truth, without pub/sub rights (issue 17).

Every user made on Redis 7+ without ``acl-pubsub-default allchannels`` gets
no channel rights (``resetchannels``). Such a user can take and release
locks, but the server refuses its release announcements and its
subscriptions. A release that deleted the key must still return normally,
waiters must still get the lock (by polling), and the one WARNING must name
the right to grant and the option that turns notifications off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis
from support import calls, connected, eventually, user_without_channels

from aiolock import AsyncLock, LockStatistics, backoff
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
    """The fixture is what the tests claim: PUBLISH by this user is refused (issue 17)."""
    with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
        await restricted.publish("aiolock:{x}:released", "")


async def test_a_release_that_deleted_the_key_returns_normally(
    restricted: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Regression (issue 17): a user without channel rights releases without an error.

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
    """Regression (issue 17): a refused subscription degrades to polling, with one WARNING.

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
    """Regression (issue 17): hand-overs of such a user, yielding included, raise nothing.

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
