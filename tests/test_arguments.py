"""Bad arguments fail at once, clearly, and touch nothing (DESIGN.md §1).

"Bad arguments (ttl <= 0 or not finite, empty name, negative timeout, a backoff
that yields negative or NaN delays, a client that is not redis.asyncio) fail at
construction with ValueError/TypeError and a message that names the argument
and the value." Construction never talks to the server.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.exceptions
from conftest import other_tasks
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aiolock import AsyncLock, backoff
from aiolock.testing import RedisServer, free_port

NAN = float("nan")
INF = float("inf")

BOOL_OPTIONS = ["blocking", "auto_renew", "notify", "cancel_on_lost", "reentrant", "fencing"]


def names(arg: str, shown: str) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``shown`` as a whole token."""
    return (
        rf"(?s)(?=.*\b{re.escape(arg)}\b)"
        rf"(?=.*(?<![\w.]){re.escape(shown)}(?![\w.]))"
    )


def names_value(arg: str, value: object) -> str:
    """A ``match=`` pattern: the message names ``arg`` and shows ``repr(value)``."""
    return names(arg, repr(value))


def connections_made(c: redis.asyncio.Redis) -> int:
    """How many connections ``c``'s pool has opened and still keeps (idle or in use)."""
    pool = c.connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)


async def assert_nothing_left(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """The failed call sent nothing through ``client`` and left no key of ``name``."""
    assert connections_made(client) == 0, "a bad argument made the client connect"
    assert await admin.keys(f"*{{{name}}}*") == []


# --- client ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_client",
    [None, "redis://127.0.0.1:6379", 42, object()],
    ids=["None", "url-string", "int", "object"],
)
async def test_client_that_is_not_redis_asyncio_is_a_type_error(
    bad_client: object, client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """A client that is not redis.asyncio is a TypeError naming `client` and the value's type."""
    # A client's repr is long; naming its type (or showing the repr) identifies the value.
    shown = rf"(?:\b{type(bad_client).__qualname__}\b|{re.escape(repr(bad_client))})"
    with pytest.raises(TypeError, match=rf"(?s)(?=.*\bclient\b)(?=.*{shown})"):
        AsyncLock(bad_client, name)  # type: ignore[arg-type]
    await assert_nothing_left(client, admin, name)


async def test_sync_client_is_a_type_error_that_says_synchronous(
    server: RedisServer, admin: redis.asyncio.Redis, name: str
) -> None:
    """A sync redis.Redis is rejected with a TypeError that says it is synchronous."""
    sync_client = redis.Redis.from_url(server.url)
    try:
        with pytest.raises(TypeError, match=names("client", "redis.client.Redis")) as excinfo:
            AsyncLock(sync_client, name)  # type: ignore[arg-type]
        assert "synchronous" in str(excinfo.value)
        assert "redis.asyncio.Redis" in str(excinfo.value)
        assert len(sync_client.connection_pool._available_connections) == 0
        assert len(sync_client.connection_pool._in_use_connections) == 0
    finally:
        sync_client.close()
    assert await admin.keys(f"*{{{name}}}*") == []


# --- name -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_name", "error"),
    [("", ValueError), (42, TypeError), (b"x", TypeError), (None, TypeError)],
    ids=["empty", "int", "bytes", "None"],
)
async def test_bad_name(
    bad_name: object,
    error: type[Exception],
    client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """An empty name is a ValueError; a name that is not a str is a TypeError; both name it."""
    with pytest.raises(error, match=names_value("name", bad_name)):
        AsyncLock(client, bad_name)  # type: ignore[arg-type]
    await assert_nothing_left(client, admin, name)


# --- keyword options ------------------------------------------------------------------------------


class NegativeBackoff(backoff.Backoff):
    """A user policy whose delays are negative."""

    def delays(self) -> Iterator[float]:
        while True:
            yield -1


class LaterNanBackoff(backoff.Backoff):
    """A user policy that goes bad at its third delay."""

    def delays(self) -> Iterator[float]:
        yield 0.01
        yield 0.02
        while True:
            yield NAN


def _returns_x(attempt: int) -> Any:
    return "x"


def _option_cases() -> Iterator[Any]:
    """(option, value, error, shown in the message) for every keyword option of AsyncLock."""
    for value, error in [
        (0, ValueError),
        (-1, ValueError),
        (0.0, ValueError),
        (-0.5, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (-INF, ValueError),
        (0.0001, ValueError),
        ("10", TypeError),
        (True, TypeError),
        (None, TypeError),
    ]:
        yield pytest.param("ttl", value, error, repr(value), id=f"ttl={value!r}")
    for value, error in [
        (-1, ValueError),
        (-0.001, ValueError),
        (-INF, ValueError),
        (NAN, ValueError),
        ("5", TypeError),
        (True, TypeError),
    ]:
        yield pytest.param("timeout", value, error, repr(value), id=f"timeout={value!r}")
    for option in BOOL_OPTIONS:
        for value in [1, 0, "yes", None]:
            yield pytest.param(option, value, TypeError, repr(value), id=f"{option}={value!r}")
    for value in [42, "fast", 0.5]:
        yield pytest.param("backoff", value, TypeError, repr(value), id=f"backoff={value!r}")
    for label, policy, error, shown in [
        ("lambda:-1.0", lambda n: -1.0, ValueError, "-1.0"),
        ("lambda:nan", lambda n: NAN, ValueError, "nan"),
        ("lambda:inf", lambda n: INF, ValueError, "inf"),
        ("returns-x", _returns_x, TypeError, "'x'"),
        ("from_callable:-1.0", backoff.from_callable(lambda n: -1.0), ValueError, "-1.0"),
        ("subclass:-1", NegativeBackoff(), ValueError, "-1"),
        ("subclass:nan-at-3rd", LaterNanBackoff(), ValueError, "nan"),
    ]:
        yield pytest.param("backoff", policy, error, shown, id=f"backoff={label}")
    for value in [42, "callback"]:
        yield pytest.param("on_lost", value, TypeError, repr(value), id=f"on_lost={value!r}")
    for value in [None, 3, b"app:"]:
        yield pytest.param("prefix", value, TypeError, repr(value), id=f"prefix={value!r}")


@pytest.mark.parametrize(("option", "value", "error", "shown"), list(_option_cases()))
async def test_bad_option_fails_at_construction(
    option: str,
    value: object,
    error: type[Exception],
    shown: str,
    client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """Each bad keyword option raises at construction, naming the option and the bad value."""
    kwargs: dict[str, Any] = {option: value}
    with pytest.raises(error, match=names(option, shown)):
        AsyncLock(client, name, **kwargs)
    await assert_nothing_left(client, admin, name)


@pytest.mark.parametrize("option", BOOL_OPTIONS)
async def test_bool_options_accept_true_and_false(
    option: str, client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """The bool options take True and False (the TypeError above is not over-eager)."""
    for value in (True, False):
        kwargs: dict[str, Any] = {option: value}
        AsyncLock(client, name, **kwargs)
    await assert_nothing_left(client, admin, name)


async def test_good_values_are_accepted_and_normalized(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """Ints become float seconds; timeout inf and None both wait forever; 0 tries once."""

    async def on_lost(lock: AsyncLock) -> None:
        pass

    assert AsyncLock(client, name, ttl=1).ttl == 1.0
    assert type(AsyncLock(client, name, ttl=1).ttl) is float
    assert AsyncLock(client, name, ttl=0.001).ttl == 0.001
    assert AsyncLock(client, name, timeout=None).timeout is None
    assert AsyncLock(client, name, timeout=INF).timeout is None
    assert AsyncLock(client, name, timeout=0).timeout == 0.0
    assert AsyncLock(client, name, timeout=2).timeout == 2.0
    AsyncLock(client, name, backoff=lambda attempt: 0.01 * attempt)
    AsyncLock(client, name, backoff=backoff.constant(0.0))
    AsyncLock(client, name, backoff=None)
    AsyncLock(client, name, on_lost=on_lost)
    AsyncLock(client, name, on_lost=lambda lock: None)
    assert AsyncLock(client, name, prefix="app:").key == f"app:{{{name}}}"
    await assert_nothing_left(client, admin, name)


# --- acquire() and extend() arguments -------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1, ValueError), (-0.5, ValueError), (NAN, ValueError), ("5", TypeError), (True, TypeError)],
    ids=["-1", "-0.5", "nan", "str", "True"],
)
async def test_acquire_rejects_a_bad_timeout_and_stays_usable(
    timeout: object,
    error: type[Exception],
    client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """acquire(timeout=bad) raises naming timeout, sends nothing, and the lock still works."""
    lock = AsyncLock(client, name)
    with pytest.raises(error, match=names_value("timeout", timeout)):
        await lock.acquire(timeout=timeout)  # type: ignore[arg-type]
    await assert_nothing_left(client, admin, name)
    assert await lock.acquire(timeout=0) is True
    await lock.release()


@pytest.mark.parametrize("blocking", ["no", 1, 0.0])
async def test_acquire_rejects_a_non_bool_blocking(
    blocking: object,
    client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """acquire(blocking=non-bool) is a TypeError naming blocking; nothing is sent."""
    lock = AsyncLock(client, name)
    with pytest.raises(TypeError, match=names_value("blocking", blocking)):
        await lock.acquire(blocking=blocking)  # type: ignore[arg-type]
    await assert_nothing_left(client, admin, name)
    assert await lock.acquire(blocking=False) is True
    await lock.release()


async def test_acquire_rejects_a_timeout_with_blocking_false(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str, no_leaks: None
) -> None:
    """acquire(blocking=False, timeout=1) is a ValueError (documented), and nothing is sent."""
    lock = AsyncLock(client, name)
    with pytest.raises(ValueError, match=r"(?s)(?=.*\btimeout\b)(?=.*\bblocking\b)"):
        await lock.acquire(blocking=False, timeout=1)
    await assert_nothing_left(client, admin, name)


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (0.0001, ValueError),
        ("10", TypeError),
        (True, TypeError),
    ],
    ids=["0", "-1", "nan", "inf", "0.0001", "str", "True"],
)
async def test_extend_rejects_a_bad_ttl_and_keeps_the_lease(
    ttl: object,
    error: type[Exception],
    client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """extend(ttl=bad) raises naming ttl; the holding and its lease on the server are untouched."""
    lock = AsyncLock(client, name, ttl=10.0)
    assert await lock.acquire()
    await admin.pexpire(lock.key, 7000)
    with pytest.raises(error, match=names_value("ttl", ttl)):
        await lock.extend(ttl=ttl)  # type: ignore[arg-type]
    pttl = await admin.pttl(lock.key)
    assert 5000 < pttl <= 7000, "a rejected extend changed the lease"
    assert not lock.lost
    assert await lock.owned()
    await lock.release()


# --- construction never talks to the server -------------------------------------------------------


def _unreachable_redis(port: int) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(
        host="127.0.0.1",
        port=port,
        retry=Retry(NoBackoff(), 0),
        socket_connect_timeout=1.0,
    )


def _every_option(client: Any, name: str) -> list[AsyncLock]:
    """Locks with every option set, on ``client``; made without awaiting anything."""
    return [
        AsyncLock(client, name),
        AsyncLock(
            client,
            name,
            ttl=2.5,
            timeout=0.5,
            blocking=False,
            backoff=backoff.decorrelated(0.001, 0.1),
            auto_renew=False,
            notify=False,
            on_lost=lambda lock: None,
            cancel_on_lost=True,
            reentrant=True,
            prefix="other:",
            fencing=True,
        ),
        AsyncLock(client, name, backoff=lambda attempt: 0.01),
        AsyncLock(client, name, backoff=ValidBackoff()),
    ]


class ValidBackoff(backoff.Backoff):
    """A user policy with valid delays (the probe at construction must pass it)."""

    def delays(self) -> Iterator[float]:
        return iter([0.01, 0.02, 0.04])


async def test_construction_does_not_contact_the_server(name: str) -> None:
    """Locks on a client whose port is closed are made without error and without connecting."""
    port = free_port()
    client = _unreachable_redis(port)
    try:
        locks = _every_option(client, name)
        assert connections_made(client) == 0
        # The port really is closed: the first command is what fails.
        with pytest.raises(redis.exceptions.ConnectionError):
            await locks[0].acquire(blocking=False)
    finally:
        await client.aclose()
    assert await other_tasks() == set()


async def test_construction_on_cluster_and_sentinel_clients_does_not_connect(name: str) -> None:
    """RedisCluster and Sentinel master_for() clients are accepted without any connection."""
    port = free_port()
    cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        [("127.0.0.1", port)], socket_connect_timeout=1.0
    )
    master = sentinel.master_for("mymaster")
    try:
        for c in (cluster, master):
            lock = AsyncLock(c, name, fencing=True)
            assert lock.key == f"aiolock:{{{name}}}"
        assert connections_made(master) == 0
    finally:
        await master.aclose()
        await cluster.aclose()
        for s in sentinel.sentinels:
            await s.aclose()


def test_lock_can_be_made_outside_an_event_loop(name: str) -> None:
    """A module-level lock (made with no running loop) constructs without touching anything."""
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    client = _unreachable_redis(free_port())
    locks = _every_option(client, name)
    assert [lock.name for lock in locks] == [name] * len(locks)
    assert connections_made(client) == 0
    asyncio.run(client.aclose())


async def test_backoff_going_bad_after_good_delays_fails_at_construction(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str, no_leaks: None
) -> None:
    """A callable backoff whose 2nd delay is bad is caught at construction, before any attempt."""
    calls: list[int] = []

    def policy(attempt: int) -> float:
        calls.append(attempt)
        return -1.0 if attempt >= 2 else 0.01

    with pytest.raises(ValueError, match=names("backoff", "-1.0")):
        AsyncLock(client, name, backoff=policy)
    assert calls[:2] == [1, 2]
    await assert_nothing_left(client, admin, name)
