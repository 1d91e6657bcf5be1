"""A resource that rejects stale lock holders: fenced writes on Redis.

A lock alone cannot stop a holder that was paused past its lease (a long GC,
a blocked event loop, SIGSTOP) from writing after the next holder did. A
fencing token can: with ``fencing=True`` each acquisition gets ``lock.fence``,
a number that strictly increases per lock name, and the resource accepts a
write only with a fence at least as high as any it has seen.

Here the resource is a Redis hash (on any server, not necessarily the lock
server), and the check and the write are one Lua script, so no stale write
can slip in between them::

    store = FencedStore(resource_client)
    async with AsyncLock(lock_client, "report:42", fencing=True) as lock:
        data = await build_report()
        if not await store.write("report:42", data, fence=lock.fence):
            ...  # a newer holder has written meanwhile: our lock was lost

Run it (``python examples/fenced_write.py``) to see a paused holder's late
write rejected, on an embedded server.
"""

from __future__ import annotations

import asyncio
from typing import Final

import redis.asyncio as redis

from aiolock import AsyncLock, LockLostError

# KEYS[1]  the resource (a hash: value, fence)
# ARGV[1]  the writer's fence
# ARGV[2]  the value
# Writes and returns 1 if the fence is at least the highest seen (a holder may
# write several times); returns 0, writing nothing, for a stale fence.
FENCED_WRITE: Final = """
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '-1')
local fence = tonumber(ARGV[1])
if fence < seen then
    return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
"""


class FencedStore:
    """Values that only the current (highest-fenced) lock holder may overwrite.

    Args:
        client: the resource's server (``redis.asyncio.Redis``).
    """

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._write = client.register_script(FENCED_WRITE)

    async def write(self, key: str, value: str, *, fence: int | None) -> bool:
        """Store ``value`` under ``key`` if ``fence`` is not older than the last writer's.

        Returns:
            True if written; False if a holder with a higher fence wrote first.

        Raises:
            ValueError: ``fence`` is None (the lock was not made with
                ``fencing=True``, or is not held).
        """
        if fence is None:
            raise ValueError("fence is None: make the lock with fencing=True and hold it")
        return bool(await self._write(keys=[key], args=[fence, value]))

    async def read(self, key: str) -> str | None:
        """The value last written under ``key``, or None."""
        value = await self._client.hget(key, "value")
        return value.decode() if isinstance(value, bytes) else value


async def demo(url: str) -> None:
    """A holder pauses past its lease; the next holder writes; the late write is rejected."""
    client = redis.Redis.from_url(url)
    store = FencedStore(client)
    slow = AsyncLock(client, "report:42", ttl=0.2, fencing=True, auto_renew=False)
    fast = AsyncLock(client, "report:42", ttl=5.0, fencing=True)
    try:
        await slow.acquire()
        stale_fence = slow.fence
        await asyncio.sleep(0.3)  # "paused" past its 0.2 s lease: the key expires
        async with fast:
            assert await store.write("report:42", "from the new holder", fence=fast.fence)
        accepted = await store.write("report:42", "from the stale holder", fence=stale_fence)
        print(f"stale write accepted: {accepted}; value: {await store.read('report:42')!r}")
        try:
            await slow.release()
        except LockLostError as exc:
            print(f"the stale holder is told when it releases: {exc}")
        await client.delete("report:42", f"{fast.key}:fence")
    finally:
        await client.aclose()


if __name__ == "__main__":
    from aiolock.testing import RedisServer

    with RedisServer() as server:
        asyncio.run(demo(server.url))
