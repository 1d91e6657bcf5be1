"""Worker process for test_election.py: a candidate of an election, in a process of its own.

Usage:

``python _test_election_worker.py turns URL NAME ROUNDS IDENTITY``
    Prints ``ready``, waits for an item on the list ``test:{NAME}:go``, then
    leads ROUNDS terms one after the other. In each it increments the witness
    ``test:{NAME}:busy`` (a value above 1 is two leaders at once), appends
    ``IDENTITY FENCE`` to ``test:{NAME}:fences``, stays a moment, and
    decrements the witness. Prints one JSON line ``{"overlaps": n, "terms": m}``.
``python _test_election_worker.py hold URL NAME TTL IDENTITY``
    Leads one term and stays in its body: prints ``leading FENCE`` once it
    leads, then ``cancelled`` if the body is cancelled, and ``lost`` when
    ``lead()`` raises ``LockLostError``; exits 0 then.
"""

from __future__ import annotations

import asyncio
import json
import sys

import redis.asyncio as redis

from aiolock import Election, LockLostError


async def turns(url: str, name: str, rounds: int, identity: str) -> None:
    """Lead ``rounds`` terms in turn with the other processes; count overlaps."""
    client = redis.Redis.from_url(url)
    busy = f"test:{{{name}}}:busy"
    fences = f"test:{{{name}}}:fences"
    election = Election(client, name, ttl=5.0, identity=identity)
    overlaps = 0
    try:
        await client.ping()
        print("ready", flush=True)
        if await client.blpop([f"test:{{{name}}}:go"], timeout=20) is None:
            raise SystemExit("no go signal")
        for _ in range(rounds):
            async with election.lead() as term:
                if await client.incr(busy) != 1:
                    overlaps += 1
                await client.rpush(fences, f"{term.identity} {term.fence}")
                await asyncio.sleep(0.005)
                await client.decr(busy)
        print(json.dumps({"overlaps": overlaps, "terms": rounds}), flush=True)
    finally:
        await client.aclose()


async def hold(url: str, name: str, ttl: float, identity: str) -> None:
    """Lead one term and stay in it; say when it is cancelled and lost."""
    client = redis.Redis.from_url(url)
    election = Election(client, name, ttl=ttl, identity=identity)
    try:
        async with election.lead() as term:
            print(f"leading {term.fence}", flush=True)
            try:
                while True:
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                print("cancelled", flush=True)
                raise
    except LockLostError:
        print("lost", flush=True)
    finally:
        await client.aclose()


if __name__ == "__main__":
    mode, url, name, number, identity = sys.argv[1:6]
    if mode == "turns":
        asyncio.run(turns(url, name, int(number), identity))
    else:
        asyncio.run(hold(url, name, float(number), identity))
