"""The ``aiolock`` logger, the observer hook and the OpenTelemetry metrics.

Every test runs real locks against a real server and asserts the log
records, the :class:`aiolock.LockEvent` objects, or the metric points the
OpenTelemetry SDK collected. The events every primitive reports (acquired,
not_acquired, released, renewed, lost; one outcome per acquire) are proved for
every primitive in test_contract.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from support.locks import keys_of, kinds, the_miss
from support.timing import eventually

import aiolock
import aiolock.otel
from aiolock import AsyncLock, LockError, LockEvent, LockLostError

pytestmark = pytest.mark.usefixtures("no_leaks")


async def make_renewal_fail(admin: redis.Redis, key: str) -> None:
    """Replace the lock key by a hash: the extend script then fails with WRONGTYPE.

    aiolock reports it as a :class:`~aiolock.LockError` naming the kind the
    key now looks like (a hash: a ReadWriteLock's); renewal goes on trying
    until the lease ends, then declares the loss.
    """
    async with admin.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.hset(key, "not", "a lock")
        pipe.pexpire(key, 5000)
        await pipe.execute()


async def take_over(admin: redis.Redis, key: str) -> None:
    """Put another holder's token in the lock key: the next renewal finds the lock lost."""
    await admin.set(key, "someone else", px=5000)


async def hold_until_lost(
    lock: AsyncLock, admin: redis.Redis, spoil: Callable[[redis.Redis, str], Awaitable[None]]
) -> None:
    """Acquire ``lock``, ``spoil`` its key, wait for the loss; release raises it; key removed."""
    assert await lock.acquire()
    await spoil(admin, lock.key)
    await eventually(lambda: lock.lost, "the loss")
    with pytest.raises(LockLostError):
        await lock.release()
    await admin.delete(lock.key)


# --- the aiolock logger ---------------------------------------------------------------------------


async def test_acquired_and_released_are_logged_at_debug(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An acquisition and a release each write one DEBUG record on the 'aiolock' logger."""
    caplog.set_level(logging.DEBUG, logger="aiolock")
    async with AsyncLock(client, name, ttl=5.0):
        pass
    records = [r for r in caplog.records if name in r.getMessage()]
    assert [(r.name, r.levelno) for r in records] == [
        ("aiolock", logging.DEBUG),
        ("aiolock", logging.DEBUG),
    ]
    assert records[0].getMessage().startswith(f"acquired lock {name!r}")
    assert records[1].getMessage() == f"released lock {name!r}"


async def test_an_untroubled_holding_logs_nothing_above_debug(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Acquire, renew and release in a healthy run: no record at INFO or above."""
    caplog.set_level(logging.DEBUG, logger="aiolock")
    # A renewal is due a third of the way in (0.33 s); the lease leaves 0.67 s of
    # slack for it, so a machine busy with other tests does not turn a healthy
    # run into a loss.
    lock = AsyncLock(client, name, ttl=1.0)
    async with lock:
        await asyncio.sleep(0.45)
        assert await client.pttl(lock.key) > 600  # renewed: unrenewed it would be ~550
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


async def test_a_failing_renewal_and_the_loss_it_ends_in_are_warnings(
    client: redis.Redis, admin: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed renewal is a WARNING naming the error, and so is the loss at the lease end."""
    caplog.set_level(logging.DEBUG, logger="aiolock")
    lock = AsyncLock(client, name, ttl=0.3)
    await hold_until_lost(lock, admin, make_renewal_fail)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert all(r.name == "aiolock" for r in warnings)
    failures = [r for r in warnings if r.getMessage().startswith(f"renewal of lock {name!r}")]
    assert failures, [r.getMessage() for r in warnings]
    assert "LockError" in failures[0].getMessage()
    assert "in use by a ReadWriteLock" in failures[0].getMessage()
    losses = [r for r in warnings if r.getMessage().startswith(f"lost lock {name!r}")]
    assert len(losses) == 1
    assert "lease ran out" in losses[0].getMessage()


async def test_a_lock_taken_over_is_a_warning(
    client: redis.Redis, admin: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that finds another holder's token logs the loss at WARNING, with the reason."""
    caplog.set_level(logging.DEBUG, logger="aiolock")
    await hold_until_lost(AsyncLock(client, name, ttl=0.3), admin, take_over)
    losses = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f"lost lock {name!r}")
    ]
    assert len(losses) == 1
    assert "held by another holder at renewal" in losses[0].getMessage()


# --- observers ------------------------------------------------------------------------------------


async def test_a_wait_for_a_holder_elsewhere_is_contended(
    client: redis.Redis, other_client: redis.Redis, name: str, events: list[LockEvent]
) -> None:
    """A lock got after another client's release: 'acquired' with contended=True and the wait."""
    holder = AsyncLock(other_client, name, ttl=5.0)
    assert await holder.acquire()
    waiter = AsyncLock(client, name, ttl=5.0, timeout=5.0)
    task = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.2)
    await holder.release()
    assert await task
    await waiter.release()
    got = [e for e in events if e.lock is waiter and e.kind == "acquired"]
    assert len(got) == 1
    assert got[0].contended is True
    assert got[0].waited is not None
    assert got[0].waited >= 0.15


