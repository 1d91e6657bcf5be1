"""The ``aiolock`` command: ``run``, ``status``, ``ls``, ``release``, ``leader``, ``demo``...

``aiolock run NAME -- CMD [ARGS...]``
    A distributed ``flock(1)`` for cron jobs: waits for the lock ``NAME``,
    runs ``CMD`` while holding it (renewing its lease), releases it, and exits
    with ``CMD``'s status. See :mod:`aiolock._cli._run`.
``aiolock run --elect NAME -- CMD [ARGS...]``
    A standby for a service that must run once: campaigns in the election
    ``NAME`` and runs ``CMD`` only while this candidate leads.
``aiolock status NAME``
    Whether the lock is held, its remaining lease and its fence
    (:mod:`aiolock._cli._status`), and who: each holder and each waiter.
``aiolock ls [PATTERN]``
    The names held on the server, with their kind, holders, waiters and
    lease (:mod:`aiolock._cli._admin`).
``aiolock release --force NAME``
    Free a name on purpose, whoever holds it; the next waiter gets it at
    once (:mod:`aiolock._cli._admin`).
``aiolock leader NAME``
    Who leads the election ``NAME``; ``--watch`` prints every change
    (:mod:`aiolock._cli._leader`).
``aiolock demo``
    A contention demo (:mod:`aiolock._cli._demo`, on :mod:`aiolock._demo`).
``aiolock server``
    A throwaway server to try aiolock against, in the foreground
    (:mod:`aiolock._cli._server`).

The parser is :mod:`aiolock._cli._parser`, the dispatch
:mod:`aiolock._cli._main`. Every subcommand but ``demo`` and ``server`` talks to the
server named by ``--url``, else by ``$AIOLOCK_URL``, else
``redis://localhost:6379/0``
(``--cluster`` for a Redis Cluster). A password in the URL is never printed
(:mod:`aiolock._cli._urls`).

Exit statuses (made from :data:`aiolock._cli._codes.EXIT_STATUSES`, as is
every list of them):
"""

from ._codes import rst_table
from ._main import main
from ._parser import build_parser

__all__ = ["build_parser", "main"]

__doc__ = f"{__doc__ or ''}\n{rst_table()}\n"
