"""The Lua scripts that make each lock operation one atomic round trip.

The scripts live as files in ``aiolock/_lua/``, one folder per family
(``lock/``, ``queue/``, ``semaphore/``, ``rwlock/``, ``multi/``, ``status/``) and the
functions they share in ``lib/``. Each script opens with a header in
redis-py's style that names its keys and arguments::

    -- KEYS[1] lock: the lock key
    -- ARGV[1] token: the caller's token
    -- ARGV[2...] holdings: (a variable number of arguments, last)
    -- return ...

and pulls in shared functions with ``--@include NAME`` lines (the file
``lib/NAME.lua``). :func:`resolve` turns a script's text into what the
server runs, once at import: each library once, the libraries it includes
before it, and a ``local`` for each Python constant the text names
(:data:`QUEUE_SLACK_MS`, ...) in front.

Each script is a :class:`Script`: its text, its SHA1, and the names of its
keys and arguments read from its header. :meth:`Script.call` builds the
``KEYS`` and ``ARGV`` of one call from those names; :meth:`Script.bind`
fixes the names that do not change from call to call.
:class:`aiolock._wire.Wire` calls a script by SHA (``EVALSHA``) and loads it
again on ``NOSCRIPT`` (after a server restart or ``SCRIPT FLUSH``). Values
reach Lua only through ``KEYS`` and ``ARGV``.

All keys one script touches share the lock's hash slot: the lock key is
``<prefix>{<name>}`` and its companions append a suffix after the ``}``.

The queue between processes (``docs/server-queue.md``) is a list of tokens,
``KEYS[2]``, and one key per waiter, its *entry*, ``KEYS[2] .. ':' ..
token``, whose value says what a grant gives it (:func:`encode_entry`,
``lib/entry.lua``). An entry lives while its waiter refreshes it
(``PEXPIRE``); a token in the list whose entry is gone is a dead waiter's,
and is dropped when met. A *kept* entry names its client's keeper (see
:mod:`aiolock._keeper`): it is alive while the keeper's mark ``KEYS[2] ..
':@' .. id`` exists, which ``KEEP`` sets again for all the keeper's waiters
at once; past it, it is a dead waiter's, deleted when met. Entry keys are
the only keys a script names without ``KEYS``: a releaser cannot know the
next waiter's token before it reads the list. They share the lock's slot,
which Redis and Valkey clusters allow.

Every script that frees the lock hands it instead to the first live waiter
of the queue (``grant_next``, ``lib/grant.lua``): the key takes that
waiter's token with the lease its entry asks for, and ``g <token> <ms>
<fence> <n>`` goes out on the grant channel its entry names,
``<channel>:<tag>``, which only the heir's process listens to: it wakes
that waiter alone, and no other process reads it. If nobody listens there
(the heir's process died, or its pub/sub connection is down), or the entry
names no channel, the grant goes out on the lock's channel instead, where
every waiter hears it: the next in line then knows that the heir's first
lease bounds its wait. ``<n>`` tells the waiter which of its entries was
granted: a grant it missed, whose lease ran out before it queued again, is
not taken for the grant of its new entry. Only with nobody queued is the
key deleted and an empty message published (which wakes every waiter of
the channel).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any, Final, NamedTuple, NoReturn, final

__all__ = [
    "ACQUIRE",
    "ACQUIRE_LEAD",
    "EXTEND",
    "EXTEND_MANY",
    "FORCE",
    "FORCED_MARK_MS",
    "FORCED_SUFFIX",
    "HANDOVER",
    "KEEP",
    "KEEPER_MARK_MS",
    "LEAVE",
    "MULTI_ACQUIRE",
    "MULTI_FENCE",
    "MULTI_RELEASE",
    "QUEUE_SLACK_MS",
    "RELEASE",
    "RW_ACQUIRE",
    "RW_EXTEND",
    "RW_EXTEND_MANY",
    "RW_FORCE",
    "RW_INDEX_SUFFIX",
    "RW_LEAVE",
    "RW_PURGE_MOST",
    "RW_RELEASE",
    "RW_STATE",
    "SCRIPTS",
    "SEMAPHORE_ACQUIRE",
    "SEMAPHORE_EXTEND",
    "SEMAPHORE_EXTEND_MANY",
    "SEMAPHORE_FORCE",
    "SEMAPHORE_HANDOVER",
    "SEMAPHORE_LEAVE",
    "SEMAPHORE_RELEASE",
    "SEMAPHORE_STATE",
    "STATUS_HOLDERS",
    "STATUS_INSPECT",
    "Bound",
    "Entry",
    "Header",
    "Plan",
    "Script",
    "decode_holders",
    "encode_entry",
    "lua_source",
    "parse_entry",
    "parse_header",
    "renewals",
    "resolve",
]

#: How long the queue outlives the lease of the lock it was last extended with (ms).
#: More than an entry's life: a waiter that watches the holder's lease acts well before.
QUEUE_SLACK_MS: Final = 2500
#: How long a keeper's mark lives unless its keeper sets it again (ms): as long as a
#: waiter's own entry lives (``aiolock._server_state.ENTRY_CAP``).
KEEPER_MARK_MS: Final = 2000
#: A read-write lock's index of its holders' ends is its key followed by this.
RW_INDEX_SUFFIX: Final = ":ends"
#: How many holdings whose lease ended a read-write script drops when it meets them.
RW_PURGE_MOST: Final = 16
#: A forced release marks each token it took in the key ``<key>:forced:<token>``
#: (:data:`FORCED_SUFFIX`), naming who forced it, for the holder's remaining lease plus
#: this (ms): long enough for its next renewal or release to read why it lost the key.
FORCED_MARK_MS: Final = 60_000
#: What follows the key in a forced release's mark, before the token.
FORCED_SUFFIX: Final = ":forced:"

#: The arguments every kind's acquire script opens with, in this order: what
#: :meth:`Bound.lead` fills in on the waiter's hot path.
ACQUIRE_LEAD: Final = ("token", "ms", "entry", "entry_ms", "looks")

#: The Python constants the scripts name, as Lua literals (see :func:`resolve`).
_CONSTANTS: Final[dict[str, str]] = {
    "QUEUE_SLACK_MS": str(QUEUE_SLACK_MS),
    "KEEPER_MARK_MS": str(KEEPER_MARK_MS),
    "RW_INDEX_SUFFIX": f"'{RW_INDEX_SUFFIX}'",
    "RW_PURGE_MOST": str(RW_PURGE_MOST),
    "FORCED_MARK_MS": str(FORCED_MARK_MS),
}

_INCLUDE = re.compile(r"--@include ([a-z_]+)[ \t]*")
_COMMENT = re.compile(r"--.*$", re.MULTILINE)
_CONSTANT = re.compile(rf"\b(?:{'|'.join(_CONSTANTS)})\b")


#: The folder of the scripts, inside the package.
_LUA: Final = resources.files(__package__).joinpath("_lua")


@functools.cache
def lua_source(path: str) -> str:
    """The text of ``aiolock/_lua/<path>`` as stored (``"lock/acquire.lua"``).

    Raises:
        FileNotFoundError: there is no such file.
    """
    return _LUA.joinpath(path).read_text(encoding="utf-8")


def resolve(text: str) -> str:
    """The text the server runs for the script ``text``: its includes and constants resolved.

    Each ``--@include NAME`` line is replaced by ``lib/NAME.lua``, itself
    resolved first; a library already included is not included again, so
    that its functions are declared once. Then each Python constant of
    :data:`_CONSTANTS` that the code names (outside comments) is declared as a
    ``local`` in front of it, after the script's header.

    Raises:
        ValueError: the libraries include each other in a circle.
        FileNotFoundError: an include names no library.
    """
    header, rest = _split_header(text)
    body = _included(rest, set(), ())
    named = set(_CONSTANT.findall(_COMMENT.sub("", body)))
    constants = "".join(
        f"local {name} = {value}\n" for name, value in _CONSTANTS.items() if name in named
    )
    return header + constants + body


def _included(text: str, seen: set[str], chain: tuple[str, ...]) -> str:
    """``text`` with each ``--@include`` line replaced by its library (once per script)."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        match = _INCLUDE.fullmatch(line.rstrip("\n")) if line.startswith("--@") else None
        if match is None:
            out.append(line)
            continue
        name = match[1]
        if name in chain:
            raise ValueError(f"the Lua libraries include each other: {' -> '.join(chain)}")
        if name in seen:
            continue
        seen.add(name)
        out.append(_included(lua_source(f"lib/{name}.lua"), seen, (*chain, name)))
    return "".join(out)