async def test_a_local_hand_over_is_contended(
    client: redis.Redis, name: str, events: list[LockEvent]
) -> None:
    """A task that queued behind a holder of its own process reports a contended acquisition."""
    lock = AsyncLock(client, name, ttl=5.0)
    order: list[str] = []

    async def hold(label: str) -> None:
        async with lock:
            order.append(label)
            await asyncio.sleep(0.05)

    await asyncio.gather(hold("first"), hold("second"))
    acquired = [e for e in events if e.name == name and e.kind == "acquired"]
    assert [e.contended for e in acquired] == [False, True]
    assert kinds(events, name) == ["acquired", "released", "acquired", "released"]


async def test_an_acquire_that_fails_on_a_redis_error_is_not_acquired_and_not_contended(
    name: str, events: list[LockEvent]
) -> None:
    """A server nobody listens on: one 'not_acquired' with the ConnectionError, not contended."""
    dead = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    try:
        lock = AsyncLock(dead, name, ttl=5.0)
        with pytest.raises(redis.ConnectionError):
            await lock.acquire(timeout=0.5)
    finally:
        await dead.aclose()
    miss = the_miss(events, lock)
    assert isinstance(miss.error, redis.ConnectionError)
    assert miss.contended is False


async def test_attempts_refused_only_by_missing_replicas_are_not_contention(
    client: redis.Redis, name: str, events: list[LockEvent]
) -> None:
    """replicas=1 on a server without replicas: never acknowledged, so not_acquired uncontended."""
    lock = AsyncLock(client, name, ttl=5.0, replicas=1, replica_timeout=0.02)
    assert not await lock.acquire(timeout=0.2)
    miss = the_miss(events, lock)
    assert miss.contended is False
    assert miss.error is None


async def test_failed_renewals_then_the_loss_are_reported(
    client: redis.Redis, admin: redis.Redis, name: str, events: list[LockEvent]
) -> None:
    """A renewal that raises gives 'renewal_failed' with the error; the lease end gives 'lost'."""
    lost_seen_by_callback: list[list[str]] = []
    lock = AsyncLock(
        client,
        name,
        ttl=0.3,
        on_lost=lambda _lock: lost_seen_by_callback.append(kinds(events, name)),
    )
    await hold_until_lost(lock, admin, make_renewal_fail)
    seen = [e for e in events if e.name == name]
    assert seen[0].kind == "acquired"
    failed = [e for e in seen if e.kind == "renewal_failed"]
    assert failed
    assert all(isinstance(e.error, LockError) for e in failed)
    assert all(
        e.error is not None and isinstance(e.error.__cause__, redis.ResponseError) for e in failed
    )
    assert seen[-1].kind == "lost"
    assert seen[-1].reason is not None
    assert "lease ran out" in seen[-1].reason
    assert seen[-1].held is not None
    assert 0.25 <= seen[-1].held < 2.0
    assert "released" not in kinds(events, name)
    # The observers hear of the loss before on_lost runs.
    assert lost_seen_by_callback == [kinds(events, name)]


