"""The wait queue's admission, ETA and refill-rate arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.queueing import RateEstimator, admit, eta_per_place, serve_order


def test_admits_until_full_then_says_when_to_retry() -> None:
    admitted = admit(waiting=2, max_waiting=3, eta_per_place=0.5)
    assert admitted.admitted
    assert admitted.position == 3
    assert admitted.eta_seconds == pytest.approx(1.5)
    refused = admit(waiting=3, max_waiting=3, eta_per_place=0.5)
    assert not refused.admitted
    assert refused.retry_after_seconds == 1


@given(
    waiting=st.integers(0, 10_000),
    max_waiting=st.integers(0, 10_000),
    each=st.floats(0.001, 60, allow_nan=False),
)
def test_admission_is_consistent(waiting: int, max_waiting: int, each: float) -> None:
    result = admit(waiting, max_waiting, each)
    assert result.admitted == (waiting < max_waiting)
    assert result.position == waiting + 1
    assert result.eta_seconds == pytest.approx(result.position * each)
    assert result.retry_after_seconds >= (0 if result.admitted else 1)


def test_rate_converges_to_the_event_rate_and_decays_when_idle() -> None:
    rate = RateEstimator(half_life_seconds=5)
    for tick in range(400):
        rate.observe(now=tick * 0.1)  # 10 events per second
    assert rate.current(39.9) == pytest.approx(10, rel=0.05)
    assert rate.current(39.9 + 5) == pytest.approx(5, rel=0.05)  # one half-life later
    assert RateEstimator().current(100) == 0.0


def test_eta_per_place_uses_the_refill_rate_or_one_spinup() -> None:
    assert eta_per_place(refill_rate=4.0, spinup_seconds=2.0) == 0.25
    assert eta_per_place(refill_rate=0.0, spinup_seconds=2.0) == 2.0


# -- head-of-line blocking: who may overtake a request that cannot be served yet ---------------

needs = st.lists(st.tuples(st.integers(1, 20), st.floats(0, 100, allow_nan=False)), max_size=30)


def test_a_young_blocked_group_is_overtaken_by_a_single() -> None:
    assert serve_order([(8, 1.0), (1, 0.5)], warm=1, overtake_seconds=5) == [(1, 1)]


def test_an_old_blocked_group_collects_what_is_warm_and_blocks_those_behind() -> None:
    assert serve_order([(8, 6.0), (1, 0.5)], warm=3, overtake_seconds=5) == [(0, 3)]


def test_zero_overtake_is_strict_fifo() -> None:
    assert serve_order([(1, 0.0), (4, 0.0), (1, 0.0)], warm=3, overtake_seconds=0) == [(0, 1), (1, 2)]


@given(needs, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_serve_order_never_hands_out_more_than_is_warm(
    waiters: list[tuple[int, float]], warm: int, overtake: float
) -> None:
    turns = serve_order(waiters, warm, overtake)
    assert sum(take for _, take in turns) <= warm
    assert [i for i, _ in turns] == sorted({i for i, _ in turns})  # each at most once, in order
    for index, take in turns[:-1]:
        assert take == waiters[index][0]  # only the last turn may be partial
    assert all(0 < take <= waiters[index][0] for index, take in turns)


@given(needs, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_nobody_overtakes_a_request_that_has_waited_the_bound(
    waiters: list[tuple[int, float]], warm: int, overtake: float
) -> None:
    turns = serve_order(waiters, warm, overtake)
    served = {index: take for index, take in turns}
    for later in served:
        for earlier in range(later):
            missing, waited = waiters[earlier]
            if served.get(earlier) != missing:  # earlier was passed over or is only collecting
                assert waited < overtake


@given(needs, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_serve_order_leaves_nothing_warm_that_someone_could_take(
    waiters: list[tuple[int, float]], warm: int, overtake: float
) -> None:
    turns = serve_order(waiters, warm, overtake)
    left = warm - sum(take for _, take in turns)
    if left == 0 or (turns and turns[-1][1] < waiters[turns[-1][0]][0]):
        return  # all handed out, or an old group is collecting every refill
    served = {index for index, _ in turns}
    for index, (missing, _) in enumerate(waiters):
        if index not in served:
            assert missing > left  # nobody waiting could have been served with what is left
