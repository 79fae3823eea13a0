"""Warm-pool planning: how many creates to start and how many ready sandboxes to retire."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.warm_pool import PoolCounts, WarmStep, plan_warm_step

counts = st.builds(
    PoolCounts,
    ready=st.integers(0, 200),
    creating=st.integers(0, 50),
    target=st.integers(0, 200),
    max_parallel_creates=st.integers(1, 20),
)


def _step(**counts: int) -> WarmStep:
    return plan_warm_step(PoolCounts(**counts))


def test_empty_pool_fills_in_parallel_batches() -> None:
    assert _step(ready=0, creating=0, target=10, max_parallel_creates=4) == WarmStep(4, 0)
    assert _step(ready=0, creating=4, target=10, max_parallel_creates=4) == WarmStep(0, 0)
    assert _step(ready=8, creating=1, target=10, max_parallel_creates=4) == WarmStep(1, 0)


def test_lowered_target_retires_surplus() -> None:
    assert _step(ready=10, creating=0, target=4, max_parallel_creates=2) == WarmStep(0, 6)
    assert _step(ready=3, creating=2, target=4, max_parallel_creates=2) == WarmStep(0, 1)


@given(counts)
def test_plan_never_overshoots_nor_exceeds_parallelism(state: PoolCounts) -> None:
    step = plan_warm_step(state)
    assert step.create >= 0
    assert step.retire >= 0
    assert not (step.create and step.retire)
    assert state.creating + step.create <= max(state.max_parallel_creates, state.creating)
    assert state.ready + state.creating + step.create <= max(state.target, state.ready + state.creating)
    assert step.retire <= state.ready


@given(counts)
def test_repeated_planning_converges_on_the_target(state: PoolCounts) -> None:
    ready, creating = state.ready, state.creating
    for _ in range(500):
        step = plan_warm_step(PoolCounts(ready, creating, state.target, state.max_parallel_creates))
        ready -= step.retire
        creating += step.create
        ready, creating = ready + creating, 0  # every create in flight finishes
        if step == WarmStep(0, 0) and ready == state.target:
            break
    assert ready == state.target


def test_counts_are_validated() -> None:
    with pytest.raises(ValueError, match="negative"):
        PoolCounts(ready=-1, creating=0, target=1, max_parallel_creates=1)
    with pytest.raises(ValueError, match="max_parallel_creates"):
        PoolCounts(ready=0, creating=0, target=1, max_parallel_creates=0)