async def test_events_carry_the_fence(
    client: redis.Redis, admin: redis.Redis, name: str, events: list[LockEvent]
) -> None:
    """With fencing=True, each event of a holding carries that holding's fence."""
    lock = AsyncLock(client, name, ttl=5.0, fencing=True)
    async with lock:
        fence = lock.fence
    await admin.delete(keys_of(lock).fence)
    assert fence is not None
    assert [(e.kind, e.fence) for e in events if e.name == name] == [
        ("acquired", fence),
        ("released", fence),
    ]


async def test_events_carry_the_holder_s_identity(
    client: redis.Redis, other_client: redis.Redis, name: str, events: list[LockEvent]
) -> None:
    """Each event names who holds (or tried): the identity given, else host:pid:task-name."""
    holder = AsyncLock(other_client, name, ttl=5.0, identity="batch-7")
    assert await holder.acquire()
    default = AsyncLock(client, name, ttl=5.0)

    async def late() -> bool:
        return await default.acquire(blocking=False)

    assert not await asyncio.create_task(late(), name="latecomer")
    await holder.release()
    here = f"{socket.gethostname()}:{os.getpid()}"
    assert [(e.kind, e.identity) for e in events if e.name == name] == [
        ("acquired", "batch-7"),
        ("not_acquired", f"{here}:latecomer"),
        ("released", "batch-7"),
    ]


async def test_an_observer_that_raises_is_logged_and_does_not_break_locking(
    client: redis.Redis, admin: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An observer's exception is logged at ERROR; the lock is acquired and released as usual."""

    def broken(event: LockEvent) -> None:
        raise RuntimeError(f"observer failure on {event.kind}")

    aiolock.add_observer(broken)
    try:
        lock = AsyncLock(client, name, ttl=5.0)
        async with lock:
            assert await lock.owned()
    finally:
        aiolock.remove_observer(broken)
    assert await admin.exists(lock.key) == 0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "aiolock"]
    assert len(errors) == 2
    assert "acquired event" in errors[0].getMessage()
    assert errors[0].exc_info is not None


async def test_observers_are_called_in_order_and_removed_one_registration_at_a_time(
    client: redis.Redis, name: str
) -> None:
    """Two observers see each event in registration order; a removed one sees no more."""
    calls: list[tuple[str, str]] = []

    def first(event: LockEvent) -> None:
        calls.append(("first", event.kind))

    def second(event: LockEvent) -> None:
        calls.append(("second", event.kind))

    aiolock.add_observer(first)
    aiolock.add_observer(second)
    try:
        async with AsyncLock(client, name, ttl=5.0):
            aiolock.remove_observer(first)
    finally:
        aiolock.remove_observer(second)
    assert calls == [("first", "acquired"), ("second", "acquired"), ("second", "released")]


async def test_observer_registration_checks_its_argument() -> None:
    """add_observer needs a callable; remove_observer of an unknown one is a ValueError."""
    with pytest.raises(TypeError, match="observer must be a callable"):
        aiolock.add_observer("print")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="was not added"):
        aiolock.remove_observer(print)


# --- OpenTelemetry --------------------------------------------------------------------------------


