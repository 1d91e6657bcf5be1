"""``aiolock run`` and ``aiolock status`` end to end, in subprocesses, on a real server.

Every ``aiolock`` process runs in a session of its own, so that a test can
stop it together with the command it started (``killpg``); the ``cli``
fixture stops whatever a test left running. The commands under the lock are
small Python scripts written into the test's temporary directory: they leave
marker files that the test waits for, instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.metadata
import itertools
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import termios
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from signal import Signals

import pytest
import redis
import redis.asyncio
from support.checkout import ROOT

from aiolock import AsyncLock
from aiolock._cli._urls import redact_url, unavailable_message
from aiolock._identity import encode_identity, mint
from aiolock._keys import Keys
from aiolock.testing import FaultProxy, LocalCluster, RedisServer, free_port

#: The longest any single ``aiolock`` process of this module may run.
PROCESS_BOUND = 20.0


#: The ``script`` fixture: makes a Python script from source, returns its command line.
Script = Callable[[str], list[str]]


class Result:
    """What a finished ``aiolock`` process did."""

    def __init__(self, returncode: int, stdout: str, stderr: str, elapsed: float) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.elapsed = elapsed

    def __repr__(self) -> str:
        return (
            f"<Result {self.returncode} after {self.elapsed:.2f} s "
            f"stdout={self.stdout!r} stderr={self.stderr!r}>"
        )

    @property
    def error_lines(self) -> list[str]:
        """The non-empty lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.strip()]


def _default_signals() -> None:  # pragma: no cover - runs in the child
    """The signals aiolock forwards back to their defaults: not ignored because the suite is.

    (Under ``nohup`` the suite's processes ignore SIGHUP, and ``aiolock run``
    rightly leaves an ignored signal alone; the tests of that start it so.)
    """
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


class Job:
    """A running ``aiolock`` process (in its own session, the signals it forwards at default)."""

    def __init__(
        self, args: tuple[str, ...], env: dict[str, str] | None, wrapper: tuple[str, ...] = ()
    ) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "aiolock", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=_default_signals,  # the test runs no threads of its own
        )

    @property
    def pid(self) -> int:
        """The ``aiolock`` process id."""
        return self.proc.pid

    def finish(self, timeout: float = PROCESS_BOUND) -> Result:
        """Wait for the process (bounded) and return what it did."""
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            stdout, stderr = self.proc.communicate()
            pytest.fail(f"aiolock did not finish within {timeout} s: {stdout!r} {stderr!r}")
        return Result(self.proc.returncode, stdout, stderr, time.monotonic() - self.started)

    def stop(self) -> None:
        """Kill the process and everything it started, if still there."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.communicate(timeout=5)


class Cli:
    """Starts ``python -m aiolock`` processes against one server; stops them all at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.jobs: list[Job] = []

    def start(
        self, *args: str, env: dict[str, str] | None = None, wrapper: tuple[str, ...] = ()
    ) -> Job:
        """Start ``aiolock ARGS`` with ``AIOLOCK_URL`` naming the server (unless ``env`` says).

        ``wrapper`` goes before ``python -m aiolock``: a command that ``exec``s its
        arguments (the process id stays aiolock's).
        """
        job = Job(args, {"AIOLOCK_URL": self.url, **(env or {})}, wrapper)
        self.jobs.append(job)
        return job

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Result:
        """Run ``aiolock ARGS`` to its end (bounded)."""
        return self.start(*args, env=env).finish()

    def stop_all(self) -> None:
        """Kill whatever is still running."""
        for job in self.jobs:
            if job.proc.returncode is None:
                job.stop()


@pytest.fixture
def cli(server: RedisServer) -> Iterator[Cli]:
    """Run ``aiolock`` against the session's server; every process is stopped after the test."""
    runner = Cli(server.url)
    yield runner
    runner.stop_all()


@pytest.fixture
def db(server: RedisServer) -> Iterator[redis.Redis]:
    """A synchronous admin client for assertions and for playing the other holder."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def key(name: str) -> str:
    """The key of the test's lock under the default prefix."""
    return Keys(name).lock


@pytest.fixture
def script(tmp_path: Path) -> Script:
    """Write a Python script into the test's directory; return the command that runs it."""
    count = 0

    def write(body: str) -> list[str]:
        nonlocal count
        count += 1
        path = tmp_path / f"script{count}.py"
        path.write_text(textwrap.dedent(body))
        return [sys.executable, str(path)]

    return write


@pytest.fixture
def unscripted_url(server: RedisServer, db: redis.Redis) -> Iterator[str]:
    """The server's URL as a user who may not run scripts: every release fails on the server.

    An uncontended acquire is a bare ``SET``; the release script is refused
    (``NOPERM``, a ``ResponseError``) and the key stays until its lease ends.
    (A user without channel rights no longer makes a release fail: its
    announcement is best effort.)
    """
    user = f"aiolock-test-{uuid.uuid4().hex[:8]}"
    db.acl_setuser(
        user,
        enabled=True,
        passwords=["+hunter2"],
        keys=["*"],
        categories=["+@all"],
        commands=["-evalsha", "-eval"],
    )
    yield server.url.replace("redis://", f"redis://{user}:hunter2@")
    db.acl_deluser(user)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


# -- running under the lock ---------------------------------------------------------------

JOB = """
import sys, time
log = sys.argv[1]
with open(log, "a") as f:
    f.write(f"start {sys.argv[2]} {time.monotonic()!r}\\n")
time.sleep(0.3)
with open(log, "a") as f:
    f.write(f"end {sys.argv[2]} {time.monotonic()!r}\\n")
"""


