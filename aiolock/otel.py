"""OpenTelemetry metrics for aiolock (the ``otel`` extra: ``pip install aiolock-redis[otel]``).

::

    import aiolock.otel

    aiolock.otel.instrument()  # the global MeterProvider; or instrument(meter_provider)

:func:`instrument` registers an :class:`OpenTelemetryObserver` (see
:func:`aiolock.add_observer`) that records, for every lock of the process:

===============================  =========  =====  ===========================================
instrument                       kind       unit   recorded
===============================  =========  =====  ===========================================
``aiolock.acquisitions``         counter    1      each ``acquire()`` outcome; attributes
                                                   ``aiolock.outcome`` (``acquired`` or
                                                   ``not_acquired``), ``aiolock.contended``,
                                                   and ``error.type`` when it raised
``aiolock.acquire.duration``     histogram  s      the wait, same attributes
``aiolock.hold.duration``        histogram  s      from acquisition to release or loss;
                                                   ``aiolock.outcome`` (``released``/``lost``)
``aiolock.renewals``             counter    1      lease resets (watchdog and ``extend()``)
``aiolock.renewal.failures``     counter    1      failed watchdog renewals; ``error.type``
``aiolock.losses``               counter    1      locks lost while held
===============================  =========  =====  ===========================================

Every point also carries ``aiolock.lock.type`` (``AsyncLock`` or
``Redlock``), with ``name_attribute=True`` the lock's name as
``aiolock.lock.name`` (off by default: one series per name can be many),
and with ``identity_attribute=True`` the holder's identity as
``aiolock.holder.identity`` (off by default: the default identity names a
process and a task, a series each).
Contention is the ``aiolock.contended=true`` share of acquisitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._observe import LockEvent, add_observer, remove_observer

try:
    from opentelemetry import metrics
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "aiolock.otel needs the OpenTelemetry API: pip install 'aiolock-redis[otel]'"
    ) from exc

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

__all__ = ["OpenTelemetryObserver", "instrument", "uninstrument"]

_SCOPE = "aiolock"


class OpenTelemetryObserver:
    """An observer (see :func:`aiolock.add_observer`) that records OpenTelemetry metrics.

    Args:
        meter_provider: where the instruments come from; defaults to the
            global one (``opentelemetry.metrics.get_meter_provider()``).
        name_attribute: also label every point with the lock's name.
        identity_attribute: also label every point with the holder's identity
            (see :attr:`aiolock.LockEvent.identity`).
    """

    __slots__ = (
        "_acquire_duration",
        "_acquisitions",
        "_hold_duration",
        "_identity_attribute",
        "_losses",
        "_name_attribute",
        "_renewal_failures",
        "_renewals",
    )

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        name_attribute: bool = False,
        identity_attribute: bool = False,
    ) -> None:
        from ._version import __version__

        if not isinstance(name_attribute, bool):
            raise TypeError(f"name_attribute must be a bool, got {name_attribute!r}")
        if not isinstance(identity_attribute, bool):
            raise TypeError(f"identity_attribute must be a bool, got {identity_attribute!r}")
        self._identity_attribute = identity_attribute
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider)
        self._name_attribute = name_attribute
        self._acquisitions = meter.create_counter(
            "aiolock.acquisitions", unit="1", description="Outcomes of acquire()."
        )
        self._acquire_duration = meter.create_histogram(
            "aiolock.acquire.duration",
            unit="s",
            description="Time acquire() took, until the lock was held or the timeout passed.",
        )
        self._hold_duration = meter.create_histogram(
            "aiolock.hold.duration",
            unit="s",
            description="Time a lock was held, until released or lost.",
        )
        self._renewals = meter.create_counter(
            "aiolock.renewals", unit="1", description="Lease resets (watchdog and extend())."
        )
        self._renewal_failures = meter.create_counter(
            "aiolock.renewal.failures",
            unit="1",
            description="Watchdog renewals that failed (retried until the lease ends).",
        )
        self._losses = meter.create_counter(
            "aiolock.losses", unit="1", description="Locks lost while held."
        )

    def __call__(self, event: LockEvent) -> None:
        """Record ``event`` on the instruments."""
        attributes: dict[str, Any] = {"aiolock.lock.type": type(event.lock).__name__}
        if self._name_attribute:
            attributes["aiolock.lock.name"] = event.name
        if self._identity_attribute and event.identity is not None:
            attributes["aiolock.holder.identity"] = event.identity
        kind = event.kind
        if kind in ("acquired", "not_acquired"):
            attributes["aiolock.outcome"] = kind
            attributes["aiolock.contended"] = event.contended
            if event.error is not None:
                attributes["error.type"] = type(event.error).__qualname__
            self._acquisitions.add(1, attributes)
            if event.waited is not None:
                self._acquire_duration.record(event.waited, attributes)
        elif kind in ("released", "lost"):
            if kind == "lost":
                self._losses.add(1, attributes)
            if event.held is not None:
                self._hold_duration.record(event.held, {**attributes, "aiolock.outcome": kind})
        elif kind == "renewed":
            self._renewals.add(1, attributes)
        elif kind == "renewal_failed":
            error = type(event.error).__qualname__ if event.error is not None else "unknown"
            self._renewal_failures.add(1, {**attributes, "error.type": error})


def instrument(
    meter_provider: MeterProvider | None = None,
    *,
    name_attribute: bool = False,
    identity_attribute: bool = False,
) -> OpenTelemetryObserver:
    """Record aiolock's metrics with OpenTelemetry from now on; return the observer.

    Args:
        meter_provider: defaults to the global meter provider.
        name_attribute: label points with the lock's name too.
        identity_attribute: label points with the holder's identity too.

    Returns:
        The registered observer; pass it to :func:`uninstrument` to stop.
    """
    observer = OpenTelemetryObserver(
        meter_provider, name_attribute=name_attribute, identity_attribute=identity_attribute
    )
    add_observer(observer)
    return observer


def uninstrument(observer: OpenTelemetryObserver) -> None:
    """Stop recording with ``observer`` (from :func:`instrument`).

    Raises:
        ValueError: it is not registered.
    """
    remove_observer(observer)
