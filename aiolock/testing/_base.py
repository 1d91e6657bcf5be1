"""The life that a server and every group of servers here share: start, stop, ``with``.

A :class:`ServerLife` is started once (a second :meth:`~ServerLife.start`
while any of its processes runs is refused), stops whatever it started when
its start fails or is interrupted, and is a context manager: ``with`` starts
it and stops it on the way out, whatever happened in the body. Each subclass
says what starting means (the ``launch`` it hands to :meth:`ServerLife._start`),
which processes count as running, and how to stop.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from types import TracebackType
from typing import Self


class ServerLife(abc.ABC):
    """Start, stop and ``with`` for a server process or a group of them."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start, wait until ready, and return ``self``."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process and remove their working directories; idempotent."""

    @abc.abstractmethod
    def _any_running(self) -> bool:
        """Whether any process of this server or group runs."""

    def _start(self, launch: Callable[[], object]) -> Self:
        """Run ``launch`` on a stopped server or group; on any failure stop, then raise.

        Raises:
            RuntimeError: A process is already running, or ``launch`` raised it.
        """
        if self._any_running():
            raise RuntimeError(f"{self!r} is already running: stop() it first")
        try:
            launch()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