def test_concurrent_runs_never_overlap(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """Three `aiolock run` started at once on one name run their commands one after another."""
    log = tmp_path / "log"
    job = script(JOB)
    jobs = [
        cli.start("run", "--timeout", "15", name, "--", *job, str(log), str(i)) for i in range(3)
    ]
    results = [j.finish() for j in jobs]
    assert [r.returncode for r in results] == [0, 0, 0], results
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 6, lines
    for start, end in zip(lines[::2], lines[1::2], strict=True):
        assert start[0] == "start"
        assert end[0] == "end"
        assert start[1] == end[1]  # the same job's start and end follow each other
    pairs = zip(lines[::2], lines[1::2], strict=True)
    intervals = sorted((float(s[2]), float(e[2])) for s, e in pairs)
    for (_, ended), (next_start, _) in itertools.pairwise(intervals):
        assert next_start >= ended
    assert sorted(s[1] for s in lines[::2]) == ["0", "1", "2"]  # all three ran
    assert db.exists(key) == 0


def test_the_command_s_exit_status_passes_through(cli: Cli, name: str, db: redis.Redis) -> None:
    """`aiolock run` exits with the command's status (0, 3, 42), says nothing, leaves no key."""
    jobs = {
        code: cli.start("run", f"{name}:{code}", "--", sys.executable, "-c", f"exit({code})")
        for code in (0, 3, 42)
    }
    for code, job in jobs.items():
        result = job.finish()
        assert result.returncode == code, result
        assert result.stderr == ""
    assert db.keys(f"*{name}*") == []


def test_a_command_killed_by_a_signal_gives_128_plus_n(
    cli: Cli, name: str, db: redis.Redis
) -> None:
    """A command that dies of signal N makes `aiolock run` exit 128+N, like the shell."""
    jobs = {
        signum: cli.start(
            "run",
            f"{name}:{signum.name}",
            "--",
            sys.executable,
            "-c",
            f"import os; os.kill(os.getpid(), {int(signum)})",
        )
        for signum in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)
    }
    for signum, job in jobs.items():
        result = job.finish()
        assert result.returncode == 128 + signum, result
    assert db.keys(f"*{name}*") == []


def test_verbose_logs_what_the_lock_does(cli: Cli, name: str) -> None:
    """-v shows the lock's own log records on stderr (without it, stderr stays empty)."""
    result = cli("run", "-v", name, "--", "true")
    assert result.returncode == 0, result
    assert f"aiolock: DEBUG: acquired lock {name!r}" in result.error_lines[0]
    assert f"aiolock: DEBUG: released lock {name!r}" in result.error_lines[-1]


def test_the_command_sees_the_lock_name_and_fence(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """The command gets AIOLOCK_LOCK_NAME, and AIOLOCK_FENCE only with --fencing (never stale)."""
    out = tmp_path / "env.json"
    dump = script(
        """
        import json, os, sys
        names = ("AIOLOCK_LOCK_NAME", "AIOLOCK_FENCE")
        with open(sys.argv[1], "w") as f:
            json.dump({n: os.environ.get(n) for n in names}, f)
        """
    )
    stale = {"AIOLOCK_FENCE": "999"}  # as if run inside another `aiolock run --fencing`
    assert cli("run", name, "--", *dump, str(out), env=stale).returncode == 0
    assert json.loads(out.read_text()) == {"AIOLOCK_LOCK_NAME": name, "AIOLOCK_FENCE": None}

    assert cli("run", "--fencing", name, "--", *dump, str(out), env=stale).returncode == 0
    first = json.loads(out.read_text())
    assert cli("run", "--fencing", name, "--", *dump, str(out)).returncode == 0
    second = json.loads(out.read_text())
    assert first["AIOLOCK_LOCK_NAME"] == name
    assert int(first["AIOLOCK_FENCE"]) > 999
    assert int(second["AIOLOCK_FENCE"]) > int(first["AIOLOCK_FENCE"])
    assert int(db.get(Keys(name).fence) or 0) == int(second["AIOLOCK_FENCE"])
    assert db.exists(key) == 0
    db.delete(Keys(name).fence)


def test_options_after_the_name_and_a_command_without_dashes(
    cli: Cli, name: str, key: str, db: redis.Redis
) -> None:
    """Options may follow NAME before `--`; without `--` everything after NAME is the command."""
    exit_with_argc = "import sys; raise SystemExit(10 + len(sys.argv))"
    result = cli(
        "run", name, "--timeout", "5", "--ttl", "3", "--", sys.executable, "-c", exit_with_argc
    )
    assert result.returncode == 11, result
    # The command's own -n and --timeout are its arguments, not aiolock's options.
    result = cli("run", name, sys.executable, "-c", exit_with_argc, "-n", "--timeout", "0")
    assert result.returncode == 14, result
    assert db.exists(key) == 0


# -- not acquired in time -----------------------------------------------------------------

HOLDER = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).touch()
time.sleep(30)
"""


def test_timeout_gives_up_without_running_the_command(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """With the lock held elsewhere, --timeout 0.3 exits 75 with one line and runs nothing."""
    started = tmp_path / "holder-started"
    holder = cli.start("run", name, "--", *script(HOLDER), str(started))
    wait_for(started.exists, "the holder's command to start")
    marker = tmp_path / "ran"
    touch = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]

    result = cli("run", "--timeout", "0.3", name, "--", *touch)
    assert result.returncode == 75, result
    assert result.error_lines == [
        f"aiolock: lock {name!r} is held by someone else; gave up after 0.3 s"
    ]
    assert 0.3 <= result.elapsed < 5.0
    assert not marker.exists()

    nonblock = cli("run", "-n", name, "--", *touch)
    assert nonblock.returncode == 75, nonblock
    assert nonblock.error_lines == [f"aiolock: lock {name!r} is held by someone else; did not wait"]
    assert not marker.exists()

    assert db.exists(key) == 1  # the holder's key, untouched
    os.kill(holder.pid, signal.SIGTERM)  # forwarded: its command ends, the lock is released
    assert holder.finish().returncode == 128 + signal.SIGTERM
    assert db.exists(key) == 0


def test_a_signal_while_waiting_stops_the_wait_without_running_the_command(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path
) -> None:
    """SIGTERM to a waiting `aiolock run` exits 143 at once, says so, runs nothing, takes no key."""
    db.set(key, "someone-else", px=20_000)
    marker = tmp_path / "ran"
    waiter = cli.start(
        "run", name, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"
    )
    wait_for(lambda: db.exists(Keys(name).queue) == 1, "the waiter to wait (in the queue)")
    os.kill(waiter.pid, signal.SIGTERM)
    result = waiter.finish(timeout=5)
    assert result.returncode == 128 + signal.SIGTERM, result
    assert result.error_lines == [
        f"aiolock: got SIGTERM while waiting for lock {name!r}; did not run the command"
    ]
    assert not marker.exists()
    assert db.get(key) == "someone-else"
    db.delete(key)


# -- losing the lock ----------------------------------------------------------------------

TERMINABLE = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
ignore = sys.argv[2] == "ignore"

def on_term(signum, frame):
    (out / "terminated-at").write_text(repr(time.monotonic()))
    (out / "terminated").write_text(signal.Signals(signum).name)
    if not ignore:
        raise SystemExit(0)

signal.signal(signal.SIGTERM, on_term)
(out / "started").touch()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    time.sleep(0.02)
"""


