"""A small blocking RESP2 client: one command on one new connection, standard library only.

The servers of this package are started, checked ("is the process that
answers ours?") and assembled into topologies with it, so none of that
needs redis-py. It sends a command as an array of bulk strings and reads
one reply of any RESP2 type; an error reply raises :class:`ReplyError`.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import BinaryIO, Final, Protocol, TypeAlias

Reply: TypeAlias = "bytes | int | list[Reply] | None"
"""A parsed reply: a simple or bulk string, an integer, an array, or ``None`` (a null)."""

COMMAND_TIMEOUT: Final = 2.0
"""Seconds allowed for connecting, and for each read, by default."""


class ReplyError(Exception):
    """The server answered a command with an error reply (the message, without its ``-``)."""


class Address(Protocol):
    """Where a server listens: a :class:`~aiolock.testing.RedisServer`, say."""

    @property
    def host(self) -> str:
        """The address to connect to."""

    @property
    def port(self) -> int:
        """The port to connect to."""


def encode(args: Sequence[str | int | bytes]) -> bytes:
    """The command ``args`` as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _parse(stream: BinaryIO) -> Reply:
    """Read one RESP2 reply of any type; an error reply raises :class:`ReplyError`."""
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("server closed the connection")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        raise ReplyError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind not in (b"$", b"*"):
        raise ValueError(f"unexpected reply line {line!r}")
    length = int(body)
    if length < 0:
        return None
    if kind == b"*":
        return [_parse(stream) for _ in range(length)]
    data = stream.read(length + 2)
    if len(data) != length + 2:
        raise ConnectionError("server closed the connection")
    return data[:length]


def call(server: Address, *args: str | int | bytes, timeout: float = COMMAND_TIMEOUT) -> Reply:
    """Send one command to ``server`` on a new connection and return the parsed reply.

    Raises:
        ReplyError: The server answered with an error.
        OSError: The connection failed or timed out.
        ValueError: The answer is not RESP2.
    """
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(encode(args))
        with sock.makefile("rb") as stream:
            return _parse(stream)


def text(server: Address, *args: str | int | bytes, timeout: float = COMMAND_TIMEOUT) -> str:
    """:func:`call` for a command that answers a string; the string, decoded."""
    reply = call(server, *args, timeout=timeout)
    if not isinstance(reply, bytes):
        raise ValueError(f"{args[0]!s} replied {reply!r}, not a string")
    return reply.decode(errors="replace")


def info(server: Address, section: str, *, timeout: float = COMMAND_TIMEOUT) -> dict[str, str]:
    """The fields of ``INFO <section>`` as a dict (``"role"`` -> ``"master"``)."""
    found: dict[str, str] = {}
    for line in text(server, "INFO", section, timeout=timeout).splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            found[key] = value
    return found


def fields(reply: Reply) -> dict[str, str]:
    """Turn a flat ``[name, value, name, value, ...]`` array reply into a dict."""
    if not isinstance(reply, list):
        raise ValueError(f"expected an array reply, got {reply!r}")
    items = [item.decode() if isinstance(item, bytes) else str(item) for item in reply]
    return dict(zip(items[::2], items[1::2], strict=True))
