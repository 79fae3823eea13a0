"""The wait queue's admission, ETA and refill-rate arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.queueing import RateEstimator, admit, eta_per_place


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
