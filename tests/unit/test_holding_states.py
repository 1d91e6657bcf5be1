"""A holding's life: HELD, then LOST or ENDED, changed only by its transitions (no server).

The transitions refuse a state they do not start from: a loss declared
twice, or after the release, is not a second loss, and nothing brings an
ended holding back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock._holding import Holding, State
from aiolock._queue import LocalQueue


async def a_holding() -> Holding:
    """A holding of the running task (its lease is not used here, its queue barely)."""
    task = asyncio.current_task()
    assert task is not None
    queue = LocalQueue({}, "name", asyncio.get_running_loop())
    lease: Any = object()
    return Holding("name", "token", task, 1.0, 1.0, 0.0, None, queue, lease)


def facts(holding: Holding) -> tuple[State, bool, bool, bool]:
    """Its state, whether it is live, ended, lost: read afresh at each call.

    (``live``, ``ended`` and ``lost`` are kept by the transitions beside the
    state: each must say what the state says.)
    """
    assert holding.live is (holding.state is State.HELD)
    assert holding.ended is (holding.state is State.ENDED)
    assert holding.lost is holding.is_lost()
    return holding.state, holding.live, holding.ended, holding.is_lost()


@pytest.mark.one_loop
async def test_a_loss_is_declared_once_and_kept_to_the_end() -> None:
    """HELD → LOST → ENDED: a second loss changes nothing, and the end keeps the reason."""
    holding = await a_holding()
    assert facts(holding) == (State.HELD, True, False, False)
    assert holding.lose("the key was gone")
    assert facts(holding) == (State.LOST, False, False, True)
    assert not holding.lose("another reason")
    assert not holding.lost_at_release("at release")  # lost already: not a second loss
    assert holding.loss_reason == "the key was gone"
    assert holding.end()
    assert facts(holding) == (State.ENDED, False, True, True)
    assert not holding.end()
    assert holding.loss_reason == "the key was gone"


@pytest.mark.one_loop
async def test_an_ended_holding_is_lost_only_by_its_release() -> None:
    """HELD → ENDED: no loss after the end, but its release may find the key gone."""
    holding = await a_holding()
    assert holding.end()
    assert facts(holding) == (State.ENDED, False, True, False)
    assert not holding.lose("declared after the release")
    assert facts(holding) == (State.ENDED, False, True, False)
    assert holding.lost_at_release("the key was gone at release")
    assert facts(holding) == (State.ENDED, False, True, True)
    assert not holding.lost_at_release("again")
    assert holding.loss_reason == "the key was gone at release"


@pytest.mark.one_loop
async def test_a_held_holding_is_not_lost_at_release() -> None:
    """``lost_at_release`` is for an ended holding only: a held one stays held."""
    holding = await a_holding()
    assert not holding.lost_at_release("too early")
    assert facts(holding) == (State.HELD, True, False, False)
