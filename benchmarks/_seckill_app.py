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
* ``SECKILL_STRATEGY``: a key of :data:`STRATEGIES` (default ``default``);
* ``SECKILL_LOCK_TIMEOUT``: seconds a request may wait for the lock (default 10);
* ``SECKILL_STOCK_KEY`` / ``SECKILL_SOLD_KEY``: the two counters;
* ``SECKILL_CLIENTS``: clients per worker (default 1). Each client has its own
  local queue, so with more than one, several coroutines of one worker contend
  on the server at once, as the article's threads each did (requests take the
  clients in turn).

``uvicorn benchmarks._seckill_app:create_app --factory --workers 2``

Each worker process makes one ``redis.asyncio`` client in the lifespan (closed on
shutdown) with :class:`~benchmarks._common.CountingConnection`, and one lock
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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as redis
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from aiolock import AsyncLock, backoff
from benchmarks._common import CountingConnection

__all__ = ["ARTICLE_ROWS", "DEFAULT_ROWS", "LOCK_NAME", "STRATEGIES", "Strategy", "create_app"]

#: The lock every request takes.
LOCK_NAME = "seckill"


@dataclass(frozen=True)
class Strategy:
    """How the endpoint's lock waits: a row of the benchmark.

    Attributes:
        label: the row's name in tables and charts.
        description: what the strategy does, in the article's words.
        options: keyword arguments for :class:`~aiolock.AsyncLock`.
    """

    label: str
    description: str
    options: Callable[[], dict[str, Any]]


#: The article's five retry strategies (pure polling: ``notify=False``), then
#: aiolock's defaults (release notifications and exponential backoff).
STRATEGIES: dict[str, Strategy] = {
    "no1": Strategy(
        "No1 spin then yield",
        "retry at once (the article yields only after 600 ms): backoff.spin()",
        lambda: {"backoff": backoff.spin(), "notify": False},
    ),
    "no2": Strategy(
        "No2 yield then sleep",
        "yield for 600 ms, then sleep 200 ms: backoff.yield_then_sleep(0.6, 0.2)",
        lambda: {"backoff": backoff.yield_then_sleep(0.6, 0.2), "notify": False},
    ),
    "no3": Strategy(
        "No3 sleep 200 ms",
        "sleep 200 ms between attempts: backoff.constant(0.2)",
        lambda: {"backoff": backoff.constant(0.2), "notify": False},
    ),
    "no4": Strategy(
        "No4 sleep 2 s",
        "sleep 2 s between attempts: backoff.constant(2.0)",
        lambda: {"backoff": backoff.constant(2.0), "notify": False},
    ),
    "no5": Strategy(
        "No5 yield only",
        "only yield between attempts: backoff.spin()",
        lambda: {"backoff": backoff.spin(), "notify": False},
    ),
    "default": Strategy(
        "aiolock default",
        "AsyncLock defaults: release notifications, exponential backoff",
        dict,
    ),
    "polling": Strategy(
        "default, no notify",
        "a control row (not run by default): exponential backoff, notify=False",
        lambda: {"notify": False},
    ),
}

#: The article's five strategies.
ARTICLE_ROWS: tuple[str, ...] = ("no1", "no2", "no3", "no4", "no5")
#: The rows run unless asked otherwise: the article's five, then the default.
DEFAULT_ROWS: tuple[str, ...] = (*ARTICLE_ROWS, "default")


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
        KeyError: ``SECKILL_STRATEGY`` names no strategy.
    """
    url = _env("SECKILL_REDIS_URL")
    strategy = STRATEGIES[_env("SECKILL_STRATEGY", "default")]
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
        locks = [
            AsyncLock(client, LOCK_NAME, timeout=lock_timeout, **strategy.options())
            for client in made
        ]
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
