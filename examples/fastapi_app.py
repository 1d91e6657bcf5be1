"""A "seckill" inventory service on FastAPI, with one aiolock lock per item.

A purchase is a read-modify-write of the item's stock in Redis (``GET``,
some work, ``SET``). Two concurrent buyers that both read "1 left" would
both sell it; the lock makes them take turns, per item, across every worker
process that shares the Redis server.

What is idiomatic here:

- The ``redis.asyncio`` client is made in the app's lifespan, kept on
  ``app.state``, and closed with ``aclose()`` at shutdown.
- :func:`item_lock` is a dependency that *yields a held lock*::

      ItemLock = Annotated[AsyncLock, Depends(item_lock, scope="function")]

      @router.post("/items/{item_id}/buy")
      async def buy(item_id: str, lock: ItemLock) -> Purchase: ...

  ``scope="function"`` ends the dependency (releases the lock) when the
  handler returns, *before* the response is sent: the client is told
  "bought" only once the lock is released and the write is done, and a
  :class:`~aiolock.LockLostError` raised on release still becomes an HTTP
  response instead of an error after the response went out.
- :func:`restock` uses ``async with AsyncLock(...)`` directly in its body.
- :func:`partner_quote` calls a partner's API under a
  :class:`~aiolock.Semaphore`: at most ``partner_limit`` calls to it at once
  across every worker process, whatever the item (the partner allows that
  many). A request that gets no permit within the timeout is a 503 with
  ``Retry-After``, and the partner is not called.
- Exception handlers map aiolock's errors to HTTP once, for every route:
  :class:`~aiolock.AcquireTimeout` (the item stayed busy past the lock's
  ``timeout``) to 503 with ``Retry-After``, and :class:`~aiolock.LockLostError`
  (the lease ran out while the handler ran) to 503 saying the outcome is
  unknown. Sold out is 409.

Run it, from a checkout with the ``examples`` extra installed (``pip install
".[examples]"``): a server, the partner's stand-in, the app, then requests
(``tests/project/test_examples.py`` runs these lines as written)::

    aiolock server &
    python examples/partner.py &
    AIOLOCK_URL=redis://127.0.0.1:6379/0 python examples/fastapi_app.py &
    curl -X POST 'localhost:8000/items/phone/restock?quantity=10'
    curl -X POST 'localhost:8000/items/phone/buy'
    curl 'localhost:8000/partner/phone'

The app talks to the server at ``AIOLOCK_URL`` (default
``redis://127.0.0.1:6379/0``) and listens on ``PORT`` (default 8000). The
partner's API is at ``PARTNER_URL`` (default ``http://127.0.0.1:9000``, where
``examples/partner.py`` serves a stand-in): ``GET /quotes/{item_id}``
answers ``{"item": ..., "price": ...}``, called with an ``aiohttp`` client
session made and closed in the lifespan too.

``create_app(url, unlocked_demo=True)`` adds ``POST /items/{item_id}/buy-unlocked``,
the same purchase without the lock. It exists to show (and to test) that
the lock is what prevents overselling; never ship such a route.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

import aiohttp
import redis.asyncio as redis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from aiolock import AcquireTimeout, AsyncLock, LockLostError, Semaphore


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


class Purchase(BaseModel):
    """A successful purchase."""

    item: str
    remaining: int


class Stock(BaseModel):
    """An item's stock."""

    item: str
    stock: int


class Quote(BaseModel):
    """The partner's price for an item."""

    item: str
    price: int


def stock_key(item_id: str) -> str:
    """The Redis key of an item's stock."""
    return f"stock:{item_id}"


def lock_name(item_id: str) -> str:
    """The lock that serializes every change to an item's stock."""
    return f"item:{item_id}"


