"""``aiolock demo``: the contention demo of :mod:`aiolock._demo`, with the command's statuses.

The demo itself (its workers, its own server, its summary) is
:mod:`aiolock._demo`; this module checks the URL it is given and turns what
goes wrong into an ``aiolock:`` line and an exit status.
"""

from __future__ import annotations

import os
import sys

from .._demo import DemoConfig, run_demo
from ._client import SERVER_ERRORS, check_url
from ._codes import EX_UNAVAILABLE, EX_USAGE
from ._urls import bad_url_message, unavailable_message

__all__ = ["demo"]


def demo(
    *, url: str | None, processes: int, coroutines: int, rounds: int, hold: float, name: str
) -> int:
    """Run the demo; return its exit status.

    Args:
        url: the server (default: ``$AIOLOCK_URL``, else a throwaway server of its own).
        processes: worker processes.
        coroutines: coroutines per process.
        rounds: acquisitions per coroutine.
        hold: seconds each acquisition holds the lock.
        name: the lock's name.

    Returns:
        0 for every acquisition done and no overlap, 1 for a failure, 2 for a
        bad URL, 69 if the server failed or none could be started.
    """
    from ..testing import ServerNotFoundError

    given = url or os.environ.get("AIOLOCK_URL")
    if given:
        try:
            check_url(given)
        except ValueError as exc:
            print(bad_url_message(exc, given), file=sys.stderr, flush=True)
            return EX_USAGE

    config = DemoConfig(
        url=url,
        processes=processes,
        coroutines=coroutines,
        rounds=rounds,
        hold=hold,
        name=name,
    )
    try:
        return run_demo(config)
    except ServerNotFoundError as exc:  # no URL, and no server binary to start one
        print(f"aiolock: cannot start a server for the demo: {exc}", file=sys.stderr, flush=True)
        return EX_UNAVAILABLE
    except SERVER_ERRORS as exc:
        shown = url or os.environ.get("AIOLOCK_URL") or ""
        print(unavailable_message(exc, shown), file=sys.stderr, flush=True)
        return EX_UNAVAILABLE
