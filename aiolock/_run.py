"""``aiolock run`` and ``aiolock status``: a distributed ``flock(1)``, and a look at a lock.

``aiolock run NAME -- CMD [ARGS...]`` waits for the lock ``NAME``, holds it
with :class:`~aiolock.AsyncLock` (renewed every ``ttl/3``) while ``CMD`` runs
as a child process, releases it when ``CMD`` ends, and exits with ``CMD``'s
status. It is meant for cron jobs and timers that must not run twice at once
across machines. ``aiolock status NAME`` asks the server whether the lock is
held, how much of its lease is left, and its last fence.

Exit statuses (``sysexits.h`` where one fits, the shell's otherwise):

====== =====================================================================
0      ``run``: the command exited 0. ``status``: the lock is held.
N      ``run``: the command's own exit status, passed through.
2      bad usage (a wrong option, an empty name, a malformed URL).
3      ``status``: the lock is free (like ``systemctl is-active``).
69     the server could not be reached, answered with an error, or did
       not answer in time (``EX_UNAVAILABLE``). ``run``: before the lock
       was acquired (the command did not run; "the server did not answer
       within S s" when the attempt in flight at the deadline got no
       answer), or when releasing it after the command had ended (the
       lock then expires within ``--ttl``).
70     ``run``: the lock was lost (``EX_SOFTWARE``): while the command ran
       (it was sent SIGTERM, then SIGKILL after ``--grace`` seconds); before
       the command started (it was not run); or found at the release, after
       the command had ended (nothing was terminated).
75     ``run``: the lock was held by someone else until the deadline; the
       command did not run (``EX_TEMPFAIL``).
126    ``run``: the command was found but could not be executed.
127    ``run``: the command was not found.
128+N  ``run``: the command died of signal N (or ``aiolock run`` itself got
       signal N while it was still waiting, and never started the command).
====== =====================================================================

Whenever the status is aiolock's own rather than the command's, aiolock
prints exactly one line on stderr that says why, starting with ``aiolock:``
(with ``-v``, log records come too; bad options get argparse's usage
message instead). When the status is the command's, aiolock prints nothing.
The first problem decides: once the status is aiolock's own (126, 127, 70,
a signal while waiting), what the release finds later (a loss, a server
error) neither changes it nor prints a second line; a 69 or 70 from the
release replaces only a status of the command's, and its line gives that
status. A command that itself exits with 69, 70 or 75 cannot be told apart
by status alone, only by the absence of that line.

**Signals.** SIGHUP, SIGINT, SIGQUIT and SIGTERM received by ``aiolock run``
while the command runs are passed on to it, and the lock is held until it
has exited. SIGINT and SIGQUIT are not passed on while ``aiolock run``'s
process group is the foreground process group of its terminal, whoever sent
them: the terminal (Ctrl-C, Ctrl-Backslash) sends them to that whole group,
the command included, and a second copy would interrupt the command's own
clean-up. A hangup of the terminal signals the whole group too, so the
command gets SIGHUP twice: from the terminal and from aiolock. A signal of
the four that is ignored when ``aiolock run`` starts (``nohup`` ignores
SIGHUP) stays ignored: aiolock neither handles nor passes it on, and the
command inherits the ignore. A signal that comes once the command has ended,
while aiolock releases the lock and closes its connection, is ignored.
Signals go to the command's process only, not to its children: a shell
script should ``exec`` its last command. If ``aiolock run`` itself is killed
with SIGKILL, the command runs on without the lock once the lease has run
out.

**Passwords.** Every message that shows a server URL shows it through
:func:`redact_url`, and error texts from the client are scrubbed of the
URL's password as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, TextIO
from urllib.parse import SplitResult, unquote, urlsplit

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from ._exceptions import LockError, LockLostError, LockNotOwnedError
from ._keys import Keys
from ._lock import AsyncLock
from ._scripts import STATUS_HOLDERS, decode_holders
from ._semaphore import Semaphore
from ._types import Client
from ._wire import Wire

__all__ = [
    "DEFAULT_URL",
    "EX_CANNOT_EXECUTE",
    "EX_FREE",
    "EX_LOST",
    "EX_NOT_FOUND",
    "EX_OK",
    "EX_SIGNAL_BASE",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "FORWARDED_SIGNALS",
    "RunConfig",
    "StatusConfig",
    "bad_url_message",
    "check_url",
    "redact_url",
    "resolve_url",
    "run_command",
    "show_status",
    "unavailable_message",
]

#: The server used when neither ``--url`` nor ``$AIOLOCK_URL`` names one.
DEFAULT_URL: Final = "redis://localhost:6379/0"

#: Success: the command exited 0 (``run``), or the lock is held (``status``).
EX_OK: Final = 0
#: Bad usage (argparse uses it too).
EX_USAGE: Final = 2
#: ``status``: the lock is free.
EX_FREE: Final = 3
#: The server could not be reached or answered with an error (sysexits ``EX_UNAVAILABLE``).
EX_UNAVAILABLE: Final = 69
#: ``run``: the lock was lost while the command ran (sysexits ``EX_SOFTWARE``).
EX_LOST: Final = 70
#: ``run``: the lock was not acquired in time (sysexits ``EX_TEMPFAIL``).
EX_TEMPFAIL: Final = 75
#: ``run``: the command could not be executed (as the shell says it).
EX_CANNOT_EXECUTE: Final = 126
#: ``run``: the command was not found (as the shell says it).
EX_NOT_FOUND: Final = 127
#: ``run``: the command died of signal N: the status is ``EX_SIGNAL_BASE + N``.
EX_SIGNAL_BASE: Final = 128

#: The signals ``aiolock run`` passes on to the command.
FORWARDED_SIGNALS: Final = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
#: The signals a terminal sends to its whole foreground process group.
_KEYBOARD_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGQUIT})

#: What the server or the client may raise: redis-py's errors, the cluster
#: client's own (not a ``RedisError``), and the socket's.
_SERVER_ERRORS: Final = (RedisError, RedisClusterException, OSError)

#: How long leftover tasks (a release listener lingering) may take to end by themselves.
_DRAIN_BOUND: Final = 2.0

_MASK: Final = "***"


# -- URLs and messages -------------------------------------------------------------------


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


def _seconds(value: float) -> str:
    """``5.0``, ``0.3``, ``0.25``: at least one decimal, at most three."""
    text = f"{value:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _status_of(returncode: int) -> int:
    """The shell's exit status for a child's return code (``-N`` for signal N)."""
    return EX_SIGNAL_BASE - returncode if returncode < 0 else returncode


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _connect(url: str, cluster: bool) -> Client:
    """A client for ``url`` (nothing is sent yet); ``ValueError`` for a malformed URL.

    redis-py passes every ``?name=value`` of the URL on as a keyword argument.
    A name it does not know fails only when the first connection is made, as a
    bare ``TypeError``, and some bad values (``protocol=9``) as an error that
    looks like the server's. So the connection the first command would use is
    built here, without connecting: whatever that raises is the URL's fault,
    and becomes a ``ValueError`` that names the option (never the password).
    """
    client: Client
    try:
        if cluster:
            client = RedisCluster.from_url(url)
            for node in client.nodes_manager.startup_nodes.values():
                node.connection_class(**node.connection_kwargs)  # built only, never opened
        else:
            client = Redis.from_url(url)
            pool = client.connection_pool
            pool.connection_class(**pool.connection_kwargs)  # built only, never opened
    except (TypeError, RedisError) as exc:
        raise ValueError(_option_problem(exc, url)) from None
    return client


def check_url(url: str, cluster: bool = False) -> None:
    """Check a server URL's options without connecting.

    Raises:
        ValueError: an option redis-py does not take or cannot use (named).
    """
    _connect(url, cluster)


def bad_url_message(exc: ValueError, url: str) -> str:
    """The one line that reports a bad server URL (exit status 2), without the password."""
    return f"aiolock: bad server URL {redact_url(url)}: {_describe(exc, url)}"


def _option_problem(exc: Exception, url: str) -> str:
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


async def _close(client: Client) -> None:
    """Close ``client`` after letting leftover tasks (a lingering listener) end."""
    me = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not me]
    if others:
        _, pending = await asyncio.wait(others, timeout=_DRAIN_BOUND)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    with contextlib.suppress(*_SERVER_ERRORS):
        await client.aclose()


# -- aiolock run --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunConfig:
    """What ``aiolock run`` does.

    Attributes:
        name: the lock's name.
        command: the command and its arguments.
        url: the server's URL.
        cluster: connect with ``RedisCluster`` instead of ``Redis``.
        prefix: the lock key's prefix.
        ttl: the lease in seconds (renewed every ``ttl/3``).
        timeout: how long to wait for the lock in seconds; ``None`` forever,
            ``0`` tries once.
        grace: after a loss, seconds between SIGTERM and SIGKILL.
        fencing: number the acquisition; the command gets ``AIOLOCK_FENCE``.
        limit: take one of ``limit`` permits of a :class:`~aiolock.Semaphore`
            named ``name`` instead of the lock (None: the lock).
    """

    name: str
    command: tuple[str, ...]
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "aiolock:"
    ttl: float = 10.0
    timeout: float | None = None
    grace: float = 10.0
    fencing: bool = False
    limit: int | None = None

    @property
    def what(self) -> str:
        """The lock or semaphore, in words: ``lock 'x'``, ``semaphore 'x' (2 permits)``."""
        if self.limit is None:
            return f"lock {self.name!r}"
        permits = "1 permit" if self.limit == 1 else f"{self.limit} permits"
        return f"semaphore {self.name!r} ({permits})"

    @property
    def taken(self) -> str:
        """What a failed wait found, in words."""
        return "is held by someone else" if self.limit is None else "has every permit taken"


def run_command(config: RunConfig, err: TextIO | None = None) -> int:
    """Run ``config.command`` while holding the lock; return the exit status.

    Args:
        config: what to run, under which lock, on which server.
        err: where aiolock's own one-line messages go (default: stderr).

    Returns:
        The command's exit status, or one of aiolock's own (see the module).
    """
    return asyncio.run(_Job(config, sys.stderr if err is None else err).main())


def _in_foreground() -> bool:
    """Whether this process's group is the foreground group of its terminal."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class _Job:
    """One ``aiolock run``: the lock, the child, the signals, the outcome."""

    def __init__(self, config: RunConfig, err: TextIO) -> None:
        self.config = config
        self.err = err
        self.proc: asyncio.subprocess.Process | None = None
        self.signals: list[int] = []  # received before the child existed
        self.wait_scope: anyio.CancelScope | None = None
        self.lost = False
        self.terminated_with: str | None = None  # SIGTERM or SIGKILL, after a loss
        self.kill_timer: asyncio.TimerHandle | None = None
        self.reported = False  # whether say() printed the run's one line
        self.closing = False  # the outcome is settled; only the client is left to close

    def was_lost(self) -> bool:
        """Whether ``on_lost`` ran (a method: the flag changes behind awaits)."""
        return self.lost

    def say(self, line: str) -> None:
        """Print the run's one line on stderr: it comes with a status of aiolock's own."""
        self.reported = True
        print(line, file=self.err, flush=True)

    async def main(self) -> int:
        """Connect, watch the signals, run the job, and clean everything up."""
        config = self.config
        try:
            client = _connect(config.url, config.cluster)
        except ValueError as exc:
            self.say(bad_url_message(exc, config.url))
            return EX_USAGE
        loop = asyncio.get_running_loop()
        # A signal ignored from the start (nohup, a shell's background job) stays ignored.
        # With a handler here, exec would reset it to the default in the command, which
        # would lose the ignore, and aiolock would pass the signal on besides.
        handled = [s for s in FORWARDED_SIGNALS if signal.getsignal(s) != signal.SIG_IGN]
        for signum in handled:
            loop.add_signal_handler(signum, self.on_signal, signum)
        try:
            return await self.locked(client)
        finally:
            if self.kill_timer is not None:
                self.kill_timer.cancel()
            self.closing = True  # on_signal ignores what comes now
            try:
                await _close(client)
            finally:
                # Only now: with the default handlers back, a Ctrl-C while the client
                # closes (up to _DRAIN_BOUND) would end in a KeyboardInterrupt traceback.
                for signum in handled:
                    loop.remove_signal_handler(signum)

    async def locked(self, client: Client) -> int:
        """Acquire the lock, run the command under it, release it; the exit status."""
        config = self.config
        try:
            lock: AsyncLock | Semaphore
            if config.limit is None:
                lock = AsyncLock(
                    client,
                    config.name,
                    ttl=config.ttl,
                    timeout=config.timeout,
                    prefix=config.prefix,
                    fencing=config.fencing,
                    on_lost=self.on_lost,
                )
            else:
                lock = Semaphore(
                    client,
                    config.name,
                    config.limit,
                    ttl=config.ttl,
                    timeout=config.timeout,
                    prefix=config.prefix,
                    on_lost=self.on_lost,
                )
        except (TypeError, ValueError) as exc:
            self.say(f"aiolock: {exc}")
            return EX_USAGE
        acquired = False  # stays so if a signal cancels the wait
        try:
            with anyio.CancelScope() as self.wait_scope:
                try:
                    acquired = await lock.acquire()
                except _SERVER_ERRORS as exc:
                    self.say(unavailable_message(exc, config.url))
                    return EX_UNAVAILABLE
                except LockError as exc:  # the name is another kind's (a lock, a semaphore)
                    self.say(f"aiolock: {exc}; did not run the command")
                    return EX_USAGE
        finally:
            self.wait_scope = None
        if not acquired and not self.signals:
            if config.timeout == 0:
                self.say(f"aiolock: {config.what} {config.taken}; did not wait")
            else:
                waited = _seconds(config.timeout or 0.0)
                self.say(f"aiolock: {config.what} {config.taken}; gave up after {waited} s")
            return EX_TEMPFAIL
        try:
            status = await self.supervise(lock)
        except BaseException as exc:  # a bug, not an outcome: it goes on, after the release
            if acquired:
                await self.release_after(lock, exc)
            raise
        if acquired:
            status = await self.release(lock, status)
        return status

    async def supervise(self, lock: AsyncLock | Semaphore) -> int:
        """Start the command under the held lock and wait for it; its status, or ours."""
        config = self.config
        if self.signals:
            self.say(
                f"aiolock: got {_signal_name(self.signals[0])} while waiting for "
                f"{config.what}; did not run the command"
            )
            return EX_SIGNAL_BASE + self.signals[0]
        if self.lost:
            self.say(f"aiolock: lost {config.what} before the command started; did not run it")
            return EX_LOST
        env = dict(os.environ)
        env["AIOLOCK_LOCK_NAME"] = config.name
        if config.fencing and lock.fence is not None:
            env["AIOLOCK_FENCE"] = str(lock.fence)
        else:
            env.pop("AIOLOCK_FENCE", None)  # an outer `aiolock run --fencing` must not leak in
        program = config.command[0]
        try:
            self.proc = await asyncio.create_subprocess_exec(*config.command, env=env)
        except FileNotFoundError:
            self.say(f"aiolock: {program}: command not found")
            return EX_NOT_FOUND
        except OSError as exc:
            self.say(f"aiolock: {program}: cannot execute: {exc.strerror or exc}")
            return EX_CANNOT_EXECUTE
        for signum in self.signals:  # arrived while the child was being started
            self.forward(signum)
        if self.was_lost():  # while the child was being started
            self.terminate()
        returncode = await self.proc.wait()
        if self.kill_timer is not None:
            self.kill_timer.cancel()
        if self.was_lost():
            if self.terminated_with == "SIGKILL":
                how = f"with SIGTERM, then SIGKILL {_seconds(config.grace)} s later"
            elif self.terminated_with == "SIGTERM":
                how = "with SIGTERM"
            else:
                how = "(it was exiting already)"
            self.say(
                f"aiolock: lost {config.what} while the command ran; terminated the "
                f"command {how}; its exit status was {_status_of(returncode)}"
            )
            return EX_LOST
        return _status_of(returncode)

    async def release(self, lock: AsyncLock | Semaphore, status: int) -> int:
        """Release the lock; return the run's final status.

        A status of aiolock's own (its line is printed already) stands: whatever
        the release finds is neither printed nor allowed to change it, so a run
        prints at most one line. The command's own status turns into
        :data:`EX_LOST` if the lock is found lost now (the command had ended;
        nothing was terminated), or :data:`EX_UNAVAILABLE` if the server fails
        to release it (the key then expires within ``ttl``); the one line gives
        the command's status.
        """
        config = self.config
        if self.reported:
            with contextlib.suppress(LockLostError, LockNotOwnedError, *_SERVER_ERRORS):
                await lock.release()  # a lost holding is forgotten without a server call
            return status
        try:
            await lock.release()
        except LockLostError:
            self.say(
                f"aiolock: {config.what} was found lost when it was released "
                f"(another holder may have run meanwhile); the command's exit status was {status}"
            )
            return EX_LOST
        except _SERVER_ERRORS as exc:
            self.say(
                f"{unavailable_message(exc, config.url)} (releasing {config.what}, "
                f"which expires within {_seconds(config.ttl)} s; "
                f"the command's exit status was {status})"
            )
            return EX_UNAVAILABLE
        return status

    async def release_after(self, lock: AsyncLock | Semaphore, error: BaseException) -> None:
        """Release the lock while ``error`` propagates; a failed release is noted on it.

        ``error`` is not an outcome (those are statuses) but a bug or an
        interruption, so it propagates with its own traceback; a loss or a
        server error found by the release is attached to it as a note instead
        of replacing it.
        """
        config = self.config
        try:
            await lock.release()
        except LockNotOwnedError:
            pass
        except LockLostError as exc:
            error.add_note(f"aiolock: {exc}")
        except _SERVER_ERRORS as exc:
            error.add_note(
                f"{unavailable_message(exc, config.url)} (releasing {config.what}, "
                f"which expires within {_seconds(config.ttl)} s)"
            )

    # -- callbacks (run by the event loop) ----------------------------------------------

    def on_signal(self, signum: int) -> None:
        """A signal reached ``aiolock run``: pass it on, or stop waiting for the lock.

        Once the outcome is settled (the command ended or never started) it is
        ignored: only the client is left to close.
        """
        if self.closing:
            return
        if self.proc is not None:
            self.forward(signum)
            return
        self.signals.append(signum)
        if self.wait_scope is not None:
            self.wait_scope.cancel()

    def forward(self, signum: int) -> None:
        """Pass ``signum`` on to the command, unless the terminal sent it there already."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if signum in _KEYBOARD_SIGNALS and _in_foreground():
            return  # the terminal sent it to the command's process group already
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    def on_lost(self, lock: AsyncLock | Semaphore) -> None:
        """The lock's watchdog found the lock lost: terminate the command."""
        self.lost = True
        if self.proc is not None:
            self.terminate()

    def terminate(self) -> None:
        """Send the command SIGTERM now, and SIGKILL after the grace period."""
        proc = self.proc
        if proc is None or proc.returncode is not None or self.terminated_with is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        self.terminated_with = "SIGTERM"
        self.kill_timer = asyncio.get_running_loop().call_later(self.config.grace, self.kill)

    def kill(self) -> None:
        """The grace period is over: SIGKILL the command if it still runs."""
        self.kill_timer = None
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        self.terminated_with = "SIGKILL"