def _split_header(text: str) -> tuple[str, str]:
    """A script's leading comment lines (its header), and the rest."""
    lines = text.splitlines(keepends=True)
    count = 0
    for line in lines:
        if not line.startswith("--") or line.startswith("--@"):
            break
        count += 1
    return "".join(lines[:count]), "".join(lines[count:])


_NAMED = re.compile(r"-- (KEYS|ARGV)\[(\d+)(\.\.\.)?\] ([a-z][a-z0-9_]*): .+")
_TITLE = re.compile(r"-- ([A-Z][A-Z0-9_]*): .+")


class Header(NamedTuple):
    """What a script's header declares: its name, and its keys and arguments in order."""

    #: The script's name (``ACQUIRE``), its header's first word.
    name: str
    #: The names of ``KEYS[1]``, ``KEYS[2]``, ... in order.
    keys: tuple[str, ...]
    #: The names of ``ARGV[1]``, ``ARGV[2]``, ... in order.
    args: tuple[str, ...]
    #: The name of the keys that follow the named ones (``KEYS[n...]``), or None.
    more_keys: str | None
    #: The name of the arguments that follow the named ones (``ARGV[n...]``), or None.
    more_args: str | None


def parse_header(text: str, where: str = "script") -> Header:
    """Read the header of the script ``text`` (see the module's docstring).

    The first line is ``-- NAME: what it does``; ``-- KEYS[i] name: ...`` and
    ``-- ARGV[i] name: ...`` lines number each from 1 with no gap, a
    variable number of them (``[i...]``) only last; a ``-- return`` line
    says what it answers.

    Raises:
        ValueError: the header is missing, out of order, or names one thing twice.
    """
    header, _ = _split_header(text)
    lines = header.splitlines()
    title = _TITLE.fullmatch(lines[0]) if lines else None
    if title is None:
        raise ValueError(f"{where}: the first line must be '-- NAME: what the script does'")
    found: dict[str, list[str]] = {"KEYS": [], "ARGV": []}
    more: dict[str, str | None] = {"KEYS": None, "ARGV": None}
    returns = False
    for line in lines[1:]:
        if line.startswith("-- return"):
            returns = True
        match = _NAMED.fullmatch(line)
        if match is None:
            if re.match(r"-- (KEYS|ARGV)\[", line):
                raise ValueError(f"{where}: cannot read {line!r} (want '-- KEYS[1] name: ...')")
            continue
        table, index, variable, name = match.groups()
        names = found[table]
        if more[table] is not None or int(index) != len(names) + 1:
            raise ValueError(f"{where}: {table}[{index}] is out of order")
        if name in found["KEYS"] or name in found["ARGV"] or name in more.values():
            raise ValueError(f"{where}: the name {name!r} is given twice")
        if variable:
            more[table] = name
        else:
            names.append(name)
    if not returns:
        raise ValueError(f"{where}: the header says nothing of the reply ('-- return ...')")
    return Header(title[1], tuple(found["KEYS"]), tuple(found["ARGV"]), more["KEYS"], more["ARGV"])


