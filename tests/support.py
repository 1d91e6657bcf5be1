"""Helpers shared by the test modules: polling, event loops, leak checks, server states.

Fixtures live in ``conftest.py``; the plain functions they and the tests
share live here, once, so that no test module keeps a copy of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import inspect
import os
import random
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis.asyncio as redis
import uvicorn

from aiolock import LockEvent
from aiolock._keys import DEFAULT_PREFIX, Keys
from aiolock.testing import FaultProxy, RedisServer, server_version

__all__ = [
    "CALLBACK_KINDS",
    "EXAMPLES",
    "LOOPS",
    "CriticalSection",
    "Lateness",
    "LossRecorder",
    "Own",
    "all_keys",
    "assert_absent_and_stays",
    "assert_nothing_leaked",
    "blocked_client_ids",
    "calls",
    "cancel_once_the_key_exists",
    "connected",
    "connections_made",
    "draw",
    "eventually",
    "finish",
    "in_use_connections",
    "is_listener",
    "keys_of",
    "kinds",
    "listeners_gone",
    "load_example",
    "names",
    "names_value",
    "other_tasks",
    "pid_gone",
    "run_on",
    "serve_with_uvicorn",
    "started_servers",
    "the_miss",
    "wait_for_key",
    "wait_for_paused_client",
]

# --- event loops ---------------------------------------------------------------------------------

#: The event loops the suite runs on, by name: asyncio's default, and uvloop where it exists.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
if sys.platform != "win32":  # uvloop is a dev dependency wherever it exists
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop


def run_on(
    factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]
) -> None:
    """Run ``main`` to completion on a fresh loop from ``factory``, then close the loop.

    Like ``asyncio.run``: tasks still running at the end (a notification
    listener in its linger) are cancelled before the loop closes.
    """
    loop = factory()
    try:
        loop.run_until_complete(main)
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


#: Server features some tests need, and the Redis release that brought each (every Valkey
#: has them all: Valkey began as Redis 7.2).
FEATURES = {
    "sharded pub/sub": (7, 0),  # SSUBSCRIBE, SPUBLISH, PUBSUB SHARDNUMSUB
    "WAITAOF": (7, 2),
}


@functools.cache
def server_release() -> tuple[str, tuple[int, int]]:
    """The test server's name (``redis`` or ``valkey``) and its (major, minor) release."""
    name, _, version = server_version().partition(" ")
    major, minor = (int(part) for part in version.split(".")[:2])
    return name, (major, minor)


def has(feature: str) -> bool:
    """Whether the test server has ``feature`` (a key of :data:`FEATURES`)."""
    name, release = server_release()
    return name != "redis" or release >= FEATURES[feature]


def needs(feature: str) -> pytest.MarkDecorator:
    """Skip the test on a server without ``feature`` (``make matrix`` runs older servers)."""
    name, (major, minor) = server_release()
    need = ".".join(map(str, FEATURES[feature]))
    return pytest.mark.skipif(
        not has(feature),
        reason=f"needs {feature} (Redis {need}); the server is {name} {major}.{minor}",
    )


def draw() -> int:
    """A fresh random draw, or the one in ``AIOLOCK_TEST_DRAW`` to replay a failure."""
    given = os.environ.get("AIOLOCK_TEST_DRAW")
    return int(given) if given else random.randrange(2**32)


# --- polling -------------------------------------------------------------------------------------


