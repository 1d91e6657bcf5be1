"""What the leases of one client share: its wire, local queues, listeners and keepers.

A client object has one *site*, made at its first lock and kept as long as
the client lives (weakly): the :class:`~aiolock._wire.Wire` every command of
its locks goes through, its local queues, its release listeners, the
keepers of its queued waiters, and the leases made for it (a lease holds no
state of its own, so the locks made per request with the same options share
one).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Final, final

from . import _notify
from ._keeper import Keeper
from ._queue import queues_of
from ._types import Client
from ._wire import Wire

__all__ = ["REMEMBERED", "Site", "site_of"]

#: How many leases a client remembers for the next lock made with the same options.
REMEMBERED: Final = 1024


@final
class Site:
    """What the leases of one client share, looked up once per lock."""

    __slots__ = ("__weakref__", "keepers", "leases", "listeners", "queues", "wire")

    def __init__(self, client: Client) -> None:
        self.wire = Wire(client)
        self.queues = queues_of(client)
        self.listeners = _notify.listeners_of(client)
        #: Leases by their options: a lease holds no state of its own, so the locks a
        #: handler makes per request with the same options share one.
        #: (The one-server lease's: typed where it is made, which this layer does not see.)
        self.leases: dict[tuple[Any, ...], Any] = {}
        #: The client's queued waiters, per queue (see :mod:`aiolock._keeper`).
        self.keepers: dict[str, Keeper] = {}

    def keeper(self, queue: str) -> Keeper:
        """The keeper of the client's waiters in ``queue`` (made if need be)."""
        keeper = self.keepers.get(queue)
        if keeper is None:
            keeper = self.keepers[queue] = Keeper(self.wire, queue)
        return keeper


def _forget_keepers() -> None:
    """A forked child keeps none of its parent's waiters (nor their keepers' ids)."""
    for site in list(_sites.values()):
        site.keepers.clear()


_sites: weakref.WeakKeyDictionary[Any, Site] = weakref.WeakKeyDictionary()
#: The client and the site of the latest lookup, both weakly (most programs have one client).
_latest: tuple[weakref.ReferenceType[Any], weakref.ReferenceType[Site]] | None = None
os.register_at_fork(after_in_child=_forget_keepers)


def site_of(client: Client) -> Site:
    """The site of ``client`` (made at its first lock)."""
    global _latest  # a one-entry cache in front of the registry
    latest = _latest
    if latest is not None and latest[0]() is client:
        site = latest[1]()
        if site is not None:
            return site
    try:
        site = _sites[client]
    except KeyError:
        site = _sites[client] = Site(client)
    _latest = (weakref.ref(client), weakref.ref(site))
    return site
