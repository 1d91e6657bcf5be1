"""Compare aiolock at a git revision with the working tree's, in one run.

``python -m benchmarks.compare --base REV [--bench contention,handoff,redlock,scale,instructions]
[--rounds N] [--quick]`` exports the ``aiolock`` package of revision ``REV``
(default ``HEAD``) into a temporary directory (``git archive REV aiolock``),
then runs each chosen benchmark ``N`` times against each copy of aiolock,
interleaved: for every round and benchmark, once against ``REV`` (*base*) then
once against the working tree (*new*). Both sides run the working tree's
``benchmarks`` package; only ``import aiolock`` differs. Each run is its own
subprocess (``python -P`` with ``PYTHONPATH`` naming the intended copy first),
which prints the ``aiolock.__file__`` it imported: a run that imported the
other copy is an error. Each run writes its JSON to a temporary directory (never
to ``benchmarks/results/``), from which the headline figures are read:

* contention: W1 both ways (reused and fresh): each subject's cycle in us and
  its median ratio to the floor, aiolock fresh over redis-py's fresh ``Lock``;
  W2-W4: aiolock's acquisitions/s, its ratio to the floor's W1 rate, its p99 wait;
* handoff: aiolock's p50 hand-off (ms, and in PING round trips) per variant and
  number of waiters;
* redlock: per aiolock subject, the uncontended acquire and cycle as ratios to
  the floor's, and the throughput (and its ratio to the floor's);
* scale: per N held, losses, errors, server and client CPU, bytes per lock and
  commands/s; per waiters run, acquisitions/s, errors and what waiting costs the
  server; per number of holders, the server's CPU of one acquire + release;
* instructions: the client's instructions per W1 cycle (aiolock, and redis-py's
  ``Lock`` as the control), per round of two hand-offs and per acquisition
  handed over between tasks of one process, counted by callgrind
  (needs valgrind): a count does not drift with the machine's load, so one
  round settles a difference a time cannot;
* every benchmark (that holds locks concurrently): its overlaps (two holders at
  once; must be 0).

The table gives, per figure, the median of the base runs, the median of the
new runs and new/base, and which way is better. The temporary directory is
removed at the end; every run is bounded (``--run-timeout``), and so is the
whole comparison (``--max-minutes``: a run still going then is stopped, no
further run starts, and the table shows what was measured). A run that times
out is interrupted like Ctrl-C (its server stops), then its process group killed.

Examples::

    .venv/bin/python -m benchmarks.compare --quick                 # about 2 minutes
    .venv/bin/python -m benchmarks.compare --bench contention --workload W1 --rounds 5
    .venv/bin/python -m benchmarks.compare --base v0.1.0 --rounds 3 --json /tmp/compare.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ._runner import EXIT_MISSED, default_loop, print_table, write_json
from ._subjects import AIOLOCK, FLOOR, REDLOCK, SET_DEL_FLOOR, W1, Library
from .handoff import VARIANTS

MODULE: Final = "benchmarks.compare"
#: The repository whose working tree is compared (the one holding this package).
ROOT: Final = Path(__file__).resolve().parent.parent
#: The benchmarks that can be compared, in the order they run.
BENCHES: Final = ("contention", "handoff", "redlock", "seckill", "scale", "instructions")
#: The longest one run may take, by benchmark (full size; ``--quick`` runs get 180 s).
RUN_TIMEOUT: Final = {
    "contention": 900.0,
    "handoff": 900.0,
    "redlock": 600.0,
    "seckill": 900.0,
    "scale": 1200.0,
    "instructions": 1200.0,
}
#: The same with ``--quick``: 180 s, but for the benchmarks named here.
QUICK_RUN_TIMEOUT: Final = 180.0
QUICK_RUN_TIMEOUTS: Final = {"instructions": 600.0}
#: What each run executes: report the aiolock it imported, then run the benchmark.
_CHILD: Final = """\
import importlib, sys
import aiolock
print("compare: aiolock", aiolock.__version__, "from", aiolock.__file__, flush=True)
sys.exit(importlib.import_module("benchmarks." + sys.argv[1]).main(sys.argv[2:]))
"""
_MARKER: Final = "compare: aiolock "


# -- exporting a revision ------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)  # noqa: S607


def resolve(rev: str) -> str:
    """Return the commit ``rev`` names (40 hex digits).

    Raises:
        SystemExit: ``rev`` names no commit of this repository.
    """
    done = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode:
        raise SystemExit(f"compare: {rev!r} is not a commit of {ROOT}")
    return done.stdout.decode().strip()


def export(commit: str, into: Path) -> Path:
    """Write the ``aiolock`` package of ``commit`` under ``into``; return ``into/aiolock``.

    Raises:
        SystemExit: git could not archive it (no ``aiolock`` at that commit).
    """
    done = _git("archive", "--format=tar", commit, "aiolock")
    if done.returncode:
        raise SystemExit(f"compare: git archive {commit} aiolock failed: {done.stderr.decode()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+ (and 3.12+)
            archive.extractall(into, filter="data")
        else:  # our own git archive of our own files: nothing to filter out
            archive.extractall(into)  # noqa: S202
    package = into / "aiolock"
    if not (package / "__init__.py").is_file():
        raise SystemExit(f"compare: {commit} has no aiolock/__init__.py")
    return package


def working_tree_changes() -> int:
    """How many paths under ``aiolock/`` differ from HEAD in the working tree (untracked too)."""
    done = _git("status", "--porcelain", "--", "aiolock")
    return len(done.stdout.decode().splitlines()) if done.returncode == 0 else -1


# -- one run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One copy of aiolock: its name in the table and the directory holding its package."""

    name: str
    label: str
    path: Path  # the directory that contains aiolock/


