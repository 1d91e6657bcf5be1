"""The soak run still runs: ``python -m benchmarks.soak --quick`` against its own servers.

The soak injects faults at random, so this test asserts only what must hold
whatever the draw: holders got the lock, several kinds of fault were
injected, no fenced update was lost, no worker or coroutine crashed (exit
status 0). Overlaps, losses, unfenced lost updates and errors are the
faults' expected effects; the soak reports them, and so does this test's
failure message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkout import ROOT

#: CPU-heavy (other processes): `make test` runs these after the others, two at a time.
pytestmark = pytest.mark.heavy


@pytest.mark.slow
@pytest.mark.timeout(100)
def test_quick_soak_injects_faults_and_loses_no_fenced_update(tmp_path: Path) -> None:
    """A quick soak acquires, injects several kinds of fault, loses no fenced update."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    output = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"the soak failed:\n{output}"
    data = json.loads((tmp_path / "soak.json").read_text())
    assert data["benchmark"] == "soak"
    assert data["quick"] is True
    assert data["acquisitions"] > 0, output
    kinds = [kind for kind, count in data["faults"].items() if count > 0]
    assert len(kinds) >= 4, f"only {kinds} injected:\n{output}"
    assert data["lost_updates"]["fenced"] == 0, output
    assert data["worker_crashes"] == {}, output
    assert data["coroutine_crashes"] == [], output
    assert data["passed"] is True
    assert data["command"].startswith(".venv/bin/python -m benchmarks.soak --quick")
