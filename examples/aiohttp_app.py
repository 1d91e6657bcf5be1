"""A "seckill" inventory service on aiohttp.web, with one aiolock lock per item.

The same service as ``examples/fastapi_app.py``: a purchase is a
read-modify-write of the item's stock in Redis (``GET``, some work, ``SET``),
which oversells unless concurrent buyers of one item take turns.

What is idiomatic here:

- The ``redis.asyncio`` client is made and closed by a ``cleanup_ctx``
  generator, and kept in the app under a typed ``web.AppKey``.
- The purchase is a plain coroutine function decorated with
  :func:`aiolock.guard`, so every call runs under the item's lock. The
  client is given as a callable (``lambda: app[REDIS]``): it is looked up
  at call time, since it only exists once the app has started::

      @guard(lambda: app[REDIS], "item:{item_id}", ttl=5.0, timeout=2.0)
      async def buy(item_id: str, quantity: int = 1) -> int | None: ...

- The restock handler uses ``async with AsyncLock(...)`` in its body.
- The partner's quote is fetched by a coroutine function guarded with
  ``limit=``: each call runs under one permit of a
  :class:`~aiolock.Semaphore`, so at most ``partner_limit`` calls to the
  partner run at once across every worker process, whatever the item. A
  call that gets no permit in time is a 503 with ``Retry-After``.
- The :func:`lock_errors` middleware maps aiolock's errors to HTTP once, for
  every handler: :class:`~aiolock.AcquireTimeout` (the item stayed busy past
  the lock's ``timeout``) to 503 with ``Retry-After``, and
  :class:`~aiolock.LockLostError` (the lease ran out while the handler ran) to
  503 saying the outcome is unknown. Sold out is 409.

Run it, from a checkout with the ``examples`` extra installed (``pip install
".[examples]"``): a server, the partner's stand-in, the app, then requests
(``tests/project/test_examples.py`` runs these lines as written)::

    aiolock server &
    python examples/partner.py &
    AIOLOCK_URL=redis://127.0.0.1:6379/0 python examples/aiohttp_app.py &
    curl -X POST 'localhost:8080/items/phone/restock?quantity=10'
    curl -X POST 'localhost:8080/items/phone/buy'
    curl 'localhost:8080/partner/phone'

The app talks to the server at ``AIOLOCK_URL`` (default
``redis://127.0.0.1:6379/0``) and listens on ``PORT`` (default 8080). The
partner's API is at ``PARTNER_URL`` (default ``http://127.0.0.1:9000``, where
``examples/partner.py`` serves a stand-in): ``GET /quotes/{item_id}``
answers ``{"item": ..., "price": ...}``, called with an ``aiohttp`` client
session made and closed by a ``cleanup_ctx`` too.

``create_app(url, unlocked_demo=True)`` adds ``POST /items/{item_id}/buy-unlocked``,
the same purchase without the lock. It exists to show (and to test) that
the lock is what prevents overselling; never ship such a route.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import redis.asyncio as redis
from aiohttp import web
from aiohttp.typedefs import Handler

from aiolock import AcquireTimeout, AsyncLock, LockLostError, guard


@dataclass(frozen=True)
class Settings:
    """How the service locks and how long a purchase "works" between its read and write.

    Attributes:
        ttl: the lease of a lock or permit in seconds (renewed while a handler holds it).
        lock_timeout: how long a request waits for a busy item, or for a
            permit to call the partner, before 503.
        pause: seconds of simulated work between reading and writing the stock.
        partner_url: the base URL of the partner's API.
        partner_limit: how many calls to the partner may run at once, across
            every worker (every worker must use the same number).
        partner_name: the name of the semaphore that counts those calls.
    """

    ttl: float = 5.0
    lock_timeout: float = 2.0
    pause: float = 0.01
    partner_url: str = "http://127.0.0.1:9000"
    partner_limit: int = 4
    partner_name: str = "partner-api"


REDIS = web.AppKey("redis", redis.Redis)
PARTNER = web.AppKey("partner", aiohttp.ClientSession)
SETTINGS = web.AppKey("settings", Settings)


def stock_key(item_id: str) -> str:
    """The Redis key of an item's stock."""
    return f"stock:{item_id}"


