"""The client of the subcommands: made from a URL, closed, its errors.

redis-py checks most of a URL's options only when it first connects;
:func:`connect` checks them before anything is sent, so that a bad option
is a usage error (exit status 2) that names it, not a server error.
:func:`asking` is what ``status``, ``ls``, ``release --force`` and
``leader`` share: the client for their questions, the message and exit
status for a bad URL or a server that cannot be asked, and the close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final, TextIO

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .._types import Client
from ._codes import EX_UNAVAILABLE, EX_USAGE
from ._urls import bad_url_message, option_problem, unavailable_message

__all__ = ["SERVER_ERRORS", "Answered", "asking", "check_url", "close", "connect"]

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


class Answered(Exception):
    """A subcommand has its answer, an exit status, and has printed why: return it."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        #: The exit status.
        self.status = status


@contextlib.asynccontextmanager
async def asking(url: str, cluster: bool, err: TextIO) -> AsyncIterator[Client]:
    """A client of ``url`` for the block's questions to the server, closed when it ends.

    Raises:
        Answered: ``EX_USAGE`` for a bad URL (nothing was sent), or
            ``EX_UNAVAILABLE`` when the server failed or could not be reached
            while the block ran; the message naming the URL (without its
            password) is printed to ``err`` first.
    """
    try:
        client = connect(url, cluster)
    except ValueError as exc:
        print(bad_url_message(exc, url), file=err)
        raise Answered(EX_USAGE) from None
    try:
        yield client
    except SERVER_ERRORS as exc:
        print(unavailable_message(exc, url), file=err)
        raise Answered(EX_UNAVAILABLE) from None
    finally:
        await close(client)
