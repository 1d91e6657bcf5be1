"""Waiting until a group of servers reaches a state, with their logs when it does not."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from ._resp import ReplyError
from ._server import RedisServer

_POLL_INTERVAL: Final = 0.05
_LOG_LINES_ON_ERROR: Final = 8


def log_tails(servers: Iterable[RedisServer]) -> str:
    """The last log lines of each server, under a ``--- host:port ---`` line."""
    parts = []
    for server in servers:
        tail = server.log_tail(_LOG_LINES_ON_ERROR) or "(empty log)"
        parts.append(f"--- {server.host}:{server.port} ---\n{tail}")
    return "\n".join(parts)


def wait_until(
    check: Callable[[], str | None],
    *,
    what: str,
    timeout: float,
    servers: Sequence[RedisServer],
    logs: Sequence[RedisServer] = (),
) -> None:
    """Poll ``check`` until it returns ``None``; otherwise it returns what is still missing.

    A ``check`` that raises :class:`OSError`, :class:`ValueError` or
    :class:`~aiolock.testing._resp.ReplyError` counts as not there yet.

    Raises:
        RuntimeError: One of ``servers`` exited, or ``timeout`` passed; the
            message ends with the last log lines of ``servers`` and ``logs``.
    """
    every_log = [*servers, *(server for server in logs if server not in servers)]
    deadline = time.monotonic() + timeout
    while True:
        for server in servers:
            if not server.running:
                raise RuntimeError(
                    f"{what}: the server on {server.host}:{server.port} exited; "
                    f"last log lines:\n{log_tails(every_log)}"
                )
        try:
            missing = check()
        except (OSError, ValueError, ReplyError) as exc:
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{what}: not reached within {timeout:g}s ({missing}); "
                f"last log lines:\n{log_tails(every_log)}"
            )
        time.sleep(_POLL_INTERVAL)
