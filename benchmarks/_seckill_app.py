"""The FastAPI "seckill" endpoint behind ``benchmarks.seckill``.

It follows the endpoint load-tested by the article 「分布式」实现分布式锁的正确姿势,
whose experiment ``benchmarks.seckill`` reproduces.

Every ``POST /buy`` takes one aiolock :class:`~aiolock.AsyncLock` named ``seckill``,
reads the stock counter (``GET``), and when some is left decrements it and counts
the sale (``DECR`` and ``INCR`` in one pipeline), then releases. It answers 200
with ``{"ok": true}`` for a sale, ``{"ok": false}`` when sold out, and 503 when
the lock could not be had within the lock timeout (a failed request, like a
non-2xx answer in ``ab``).

uvicorn starts it in factory mode, so everything comes from the environment:

* ``SECKILL_REDIS_URL``: the server (required);
* ``SECKILL_STRATEGY``: a key of :data:`benchmarks._subjects.SECKILL`, the
  subject whose options the lock takes (default ``default``);
* ``SECKILL_LOCK_TIMEOUT``: seconds a request may wait for the lock (default 10);
* ``SECKILL_STOCK_KEY`` / ``SECKILL_SOLD_KEY``: the two counters;
* ``SECKILL_CLIENTS``: clients per worker (default 1). Each client has its own
  local queue, so with more than one, several coroutines of one worker contend
  on the server at once, as the article's threads each did (requests take the
  clients in turn).

``uvicorn benchmarks._seckill_app:create_app --factory --workers 2``

Each worker process makes one ``redis.asyncio`` client in the lifespan (closed on
shutdown) with :class:`~benchmarks._measure.CountingConnection`, and one lock
object shared by its requests (or ``SECKILL_CLIENTS`` of each). ``GET /stats``
reports that worker's figures: its pid, the commands its clients sent (and how
many of those were the endpoint's own business commands), acquisitions, lock
timeouts, and every holding as an ``(acquired_at, released_at)`` pair of
``time.monotonic()`` readings taken just inside the lock, so the load generator
can check for overlaps across workers (the monotonic clock is system-wide on
Linux). The load generator polls ``/stats`` on fresh connections until it has
seen every worker's pid.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import redis.asyncio as redis
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from aiolock import AsyncLock
from benchmarks._measure import CountingConnection
from benchmarks._subjects import SECKILL

__all__ = ["LOCK_NAME", "create_app"]

#: The lock every request takes.
LOCK_NAME = "seckill"


@dataclass
class _Worker:
    """One worker process's clients, locks and figures."""

    clients: list[redis.Redis]
    locks: list[AsyncLock]
    turn: int = 0
    business: int = 0
    acquisitions: int = 0
    timeouts: int = 0
    intervals: list[tuple[float, float]] = field(default_factory=list)


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise RuntimeError(f"{name} is not set (see benchmarks/_seckill_app.py)")
    return value


def create_app() -> FastAPI:
    """Make the seckill app from the environment (uvicorn's ``--factory`` entry point).

    Returns:
        The FastAPI application.

    Raises:
        RuntimeError: ``SECKILL_REDIS_URL`` is not set.
        KeyError: ``SECKILL_STRATEGY`` names no row of ``SECKILL``.
    """
    url = _env("SECKILL_REDIS_URL")
    subject = SECKILL[_env("SECKILL_STRATEGY", "default")]
    lock_timeout = float(_env("SECKILL_LOCK_TIMEOUT", "10"))
    stock_key = _env("SECKILL_STOCK_KEY", "seckill:stock")
    sold_key = _env("SECKILL_SOLD_KEY", "seckill:sold")
    clients = int(_env("SECKILL_CLIENTS", "1"))
    workers: list[_Worker] = []  # the one worker of this process, once started

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        made = [
            redis.Redis.from_url(url, connection_class=CountingConnection) for _ in range(clients)
        ]
        locks = [subject.make(client, LOCK_NAME, timeout=lock_timeout) for client in made]
        workers.append(_Worker(made, locks))
        try:
            yield
        finally:
            for client in made:
                await client.aclose()

    app = FastAPI(title="aiolock seckill", lifespan=lifespan)

    @app.post("/buy")
    async def buy() -> JSONResponse:
        worker = workers[0]
        turn = worker.turn = (worker.turn + 1) % len(worker.clients)
        client, lock = worker.clients[turn], worker.locks[turn]
        if not await lock.acquire():
            worker.timeouts += 1
            return JSONResponse({"ok": False, "error": "lock timeout"}, status_code=503)
        acquired_at = time.monotonic()
        try:
            worker.acquisitions += 1
            stock = int(await client.get(stock_key) or 0)
            worker.business += 1
            sold = stock > 0
            if sold:
                async with client.pipeline(transaction=False) as pipe:
                    pipe.decr(stock_key)
                    pipe.incr(sold_key)
                    await pipe.execute()
                worker.business += 2
        finally:
            worker.intervals.append((acquired_at, time.monotonic()))
            await lock.release()
        return JSONResponse({"ok": sold})

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        worker = workers[0]
        return {
            "pid": os.getpid(),
            "sent": CountingConnection.sent,
            "business": worker.business,
            "acquisitions": worker.acquisitions,
            "timeouts": worker.timeouts,
            "intervals": worker.intervals,
        }

    return app