@pytest.fixture
def metrics() -> Iterator[InMemoryMetricReader]:
    """An SDK meter provider with an in-memory reader, instrumented for the test only."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observer = aiolock.otel.instrument(provider, name_attribute=True)
    try:
        yield reader
    finally:
        aiolock.otel.uninstrument(observer)
        provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> dict[str, list[Any]]:
    """The collected data points of lock ``name``, by instrument name."""
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "aiolock"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if (point.attributes or {}).get("aiolock.lock.name") == name:
                        found.setdefault(metric.name, []).append(point)
    return found


async def test_otel_records_acquisitions_waits_holds_renewals_and_losses(
    client: redis.Redis,
    other_client: redis.Redis,
    admin: redis.Redis,
    name: str,
    metrics: InMemoryMetricReader,
) -> None:
    """The OpenTelemetry observer counts outcomes and renewals and times waits and holds."""
    holder = AsyncLock(other_client, name, ttl=1.0)
    assert await holder.acquire()
    lock = AsyncLock(client, name, ttl=0.3)
    # Contended, not acquired. (A wait long enough that its last attempt is answered
    # on a loaded machine: an attempt with no answer in time raises instead.)
    assert not await lock.acquire(timeout=0.5)
    await asyncio.sleep(0.2)  # the holder renews at least once (every ttl/3 = 0.33 s)
    await holder.release()
    async with lock:  # free now: acquired, not contended
        pass
    await hold_until_lost(lock, admin, make_renewal_fail)

    found = points(metrics, name)
    acquisitions = {
        (p.attributes["aiolock.outcome"], p.attributes["aiolock.contended"]): p.value
        for p in found["aiolock.acquisitions"]
    }
    assert acquisitions == {
        ("acquired", False): 3,  # the holder, the async with, the last acquire
        ("not_acquired", True): 1,
    }
    waits = {
        (p.attributes["aiolock.outcome"], p.attributes["aiolock.contended"]): p
        for p in found["aiolock.acquire.duration"]
    }
    assert waits["not_acquired", True].count == 1
    assert waits["not_acquired", True].min >= 0.5
    holds = {p.attributes["aiolock.outcome"]: p for p in found["aiolock.hold.duration"]}
    assert holds["released"].count == 2
    assert holds["released"].max >= 0.6  # the holder's: the 0.5 s wait and the 0.2 s sleep
    assert holds["lost"].count == 1
    assert sum(p.value for p in found["aiolock.renewals"]) >= 1
    (failures,) = found["aiolock.renewal.failures"]
    assert failures.value >= 1
    assert failures.attributes["error.type"] == "LockError"
    (losses,) = found["aiolock.losses"]
    assert losses.value == 1
    assert all(
        p.attributes["aiolock.lock.type"] == "AsyncLock" for ps in found.values() for p in ps
    )


async def test_otel_leaves_the_lock_name_out_unless_asked(client: redis.Redis, name: str) -> None:
    """By default the metric points carry the lock type but not its name (cardinality)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observer = aiolock.otel.instrument(provider)
    try:
        async with AsyncLock(client, name, ttl=5.0):
            pass
    finally:
        aiolock.otel.uninstrument(observer)
    data = reader.get_metrics_data()
    assert data is not None
    attributes = [
        dict(p.attributes or {})
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        for p in m.data.data_points
    ]
    provider.shutdown()
    assert attributes
    assert all("aiolock.lock.name" not in a for a in attributes)
    assert all(a["aiolock.lock.type"] == "AsyncLock" for a in attributes)


async def test_otel_labels_points_with_the_identity_when_asked(
    client: redis.Redis, name: str
) -> None:
    """identity_attribute=True: every point of the lock carries aiolock.holder.identity."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observer = aiolock.otel.instrument(provider, name_attribute=True, identity_attribute=True)
    try:
        async with AsyncLock(client, name, ttl=5.0, identity="etl-2"):
            pass
    finally:
        aiolock.otel.uninstrument(observer)
    found = points(reader, name)
    provider.shutdown()
    assert found
    assert all(
        p.attributes["aiolock.holder.identity"] == "etl-2" for ps in found.values() for p in ps
    )


async def test_otel_checks_its_arguments() -> None:
    """name_attribute must be a bool; uninstrument of an unknown observer is a ValueError."""
    with pytest.raises(TypeError, match="name_attribute"):
        aiolock.otel.OpenTelemetryObserver(name_attribute="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="identity_attribute"):
        aiolock.otel.OpenTelemetryObserver(identity_attribute=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="was not added"):
        aiolock.otel.uninstrument(aiolock.otel.OpenTelemetryObserver())
