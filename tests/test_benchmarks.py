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

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["contention", "handoff", "seckill", "redlock"])
def test_benchmark_runs_quick_and_checks_itself(name: str, tmp_path: Path) -> None:
    """`python -m benchmarks --quick --only NAME` exits 0 and writes NAME.json and NAME.png."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", name, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data, f"{name}.json is empty"
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