def lock_name(item_id: str) -> str:
    """The lock that serializes every change to an item's stock."""
    return f"item:{item_id}"


async def take(client: redis.Redis, item_id: str, quantity: int, pause: float) -> int | None:
    """Take ``quantity`` units of the item: a read-modify-write, safe only under its lock.

    Returns:
        The stock left, or None if there was not enough (nothing is taken).
    """
    key = stock_key(item_id)
    stock = int(await client.get(key) or 0)
    if stock < quantity:
        return None
    # The work between the read and the write (pricing, payment, ...). Without
    # the lock, other buyers read the same stock meanwhile and all of them sell.
    await asyncio.sleep(pause)
    await client.set(key, stock - quantity)
    return stock - quantity


def quantity_of(request: web.Request, default: int) -> int:
    """The ``quantity`` query parameter: an integer from 1 to 100 (else 422)."""
    raw = request.query.get("quantity", str(default))
    if not raw.isdecimal() or not 1 <= int(raw) <= 100:
        raise web.HTTPUnprocessableEntity(
            text=json.dumps({"detail": "quantity must be an integer from 1 to 100"}),
            content_type="application/json",
        )
    return int(raw)


def sold_out(item_id: str) -> web.HTTPConflict:
    """409: not enough stock."""
    return web.HTTPConflict(
        text=json.dumps({"detail": f"item {item_id!r} is sold out"}),
        content_type="application/json",
    )


@web.middleware
async def lock_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map aiolock's errors to 503 responses, for every handler."""
    try:
        return await handler(request)
    except AcquireTimeout as exc:  # the lock was not acquired in time: nothing was done
        return web.json_response(
            {"detail": f"the item is busy, try again later ({exc})"},
            status=503,
            headers={"Retry-After": "1"},
        )
    except LockLostError as exc:  # the lease ran out meanwhile: writes may have happened
        return web.json_response(
            {"detail": f"outcome unknown: the lock was lost while processing ({exc})"},
            status=503,
        )


async def get_stock(request: web.Request) -> web.Response:
    """The item's stock (a plain read needs no lock)."""
    item_id = request.match_info["item_id"]
    stock = int(await request.app[REDIS].get(stock_key(item_id)) or 0)
    return web.json_response({"item": item_id, "stock": stock})


async def restock(request: web.Request) -> web.Response:
    """Add ``quantity`` units, holding the item's lock inside the handler body."""
    item_id = request.match_info["item_id"]
    quantity = quantity_of(request, default=10)
    client, settings = request.app[REDIS], request.app[SETTINGS]
    # INCRBY is atomic on its own, but a buyer between its GET and its SET would
    # overwrite it: restocking takes the same lock as buying.
    async with AsyncLock(
        client, lock_name(item_id), ttl=settings.ttl, timeout=settings.lock_timeout
    ):
        stock = await client.incrby(stock_key(item_id), quantity)
    return web.json_response({"item": item_id, "stock": stock})


async def buy_unlocked(request: web.Request) -> web.Response:
    """DEMONSTRATION ONLY: the purchase without the lock. Concurrent buyers oversell."""
    item_id = request.match_info["item_id"]
    quantity = quantity_of(request, default=1)
    remaining = await take(request.app[REDIS], item_id, quantity, request.app[SETTINGS].pause)
    if remaining is None:
        raise sold_out(item_id)
    return web.json_response({"item": item_id, "remaining": remaining})


