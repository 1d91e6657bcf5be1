"""A real FastAPI app whose locks change tasks: middleware, background jobs, helper tasks.

Served in-process by uvicorn against the session's server and driven with
real HTTP requests (aiohttp). In each route the task that acquires is not the
task that uses or releases the lock:

* a Starlette middleware (``@app.middleware("http")``) holds the lock while
  the endpoint runs in a task that ``call_next`` starts: the endpoint's
  ``owned()`` is True and its ``extend()`` extends the middleware's lease;
* an endpoint acquires and hands the lock to a job that outlives the request
  (``asyncio.create_task``) or runs after the reply (FastAPI's
  ``BackgroundTasks``): the job works three leases, then releases;
* an endpoint acquires with ``asyncio.wait_for`` (a task of its own on
  CPython 3.11), then works three leases.

Another "process" tries the lock all along. The holdings of the app and of
that intruder never overlap, and every release of the app succeeds. Before
detached holdings, the lease ran out under the job (or the endpoint) and the
intruder got the lock mid-work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import redis.asyncio as redis
from fastapi import BackgroundTasks, FastAPI, Request
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.checkout import serve_with_uvicorn
from support.servers import connected

from aiolock import AsyncLock
from aiolock.testing import RedisServer

#: The lease, and the work of a request or job: three leases.
TTL = 0.5
WORK = 3 * TTL


@dataclass
class Holdings:
    """When each side held the lock ((from, to), monotonic), and what the app's calls raised."""

    app: list[tuple[float, float]] = field(default_factory=list)
    intruder: list[tuple[float, float]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    jobs: list[asyncio.Task[None]] = field(default_factory=list)

    def overlaps(self) -> list[tuple[tuple[float, float], tuple[float, float]]]:
        """Every pair of an app holding and an intruder holding that overlap in time."""
        return [
            (mine, theirs)
            for mine in self.app
            for theirs in self.intruder
            if theirs[0] < mine[1] and mine[0] < theirs[1]
        ]


def make_app(client: redis.Redis, name: str, seen: Holdings) -> FastAPI:
    """The app: each route acquires ``name`` in one task and uses it in another."""
    app = FastAPI()

    @app.middleware("http")
    async def lock_the_request(
        request: Request, call_next: Callable[[Request], Awaitable[Any]]
    ) -> Any:
        if request.url.path != "/middleware":
            return await call_next(request)
        lock = AsyncLock(client, name, ttl=TTL)
        async with lock:
            since = time.monotonic()
            request.state.lock = lock
            response = await call_next(request)
            seen.app.append((since, time.monotonic()))
        return response

    @app.get("/middleware")
    async def inside(request: Request) -> dict[str, Any]:
        lock: AsyncLock = request.state.lock
        await asyncio.sleep(WORK)
        return {"owned": await lock.owned(), "extended": await lock.extend(), "lost": lock.lost}

    async def job(lock: AsyncLock, since: float) -> None:
        await asyncio.sleep(WORK)
        try:
            assert await lock.owned()
            seen.app.append((since, time.monotonic()))
            await lock.release()
        except BaseException as exc:
            seen.errors.append(exc)
            raise

    @app.get("/background")
    async def background(tasks: BackgroundTasks) -> dict[str, bool]:
        lock = AsyncLock(client, name, ttl=TTL)
        acquired = await lock.acquire()
        tasks.add_task(job, lock, time.monotonic())
        return {"acquired": acquired}

    @app.get("/spawn")
    async def spawn() -> dict[str, bool]:
        lock = AsyncLock(client, name, ttl=TTL)
        acquired = await lock.acquire()
        seen.jobs.append(asyncio.create_task(job(lock, time.monotonic())))
        return {"acquired": acquired}

    @app.get("/wait_for")
    async def wait_for() -> dict[str, Any]:
        lock = AsyncLock(client, name, ttl=TTL)
        acquired = await asyncio.wait_for(lock.acquire(), 5)
        since = time.monotonic()
        await asyncio.sleep(WORK)
        owned = await lock.owned()
        seen.app.append((since, time.monotonic()))
        await lock.release()
        return {"acquired": acquired, "owned": owned}

    return app


async def intrude(client: redis.Redis, name: str, seen: Holdings, stop: asyncio.Event) -> None:
    """Another "process": take the lock whenever it can, hold it a moment, until ``stop``."""
    lock = AsyncLock(client, name, ttl=TTL)
    while not stop.is_set():
        try:
            got = await lock.acquire(timeout=0.05)
        except RedisTimeoutError:
            # No verdict in time (a loaded machine): a true answer, and nothing was left
            # on the server. Try again, as a real intruder would.
            got = False
        if got:
            since = time.monotonic()
            await asyncio.sleep(0.005)
            seen.intruder.append((since, time.monotonic()))
            await lock.release()
        await asyncio.sleep(0.005)


#: What each route answers.
ANSWERS = {
    "middleware": {"owned": True, "extended": True, "lost": False},
    "background": {"acquired": True},
    "spawn": {"acquired": True},
    "wait_for": {"acquired": True, "owned": True},
}


@pytest.mark.parametrize("route", list(ANSWERS))
async def test_a_lock_that_changes_tasks_is_held_until_it_is_released(
    server: RedisServer, other_client: redis.Redis, admin: redis.Redis, name: str, route: str
) -> None:
    """The app holds the lock for all of its work; the intruder never holds it meanwhile."""
    seen = Holdings()
    async with connected(server.url) as client:
        app = make_app(client, name, seen)
        stop = asyncio.Event()
        async with serve_with_uvicorn(app) as url, aiohttp.ClientSession() as http:
            trying = asyncio.create_task(intrude(other_client, name, seen, stop))
            await asyncio.sleep(0.1)  # the intruder holds now and then before the request
            async with http.get(f"{url}/{route}") as response:
                assert response.status == 200, await response.text()
                assert await response.json() == ANSWERS[route]
            for job in seen.jobs:
                await asyncio.wait_for(job, WORK + 5)

            async def app_done() -> bool:
                return len(seen.app) == 1

            deadline = time.monotonic() + WORK + 5
            while not await app_done() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(2 * TTL)  # the intruder's turn again
            stop.set()
            await trying
    assert seen.errors == []
    assert len(seen.app) == 1, seen.app
    since, until = seen.app[0]
    assert until - since >= WORK - 0.05
    assert seen.overlaps() == [], "the intruder held the lock during the app's holding"
    assert any(theirs[0] >= until for theirs in seen.intruder), "never released"
    assert await admin.exists(f"aiolock:{{{name}}}") == 0