async def take(
    client: redis.Redis, item_id: str, quantity: int, pause: float, lock: AsyncLock | None = None
) -> int | None:
    """Take ``quantity`` units of the item: a read-modify-write, safe only under its lock.

    Args:
        client: the Redis client.
        item_id: the item.
        quantity: how many units.
        pause: seconds of simulated work between the read and the write.
        lock: the item's lock, held by the caller: checked right before the
            write, so that a holder whose lease ran out meanwhile (renewal
            failed, the event loop was blocked) does not write.

    Returns:
        The stock left, or None if there was not enough (nothing is taken).

    Raises:
        HTTPException: 503, the lock was lost before the write (nothing is taken).
    """
    key = stock_key(item_id)
    stock = int(await client.get(key) or 0)
    if stock < quantity:
        return None
    # The work between the read and the write (pricing, payment, ...). Without
    # the lock, other buyers read the same stock meanwhile and all of them sell.
    await asyncio.sleep(pause)
    if lock is not None and lock.lost:
        # Another buyer may hold the lock now: writing our stale read would undo
        # their sale. (A write that the store itself must refuse takes a fence:
        # see examples/fenced_write.py.)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the lock of item {item_id!r} was lost before the sale was written; "
            "nothing was sold, try again",
        )
    await client.set(key, stock - quantity)
    return stock - quantity


# -- dependencies ----------------------------------------------------------------------


def get_redis(request: Request) -> redis.Redis:
    """The app's Redis client, made by the lifespan."""
    client: redis.Redis = request.app.state.redis
    return client


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    settings: Settings = request.app.state.settings
    return settings


def get_partner(request: Request) -> aiohttp.ClientSession:
    """The app's HTTP session to the partner's API, made by the lifespan."""
    partner: aiohttp.ClientSession = request.app.state.partner
    return partner


RedisClient = Annotated[redis.Redis, Depends(get_redis)]
AppSettings = Annotated[Settings, Depends(get_settings)]
PartnerAPI = Annotated[aiohttp.ClientSession, Depends(get_partner)]


async def item_lock(
    item_id: str, client: RedisClient, settings: AppSettings
) -> AsyncIterator[AsyncLock]:
    """Hold the item's lock while the handler runs.

    Waits up to ``settings.lock_timeout`` (then :class:`AcquireTimeout`
    becomes a 503), renews the lease while the handler runs, and releases
    when it returns or raises.
    """
    async with AsyncLock(
        client, lock_name(item_id), ttl=settings.ttl, timeout=settings.lock_timeout
    ) as lock:
        yield lock


#: The item's lock, held around the handler; released before the response is sent.
ItemLock = Annotated[AsyncLock, Depends(item_lock, scope="function")]
Quantity = Annotated[int, Query(ge=1, le=100)]


# -- routes ----------------------------------------------------------------------------

router = APIRouter()


@router.get("/items/{item_id}")
async def get_stock(item_id: str, client: RedisClient) -> Stock:
    """The item's stock (a plain read needs no lock)."""
    return Stock(item=item_id, stock=int(await client.get(stock_key(item_id)) or 0))


@router.post("/items/{item_id}/buy")
async def buy(
    item_id: str,
    lock: ItemLock,
    client: RedisClient,
    settings: AppSettings,
    quantity: Quantity = 1,
) -> Purchase:
    """Buy ``quantity`` units: 409 when sold out, 503 when the item stays busy."""
    # ``lock`` is held for this whole body: no other buyer of this item (in
    # any process) is between its read and its write now.
    remaining = await take(client, item_id, quantity, settings.pause, lock)
    if remaining is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"item {item_id!r} is sold out")
    return Purchase(item=item_id, remaining=remaining)


@router.post("/items/{item_id}/restock")
async def restock(
    item_id: str, client: RedisClient, settings: AppSettings, quantity: Quantity = 10
) -> Stock:
    """Add ``quantity`` units, holding the item's lock inside the handler body."""
    # INCRBY is atomic on its own, but a buyer between its GET and its SET would
    # overwrite it: restocking takes the same lock as buying.
    async with AsyncLock(
        client, lock_name(item_id), ttl=settings.ttl, timeout=settings.lock_timeout
    ):
        stock = await client.incrby(stock_key(item_id), quantity)
    return Stock(item=item_id, stock=stock)


