"""The framework examples, ``examples/fastapi_app.py`` and ``examples/aiohttp_app.py``, served.

The examples show aiolock in FastAPI and aiohttp handlers. Each test runs one
of them against the session's real server: FastAPI under an in-process
``uvicorn.Server`` (lifespan on), aiohttp under ``web.AppRunner`` and
``TCPSite``, both on a free loopback port, and drives it with real
concurrent HTTP requests. After the server stops, every test checks that the
app shut down cleanly: its Redis client's connections are gone, no lock key
is left, and no task it started still runs. The partner route's upstream is
a real HTTP server of the test's own (aiohttp, loopback), which counts the
calls it is serving at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import aiohttp
import pytest
import redis.asyncio as redis
from aiohttp import web
from support.checkout import load_example, serve_with_uvicorn
from support.timing import eventually

from aiolock import AsyncLock, Semaphore
from aiolock._keys import Keys
from aiolock.testing import RedisServer

#: The load: ``BUYERS`` concurrent purchases of each of ``ITEMS`` items with ``STOCK`` units.
ITEMS = 3
STOCK = 10
BUYERS = 30
#: Seconds between a purchase's read and its write (widens the race without the lock).
PAUSE = 0.02
#: The partner route: ``QUOTES`` concurrent requests against a limit of ``PARTNER_LIMIT``.
PARTNER_LIMIT = 4
QUOTES = 20
#: Bounds on starting and stopping a server, and on one batch of requests.
STARTUP = 10.0
SHUTDOWN = 10.0
REQUESTS = 20.0
#: How long the app's connections and tasks may take to go after the server stopped
#: (the release-notification listener lingers a little after its last waiter).
SETTLE = 3.0


fastapi_app = load_example("fastapi_app.py")
aiohttp_app = load_example("aiohttp_app.py")


@contextlib.asynccontextmanager
async def serve_with_aiohttp(app: web.Application) -> AsyncIterator[str]:
    """Serve an aiohttp app with ``AppRunner`` and ``TCPSite``; yield its base URL."""
    runner = web.AppRunner(app, access_log=None)
    async with asyncio.timeout(STARTUP):
        await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        async with asyncio.timeout(STARTUP):
            await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        async with asyncio.timeout(SHUTDOWN):
            await runner.cleanup()


@dataclass(frozen=True)
class Framework:
    """One example app and how to serve it."""

    module: ModuleType
    serve: Callable[[Any], AbstractAsyncContextManager[str]]

    def running(
        self,
        url: str,
        client_name: str,
        *,
        ttl: float = 5.0,
        lock_timeout: float = 10.0,
        pause: float = PAUSE,
        unlocked_demo: bool = False,
        **partner: Any,
    ) -> AbstractAsyncContextManager[str]:
        """Make the app with these settings and serve it; the context yields its base URL.

        ``partner`` takes the ``partner_*`` settings.
        """
        settings = self.module.Settings(ttl=ttl, lock_timeout=lock_timeout, pause=pause, **partner)
        app = self.module.create_app(
            url, client_name=client_name, settings=settings, unlocked_demo=unlocked_demo
        )
        return self.serve(app)


@pytest.fixture(
    params=[
        pytest.param(Framework(fastapi_app, serve_with_uvicorn), id="fastapi"),
        pytest.param(Framework(aiohttp_app, serve_with_aiohttp), id="aiohttp"),
    ]
)
def framework(request: pytest.FixtureRequest) -> Framework:
    """Each test runs on both examples."""
    chosen: Framework = request.param
    return chosen


@pytest.fixture
def client_name() -> str:
    """The name the app's Redis connections give the server, unique to the test."""
    return f"aiolock-web-example-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def items(admin: redis.Redis, name: str) -> AsyncIterator[list[str]]:
    """Item ids no other test uses; their stock keys are deleted after the test."""
    ids = [f"{name}-{i}" for i in range(ITEMS)]
    yield ids
    await admin.delete(*(f"stock:{item}" for item in ids))


