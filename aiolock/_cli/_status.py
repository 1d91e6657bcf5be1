"""``aiolock status``: a name's state as the server sees it, in a sentence or as JSON.

For a lock: whether it is held, how much of its lease is left and its fence
counter; for a semaphore's name, the permits held and when each lease ends;
for a read-write lock's, its readers or its writer. The holders of the last
two come from the package's own status script (``STATUS_HOLDERS``), read by
its decoder (``decode_holders``), both in :mod:`aiolock._scripts`. Then who:
each holder and each waiter in order, as :func:`aiolock.inspect` names them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from .._inspect import LockInfo, inspect
from .._keys import Keys
from .._scripts import STATUS_HOLDERS, decode_holders
from .._types import Client
from .._wire import Wire
from ._client import Answered, asking
from ._codes import EX_FREE, EX_OK, EX_USAGE
from ._urls import DEFAULT_URL, redact_url

__all__ = ["StatusConfig", "show_status"]


@dataclass(frozen=True)
class StatusConfig:
    """What ``aiolock status`` asks.

    Attributes:
        name: the lock's name.
        url: the server's URL.
        cluster: connect with ``RedisCluster`` instead of ``Redis``.
        prefix: the lock key's prefix.
        json: print one JSON object instead of a sentence.
    """

    name: str
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "aiolock:"
    json: bool = False


def show_status(config: StatusConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the lock's state as the server sees it; return 0 if held, 3 if free.

    The sentence (or the JSON object, with ``config.json``) gives the key,
    whether it is held, the remaining lease in seconds (``PTTL``; none for a
    key without expiry) and the fence counter (the fence of the latest
    acquisition with ``fencing=True``, if there ever was one).

    JSON fields: ``name``, ``key``, ``kind`` (``"lock"``, ``"semaphore"``,
    ``"read-write"``, or null for a free name), ``held`` (bool), ``lease``
    (seconds left, a float, or null), ``fence`` (an int or null), ``server``
    (the URL without its password). A semaphore's name gives ``permits`` (a
    list of ``{"lease": seconds left}``, first ending first) instead of
    ``lease`` and ``fence``; a read-write lock's gives ``readers`` (the same
    list) and ``writer`` (``{"lease": ...}`` or null). Every object also has
    ``holders`` (a list of ``{"identity", "acquired_at", "remaining",
    "fence", "role"}``, as :class:`aiolock.HolderInfo`) and ``waiters`` (a
    list of ``{"identity"}`` in the order they will be served). The
    sentence is followed by a line per holder and one per waiter.

    Args:
        config: which lock, on which server, printed how.
        out: where the state goes (default: stdout).
        err: where an error line goes (default: stderr).

    Returns:
        0 if held, 3 if free, 69 if the server could not be asked, 2 for a bad name or URL.
    """
    return asyncio.run(
        _status(config, sys.stdout if out is None else out, sys.stderr if err is None else err)
    )


async def _status(config: StatusConfig, out: TextIO, err: TextIO) -> int:
    try:
        async with asking(config.url, config.cluster, err) as client:
            try:
                keys = Keys(config.name, config.prefix)
            except (TypeError, ValueError) as exc:
                print(f"aiolock: {exc}", file=err)
                return EX_USAGE
            pttl, raw_fence, permits = await _ask(client, keys)
            info = await inspect(client, config.name, prefix=config.prefix)
    except Answered as answered:
        return answered.status
    if permits is not None:
        kind, holders = permits
        if kind == "semaphore":
            return _show_permits(config, keys, [lease for _, lease in holders], info, out)
        return _show_readers_and_writer(config, keys, holders, info, out)
    held = pttl != -2
    lease = pttl / 1000 if pttl >= 0 else None
    fence = _fence(raw_fence)
    if config.json:
        state: dict[str, Any] = {
            "name": config.name,
            "key": keys.lock,
            "kind": "lock" if held else None,
            "held": held,
            "lease": lease,
            "fence": fence,
            "server": redact_url(config.url),
            **_who(info),
        }
        print(json.dumps(state), file=out)
    else:
        print(" ".join(_sentence(config.name, keys.lock, held, lease, fence)), file=out)
        _print_who(info, out)
    return EX_OK if held else EX_FREE


def _who(info: LockInfo | None) -> dict[str, Any]:
    """The JSON fields ``holders`` and ``waiters``."""
    if info is None:
        return {"holders": [], "waiters": []}
    return {
        "holders": [asdict(h) for h in info.holders],
        "waiters": [asdict(w) for w in info.waiters],
    }


def _since(at: float | None) -> str:
    """When, in UTC, and how long ago."""
    if at is None:
        return "since an unknown time"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
    return f"since {stamp}.{int(at * 1000) % 1000:03d}Z ({max(time.time() - at, 0.0):.1f} s ago)"