#: The keys and the arguments of one call of a script, in order.
Call = tuple[tuple[str, ...], tuple[Any, ...]]


@final
class Script:
    """A Lua script: its text, its SHA1 (the name ``EVALSHA`` calls it by), its named parameters.

    Args:
        text: the script as the server runs it (see :func:`resolve`).
        header: its name and the names of its keys and arguments.
    """

    __slots__ = (
        "_names",
        "_plans",
        "args",
        "keys",
        "more_args",
        "more_keys",
        "name",
        "sha",
        "text",
    )

    def __init__(self, text: str, header: Header) -> None:
        #: The Lua source.
        self.text = text
        #: Its SHA1 in hex, as ``SCRIPT LOAD`` returns it.
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
        #: Its name (``ACQUIRE``).
        self.name = header.name
        #: The names of its keys, in order.
        self.keys = header.keys
        #: The names of its arguments, in order.
        self.args = header.args
        #: The name of the sequence of keys that follow, or None.
        self.more_keys = header.more_keys
        #: The name of the sequence of arguments that follow, or None.
        self.more_args = header.more_args
        more = {n for n in (header.more_keys, header.more_args) if n is not None}
        self._names = frozenset((*header.keys, *header.args, *more))
        # One plan for each set of names bound (shared by every lease that binds them).
        self._plans: dict[frozenset[str], Plan] = {}

    @classmethod
    def load(cls, path: str) -> Script:
        """The script in ``aiolock/_lua/<path>``, its includes resolved."""
        source = lua_source(path)
        return cls(resolve(source), parse_header(source, path))

    def call(self, **values: Any) -> Call:
        """The ``KEYS`` and ``ARGV`` of one call, each value given by its name.

        A name of a variable number of keys or arguments (``KEYS[n...]``)
        takes a sequence, whose items follow the named ones.

        Raises:
            TypeError: a name is missing or unknown, or a sequence is not one.
        """
        if self.more_keys is None and self.more_args is None:
            # As many names as it has, and each of them there: exactly its names (told
            # without comparing the sets; map makes no frame, as a comprehension does).
            if len(values) == len(self._names):
                get = values.__getitem__
                try:
                    return tuple(map(get, self.keys)), tuple(map(get, self.args))
                except KeyError:
                    pass
            raise self._mismatch(values.keys())
        if values.keys() != self._names:
            raise self._mismatch(values.keys())
        keys = [values[name] for name in self.keys]
        if self.more_keys is not None:
            keys += self._sequence(self.more_keys, values[self.more_keys])
        args = [values[name] for name in self.args]
        if self.more_args is not None:
            args += self._sequence(self.more_args, values[self.more_args])
        return tuple(keys), tuple(args)

    def bind(self, **values: Any) -> Bound:
        """This script with the values of some names fixed (see :class:`Bound`).

        Raises:
            TypeError: a name is unknown.
        """
        unknown = values.keys() - self._names
        if unknown:
            raise TypeError(f"{self.name} has no key or argument named {sorted(unknown)}")
        names = frozenset(values)
        plan = self._plans.get(names)
        if plan is None:
            plan = self._plans[names] = Plan(self, names)
        return Bound(plan, values)

    def _mismatch(self, given: Iterable[str]) -> TypeError:
        names = set(given)
        missing = [n for n in (*self.keys, *self.args) if n not in names]
        missing += sorted((self._names - names) - set(missing))
        unknown = sorted(names - self._names)
        said = []
        if missing:
            said.append(f"missing {missing}")
        if unknown:
            said.append(f"unknown {unknown}")
        return TypeError(
            f"{self.name} takes keys {list(self.keys)} and arguments {list(self.args)}"
            f"{self._more()}: {', '.join(said)}"
        )

    def _more(self) -> str:
        more = [
            f"then {what} {name!r} (a sequence)"
            for what, name in (("keys", self.more_keys), ("arguments", self.more_args))
            if name is not None
        ]
        return f" ({'; '.join(more)})" if more else ""

    def _sequence(self, name: str, value: object) -> list[Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise TypeError(f"{self.name}: {name} takes a sequence, got {value!r}")
        return list(value)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:12]}>"


