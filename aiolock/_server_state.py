"""What a one-server lease knows: its client's site, its keys, its options, its scripts.

:class:`ServerState` is the base of :class:`~aiolock._server_lease.ServerLease`
and of its parts (:mod:`aiolock._server_queue`, :mod:`aiolock._server_holding`):
it holds every attribute they share, made once when the lease is made. A
lease holds no state of a call or a holding of its own: the locks of one
client with the same options share it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Final

from redis.crc import key_slot

from ._checks import check_ttl, shared, to_ms
from ._lease import CLEANUP_BOUND
from ._queue import LocalQueue
from ._scripts import (
    ACQUIRE,
    EXTEND,
    EXTEND_MANY,
    HANDOVER,
    KEEPER_MARK_MS,
    LEAVE,
    RELEASE,
    Bound,
)
from ._site import site_of

if TYPE_CHECKING:
    from ._keys import Keys
    from ._types import Client

__all__ = ["ENTRY_CAP", "REFRESH_SHARE", "ServerState"]

#: The longest a waiter's queue entry lives without being refreshed (and not longer
#: than the lease): a dead waiter's entry is gone at most this long after its death,
#: and a grant to a waiter that died meanwhile holds the lock no longer than this.
ENTRY_CAP: Final = KEEPER_MARK_MS / 1000
#: A queued waiter refreshes its entry after this share of the entry's life.
REFRESH_SHARE: Final = 0.7


class ServerState:
    """The attributes of a one-server lease (see the module)."""

    __slots__ = (
        "_acquire",
        "_calls",
        "_cleanup",
        "_contended_until",
        "_entry_ms",
        "_fair",
        "_heir",
        "_leave",
        "_letter",
        "_listeners",
        "_ms",
        "_notify",
        "_queues",
        "_release",
        "_replica_fsync",
        "_replica_timeout",
        "_replicas",
        "_sharded",
        "_site",
        "_slot",
        "accepts_grants",
        "bare_first",
        "fencing",
        "foreign_without_expiry",
        "gone",
        "key",
        "keys",
        "name",
        "refresh_every",
        "span",
        "ttl",
        "wire",
    )

    #: The scripts of an attempt, a release, a leave (or undo) and an extension.
    _ACQUIRE = ACQUIRE
    _RELEASE = RELEASE
    _LEAVE = LEAVE
    _EXTEND = EXTEND
    _EXTEND_MANY = EXTEND_MANY

    def __init__(
        self,
        client: Client,
        name: str,
        keys: Keys,
        ttl: float,
        *,
        notify: bool = True,
        fencing: bool = False,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        replica_fsync: bool = False,
        fair: bool = False,
    ) -> None:
        site = site_of(client)
        self.wire = site.wire
        self.name = name
        self.keys = keys
        self.key = keys.lock
        self._notify = notify
        self.fencing = fencing
        self._replicas = replicas
        self._replica_timeout = shared(replica_timeout)
        self._replica_fsync = replica_fsync
        self._fair = fair
        self.ttl = self.span = ttl
        self._ms = shared(to_ms(ttl))
        self._cleanup = shared(min(ttl, CLEANUP_BOUND))
        # The first attempt can be a bare SET NX, not the script: it says only taken or
        # not (RETRY). Off where the script must run (a subclass whose key is no plain
        # string turns it off too).
        self.bare_first = not (fencing or replicas or fair)
        # A grant sets the key without waiting for replicas: such an heir confirms it.
        self.accepts_grants = not replicas
        self.foreign_without_expiry = True  # the lock's key is a plain string any SET NX takes
        life = min(ttl, ENTRY_CAP)
        self._entry_ms = shared(to_ms(life))
        # What a grant gives this lock's waiters: a first lease of one entry life (a dead
        # heir holds the lock no longer), renewed to the full lease like any other. (A
        # waiter that will not renew asks for its whole lease instead: see _scripted.)
        self._letter = "f" if fencing else ""
        self.refresh_every = shared(REFRESH_SHARE * life)
        self._contended_until = 0.0
        self.gone = "the key was gone or held by another holder"
        #: The scripts' ``sharded`` argument: '1' on a cluster (sharded pub/sub).
        self._sharded = "1" if self.wire.cluster else "0"
        self._site = site
        # Only holdings of one slot are renewed by one script call on a cluster.
        self._slot = key_slot(keys.lock.encode()) if self.wire.cluster else None
        self._queues = site.queues
        self._listeners = site.listeners if notify else None
        # A fair lease's acquisitions in progress (their local queues), for statistics.
        self._calls: weakref.WeakSet[LocalQueue] | None = None  # (made at the first)
        # Each script's fixed names are bound at its first need (_acquiring, _releasing,
        # _leaving): thousands of held locks would keep them for nothing, and a lock
        # taken by a bare SET and released never needs the waiter's.
        self._acquire: Bound | None = None
        self._release: Bound | None = None
        self._leave: Bound | None = None
        self._heir: Bound | None = None

    def _named(self) -> dict[str, Any]:
        """The values of the names the kind's scripts share (the keys, ``sharded``, ...)."""
        keys = self.keys
        return {
            "lock": keys.lock,
            "queue": keys.queue,
            "fence": keys.fence,
            "channel": keys.channel,
            "sharded": self._sharded,
        }

    def _acquire_named(self) -> dict[str, Any]:
        """The values of the names the acquire script alone has."""
        return {"fencing": "1" if self.fencing else "0"}

    def _acquiring(self) -> Bound:
        """The acquire script, its fixed names bound (at its first need)."""
        acquire = self._acquire
        if acquire is None:
            acquire = self._acquire = self._ACQUIRE.bind(**self._named(), **self._acquire_named())
        return acquire

    def _releasing(self) -> Bound:
        """The release script, its fixed names bound (at its first need)."""
        release = self._release
        if release is None:
            release = self._release = self._RELEASE.bind(**self._named())
        return release

    def _leaving(self) -> Bound:
        """The script that takes a token out of the queue, its names bound (at its first need)."""
        leave = self._leave
        if leave is None:
            leave = self._leave = self._LEAVE.bind(**self._named())
        return leave

    def _inheriting(self) -> Bound:
        """The lock's hand-over script to this lease as the heir's, its names bound.

        Its own lease and fencing are the heir's; what is left to give, in
        order, is the releaser's token, the heir's token and ``may_yield``.
        """
        heir = self._heir
        if heir is None:
            fencing = "1" if self.fencing else "0"
            named = self._named()
            heir = self._heir = HANDOVER.bind(**named, heir_ms=self._ms, heir_fencing=fencing)
        return heir

    def check_ttl(self, value: object, name: str = "ttl") -> float:
        """Check a lease: a finite number of seconds, at least 1 ms."""
        return check_ttl(value, name)

    def counted(self, ttl: float) -> float:
        """The holder counts the whole lease (from when it sent the command)."""
        return ttl
