"""The ``aiolock`` command and the demo behind ``make demo``."""

from __future__ import annotations

import os
import subprocess
import sys

from aiolock.testing import RedisServer


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_demo_against_a_url_reports_every_acquisition_and_no_overlap(server: RedisServer) -> None:
    """`aiolock demo --url` runs its workers to a summary with all acquisitions and 0 overlaps."""
    result = run_cli(
        "demo",
        "--url",
        server.url,
        "--processes",
        "2",
        "--coroutines",
        "5",
        "--rounds",
        "3",
        "--name",
        "cli-demo",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "acquisitions                   30 of 30" in result.stdout
    assert "overlaps detected              0" in result.stdout
    assert "lock commands per acquisition" in result.stdout
    assert "started" not in result.stdout  # it used the given server, none of its own


def test_demo_without_a_url_starts_and_stops_its_own_server() -> None:
    """With no URL the demo starts an embedded server, reports, and stops it."""
    result = run_cli(
        "demo",
        "--processes",
        "1",
        "--coroutines",
        "3",
        "--rounds",
        "2",
        env={"AIOLOCK_URL": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0].startswith("started ")
    assert "6 of 6" in result.stdout
    assert result.stdout.rstrip().endswith("stopped the server")


def test_demo_reads_the_url_from_the_environment(server: RedisServer) -> None:
    """AIOLOCK_URL names the server when --url is not given."""
    result = run_cli(
        "demo",
        "--processes",
        "1",
        "--coroutines",
        "2",
        "--rounds",
        "1",
        env={"AIOLOCK_URL": server.url},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "started" not in result.stdout
    assert "2 of 2" in result.stdout


def test_bad_usage_exits_2_with_a_message() -> None:
    """A bad argument exits with status 2 and says which argument."""
    result = run_cli("demo", "--processes", "0")
    assert result.returncode == 2
    assert "--processes" in result.stderr


def test_version_and_help() -> None:
    """--version prints the version; --help lists the demo command."""
    version = run_cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("aiolock ")
    help_text = run_cli("--help")
    assert help_text.returncode == 0
    assert "demo" in help_text.stdout


def test_demo_without_a_url_or_a_server_binary_says_how_to_get_one() -> None:
    """No URL and no usable server binary: exit 69 with one line saying how to get one."""
    result = run_cli(
        "demo",
        env={"AIOLOCK_URL": "", "AIOLOCK_SERVER_BIN": "/nonexistent/redis-server"},
    )
    assert result.returncode == 69, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aiolock: cannot start a server for the demo:")
    assert "AIOLOCK_SERVER_BIN" in lines[0]
    assert "Traceback" not in result.stderr