@final
class Plan:
    """Where each key and argument of a script comes from, for one set of bound names.

    Worked out once per script and set of names, and shared by every
    :class:`Bound` that binds them: thousands of leases of one kind hold one
    plan, and each only its values.
    """

    __slots__ = (
        "arg_fill",
        "arg_plan",
        "every_key",
        "fixed",
        "index",
        "key_plan",
        "lead",
        "needed",
        "only_at",
        "script",
    )

    def __init__(self, script: Script, fixed: frozenset[str]) -> None:
        #: The script.
        self.script = script
        #: The bound names, in the order a :class:`Bound` keeps their values.
        self.fixed = tuple(sorted(fixed))
        #: Where each bound name's value is in that order.
        self.index = {name: i for i, name in enumerate(self.fixed)}
        #: The names a call gives.
        self.needed = script._names - fixed
        # Each key and argument in order: (True, where its bound value is) or (False, its name).
        index = self.index
        self.key_plan: tuple[tuple[bool, Any], ...] = tuple(
            (n in fixed, index.get(n, n)) for n in script.keys
        )
        self.arg_plan: tuple[tuple[bool, Any], ...] = tuple(
            (n in fixed, index.get(n, n)) for n in script.args
        )
        #: Every key is bound: a bound script's keys are one tuple, made once.
        self.every_key = all(known for known, _ in self.key_plan) and script.more_keys is None
        #: Where each argument a call gives goes.
        self.arg_fill = tuple((i, v) for i, (known, v) in enumerate(self.arg_plan) if not known)
        #: With every key bound and one argument left: where that one goes (see ``only``).
        self.only_at = (
            self.arg_fill[0][0]
            if self.every_key and script.more_args is None and len(self.arg_fill) == 1
            else None
        )
        #: With every key bound and the arguments left the first ones: how many they are
        #: (see ``lead``); else None.
        self.lead = (
            len(self.arg_fill)
            if self.every_key
            and script.more_args is None
            and [at for at, _ in self.arg_fill] == list(range(len(self.arg_fill)))
            else None
        )


