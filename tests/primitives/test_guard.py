"""``aiolock.guard``: a decorator that runs each call under a lock named from its arguments."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as redis

from aiolock import AcquireTimeout, AsyncLock, LockError, LockLostError, guard
from aiolock._keys import Keys

pytestmark = pytest.mark.usefixtures("no_leaks")


@dataclass
class User:
    """An argument with an attribute, for ``{user.id}`` templates."""

    id: int


async def test_calls_for_one_name_run_one_at_a_time_and_other_names_in_parallel(
    client: redis.Redis, name: str
) -> None:
    """Calls that fill the template alike never overlap; calls for other names do."""
    running: dict[int, int] = {}
    most: dict[int, int] = {}
    overall = {"now": 0, "most": 0}

    @guard(client, name + ":{order_id}", ttl=5.0)
    async def settle(order_id: int) -> int:
        running[order_id] = running.get(order_id, 0) + 1
        overall["now"] += 1
        most[order_id] = max(most.get(order_id, 0), running[order_id])
        overall["most"] = max(overall["most"], overall["now"])
        await asyncio.sleep(0.01)
        running[order_id] -= 1
        overall["now"] -= 1
        return order_id

    results = await asyncio.gather(*(settle(i % 3) for i in range(30)))
    assert sorted(results) == sorted(i % 3 for i in range(30))
    assert most == {0: 1, 1: 1, 2: 1}
    assert overall["most"] > 1


async def test_the_name_uses_bound_arguments_defaults_keywords_and_attributes(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """The template is filled from the call bound to the signature, defaults applied."""
    seen: list[list[str]] = []

    @guard(client, name + ":{user.id}:{region}", ttl=5.0)
    async def charge(user: User, amount: int, region: str = "eu") -> None:
        seen.append(sorted(str(k) for k in await admin.keys(f"*{{{name}:*")))

    await charge(User(7), 10)
    await charge(user=User(8), amount=1, region="us")
    await charge(User(9), 3, "ap")
    assert seen == [
        [Keys(f"{name}:7:eu").lock],
        [Keys(f"{name}:8:us").lock],
        [Keys(f"{name}:9:ap").lock],
    ]


async def test_a_callable_name_and_a_callable_client_are_used_at_each_call(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """A name callable gets the call's arguments; a client callable is called per call."""
    lookups: list[int] = []
    held: list[bool] = []

    def current_client() -> redis.Redis:
        lookups.append(1)
        return client

    @guard(current_client, lambda a, b=2: f"{name}:{a + b}", ttl=5.0, prefix="jobs:")
    async def work(a: int, b: int = 2) -> int:
        held.append(bool(await admin.exists(Keys(f"{name}:{a + b}", "jobs:").lock)))
        return a * b

    assert await work(3) == 6
    assert await work(1, b=5) == 5
    assert lookups == [1, 1]
    assert held == [True, True]


async def test_a_call_that_cannot_get_the_lock_in_time_raises_and_does_not_run(
    client: redis.Redis, other_client: redis.Redis, name: str
) -> None:
    """With the lock held elsewhere, a call raises AcquireTimeout after its timeout, unrun."""
    ran: list[str] = []

    @guard(client, name + ":{key}", ttl=5.0, timeout=0.2)
    async def job(key: str) -> None:
        ran.append(key)

    holder = AsyncLock(other_client, f"{name}:k", ttl=5.0)
    assert await holder.acquire()
    try:
        with pytest.raises(AcquireTimeout):
            await job("k")
    finally:
        await holder.release()
    assert ran == []
    await job("k")
    assert ran == ["k"]


