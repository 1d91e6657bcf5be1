"""The fencing example (``examples/fenced_write.py``): a resource that rejects stale holders.

Fencing tokens are worth their cost only to a resource that rejects stale
fences: this is the documented example of one. These tests run it against a
real server.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as redis
from support.checkout import load_example

from aiolock import AsyncLock, LockLostError
from aiolock._keys import Keys
from aiolock.testing import RedisServer

example = load_example("fenced_write.py")


async def test_the_demo_rejects_the_paused_holders_late_write(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo: a holder paused past its lease writes after the next holder; it is refused."""
    await example.demo(server.url)
    out = capsys.readouterr().out
    assert "stale write accepted: False; value: 'from the new holder'" in out
    assert "the stale holder is told when it releases" in out


async def test_only_the_newest_fence_writes(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Fences from successive holders: older ones are refused, the current one may write again."""
    store = example.FencedStore(client)
    fences = []
    for _ in range(3):
        async with AsyncLock(client, name, fencing=True) as lock:
            assert lock.fence is not None
            fences.append(lock.fence)
    first, second, third = fences
    assert first < second < third
    key = Keys(name, "resource:").lock
    try:
        assert await store.write(key, "second", fence=second)
        assert not await store.write(key, "first", fence=first)
        assert await store.write(key, "second again", fence=second)
        assert await store.write(key, "third", fence=third)
        assert not await store.write(key, "second late", fence=second)
        assert await store.read(key) == "third"
        with pytest.raises(ValueError, match="fence is None"):
            await store.write(key, "unfenced", fence=None)
    finally:
        await admin.delete(key, Keys(name).fence)


async def test_concurrent_holders_never_let_a_stale_write_through(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """Holders on two clients with a 0.1 s lease, some paused past it: stale writes are refused.

    Each holder writes its fence as the value. Every refused write had a
    lower fence than one already written, and the final value is the highest
    fence written: the value never went back.
    """
    store = example.FencedStore(client)
    key = Keys(name, "resource:").lock
    outcomes: list[tuple[int, bool]] = []

    async def holder(c: redis.Redis, pause: float) -> None:
        lock = AsyncLock(c, name, ttl=0.1, fencing=True, auto_renew=False, timeout=5.0)
        await lock.acquire()
        fence = lock.fence
        assert fence is not None
        await asyncio.sleep(pause)  # past the 0.1 s lease for some
        outcomes.append((fence, await store.write(key, str(fence), fence=fence)))
        with contextlib.suppress(LockLostError):  # a holder paused past its lease lost it
            await lock.release()

    try:
        pauses = [0.15 if i % 3 == 0 else 0.0 for i in range(12)]
        await asyncio.gather(
            *(holder(client if i % 2 else other_client, p) for i, p in enumerate(pauses))
        )
        written = [fence for fence, ok in outcomes if ok]
        refused = [fence for fence, ok in outcomes if not ok]
        assert refused, "no holder was paused past its lease and then overtaken"
        assert all(fence < max(written) for fence in refused)
        assert await store.read(key) == str(max(written))
    finally:
        await admin.delete(key, Keys(name).fence)