def session(base: str) -> aiohttp.ClientSession:
    """An HTTP client for the app at ``base``, with no limit on concurrent connections."""
    return aiohttp.ClientSession(
        base_url=base,
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=REQUESTS),
    )


async def restock(http: aiohttp.ClientSession, item: str, quantity: int) -> None:
    """Add ``quantity`` units of ``item`` through the app."""
    async with http.post(f"/items/{item}/restock", params={"quantity": quantity}) as resp:
        assert resp.status == 200, await resp.text()


async def buy_concurrently(
    http: aiohttp.ClientSession, items: list[str], route: str
) -> dict[str, list[tuple[int, Any]]]:
    """``BUYERS`` concurrent purchases per item, interleaved; (status, body) per item."""

    async def buy(item: str) -> tuple[str, int, Any]:
        async with http.post(f"/items/{item}/{route}") as resp:
            return item, resp.status, await resp.json()

    async with asyncio.timeout(REQUESTS):
        done = await asyncio.gather(*(buy(item) for _ in range(BUYERS) for item in items))
    outcomes: dict[str, list[tuple[int, Any]]] = {item: [] for item in items}
    for item, status, body in done:
        outcomes[item].append((status, body))
    return outcomes


def app_tasks(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """Tasks started since ``before`` (by the server, the app or aiolock) that still run."""
    me = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t not in before and t is not me and not t.done()}


async def assert_shut_down_cleanly(
    admin: redis.Redis, client_name: str, name: str, before: set[asyncio.Task[Any]]
) -> None:
    """The stopped app left no connection named ``client_name``, no lock key, no task."""
    deadline = time.monotonic() + SETTLE
    while True:
        connections = [c for c in await admin.client_list() if c.get("name") == client_name]
        tasks = app_tasks(before)
        if (not connections and not tasks) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    assert connections == [], f"the app's Redis client was not closed: {connections}"
    assert tasks == set(), f"tasks outlived the app: {sorted(t.get_name() for t in tasks)}"
    assert await admin.keys(f"aiolock:*{name}*") == [], "a lock key was left on the server"


@dataclass
class Shop:
    """The example app of one framework, ready to serve against the session server."""

    framework: Framework
    url: str
    client_name: str

    def running(self, **settings: Any) -> AbstractAsyncContextManager[str]:
        """Serve the app with ``settings``; the context yields its base URL."""
        return self.framework.running(self.url, self.client_name, **settings)


@pytest.fixture
async def shop(
    framework: Framework, server: RedisServer, admin: redis.Redis, name: str, client_name: str
) -> AsyncIterator[Shop]:
    """The app to serve; after the test it must have shut down cleanly."""
    before = asyncio.all_tasks()
    yield Shop(framework, server.url, client_name)
    await assert_shut_down_cleanly(admin, client_name, name, before)


async def test_concurrent_buys_never_oversell(
    shop: Shop, admin: redis.Redis, items: list[str]
) -> None:
    """30 concurrent buys per item on stock 10: exactly 10 sell, each unit once, stock ends at 0."""
    async with shop.running() as base, session(base) as http:
        for item in items:
            await restock(http, item, STOCK)
        outcomes = await buy_concurrently(http, items, "buy")
        for item in items:
            sold = sorted(body["remaining"] for status, body in outcomes[item] if status == 200)
            assert sold == list(range(STOCK)), f"{item}: units sold {sold}"
            refused = [(status, body["detail"]) for status, body in outcomes[item] if status != 200]
            assert refused == [(409, f"item {item!r} is sold out")] * (BUYERS - STOCK)
            async with http.get(f"/items/{item}") as resp:
                assert await resp.json() == {"item": item, "stock": 0}
            assert await admin.get(f"stock:{item}") == "0"


async def test_without_the_lock_the_same_load_oversells(shop: Shop, items: list[str]) -> None:
    """The demonstration route (the purchase without the lock) sells more than the stock.

    This is what makes the test above able to fail: the same read-modify-write
    under the same load, minus the lock, sells some units several times.
    """
    async with (
        shop.running(unlocked_demo=True) as base,
        session(base) as http,
    ):
        for item in items:
            await restock(http, item, STOCK)
        outcomes = await buy_concurrently(http, items, "buy-unlocked")
    for item in items:
        sold = [body["remaining"] for status, body in outcomes[item] if status == 200]
        assert len(sold) > STOCK, f"{item}: only {len(sold)} sold without the lock"
        assert max(Counter(sold).values()) > 1, f"{item}: no unit was sold twice"
        assert all(remaining >= 0 for remaining in sold)


