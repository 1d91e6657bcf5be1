"""Every key and channel name aiolock uses, built in one place.

A lock named ``name`` under ``prefix`` lives in the key ``<prefix>{<name>}``.
Its companions append a suffix *after* the closing brace, so that the hash
tag, and with it the Redis Cluster hash slot, is the same for all of them:

===================  ==================================  =====================================
name                 key                                 what it holds
===================  ==================================  =====================================
:attr:`Keys.lock`    ``<prefix>{<name>}``                the holder's token, with the lease
:attr:`Keys.queue`   ``<prefix>{<name>}:queue``          the waiters elsewhere, in order (tokens);
                                                        a semaphore's: ``...:queue:semaphore``,
                                                        a read-write lock's: ``...:queue:rw``
:meth:`Keys.entry`   ``<prefix>{<name>}:queue:<token>``  one waiter's entry: alive while it exists
                                                        (a kept one: while its keeper's mark does)
:meth:`Keys.mark`    ``<prefix>{<name>}:queue:@<id>``    a client's keeper of its waiters is alive
:attr:`Keys.fence`   ``<prefix>{<name>}:fence``          the last fencing number (kept)
:meth:`Keys.forced`  ``<prefix>{<name>}:forced:<token>`` who released that holder's token by force
:attr:`Keys.channel` ``<prefix>{<name>}:released``       the release and grant channel
===================  ==================================  =====================================

Each kind of primitive has a queue of its own (:data:`QUEUES`): a waiter
of one kind is never granted the key of another (a lock waiter a permit).

The library, the CLI, the tests and the benchmarks all take names from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

__all__ = ["DEFAULT_PREFIX", "QUEUES", "Keys", "keys_for"]

#: The prefix of every key unless a lock is given another.
DEFAULT_PREFIX: Final = "aiolock:"
#: The suffix of each kind's queue after ``:queue`` (the lock's has none).
QUEUES: Final = {"lock": "", "semaphore": ":semaphore", "rw": ":rw"}
#: How many names :func:`keys_for` remembers (then it starts afresh): enough for the
#: names a service locks again and again; a lease keeps its own keys, so thousands of
#: held names need no more.
_REMEMBERED: Final = 256


@final
class Keys:
    """The names of one lock's key, its companion keys and its channel.

    Raises:
        TypeError: ``name`` or ``prefix`` is not a str.
        ValueError: ``name`` is empty, or the key's hash tag would be empty
            (a name starting with ``}``, a prefix containing ``{}``): its
            companions would then fall into other cluster slots.
    """

    __slots__ = ("channel", "fence", "lock", "queue")

    #: The fencing counter: ``<lock>:fence``.
    fence: str
    #: The release and grant channel: ``<lock>:released``.
    channel: str

    def __init__(
        self, name: str, prefix: str = DEFAULT_PREFIX, *, tagged: bool = True, kind: str = "lock"
    ) -> None:
        """Name the keys of lock ``name``; ``tagged=False`` skips the hash-tag rule.

        The rule matters on a cluster only: Redlock's nodes are independent
        servers, and accept any name. ``kind`` picks the queue (see :data:`QUEUES`).
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if not name:
            raise ValueError(f"name must not be empty, got {name!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        lock = f"{prefix}{{{name}}}"
        if tagged and lock[lock.index("{") + 1] == "}":
            raise ValueError(
                f"name {name!r} with prefix {prefix!r} gives the key {lock!r} an empty "
                "hash tag '{}', so its companion keys would not share its cluster slot "
                "(a name must not start with '}', nor a prefix contain '{}')"
            )
        #: The lock key: ``<prefix>{<name>}``.
        self.lock: Final = lock
        #: The queue of waiters between processes: ``<lock>:queue`` (and the kind's
        #: suffix), a list of tokens.
        self.queue: Final = f"{lock}:queue{QUEUES[kind]}"
        # (The fence's and the channel's names are made at their first read, by
        # __getattr__: a lock that is only taken and held, thousands of them, never
        # needs them; once made, reading one is reading a slot.)

    if not TYPE_CHECKING:  # (for the type checker, a Keys has no other attribute)

        def __getattr__(self, attr: str) -> str:
            """Make the fence's or the channel's name at its first read (slots left unset)."""
            if attr == "fence":
                self.fence = value = f"{self.lock}:fence"
            elif attr == "channel":
                self.channel = value = f"{self.lock}:released"
            else:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
            return value

    def entry(self, token: str) -> str:
        """The entry of the waiter with ``token``: ``<queue>:<token>``, alive while it exists.

        The scripts build the same name from :attr:`queue` (it shares the slot).
        """
        return f"{self.queue}:{token}"

    def forced(self, token: str) -> str:
        """The mark a forced release leaves for the holder of ``token``: ``<lock>:forced:<token>``.

        It names who forced the release; the holder's loss path reads it.
        The force scripts build the same name.
        """
        return f"{self.lock}:forced:{token}"

    def mark(self, keeper: str) -> str:
        """The mark of the keeper ``keeper`` of a client's waiters: ``<queue>:@<keeper>``.

        Its kept entries are alive while it exists (see :mod:`aiolock._keeper`);
        the scripts build the same name.
        """
        return f"{self.queue}:@{keeper}"

    def __repr__(self) -> str:
        return f"Keys({self.lock!r})"


_known: dict[tuple[str, str, str], Keys] = {}


def keys_for(name: str, prefix: str = DEFAULT_PREFIX, kind: str = "lock") -> Keys:
    """``Keys(name, prefix, kind=kind)``, remembered: handlers making a lock per request name few.

    Raises:
        TypeError: ``name`` or ``prefix`` is not a str.
        ValueError: as :class:`Keys`.
    """
    if name.__class__ is str and prefix.__class__ is str:
        known = _known.get((name, prefix, kind))
        if known is not None:
            return known
    keys = Keys(name, prefix, kind=kind)  # checks them
    if len(_known) >= _REMEMBERED:
        _known.clear()
    _known[name, prefix, kind] = keys
    return keys
