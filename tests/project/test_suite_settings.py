"""The suite's own pytest settings (pyproject's ``[tool.pytest.ini_options]``) do what they say."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.checkout import ROOT


def test_the_summary_lists_failures_and_counts_skips_without_listing_them(tmp_path: Path) -> None:
    """With the project's settings a run lists each failure and error, and only counts skips.

    The suite skips some 170 tests on any one machine (servers, loops or
    Pythons it lacks); a line for each would bury the failures.
    """
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_passes():
                pass

            @pytest.mark.parametrize("n", [1, 2])
            def test_skipped(n):
                pytest.skip("not on this machine")

            def test_fails():
                assert 1 == 2

            @pytest.fixture
            def broken():
                raise RuntimeError("set-up failed")

            def test_errors(broken):
                pass
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml")),
            *("--rootdir", str(tmp_path), str(tmp_path)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "short test summary info" in out, out
    assert "FAILED test_sample.py::test_fails" in out, out
    assert "ERROR test_sample.py::test_errors" in out, out
    assert "SKIPPED" not in out, out
    assert "1 failed, 1 passed, 2 skipped, 1 error" in out, out
