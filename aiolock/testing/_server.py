"""One Redis/Valkey server process on a loopback port: :class:`RedisServer`.

Besides it, the process registry that stops every server still running when
the interpreter exits, and :func:`stop_together`, which the groups of
servers stop their members with.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final, final

import aiolock.testing._resp as _resp  # (not `from . import`: no edge to the package)

from ._base import ServerLife
from ._binary import debug_command_option, find_server_binary
from ._ports import CLUSTER_MAX_PORT, free_port

_START_ATTEMPTS: Final = 5
#: How long each check of a starting server may wait for an answer.
_CHECK_TIMEOUT: Final = 0.25
#: What Redis and Valkey log once they listen.
_READY_LINE: Final = "Ready to accept connections"
_LOG_KEEP_BYTES: Final = 64 * 1024
_CONFIG_FILE: Final = "server.conf"


def _wants_cluster(args: Sequence[str]) -> bool:
    items = [item.lower() for item in args]
    return any(
        item == "--cluster-enabled" and value == "yes" for item, value in itertools.pairwise(items)
    )


def _read_tail(path: str, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# --- child process set-up and clean-up ------------------------------------------------------

_PR_SET_PDEATHSIG: Final = 1


def _make_preexec() -> Callable[[], None] | None:
    """Return a ``preexec_fn`` making the child die with this thread (Linux only).

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits,
    so it is only used when the server is started from the main thread (a
    server started from a worker thread would die with that thread). The
    atexit hook covers the other cases.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes  # only needed on Linux

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _answers_as(server: _resp.Address, pid: int, timeout: float) -> bool:
    """Whether the server that answers at ``server`` says it is process ``pid`` (``INFO``)."""
    try:
        found = _resp.info(server, "server", timeout=timeout).get("process_id")
    except _resp.ReplyError:
        return False  # a server that refuses INFO is not one we started
    return found == str(pid)


def _wait_for_state(proc: subprocess.Popen[bytes] | None, *, stopped: bool) -> None:
    """Wait (up to 1 s) until /proc shows the process (un)stopped, where available."""
    if proc is None:
        return
    stat = Path(f"/proc/{proc.pid}/stat")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return
        if (state in ("T", "t")) == stopped:
            return
        time.sleep(0.001)


_live_lock = threading.Lock()
_live: set[RedisServer] = set()


def _stop_all_servers() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop(timeout=2.0)


atexit.register(_stop_all_servers)


