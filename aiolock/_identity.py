"""Who holds a lease: an identity carried in the holding's token, readable on the server.

A holding made with an identity stores the token ``<32 hex digits>:<identity>``
in its key: the random part keeps every token unique (and secret enough to
release only one's own holding), the part after the first ``:`` says who
holds it. Anyone who can ``GET`` the key can tell who holds it
(:func:`identity_of`) without knowing the token, and nothing else on the
server changes: the scripts compare whole tokens, as always.

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
from typing import Final
from urllib.parse import quote, unquote

__all__ = [
    "IDENTITY_MOST",
    "check_identity",
    "default_identity",
    "identity_of",
    "token_with",
]

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
