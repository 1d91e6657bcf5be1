"""One active APScheduler across replicas: its jobs fire only on the replica that leads.

Every replica runs this process. Each starts its ``AsyncIOScheduler`` paused
and campaigns in the election ``digest-scheduler``; the replica that leads
resumes its scheduler, and pauses it again the moment its term ends (lost,
resigned, or the process stopping). Run it with
``REDIS_URL=redis://localhost:6379/0 python examples/apscheduler_leader.py``
on two hosts, and the digest is sent from one of them at a time.
``tests/project/test_recipes.py`` runs ``lead_the_schedule`` as written.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as redis
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from aiolock import Election, Term


async def lead_the_schedule(election: Election, scheduler: AsyncIOScheduler) -> None:
    """Fire ``scheduler``'s jobs only while this replica leads ``election``, until cancelled."""
    scheduler.start(paused=True)

    async def while_leading(term: Term) -> None:
        scheduler.resume()
        try:
            await asyncio.Event().wait()  # until the term ends: the body is cancelled
        finally:
            scheduler.pause()

    try:
        await election.run(while_leading)  # campaigns again after every term
    finally:
        scheduler.shutdown(wait=False)


async def send_digest() -> None:
    print("digest sent")  # stands for the periodic job


async def main() -> None:
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    scheduler = AsyncIOScheduler()
    scheduler.add_job(send_digest, "interval", minutes=5)
    try:
        await lead_the_schedule(Election(client, "digest-scheduler", ttl=10.0), scheduler)
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