@pytest.mark.parametrize("how", ["overwrite", "delete"])
def test_a_lost_lock_terminates_the_command_and_exits_70(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script, how: str
) -> None:
    """If the key is taken over or deleted, the command gets SIGTERM and `aiolock run` exits 70."""
    job = cli.start(
        "run", "--ttl", "1", "--grace", "5", name, "--", *script(TERMINABLE), str(tmp_path), "exit"
    )
    wait_for((tmp_path / "started").exists, "the command to start")
    assert db.exists(key) == 1
    taken = time.monotonic()
    if how == "overwrite":
        db.set(key, "another-holder")
    else:
        db.delete(key)
    result = job.finish(timeout=10)
    took = time.monotonic() - taken
    assert result.returncode == 70, result
    assert (tmp_path / "terminated").read_text() == "SIGTERM"
    assert len(result.error_lines) == 1, result
    assert f"lost lock {name!r}" in result.stderr
    assert "with SIGTERM" in result.stderr
    assert took < 4.0  # the renewal (every 1/3 s) noticed; SIGTERM ended it, no 5 s grace
    # The other holder's key is left alone; a deleted key is not recreated.
    assert db.get(key) == ("another-holder" if how == "overwrite" else None)
    db.delete(key)


def test_a_command_ignoring_sigterm_after_a_loss_is_killed_after_the_grace(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """A command that ignores SIGTERM after a loss gets SIGKILL --grace seconds later; exit 70."""
    job = cli.start(
        "run",
        "--ttl",
        "1",
        "--grace",
        "0.5",
        name,
        "--",
        *script(TERMINABLE),
        str(tmp_path),
        "ignore",
    )
    wait_for((tmp_path / "started").exists, "the command to start")
    db.set(key, "another-holder")
    result = job.finish(timeout=10)
    ended = time.monotonic()
    assert result.returncode == 70, result
    assert (tmp_path / "terminated").read_text() == "SIGTERM"
    # SIGKILL came after the 0.5 s grace, not with the SIGTERM (the margin: the handler's lag).
    assert ended - float((tmp_path / "terminated-at").read_text()) >= 0.3
    assert len(result.error_lines) == 1, result
    assert "SIGKILL" in result.stderr
    assert "exit status was 137" in result.stderr
    assert db.get(key) == "another-holder"
    db.delete(key)


def test_a_server_gone_mid_run_loses_the_lock_at_the_lease_end_and_exits_70(
    private_server: Callable[..., RedisServer], tmp_path: Path, script: Script
) -> None:
    """The server dying while the command runs: the lock is lost by the lease end; exit 70."""
    srv = private_server()
    cli = Cli(srv.url)
    try:
        job = cli.start("run", "--ttl", "1", "lock", "--", *script(TERMINABLE), str(tmp_path), "x")
        wait_for((tmp_path / "started").exists, "the command to start")
        srv.kill()
        killed_at = time.monotonic()
        result = job.finish(timeout=10)
        assert result.returncode == 70, result
        assert time.monotonic() - killed_at < 3.0  # the 1 s lease, then SIGTERM at once
        assert (tmp_path / "terminated").read_text() == "SIGTERM"
        assert len(result.error_lines) == 1, result
        assert "lost lock 'lock'" in result.stderr
    finally:
        cli.stop_all()


# -- what the release finds ---------------------------------------------------------------


def test_a_loss_found_at_the_release_exits_70_with_the_command_s_status(
    cli: Cli, server: RedisServer, name: str, key: str, db: redis.Redis
) -> None:
    """A command ending by itself after its lock was taken over: exit 70, one line with its 5."""
    take_over = "import redis, sys; redis.Redis.from_url(sys.argv[1]).set(sys.argv[2], 'other')"
    result = cli(
        "run",
        "--ttl",
        "30",  # no renewal (every 10 s) notices before the release does
        name,
        "--",
        sys.executable,
        "-c",
        f"{take_over}; raise SystemExit(5)",
        server.url,
        key,
    )
    assert result.returncode == 70, result
    assert result.error_lines == [
        f"aiolock: lock {name!r} was found lost when it was released (another holder may have "
        "run meanwhile); the command's exit status was 5"
    ]
    assert db.get(key) == "other"  # the other holder's key, untouched
    db.delete(key)


def test_a_release_the_server_fails_exits_69_with_the_command_s_status(
    cli: Cli, name: str, key: str, db: redis.Redis, unscripted_url: str
) -> None:
    """The server failing the release after the command exited 5: exit 69, one line with the 5."""
    result = cli(
        "run", name, "--", sys.executable, "-c", "exit(5)", env={"AIOLOCK_URL": unscripted_url}
    )
    assert result.returncode == 69, result
    assert len(result.error_lines) == 1, result
    line = result.error_lines[0]
    assert line.startswith(f"aiolock: server {redact_url(unscripted_url)} is unavailable: ")
    assert line.endswith(
        f"(releasing lock {name!r}, which expires within 10.0 s; the command's exit status was 5)"
    )
    assert "hunter2" not in result.stderr
    assert db.exists(key) == 1, "the refused release deleted the key"  # it expires by itself
    db.delete(key)


def test_a_failed_release_adds_no_second_line_to_a_command_not_found(
    cli: Cli, name: str, unscripted_url: str
) -> None:
    """Regression (found in review): a 127 stays 127 with one line if the release fails too."""
    result = cli(
        "run", name, "--", "aiolock-test-no-such-command", env={"AIOLOCK_URL": unscripted_url}
    )
    assert result.returncode == 127, result
    assert result.error_lines == ["aiolock: aiolock-test-no-such-command: command not found"]


def test_an_error_starting_the_command_is_not_hidden_by_a_failed_release(
    name: str, unscripted_url: str
) -> None:
    """Regression (review): an error starting the command is not hidden by the release's."""
    code = (
        "import sys\n"
        "from aiolock._cli._run import RunConfig, run_command\n"
        "run_command(RunConfig(sys.argv[1], ('embedded\\x00null',), url=sys.argv[2]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, name, unscripted_url],
        capture_output=True,
        text=True,
        timeout=PROCESS_BOUND,
        check=False,
    )
    assert result.returncode == 1, result
    *_, error, note = [line for line in result.stderr.splitlines() if line.strip()]
    assert error == "ValueError: embedded null byte", result.stderr
    assert note.startswith(f"aiolock: server {redact_url(unscripted_url)} is unavailable: ")
    assert note.endswith(f"(releasing lock {name!r}, which expires within 10.0 s)")
    assert "hunter2" not in result.stderr


# -- signals ------------------------------------------------------------------------------

TRAPPING = """
import pathlib, signal, sys, time
import redis

out, url, key = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def on_signal(signum, frame):
    time.sleep(0.2)  # the lock must still be held meanwhile
    held = redis.Redis.from_url(url).exists(key)
    (out / "signal").write_text(f"{signal.Signals(signum).name} held={held}")
    raise SystemExit(7)

for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, on_signal)
(out / "started").touch()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    time.sleep(0.02)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_and_the_lock_is_held_until_the_command_exits(
    cli: Cli,
    server: RedisServer,
    name: str,
    key: str,
    db: redis.Redis,
    tmp_path: Path,
    script: Script,
    signum: Signals,
) -> None:
    """A signal to `aiolock run` reaches the command; the lock stays held until it exits."""
    command = script(TRAPPING)
    job = cli.start("run", name, "--", *command, str(tmp_path), server.url, key)
    wait_for((tmp_path / "started").exists, "the command to start")
    os.kill(job.pid, signum)
    result = job.finish(timeout=10)
    assert result.returncode == 7, result
    assert result.stderr == ""
    assert (tmp_path / "signal").read_text() == f"{signum.name} held=1"
    assert db.exists(key) == 0


COUNTING = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
count = 0

def on_int(signum, frame):
    global count
    count += 1

signal.signal(signal.SIGINT, on_int)
(out / "started").touch()
while count == 0:
    time.sleep(0.01)
time.sleep(0.5)  # a second copy, if any, comes within this
(out / "count").write_text(str(count))
raise SystemExit(9)
"""


def _make_controlling_terminal() -> None:  # pragma: no cover - runs in the child
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_ctrl_c_at_the_terminal_reaches_the_command_once(
    server: RedisServer, name: str, tmp_path: Path, script: Script
) -> None:
    """Ctrl-C on the terminal of a foreground `aiolock run` reaches the command once, not twice."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiolock", "run", name, "--", *script(COUNTING), str(tmp_path)],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "AIOLOCK_URL": server.url},
        start_new_session=True,
        preexec_fn=_make_controlling_terminal,  # the test runs no threads of its own
    )
    os.close(terminal)
    try:
        wait_for((tmp_path / "started").exists, "the command to start")
        os.write(controller, b"\x03")  # the terminal sends SIGINT to its foreground group
        assert proc.wait(timeout=10) == 9
        assert (tmp_path / "count").read_text() == "1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        os.close(controller)


def test_a_signal_while_aiolock_closes_after_the_release_is_ignored(
    cli: Cli, name: str, key: str, db: redis.Redis
) -> None:
    """Regression (found in review): SIGINT after the release, while closing, is no traceback."""
    db.set(key, "someone-else", px=20_000)
    job = cli.start("run", "--fencing", name, "--", "true")
    wait_for(lambda: db.exists(Keys(name).queue) == 1, "the waiter to wait (in the queue)")
    # Free the lock as a release does: delete it and announce it (a bare DEL wakes no
    # queued waiter before the lease it saw would have ended).
    db.delete(key)
    db.publish(Keys(name).channel, "")
    # It takes the lock (the fence counter appears), runs `true` and releases it; then it
    # closes its client, which waits (about 0.25 s) for the release listener its wait
    # started to linger and end. The signal comes in that window.
    wait_for(lambda: db.exists(Keys(name).fence) == 1 and db.exists(key) == 0, "the release")
    os.kill(job.pid, signal.SIGINT)
    result = job.finish()
    assert result.returncode == 0, result
    assert result.stderr == ""
    db.delete(Keys(name).fence)


IGNORING = """
import pathlib, signal, sys, time
out, signum = pathlib.Path(sys.argv[1]), signal.Signals[sys.argv[2]]
(out / "ignored").write_text(str(signal.getsignal(signum) == signal.SIG_IGN))
deadline = time.monotonic() + 30
while not (out / "sent").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # a copy passed on by aiolock would land within this
"""


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM])
def test_a_signal_ignored_at_start_stays_ignored_and_is_not_passed_on(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script, signum: Signals
) -> None:
    """Regression (found in review, nohup): a signal ignored at start stays ignored, unforwarded."""
    trap = signum.name.removeprefix("SIG")
    ignoring = ("sh", "-c", f'trap "" {trap}; exec "$@"', "sh")  # what nohup does for SIGHUP
    command = script(IGNORING)
    job = cli.start("run", name, "--", *command, str(tmp_path), signum.name, wrapper=ignoring)
    wait_for((tmp_path / "ignored").exists, "the command to start")
    os.kill(job.pid, signum)
    (tmp_path / "sent").touch()
    result = job.finish(timeout=10)
    assert result.returncode == 0, result
    assert result.stderr == ""
    assert (tmp_path / "ignored").read_text() == "True"
    assert db.exists(key) == 0


# -- the command cannot run ---------------------------------------------------------------


def test_a_command_not_found_exits_127_and_leaves_no_key(
    cli: Cli, name: str, key: str, db: redis.Redis
) -> None:
    """A missing command gives exit 127 and one line, like the shell, and the lock is released."""
    result = cli("run", name, "--", "aiolock-test-no-such-command", "--flag")
    assert result.returncode == 127, result
    assert result.error_lines == ["aiolock: aiolock-test-no-such-command: command not found"]
    assert db.exists(key) == 0


def test_a_command_not_executable_exits_126_and_leaves_no_key(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path
) -> None:
    """A file without the execute bit gives exit 126 and one line, and the lock is released."""
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    result = cli("run", name, "--", str(plain))
    assert result.returncode == 126, result
    assert len(result.error_lines) == 1
    assert "cannot execute" in result.stderr
    assert db.exists(key) == 0


# -- status -------------------------------------------------------------------------------


def test_status_of_a_free_lock_exits_3(cli: Cli, name: str, key: str) -> None:
    """`aiolock status` on a free lock says so and exits 3."""
    result = cli("status", name)
    assert result.returncode == 3, result
    assert result.stdout == f"lock {name!r} is free (key {key}); no fence issued yet\n"
    as_json = cli("status", "--json", name)
    assert as_json.returncode == 3, as_json
    assert json.loads(as_json.stdout) == {
        "name": name,
        "key": key,
        "kind": None,
        "held": False,
        "lease": None,
        "fence": None,
        "server": cli.url,
        "holders": [],
        "waiters": [],
    }


def test_status_of_a_held_lock_shows_the_lease_and_the_holder_s_fence(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """`aiolock status` on a held lock exits 0 with the remaining lease and the holder's fence."""
    fence_file = tmp_path / "fence"
    holder = script(
        """
        import os, pathlib, sys, time
        pathlib.Path(sys.argv[1]).write_text(os.environ["AIOLOCK_FENCE"])
        time.sleep(30)
        """
    )
    job = cli.start("run", "--fencing", "--ttl", "6", name, "--", *holder, str(fence_file))
    wait_for(lambda: fence_file.exists() and fence_file.read_text() != "", "the holder's fence")
    fence = int(fence_file.read_text())

    text = cli("status", name)
    assert text.returncode == 0, text
    sentence, who = text.stdout.splitlines()
    assert sentence.startswith(f"lock {name!r} is held (key {key}); lease ends in ")
    assert sentence.endswith(f" s; fence {fence}")
    # The holder: aiolock run itself (its default identity: host, pid, task name).
    assert who.startswith(f"  holder {socket.gethostname()}:{job.pid}:")
    assert who.endswith(f", fence {fence}")

    as_json = cli("status", "--json", name)
    assert as_json.returncode == 0, as_json
    state = json.loads(as_json.stdout)
    assert state["held"] is True
    assert state["kind"] == "lock"
    assert state["fence"] == fence
    assert 0 < state["lease"] <= 6.0
    assert state["key"] == key
    [holder] = state["holders"]
    assert holder["identity"].startswith(f"{socket.gethostname()}:{job.pid}:")
    assert holder["fence"] == fence
    assert holder["role"] == "holder"
    assert 0 < holder["remaining"] <= 6.0
    assert time.time() - 60 < holder["acquired_at"] <= time.time()
    assert state["waiters"] == []

    os.kill(job.pid, signal.SIGTERM)
    assert job.finish().returncode == 128 + signal.SIGTERM
    freed = cli("status", name)
    assert freed.returncode == 3, freed
    assert freed.stdout.endswith(f"last fence {fence}\n")
    db.delete(Keys(name).fence)


def test_ls_lists_held_names_with_their_kind_holders_and_lease_and_filters(
    cli: Cli, name: str, db: redis.Redis
) -> None:
    """`aiolock ls PATTERN`: the held names that match, sorted, --limit bounded, --json."""
    for part in ("a", "b"):
        db.set(Keys(f"{name}:{part}").lock, mint(encode_identity(f"job-{part}")), px=9000)
    db.rpush(Keys(f"{name}:b").queue, "gone")  # (a companion key; a dead waiter)
    listed = cli("ls", f"{name}:*")
    assert listed.returncode == 0, listed
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "KIND", "HOLDERS", "WAITERS", "LEASE"]
    assert [row.split()[:4] for row in rows] == [
        [f"{name}:a", "lock", "1", "0"],
        [f"{name}:b", "lock", "1", "0"],
    ]
    assert all(0 < float(row.split()[4]) <= 9.0 for row in rows)
    one = cli("ls", f"{name}:[a]")
    assert [row.split()[0] for row in one.stdout.splitlines()[1:]] == [f"{name}:a"]
    limited = cli("ls", "--limit", "1", "--json", f"{name}:*")
    assert limited.returncode == 0, limited
    [row] = [json.loads(line) for line in limited.stdout.splitlines()]
    assert row["kind"] == "lock"
    assert row["holders"] == 1
    assert "more names match" in limited.stderr
    nothing = cli("ls", f"{name}:none*")
    assert (nothing.returncode, nothing.stdout) == (3, "")
    db.delete(Keys(f"{name}:a").lock, Keys(f"{name}:b").lock, Keys(f"{name}:b").queue)