# -- aiolock status ----------------------------------------------------------------------


@dataclass(frozen=True)
class StatusConfig:
    """What ``aiolock status`` asks.

    Attributes:
        name: the lock's name.
        url: the server's URL.
        cluster: connect with ``RedisCluster`` instead of ``Redis``.
        prefix: the lock key's prefix.
        json: print one JSON object instead of a sentence.
    """

    name: str
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "aiolock:"
    json: bool = False


def show_status(config: StatusConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the lock's state as the server sees it; return 0 if held, 3 if free.

    The sentence (or the JSON object, with ``config.json``) gives the key,
    whether it is held, the remaining lease in seconds (``PTTL``; none for a
    key without expiry) and the fence counter (the fence of the latest
    acquisition with ``fencing=True``, if there ever was one).

    JSON fields: ``name``, ``key``, ``kind`` (``"lock"``, ``"semaphore"``,
    ``"read-write"``, or null for a free name), ``held`` (bool), ``lease``
    (seconds left, a float, or null), ``fence`` (an int or null), ``server``
    (the URL without its password). A semaphore's name gives ``permits`` (a
    list of ``{"lease": seconds left}``, first ending first) instead of
    ``lease`` and ``fence``; a read-write lock's gives ``readers`` (the same
    list) and ``writer`` (``{"lease": ...}`` or null).

    Args:
        config: which lock, on which server, printed how.
        out: where the state goes (default: stdout).
        err: where an error line goes (default: stderr).

    Returns:
        0 if held, 3 if free, 69 if the server could not be asked, 2 for a bad name or URL.
    """
    return asyncio.run(
        _status(config, sys.stdout if out is None else out, sys.stderr if err is None else err)
    )


async def _status(config: StatusConfig, out: TextIO, err: TextIO) -> int:
    try:
        client = _connect(config.url, config.cluster)
    except ValueError as exc:
        print(
            bad_url_message(exc, config.url),
            file=err,
        )
        return EX_USAGE
    try:
        try:
            keys = Keys(config.name, config.prefix)
        except (TypeError, ValueError) as exc:
            print(f"aiolock: {exc}", file=err)
            return EX_USAGE
        try:
            pttl, raw_fence, permits = await _ask(client, keys)
        except _SERVER_ERRORS as exc:
            print(unavailable_message(exc, config.url), file=err)
            return EX_UNAVAILABLE
    finally:
        await _close(client)
    if permits is not None:
        kind, holders = permits
        if kind == "semaphore":
            return _show_permits(config, keys, [lease for _, lease in holders], out)
        return _show_readers_and_writer(config, keys, holders, out)
    held = pttl != -2
    lease = pttl / 1000 if pttl >= 0 else None
    fence = _fence(raw_fence)
    if config.json:
        state: dict[str, Any] = {
            "name": config.name,
            "key": keys.lock,
            "kind": "lock" if held else None,
            "held": held,
            "lease": lease,
            "fence": fence,
            "server": redact_url(config.url),
        }
        print(json.dumps(state), file=out)
    else:
        print(" ".join(_sentence(config.name, keys.lock, held, lease, fence)), file=out)
    return EX_OK if held else EX_FREE


def _show_readers_and_writer(
    config: StatusConfig, keys: Keys, holders: list[tuple[str, float]], out: TextIO
) -> int:
    """A read-write lock's state: its readers, or its writer, and when each lease ends."""
    readers = [lease for kind, lease in holders if kind == "r"]
    writer = next((lease for kind, lease in holders if kind == "w"), None)
    if config.json:
        state: dict[str, Any] = {
            "name": config.name,
            "key": keys.lock,
            "kind": "read-write",
            "held": bool(holders),
            "readers": [{"lease": lease} for lease in readers],
            "writer": None if writer is None else {"lease": writer},
            "server": redact_url(config.url),
        }
        print(json.dumps(state), file=out)
    elif writer is not None:
        print(
            f"read-write lock {config.name!r} is held by a writer (key {keys.lock}); "
            f"its lease ends in {writer:.3f} s",
            file=out,
        )
    elif readers:
        ends = ", ".join(f"{lease:.3f} s" for lease in readers)
        count = "1 reader" if len(readers) == 1 else f"{len(readers)} readers"
        theirs = "its lease ends" if len(readers) == 1 else "their leases end"
        print(
            f"read-write lock {config.name!r} is held by {count} (key {keys.lock}); "
            f"{theirs} in {ends}",
            file=out,
        )
    else:
        print(f"read-write lock {config.name!r} is free (key {keys.lock})", file=out)
    return EX_OK if holders else EX_FREE


