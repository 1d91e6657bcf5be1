"""The benchmarks still run: each one, at its ``--quick`` size, against its own server.

Speed is not asserted here (that is what the benchmarks report); these
tests only prove that every benchmark runs to the end, checks its own
correctness (a benchmark exits 1 on an overlap or an oversold unit), and
writes its table data and chart.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkout import ROOT

#: CPU-heavy (other processes): `make test` runs these after the others, two at a time.
pytestmark = pytest.mark.heavy

#: The committed results (the docs' charts): only ``--out benchmarks/results`` writes there.
RESULTS = ROOT / "benchmarks" / "results"
#: Where a run without ``--out`` writes (untracked).
DEFAULT_OUT = ROOT / "benchmarks" / "out"
#: The exit status of a benchmark that missed a target (and found nothing wrong).
EXIT_MISSED = 3


def run_module(label: str, module: str, *args: str, timeout: float) -> None:
    """``python -m module args`` from the checkout; it must exit 0 (else its output's tail)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{label} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "name", ["contention", "handoff", "seckill", "redlock", "family", "multi", "failover"]
)
def test_benchmark_runs_quick_and_checks_itself(name: str, tmp_path: Path) -> None:
    """`python -m benchmarks --quick --only NAME` exits 0 and writes NAME.json and NAME.png."""
    run_module(name, "benchmarks", "--quick", "--only", name, "--out", str(tmp_path), timeout=170)
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data, f"{name}.json is empty"
    assert (tmp_path / f"{name}.png").stat().st_size > 1000


def _in_git_checkout() -> bool:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.mark.timeout(180)
@pytest.mark.skipif(not _in_git_checkout(), reason="needs a git checkout with a HEAD commit")
def test_compare_runs_w1_against_head(tmp_path: Path) -> None:
    """`python -m benchmarks.compare` runs W1 against HEAD's and the working tree's aiolock."""
    out = tmp_path / "compare.json"
    run_module(
        "compare",
        *("benchmarks.compare", "--quick", "--bench", "contention", "--workload", "W1"),
        *("--rounds", "1", "--json", str(out)),
        timeout=170,
    )
    data = json.loads(out.read_text())
    runs = {run["side"]: run for run in data["runs"]}
    assert set(runs) == {"base", "new"}
    assert runs["new"]["imported"] == str(ROOT / "aiolock" / "__init__.py")
    assert runs["base"]["imported"] != runs["new"]["imported"]
    assert not Path(runs["base"]["imported"]).exists(), "the exported copy was not removed"
    figures = {figure["figure"]: figure for figure in data["figures"]}
    for name in ("W1 reused: aiolock / floor", "W1 fresh: aiolock fresh / floor"):
        assert len(figures[name]["base"]) == len(figures[name]["new"]) == 1


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_the_instructions_benchmark_counts_a_workload_by_difference(tmp_path: Path) -> None:
    """benchmarks.instructions counts W1's client instructions per cycle, by difference.

    (One workload: each run under valgrind starts an interpreter for about 20 s.)
    """
    run_module(
        "instructions",
        *("benchmarks.instructions", "--quick", "--workload", "W1 aiolock"),
        *("--out", str(tmp_path)),
        timeout=170,
    )
    data = json.loads((tmp_path / "instructions.json").read_text())
    (row,) = data["rows"]
    assert row["workload"] == "W1 aiolock"
    assert row["large"] > row["small"]
    assert row["large_total"] > row["small_total"]
    # An acquire and a release cost the client hundreds of thousands of instructions
    # (about 540k on uvloop here); the start of the interpreter (above a billion) cancels.
    assert 100_000 < row["per_unit"] < 5_000_000, row
    assert row["per_unit"] == pytest.approx(
        (row["large_total"] - row["small_total"]) / (row["large"] - row["small"])
    )
    assert data["ratios"] == {}  # (no baseline counted)


@pytest.mark.timeout(120)
def test_the_waiting_benchmark_runs_and_its_figures_hold(tmp_path: Path) -> None:
    """benchmarks.waiting with 40 clients: at most 1 command/s per waiter, 12 per hand-off.

    The queue's waiting cost (docs/server-queue.md) at a small size: every waiter is
    queued, they refresh their entries and nothing else, and the lock then
    passes through all of them without overlap, leaving nothing.
    """
    run_module(
        "waiting",
        *("benchmarks.waiting", "--quick", "--clients", "40", "--processes", "2"),
        *("--window", "1.5", "--out", str(tmp_path)),
        timeout=110,
    )
    data = json.loads((tmp_path / "waiting.json").read_text())
    assert data["clients"] == 40
    assert data["waiting_commands_per_s_per_client"] <= 1.0
    assert data["commands_per_handoff"] <= 12.0
    assert data["overlaps"] == 0
    assert data["keys_left"] == []