def test_release_force_takes_the_name_says_whom_from_and_logs_it(
    cli: Cli, name: str, key: str, db: redis.Redis
) -> None:
    """`release --force`: exit 0 naming the holder, logged, marked; a free name: exit 3."""
    token = mint(encode_identity("stuck-host:42:nightly"))
    db.set(key, token, px=20_000)
    refused = cli("release", name)
    assert refused.returncode == 2, refused
    assert "needs --force" in refused.stderr
    assert db.get(key) == token
    forced = cli("release", "--force", "--by", "ops on call", name)
    assert forced.returncode == 0, forced
    assert forced.stdout == (
        f"released lock {name!r} by force (key {key}): taken from "
        "stuck-host:42:nightly; nobody was waiting\n"
    )
    assert "WARNING" in forced.stderr
    assert "by ops on call" in forced.stderr
    assert db.get(key) is None
    mark = f"{key}:forced:{token}"
    assert db.get(mark) == "ops on call"
    assert 20_000 < db.pttl(mark) <= 80_000
    again = cli("release", "--force", name)
    assert again.returncode == 3, again
    assert again.stdout == f"lock {name!r} was not held (key {key}); nothing was released\n"
    db.delete(mark)


def test_status_uses_the_prefix(cli: Cli, name: str, db: redis.Redis) -> None:
    """--prefix changes the key status looks at."""
    db.set(Keys(name, "jobs:").lock, "token", px=5000)
    assert cli("status", name).returncode == 3
    held = cli("status", "--prefix", "jobs:", "--json", name)
    assert held.returncode == 0, held
    assert json.loads(held.stdout)["key"] == Keys(name, "jobs:").lock
    db.delete(Keys(name, "jobs:").lock)


