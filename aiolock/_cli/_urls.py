"""Server URLs in text: which one to use, how to show it, what is wrong with one.

A password in a URL is never printed: every message that shows a server
URL shows it through :func:`redact_url`, and error texts from the client are
scrubbed of the URL's password as well (:func:`unavailable_message`,
:func:`bad_url_message`).
"""

from __future__ import annotations

import os
import re
from typing import Final
from urllib.parse import SplitResult, unquote, urlsplit

__all__ = [
    "DEFAULT_URL",
    "bad_url_message",
    "option_problem",
    "redact_url",
    "resolve_url",
    "unavailable_message",
]

#: The server used when neither ``--url`` nor ``$AIOLOCK_URL`` names one.
DEFAULT_URL: Final = "redis://localhost:6379/0"

_MASK: Final = "***"


def redact_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``, fit to be printed.

    Covers the password in the user part (``redis://user:***@host:6379/0``,
    ``redis://:***@host``) and a ``password=`` query parameter
    (``unix:///run/redis.sock?password=***``). A URL that cannot be parsed
    (or that a ``/``, ``?`` or ``#`` in the password splits early) is masked
    from ``//`` to its last ``@``.

    Args:
        url: a Redis URL as given by the user.

    Returns:
        The URL without its password; unchanged if it had none.
    """
    parts = _parse(url)
    if parts is None:
        head, sep, userinfo = _split_userinfo(url)
        return f"{head}{_MASK}{sep}{url[len(head) + len(userinfo) + len(sep) :]}" if sep else url
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{_MASK}@{hostinfo}"
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    if "?" in url:
        shown += "?" + "&".join(
            f"{field.partition('=')[0]}={_MASK}"
            if unquote(field.partition("=")[0]).lower() == "password"
            else field
            for field in parts.query.split("&")
        )
    if "#" in url:
        shown += "#" + parts.fragment
    return shown


def _parse(url: str) -> SplitResult | None:
    """``url`` split in parts, or None if it is too odd to trust the parts.

    Odd: unparsable, without ``://``, or with an ``@`` after the host part
    (a ``/``, ``?`` or ``#`` in the password split the URL early).
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if "://" not in url or "@" in parts.path + parts.query + parts.fragment:
        return None
    return parts


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """``(scheme and //, "@", userinfo)`` of a URL too odd to parse; ``sep`` is empty if none.

    The userinfo runs from after ``//`` (or the start) to the last ``@``.
    """
    start = url.find("//")
    start = 0 if start < 0 else start + 2
    end = url.rfind("@")
    if end < start:
        return url, "", ""
    return url[:start], "@", url[start:end]


def _passwords(url: str) -> list[str]:
    """The password(s) in ``url``, as written and as decoded, longest first."""
    found: set[str] = set()
    parts = _parse(url)
    if parts is None:  # redact_url masks the whole user part: so does this
        _, sep, userinfo = _split_userinfo(url)
        if sep:
            found.update({userinfo, userinfo.partition(":")[2]})
        return sorted((p for p in found if p), key=len, reverse=True)
    if parts.password:
        raw = parts.netloc.rpartition("@")[0].partition(":")[2]
        found.update({raw, parts.password, unquote(parts.password)})
    for field in parts.query.split("&"):
        key, _, value = field.partition("=")
        if unquote(key).lower() == "password" and value:
            found.update({value, unquote(value)})
    return sorted((p for p in found if p), key=len, reverse=True)


def _scrub(text: str, url: str) -> str:
    """Remove the URL's password from ``text`` (a client error may quote it)."""
    for password in _passwords(url):
        text = text.replace(password, _MASK)
    return text


def _describe(exc: BaseException, url: str) -> str:
    """``Type: message`` of an exception, scrubbed of the URL's password."""
    text = str(exc).strip() or repr(exc)
    return _scrub(f"{type(exc).__name__}: {text}", url)


def unavailable_message(exc: BaseException, url: str) -> str:
    """The one line that reports a server error (exit status 69), without the password.

    Args:
        exc: what the client raised.
        url: the server's URL as given (it is redacted here).

    Returns:
        A line starting with ``aiolock:`` naming the server and the error.
    """
    return f"aiolock: server {redact_url(url)} is unavailable: {_describe(exc, url)}"


def resolve_url(url: str | None) -> str:
    """The server URL to use: ``url``, else ``$AIOLOCK_URL``, else :data:`DEFAULT_URL`."""
    return url or os.environ.get("AIOLOCK_URL") or DEFAULT_URL


def bad_url_message(exc: ValueError, url: str) -> str:
    """The one line that reports a bad server URL (exit status 2), without the password."""
    return f"aiolock: bad server URL {redact_url(url)}: {_describe(exc, url)}"


def option_problem(exc: Exception, url: str) -> str:
    """What is wrong with the URL's options, given what building a client raised.

    Names the option: the one redis-py calls unknown, else those whose name
    (or, failing that, value) the error mentions, else all of them.
    """
    text = str(exc)
    unknown = re.search(r"unexpected keyword argument '([^']*)'", text)
    if unknown is not None:
        return f"unknown option {unknown.group(1)!r} in the URL (redis-py does not take it)"
    parts = _parse(url)
    fields = [f.partition("=") for f in (parts.query if parts is not None else "").split("&")]
    options = [(k, v) for k, _, v in fields if k and unquote(k).lower() != "password"]
    named = [k for k, _ in options if k.lower() in text.lower()]
    named = named or [k for k, v in options if len(v) > 1 and unquote(v) in text]
    named = named or [k for k, _ in options]
    which = ", ".join(repr(k) for k in named) or "none"
    return f"bad option {which} in the URL: {text}"
