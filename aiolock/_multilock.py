"""MultiLock: the locks of several names, held all together or not at all.

How the names are taken, renewed and given back is
:mod:`aiolock._multi_lease`; everything else (ownership per task, the wait
loop, renewal, loss, cancellation, ``async with``) is the engine every lock
shares (:mod:`aiolock._leaselock`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, Never, final

from redis.asyncio import Redis

from . import backoff as _backoff
from ._checks import check_bool, check_client, check_ttl
from ._keys import DEFAULT_PREFIX, keys_for
from ._leaselock import LeaseLock
from ._multi_lease import MultiLease
from ._options import Options
from ._types import Client

__all__ = ["MultiLock"]

#: The options of ``AsyncLock`` that a MultiLock does not take, and why not.
_REFUSED: Final = {
    "fair": "its waiters are not served in order (a waiter queues on no name)",
    "replicas": "replica acknowledgement is only for AsyncLock",
    "replica_timeout": "replica acknowledgement is only for AsyncLock",
    "replica_fsync": "replica acknowledgement is only for AsyncLock",
}


def _refuse(refused: Mapping[str, object]) -> None:
    """Raise a ``TypeError`` naming the first keyword MultiLock does not take, and why."""
    for option in refused:
        why = _REFUSED.get(option)
        if why is None:
            raise TypeError(f"MultiLock() got an unexpected keyword argument {option!r}")
        raise TypeError(f"MultiLock does not take {option}: {why}")


def check_names(names: object, prefix: object) -> tuple[str, ...]:
    """Check a MultiLock's names: one or more distinct, non-empty ``str``, each a valid lock name.

    Raises:
        TypeError: ``names`` is a str, bytes or not iterable, or one of them
            is not a str; or ``prefix`` is not a str.
        ValueError: no names, a name given twice, or a name that is not a
            valid lock name (empty, or one whose key's hash tag would be empty).
    """
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a list or tuple of str, got {names!r}")
    checked = tuple(names)
    if not checked:
        raise ValueError(f"names must hold at least one name, got {names!r}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {prefix!r}")
    seen: set[str] = set()
    for index, name in enumerate(checked):
        if not isinstance(name, str):
            raise TypeError(f"each name must be a str, got {name!r} (names[{index}])")
        if name in seen:
            raise ValueError(f"names holds {name!r} twice (names[{index}]): each name once")
        seen.add(name)
        try:
            keys_for(name, prefix)
        except ValueError as exc:
            raise ValueError(f"names[{index}]: {exc}") from None
    return checked


@final
class MultiLock(LeaseLock):
    """The locks of several names, held all together or not at all.

    ``MultiLock(client, ["acct:1", "acct:2"])`` names one holding of every
    name given; nothing is sent to the server until it is acquired. It has
    the methods and the ``async with`` behaviour of
    :class:`~aiolock.AsyncLock`: one acquisition, one lease, one renewal,
    one release, one loss. Its names are ordinary lock names: a
    ``MultiLock`` over ``["a", "b"]`` and an ``AsyncLock`` on ``"b"``
    (with the same client's server and prefix) exclude each other.

    On one server, and for names in one cluster hash slot, one script takes
    every key at once or none of them. Across slots of a cluster the names
    are taken one slot at a time, in the order of the slots, and what was
    taken is given back if a later slot is busy; either way, a
    ``MultiLock`` that waits holds none of its names, so two of them over
    the same names, given in any order, never wait for each other.

    Args:
        client: a ``redis.asyncio.Redis`` (Sentinel's ``master_for()`` gives
            one) or ``redis.asyncio.RedisCluster``.
        names: the names to hold, one or more, each once (a list or tuple of
            str; their order does not matter). Each key is
            ``<prefix>{<name>}``, as ``AsyncLock``'s.
        ttl: the lease in seconds of every name: how long the server keeps
            them if the holder dies.
        timeout: how long :meth:`acquire` waits, in seconds; ``None`` waits
            forever, ``0`` tries once.
        blocking: ``False`` makes :meth:`acquire` try once by default.
        backoff: the policy for the pause between attempts (see
            :mod:`aiolock.backoff`), or a callable ``attempt -> seconds``.
        auto_renew: extend every name's lease every ``ttl/3`` while held.
        notify: wake a waiter when the name that kept it out longest is
            released, not only by backoff.
        on_lost: called with the lock when the holding is lost; may be a
            coroutine function.
        cancel_on_lost: cancel the body of ``async with`` at once when the
            holding is lost (``LockLostError`` is raised in its place).
        reentrant: let a task acquire it again while it holds it (counted).
        max_hold: the longest one holding may last, in seconds (``None``: no
            cap; at least ``ttl``).
        prefix: the key prefix of every name.
        identity: how others see each holding and each waiting call of this
            lock (:func:`aiolock.inspect`, ``aiolock status``): a ``str``
            of at most 256 printable characters. Default: the acquiring
            task's ``host:pid:task-name``.
        fencing: number each holding with a strictly increasing
            :attr:`fence`: every name's fencing counter moves to the same
            number, above every fence any of the names had before, so a
            later holding of any of the names (a ``MultiLock``'s or an
            ``AsyncLock(fencing=True)``'s) gets a larger one.

    ``fair`` and the replica options are refused with a ``TypeError`` that
    names them.

    **Ownership.** As for ``AsyncLock``: a holding belongs to the task that
    acquired it, and the server only ever extends or deletes a key that
    holds this acquisition's own token. Losing any one name (its key
    deleted, expired or taken) loses the whole holding: its other keys are
    given back at once, and ``lost``, ``on_lost``, ``cancel_on_lost`` and
    :class:`~aiolock.LockLostError` at exit report it as for ``AsyncLock``.

    **Fairness.** None between processes: a waiting ``MultiLock`` stands in
    no queue on the server (that would hold a place on some names while it
    waits for others); it attempts again at its backoff steps, woken early
    by the release of the name that kept it out longest. Waiters of an
    ``AsyncLock`` queued on one of its names go first. Tasks waiting on the
    same object are served first come, first served.

    **Cancellation.** Cancelling :meth:`acquire` at any ``await`` leaves
    none of its keys behind (every key that may hold the token is freed
    before the cancellation propagates), and a cancelled :meth:`release`
    still completes; the cleanup waits at most ``min(ttl, 1)`` seconds for
    the server, and after that the lease expires the keys.

    **Expiry.** The server deletes each key ``ttl`` seconds after the last
    acquisition or renewal; the holder counts the same lease from when it
    sent the first command and declares the holding lost no later than
    that. A failover to a replica that had not received a key loses that
    name, and with it the holding, without notice.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments (``names``
    among them); :class:`~aiolock.AcquireTimeout` from ``async with`` when
    the names were not all acquired in time; :class:`~aiolock.LockNotOwnedError`
    and :class:`~aiolock.LockLostError` from :meth:`release` and
    :meth:`extend` as for ``AsyncLock``; :class:`~aiolock.LockError` when a
    name is in use by another kind of primitive; redis-py's own exceptions,
    unchanged, after the cleanup. In full, on the guide's MultiLock section.
    """

    __slots__ = ()

    def __init__(
        self,
        client: Client,
        names: Iterable[str],
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        blocking: bool = True,
        backoff: _backoff.Backoff | Callable[[int], float] | None = None,
        auto_renew: bool = True,
        notify: bool = True,
        on_lost: Callable[[MultiLock], object] | None = None,
        cancel_on_lost: bool = False,
        reentrant: bool = False,
        max_hold: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        identity: str | None = None,
        fencing: bool = False,
        **refused: Never,
    ) -> None:
        _refuse(refused)
        if client.__class__ is not Redis:
            client = check_client(client)
        checked = check_names(names, prefix)
        ttl = check_ttl(ttl)
        check_bool("notify", notify)
        check_bool("fencing", fencing)
        lease = MultiLease(client, checked, prefix, ttl, notify=notify, fencing=fencing)
        super().__init__(
            lease,
            Options.of(
                ttl=ttl,
                timeout=timeout,
                blocking=blocking,
                backoff=backoff,
                auto_renew=auto_renew,
                on_lost=on_lost,
                cancel_on_lost=cancel_on_lost,
                reentrant=reentrant,
                max_hold=max_hold,
                identity=identity,
            ),
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The names, sorted (one server takes them in this order; see :attr:`keys`)."""
        lease = self._lease
        assert isinstance(lease, MultiLease)  # noqa: S101 - made in __init__
        return lease.names

    @property
    def keys(self) -> tuple[str, ...]:
        """Every name's lock key, in the order they are taken (by hash slot on a cluster)."""
        lease = self._lease
        assert isinstance(lease, MultiLease)  # noqa: S101 - made in __init__
        return tuple(k.lock for k in lease.keys)

    def __repr__(self) -> str:
        state = "held" if self._current is not None else "free"
        return f"<MultiLock {list(self.names)!r} ttl={self._ttl} {state}>"
