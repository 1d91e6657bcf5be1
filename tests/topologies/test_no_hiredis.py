"""Without hiredis (a pure-Python install, PyPy): release notifications work.

redis-py 8 refused the listener's connection without hiredis ("Maintenance
notifications are only supported with hiredis and RESP3 parsers!"); the
listener task died ("Task exception was never retrieved"), nothing restarted
it, and waiters woke only at their backoff step. These tests run in
subprocesses with hiredis hidden (``AIOLOCK_TEST_HIDE_HIREDIS=1``, which
``tests/conftest.py`` honours before anything imports redis).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.checkout import ROOT

from aiolock.testing import RedisServer

#: CPU-heavy (other processes): `make test` runs these after the others, two at a time.
pytestmark = pytest.mark.heavy


SCENARIO = """
import sys
sys.modules["hiredis"] = None
import asyncio, time
import redis.asyncio as aredis
from redis.utils import HIREDIS_AVAILABLE
from aiolock import AsyncLock, backoff
assert HIREDIS_AVAILABLE is False, "hiredis is not hidden"
url = sys.argv[1]
async def run():
    c = aredis.Redis.from_url(url)
    other = aredis.Redis.from_url(url)
    holder = AsyncLock(other, "no-hiredis")
    assert await holder.acquire()
    waiter = AsyncLock(c, "no-hiredis", backoff=backoff.constant(3))
    waiting = asyncio.ensure_future(waiter.acquire(timeout=8))
    await asyncio.sleep(0.3)
    released = time.monotonic()
    await holder.release()
    assert await waiting
    woke = time.monotonic() - released
    await waiter.release()
    await c.aclose()
    await other.aclose()
    print(f"woke after {woke:.3f} s")
    return woke
asyncio.run(run())
"""


def _env() -> dict[str, str]:
    return {**os.environ, "AIOLOCK_TEST_HIDE_HIREDIS": "1", "PYTHONPATH": str(ROOT)}


def test_a_waiter_without_hiredis_wakes_at_the_release(server: RedisServer) -> None:
    """Regression: without hiredis a notified waiter wakes at once, and nothing dies.

    The waiter's backoff step is 3 s; before the fix it woke after about 2-3 s
    and stderr said "Task exception was never retrieved".
    """
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, server.url],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    woke = float(done.stdout.split("woke after ")[1].split()[0])
    assert woke < 1.0, done.stdout
    assert "never retrieved" not in done.stderr
    assert "Maintenance notifications" not in done.stderr
    assert done.stderr == "", done.stderr


@pytest.mark.timeout(300)
def test_the_notification_tests_pass_without_hiredis() -> None:
    """The notification tests (tests/mechanisms/test_notify.py) pass with hiredis hidden."""
    done = subprocess.run(
        # (Not the slow re-subscribe race: the listener's bookkeeping, which does not
        # depend on the parser; and on asyncio's loop only: the parser is the same on both.)
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-m",
            "not slow",
            "-k",
            "not uvloop",
            "tests/mechanisms/test_notify.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=_env(),
        check=False,
    )
    assert "hiredis: hidden" in done.stdout, done.stdout[-2000:]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
