"""Bad arguments fail at once, clearly, and touch nothing (docs/design.md, The public contract).

"Bad arguments (ttl <= 0 or not finite, empty name, negative timeout, a backoff
that yields negative or NaN delays, a client that is not redis.asyncio) fail at
construction with ValueError/TypeError and a message that names the argument
and the value." Construction never talks to the server.

The arguments every primitive shares (name, ttl, timeout, the bool options,
backoff, on_lost, prefix, and those of acquire() and extend()) are checked for
every primitive in test_contract.py; here, what is AsyncLock's own: the client,
its own options, and construction without a server.
"""

from __future__ import annotations

import asyncio
import math
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from support.leaks import connections_made, other_tasks
from support.locks import all_keys, names, names_value
from support.timing import eventually

from aiolock import AsyncLock, ReadWriteLock, Redlock, Semaphore, _checks, backoff
from aiolock._checks import LONG_TTL, MAX_SECONDS
from aiolock._keys import Keys
from aiolock._server_state import ENTRY_CAP
from aiolock.testing import RedisServer, free_port

NAN = float("nan")
INF = float("inf")

BOOL_OPTIONS = ["blocking", "auto_renew", "notify", "cancel_on_lost", "reentrant", "fencing"]
#: The bool options Redlock does not take (the others are checked in test_contract.py).
ASYNC_LOCK_ONLY_BOOL_OPTIONS = ["notify", "fencing"]