async def test_a_lock_lost_during_the_call_raises_after_it(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """If the key is taken over during the call, the call raises LockLostError on exit."""
    finished: list[bool] = []

    @guard(client, name, ttl=5.0)
    async def job() -> str:
        await admin.set(Keys(name).lock, "someone else", px=5000)
        finished.append(True)
        return "result"

    with pytest.raises(LockLostError):
        await job()
    assert finished == [True]
    assert await admin.get(Keys(name).lock) == "someone else"
    await admin.delete(Keys(name).lock)


async def test_cancel_on_lost_cancels_the_call_at_the_loss(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """With cancel_on_lost=True the call is cancelled when renewal finds the lock gone."""
    reached_end: list[bool] = []

    @guard(client, name, ttl=0.3, cancel_on_lost=True)
    async def job() -> None:
        await admin.set(Keys(name).lock, "someone else", px=5000)
        await asyncio.sleep(5)
        reached_end.append(True)

    with pytest.raises(LockLostError):
        await asyncio.wait_for(job(), timeout=3)
    assert reached_end == []
    await admin.delete(Keys(name).lock)


async def test_the_function_s_exception_propagates_and_the_lock_is_released(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """An exception from the call propagates unchanged, and the key is gone afterwards."""

    @guard(client, name, ttl=5.0)
    async def job() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await job()
    assert await admin.exists(Keys(name).lock) == 0


async def test_the_wrapper_keeps_name_docstring_and_signature(client: redis.Redis) -> None:
    """functools.wraps: the decorated function looks like the original."""

    async def original(order_id: int, *, note: str = "") -> int:
        """Settle an order."""
        return order_id

    wrapped = guard(client, "order:{order_id}")(original)
    assert wrapped.__name__ == "original"
    assert wrapped.__doc__ == "Settle an order."
    assert inspect.signature(wrapped) == inspect.signature(original)
    assert inspect.iscoroutinefunction(wrapped)
    assert await wrapped(4) == 4


@pytest.mark.parametrize(
    ("client_arg", "lock_name", "options", "error", "match"),
    [
        ("not a client", "x", {}, TypeError, "client must be"),
        (None, 42, {}, TypeError, "name must be a str template or a callable"),
        (None, "", {}, ValueError, "name must not be empty"),
        (None, "x:{", {}, ValueError, "not a valid format template"),
        (None, "x:{0}", {}, ValueError, "must refer to arguments by name"),
        (None, "x:{}", {}, ValueError, "must refer to arguments by name"),
        (None, "x", {"ttl": -1}, ValueError, "ttl"),
        (None, "x", {"timeout": "soon"}, TypeError, "timeout"),
        (None, "x", {"tll": 1}, TypeError, "tll"),
        (None, "x", {"reentrant": True}, TypeError, "does not take reentrant"),
    ],
)
async def test_bad_arguments_fail_when_decorating(
    client: redis.Redis,
    client_arg: Any,
    lock_name: Any,
    options: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    """Bad clients, names and options raise at guard(...), naming what is wrong."""
    with pytest.raises(error, match=match):
        guard(client if client_arg is None else client_arg, lock_name, **options)


async def test_options_are_checked_even_with_a_client_callable(client: redis.Redis) -> None:
    """A client looked up per call does not postpone the check of the options."""
    with pytest.raises(ValueError, match="ttl"):
        guard(lambda: client, "x", ttl=0)


async def test_a_template_field_that_is_not_a_parameter_fails_at_decoration(
    client: redis.Redis,
) -> None:
    """'order:{order}' on a function without 'order' is a ValueError naming the field."""
    decorate = guard(client, "order:{order}")

    async def settle(order_id: int) -> None:
        return None

    with pytest.raises(ValueError, match=r"'order', which is not a parameter of .*settle"):
        decorate(settle)
    with pytest.raises(ValueError, match=r"'width', which is not a parameter"):
        guard(client, "order:{order_id:{width}}")(settle)


async def test_format_specs_conversions_and_nested_spec_fields_fill_the_name(
    client: redis.Redis, admin: redis.Redis, name: str
) -> None:
    """'{id:05d}', '{tag!s}' and a spec taken from another argument all fill the name."""
    keys: list[str] = []

    @guard(client, name + ":{order_id:05d}:{tag!s}:{note:>{width}}", ttl=5.0)
    async def settle(order_id: int, tag: str, note: str = "n", width: int = 3) -> None:
        keys.extend(str(k) for k in await admin.keys(f"*{{{name}:*"))

    await settle(42, "a")
    assert keys == [Keys(f"{name}:00042:a:  n").lock]


async def test_a_guarded_call_nested_in_another_for_the_same_name_raises_lock_error(
    client: redis.Redis, name: str
) -> None:
    """Nesting guarded calls on one name in one task raises LockError rather than deadlocking."""

    @guard(client, name + ":{n}", ttl=5.0, timeout=1.0)
    async def countdown(n: int, depth: int = 0) -> int:
        if depth == 1:
            return n
        return await countdown(n, depth + 1)

    with pytest.raises(LockError):
        await countdown(3)


async def test_only_coroutine_functions_can_be_guarded(client: redis.Redis) -> None:
    """Decorating a plain function is a TypeError: a lock cannot be held across a sync call."""

    def plain(order_id: int) -> int:
        return order_id

    with pytest.raises(TypeError, match="coroutine functions"):
        guard(client, "order:{order_id}")(plain)  # type: ignore[arg-type]


async def test_a_name_callable_must_return_a_str(client: redis.Redis) -> None:
    """A name callable returning something else raises TypeError at the call, before locking."""

    @guard(client, lambda order_id: order_id, ttl=5.0)
    async def settle(order_id: int) -> None:
        return None

    with pytest.raises(TypeError, match="must return a str"):
        await settle(3)


async def test_with_a_limit_at_most_that_many_calls_for_one_name_run_at_once(
    client: redis.Redis, name: str
) -> None:
    """`limit=2`: eight calls for one name run two at a time, and do reach two."""
    now = {"inside": 0, "most": 0}

    @guard(client, name + ":{host}", limit=2, ttl=5.0)
    async def call(host: str, n: int) -> int:
        now["inside"] += 1
        now["most"] = max(now["most"], now["inside"])
        await asyncio.sleep(0.02)
        now["inside"] -= 1
        return n

    assert await asyncio.gather(*(call("partner", n) for n in range(8))) == list(range(8))
    assert now["most"] == 2


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"limit": 0}, ValueError, "limit"),
        ({"limit": True}, TypeError, "limit"),
        ({"limit": 2, "fencing": True}, TypeError, "fencing"),
        ({"limit": 2, "replicas": 1}, TypeError, "replicas"),
    ],
)
def test_a_bad_limit_or_an_option_a_semaphore_refuses_fails_when_decorating(
    client: redis.Redis, options: dict[str, Any], error: type[Exception], named: str
) -> None:
    """The semaphore's arguments are checked at decoration time, naming the argument."""
    with pytest.raises(error, match=named):
        guard(client, "x", **options)
