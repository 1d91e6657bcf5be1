"""What the benchmarks measure with: a private server, command counters, percentiles, overlaps.

* :func:`embedded_server` starts a private Valkey on loopback and always stops it;
* :class:`CountingConnection` counts the commands a client sends (round trips);
* :func:`server_commands` sums ``INFO commandstats`` (every command the server ran);
* :func:`percentiles` and :func:`count_overlaps` turn samples into figures, and
  :func:`fmt_ms` prints a duration in a table.

How a benchmark runs and reports (its options, tables, JSON, chart and exit
status) is :mod:`benchmarks._runner`'s; what it measures is
:mod:`benchmarks._subjects`'.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

from redis.asyncio import Connection, Redis
from redis.typing import EncodableT

from aiolock.testing import RedisServer

__all__ = [
    "PERCENTILES",
    "CountingConnection",
    "count_overlaps",
    "embedded_server",
    "fmt_ms",
    "percentiles",
    "server_commands",
]

#: The percentiles ``ab`` prints, plus the maximum (100).
PERCENTILES: tuple[int, ...] = (50, 66, 75, 80, 90, 95, 98, 99, 100)


@contextlib.contextmanager
def embedded_server() -> Iterator[RedisServer]:
    """Start a private server on a free loopback port; stop it on exit, even on error.

    Yields:
        The running server (``server.url`` is its address).
    """
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class CountingConnection(Connection):
    """A ``redis.asyncio.Connection`` that counts every command it packs for sending.

    Pass it as ``connection_class=`` to ``Redis.from_url``. The count is
    class-level (one per process, over all clients using the class), so
    benchmarks take deltas around the measured section. Pipelines count each
    command; commands run inside scripts are not seen (they never cross the
    wire); connection handshakes (``HELLO``, ``CLIENT SETINFO``) are.
    """

    #: Commands packed for sending since the last :meth:`reset`.
    sent: ClassVar[int] = 0

    @classmethod
    def reset(cls) -> None:
        """Set the counter back to zero."""
        CountingConnection.sent = 0

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        """Count one command, then pack it as usual.

        Args:
            *args: the command and its arguments.

        Returns:
            The packed command.
        """
        CountingConnection.sent += 1
        return super().pack_command(*args)


async def server_commands(client: Redis) -> int:
    """Return the total of ``calls`` over ``INFO commandstats`` on the server.

    Includes commands run inside scripts and those of every client. The
    ``INFO`` command issuing this query counts too (once per call, after the
    reply is built on most servers); benchmarks use deltas.

    Args:
        client: any client of the server.

    Returns:
        The number of commands the server has run since its start or the
        last ``CONFIG RESETSTAT``.
    """
    stats: dict[str, Any] = await client.info("commandstats")
    total = 0
    for value in stats.values():
        if isinstance(value, dict) and "calls" in value:
            total += int(value["calls"])
    return total


def percentiles(values: Sequence[float], points: Sequence[int] = PERCENTILES) -> dict[int, float]:
    """Return nearest-rank percentiles of ``values``, like ``ab`` does.

    Args:
        values: the samples, in any order.
        points: the percentiles wanted, each in 1..100 (100 is the maximum).

    Returns:
        ``{point: value}``; every value is NaN when there are no samples.
    """
    if not values:
        return dict.fromkeys(points, math.nan)
    ordered = sorted(values)
    count = len(ordered)
    result: dict[int, float] = {}
    for point in points:
        rank = max(1, math.ceil(point / 100 * count))
        result[point] = ordered[min(rank, count) - 1]
    return result


def count_overlaps(intervals: Iterable[tuple[float, float]]) -> int:
    """Count holdings that began before an earlier holding ended.

    Args:
        intervals: ``(acquired_at, released_at)`` pairs on one monotonic clock
            (``time.monotonic()`` is system-wide on Linux, so pairs from
            several processes compare).

    Returns:
        How many intervals, in order of their start, start before the latest
        end seen so far: 0 means the holders never overlapped.
    """
    overlaps = 0
    latest_end = -math.inf
    for start, end in sorted(intervals):
        if start < latest_end:
            overlaps += 1
        latest_end = max(latest_end, end)
    return overlaps


def fmt_ms(seconds: float, digits: int = 2) -> str:
    """Format seconds as milliseconds for a table (``"-"`` for NaN).

    Args:
        seconds: the duration.
        digits: digits after the decimal point.

    Returns:
        The formatted number of milliseconds.
    """
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:.{digits}f}"