async def eventually(
    check: Callable[[], object],
    what: str = "the condition",
    timeout: float = 5.0,
    every: float = 0.005,
) -> None:
    """Poll ``check`` (plain or async) until it is true; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if await outcome if inspect.isawaitable(outcome) else outcome:
            return
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)


def pid_gone(pid: int) -> bool:
    """Whether no process (not even a zombie) has the id ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def finish(task: asyncio.Future[Any]) -> None:
    """Cleanup after a failed test: cancel ``task`` if it still runs, and await it."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --- servers and examples -----------------------------------------------------------------------

#: The repository's ``examples/`` folder.
EXAMPLES = Path(__file__).parents[1] / "examples"


@contextlib.contextmanager
def started_servers(count: int) -> Iterator[list[RedisServer]]:
    """``count`` private servers, all stopped at the end (also if one fails to start)."""
    started: list[RedisServer] = []
    try:
        started.extend(RedisServer().start() for _ in range(count))
        yield started
    finally:
        for srv in started:
            srv.stop()


def load_example(filename: str) -> ModuleType:
    """Import ``examples/<filename>`` by path (examples are not a package)."""
    path = EXAMPLES / filename
    spec = importlib.util.spec_from_file_location(f"{path.stem}_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- clients -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def connected(url: str, **options: Any) -> AsyncIterator[redis.Redis]:
    """A ``redis.asyncio`` client of ``url`` (with redis-py ``options``), closed at the end."""
    c = redis.Redis.from_url(url, **options)
    try:
        yield c
    finally:
        await c.aclose()


@contextlib.asynccontextmanager
async def user_without_channels(admins: list[redis.Redis]) -> AsyncIterator[tuple[str, str]]:
    """A user on every server of ``admins`` with every command and key but no channel.

    What new users get on Redis 7+ (``resetchannels``); yields ``(user,
    password)`` and deletes the user at the end.
    """
    user = f"locker-{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    for admin in admins:
        await admin.acl_setuser(
            user,
            enabled=True,
            passwords=[f"+{password}"],
            keys=["~*"],
            categories=["+@all"],
            reset_channels=True,
        )
    try:
        yield user, password
    finally:
        for admin in admins:
            await admin.acl_deluser(user)


@dataclass
class Own:
    """A private server of the test's own (to pause, kill, restart), a lock client, an admin."""

    server: RedisServer
    client: redis.Redis
    admin: redis.Redis


# --- leak checks ---------------------------------------------------------------------------------


def is_listener(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is the release-notification listener of a client.

    Listeners outlive the waits that started them by a short linger, and end
    by themselves; ``no_leaks`` checks that they do.
    """
    return task.get_name().startswith("aiolock-notify")


async def other_tasks() -> set[asyncio.Task[Any]]:
    """The tasks of this loop but the caller and listeners, after letting finished ones go."""
    for _ in range(3):
        await asyncio.sleep(0)
    me = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not me and not is_listener(t)}


async def listeners_gone(timeout: float = 3.0) -> bool:
    """Wait until no release-notification listener task runs; False if one still does."""
    deadline = time.monotonic() + timeout
    while any(is_listener(t) for t in asyncio.all_tasks()):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def in_use_connections(c: redis.Redis) -> int:
    """How many connections of ``c``'s pool are checked out."""
    return len(c.connection_pool._in_use_connections)


async def assert_nothing_leaked(*clients: redis.Redis) -> None:
    """No task besides the caller, no connection checked out on any of ``clients``."""
    assert await other_tasks() == set(), "a task outlived its lock"
    for c in clients:
        assert in_use_connections(c) == 0, "a connection was left checked out"


def connections_made(c: redis.Redis) -> int:
    """How many connections ``c``'s pool has opened and still keeps (idle or in use)."""
    pool = c.connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)


# --- messages ----------------------------------------------------------------------------------


def names(arg: str, shown: str) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``shown`` as a whole token."""
    return (
        rf"(?s)(?=.*\b{re.escape(arg)}\b)"
        rf"(?=.*(?<![\w.]){re.escape(shown)}(?![\w.]))"
    )


def names_value(arg: str, value: object) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``repr(value)``."""
    return names(arg, repr(value))


# --- key names -----------------------------------------------------------------------------------


def all_keys(name: str) -> str:
    """A ``KEYS`` pattern for every key of lock ``name`` (any prefix, any companion)."""
    return f"*{Keys(name, prefix='').lock}*"


