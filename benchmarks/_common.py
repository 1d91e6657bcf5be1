"""Helpers shared by the benchmarks: CLI options, event loop, server, counters, output.

Every benchmark uses the same pieces:

* :func:`add_common_args` adds ``--quick``, ``--out`` and ``--loop``;
* :func:`run` runs the benchmark's coroutine on the chosen event loop;
* :func:`embedded_server` starts a private Valkey on loopback and always stops it;
* :class:`CountingConnection` counts the commands a client sends (round trips);
* :func:`server_commands` sums ``INFO commandstats`` (every command the server ran);
* :func:`percentiles`, :func:`count_overlaps`, :func:`print_table`, :func:`write_json`
  and :func:`out_dir` turn measurements into reports;
* :func:`mark` labels a target's line (``PASS``, ``FAIL``, or ``info`` at the
  ``--quick`` size, which judges no target) and :func:`finish` gives the exit
  status: 1 for a failed correctness check, :data:`EXIT_MISSED` for a missed target.

Results go to ``benchmarks/out/`` (untracked) unless ``--out`` says otherwise;
``--out benchmarks/results`` (``make bench-update``) rewrites the committed ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

from redis.asyncio import Connection, Redis
from redis.typing import EncodableT

from aiolock.testing import RedisServer

__all__ = [
    "DEFAULT_OUT",
    "EXIT_MISSED",
    "PERCENTILES",
    "RESULTS",
    "CountingConnection",
    "add_common_args",
    "count_overlaps",
    "default_loop",
    "embedded_server",
    "finish",
    "fmt_ms",
    "mark",
    "out_dir",
    "percentiles",
    "print_table",
    "repro_command",
    "run",
    "server_commands",
    "write_json",
]

T = TypeVar("T")

#: Where results go unless ``--out`` says otherwise: untracked (in .gitignore).
DEFAULT_OUT = Path(__file__).resolve().parent / "out"

#: The committed results the README and the docs show: ``--out`` names it to rewrite them.
RESULTS = Path(__file__).resolve().parent / "results"

#: The exit status of a run that checked itself and found nothing wrong, but missed a
#: target (a ``FAIL`` line). 1 is a failed correctness check or an error; 2 is bad usage.
EXIT_MISSED: Final = 3

#: The percentiles ``ab`` prints, plus the maximum (100).
PERCENTILES: tuple[int, ...] = (50, 66, 75, 80, 90, 95, 98, 99, 100)


def default_loop() -> str:
    """Return ``"uvloop"`` when uvloop is importable, else ``"asyncio"``."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Add the options every benchmark takes: ``--quick``, ``--out`` and ``--loop``.

    Args:
        parser: the benchmark's parser.
    """
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: finishes in a few seconds (smoke test); too small to judge the "
        "targets, which are shown as info",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"directory for the .png and .json results (default: {DEFAULT_OUT}, untracked; "
        f"{RESULTS} holds the committed ones)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default=default_loop(),
        help="event loop implementation (default: uvloop if installed)",
    )


def run(main: Callable[[], Coroutine[Any, Any, T]], loop: str) -> T:
    """Run ``main()`` to completion on a fresh event loop of the chosen kind.

    Args:
        main: a coroutine function taking no arguments.
        loop: ``"asyncio"`` or ``"uvloop"``.

    Returns:
        What ``main()`` returned.

    Raises:
        ValueError: ``loop`` is not one of the two names.
    """
    if loop == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    elif loop == "asyncio":
        factory = asyncio.new_event_loop
    else:
        raise ValueError(f"loop must be 'asyncio' or 'uvloop', got {loop!r}")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


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


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a table with rich.

    Args:
        title: the table's title.
        columns: the column headers; all but the first are right-aligned.
        rows: the cells, turned into text with ``str``.
    """
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    Console(width=max(120, len(columns) * 14)).print(table)


def _json_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _finite(value: object) -> object:
    """Replace NaN and infinities (not valid JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as indented JSON (NaN and infinities become ``null``).

    Args:
        path: the file to write; its directory must exist.
        data: dicts, lists, numbers, strings, ``Path`` objects.
    """
    path.write_text(json.dumps(_finite(data), indent=2, default=_json_default) + "\n")


def out_dir(args: argparse.Namespace) -> Path:
    """Return ``args.out``, creating the directory if needed.

    Args:
        args: parsed options from a parser given :func:`add_common_args`.

    Returns:
        The output directory.
    """
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def repro_command(module: str, argv: Sequence[str] | None = None) -> str:
    """Return the shell command that reruns a benchmark with the same options.

    Args:
        module: the benchmark's module name, e.g. ``"benchmarks.contention"``.
        argv: the options it was given (``sys.argv[1:]`` when None).

    Returns:
        e.g. ``.venv/bin/python -m benchmarks.contention --quick``.
    """
    options = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([".venv/bin/python", "-m", module, *options])


class Stopwatch:
    """Measures wall time with ``time.perf_counter``: ``with Stopwatch() as sw: ...``."""

    def __init__(self) -> None:
        self.started = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.started


def mark(passed: bool, quick: bool) -> str:
    """The word a target's line starts with: ``PASS``, ``FAIL``, or ``info`` with ``--quick``.

    The ``--quick`` sizes are a smoke test: a handful of samples judges no target.
    """
    if quick:
        return "info"
    return "PASS" if passed else "FAIL"


def finish(
    module: str, argv: Sequence[str], chart: Path, data: Path, overlaps: int, missed: int = 0
) -> int:
    """Say where the results went and how to reproduce them; the exit status.

    Args:
        module: the benchmark's module name.
        argv: the options it was given.
        chart: the chart written.
        data: the JSON written.
        overlaps: holdings that overlapped (two holders at once).
        missed: targets missed (``FAIL`` lines; none is judged with ``--quick``).

    Returns:
        1 if any holdings overlapped, else :data:`EXIT_MISSED` if a target was
        missed, else 0.
    """
    print(f"wrote {chart} and {data}")
    print(f"reproduce: {repro_command(module, argv)}")
    if overlaps:
        print(f"ERROR: {overlaps} overlapping holdings (two holders at once)", file=sys.stderr)
        return 1
    if missed:
        print(f"FAIL: {missed} target(s) missed (see the FAIL lines above)", file=sys.stderr)
        return EXIT_MISSED
    return 0