@dataclass
class Run:
    """One benchmark run against one side."""

    bench: str
    side: str
    index: int
    seconds: float = 0.0
    code: int | None = None  # None: it timed out
    imported: str = ""
    data: dict[str, Any] | None = None
    problem: str = ""


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End a run's process group: interrupt (its server stops), then kill."""
    for sig, grace in ((signal.SIGINT, 15.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)


def run_one(
    bench: str,
    side: Side,
    index: int,
    options: Sequence[str],
    workdir: Path,
    timeout: float,
) -> Run:
    """Run ``bench`` once against ``side``'s aiolock; read its JSON back.

    Args:
        bench: ``contention``, ``handoff`` or ``redlock``.
        side: which aiolock ``import aiolock`` must find.
        index: the round (for names and messages).
        options: the benchmark's options (``--out`` is added).
        workdir: a scratch directory for this run (its cwd, output and log).
        timeout: seconds the run may take before it is stopped.

    Returns:
        The run, with ``data`` set when it ended with exit 0 (or 3, a target
        missed: its figures are what is compared), imported the
        intended aiolock and wrote its JSON.
    """
    workdir.mkdir(parents=True)
    out = workdir / "out"
    log = workdir / "log.txt"
    paths = dict.fromkeys([str(side.path), str(ROOT)])  # the side's aiolock first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [sys.executable, "-P", "-c", _CHILD, bench, *options, "--out", str(out)]
    result = Run(bench, side.name, index)
    started = time.monotonic()
    with log.open("wb") as sink:
        # Its own session: a timeout ends the run with its server and worker processes.
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            result.code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            result.problem = f"timed out after {timeout:g} s"
        finally:
            _stop(process)
    result.seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    marker = next((line for line in text.splitlines() if line.startswith(_MARKER)), "")
    result.imported = marker.partition(" from ")[2]
    expected = (side.path / "aiolock" / "__init__.py").resolve()
    if not marker:
        result.problem = result.problem or "aiolock did not import"
    elif Path(result.imported).resolve() != expected:
        result.problem = f"imported {result.imported}, not {expected}"
    elif result.code not in (0, EXIT_MISSED) and not result.problem:
        result.problem = f"exit {result.code}"
    data_file = out / f"{bench}.json"
    if not result.problem and data_file.is_file():
        result.data = json.loads(data_file.read_text())
    elif not result.problem:
        result.problem = f"no {data_file.name} written"
    if result.problem:
        tail = "\n".join(f"    | {line}" for line in text.splitlines()[-25:])
        print(f"  {bench} {side.name} round {index + 1}: {result.problem}; its output ended:")
        print(tail, flush=True)
    return result


# -- headline figures ----------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One headline figure of one run."""

    name: str
    value: float
    unit: str  # "us", "ms", "x", "/s" or "" (a count)
    better: str  # "lower" or "higher"
    control: bool = False  # does not depend on aiolock: its new/base shows the noise


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


#: The labels of aiolock's subjects (the others are controls: they do not depend on aiolock).
_OURS: Final = {
    *(s.label for s in (*W1, *REDLOCK) if s.library is Library.AIOLOCK),
    *(v.label for v in VARIANTS if v.subject.library is Library.AIOLOCK),
}


def contention_figures(data: dict[str, Any]) -> list[Figure]:
    """W1 both ways, aiolock in W2-W4, overlaps."""
    figures: list[Figure] = []
    seen_floor = False
    for row in data.get("w1", []):
        subject = row["subject"]
        if subject == FLOOR.label:
            if seen_floor:
                continue
            seen_floor = True
            figures.append(Figure("W1 floor cycle", _num(row["cycle_us"]), "us", "lower", True))
            continue
        name = f"W1 {row['way']}: {subject}"
        control = subject not in _OURS
        figures.append(Figure(f"{name} cycle", _num(row["cycle_us"]), "us", "lower", control))
        figures.append(Figure(f"{name} / floor", _num(row["vs_floor"]), "x", "lower", control))
    ratios: dict[str, Any] = data.get("ratios", {})
    if "aiolock_fresh_w1_vs_redispy_fresh" in ratios:
        figures.append(
            Figure(
                "W1 fresh aiolock / redis-py",
                _num(ratios["aiolock_fresh_w1_vs_redispy_fresh"]),
                "x",
                "lower",
            )
        )
    for outcome in data.get("outcomes", []):
        workload = outcome["workload"]
        if workload == "W1" or outcome["subject"] != AIOLOCK.label:
            continue
        figures.append(
            Figure(f"{workload} aiolock acq/s", _num(outcome["acq_per_s"]), "/s", "higher")
        )
        share = ratios.get(f"aiolock_{workload.lower()}_rate_vs_floor_w1")
        if share is not None:
            figures.append(
                Figure(f"{workload} aiolock acq/s / floor W1", _num(share), "x", "higher")
            )
        figures.append(
            Figure(f"{workload} aiolock p99 wait", _num(outcome["wait_ms"]["99"]), "ms", "lower")
        )
        figures.append(
            Figure(f"{workload} aiolock failures", _num(outcome["failures"]), "", "lower")
        )
    figures.append(Figure("overlaps", _num(data.get("overlaps", math.nan)), "", "lower"))
    return figures


def handoff_figures(data: dict[str, Any]) -> list[Figure]:
    """aiolock's p50 hand-off per variant and waiters, in ms and in PING round trips."""
    figures = [Figure("PING RTT p50", _num(data["ping_rtt_ms"]["50"]), "ms", "lower", True)]
    for setting in data.get("settings", []):
        if setting["variant"] not in _OURS:
            continue
        name = f"{setting['variant']} N={setting['waiters']}"
        figures.append(Figure(f"{name} p50", _num(setting["handoff_ms"]["50"]), "ms", "lower"))
        figures.append(Figure(f"{name} p50 / RTT", _num(setting["p50_rtt"]), "x", "lower"))
        figures.append(
            Figure(
                f"{name} client cmd/hand-off",
                _num(setting["client_cmds_per_handoff"]),
                "",
                "lower",
            )
        )
    figures.append(Figure("overlaps", _num(data.get("overlaps", math.nan)), "", "lower"))
    return figures


def redlock_figures(data: dict[str, Any]) -> list[Figure]:
    """Per aiolock subject: uncontended acquire and cycle over the floor's; throughput."""
    subjects: dict[str, Any] = data["subjects"]
    floor = subjects[SET_DEL_FLOOR.label]
    figures = [
        Figure("floor acquire p50", _num(floor["acquire_ms"]["50"]), "ms", "lower", True),
        Figure("floor acq/s", _num(floor["acq_per_s"]), "/s", "higher", True),
    ]
    overlaps = 0.0
    for name, found in subjects.items():
        if name not in _OURS:
            continue
        acquire = _num(found["acquire_ms"]["50"]) / _num(floor["acquire_ms"]["50"])
        cycle = _num(found["cycle_ms"]["50"]) / _num(floor["cycle_ms"]["50"])
        rate = _num(found["acq_per_s"])
        figures += [
            Figure(f"{name} acquire p50 / floor", acquire, "x", "lower"),
            Figure(f"{name} cycle p50 / floor", cycle, "x", "lower"),
            Figure(f"{name} acq/s", rate, "/s", "higher"),
            Figure(f"{name} acq/s / floor", rate / _num(floor["acq_per_s"]), "x", "higher"),
        ]
        overlaps += _num(found["overlaps"])
    figures.append(Figure("overlaps", overlaps, "", "lower"))
    return figures


def seckill_figures(data: dict[str, Any]) -> list[Figure]:
    """Per row (the default first): mean and p99 request time, oversold units."""
    figures: list[Figure] = []
    for row in data.get("rows", []):
        name = row["key"]
        figures.append(Figure(f"{name} mean", _num(row["mean_ms"]), "ms", "lower"))
        figures.append(Figure(f"{name} p99", _num(row["percentiles_ms"]["99"]), "ms", "lower"))
        figures.append(Figure(f"{name} oversold", _num(row["oversold"]), "", "lower"))
    return figures


def instructions_figures(data: dict[str, Any]) -> list[Figure]:
    """Client instructions per unit of each workload (redis-py's: the control); W1's ratio."""
    figures = [
        Figure(
            f"{row['workload']} instructions/{row['unit']}",
            _num(row["per_unit"]),
            "Ir",
            "lower",
            "redis-py" in row["workload"],
        )
        for row in data.get("rows", [])
    ]
    ratio = data.get("ratios", {}).get("aiolock_w1_vs_redispy")
    if ratio is not None:
        figures.append(Figure("W1 aiolock / redis-py Lock", _num(ratio), "x", "lower"))
    return figures


def scale_figures(data: dict[str, Any]) -> list[Figure]:
    """Held: losses, CPU, memory and calls per N; waiters: rates, errors; cost per holders."""
    figures: list[Figure] = []
    for row in data.get("held", []):
        name = f"held {row['count']}{' cluster' if row['cluster'] else ''}"
        errors = sum(row["release_errors"].values()) + row["acquire_failures"]
        figures += [
            Figure(f"{name} lost", _num(row["lost"]), "", "lower"),
            Figure(f"{name} errors", _num(errors), "", "lower"),
            Figure(f"{name} server CPU", _num(row["server_cpu_share"]) * 100, "%", "lower"),
            Figure(f"{name} client CPU", _num(row["client_cpu_share"]) * 100, "%", "lower"),
            Figure(f"{name} bytes/lock", _num(row["bytes_per_lock"]), "B", "lower"),
            Figure(f"{name} commands/s", _num(row["commands_per_s"]), "/s", "lower"),
        ]
    for row in data.get("waiters", []):
        name = f"waiters {row['kind']} {row['pool']}"
        figures += [
            Figure(f"{name} acq/s", _num(row["acquisitions_per_s"]), "/s", "higher"),
            Figure(f"{name} errors", _num(row["error_count"]), "", "lower"),
            Figure(f"{name} waiting cmd/s", _num(row["waiting_commands_per_s"]), "/s", "lower"),
        ]
    for row in data.get("cost", []):
        name = f"cost {row['kind']} at {row['holders']} holders"
        figures.append(Figure(f"{name}", _num(row["us_per_cycle"]), "us", "lower"))
    return figures


FIGURES: Final[dict[str, Callable[[dict[str, Any]], list[Figure]]]] = {
    "contention": contention_figures,
    "handoff": handoff_figures,
    "redlock": redlock_figures,
    "seckill": seckill_figures,
    "scale": scale_figures,
    "instructions": instructions_figures,
}


# -- the table -----------------------------------------------------------------------------


@dataclass
class Row:
    """One figure of one benchmark over every run of both sides."""

    bench: str
    name: str
    unit: str
    better: str
    control: bool
    base: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)

    @staticmethod
    def _median(values: Sequence[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return statistics.median(finite) if finite else math.nan

    @property
    def base_median(self) -> float:
        """The median of the base runs' values."""
        return self._median(self.base)

    @property
    def new_median(self) -> float:
        """The median of the new runs' values."""
        return self._median(self.new)

    @property
    def ratio(self) -> float:
        """new / base (NaN if base is 0 or missing)."""
        base, new = self.base_median, self.new_median
        if base == 0:
            return 1.0 if new == 0 else math.nan
        return new / base


def _fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    if unit == "us":
        return f"{value:.1f} us"
    if unit == "ms":
        return f"{value:.3f} ms"
    if unit == "x":
        return f"{value:.3f}x"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "Ir":
        return f"{value:,.0f}"
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


def _verdict(row: Row) -> str:
    """Which side the figure favours: new/base beyond 2% in the better or the worse way."""
    ratio = row.ratio
    if not math.isfinite(ratio) or abs(ratio - 1) < 0.02:
        return "control" if row.control else ""
    improved = ratio < 1 if row.better == "lower" else ratio > 1
    verdict = "better" if improved else "worse"
    return f"({verdict}: noise)" if row.control else verdict


def collect(runs: Sequence[Run]) -> list[Row]:
    """Gather the figures of every successful run into rows, in first-seen order."""
    rows: dict[tuple[str, str], Row] = {}
    for run in runs:
        if run.data is None:
            continue
        for figure in FIGURES[run.bench](run.data):
            row = rows.setdefault(
                (run.bench, figure.name),
                Row(run.bench, figure.name, figure.unit, figure.better, figure.control),
            )
            (row.base if run.side == "base" else row.new).append(figure.value)
    return list(rows.values())


def print_rows(rows: Sequence[Row], runs: Sequence[Run], base: Side, new: Side) -> None:
    """One table per benchmark: base median, new median, new/base."""
    for bench in dict.fromkeys(row.bench for row in rows):
        done = {
            side: sum(1 for r in runs if r.bench == bench and r.side == side and r.data)
            for side in ("base", "new")
        }
        tried = {
            side: sum(1 for r in runs if r.bench == bench and r.side == side)
            for side in ("base", "new")
        }
        print_table(
            f"{bench}: median of {done['base']}/{tried['base']} base runs ({base.label}) "
            f"and {done['new']}/{tried['new']} new runs ({new.label})",
            ["figure", "better", "base", "new", "new/base", "change"],
            [
                [
                    row.name,
                    row.better,
                    _fmt(row.base_median, row.unit),
                    _fmt(row.new_median, row.unit),
                    f"{row.ratio:.3f}" if math.isfinite(row.ratio) else "-",
                    _verdict(row),
                ]
                for row in rows
                if row.bench == bench
            ],
        )
    print(
        "  new/base: the ratio of the medians; change: beyond 2% one way or the other. "
        "Control figures (the floor, redis-py, the PING round trip) do not depend on "
        "aiolock: their new/base shows how much the machine drifted between runs"
    )


# -- main ----------------------------------------------------------------------------------


def _options(bench: str, args: argparse.Namespace) -> list[str]:
    options = ["--loop", args.loop]
    if args.quick:
        options.append("--quick")
    if bench == "contention":
        for workload in args.workload or ():
            options += ["--workload", workload]
    return options


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="aiolock-compare-") as name:
        yield Path(name)


def main(argv: Sequence[str] | None = None) -> int:
    """Compare aiolock at ``--base`` with the working tree's; print the table.

    Args:
        argv: command-line options (``sys.argv[1:]`` when None).

    Returns:
        0 if every run ended well with no overlap, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Run benchmarks alternately against aiolock at a git revision and the "
        "working tree's aiolock; print both sides' headline figures.",
    )
    parser.add_argument("--base", default="HEAD", help="git revision to compare with (HEAD)")
    parser.add_argument(
        "--bench",
        default="contention,handoff,redlock",
        help="comma-separated benchmarks to run (default contention,handoff,redlock)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="runs per side and benchmark (3; 2 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="run each benchmark with --quick")
    parser.add_argument(
        "--workload",
        action="append",
        choices=("W1", "W2", "W3", "W4"),
        help="contention: run only this workload (repeatable), e.g. --workload W1",
    )
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default=default_loop(), help="event loop"
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=None,
        help="seconds one run may take (contention/handoff 900, redlock 600; 180 with --quick)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop after this many minutes (default 90, 15 with --quick)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    benches = [b.strip() for b in args.bench.split(",") if b.strip()]
    unknown = [b for b in benches if b not in BENCHES]
    if unknown or not benches:
        parser.error(f"--bench takes names among {', '.join(BENCHES)}; got {args.bench!r}")
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    budget = 60 * (args.max_minutes if args.max_minutes is not None else (15 if args.quick else 90))
    commit = resolve(args.base)
    changed = working_tree_changes()
    runs: list[Run] = []
    started = time.monotonic()
    with _scratch() as scratch:
        exported = export(commit, scratch / "base")
        base = Side("base", f"{args.base} = {commit[:9]}", exported.parent)
        new = Side("new", f"working tree, {changed} paths changed under aiolock/", ROOT)
        print(
            f"compare: base = aiolock of {base.label} (exported to {base.path}); "
            f"new = {new.label} ({ROOT}); {', '.join(benches)}; {rounds} round(s); "
            f"loop={args.loop}{', quick' if args.quick else ''}",
            flush=True,
        )
        total = rounds * len(benches) * 2
        out_of_time = False
        for index in range(rounds):
            for bench in benches:
                for side in (base, new):
                    left = budget - (time.monotonic() - started)
                    if left <= 0:
                        out_of_time = True
                        break
                    limit = args.run_timeout or (
                        QUICK_RUN_TIMEOUTS.get(bench, QUICK_RUN_TIMEOUT)
                        if args.quick
                        else RUN_TIMEOUT[bench]
                    )
                    run = run_one(
                        bench,
                        side,
                        index,
                        _options(bench, args),
                        scratch / "runs" / f"{index}-{bench}-{side.name}",
                        min(limit, left),
                    )
                    runs.append(run)
                    status = "ok" if run.data is not None else f"FAILED ({run.problem})"
                    print(
                        f"  [{len(runs)}/{total}] round {index + 1} {bench:<10} {side.name:<4} "
                        f"{run.seconds:6.1f} s  {status}  aiolock from {run.imported or '?'}",
                        flush=True,
                    )
        if out_of_time:
            print(f"compare: out of time after {len(runs)} of {total} runs (--max-minutes)")
    rows = collect(runs)
    print_rows(rows, runs, base, new)
    failed = [r for r in runs if r.data is None]
    overlaps = sum(v for row in rows if row.name == "overlaps" for v in row.base + row.new)
    print(
        f"compare: {len(runs) - len(failed)}/{len(runs)} runs ok in "
        f"{time.monotonic() - started:.0f} s; overlaps {overlaps:g}"
    )
    options = list(sys.argv[1:] if argv is None else argv)
    print(f"reproduce: {shlex.join(['.venv/bin/python', '-m', MODULE, *options])}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(
            args.json,
            {
                "benchmark": "compare",
                "base": {"rev": args.base, "commit": commit},
                "new": {"path": ROOT, "paths_changed_under_aiolock": changed},
                "benches": benches,
                "rounds": rounds,
                "quick": args.quick,
                "loop": args.loop,
                "runs": [
                    {
                        "bench": r.bench,
                        "side": r.side,
                        "round": r.index + 1,
                        "seconds": r.seconds,
                        "exit": r.code,
                        "imported": r.imported,
                        "problem": r.problem,
                    }
                    for r in runs
                ],
                "figures": [
                    {
                        "bench": row.bench,
                        "figure": row.name,
                        "unit": row.unit,
                        "better": row.better,
                        "base": row.base,
                        "new": row.new,
                        "base_median": row.base_median,
                        "new_median": row.new_median,
                        "new_over_base": row.ratio,
                    }
                    for row in rows
                ],
            },
        )
        print(f"wrote {args.json}")
    return 1 if failed or overlaps else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
