"""The framework recipes of docs/recipes.md, run as written against the real frameworks.

APScheduler (``examples/apscheduler_leader.py``) runs in the test's own
loop, two replicas on two clients; taskiq (``examples/taskiq_cron.py``) and
celery beat (``examples/celery_beat.py``, under ``aiolock run --elect``) run
as real worker, scheduler and beat processes against the session's server.
Every process is started in a session of its own and killed with its group
at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO

import pytest
import redis as sync_redis
import redis.asyncio as redis
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING
from support.checkout import EXAMPLES, ROOT, load_example
from support.timing import eventually

from aiolock import Election
from aiolock._keys import Keys
from aiolock.testing import RedisServer

apscheduler_leader = load_example("apscheduler_leader.py")


@contextlib.asynccontextmanager
async def fence_deleted(admin: redis.Redis, name: str) -> AsyncIterator[None]:
    """Delete the election's fencing counter after the test (it persists by design)."""
    try:
        yield
    finally:
        await admin.delete(Keys(name).fence)


# -- the pages show the code the tests run ---------------------------------------------------


def _python_blocks(heading: str) -> list[str]:
    """The python blocks of the section ``## heading`` of docs/recipes.md."""
    page = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    section = page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)


@pytest.mark.parametrize(
    ("heading", "example"),
    [
        ("One APScheduler across replicas", "apscheduler_leader.py"),
        ("A taskiq cron job that skips a run while the last one runs", "taskiq_cron.py"),
    ],
)
def test_the_recipe_shows_the_example_s_code(heading: str, example: str) -> None:
    """Each line of the recipe's code is the example's, in the example's order (some left out)."""
    blocks = _python_blocks(heading)
    assert blocks, f"no python block under {heading!r}"
    lines = iter((EXAMPLES / example).read_text(encoding="utf-8").splitlines())
    for line in "\n".join(blocks).splitlines():
        if line.strip():
            assert any(line == other for other in lines), f"{line!r} is not {example}'s"


def test_the_celery_recipe_runs_the_command_the_test_runs() -> None:
    """The celery recipe's command has the options the test gives `aiolock run` and celery."""
    page = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    command = page.split("\n## Celery beat on one host at a time\n", 1)[1].split("```sh\n")[1]
    for words in ("aiolock run --elect --ttl", "celery -A celery_beat --workdir examples beat"):
        assert words in " ".join(command.split()), words


# -- APScheduler: one active scheduler across replicas ---------------------------------------


async def test_apscheduler_fires_on_the_leading_replica_only(
    client: redis.Redis, other_client: redis.Redis, admin: redis.Redis, name: str, no_leaks: None
) -> None:
    """Two replicas: only the leader's jobs fire; after a resignation or a stop the other's do."""
    fired: list[str] = []
    both_running: list[float] = []
    schedulers: dict[str, AsyncIOScheduler] = {}
    elections: dict[str, Election] = {}
    replicas: dict[str, asyncio.Task[None]] = {}

    async def job(replica: str) -> None:
        fired.append(replica)

    async def witness() -> None:
        while True:  # a sample every 2 ms: never two schedulers resumed at once
            if sum(s.state == STATE_RUNNING for s in schedulers.values()) > 1:
                both_running.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.002)

    def start(replica: str, lock_client: redis.Redis) -> None:
        scheduler = AsyncIOScheduler()
        scheduler.add_job(job, "interval", seconds=0.05, args=[replica])
        schedulers[replica] = scheduler
        elections[replica] = Election(lock_client, name, ttl=2.0, identity=replica)
        replicas[replica] = asyncio.create_task(
            apscheduler_leader.lead_the_schedule(elections[replica], scheduler)
        )

    async with fence_deleted(admin, name):
        watching = asyncio.create_task(witness())
        try:
            start("a", client)
            await eventually(lambda: fired.count("a") >= 3, "replica a's job to fire")
            start("b", other_client)
            await eventually(lambda: len(schedulers["b"].get_jobs()) == 1, "b's scheduler")
            await asyncio.sleep(0.5)  # b waits as a standby: its job never fires
            assert "b" not in fired, fired
            assert await elections["a"].resign()  # a steps down and campaigns again behind b
            await eventually(lambda: fired.count("b") >= 3, "replica b's job to fire")
            replicas["b"].cancel()  # b stops: its term goes back to a
            with contextlib.suppress(asyncio.CancelledError):
                await replicas["b"]
            fired_by_b = fired.count("b")
            await eventually(lambda: fired[-3:] == ["a"] * 3, "replica a's job to fire again")
            assert fired.count("b") == fired_by_b
            replicas["a"].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replicas["a"]
        finally:
            for task in (watching, *replicas.values()):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    assert both_running == []
    assert [replica for replica, _ in itertools.groupby(fired)] == ["a", "b", "a"], fired
    assert all(s.state != STATE_RUNNING for s in schedulers.values())


# -- celery beat under aiolock run --elect ---------------------------------------------------


