"""Which lease keeps which protocol: every lease is a ``Lease``; one that queues has a ``Queueing``.

No server. mypy (strict, over the tests too) checks the typed assignments
below: every lease class is a ``Lease``, and a one-server lease's
``queueing`` part is a ``Queueing``. The tests check the same at run time,
and that a lease that does not queue (Redlock's quorum) has none of the
queueing members: no method that would only answer "nothing to do".
"""

from __future__ import annotations

from typing import Final

import pytest

from aiolock._lease import Lease, Queueing
from aiolock._multi_lease import MultiLease
from aiolock._quorum import QuorumLease
from aiolock._rwlock import RWLease
from aiolock._semaphore import SemaphoreLease
from aiolock._server_lease import ServerLease

#: Every lease class of aiolock is a Lease (mypy checks these assignments).
LEASES: Final[tuple[type[Lease], ...]] = (
    ServerLease,
    SemaphoreLease,
    RWLease,
    QuorumLease,
    MultiLease,
)
#: The leases that queue on their server.
QUEUEING: Final = (ServerLease, SemaphoreLease, RWLease)


def queueing_of(lease: ServerLease) -> Queueing:
    """A one-server lease's queueing part, as the engine sees it (mypy checks the type)."""
    return lease.queueing


def members(protocol: type) -> set[str]:
    """The names a protocol asks for: its attributes and its methods."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name in vars(protocol) if not name.startswith("_")}
    return names


def test_the_protocols_share_no_member() -> None:
    """A member is the core lease's or the queueing part's, never both."""
    assert members(Lease) & members(Queueing) == set()
    assert "queueing" in members(Lease)
    assert {"refresh", "leave", "hand_over", "refresh_every"} <= members(Queueing)


@pytest.mark.parametrize("lease", LEASES, ids=lambda lease: lease.__name__)
def test_every_lease_has_every_member_of_the_core_protocol(lease: type[Lease]) -> None:
    """Each lease class has what the wait loop and the holding life ask of any lease."""
    missing = {name for name in members(Lease) if not hasattr(lease, name)}
    assert missing == set()


@pytest.mark.parametrize("lease", QUEUEING, ids=lambda lease: lease.__name__)
def test_a_lease_that_queues_has_every_member_of_the_queueing_protocol(
    lease: type[ServerLease],
) -> None:
    """A one-server lease (and its subclasses) is its own queueing part."""
    missing = {name for name in members(Queueing) if not hasattr(lease, name)}
    assert missing == set()
    assert isinstance(vars(ServerLease)["queueing"], property)


def test_a_quorum_lease_has_no_queueing_part() -> None:
    """Redlock's lease does not queue: ``queueing`` is None, and no queueing member is there."""
    assert QuorumLease.queueing is None
    assert members(Queueing) & set(dir(QuorumLease)) == set()


def multi_queueing_of(lease: MultiLease) -> Queueing:
    """A MultiLock's lease's queueing part, as the engine sees it (mypy checks the type)."""
    return lease.queueing


def test_a_multi_lease_is_its_own_queueing_part_that_queues_nobody() -> None:
    """A MultiLock's lease hears releases (its queueing part is itself) but never queues."""
    missing = {name for name in members(Queueing) if not hasattr(MultiLease, name)}
    assert missing == set()
    assert isinstance(vars(MultiLease)["queueing"], property)