# -- servers and passwords ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@host", "redis://:***@host"),
        ("rediss://user:s%40cr%3Aet@host:6380", "rediss://user:***@host:6380"),
        ("redis://user:p@ss@host/1", "redis://user:***@host/1"),
        ("unix:///run/redis.sock?db=1&password=secret", "unix:///run/redis.sock?db=1&password=***"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host", "redis://user@host"),
        ("redis://user:secret@[::1", "redis://***@[::1"),
        ("redis://user:se?cr/et@host:6379", "redis://***@host:6379"),
        ("user:secret@host", "***@host"),
    ],
)
def test_redact_url_hides_the_password(url: str, shown: str) -> None:
    """redact_url replaces the password (user part or query) and keeps the rest."""
    assert redact_url(url) == shown


def test_error_messages_are_scrubbed_of_the_password() -> None:
    """A client error that quotes the password (as written or decoded) is printed without it."""
    url = "redis://user:s%40cr3t@db.example:6379/0"
    error = redis.ConnectionError("AUTH s@cr3t refused (sent s%40cr3t)")
    line = unavailable_message(error, url)
    assert line == (
        "aiolock: server redis://user:***@db.example:6379/0 is unavailable: "
        "ConnectionError: AUTH *** refused (sent ***)"
    )


def test_an_unreachable_server_exits_69_with_one_line_and_no_password(cli: Cli) -> None:
    """Nobody listening: every subcommand that asks exits 69, one line, no password, either way."""
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    cases = [
        ("run", "NAME", "--", "true"),
        ("status", "NAME"),
        ("demo", "--processes", "1", "--coroutines", "1", "--rounds", "1"),
        ("ls",),
        ("release", "--force", "NAME"),
        ("leader", "NAME"),
    ]
    jobs = [
        *(cli.start(args[0], "--url", url, *args[1:]) for args in cases),
        *(cli.start(*args, env={"AIOLOCK_URL": url}) for args in cases),
    ]
    for job in jobs:
        result = job.finish()
        assert result.returncode == 69, result
        assert len(result.error_lines) == 1, result
        assert result.stderr.startswith(f"aiolock: server {redact_url(url)} is unavailable: ")
        assert "secret" not in result.stdout + result.stderr


