"""What every benchmark's ``main()`` shares: its options, its run, its report, its exit status.

A benchmark module keeps what is its own (its sizes, how it measures, the
rows of its tables and the drawing of its chart) and hands the rest to this
module:

* :class:`Benchmark` names it: ``python -m benchmarks.NAME`` writes
  ``NAME.json`` (and ``NAME.png``); :meth:`Benchmark.parser` makes its parser
  with the options every benchmark takes (:func:`add_common_args`: ``--quick``,
  ``--out``, ``--loop``);
* :class:`Session` is one run of it: it runs the benchmark's coroutine on the
  chosen event loop (:func:`run`), prints each target's line
  (:meth:`Session.judge`), draws the chart (:meth:`Session.chart`), writes the
  JSON (:meth:`Session.write_json`) and gives the exit status
  (:meth:`Session.finish`);
* :func:`print_table` prints a table, :func:`write_json` writes JSON (NaN
  becomes ``null``), :func:`in_turn` rotates the subjects from round to round.

The exit rule, the same for every benchmark: 1 when the run found something
wrong (two holders at once, a unit oversold, an error); else
:data:`EXIT_MISSED` (3) when it missed a target (a ``FAIL`` line); else 0. The
``--quick`` sizes are a smoke test: they judge no target (the lines say
``info``), only correctness. 2 is bad usage (argparse).

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
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_OUT",
    "EXIT_MISSED",
    "RESULTS",
    "Benchmark",
    "Session",
    "add_common_args",
    "default_loop",
    "in_turn",
    "mark",
    "overlapping",
    "print_table",
    "repro_command",
    "run",
    "write_json",
]

T = TypeVar("T")

#: Where results go unless ``--out`` says otherwise: untracked (in .gitignore).
DEFAULT_OUT: Final = Path(__file__).resolve().parent / "out"

#: The committed results the README and the docs show: ``--out`` names it to rewrite them.
RESULTS: Final = Path(__file__).resolve().parent / "results"

#: The exit status of a run that checked itself and found nothing wrong, but missed a
#: target (a ``FAIL`` line). 1 is a failed correctness check or an error; 2 is bad usage.
EXIT_MISSED: Final = 3


# -- options and the event loop ----------------------------------------------------------


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


def in_turn(items: Sequence[T], index: int) -> list[T]:
    """``items`` from the ``index``-th on, then the rest: round ``index``'s order.

    Rounds interleave the subjects, so that a burst of load elsewhere on the
    machine does not fall on one subject only; each round starts with the next
    subject in line, so that none always runs first.

    Args:
        items: the subjects, in their usual order.
        index: the round (any number: it is taken modulo ``len(items)``).

    Returns:
        The rotated list (empty for no items).
    """
    if not items:
        return []
    turn = index % len(items)
    return [*items[turn:], *items[:turn]]


# -- reports -------------------------------------------------------------------------------


def mark(passed: bool, quick: bool) -> str:
    """The word a target's line starts with: ``PASS``, ``FAIL``, or ``info`` with ``--quick``.

    The ``--quick`` sizes are a smoke test: a handful of samples judges no target.
    """
    if quick:
        return "info"
    return "PASS" if passed else "FAIL"


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


# -- one benchmark, one run ------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's name, which names its command and its files.

    Attributes:
        name: ``contention`` for ``python -m benchmarks.contention``, which
            writes ``contention.json`` and ``contention.png``.
        description: what its ``--help`` says first.
    """

    name: str
    description: str

    @property
    def module(self) -> str:
        """The module to run: ``benchmarks.NAME``."""
        return f"benchmarks.{self.name}"

    def parser(self) -> argparse.ArgumentParser:
        """A parser with the options every benchmark takes; the benchmark adds its own."""
        parser = argparse.ArgumentParser(
            prog=f"python -m {self.module}", description=self.description
        )
        add_common_args(parser)
        return parser

    def session(self, args: argparse.Namespace, argv: Sequence[str] | None) -> Session:
        """Start a run with the parsed options; its output directory is made now.

        Args:
            args: the options, parsed by a parser from :meth:`parser` (and checked).
            argv: the options as given (``sys.argv[1:]`` when None), for the
                command that reproduces the run.
        """
        return Session(self, args, list(sys.argv[1:] if argv is None else argv))