def _show_permits(config: StatusConfig, keys: Keys, leases: list[float], out: TextIO) -> int:
    """A semaphore's state: how many permits are held, and when each lease ends."""
    if config.json:
        state: dict[str, Any] = {
            "name": config.name,
            "key": keys.lock,
            "kind": "semaphore",
            "held": bool(leases),
            "permits": [{"lease": lease} for lease in leases],
            "server": redact_url(config.url),
        }
        print(json.dumps(state), file=out)
    elif not leases:
        print(f"semaphore {config.name!r} has no permit held (key {keys.lock})", file=out)
    else:
        ends = ", ".join(f"{lease:.3f} s" for lease in leases)
        count = "1 permit" if len(leases) == 1 else f"{len(leases)} permits"
        theirs = "its lease ends" if len(leases) == 1 else "their leases end"
        print(
            f"semaphore {config.name!r} has {count} held (key {keys.lock}); {theirs} in {ends}",
            file=out,
        )
    return EX_OK if leases else EX_FREE


async def _ask(
    client: Client, keys: Keys
) -> tuple[int, bytes | None, tuple[str, list[tuple[str, float]]] | None]:
    """The lock key's ``PTTL`` and fence counter, in one round trip; other kinds' holders.

    A key that is a sorted set is a semaphore's, a hash a read-write
    lock's: the third item is then ``("semaphore", holders)`` or
    ``("read-write", holders)``, each holder ``(kind, seconds its lease has
    left)`` (kind ``"p"`` for a permit, ``"r"``/``"w"`` for a reader or the
    writer), first ending first (else None).
    """
    # Every key shares the lock's hash slot, so a cluster pipeline sends them together.
    pipe = client.pipeline()
    pipe.pttl(keys.lock)
    pipe.get(keys.fence)
    pipe.type(keys.lock)
    pttl, fence, kind = await pipe.execute()
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind not in ("zset", "hash"):
        return int(pttl), fence, None
    # The holders and the server's clock, in one script (a cluster client sends no
    # keyless TIME in a pipeline).
    named, args = STATUS_HOLDERS.call(lock=keys.lock)
    now_ms, ends = decode_holders(await Wire(client).run(STATUS_HOLDERS, named, args))
    holders = [(holder, (at - now_ms) / 1000) for holder, at in ends if at > now_ms]
    holders.sort(key=lambda holder: holder[1])
    return int(pttl), fence, ("semaphore" if kind == "zset" else "read-write", holders)


def _fence(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None  # not a counter aiolock wrote


def _sentence(
    name: str, key: str, held: bool, lease: float | None, fence: int | None
) -> Iterator[str]:
    if not held:
        yield f"lock {name!r} is free (key {key});"
        yield "no fence issued yet" if fence is None else f"last fence {fence}"
        return
    yield f"lock {name!r} is held (key {key});"
    if lease is None:
        yield "its key has no expiry (not set by aiolock?);"
    else:
        yield f"lease ends in {lease:.3f} s;"
    yield "no fence" if fence is None else f"fence {fence}"