async def assert_nothing_left(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """The failed call sent nothing through ``client`` and left no key of ``name``."""
    assert connections_made(client) == 0, "a bad argument made the client connect"
    assert await admin.keys(all_keys(name)) == []


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
    assert await admin.keys(all_keys(name)) == []


# --- name -----------------------------------------------------------------------------------------


# --- keyword options ------------------------------------------------------------------------------


def _option_cases() -> Iterator[Any]:
    """(option, value, error, shown in the message) for the options only AsyncLock has.

    The options every primitive takes are checked in test_contract.py.
    """
    for option in ASYNC_LOCK_ONLY_BOOL_OPTIONS:
        for value in [1, 0, "yes", None]:
            yield pytest.param(option, value, TypeError, repr(value), id=f"{option}={value!r}")


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
    """Each bad AsyncLock-only option raises at construction, naming the option and the value."""
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
    assert AsyncLock(client, name, prefix="app:").key == Keys(name, "app:").lock
    await assert_nothing_left(client, admin, name)


# --- durations the server can store --------------------------------------------------------------

#: The next float above the longest duration aiolock sends to the server.
ABOVE_MAX = math.nextafter(MAX_SECONDS, math.inf)


def names_the_limit(arg: str, value: object) -> str:
    """A ``match=`` pattern: names ``arg``, shows ``repr(value)`` and the limit in seconds."""
    return names_value(arg, value) + rf"(?=.*{re.escape(f'{MAX_SECONDS:g}')} s\b)"


async def test_replica_timeout_beyond_what_wait_takes_fails_at_construction(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """replica_timeout above MAX_SECONDS (WAIT's milliseconds) is a ValueError."""
    for value in (ABOVE_MAX, 1e16):
        with pytest.raises(ValueError, match=names_the_limit("replica_timeout", value)):
            AsyncLock(client, name, replicas=1, replica_timeout=value)
    AsyncLock(client, name, replicas=1, replica_timeout=MAX_SECONDS)
    await assert_nothing_left(client, admin, name)


#: (the parameter named, a factory of a policy given that value) for every built-in policy.
_FACTORIES: list[tuple[str, Callable[[float], backoff.Backoff]]] = [
    ("delay", backoff.constant),
    ("step", lambda v: backoff.linear(step=v, cap=1.0)),
    ("cap", lambda v: backoff.linear(step=0.01, cap=v)),
    ("base", lambda v: backoff.exponential(base=v)),
    ("cap", lambda v: backoff.exponential(cap=v)),
    ("base", lambda v: backoff.decorrelated(base=v, cap=v)),
    ("cap", lambda v: backoff.decorrelated(cap=v)),
    ("interval", lambda v: backoff.yield_then_sleep(0.1, v)),
]


@pytest.mark.parametrize(
    ("parameter", "factory"),
    _FACTORIES,
    ids=[
        "constant",
        "linear.step",
        "linear.cap",
        "exponential.base",
        "exponential.cap",
        "decorrelated.base",
        "decorrelated.cap",
        "yield_then_sleep.interval",
    ],
)
async def test_a_built_in_policy_pausing_longer_than_the_server_keeps_is_refused(
    parameter: str,
    factory: Callable[[float], backoff.Backoff],
    client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
) -> None:
    """A built-in policy's delay above MAX_SECONDS fails in its factory, naming it."""
    for value in (ABOVE_MAX, 1e16):
        with pytest.raises(ValueError, match=names_the_limit(parameter, value)):
            AsyncLock(client, name, backoff=factory(value))
    AsyncLock(client, name, backoff=factory(MAX_SECONDS))
    await assert_nothing_left(client, admin, name)


async def test_the_longest_backoff_delay_is_accepted_and_the_waiter_still_gets_in(
    client: redis.asyncio.Redis,
    other_client: redis.asyncio.Redis,
    admin: redis.asyncio.Redis,
    name: str,
    no_leaks: None,
) -> None:
    """A waiter pausing MAX_SECONDS queues (its entry lives ENTRY_CAP) and gets the lock.

    Above MAX_SECONDS the policy is refused. The pause no longer sets any
    lifetime on the server (the waiting marker's did): the entry lives
    min(ttl, ENTRY_CAP) and is refreshed.
    """
    with pytest.raises(ValueError, match=names_the_limit("delay", ABOVE_MAX)):
        backoff.constant(ABOVE_MAX)
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=5.0, backoff=backoff.constant(MAX_SECONDS))
    waiting = asyncio.create_task(waiter.acquire())  # no timeout
    try:
        queue = Keys(name).queue
        await eventually(lambda: admin.exists(queue), "the waiter queued")
        (entry,) = await admin.keys(f"{queue}:*")
        assert 0 < await admin.pttl(entry) <= ENTRY_CAP * 1000
        await holder.release()
        assert await asyncio.wait_for(waiting, 5.0)
        await waiter.release()
    finally:
        waiting.cancel()
        if holder.statistics().held:
            await holder.release()


# --- acquire() and extend() arguments -------------------------------------------------------------


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
            assert lock.key == Keys(name).lock
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


# --- a plain `with` -------------------------------------------------------------------------------


async def test_a_plain_with_is_a_type_error_that_says_async_with(
    client: redis.asyncio.Redis, admin: redis.asyncio.Redis, name: str
) -> None:
    """`with lock:` on any primitive: a TypeError naming it and saying `async with`; nothing sent.

    Not Python's generic "does not support the context manager protocol". To a
    type checker the plain `with` stays an error (the ignore below is needed).
    """
    rw = ReadWriteLock(client, name)
    locks: list[tuple[str, Any]] = [
        ("AsyncLock", AsyncLock(client, name)),
        ("Semaphore", Semaphore(client, name, limit=2)),
        ("the reader side of ReadWriteLock", rw.reader),
        ("the writer side of ReadWriteLock", rw.writer),
        ("Redlock", Redlock([client], name)),
    ]
    for what, lock in locks:
        entered = False
        said = rf"^{re.escape(f'{what} {name!r}')}.*'async with'"
        with pytest.raises(TypeError, match=said), lock:
            entered = True
        assert not entered, what
    typed = AsyncLock(client, name)
    with pytest.raises(TypeError, match=r"AsyncLock.*'async with', not 'with'"), typed:  # type: ignore[attr-defined]
        pass
    # The read-write lock itself is held through its sides: either `with` says so.
    whole: Any = rw
    sides = r"'async with rw\.reader:' or 'async with rw\.writer:'"
    with pytest.raises(TypeError, match=sides), whole:
        pass
    with pytest.raises(TypeError, match=sides):
        async with whole:
            pass
    await assert_nothing_left(client, admin, name)


# --- a ttl above a day ----------------------------------------------------------------------------


def test_a_ttl_above_a_day_is_taken_with_one_warning_per_process(
    client: redis.asyncio.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ttl=100000 (milliseconds meant?) makes the lock, warning once per process that ttl is in s.

    The warning shows the value and the lease it makes, and points at the
    caller's line. The next lock with a huge ttl (any primitive) does not warn
    again; a day exactly, or a long max_hold, never does.
    """
    monkeypatch.setattr(_checks, "_long_ttl_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncLock(client, name, ttl=LONG_TTL, max_hold=10 * LONG_TTL)
        Semaphore(client, name, limit=2, ttl=LONG_TTL)
    assert caught == []
    with pytest.warns(UserWarning, match=r"^ttl=100000 is in seconds") as warned:
        lock = AsyncLock(client, name, ttl=100_000)
    assert lock.ttl == 100_000
    assert len(warned) == 1
    message = str(warned[0].message)
    assert message.startswith("ttl=100000 is in seconds: a lease of 27.8 hours"), message
    assert "ttl=100.0" in message, message  # what milliseconds would have been
    assert warned[0].filename == __file__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncLock(client, name, ttl=200_000)
        Semaphore(client, name, limit=2, ttl=1e7)
        ReadWriteLock(client, name, ttl=1e7)
        Redlock([client], name, ttl=1e7)
    assert caught == []
    makers: list[Callable[[], object]] = [
        lambda: Semaphore(client, name, limit=2, ttl=1e7),
        lambda: ReadWriteLock(client, name, ttl=1e7),
        lambda: Redlock([client], name, ttl=1e7),
    ]
    for make in makers:  # each primitive warns (the first in a process)
        monkeypatch.setattr(_checks, "_long_ttl_warned", False)
        said = r"^ttl=10000000 is in seconds: a lease of 115\.7 days"
        with pytest.warns(UserWarning, match=said):
            make()
