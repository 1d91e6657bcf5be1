"""``@guard``: run each call of a coroutine function under a lock named from its arguments.

::

    @guard(client, "order:{order_id}", ttl=30.0, timeout=5.0)
    async def settle(order_id: int, amount: Decimal) -> None: ...

Every call binds its arguments to the function's signature (defaults
applied), fills the name template with them, and runs the function inside
``async with AsyncLock(client, name, **options)``; with ``limit=N``, inside
``async with Semaphore(client, name, N, **options)`` (at most ``N`` calls
with that name at once).
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from redis.asyncio import Redis, RedisCluster

from ._lock import AsyncLock
from ._semaphore import Semaphore

__all__ = ["guard"]

P = ParamSpec("P")
R = TypeVar("R")

_Client = Redis | RedisCluster


def _template_fields(template: str, part: str | None = None) -> list[str]:
    """The argument names a ``str.format`` template uses (``{order.id}`` uses ``order``).

    Fields nested in a format spec (``{amount:{width}}``) count too.
    """
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template if part is None else part))
    except ValueError as exc:
        raise ValueError(f"name {template!r} is not a valid format template: {exc}") from None
    for _text, field, spec, _conversion in parsed:
        if spec:
            fields.extend(_template_fields(template, spec))
        if field is None:
            continue
        head = field.split(".", 1)[0].split("[", 1)[0]
        if not head or head.isdigit():
            raise ValueError(
                f"name {template!r} must refer to arguments by name, like '{{order_id}}', "
                f"got the field {{{field}}}"
            )
        fields.append(head)
    return fields


def guard(
    client: _Client | Callable[[], _Client],
    name: str | Callable[..., str],
    *,
    limit: int | None = None,
    **options: Any,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Decorate a coroutine function so that each call runs while holding a lock.

    The lock is named from the call's arguments: ``name`` is a
    :meth:`str.format` template whose fields are the function's parameter
    names (``"order:{order_id}"``, ``"user:{user.id}"``), filled with the
    arguments as bound to the signature, defaults applied; or a callable that
    takes the same arguments as the function and returns the name. Each call
    then runs inside ``async with AsyncLock(client, name, **options)``, so it
    waits, holds and renews the lock exactly as ``async with`` does.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster``, or a callable
            without arguments that returns one, called at each call (for a
            client that only exists once the application has started).
        name: the name template, or a callable returning the name.
        limit: run each call under a :class:`Semaphore` of ``limit`` permits
            instead of a lock: at most ``limit`` calls with the same name run
            at once, across every process (None: a lock, one at a time).
        **options: :class:`AsyncLock` keyword options (``ttl``, ``timeout``,
            ``backoff``, ...; with ``limit``, those :class:`Semaphore` takes),
            checked when decorating (against
            a plain client when ``client`` is a callable: a refusal that
            depends on the client's kind, such as ``replicas`` on a
            ``RedisCluster``, comes at the call). Not ``reentrant``.

    Returns:
        A decorator for coroutine functions. The wrapped function keeps its
        signature, name and docstring.

    Raises:
        TypeError: ``client`` is neither a client nor a callable, ``name``
            is neither a str nor a callable, an option is unknown or of the
            wrong type, or the decorated object is not a coroutine function.
        ValueError: an option has a bad value, or the template is malformed
            or uses a field that is not a parameter of the function.

    A call raises what ``async with`` raises: :class:`AcquireTimeout` when
    the lock was not acquired in time (the function does not run),
    :class:`LockLostError` after the function returned if the lock was lost
    meanwhile (its result is then discarded; with ``cancel_on_lost=True`` the
    function is cancelled at the loss), and the function's own exceptions.
    Each call makes its own lock object, so a guarded call that calls itself
    (or another guarded function) for the same name raises
    :class:`LockError`, as re-acquiring a held lock does. A call that needs
    the lock object itself (to read :attr:`AsyncLock.fence`, or check
    :attr:`AsyncLock.lost` right before a write) is better written with
    ``async with AsyncLock(...)`` in its body.
    """
    if not (isinstance(client, (Redis, RedisCluster)) or callable(client)):
        raise TypeError(
            "client must be a redis.asyncio.Redis or RedisCluster, or a callable returning "
            f"one, got {client!r}"
        )
    if "reentrant" in options:
        raise TypeError(
            "guard() does not take reentrant: each call makes its own lock object, so a "
            "nested call for the same name raises LockError; nest `async with` on one "
            "AsyncLock(..., reentrant=True) instead"
        )
    if isinstance(name, str):
        if not name:
            raise ValueError(f"name must not be empty, got {name!r}")
        fields = _template_fields(name)
    elif callable(name):
        fields = []
    else:
        raise TypeError(f"name must be a str template or a callable, got {name!r}")
    # Check the options now, not at the first call: build a lock with them once. A
    # callable client is only known at call time; a stand-in client serves the check
    # (constructing a lock sends nothing; a Redis() that never connected holds nothing).
    probe_client = client if isinstance(client, (Redis, RedisCluster)) else Redis()
    try:
        if limit is None:
            AsyncLock(probe_client, "guard-check", **options)
        else:
            Semaphore(probe_client, "guard-check", limit, **options)
    except TypeError as exc:
        raise TypeError(f"guard(): {exc}") from None

    def decorate(
        function: Callable[P, Coroutine[Any, Any, R]],
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"guard() decorates coroutine functions (async def), got {function!r}")
        signature = inspect.signature(function)
        missing = [field for field in fields if field not in signature.parameters]
        if missing:
            raise ValueError(
                f"name {name!r} uses {', '.join(repr(m) for m in missing)}, which "
                f"{'is not a parameter' if len(missing) == 1 else 'are not parameters'} "
                f"of {function.__qualname__}{signature}"
            )

        def lock_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            if not isinstance(name, str):
                made = name(*args, **kwargs)
                if not isinstance(made, str):
                    raise TypeError(f"name callable must return a str, got {made!r}")
                return made
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return name.format(**bound.arguments)

        @functools.wraps(function)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            lock_client = client if isinstance(client, (Redis, RedisCluster)) else client()
            lock: AsyncLock | Semaphore
            if limit is None:
                lock = AsyncLock(lock_client, lock_name(args, kwargs), **options)
            else:
                lock = Semaphore(lock_client, lock_name(args, kwargs), limit, **options)
            async with lock:
                return await function(*args, **kwargs)

        return guarded

    return decorate
