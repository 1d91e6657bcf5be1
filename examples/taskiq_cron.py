"""A taskiq cron job that skips a run while the last one still runs, scheduled by one leader.

Two processes, each started on as many hosts as you like:

- workers, ``taskiq worker taskiq_cron:broker`` (from ``examples/``): each
  run of ``export_orders`` first tries, once, to take the lock
  ``export-orders``; while the previous run (on any worker) still holds it,
  this run is skipped, and counted in ``export-orders:skipped``.
- schedulers, ``python examples/taskiq_cron.py``: each campaigns in the
  election ``export-orders-scheduler``, and only the leader runs taskiq's
  scheduler loop, so the job is sent once per period, not once per host.

``REDIS_URL`` names the server of the broker and the locks;
``EXPORT_EVERY`` the period in seconds (300). ``tests/project/test_recipes.py``
runs two workers and two schedulers against a real server.
"""

from __future__ import annotations

import asyncio
import logging
import os

import redis.asyncio as redis
from taskiq import TaskiqScheduler
from taskiq.cli.scheduler.run import SchedulerLoop
from taskiq.schedule_sources import LabelScheduleSource
from taskiq_redis import ListQueueBroker

from aiolock import AsyncLock, Election, Term

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
broker = ListQueueBroker(REDIS_URL, socket_timeout=None)  # BRPOP waits: no read timeout
scheduler = TaskiqScheduler(broker, [LabelScheduleSource(broker)])
lock_client = redis.Redis.from_url(REDIS_URL)  # one client per process


async def export() -> None:
    """Stands for the job: logs its start and end on the server, and takes a while."""
    await lock_client.rpush("export-orders:log", f"start {os.getpid()}")
    await asyncio.sleep(float(os.environ.get("EXPORT_SECONDS", "1")))
    await lock_client.rpush("export-orders:log", f"end {os.getpid()}")


@broker.task(
    task_name="export_orders",  # the same name in the workers and in the scheduler's __main__
    schedule=[{"interval": int(os.environ.get("EXPORT_EVERY", "300"))}],
)
async def export_orders() -> bool:
    """Export the orders, unless the previous run still runs: then skip this one."""
    lock = AsyncLock(lock_client, "export-orders", ttl=30.0)
    if not await lock.acquire(blocking=False):  # tries once
        await lock_client.incr("export-orders:skipped")
        return False
    try:
        await export()
    finally:
        await lock.release()
    return True


async def schedule_while_leading(term: Term) -> None:
    """Send the scheduled jobs for as long as this process leads."""
    for source in scheduler.sources:
        await source.startup()
    await scheduler.startup()
    try:
        await SchedulerLoop(scheduler).run()
    finally:
        await scheduler.shutdown()
        for source in scheduler.sources:
            await source.shutdown()


async def main() -> None:
    broker.is_scheduler_process = True
    try:
        await Election(lock_client, "export-orders-scheduler", ttl=10.0).run(schedule_while_leading)
    finally:
        await lock_client.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