def _results_state() -> tuple[dict[str, tuple[int, int]], str]:
    """Every committed result's size and mtime, and what git says of the folder."""
    files = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in RESULTS.iterdir()}
    git = ""
    if _in_git_checkout():
        git = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", str(RESULTS)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return files, git


@pytest.mark.timeout(120)
def test_a_run_without_out_writes_nothing_under_benchmarks_results() -> None:
    """Without --out a benchmark writes to benchmarks/out/ (ignored by git), not the results.

    So `make bench` leaves the committed charts and figures alone (`make
    bench-update` rewrites them). At the --quick size no target is judged: the
    lines say info, and the run exits 0.
    """
    before = _results_state()
    done, said = _small_waiting_run("-m", "benchmarks.waiting", "--quick")
    assert done.returncode == 0, said
    assert _results_state() == before, "a run without --out changed benchmarks/results/"
    assert f"wrote {DEFAULT_OUT / 'waiting.json'}" in done.stdout, said
    assert json.loads((DEFAULT_OUT / "waiting.json").read_text())["clients"] == 20
    assert "FAIL" not in done.stdout, said
    assert "info  at most 12 commands per hand-off" in done.stdout, said
    if _in_git_checkout():
        ignored = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "-q", str(DEFAULT_OUT / "waiting.json")],
            check=False,
        )
        assert ignored.returncode == 0, "benchmarks/out/ is not in .gitignore"


def _small_waiting_run(*how: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``python HOW`` with benchmarks.waiting's small size (20 clients, 1 process, 1 s)."""
    done = subprocess.run(
        [sys.executable, *how, "--clients", "20", "--processes", "1", "--window", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    return done, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.timeout(120)
def test_a_missed_target_is_a_fail_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    """A full-size run that misses a target prints FAIL and exits 3 (1 is kept for errors).

    benchmarks.waiting at a small but judged size (no --quick), with its
    hand-off bound set to 0 commands, which no hand-off meets.
    """
    code = (
        "import sys, benchmarks.waiting as w; w.TARGET_HANDOFF = 0.0; "
        "sys.exit(w.main(sys.argv[1:]))"
    )
    done, said = _small_waiting_run("-c", code, "--out", str(tmp_path))
    assert done.returncode == EXIT_MISSED, said
    assert "FAIL  at most 0 commands per hand-off" in done.stdout, said
    assert (tmp_path / "waiting.json").is_file()


def test_python_m_benchmarks_exits_nonzero_when_one_misses_a_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`make bench`'s runner: 3 when a benchmark missed a target, 1 when one failed, else 0.

    The benchmarks are stood in for by functions returning those statuses.
    """
    monkeypatch.syspath_prepend(str(ROOT))
    runner = importlib.import_module("benchmarks.__main__")
    assert importlib.import_module("benchmarks._runner").EXIT_MISSED == EXIT_MISSED
    codes = dict.fromkeys(runner.BENCHMARKS, 0)
    monkeypatch.setattr(runner, "_load", lambda name: lambda argv: codes[name])
    options = ["--quick", "--out", str(tmp_path)]
    assert runner.main(options) == 0
    codes["handoff"] = EXIT_MISSED
    assert runner.main(options) == EXIT_MISSED
    codes["redlock"] = 1
    assert runner.main(options) == 1


@pytest.mark.parametrize(
    "module",
    [
        "benchmarks",
        *(f"benchmarks.{name}" for name in ("contention", "handoff", "seckill", "redlock")),
        *(f"benchmarks.{name}" for name in ("family", "waiting", "scale", "soak", "compare")),
        "benchmarks.multi",
        "benchmarks.failover",
        "benchmarks.instructions",
    ],
)
def test_every_benchmark_still_answers_help(module: str) -> None:
    """`python -m benchmarks.NAME --help` exits 0; each names benchmarks/out/ as the default."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    if module != "benchmarks.compare":  # it writes to a temporary folder, or to --json
        # argparse wraps its lines, at a hyphen too: compared without any white space.
        assert "".join(str(DEFAULT_OUT).split()) in "".join(done.stdout.split()), done.stdout
