"""``aiolock run``: a distributed ``flock(1)``: a command run while a lock is held.

``aiolock run NAME -- CMD [ARGS...]`` waits for the lock ``NAME``, holds it
with :class:`~aiolock.AsyncLock` (renewed every ``ttl/3``; with ``--limit N``
one of ``N`` permits of a :class:`~aiolock.Semaphore`) while ``CMD`` runs as a
child process, releases it when ``CMD`` ends, and exits with ``CMD``'s
status. It is meant for cron jobs and timers that must not run twice at once
across machines. With ``--elect`` it is a standby instead: it campaigns in
the :class:`~aiolock.Election` ``NAME`` (candidates are served in the order
they came) and runs ``CMD`` only while this candidate leads, in a fenced
term; a lost term ends ``CMD`` as a lost lock does. Its exit statuses,
and the one line it prints with a status of its own, are in
:mod:`aiolock._cli._codes`: the first problem decides, and a run prints at
most one line.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TextIO

import anyio

from .._election import standby
from .._exceptions import LockError, LockLostError, LockNotOwnedError
from .._leaselock import LeaseLock
from .._lock import AsyncLock
from .._semaphore import Semaphore
from .._types import Client
from ._client import SERVER_ERRORS, close, connect
from ._codes import (
    EX_CANNOT_EXECUTE,
    EX_LOST,
    EX_NOT_FOUND,
    EX_SIGNAL_BASE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
)
from ._urls import DEFAULT_URL, bad_url_message, unavailable_message

__all__ = ["FORWARDED_SIGNALS", "RunConfig", "run_command"]

#: The signals ``aiolock run`` passes on to the command.
FORWARDED_SIGNALS: Final = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
#: The signals a terminal sends to its whole foreground process group.
_KEYBOARD_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGQUIT})


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
        elect: campaign in the :class:`~aiolock.Election` named ``name`` and
            run the command while this candidate leads (a fenced term).
        identity: the candidate's identity with ``elect`` (None: ``host:pid``).
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
    elect: bool = False
    identity: str | None = None

    @property
    def what(self) -> str:
        """The lock or semaphore, in words: ``lock 'x'``, ``semaphore 'x' (2 permits)``."""
        if self.elect:
            return f"the lead of election {self.name!r}"
        if self.limit is None:
            return f"lock {self.name!r}"
        permits = "1 permit" if self.limit == 1 else f"{self.limit} permits"
        return f"semaphore {self.name!r} ({permits})"

    @property
    def taken(self) -> str:
        """What a failed wait found, in words."""
        if self.elect:
            return "is held by another leader"
        return "is held by someone else" if self.limit is None else "has every permit taken"


def run_command(config: RunConfig, err: TextIO | None = None) -> int:
    """Run ``config.command`` while holding the lock; return the exit status.

    Args:
        config: what to run, under which lock, on which server.
        err: where aiolock's own one-line messages go (default: stderr).

    Returns:
        The command's exit status, or one of aiolock's own (see :mod:`aiolock._cli._codes`).
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
            client = connect(config.url, config.cluster)
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
                await close(client)
            finally:
                # Only now: with the default handlers back, a Ctrl-C while the client
                # closes (close() lets leftover tasks end first, for a bounded time)
                # would end in a KeyboardInterrupt traceback.
                for signum in handled:
                    loop.remove_signal_handler(signum)

    async def locked(self, client: Client) -> int:
        """Acquire the lock, run the command under it, release it; the exit status."""
        config = self.config
        campaign: Callable[[], Awaitable[bool]]
        try:
            lock: LeaseLock
            if config.elect:
                election = standby(
                    client,
                    config.name,
                    ttl=config.ttl,
                    identity=config.identity or f"{socket.gethostname()}:{os.getpid()}",
                    prefix=config.prefix,
                    timeout=config.timeout,
                    on_lost=self.on_lost,
                )
                lock = election._lock
                campaign = election._campaign
            elif config.limit is None:
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
            if not config.elect:
                campaign = lock.acquire
        except (TypeError, ValueError) as exc:
            self.say(f"aiolock: {exc}")
            return EX_USAGE
        acquired = False  # stays so if a signal cancels the wait
        try:
            with anyio.CancelScope() as self.wait_scope:
                try:
                    acquired = await campaign()
                except SERVER_ERRORS as exc:
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

    async def supervise(self, lock: LeaseLock) -> int:
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

    async def release(self, lock: LeaseLock, status: int) -> int:
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
            with contextlib.suppress(LockLostError, LockNotOwnedError, *SERVER_ERRORS):
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
        except SERVER_ERRORS as exc:
            self.say(
                f"{unavailable_message(exc, config.url)} (releasing {config.what}, "
                f"which expires within {_seconds(config.ttl)} s; "
                f"the command's exit status was {status})"
            )
            return EX_UNAVAILABLE
        return status

    async def release_after(self, lock: LeaseLock, error: BaseException) -> None:
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
        except SERVER_ERRORS as exc:
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

    def on_lost(self, lock: LeaseLock) -> None:
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