class Lateness:
    """How late this event loop's timers fire while it runs: the load a test runs under.

    A task ticks every ``tick`` seconds and writes down how late each tick
    woke. On an idle machine the ticks are a fraction of a millisecond late;
    with busy processes beside the suite the loop waits for a core, and every
    step of a chain of awaits (a timer, a reply, a retry) waits as long.
    :meth:`between` sums the lateness of the ticks in a window: what a bound
    on that window adds so that it holds on a loaded machine and still fails
    on an idle one when the library is slow. Use it as ``async with``.
    """

    def __init__(self, tick: float = 0.01) -> None:
        self.tick = tick
        self._ticks: list[tuple[float, float]] = []  # (woke at, how late)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + self.tick
            await asyncio.sleep(self.tick)
            woke = time.monotonic()
            self._ticks.append((woke, max(woke - due, 0.0)))

    async def __aenter__(self) -> Lateness:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def between(self, start: float, end: float) -> float:
        """The lateness of the ticks that woke from ``start`` to ``end`` (monotonic), summed."""
        return sum(late for woke, late in self._ticks if start <= woke <= end + self.tick)


class Answers:
    """How long servers take to answer a ``PING`` while a test runs, as this loop sees it.

    A task pings each server of ``urls`` (on clients of its own) every
    ``tick`` seconds and writes down each round trip: a server starved of a
    core and a loop starved of one both show. Use it as ``async with``;
    :meth:`slowest` is the longest round trip seen.
    """

    def __init__(self, *urls: str, tick: float = 0.01) -> None:
        self.clients = [redis.Redis.from_url(url) for url in urls]
        self.tick = tick
        self.times: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            for client in self.clients:
                sent = time.monotonic()
                await client.ping()
                self.times.append(time.monotonic() - sent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.tick)

    async def __aenter__(self) -> Answers:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Stopped between pings, not cancelled in one: a command cancelled in flight
        # can leave redis-py's connection waiting.
        assert self._task is not None
        self._stop.set()
        await self._task
        for client in self.clients:
            await client.aclose()

    def slowest(self) -> float:
        """The longest round trip seen (seconds); 0 before the first answer."""
        return max(self.times, default=0.0)


async def holds_on_server(lock: Any) -> bool:
    """Whether the object's current holding (whichever task acquired it) is the server's.

    ``owned()`` answers for the calling task only; a test that let another
    task acquire (a task that may have ended since, leaving the holding to
    be released by anyone) asks the server about that holding's token here.
    """
    holding = lock._current
    if holding is None or holding.ended or holding.lost:
        return False
    return bool(await lock._lease.holds(holding.token))


def keys_of(lock: Any, prefix: str = DEFAULT_PREFIX) -> Keys:
    """The key names of ``lock`` (made with ``prefix``), checked against its own ``key``."""
    kind = {"Semaphore": "semaphore", "RWSide": "rw"}.get(type(lock).__name__, "lock")
    keys = Keys(lock.name, prefix, kind=kind)
    assert keys.lock == lock.key, (keys, lock.key)
    return keys


# --- server states -------------------------------------------------------------------------------


async def calls(admin: redis.Redis, command: str) -> int:
    """How many times the server ran ``command`` since the last CONFIG RESETSTAT."""
    stats = await admin.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


async def blocked_client_ids(admin: redis.Redis) -> set[str]:
    """The ids of the clients the server holds blocked (``CLIENT LIST`` flag ``b``)."""
    return {c["id"] for c in await admin.client_list() if "b" in c["flags"]}


async def wait_for_paused_client(admin: redis.Redis) -> None:
    """Until a client's command is held back by ``CLIENT PAUSE``.

    Measured on valkey 8.1: ``INFO clients`` shows ``blocked_clients: 1`` and
    ``paused_reason: client_pause`` (``CLIENT LIST`` shows the client with flag
    ``b`` and ``cmd=evalsha``). Redis 7.0 has no ``paused_reason``:
    there ``blocked_clients`` alone says it (these tests block on nothing else).
    """

    async def paused_one() -> bool:
        info = await admin.info("clients")
        reason = info.get("paused_reason", "client_pause")
        return int(info["blocked_clients"]) > 0 and reason == "client_pause"

    await eventually(paused_one, "a client blocked by CLIENT PAUSE", timeout=3.0, every=0.002)


async def wait_for_key(admin: redis.Redis, key: str) -> None:
    """Until ``key`` exists on the server."""

    async def exists() -> bool:
        return bool(await admin.exists(key))

    await eventually(exists, f"the key {key!r} to appear", timeout=3.0, every=0.002)


