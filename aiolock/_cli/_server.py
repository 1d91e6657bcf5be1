"""``aiolock server``: a throwaway server in the foreground until a signal stops it."""

from __future__ import annotations

import signal
import sys
import threading

from ._codes import EX_OK, EX_UNAVAILABLE

__all__ = ["serve"]


def serve(host: str, port: int) -> int:
    """Run a server on ``host:port`` until SIGINT or SIGTERM; return the exit status.

    Args:
        host: the address to listen on.
        port: the port to listen on.

    Returns:
        0 once a signal stopped it; 69 if it could not start or exited by itself.
    """
    from ..testing import RedisServer, ServerNotFoundError

    # The handlers first: a Ctrl-C while the server starts stops it once it is up,
    # rather than interrupting the start and leaving its process behind.
    stop = threading.Event()
    previous = {
        number: signal.signal(number, lambda *_: stop.set())
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            server = RedisServer(host=host, port=port).start()
        except ServerNotFoundError as exc:
            print(f"aiolock: cannot start a server: {exc}", file=sys.stderr, flush=True)
            return EX_UNAVAILABLE
        except (RuntimeError, OSError) as exc:
            print(
                f"aiolock: the server did not start on {host}:{port}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return EX_UNAVAILABLE
        try:
            print(f"aiolock: serving {server.url} (Ctrl-C stops it)", flush=True)
            while not stop.wait(0.2):
                if not server.running:
                    print("aiolock: the server exited by itself", file=sys.stderr, flush=True)
                    return EX_UNAVAILABLE
            return EX_OK
        finally:
            server.stop()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