def test_a_rejected_password_exits_69_without_printing_it(
    cli: Cli, server: RedisServer, name: str, key: str, db: redis.Redis
) -> None:
    """The server refusing the password: exit 69, one line, the password printed nowhere."""
    url = server.url.replace("redis://", "redis://user:hunter2@")
    result = cli("run", "--url", url, name, "--", "true")
    assert result.returncode == 69, result
    assert len(result.error_lines) == 1
    assert "user:***@" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert db.exists(key) == 0


#: URL options redis-py does not take (or cannot use), and the option's name.
BAD_URL_OPTIONS = [
    ("bogus=1", "bogus"),
    ("Bogus=1&password=secret", "Bogus"),
    ("protocol=9", "protocol"),
    ("socket_timeout=abc", "socket_timeout"),  # exited 2 already: the others must match it
]


def test_a_bad_url_option_exits_2_naming_it_without_a_traceback(
    cli: Cli, server: RedisServer, name: str, key: str, db: redis.Redis
) -> None:
    """A URL option redis-py does not take or cannot use: exit 2, one line naming it.

    For ``run``, ``status`` and ``demo`` (whose bad URL ended in a traceback, exit 1).
    """
    base = server.url.replace("redis://", "redis://user:secret@")
    jobs = [
        (url, option, cli.start(*args))
        for url, option in ((f"{base}?{query}", option) for query, option in BAD_URL_OPTIONS)
        for args in [
            ("run", "--url", url, name, "--", "true"),
            ("status", "--url", url, name),
            ("run", "--cluster", "--url", url, name, "--", "true"),
            ("status", "--cluster", "--url", url, name),
            ("demo", "--url", url, "--processes", "1", "--coroutines", "1", "--rounds", "1"),
            ("ls", "--url", url),
            ("release", "--force", "--url", url, name),
            ("leader", "--url", url, name),
        ]
    ]
    for url, option, job in jobs:
        result = job.finish()
        assert result.returncode == 2, result
        assert len(result.error_lines) == 1, result
        assert "Traceback" not in result.stderr, result
        line = result.error_lines[0]
        assert line.startswith(f"aiolock: bad server URL {redact_url(url)}: "), result
        assert f"'{option}'" in line, result
        assert "secret" not in result.stdout + result.stderr, result
    assert db.exists(key) == 0


def test_cluster_option_runs_and_reports_on_a_cluster(
    cli: Cli, name: str, tmp_path: Path, script: Script
) -> None:
    """--cluster talks to a Redis Cluster: run holds the lock there, status sees it."""
    started = tmp_path / "started"
    with LocalCluster(masters=1) as cluster:
        job = cli.start(
            "run", "--cluster", "--url", cluster.url, name, "--", *script(HOLDER), str(started)
        )
        wait_for(started.exists, "the command to start")
        held = cli("status", "--cluster", "--url", cluster.url, "--json", name)
        assert held.returncode == 0, held
        assert json.loads(held.stdout)["held"] is True
        os.kill(job.pid, signal.SIGTERM)
        assert job.finish().returncode == 128 + signal.SIGTERM
        freed = cli("status", "--cluster", "--url", cluster.url, name)
        assert freed.returncode == 3, freed


# -- usage, help, installation ------------------------------------------------------------


def test_bad_usage_exits_2(cli: Cli) -> None:
    """A missing command, a bad number or a stray argument exits 2 with a usage message."""
    cases = [
        ("run", "NAME"),
        ("run", "NAME", "--"),
        ("run", "--timeout", "-1", "NAME", "--", "true"),
        ("run", "-n", "--timeout", "1", "NAME", "--", "true"),
        ("run", "--ttl", "0", "NAME", "--", "true"),
        ("run", "NAME", "extra", "--", "true"),
        ("status",),
    ]
    jobs = [cli.start(*args) for args in cases]
    for job in jobs:
        result = job.finish()
        assert result.returncode == 2, result
        assert "usage: aiolock" in result.stderr


def test_help_documents_the_exit_codes(cli: Cli) -> None:
    """--help works for the command and each subcommand, and lists its exit codes."""
    expected = {
        (): ["run", "status", "demo", "server", "75", "70", "126", "127", "128+N", "3 "],
        ("run",): ["--timeout", "--nonblock", "--ttl", "--grace", "--fencing", "75", "70", "128+N"],
        ("status",): ["--json", "3 "],
        ("demo",): ["--processes", "1 "],
        ("server",): ["--port", "--host"],
    }
    jobs = {command: cli.start(*command, "--help") for command in expected}
    for command, job in jobs.items():
        result = job.finish()
        assert result.returncode == 0, result
        words = ["exit status:", "69", *expected[command]]
        if command in {("run",), ("status",)}:
            words += ["--url", "--cluster", "AIOLOCK_URL"]
        for word in words:
            assert word in result.stdout, (command, word)


def test_the_distribution_declares_the_console_script() -> None:
    """The installed distribution maps `aiolock` to aiolock._cli:main, and the script runs."""
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [e.value for e in scripts if e.name == "aiolock"] == ["aiolock._cli:main"]
    executable = Path(sys.executable).parent / "aiolock"
    assert executable.exists(), executable
    result = subprocess.run(
        [str(executable), "--version"],
        capture_output=True,
        text=True,
        timeout=PROCESS_BOUND,
        check=False,
    )
    assert result.returncode == 0, result
    assert result.stdout.startswith("aiolock ")


