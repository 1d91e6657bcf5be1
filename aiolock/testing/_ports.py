"""Free loopback ports for servers (and for the cluster bus ``port + 10000``)."""

from __future__ import annotations

import random
import socket
from typing import Final

CLUSTER_MAX_PORT: Final = 65535 - 10000
"""The highest port a cluster node may take: its bus listens on ``port + 10000``."""


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