class Session:
    """One run of a benchmark: where it writes, what it judged, how it ends.

    Attributes:
        benchmark: the benchmark.
        args: its parsed options.
        argv: its options as given (a benchmark may add one, such as the random start it drew,
            so that :attr:`command` reproduces the run).
        quick: ``--quick``: no target is judged.
        loop: ``--loop``: the event loop's kind.
        out: the output directory (``--out``).
        written: the files written so far, in order.
        missed: the targets missed so far (never with ``--quick``).
    """

    def __init__(self, benchmark: Benchmark, args: argparse.Namespace, argv: list[str]) -> None:
        self.benchmark = benchmark
        self.args = args
        self.argv = argv
        self.quick: bool = args.quick
        self.loop: str = args.loop
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.written: list[Path] = []
        self.missed = 0

    @property
    def command(self) -> str:
        """The shell command that reruns this benchmark with the same options."""
        return repro_command(self.benchmark.module, self.argv)

    def header(self) -> dict[str, Any]:
        """The JSON's first fields: ``benchmark``, ``command``, ``loop`` and ``quick``."""
        return {
            "benchmark": self.benchmark.name,
            "command": self.command,
            "loop": self.loop,
            "quick": self.quick,
        }

    def banner(self, title: str) -> None:
        """Print ``TITLE (loop=..., quick)``: the run's first line."""
        print(f"{title} (loop={self.loop}{', quick' if self.quick else ''})", flush=True)

    def run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``main()`` on the chosen event loop (see :func:`run`)."""
        return run(main, self.loop)

    def judge(self, passed: bool, text: str) -> str:
        """Print a target's line (``PASS``, ``FAIL`` or ``info``); count it if missed.

        Args:
            passed: whether the run met the target.
            text: what the target is, and the figures that judge it.

        Returns:
            The line printed.
        """
        line = f"{mark(passed, self.quick)}  {text}"
        print(line)
        if not passed and not self.quick:
            self.missed += 1
        return line

    @contextlib.contextmanager
    def chart(self, *grid: int, **options: Any) -> Iterator[tuple[Figure, Any]]:
        """Draw the chart ``NAME.png``: a matplotlib figure, saved when the block ends.

        Args:
            *grid: rows and columns of axes, as for ``matplotlib.pyplot.subplots``.
            **options: its other options (``figsize=``, ``gridspec_kw=``).

        Yields:
            The figure and its axes.
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(*grid, **options)
        try:
            yield figure, axes
            figure.tight_layout()
            path = self.out / f"{self.benchmark.name}.png"
            figure.savefig(path, dpi=120)
            self.written.append(path)
        finally:
            plt.close(figure)

    def write_json(self, data: dict[str, Any]) -> Path:
        """Write ``NAME.json`` (see :func:`write_json`); return its path."""
        path = self.out / f"{self.benchmark.name}.json"
        write_json(path, data)
        self.written.append(path)
        return path

    def finish(self, *, broken: str = "", missed: str = "", passed: str = "") -> int:
        """Say what was written and how to reproduce it; apply the exit rule.

        Args:
            broken: what the run found wrong (an overlap, a unit oversold, an
                error), if anything: printed as ``ERROR: ...``, and the status is 1.
            missed: what the run missed, if anything (by default, the count of
                the targets :meth:`judge` found missed): printed as ``FAIL: ...``
                unless ``--quick``, and the status is :data:`EXIT_MISSED`.
            passed: printed when the status is 0, if given.

        Returns:
            The exit status: 1, :data:`EXIT_MISSED` or 0.
        """
        print(f"wrote {' and '.join(str(path) for path in self.written)}")
        print(f"reproduce: {self.command}")
        if not missed and self.missed:
            missed = f"{self.missed} target(s) missed (see the FAIL lines above)"
        if broken:
            print(f"ERROR: {broken}", file=sys.stderr)
            return 1
        if missed and not self.quick:
            print(f"FAIL: {missed}", file=sys.stderr)
            return EXIT_MISSED
        if passed:
            print(passed)
        return 0


def overlapping(overlaps: int) -> str:
    """What :meth:`Session.finish` says of ``overlaps`` holdings that overlapped ("" for none)."""
    return f"{overlaps} overlapping holdings (two holders at once)" if overlaps else ""