def create_app(
    url: str,
    *,
    client_name: str = "aiolock-aiohttp-example",
    settings: Settings | None = None,
    unlocked_demo: bool = False,
) -> web.Application:
    """Make the service for the Redis server at ``url``.

    Args:
        url: the Redis URL (``redis://host:port/db``).
        client_name: the name its connections give the server (``CLIENT SETNAME``).
        settings: lock and timing settings; the defaults of :class:`Settings`.
        unlocked_demo: also serve ``POST /items/{item_id}/buy-unlocked``, the
            purchase without the lock, to show that it oversells.

    Returns:
        The app; its Redis client exists from startup to cleanup.
    """
    settings = settings or Settings()
    app = web.Application(middlewares=[lock_errors])
    app[SETTINGS] = settings

    async def redis_client(app: web.Application) -> AsyncIterator[None]:
        client = redis.Redis.from_url(url, client_name=client_name)
        app[REDIS] = client
        try:
            yield
        finally:
            await client.aclose()

    async def partner_session(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(base_url=settings.partner_url) as partner:
            app[PARTNER] = partner
            yield

    app.cleanup_ctx.append(redis_client)
    app.cleanup_ctx.append(partner_session)

    # Each call runs under ``async with AsyncLock(app[REDIS], f"item:{item_id}", ...)``.
    # guard() does not hand the lock to the function, so it cannot check ``lock.lost``
    # before its write: cancel_on_lost=True cancels the call at the loss instead, and
    # the stale read is never written (LockLostError, a 503, comes out of the call).
    @guard(
        lambda: app[REDIS],
        "item:{item_id}",
        ttl=settings.ttl,
        timeout=settings.lock_timeout,
        cancel_on_lost=True,
    )
    async def purchase(item_id: str, quantity: int = 1) -> int | None:
        return await take(app[REDIS], item_id, quantity, settings.pause)

    async def buy(request: web.Request) -> web.Response:
        """Buy ``quantity`` units: 409 when sold out, 503 when the item stays busy."""
        item_id = request.match_info["item_id"]
        remaining = await purchase(item_id, quantity_of(request, default=1))
        if remaining is None:
            raise sold_out(item_id)
        return web.json_response({"item": item_id, "remaining": remaining})

    # One permit of the semaphore per call, whatever the item: the limit is the
    # partner's. Waiting calls get permits in the order they asked, in every worker.
    @guard(
        lambda: app[REDIS],
        settings.partner_name,
        limit=settings.partner_limit,
        ttl=settings.ttl,
        timeout=settings.lock_timeout,
    )
    async def fetch_quote(item_id: str) -> Any:
        async with app[PARTNER].get(f"/quotes/{item_id}") as resp:
            resp.raise_for_status()
            return await resp.json()

    async def partner_quote(request: web.Request) -> web.Response:
        """The partner's price: at most ``partner_limit`` calls at once, in every worker."""
        item_id = request.match_info["item_id"]
        try:
            body = await fetch_quote(item_id)
        except AcquireTimeout as exc:  # every permit stayed taken: the partner was not called
            return web.json_response(
                {"detail": f"the partner API is busy, try again later ({exc})"},
                status=503,
                headers={"Retry-After": "1"},
            )
        return web.json_response({"item": item_id, "price": int(body["price"])})

    app.router.add_get("/items/{item_id}", get_stock)
    app.router.add_get("/partner/{item_id}", partner_quote)
    app.router.add_post("/items/{item_id}/buy", buy)
    app.router.add_post("/items/{item_id}/restock", restock)
    if unlocked_demo:
        app.router.add_post("/items/{item_id}/buy-unlocked", buy_unlocked)
    return app


if __name__ == "__main__":
    web.run_app(
        create_app(
            os.environ.get("AIOLOCK_URL", "redis://127.0.0.1:6379/0"),
            settings=Settings(partner_url=os.environ.get("PARTNER_URL", Settings.partner_url)),
        ),
        host="127.0.0.1",
        port=int(os.environ.get("PORT", "8080")),
    )