async def _aiolock(url: str, *args: str) -> Result:
    """Run ``aiolock ARGS`` against ``url`` without blocking the loop (a proxy runs in it)."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aiolock",
        *args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "AIOLOCK_URL": url},
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), PROCESS_BOUND)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"aiolock {args} did not finish within {PROCESS_BOUND} s")
    assert proc.returncode is not None
    return Result(proc.returncode, stdout.decode(), stderr.decode(), time.monotonic() - started)


async def test_over_a_slow_link_run_takes_a_free_lock_and_silence_exits_69(
    server: RedisServer,
    start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]],
    name: str,
    db: redis.Redis,
) -> None:
    """Regression: a slow link is not "held by someone"; no answer exits 69.

    Through 50 ms each way, ``run -n`` on a free lock printed "held by someone
    else; did not wait" and exited 75: its first attempt (which also sets up
    the connection) was cut off 0.1 s past the deadline. Through a link that
    answers nothing, it said the same. Now the first runs its command, and the
    second exits 69 with one line saying the server did not answer, within
    the lease (--ttl) and one cleanup budget.
    """
    proxy = await start_proxy(server)
    proxy.set_latency(0.05)
    ran = await _aiolock(proxy.url, "run", "-n", name, "--", sys.executable, "-c", "print('ran')")
    assert ran.returncode == 0, ran
    assert ran.stdout == "ran\n"
    assert ran.stderr == ""

    proxy.black_hole()
    silent = await _aiolock(proxy.url, "run", "-n", "--ttl", "1", name, "--", "true")
    assert silent.returncode == 69, silent
    assert len(silent.error_lines) == 1, silent
    assert re.search(r"the server did not answer within 1(\.\d)? s", silent.stderr), silent
    # The lease (1 s: no answer yet, so what the link needs is unknown), then one cleanup
    # budget of min(ttl, 1 s); plus the interpreter's start.
    assert silent.elapsed < 2.0 + 2.0, silent
    assert db.keys(f"*{name}*") == []


# -- semaphores (--limit) ------------------------------------------------------------------


def test_run_with_a_limit_of_two_runs_two_commands_at_once_never_three(
    cli: Cli, name: str, db: redis.Redis, script: Script
) -> None:
    """Five `aiolock run --limit 2` at once: two commands run together, never three.

    Each command counts itself in on the server (INCR), notes the most it
    saw, stays until the test has looked (and 0.2 s more) and counts itself
    out; `aiolock status` meanwhile shows the semaphore's two permits. (The
    commands wait for the test rather than a fixed time: on a loaded machine
    starting `aiolock status` alone can take longer than any such time.)
    """
    witness = f"{name}:inside"
    looked = f"{name}:looked"
    job = script(
        """
        import sys, time
        import redis
        r = redis.Redis.from_url(sys.argv[1])
        inside = r.incr(sys.argv[2])
        r.eval("if tonumber(redis.call('GET', KEYS[1]) or 0) < tonumber(ARGV[1]) then "
               "redis.call('SET', KEYS[1], ARGV[1]) end", 1, sys.argv[2] + ":most", inside)
        deadline = time.monotonic() + 30
        while not r.exists(sys.argv[3]) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        r.decr(sys.argv[2])
        """
    )
    jobs = [
        cli.start("run", "--limit", "2", name, "--", *job, cli.url, witness, looked)
        for _ in range(5)
    ]
    wait_for(lambda: db.get(witness) == "2", "two commands running at once")
    status = cli("status", "--json", name)
    assert status.returncode == 0, status
    state = json.loads(status.stdout)
    assert state["kind"] == "semaphore"
    assert len(state["permits"]) == 2
    assert all(0 < p["lease"] <= 10.0 for p in state["permits"])
    assert cli("status", name).stdout.startswith(f"semaphore {name!r} has 2 permits held")
    db.set(looked, 1)
    for one in jobs:
        result = one.finish()
        assert result.returncode == 0, result
    assert db.get(f"{witness}:most") == "2"
    assert db.keys(f"*{{{name}}}*") == []
    db.delete(witness, f"{witness}:most", looked)


def test_run_with_a_limit_that_is_full_says_so(
    cli: Cli, name: str, db: redis.Redis, script: Script
) -> None:
    """`--limit 1 --nonblock` while the permit is taken: exit 75, one line naming the semaphore."""
    holder = script("import time; time.sleep(30)")
    job = cli.start("run", "--limit", "1", name, "--", *holder)
    wait_for(lambda: db.exists(Keys(name).lock) == 1, "the first run's permit")
    result = cli("run", "--limit", "1", "--nonblock", name, "--", "true")
    assert result.returncode == 75, result
    assert result.stderr == (
        f"aiolock: semaphore {name!r} (1 permit) has every permit taken; did not wait\n"
    )
    job.stop()


def test_limit_with_fencing_or_a_bad_limit_is_a_usage_error(cli: Cli, name: str) -> None:
    """`--limit` takes a positive int and does not go with `--fencing`: exit 2, nothing run."""
    fenced = cli("run", "--limit", "2", "--fencing", name, "--", "true")
    assert fenced.returncode == 2, fenced
    assert "--fencing cannot go with --limit" in fenced.stderr
    for bad in ("0", "-1", "two", "1.5"):
        result = cli("run", "--limit", bad, name, "--", "true")
        assert result.returncode == 2, result
        assert "--limit" in result.stderr


def test_status_of_a_read_write_lock_shows_its_readers_or_its_writer(
    cli: Cli, name: str, db: redis.Redis, script: Script
) -> None:
    """Two readers hold: `aiolock status` names them and their leases; exit 0; free: exit 3."""
    holder = script(
        """
        import asyncio, sys
        import redis.asyncio as redis
        from aiolock import ReadWriteLock
        async def main(url, name):
            rw = ReadWriteLock(redis.Redis.from_url(url), name, ttl=8.0)
            async def read():
                async with rw.reader:
                    await asyncio.sleep(30)
            await asyncio.gather(read(), read())
        asyncio.run(main(*sys.argv[1:]))
        """
    )
    root = str(ROOT)
    proc = subprocess.Popen(
        [*holder, cli.url, name], env={**os.environ, "PYTHONPATH": root}, start_new_session=True
    )
    try:
        wait_for(lambda: db.hlen(Keys(name).lock) == 2, "the two readers")
        status = cli("status", "--json", name)
        assert status.returncode == 0, status
        state = json.loads(status.stdout)
        assert state["kind"] == "read-write"
        assert state["writer"] is None
        assert len(state["readers"]) == 2
        assert all(0 < r["lease"] <= 8.0 for r in state["readers"])
        text = cli("status", name).stdout
        assert text.startswith(f"read-write lock {name!r} is held by 2 readers")
    finally:
        proc.kill()
        proc.wait()
        db.delete(Keys(name).lock)


def test_run_on_a_name_of_the_other_kind_exits_2_with_one_line(
    cli: Cli, name: str, db: redis.Redis
) -> None:
    """`--limit` on a lock's name, or a lock on a semaphore's: one line naming the kind, exit 2."""
    db.set(Keys(name).lock, "a lock's token", px=10_000)
    result = cli("run", "--limit", "2", "--nonblock", name, "--", "true")
    assert result.returncode == 2, result
    assert result.stderr.startswith("aiolock: the key ")
    assert "in use by an AsyncLock" in result.stderr
    assert result.stderr.count("\n") == 1
    db.delete(Keys(name).lock)
    db.zadd(Keys(name).lock, {"a permit": 99_999_999_999_999})
    result = cli("run", "--timeout", "0.5", name, "--", "true")
    assert result.returncode == 2, result
    assert "in use by a Semaphore" in result.stderr
    assert result.stderr.count("\n") == 1
    db.delete(Keys(name).lock, Keys(name).queue)


# -- aiolock server ---------------------------------------------------------------------------


def _serving(job: Job, port: int) -> None:
    """Wait (bounded) until the server of ``job`` listens on ``port``."""
    deadline = time.monotonic() + PROCESS_BOUND
    while time.monotonic() < deadline:
        if job.proc.poll() is not None:
            pytest.fail(f"aiolock server exited: {job.finish()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    else:
        pytest.fail("aiolock server did not listen in time")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_server_serves_until_a_signal_stops_it(cli: Cli, stop: signal.Signals) -> None:
    """`aiolock server --port P` serves a lock on P, prints its URL, and a signal stops it (0)."""
    port = free_port()
    job = cli.start("server", "--port", str(port))
    _serving(job, port)
    client = redis.asyncio.Redis(port=port)
    try:
        async with AsyncLock(client, "tried"):
            assert await client.exists("aiolock:{tried}") == 1
    finally:
        await client.aclose()
    os.killpg(job.pid, stop)
    result = job.finish()
    assert result.returncode == 0, result
    assert f"aiolock: serving redis://127.0.0.1:{port} (Ctrl-C stops it)" in result.stdout
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass  # the server went with it


async def test_server_on_a_port_in_use_says_so(cli: Cli, server: RedisServer) -> None:
    """A port already taken: exit 69, naming the address and quoting the server's log."""
    result = cli("server", "--port", str(server.port))
    assert result.returncode == 69, result
    assert result.error_lines[0].startswith(
        f"aiolock: the server did not start on 127.0.0.1:{server.port}: "
    ), result
    assert "Address already in use" in result.stderr, result  # (its log's last lines)