class Candidate:
    """One ``aiolock run --elect ... -- celery beat`` process, in a session of its own."""

    def __init__(self, url: str, tag: str, folder: Path) -> None:
        self.tag = tag
        self.log = folder / f"candidate-{tag}.log"
        with self.log.open("wb") as log:
            self.proc = self._start(url, folder, log)

    def _start(self, url: str, folder: Path, log: BinaryIO) -> subprocess.Popen[bytes]:
        tag = self.tag
        return subprocess.Popen(
            [
                *[sys.executable, "-m", "aiolock", "run", "--elect", "--ttl", str(BEAT_TTL)],
                *["--identity", tag, "celery-beat", "--"],
                *[sys.executable, "-m", "celery", "-A", "celery_beat", "--workdir", str(EXAMPLES)],
                *["beat", "--schedule", str(folder / f"schedule-{tag}"), "--loglevel", "WARNING"],
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "AIOLOCK_URL": url,
                "CELERY_BROKER_URL": url,
                "REFRESH_EVERY": str(BEAT_EVERY),
            },
            start_new_session=True,
        )

    def beats(self) -> set[int]:
        """The process ids of the ``celery beat`` processes this candidate runs now."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        with contextlib.suppress(OSError):
            return {int(pid) for pid in children.read_text().split()}
        return set()

    def kill(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the candidate's whole process group (its beat too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def finish(self) -> int:
        """Wait for the candidate to end (bounded); its exit status."""
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"candidate {self.tag} did not end")
        return self.proc.returncode


#: The term's lease of the beat's candidates, and the beat's period (seconds).
BEAT_TTL = 2
BEAT_EVERY = 0.25


@pytest.mark.heavy
def test_celery_beat_under_aiolock_run_elect_runs_one_beat_and_fails_over(
    private_server: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """Only the leading candidate runs a beat; a SIGTERM hands over, a SIGKILL within ttl + 5 s."""
    server = private_server()
    db = sync_redis.Redis.from_url(server.url, decode_responses=True)
    senders: list[tuple[float, int]] = []  # (when the test read it, the beat that sent it)
    running_together: list[set[int]] = []
    candidates: list[Candidate] = []

    def read_messages() -> None:
        while message := db.lpop("celery"):
            origin = json.loads(str(message))["headers"]["origin"]  # gen<pid>@<host>
            senders.append((time.monotonic(), int(origin.removeprefix("gen").split("@")[0])))
        beating = [c.beats() for c in candidates]
        if sum(bool(b) for b in beating) > 1:
            running_together.append(set().union(*beating))

    def until(condition: Callable[[], bool], what: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}: {senders}")
            time.sleep(0.02)
            read_messages()
        return time.monotonic()

    def sent_by(candidate: Candidate) -> Callable[[], bool]:
        return lambda: any(pid in candidate.beats() for _, pid in senders[-1:])

    try:
        a = Candidate(server.url, "a", tmp_path)
        candidates.append(a)
        until(lambda: bool(senders), "the first beat to send", 15.0)
        b = Candidate(server.url, "b", tmp_path)
        candidates.append(b)
        settled = time.monotonic()
        until(lambda: time.monotonic() > settled + 1.5, "b to stay a standby", 5.0)
        assert b.beats() == set(), "the standby runs a beat"
        window = [s for s in senders if s[0] > settled]
        assert len(window) <= 1.5 / BEAT_EVERY + 2, "more ticks than one beat sends"

        a.proc.send_signal(signal.SIGTERM)  # passed on to a's beat; the term goes to b
        until(sent_by(b), "b's beat to send", 10.0)
        assert a.finish() == 0
        c = Candidate(server.url, "c", tmp_path)
        candidates.append(c)
        started_c = time.monotonic()
        until(lambda: time.monotonic() > started_c + 1.0, "c to campaign", 5.0)
        b.kill(signal.SIGKILL)  # the host dies: its term ends with its lease
        killed = time.monotonic()
        took_over = until(sent_by(c), "c's beat to send", BEAT_TTL + 10.0)
        assert took_over - killed < BEAT_TTL + 5.0
    finally:
        for candidate in candidates:
            candidate.kill(signal.SIGKILL)
            candidate.proc.wait(timeout=15)
        db.close()
    beats = [pid for _, pid in senders]
    assert len([pid for pid, _ in itertools.groupby(beats)]) == 3, beats  # a's, b's, c's
    assert running_together == []


# -- taskiq: a cron job that skips a run while the last one runs, one scheduler ----------------


def started(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=EXAMPLES,
            env={**os.environ, **env},
            start_new_session=True,
        )


#: The job's period (whole seconds: taskiq's least) and how long one run of it takes.
EXPORT_EVERY = 1
EXPORT_SECONDS = 2.5


@pytest.mark.heavy
def test_taskiq_cron_job_skips_a_run_while_the_last_runs_and_one_scheduler_sends(
    private_server: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """Two workers, two schedulers: runs never overlap, overlapping ones skip, one send a period."""
    server = private_server()
    env = {
        "REDIS_URL": server.url,
        "EXPORT_EVERY": str(EXPORT_EVERY),
        "EXPORT_SECONDS": str(EXPORT_SECONDS),
    }
    worker = [sys.executable, "-m", "taskiq", "worker", "taskiq_cron:broker", "--workers", "1"]
    scheduler = [sys.executable, "taskiq_cron.py"]
    db = sync_redis.Redis.from_url(server.url, decode_responses=True)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for number in range(2):
            processes.append(started(worker, env, tmp_path / f"worker-{number}.log"))
            processes.append(started(scheduler, env, tmp_path / f"scheduler-{number}.log"))
        deadline = time.monotonic() + 20.0
        while not db.lrange("export-orders:log", 0, 0):
            assert time.monotonic() < deadline, "no run of the job started within 20 s"
            time.sleep(0.02)
        first = time.monotonic()
        time.sleep(3 * EXPORT_SECONDS)  # three runs' worth: two runs, the other sends skipped
        log = db.lrange("export-orders:log", 0, -1)
        skipped = int(db.get("export-orders:skipped") or 0)
        elapsed = time.monotonic() - first
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
        db.close()
    events = [line.split()[0] for line in log]
    assert events[: len(events) // 2 * 2] == ["start", "end"] * (len(events) // 2), log
    runs = events.count("start")
    assert runs >= 2, log
    assert skipped >= 2, "no run was skipped while the last one ran"
    # One scheduler sends once a period (two would send twice): one more for each edge.
    assert runs + skipped <= elapsed / EXPORT_EVERY + 2, (runs, skipped, elapsed)