@final
class Bound:
    """A script with the values of some of its names fixed (:meth:`Script.bind`).

    The order of the keys and arguments is worked out once per script and set
    of names (a :class:`Plan`, shared); a bound script keeps its values, and
    a call only fills in the names it gives.
    """

    __slots__ = ("_after", "_args", "_before", "_keys", "_plan", "_values", "script")

    def __init__(self, plan: Plan, fixed: dict[str, Any]) -> None:
        #: The script.
        self.script = plan.script
        self._plan = plan
        values = tuple(fixed[name] for name in plan.fixed)
        # Kept only where a call still reads them: a key not made here, or a sequence.
        script = plan.script
        needs = not plan.every_key or script.more_keys is not None or script.more_args is not None
        self._values = values if needs else ()
        # The keys when every one is bound; the arguments with the bound ones in place.
        self._keys = tuple(values[i] for _, i in plan.key_plan) if plan.every_key else None
        self._args = tuple(values[v] if known else None for known, v in plan.arg_plan)
        # The bound arguments before and after the one only() gives, or after the ones
        # lead() gives (when one argument is left and it is the first, both agree).
        if plan.only_at is not None:
            self._before = self._args[: plan.only_at]
            self._after = self._args[plan.only_at + 1 :]
        else:
            self._before = ()
            self._after = self._args[plan.lead :] if plan.lead is not None else ()

    def call(self, **values: Any) -> Call:
        """The ``KEYS`` and ``ARGV`` of one call: the fixed values and ``values``.

        Raises:
            TypeError: a name is missing, unknown, or given again.
        """
        plan = self._plan
        # As many names as needed, and each of them there: exactly the needed names.
        if len(values) != len(plan.needed):
            self._refuse(values)
        script = self.script
        keys = self._keys
        args = list(self._args)
        try:
            if keys is None:
                bound = self._values
                listed = [bound[v] if known else values[v] for known, v in plan.key_plan]
                if script.more_keys is not None:
                    more = self._value(script.more_keys, values)
                    listed += script._sequence(script.more_keys, more)
                keys = tuple(listed)
            for at, name in plan.arg_fill:
                args[at] = values[name]
            if script.more_args is not None:
                more = self._value(script.more_args, values)
                args += script._sequence(script.more_args, more)
        except KeyError:
            self._refuse(values)
        return keys, tuple(args)

    def only(self, value: Any) -> Call:
        """:meth:`call` where one argument is left to give: ``value`` is it (the hot path).

        Raises:
            TypeError: more (or less) than one argument is left, or a key is.
        """
        at = self._plan.only_at
        keys = self._keys
        if at is None or keys is None:
            raise TypeError(
                f"{self.script.name}: only() needs every key bound and one argument left; "
                f"left: {sorted(self._plan.needed)}"
            )
        return keys, (*self._before, value, *self._after)

    def lead(self, *values: Any) -> Call:
        """:meth:`call` where the arguments left are the first ones: ``values`` are they, in order.

        The waiter's hot path (an acquire script's token, lease, entry, ...):
        no names to look up. The order is the header's (``ARGV[1]``, ...).

        Raises:
            TypeError: a key is left, or the arguments left are not the first
                ones, or ``values`` are not as many.
        """
        lead = self._plan.lead
        keys = self._keys
        if lead is None or keys is None or len(values) != lead:
            raise TypeError(
                f"{self.script.name}: lead() needs every key bound and the first "
                f"{lead} arguments given in order, got {len(values)}; "
                f"left: {[name for _, name in self._plan.arg_fill]}"
            )
        return keys, (*values, *self._after)

    def _refuse(self, values: dict[str, Any]) -> NoReturn:
        fixed = self._plan.fixed
        again = sorted(values.keys() & set(fixed))
        if again:
            raise TypeError(f"{self.script.name}: {again} given again (bound already)")
        raise self.script._mismatch(values.keys() | set(fixed))

    def _value(self, name: str, values: dict[str, Any]) -> Any:
        i = self._plan.index.get(name)
        return self._values[i] if i is not None else values[name]

    def __repr__(self) -> str:
        return f"<Bound {self.script.name} {list(self._plan.fixed)}>"