@pytest.mark.parametrize("port", ["0", "65536", "x"])
def test_server_refuses_a_bad_port(cli: Cli, port: str) -> None:
    """A port outside 1..65535 (or not a number) is bad usage: exit 2."""
    result = cli("server", "--port", port)
    assert result.returncode == 2, result
    assert "--port" in result.stderr, result


# -- elections: run --elect and leader ----------------------------------------------------

ELECTED = """
import os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
with open(out / "log", "a") as f:
    f.write(f"start {sys.argv[2]} {os.environ['AIOLOCK_FENCE']} {time.monotonic()!r}\\n")
(out / f"started-{sys.argv[2]}").touch()
time.sleep(float(sys.argv[3]))
with open(out / "log", "a") as f:
    f.write(f"end {sys.argv[2]} {time.monotonic()!r}\\n")
"""


def test_run_elect_runs_the_standby_only_once_the_leader_is_done(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """Two `run --elect`: the standby's command starts once the leader's ended, a newer fence."""
    job = script(ELECTED)
    first = cli.start(
        "run", "--elect", "--identity", "host-a", name, "--", *job, str(tmp_path), "a", "0.5"
    )
    wait_for((tmp_path / "started-a").exists, "the leader's command to start")
    second = cli.start("run", "--elect", name, "--", *job, str(tmp_path), "b", "0")
    assert [first.finish().returncode, second.finish().returncode] == [0, 0]
    lines = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    assert [(line[0], line[1]) for line in lines] == [
        ("start", "a"),
        ("end", "a"),
        ("start", "b"),
        ("end", "b"),
    ]
    assert float(lines[2][3]) >= float(lines[1][2])
    assert int(lines[2][2]) > int(lines[0][2])
    assert db.exists(key) == 0
    db.delete(Keys(name).fence)


def test_leader_prints_the_leader_or_exits_3_and_watch_prints_each_change(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """`leader` prints the identity (exit 0) or nothing (exit 3); `--watch` prints -, host-a, -."""
    nobody = cli("leader", name)
    assert (nobody.returncode, nobody.stdout) == (3, ""), nobody
    watch = cli.start("leader", "--watch", name)
    wait_for(lambda: db.pubsub_numsub(Keys(name).channel)[0][1] > 0, "the watch to listen")
    job = cli.start(
        "run",
        "--elect",
        "--identity",
        "host-a",
        name,
        "--",
        *script(TERMINABLE),
        str(tmp_path),
        "exit",
    )
    wait_for((tmp_path / "started").exists, "the command to start")
    leading = cli("leader", name)
    assert (leading.returncode, leading.stdout) == (0, "host-a\n"), leading
    # (To aiolock alone, which passes it on: a SIGTERM to the whole group would reach
    # the command twice, and the second may kill it as it exits from the first.)
    os.kill(job.pid, signal.SIGTERM)
    assert job.finish().returncode == 0
    wait_for(lambda: db.exists(key) == 0, "the term to end")
    time.sleep(0.5)  # (the watch reads the leader at least every 0.25 s)
    os.kill(watch.pid, signal.SIGTERM)
    watched = watch.finish()
    assert watched.returncode == 0, watched
    assert watched.stdout.splitlines() == ["-", "host-a", "-"], watched
    db.delete(Keys(name).fence)


def test_a_lost_term_terminates_the_command_and_exits_70(
    cli: Cli, name: str, key: str, db: redis.Redis, tmp_path: Path, script: Script
) -> None:
    """`run --elect` whose term is taken over: the command gets SIGTERM, exit 70, one line."""
    job = cli.start(
        "run", "--elect", "--ttl", "1", name, "--", *script(TERMINABLE), str(tmp_path), "exit"
    )
    wait_for((tmp_path / "started").exists, "the command to start")
    db.set(key, "another-leader")
    result = job.finish(timeout=10)
    assert result.returncode == 70, result
    assert (tmp_path / "terminated").read_text() == "SIGTERM"
    assert len(result.error_lines) == 1, result
    assert f"lost the lead of election {name!r}" in result.stderr
    assert db.get(key) == "another-leader"
    db.delete(key, Keys(name).fence)


def test_elect_with_limit_or_identity_alone_is_a_usage_error(cli: Cli, name: str) -> None:
    """`--elect` does not go with `--limit`, nor `--identity` without `--elect`: exit 2."""
    limited = cli("run", "--elect", "--limit", "2", name, "--", "true")
    assert limited.returncode == 2, limited
    assert "--elect cannot go with --limit" in limited.stderr
    alone = cli("run", "--identity", "a", name, "--", "true")
    assert alone.returncode == 2, alone
    assert "--identity goes with --elect only" in alone.stderr
