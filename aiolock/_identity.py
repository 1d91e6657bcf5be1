"""Who holds a lease: an identity carried in the holding's token, readable on the server.

Every acquisition mints the token ``<32 hex><12 hex><marks>:<identity>``
(:func:`mint`): 128 random bits keep every token unique (and secret enough
to release only one's own holding); the next 12 hex digits are the time the
token was minted, in milliseconds since the epoch, by the holder's clock
(:func:`minted_at`); the marks are letters saying what the holder is
(``f``: it takes a fence; ``e``: an election's candidate; :func:`marks_of`);
the part after the first ``:`` says who holds it. Anyone who can read the
key (or a queue) can tell who holds it or waits (:func:`identity_of`)
without knowing the token, and nothing else on the server changes: the
scripts compare whole tokens, as always. A token of an older version
(``<32 hex>`` alone, or ``<32 hex>:<identity>``) reads as no time and no marks.

The identity is written percent-encoded (:func:`token_with`): a space or a
``%`` would break the grant messages, whose fields are separated by spaces
(:mod:`aiolock._notify`), and non-ASCII text is kept to ASCII on the wire.
The default identity is ``host:pid:task-name`` (:func:`default_identity`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import string
import time
from typing import Final
from urllib.parse import quote, unquote

__all__ = [
    "DEFAULTS",
    "DEFAULTS_MOST",
    "IDENTITY_MOST",
    "UNKNOWN",
    "check_identity",
    "default_encoded",
    "default_identity",
    "encode_identity",
    "identity_of",
    "marks_of",
    "mint",
    "minted_at",
    "token_with",
]

#: The identity shown for a token that carries none (an older version's).
UNKNOWN: Final = "unknown"
#: The longest identity, in characters.
IDENTITY_MOST: Final = 256
#: What the token keeps as it is: printable ASCII but the space and ``%``.
_SAFE: Final = "".join(c for c in string.punctuation if c != "%")


def check_identity(value: object, name: str = "identity") -> str:
    """Check an identity: a non-empty ``str`` of printable characters, at most 256.

    Raises:
        TypeError: not a ``str``.
        ValueError: empty, too long, or with a control character (a newline).
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value!r}")
    if not value:
        raise ValueError(f"{name} must not be empty, got {value!r}")
    if len(value) > IDENTITY_MOST:
        raise ValueError(
            f"{name} must be at most {IDENTITY_MOST} characters, "
            f"got {len(value)}: {value[:40]!r}..."
        )
    if not value.isprintable():
        raise ValueError(
            f"{name} must be printable (no newline or control character), got {value!r}"
        )
    return value


def default_identity(task: asyncio.Task[object] | None = None) -> str:
    """``host:pid:task-name`` for ``task`` (default: the current task; ``-`` outside one)."""
    if task is None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            task = None
    task_name = task.get_name() if task is not None else "-"
    identity = f"{socket.gethostname()}:{os.getpid()}:{task_name}"
    if len(identity) > IDENTITY_MOST or not identity.isprintable():
        identity = "".join(c if c.isprintable() else "?" for c in identity[:IDENTITY_MOST])
    return identity


def encode_identity(identity: str) -> str:
    """``identity`` as a token carries it: percent-encoded (no space, no ``%``, ASCII)."""
    return quote(identity, safe=_SAFE)


#: The default identity's ``host:pid:`` part, encoded: made once per process (see _forked).
_host_pid: str | None = None
#: The encoded default identity per task name (the engine reads it inline: a hit costs
#: no call). Tasks taking turns on a lock find theirs made; a server that names a task
#: per request would grow it, so it starts afresh at DEFAULTS_MOST names.
DEFAULTS: Final[dict[str, str]] = {}
#: How many task names :data:`DEFAULTS` remembers.
DEFAULTS_MOST: Final = 1024


def _forked() -> None:
    """A child process has another pid: forget what was made with the parent's."""
    global _host_pid
    _host_pid = None
    DEFAULTS.clear()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_forked)


def default_encoded(task: asyncio.Task[object] | None) -> str:
    """The default identity (:func:`default_identity`) of ``task``, encoded.

    The ``host:pid:`` part is made once per process, the whole once per
    task name (of the latest :data:`DEFAULTS_MOST`).
    """
    global _host_pid
    name = task.get_name() if task is not None else "-"
    encoded = DEFAULTS.get(name)
    if encoded is not None:
        return encoded
    head = _host_pid
    if head is None:
        head = _host_pid = encode_identity(f"{socket.gethostname()}:{os.getpid()}:")
    if len(head) + len(name) <= IDENTITY_MOST and name.isprintable():
        encoded = head + encode_identity(name)
    else:
        encoded = encode_identity(default_identity(task))
    if len(DEFAULTS) >= DEFAULTS_MOST:
        DEFAULTS.clear()
    DEFAULTS[name] = encoded
    return encoded


def mint(encoded: str | None, marks: str = "") -> str:
    """A new token: 128 random bits, the time now, ``marks``, ``:``, the encoded identity.

    ``encoded`` is :func:`encode_identity`'s output, or None for the calling
    task's default identity. (The engine mints its tokens the same way,
    inline, in :meth:`aiolock._leaselock.LeaseLock.acquire`.)
    """
    if encoded is None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            task = None
        encoded = default_encoded(task)
    head = (os.urandom(16) + (time.time_ns() // 1_000_000).to_bytes(6)).hex()
    return f"{head}{marks}:{encoded}"


def _head(token: str | bytes) -> str:
    text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
    return text.partition(":")[0]


def minted_at(token: str | bytes | None) -> float | None:
    """When :func:`mint` made ``token``, in seconds since the epoch; None if it does not say."""
    if token is None:
        return None
    head = _head(token)
    if len(head) < 44:
        return None
    try:
        return int(head[32:44], 16) / 1000
    except ValueError:
        return None


def marks_of(token: str | bytes | None) -> str:
    """The marks :func:`mint` put in ``token`` (``f``: fenced, ``e``: election), or ``""``."""
    if token is None:
        return ""
    return _head(token)[44:]


def token_with(identity: str) -> str:
    """A new token that carries ``identity``: 128 random bits, ``:``, the identity encoded."""
    return f"{os.urandom(16).hex()}:{quote(identity, safe=_SAFE)}"


def identity_of(token: str | bytes | None) -> str | None:
    """The identity a token carries (see :func:`token_with`); None if it carries none."""
    if token is None:
        return None
    text = token.decode("utf-8", "replace") if isinstance(token, bytes) else token
    _, colon, encoded = text.partition(":")
    if not colon or not encoded:
        return None
    return unquote(encoded)