def _print_who(info: LockInfo | None, out: TextIO) -> None:
    """A line per holder (who, since when, lease left, fence) and per waiter, in order."""
    if info is None:
        return
    for holder in info.holders:
        lease = (
            "no expiry" if holder.remaining is None else f"lease ends in {holder.remaining:.3f} s"
        )
        fence = "" if holder.fence is None else f", fence {holder.fence}"
        print(
            f"  {holder.role} {holder.identity}, {_since(holder.acquired_at)}, {lease}{fence}",
            file=out,
        )
    for place, waiter in enumerate(info.waiters, 1):
        print(f"  waiter {place}: {waiter.identity}", file=out)


def _show_readers_and_writer(
    config: StatusConfig,
    keys: Keys,
    holders: list[tuple[str, float]],
    info: LockInfo | None,
    out: TextIO,
) -> int:
    """A read-write lock's state: its readers, or its writer, and when each lease ends."""
    readers = [lease for kind, lease in holders if kind == "r"]
    writer = next((lease for kind, lease in holders if kind == "w"), None)
    if config.json:
        state: dict[str, Any] = {
            "name": config.name,
            "key": keys.lock,
            "kind": "read-write",
            "held": bool(holders),
            "readers": [{"lease": lease} for lease in readers],
            "writer": None if writer is None else {"lease": writer},
            "server": redact_url(config.url),
            **_who(info),
        }
        print(json.dumps(state), file=out)
        return EX_OK if holders else EX_FREE
    if writer is not None:
        print(
            f"read-write lock {config.name!r} is held by a writer (key {keys.lock}); "
            f"its lease ends in {writer:.3f} s",
            file=out,
        )
    elif readers:
        ends = ", ".join(f"{lease:.3f} s" for lease in readers)
        count = "1 reader" if len(readers) == 1 else f"{len(readers)} readers"
        theirs = "its lease ends" if len(readers) == 1 else "their leases end"
        print(
            f"read-write lock {config.name!r} is held by {count} (key {keys.lock}); "
            f"{theirs} in {ends}",
            file=out,
        )
    else:
        print(f"read-write lock {config.name!r} is free (key {keys.lock})", file=out)
    _print_who(info, out)
    return EX_OK if holders else EX_FREE


def _show_permits(
    config: StatusConfig, keys: Keys, leases: list[float], info: LockInfo | None, out: TextIO
) -> int:
    """A semaphore's state: how many permits are held, and when each lease ends."""
    if config.json:
        state: dict[str, Any] = {
            "name": config.name,
            "key": keys.lock,
            "kind": "semaphore",
            "held": bool(leases),
            "permits": [{"lease": lease} for lease in leases],
            "server": redact_url(config.url),
            **_who(info),
        }
        print(json.dumps(state), file=out)
        return EX_OK if leases else EX_FREE
    if not leases:
        print(f"semaphore {config.name!r} has no permit held (key {keys.lock})", file=out)
    else:
        ends = ", ".join(f"{lease:.3f} s" for lease in leases)
        count = "1 permit" if len(leases) == 1 else f"{len(leases)} permits"
        theirs = "its lease ends" if len(leases) == 1 else "their leases end"
        print(
            f"semaphore {config.name!r} has {count} held (key {keys.lock}); {theirs} in {ends}",
            file=out,
        )
    _print_who(info, out)
    return EX_OK if leases else EX_FREE


async def _ask(
    client: Client, keys: Keys
) -> tuple[int, bytes | None, tuple[str, list[tuple[str, float]]] | None]:
    """The lock key's ``PTTL`` and fence counter, in one round trip; other kinds' holders.

    A key that is a sorted set is a semaphore's, a hash a read-write
    lock's: the third item is then ``("semaphore", holders)`` or
    ``("read-write", holders)``, each holder ``(kind, seconds its lease has
    left)`` (kind ``"p"`` for a permit, ``"r"``/``"w"`` for a reader or the
    writer), first ending first (else None).
    """
    # Every key shares the lock's hash slot, so a cluster pipeline sends them together.
    pipe = client.pipeline()
    pipe.pttl(keys.lock)
    pipe.get(keys.fence)
    pipe.type(keys.lock)
    pttl, fence, kind = await pipe.execute()
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind not in ("zset", "hash"):
        return int(pttl), fence, None
    # The holders and the server's clock, in one script (a cluster client sends no
    # keyless TIME in a pipeline).
    named, args = STATUS_HOLDERS.call(lock=keys.lock)
    now_ms, ends = decode_holders(await Wire(client).run(STATUS_HOLDERS, named, args))
    holders = [(holder, (at - now_ms) / 1000) for holder, at in ends if at > now_ms]
    holders.sort(key=lambda holder: holder[1])
    return int(pttl), fence, ("semaphore" if kind == "zset" else "read-write", holders)


def _fence(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None  # not a counter aiolock wrote


def _sentence(
    name: str, key: str, held: bool, lease: float | None, fence: int | None
) -> Iterator[str]:
    if not held:
        yield f"lock {name!r} is free (key {key});"
        yield "no fence issued yet" if fence is None else f"last fence {fence}"
        return
    yield f"lock {name!r} is held (key {key});"
    if lease is None:
        yield "its key has no expiry (not set by aiolock?);"
    else:
        yield f"lease ends in {lease:.3f} s;"
    yield "no fence" if fence is None else f"fence {fence}"
