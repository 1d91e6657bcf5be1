"""The client of ``aiolock run`` and ``aiolock status``: made from a URL, closed, its errors.

redis-py checks most of a URL's options only when it first connects;
:func:`connect` checks them before anything is sent, so that a bad option
is a usage error (exit status 2) that names it, not a server error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .._types import Client
from ._urls import option_problem

__all__ = ["SERVER_ERRORS", "check_url", "close", "connect"]

#: What the server or the client may raise: redis-py's errors, the cluster
#: client's own (not a ``RedisError``), and the socket's.
SERVER_ERRORS: Final = (RedisError, RedisClusterException, OSError)

#: How long leftover tasks (a release listener lingering) may take to end by themselves.
_DRAIN_BOUND: Final = 2.0


def connect(url: str, cluster: bool) -> Client:
    """A client for ``url`` (nothing is sent yet); ``ValueError`` for a malformed URL.

    redis-py passes every ``?name=value`` of the URL on as a keyword argument.
    A name it does not know fails only when the first connection is made, as a
    bare ``TypeError``, and some bad values (``protocol=9``) as an error that
    looks like the server's. So the connection the first command would use is
    built here, without connecting: whatever that raises is the URL's fault,
    and becomes a ``ValueError`` that names the option (never the password).
    """
    client: Client
    try:
        if cluster:
            client = RedisCluster.from_url(url)
            for node in client.nodes_manager.startup_nodes.values():
                node.connection_class(**node.connection_kwargs)  # built only, never opened
        else:
            client = Redis.from_url(url)
            pool = client.connection_pool
            pool.connection_class(**pool.connection_kwargs)  # built only, never opened
    except (TypeError, RedisError) as exc:
        raise ValueError(option_problem(exc, url)) from None
    return client


def check_url(url: str, cluster: bool = False) -> None:
    """Check a server URL's options without connecting.

    Raises:
        ValueError: an option redis-py does not take or cannot use (named).
    """
    connect(url, cluster)


async def close(client: Client) -> None:
    """Close ``client`` after letting leftover tasks (a lingering listener) end."""
    me = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not me]
    if others:
        _, pending = await asyncio.wait(others, timeout=_DRAIN_BOUND)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    with contextlib.suppress(*SERVER_ERRORS):
        await client.aclose()