@final
class RedisServer(ServerLife):
    """A ``redis-server``/``valkey-server`` process on a loopback port.

    The server runs with persistence disabled (``--save "" --appendonly no``),
    its own temporary working directory and log file,
    ``--repl-diskless-sync-delay 0`` (replicas sync at once) and, where the
    binary knows it (not Redis 6), ``--enable-debug-command local``; the
    caller's ``args`` are appended, so
    ``args=["--cluster-enabled", "yes"]`` makes a cluster node (its port is
    then chosen <= 55535 so that the bus port ``port + 10000`` is valid).
    With ``config`` the text is written to a configuration file in the working
    directory and passed first, so ``args=["--sentinel"]`` with a
    ``sentinel monitor ...`` config makes a sentinel that can rewrite it.

    On Linux the process is killed when the Python process dies; an atexit
    hook also stops every server still running at interpreter exit.

    Args:
        port: The port to listen on; a free one is chosen now if omitted, so
            :attr:`port` and :attr:`url` are known before :meth:`start`.
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for the server.
        host: The address to bind and connect to.
        config: The text of a configuration file, written anew into the
            working directory at each start (so a restart forgets what the
            server wrote into it).

    Raises:
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        host: The address the server binds.
        port: The port the server listens on.
        binary: The server binary.
        args: The extra command-line arguments.
        config: The configuration file text, or ``None``.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
        config: str | None = None,
    ) -> None:
        self.binary: str = binary or find_server_binary()
        self.args: tuple[str, ...] = tuple(args)
        self.config: str | None = config
        self.host: str = host
        self._max_port = CLUSTER_MAX_PORT if _wants_cluster(self.args) else 65535
        self._port_fixed = port is not None
        self.port: int = port if port is not None else free_port(max_port=self._max_port)
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._paused = False
        self._last_log = ""
        self._foreign_answer = False

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.running else "stopped"
        return f"<RedisServer {self.url} {state} pid={self.pid}>"

    @property
    def url(self) -> str:
        """The ``redis://host:port`` URL of the server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id, or ``None`` when no process is running."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def workdir(self) -> str | None:
        """The temporary working directory, or ``None`` once the server was stopped or killed."""
        return self._dir

    @property
    def running(self) -> bool:
        """Whether the process is alive (a paused process counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """Whether the process was paused with :meth:`pause`."""
        return self._paused and self.running

    def _command_line(self, workdir: str) -> list[str]:
        config = [] if self.config is None else [os.path.join(workdir, _CONFIG_FILE)]
        return [
            self.binary,
            *config,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            workdir,
            "--logfile",
            os.path.join(workdir, "server.log"),
            "--repl-diskless-sync-delay",
            "0",
            *debug_command_option(self.binary),
            *self.args,
        ]

    def start(self, *, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers ``PING``.

        If the port was taken by someone else in the meantime and the caller
        did not fix the port, another free port is chosen and the start is
        retried a few times. A start that fails, or is interrupted, leaves no
        process behind.

        Args:
            timeout: Seconds to wait for each start attempt to answer.

        Returns:
            The server itself, for chaining.

        Raises:
            RuntimeError: The server is already running, or it did not come up;
                the message ends with the last lines of its log.
        """
        return self._start(lambda: self._launch(timeout=timeout, may_move=not self._port_fixed))

    def _any_running(self) -> bool:
        return self.running

    def _launch(self, *, timeout: float, may_move: bool) -> None:
        """Spawn the process and wait until it answers, on another port if ``may_move``."""
        self._kill_and_cleanup()  # a process that exited by itself: reap it, drop its dir
        for attempt in range(_START_ATTEMPTS):
            self._spawn()
            try:
                self.wait_until_ready(timeout)
            except RuntimeError:
                port_taken = self._port_taken()
                self._kill_and_cleanup()
                if may_move and port_taken and attempt + 1 < _START_ATTEMPTS:
                    self.port = free_port(max_port=self._max_port)
                    continue
                raise
            return
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        self._dir = tempfile.mkdtemp(prefix=f"aiolock-server-{self.port}-")
        self._last_log = ""
        self._paused = False
        self._foreign_answer = False
        if self.config is not None:
            with open(os.path.join(self._dir, _CONFIG_FILE), "w", encoding="utf-8") as f:
                f.write(self.config)
        argv = self._command_line(self._dir)
        # stdout is silent (everything goes to --logfile); stderr goes to a file
        # so that start-up errors printed before the log is opened are kept.
        with open(os.path.join(self._dir, "stderr.log"), "wb") as stderr:
            self._proc = subprocess.Popen(  # noqa: S603 - argv list, no shell; resolved binary
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=_make_preexec(),  # only prctl(), see _make_preexec
                close_fds=True,
            )
        with _live_lock:
            _live.add(self)

    def _port_taken(self) -> bool:
        return self._foreign_answer or "Address already in use" in self.log_tail(50)

    def wait_until_ready(self, timeout: float = 10.0) -> None:
        """Wait until this server process answers ``PING`` on its port.

        The answer is also checked to come from this process (not another
        server that happens to listen on the same port).

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: The process is not running, exited, or did not answer
                in time; the message ends with the last lines of its log.
        """
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while True:
            proc = self._proc
            if proc is None:
                raise RuntimeError(f"{self!r} was not started")
            code = proc.poll()
            if code is not None:
                raise RuntimeError(self._failure(f"exited with code {code}"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    self._failure(f"did not answer PING within {timeout:g}s ({last_error})")
                )
            # Short timeouts: a stranger listening on the port may never
            # answer, and the loop must notice soon if our process exits.
            wait = min(_CHECK_TIMEOUT, remaining)
            try:
                reply = _resp.call(self, "PING", timeout=wait)
                if reply == b"PONG":
                    if _answers_as(self, proc.pid, wait):
                        return
                    self._foreign_answer = True
                    last_error = "another process answers on this port"
                else:
                    last_error = f"PING replied {reply!r}"
            except _resp.ReplyError as exc:
                if str(exc).startswith("NOAUTH") and _READY_LINE in self.log_tail(200):
                    # A server started with --requirepass answers only after AUTH;
                    # its own log file (in our working directory) says it is ours.
                    return
                last_error = str(exc)
            except (OSError, ValueError) as exc:
                last_error = str(exc) or type(exc).__name__
            time.sleep(0.01)

    def _failure(self, what: str) -> str:
        tail = self.log_tail(20)
        message = f"{self.binary} on {self.host}:{self.port} {what}"
        return f"{message}; last log lines:\n{tail}" if tail else f"{message} (empty log)"

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop the server with ``SIGTERM``, then ``SIGKILL`` after ``timeout``.

        A paused server is resumed first. The working directory is removed.
        Stopping a server that is not running does nothing.

        Args:
            timeout: Seconds to wait for a clean exit before killing.
        """
        self._request_stop()
        self._finish_stop(timeout)

    def _request_stop(self) -> None:
        """Send ``SIGTERM`` (after ``SIGCONT`` if paused) without waiting."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self._paused:
                    proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)

    def _finish_stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the exit :meth:`_request_stop` asked for, then kill."""
        proc = self._proc
        if proc is None:
            self._cleanup()
            return
        if proc.poll() is None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._reap()
        self._cleanup()

    def kill(self) -> None:
        """Kill the server with ``SIGKILL`` (its data is lost) and reap it.

        Killing a server that is not running does nothing.
        """
        self._kill_and_cleanup()

    def _kill_and_cleanup(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        self._reap()
        self._cleanup()

    def _reap(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL never takes this long
            proc.kill()
            proc.wait()
        self._proc = None
        self._paused = False

    def _cleanup(self) -> None:
        if self._dir is not None:
            self._last_log = self._read_log(_LOG_KEEP_BYTES)
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._proc is None:
            with _live_lock:
                _live.discard(self)

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"{self!r} is not running")
        proc.send_signal(sig)

    def pause(self) -> None:
        """Freeze the server with ``SIGSTOP``; it stops answering until :meth:`resume`.

        Clients can still connect (the kernel completes the handshake) but no
        command gets a reply. On Linux this returns once the process is stopped.

        Raises:
            RuntimeError: The server is not running.
        """
        self._signal(signal.SIGSTOP)
        self._paused = True
        _wait_for_state(self._proc, stopped=True)

    def resume(self) -> None:
        """Let a paused server run again with ``SIGCONT``.

        Raises:
            RuntimeError: The server is not running.
        """
        self._signal(signal.SIGCONT)
        self._paused = False
        _wait_for_state(self._proc, stopped=False)

    def restart(self, *, timeout: float = 10.0) -> RedisServer:
        """Kill the server if it runs, then start it again on the same port with no data.

        Args:
            timeout: Seconds to wait for the new process to answer.

        Returns:
            The server itself, for chaining.

        Raises:
            RuntimeError: The server did not come up again.
        """
        self._kill_and_cleanup()
        return self._start(lambda: self._launch(timeout=timeout, may_move=False))

    def _read_log(self, max_bytes: int) -> str:
        if self._dir is None:
            return self._last_log
        # Errors found before the log file is opened (a bad argument, say) go
        # to stderr, which is redirected to a file next to the log.
        for name in ("server.log", "stderr.log"):
            text = _read_tail(os.path.join(self._dir, name), max_bytes)
            if text.strip():
                return text
        return ""

    def log_tail(self, lines: int = 20) -> str:
        """Return the last lines of the server's log.

        After :meth:`stop` or :meth:`kill` this is the end of the log of the
        last process, kept in memory.

        Args:
            lines: How many lines to return.

        Returns:
            The lines joined with newlines (empty if there is no log).
        """
        if lines <= 0:
            return ""
        return "\n".join(self._read_log(_LOG_KEEP_BYTES).splitlines()[-lines:])


def start_all(servers: Iterable[RedisServer], timeout: float) -> None:
    """Start ``servers`` one after the other, each given ``timeout`` seconds."""
    for server in servers:
        server.start(timeout=timeout)


def stop_together(servers: Sequence[RedisServer], timeout: float = 5.0) -> None:
    """Stop servers together: ``SIGTERM`` to all, then wait, ``SIGKILL`` at ``timeout``.

    Signalling all at once keeps a master from waiting for replicas that are
    about to stop as well.
    """
    for server in servers:
        server._request_stop()
    deadline = time.monotonic() + timeout
    for server in servers:
        server._finish_stop(max(0.0, deadline - time.monotonic()))
