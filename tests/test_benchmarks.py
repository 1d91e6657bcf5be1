"""The benchmarks still run: each one, at its ``--quick`` size, against its own server.

Speed is not asserted here (that is what the benchmarks report); these
tests only prove that every benchmark runs to the end, checks its own
correctness (a benchmark exits 1 on an overlap or an oversold unit), and
writes its table data and chart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: CPU-heavy (other processes): `make test` runs these after the others, two at a time.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent


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
@pytest.mark.parametrize("name", ["contention", "handoff", "seckill", "redlock", "family"])
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


@pytest.mark.timeout(120)
def test_the_waiting_benchmark_runs_and_its_figures_hold(tmp_path: Path) -> None:
    """benchmarks.waiting with 40 clients: at most 1 command/s per waiter, 12 per hand-off.

    The queue's waiting cost (issue 13) at a small size: every waiter is
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
