"""``aiolock ls`` and ``aiolock release --force``: the names held on a server, and freeing one.

``ls [PATTERN]`` lists the names held (``SCAN`` over every master of a
cluster), each with its kind, how many hold it, how many wait and the
first lease to end, at most ``--limit`` of them. ``release --force NAME``
frees a name on purpose (:func:`aiolock._inspect.force_release`): it prints
whom it took the name from, the next waiter is granted at once, and the act
is logged (the ``aiolock`` logger, WARNING, and a line on stdout).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import os
import socket
import sys
from dataclasses import asdict, dataclass
from typing import Any, Final, TextIO

from .._identity import check_identity
from .._inspect import force_release, held_names, inspect
from .._keys import Keys
from .._types import Client
from ._client import Answered, asking
from ._codes import EX_FREE, EX_OK, EX_USAGE
from ._urls import DEFAULT_URL, redact_url

__all__ = ["ForceConfig", "ListConfig", "default_forcer", "force", "held_rows", "list_names"]

logger = logging.getLogger("aiolock")

#: How many names ``ls`` shows unless given ``--limit``.
DEFAULT_LIMIT: Final = 100


@dataclass(frozen=True)
class ListConfig:
    """What ``aiolock ls`` asks.

    Attributes:
        pattern: a glob over the names (``*``, ``?``, ``[...]``).
        url: the server's URL.
        cluster: connect with ``RedisCluster`` instead of ``Redis``.
        prefix: the key prefix.
        limit: the most names shown.
        json: print one JSON object per line instead of a table.
    """

    pattern: str = "*"
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "aiolock:"
    limit: int = DEFAULT_LIMIT
    json: bool = False


def list_names(config: ListConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the held names matching the pattern; return 0 if any, 3 if none.

    Returns:
        0 if a name was listed, 3 if none matched, 69 if the server could not
        be asked, 2 for a bad URL.
    """
    return asyncio.run(
        _list(config, sys.stdout if out is None else out, sys.stderr if err is None else err)
    )


async def _list(config: ListConfig, out: TextIO, err: TextIO) -> int:
    try:
        async with asking(config.url, config.cluster, err) as client:
            rows, more = await held_rows(client, config.pattern, config.prefix, config.limit)
    except Answered as answered:
        return answered.status
    if config.json:
        for row in rows:
            print(json.dumps(row), file=out)
    elif rows:
        width = max(4, *(len(row["name"]) for row in rows))
        print(f"{'NAME':<{width}}  KIND       HOLDERS  WAITERS  LEASE", file=out)
        for row in rows:
            lease = "-" if row["lease"] is None else f"{row['lease']:.3f} s"
            print(
                f"{row['name']:<{width}}  {row['kind']:<9}  {row['holders']:>7}  "
                f"{row['waiters']:>7}  {lease}",
                file=out,
            )
    if more:
        print(
            f"aiolock: more names match; the first {config.limit} found are shown (--limit)",
            file=err,
        )
    return EX_OK if rows else EX_FREE


async def held_rows(
    client: Client, pattern: str, prefix: str, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """The rows of ``ls`` (name, kind, holders, waiters, lease), by name; whether more matched."""
    rows: list[dict[str, Any]] = []
    more = False
    names = held_names(client, pattern, prefix=prefix)
    try:
        async for name in names:
            if len(rows) >= limit:
                more = True
                break
            info = await inspect(client, name, prefix=prefix)
            if info is None or not info.holders:
                continue  # (freed since the scan)
            ends = [h.remaining for h in info.holders if h.remaining is not None]
            rows.append(
                {
                    "name": name,
                    "kind": info.kind,
                    "holders": len(info.holders),
                    "waiters": len(info.waiters),
                    "lease": min(ends) if ends else None,
                }
            )
    finally:
        await names.aclose()
    rows.sort(key=lambda row: row["name"])
    return rows, more


def default_forcer() -> str:
    """Who forces a release unless told: ``user@host:pid`` of this ``aiolock`` command."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid
        user = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ForceConfig:
    """What ``aiolock release --force`` asks.

    Attributes:
        name: the name to free.
        url: the server's URL.
        cluster: connect with ``RedisCluster`` instead of ``Redis``.
        prefix: the key prefix.
        by: who forces it, as the holder's loss will name it (default:
            :func:`default_forcer`).
        json: print one JSON object instead of a sentence.
    """

    name: str
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "aiolock:"
    by: str | None = None
    json: bool = False


def force(config: ForceConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Free the name on purpose; return 0 if it was held, 3 if it was not.

    Returns:
        0 if it took the name from its holders, 3 if nobody held it (nothing
        is changed), 69 if the server could not be asked, 2 for a bad name,
        ``--by`` or URL.
    """
    return asyncio.run(
        _force(config, sys.stdout if out is None else out, sys.stderr if err is None else err)
    )


async def _force(config: ForceConfig, out: TextIO, err: TextIO) -> int:
    try:
        forcer = default_forcer() if config.by is None else check_identity(config.by, "--by")
        keys = Keys(config.name, config.prefix)
    except (TypeError, ValueError) as exc:
        print(f"aiolock: {exc}", file=err)
        return EX_USAGE
    try:
        async with asking(config.url, config.cluster, err) as client:
            done = await force_release(client, config.name, forcer, prefix=config.prefix)
    except Answered as answered:
        return answered.status
    if done.kind is None:
        sentence = f"lock {config.name!r} was not held (key {keys.lock}); nothing was released"
    else:
        whom = ", ".join(done.holders)
        granted = (
            "nobody was waiting"
            if not done.granted
            else "granted at once to the next waiter"
            if done.granted == 1
            else f"granted at once to the next {done.granted} waiters"
        )
        sentence = (
            f"released {done.kind} {config.name!r} by force (key {keys.lock}): "
            f"taken from {whom}; {granted}"
        )
        logger.warning("%s, by %s", sentence, forcer)
    if config.json:
        state = {
            "name": config.name,
            "key": keys.lock,
            "released": done.kind is not None,
            "by": forcer,
            "server": redact_url(config.url),
            **asdict(done),
        }
        print(json.dumps(state), file=out)
    else:
        print(sentence, file=out)
    return EX_OK if done.kind is not None else EX_FREE