# --- the queue's entries ------------------------------------------------------------

_ENTRY = re.compile(r"([0-9]+)([A-Za-z]?) ([0-9]+) ?([A-Za-z0-9]*) ?([A-Za-z0-9]*)")


class Entry(NamedTuple):
    """A queue entry's value, as ``lib/entry.lua`` reads it."""

    #: The first lease a grant gives its waiter (ms).
    ms: int
    #: ``"f"``: a lock waiter that wants a fence; ``"r"``, ``"w"``: a reader's, a writer's.
    letter: str
    #: The number of the attempt that wrote it (in its call).
    number: int
    #: The tag of its process's grant channel; ``""``: none.
    tag: str = ""
    #: The id of the keeper that keeps it alive; ``""``: its waiter's own refreshes.
    keeper: str = ""


def renewals(reply: Iterable[Any], count: int) -> list[int]:
    """Each holding's outcome from an ``*_EXTEND_MANY`` reply of a batch of ``count``.

    The reply names the holdings not renewed (their positions, from 1:
    ``i`` not ours any more, ``-i`` an error that says nothing of whose the
    key is); every other one was renewed. Returns, in the batch's order, 1
    (renewed), 0 (not ours) or -1 (not renewed now: try again).
    """
    outcomes = [1] * count
    for position in reply:
        at = int(position)
        if at > 0:
            outcomes[at - 1] = 0
        else:
            outcomes[-at - 1] = -1
    return outcomes


def encode_entry(ms: int, letter: str, number: int, tag: str = "", keeper: str = "") -> str:
    """A queue entry's value, ``'<ms><letter> <n> <tag> <keeper>'`` (see :class:`Entry`).

    The tag and the keeper are left out when empty (the tag stays, empty,
    before a keeper).
    """
    text = f"{ms}{letter} {number}"
    if keeper:
        return f"{text} {tag} {keeper}"
    if tag:
        return f"{text} {tag}"
    return text


def parse_entry(value: str) -> Entry | None:
    """Read a queue entry's value as ``lib/entry.lua`` reads it; None if unreadable."""
    match = _ENTRY.fullmatch(value)
    if match is None:
        return None
    ms, letter, number, tag, keeper = match.groups()
    return Entry(int(ms), letter, int(number), tag, keeper)


# --- the scripts ----------------------------------------------------------------------

ACQUIRE: Final = Script.load("lock/acquire.lua")
LEAVE: Final = Script.load("lock/leave.lua")
RELEASE: Final = Script.load("lock/release.lua")
EXTEND: Final = Script.load("lock/extend.lua")
EXTEND_MANY: Final = Script.load("lock/extend_many.lua")
HANDOVER: Final = Script.load("lock/handover.lua")
KEEP: Final = Script.load("queue/keep.lua")

