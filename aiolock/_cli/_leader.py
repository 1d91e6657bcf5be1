"""``aiolock leader``: who leads an election, once or at every change.

``aiolock leader NAME`` prints the identity of the leader of the election
``NAME`` (:class:`~aiolock.Election`, or ``aiolock run --elect``) and exits
0, or prints nothing and exits 3 while nobody leads. ``--watch`` prints the
leader at once and a line at every change (``-`` while nobody leads), as
:meth:`Election.observe <aiolock.Election.observe>` reports them, until
SIGINT or SIGTERM (then it exits 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass
from typing import Final, TextIO

from .._election import Election
from ._client import Answered, asking
from ._codes import EX_FREE, EX_OK, EX_USAGE
from ._urls import DEFAULT_URL

__all__ = ["VACANT", "LeaderConfig", "show_leader"]

#: What ``--watch`` prints while nobody leads.
VACANT: Final = "-"


@dataclass(frozen=True)
class LeaderConfig:
    """What ``aiolock leader`` asks.

    Attributes:
        name: the election's name.
        url: the server's URL.
        cluster: connect with ``RedisCluster`` instead of ``Redis``.
        prefix: the key prefix.
        watch: print every change until a signal, not the leader once.
    """

    name: str
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "aiolock:"
    watch: bool = False


def show_leader(config: LeaderConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the election's leader (or every change of it); return the exit status.

    Returns:
        0 if someone leads (``--watch``: stopped by a signal), 3 if nobody
        leads, 69 if the server could not be asked, 2 for a bad name or URL.
    """
    return asyncio.run(
        _leader(config, sys.stdout if out is None else out, sys.stderr if err is None else err)
    )


async def _leader(config: LeaderConfig, out: TextIO, err: TextIO) -> int:
    try:
        async with asking(config.url, config.cluster, err) as client:
            try:
                election = Election(client, config.name, prefix=config.prefix)
            except (TypeError, ValueError) as exc:
                print(f"aiolock: {exc}", file=err)
                return EX_USAGE
            if config.watch:
                await _watch(election, out)
                return EX_OK
            leader = await election.leader()
    except Answered as answered:
        return answered.status
    if leader is None:
        return EX_FREE
    print(leader, file=out, flush=True)
    return EX_OK


async def _watch(election: Election, out: TextIO) -> None:
    """Print each change of leader until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # noqa: S101 - asyncio.run runs us in a task
    stops = (signal.SIGINT, signal.SIGTERM)
    for signum in stops:
        loop.add_signal_handler(signum, task.cancel)
    try:
        async with contextlib.aclosing(election.observe()) as changes:
            async for leader in changes:
                print(VACANT if leader is None else leader, file=out, flush=True)
    except asyncio.CancelledError:
        if not task.uncancel():
            return  # stopped by a signal
        raise
    finally:
        for signum in stops:
            loop.remove_signal_handler(signum)