@router.get("/partner/{item_id}")
async def partner_quote(
    item_id: str, client: RedisClient, partner: PartnerAPI, settings: AppSettings
) -> Quote:
    """The partner's price: at most ``partner_limit`` calls at once, in every worker; else 503."""
    # One permit per call, whatever the item: the limit is the partner's, not an item's.
    # Waiting tasks get permits in the order they asked, across every worker.
    permit = Semaphore(
        client,
        settings.partner_name,
        limit=settings.partner_limit,
        ttl=settings.ttl,
        timeout=settings.lock_timeout,
    )
    try:
        async with permit, partner.get(f"/quotes/{item_id}") as resp:
            resp.raise_for_status()
            body = await resp.json()
    except AcquireTimeout as exc:  # every permit stayed taken: the partner was not called
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the partner API is busy, try again later ({exc})",
            headers={"Retry-After": "1"},
        ) from exc
    return Quote(item=item_id, price=int(body["price"]))


demo_router = APIRouter()


@demo_router.post("/items/{item_id}/buy-unlocked")
async def buy_unlocked(
    item_id: str, client: RedisClient, settings: AppSettings, quantity: Quantity = 1
) -> Purchase:
    """DEMONSTRATION ONLY: :func:`buy` without the lock. Concurrent buyers oversell."""
    remaining = await take(client, item_id, quantity, settings.pause)
    if remaining is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"item {item_id!r} is sold out")
    return Purchase(item=item_id, remaining=remaining)


# -- aiolock's errors as HTTP responses ------------------------------------------------


async def item_busy(request: Request, exc: AcquireTimeout) -> JSONResponse:
    """503 + ``Retry-After``: the lock was not acquired within the timeout; nothing was done."""
    return JSONResponse(
        {"detail": f"the item is busy, try again later ({exc})"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "1"},
    )


async def lock_lost(request: Request, exc: LockLostError) -> JSONResponse:
    """503: the lock (or permit) was lost while the handler ran; its writes may have happened."""
    return JSONResponse(
        {"detail": f"outcome unknown: the lock was lost while processing ({exc})"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def create_app(
    url: str,
    *,
    client_name: str = "aiolock-fastapi-example",
    settings: Settings | None = None,
    unlocked_demo: bool = False,
) -> FastAPI:
    """Make the service for the Redis server at ``url``.

    Args:
        url: the Redis URL (``redis://host:port/db``).
        client_name: the name its connections give the server (``CLIENT SETNAME``).
        settings: lock and timing settings; the defaults of :class:`Settings`.
        unlocked_demo: also serve ``POST /items/{item_id}/buy-unlocked``, the
            purchase without the lock, to show that it oversells.

    Returns:
        The app; its Redis client exists from startup to shutdown of its lifespan.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = redis.Redis.from_url(url, client_name=client_name)
        app.state.redis = client
        try:
            async with aiohttp.ClientSession(base_url=app.state.settings.partner_url) as partner:
                app.state.partner = partner
                yield
        finally:
            await client.aclose()

    app = FastAPI(
        title="aiolock seckill example",
        lifespan=lifespan,
        exception_handlers={AcquireTimeout: item_busy, LockLostError: lock_lost},
    )
    app.state.settings = settings or Settings()
    app.include_router(router)
    if unlocked_demo:
        app.include_router(demo_router)
    return app


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        create_app(
            os.environ.get("AIOLOCK_URL", "redis://127.0.0.1:6379/0"),
            settings=Settings(partner_url=os.environ.get("PARTNER_URL", Settings.partner_url)),
        ),
        host="127.0.0.1",
        port=int(os.environ.get("PORT", "8000")),
    )