async def assert_absent_and_stays(admin: redis.Redis, key: str) -> None:
    """``key`` does not exist, and still does not a moment later."""
    assert await admin.exists(key) == 0, f"{key!r} was left on the server"
    await asyncio.sleep(0.05)
    assert await admin.exists(key) == 0, f"{key!r} appeared after the cancellation"


# --- mutual exclusion ----------------------------------------------------------------------------


class CriticalSection:
    """Counts the holders in a critical section: ``overlaps`` counts entries that found company."""

    def __init__(self) -> None:
        self.inside = 0
        self.overlaps = 0
        self.holdings = 0

    async def stay(self, seconds: float = 0.001) -> None:
        """Be inside for ``seconds`` (call it while holding the lock)."""
        self.inside += 1
        self.overlaps += self.inside != 1
        self.holdings += 1
        await asyncio.sleep(seconds)
        self.inside -= 1


# --- observer events -----------------------------------------------------------------------------


def kinds(events: list[LockEvent], name: str) -> list[str]:
    """The kinds of the events of lock ``name``, in order."""
    return [e.kind for e in events if e.name == name]


def the_miss(events: list[LockEvent], lock: object) -> LockEvent:
    """The one event of ``lock``, which must be a 'not_acquired'."""
    mine = [e for e in events if e.lock is lock]
    assert [e.kind for e in mine] == ["not_acquired"]
    return mine[0]


# --- loss ----------------------------------------------------------------------------------------


class LossRecorder:
    """An ``on_lost`` callback (plain or async) that records which lock lost, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, float]] = []
        self.event = asyncio.Event()

    @property
    def locks(self) -> list[Any]:
        """The locks the callback was called with, in order."""
        return [who for who, _ in self.calls]

    def function(self, lock: Any) -> None:
        """The plain-function form of the callback."""
        self.calls.append((lock, time.monotonic()))
        self.event.set()

    async def coroutine_function(self, lock: Any) -> None:
        """The coroutine-function form: it must be run to the end, not dropped."""
        at = time.monotonic()
        await asyncio.sleep(0)
        self.calls.append((lock, at))
        self.event.set()

    def callback(self, kind: str) -> Callable[[Any], object]:
        """The callback of ``kind``: ``"function"`` or ``"coroutine_function"``."""
        return self.function if kind == "function" else self.coroutine_function

    async def wait(self, timeout: float = 2.0) -> float:
        """Wait for the callback; return when it ran."""
        await asyncio.wait_for(self.event.wait(), timeout)
        return float(self.calls[0][1])


#: The kinds of ``on_lost`` callbacks a lock accepts (see :meth:`LossRecorder.callback`).
CALLBACK_KINDS = ["function", "coroutine_function"]


async def cancel_once_the_key_exists(
    proxies: list[FaultProxy], admins: list[redis.Redis], key: str, acquire: Awaitable[Any]
) -> None:
    """Hold replies, run ``acquire`` until every server has the key, cancel it.

    The caller has used the proxied clients once, so their pools have a
    connection (which the proxies then hold) and the servers know the scripts.
    """
    assert all(p.connections > 0 for p in proxies)
    for p in proxies:
        p.hold_replies()
    task = asyncio.ensure_future(acquire)
    try:
        for a in admins:
            await wait_for_key(a, key)
        assert not task.done(), "the reply was not held back"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        for p in proxies:
            p.release_replies()
        await finish(task)


# --- other processes -----------------------------------------------------------------------------

#: The checkout's root: other Python processes import its aiolock.
ROOT = Path(__file__).resolve().parent.parent


async def start_python(
    code: str, *args: str, stdout: int | None = None
) -> asyncio.subprocess.Process:
    """Run ``code`` with ``args`` in another Python process that imports this checkout's aiolock."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stdout=stdout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


#: Bounds on starting and stopping an in-process web server.
_STARTUP = 10.0
_SHUTDOWN = 10.0


@contextlib.asynccontextmanager
async def serve_with_uvicorn(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app in-process with uvicorn (lifespan on); yield its base URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        lifespan="on",
        log_config=None,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="test-uvicorn")
    try:
        await eventually(lambda: server.started or task.done(), "uvicorn to start", _STARTUP, 0.01)
        if task.done():
            await task
            pytest.fail("uvicorn stopped during startup")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(_SHUTDOWN):
            await task
