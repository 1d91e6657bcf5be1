"""Worker process for test_lock.py: many coroutines contend for one lock through one client.

Usage: ``python _test_lock_worker.py URL NAME COROUTINES ROUNDS [fencing]``. Prints
``ready`` once connected, waits for an item on the ``go`` list (so every process starts
together), then prints one JSON line ``{"overlaps": n, "holdings": m}``. With ``fencing``
the locks are made with ``fencing=True`` and each holder appends its fence to the list
``test:{NAME}:fences`` inside the critical section (the list is the order of holdings).
"""

from __future__ import annotations

import asyncio
import json
import sys

import redis.asyncio as redis

from aiolock import AsyncLock


async def main(url: str, name: str, coroutines: int, rounds: int, fencing: bool) -> None:
    """Run ``coroutines`` coroutines, each taking the lock ``rounds`` times."""
    client = redis.Redis.from_url(url)
    busy = f"test:{{{name}}}:busy"
    total = f"test:{{{name}}}:total"
    go = f"test:{{{name}}}:go"
    fences = f"test:{{{name}}}:fences"
    overlaps = 0
    holdings = 0

    async def worker() -> None:
        nonlocal overlaps, holdings
        lock = AsyncLock(client, name, ttl=5.0, timeout=20.0, fencing=fencing)
        for _ in range(rounds):
            async with lock:
                if await client.incr(busy) != 1:
                    overlaps += 1
                if fencing:
                    await client.rpush(fences, str(lock.fence))
                await asyncio.sleep(0.001)
                await client.decr(busy)
                await client.incr(total)
                holdings += 1

    try:
        await client.ping()
        print("ready", flush=True)
        if await client.blpop([go], timeout=20) is None:
            raise SystemExit("no go signal")
        await asyncio.gather(*(worker() for _ in range(coroutines)))
        print(json.dumps({"overlaps": overlaps, "holdings": holdings}), flush=True)
    finally:
        await client.aclose()


if __name__ == "__main__":
    fencing = sys.argv[5:] == ["fencing"]
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), fencing))