async def test_a_busy_item_answers_503_with_retry_after(
    shop: Shop, client: redis.Redis, admin: redis.Redis, items: list[str]
) -> None:
    """Held elsewhere past the app's lock timeout: buy and restock answer 503 + Retry-After."""
    item = items[0]
    async with (
        shop.running(lock_timeout=0.2) as base,
        session(base) as http,
    ):
        await restock(http, item, 1)
        async with AsyncLock(client, f"item:{item}", ttl=10.0, timeout=1.0):
            for route in ("buy", "restock"):
                started = time.monotonic()
                async with http.post(f"/items/{item}/{route}") as resp:
                    assert resp.status == 503, await resp.text()
                    assert resp.headers["Retry-After"] == "1"
                    detail = (await resp.json())["detail"]
                assert detail.startswith("the item is busy, try again later"), detail
                assert time.monotonic() - started >= 0.15, "answered before the lock timeout"
            assert await admin.get(f"stock:{item}") == "1"
        async with http.post(f"/items/{item}/buy") as resp:  # free again: it sells
            assert resp.status == 200, await resp.text()
            assert await resp.json() == {"item": item, "remaining": 0}


async def test_a_lock_lost_during_a_purchase_answers_503(
    shop: Shop, admin: redis.Redis, items: list[str]
) -> None:
    """The lock key vanishes mid-purchase: renewal finds it gone; 503, and nothing is sold."""
    item = items[0]
    lock_key = Keys(f"item:{item}").lock
    async with (
        shop.running(ttl=0.3, pause=0.6) as base,
        session(base) as http,
    ):
        await restock(http, item, 1)

        async def buy() -> tuple[int, Any]:
            async with http.post(f"/items/{item}/buy") as resp:
                return resp.status, await resp.json()

        purchase = asyncio.create_task(buy())
        deadline = time.monotonic() + STARTUP
        while not await admin.exists(lock_key):  # the handler holds the lock, then pauses
            assert not purchase.done(), await purchase
            assert time.monotonic() < deadline, "the purchase never took the lock"
            await asyncio.sleep(0.005)
        await admin.delete(lock_key)  # within its 0.6 s pause; renewal runs every 0.1 s
        async with asyncio.timeout(REQUESTS):
            status, body = await purchase
    assert status == 503, body
    # FastAPI's handler checks lock.lost before its write; the aiohttp one is cancelled
    # at the loss (guard with cancel_on_lost=True). Either way the stale read is not written.
    assert body["detail"].startswith(
        ("outcome unknown: the lock was lost", f"the lock of item {item!r} was lost")
    ), body
    assert await admin.get(f"stock:{item}") == "1"


async def test_stopping_the_app_closes_its_connections_and_tasks(
    shop: Shop, client: redis.Redis, admin: redis.Redis, items: list[str], client_name: str
) -> None:
    """A purchase waited (pool and release-listener connections open); after stop none is left."""
    item = items[0]

    async def named_connections() -> int:
        return sum(c.get("name") == client_name for c in await admin.client_list())

    async with shop.running() as base, session(base) as http:
        await restock(http, item, 1)
        async with AsyncLock(client, f"item:{item}", ttl=10.0, timeout=1.0):
            pending = asyncio.create_task(http.post(f"/items/{item}/buy"))
            deadline = time.monotonic() + STARTUP
            while await named_connections() < 2:  # its pool's, and the listener's
                assert not pending.done(), "the purchase ended while the lock was held"
                assert time.monotonic() < deadline, "no release listener connected"
                await asyncio.sleep(0.01)
        async with asyncio.timeout(REQUESTS):
            resp = await pending
        async with resp:
            assert resp.status == 200, await resp.text()