SEMAPHORE_ACQUIRE: Final = Script.load("semaphore/acquire.lua")
SEMAPHORE_RELEASE: Final = Script.load("semaphore/release.lua")
SEMAPHORE_LEAVE: Final = Script.load("semaphore/leave.lua")
SEMAPHORE_EXTEND: Final = Script.load("semaphore/extend.lua")
SEMAPHORE_EXTEND_MANY: Final = Script.load("semaphore/extend_many.lua")
SEMAPHORE_HANDOVER: Final = Script.load("semaphore/handover.lua")
SEMAPHORE_STATE: Final = Script.load("semaphore/state.lua")

RW_ACQUIRE: Final = Script.load("rwlock/acquire.lua")
RW_RELEASE: Final = Script.load("rwlock/release.lua")
RW_LEAVE: Final = Script.load("rwlock/leave.lua")
RW_EXTEND: Final = Script.load("rwlock/extend.lua")
RW_EXTEND_MANY: Final = Script.load("rwlock/extend_many.lua")
RW_STATE: Final = Script.load("rwlock/state.lua")

MULTI_ACQUIRE: Final = Script.load("multi/acquire.lua")
MULTI_RELEASE: Final = Script.load("multi/release.lua")
MULTI_FENCE: Final = Script.load("multi/fence.lua")

STATUS_HOLDERS: Final = Script.load("status/holders.lua")
STATUS_INSPECT: Final = Script.load("status/inspect.lua")
FORCE: Final = Script.load("lock/force.lua")
SEMAPHORE_FORCE: Final = Script.load("semaphore/force.lua")
RW_FORCE: Final = Script.load("rwlock/force.lua")

#: Every script, by the path of its file under ``aiolock/_lua/``.
SCRIPTS: Final[dict[str, Script]] = {
    "lock/acquire.lua": ACQUIRE,
    "lock/leave.lua": LEAVE,
    "lock/release.lua": RELEASE,
    "lock/extend.lua": EXTEND,
    "lock/extend_many.lua": EXTEND_MANY,
    "lock/handover.lua": HANDOVER,
    "queue/keep.lua": KEEP,
    "semaphore/acquire.lua": SEMAPHORE_ACQUIRE,
    "semaphore/release.lua": SEMAPHORE_RELEASE,
    "semaphore/leave.lua": SEMAPHORE_LEAVE,
    "semaphore/extend.lua": SEMAPHORE_EXTEND,
    "semaphore/extend_many.lua": SEMAPHORE_EXTEND_MANY,
    "semaphore/handover.lua": SEMAPHORE_HANDOVER,
    "semaphore/state.lua": SEMAPHORE_STATE,
    "rwlock/acquire.lua": RW_ACQUIRE,
    "rwlock/release.lua": RW_RELEASE,
    "rwlock/leave.lua": RW_LEAVE,
    "rwlock/extend.lua": RW_EXTEND,
    "rwlock/extend_many.lua": RW_EXTEND_MANY,
    "rwlock/state.lua": RW_STATE,
    "multi/acquire.lua": MULTI_ACQUIRE,
    "multi/release.lua": MULTI_RELEASE,
    "multi/fence.lua": MULTI_FENCE,
    "status/holders.lua": STATUS_HOLDERS,
    "status/inspect.lua": STATUS_INSPECT,
    "lock/force.lua": FORCE,
    "semaphore/force.lua": SEMAPHORE_FORCE,
    "rwlock/force.lua": RW_FORCE,
}


def decode_holders(reply: Sequence[Any]) -> tuple[int, list[tuple[str, int]]]:
    """Read a reply of :data:`STATUS_HOLDERS`: the server's clock (ms) and each holder.

    Each holder is its kind (``"p"`` a permit, ``"r"`` a reader, ``"w"``
    the writer) and the server's ms its lease ends at, as the scripts keep
    them (``lib/permits.lua``, ``lib/holders.lua``); a value aiolock did not
    write is left out.
    """
    now, ends = reply
    holders: list[tuple[str, int]] = []
    for end in ends:
        text = end.decode() if isinstance(end, bytes) else str(end)
        try:
            at = int(text[1:])
        except ValueError:
            continue
        holders.append((text[:1], at))
    return int(now), holders
