"""A stand-in for the partner's price API that the web examples call.

``GET /quotes/{item_id}`` answers ``{"item": ..., "price": ...}`` with a
made-up price (the same for the same item), after a short pause like a
remote API's. It listens on ``127.0.0.1`` at ``PORT`` (default 9000), where
the examples look for it by default (``PARTNER_URL``)::

    python examples/partner.py

It needs ``aiohttp`` (the ``examples`` extra).
"""

from __future__ import annotations

import asyncio
import os
import zlib

from aiohttp import web

#: How long a quote takes, seconds: long enough for calls to overlap.
PAUSE = 0.05


async def quote(request: web.Request) -> web.Response:
    """The price of the item in the path."""
    item = request.match_info["item_id"]
    await asyncio.sleep(PAUSE)
    return web.json_response({"item": item, "price": 100 + zlib.crc32(item.encode()) % 900})


def create_app() -> web.Application:
    """The partner's app: one route."""
    app = web.Application()
    app.router.add_get("/quotes/{item_id}", quote)
    return app


if __name__ == "__main__":
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "9000")))