@dataclass
class Partner:
    """The partner's API as the test serves it: each call waits for ``gate``, then ``PAUSE``.

    It counts the calls it is serving at once (``inside``), the most it
    served at once (``most``) and all it served (``served``); ``full`` is
    set once ``PARTNER_LIMIT`` calls are inside.
    """

    gate: asyncio.Event
    full: asyncio.Event
    inside: int = 0
    most: int = 0
    served: int = 0

    async def quote(self, request: web.Request) -> web.Response:
        """``GET /quotes/{item_id}``: a price, once the gate is open."""
        self.inside += 1
        self.most = max(self.most, self.inside)
        if self.inside == PARTNER_LIMIT:
            self.full.set()
        try:
            await self.gate.wait()
            await asyncio.sleep(PAUSE)
        finally:
            self.inside -= 1
        self.served += 1
        return web.json_response({"item": request.match_info["item_id"], "price": 7})

    def app(self) -> web.Application:
        """The partner's web app."""
        app = web.Application()
        app.router.add_get("/quotes/{item_id}", self.quote)
        return app


async def test_partner_calls_reach_the_limit_and_never_exceed_it(
    shop: Shop, admin: redis.Redis, name: str
) -> None:
    """20 concurrent quotes, limit 4: the partner serves 4 at once, never 5; 16 wait their turn.

    The partner holds every call until 4 are inside and the other 16
    requests stand in the semaphore's queue on the server (all 20 are then
    accounted for: none is on its way to the partner). Then it answers,
    each call taking ``PAUSE``; every request gets its quote.
    """
    partner = Partner(gate=asyncio.Event(), full=asyncio.Event())
    semaphore = f"{name}:partner"
    queue = Keys(semaphore, kind="semaphore").queue

    async def quote(http: aiohttp.ClientSession, index: int) -> tuple[int, Any]:
        async with http.get(f"/partner/item-{index}") as resp:
            return resp.status, await resp.json()

    async def all_the_others_wait() -> bool:
        assert partner.most <= PARTNER_LIMIT, f"{partner.most} calls at once"
        return bool(await admin.llen(queue) == QUOTES - PARTNER_LIMIT)

    async with (
        serve_with_aiohttp(partner.app()) as partner_url,
        shop.running(
            partner_url=partner_url, partner_limit=PARTNER_LIMIT, partner_name=semaphore
        ) as base,
        session(base) as http,
    ):
        calls = asyncio.gather(*(quote(http, i) for i in range(QUOTES)))
        try:
            async with asyncio.timeout(REQUESTS):
                await partner.full.wait()
            await eventually(
                all_the_others_wait, "the other requests to wait in the semaphore's queue", REQUESTS
            )
            assert partner.inside == PARTNER_LIMIT
        finally:
            partner.gate.set()
            async with asyncio.timeout(REQUESTS):
                done = await calls
    assert done == [(200, {"item": f"item-{i}", "price": 7}) for i in range(QUOTES)]
    assert partner.served == QUOTES
    assert partner.most == PARTNER_LIMIT, f"{partner.most} calls at once, limit {PARTNER_LIMIT}"
    assert await admin.keys(f"*{{{semaphore}}}*") == [], "the semaphore left a key"


async def test_a_partner_at_its_limit_answers_503_with_retry_after(
    shop: Shop, client: redis.Redis, name: str
) -> None:
    """Every permit held elsewhere past the app's timeout: 503 + Retry-After, no partner call."""
    semaphore = f"{name}:partner"
    # The partner's URL is never called: no permit is ever free to the app.
    async with (
        shop.running(lock_timeout=0.2, partner_limit=1, partner_name=semaphore) as base,
        session(base) as http,
        Semaphore(client, semaphore, limit=1, ttl=10.0, timeout=1.0),
    ):
        started = time.monotonic()
        async with http.get("/partner/phone") as resp:
            assert resp.status == 503, await resp.text()
            assert resp.headers["Retry-After"] == "1"
            detail = (await resp.json())["detail"]
        assert detail.startswith("the partner API is busy, try again later"), detail
        assert time.monotonic() - started >= 0.15, "answered before the timeout"
