"""The wait queue's admission, ETA and refill-rate arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.queueing import RateEstimator, admit, boot_overlap, eta_per_place, serve_order, serve_plan


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


# -- batches (up to `missing`, any number accepted) beside whole requests ----------------------------


# Queues in arrival order: each waiter has waited no longer than those ahead of it.
def in_arrival_order(waiters: list[tuple[int, float, bool]]) -> list[tuple[int, float, bool]]:
    waits = sorted((waited for _, waited, _ in waiters), reverse=True)
    return [(missing, waited, batch) for (missing, _, batch), waited in zip(waiters, waits, strict=True)]


queues = st.lists(
    st.tuples(st.integers(1, 20), st.floats(0, 100, allow_nan=False), st.booleans()), max_size=30
).map(in_arrival_order)


def test_a_batch_takes_what_is_warm_when_nobody_behind_it_has_waited_the_bound() -> None:
    assert serve_plan([(300, 0.0, True), (1, 0.0, False)], warm=120, overtake_seconds=5) == [(0, 120)]


def test_a_batch_that_fits_is_served_whole_like_anyone() -> None:
    assert serve_plan([(3, 0.0, True), (1, 0.0, False)], warm=5, overtake_seconds=5) == [(0, 3), (1, 1)]


def test_those_behind_a_batch_go_first_once_they_have_waited_the_bound() -> None:
    plan = serve_plan([(300, 9.0, True), (1, 6.0, False), (2, 5.0, False), (1, 1.0, False)], 10, 5)
    assert plan == [(1, 1), (2, 2), (0, 7)]  # the young single still waits: the batch takes the rest


def test_an_old_group_behind_a_batch_collects_before_the_batch() -> None:
    assert serve_plan([(300, 9.0, True), (8, 6.0, False)], warm=3, overtake_seconds=5) == [(1, 3)]


def test_a_batch_overtakes_a_young_group_that_cannot_be_served_yet() -> None:
    assert serve_plan([(8, 1.0, False), (300, 0.5, True)], warm=3, overtake_seconds=5) == [(1, 3)]


def test_only_the_first_batch_that_cannot_be_served_whole_takes_a_part() -> None:
    assert serve_plan([(30, 2.0, True), (20, 1.0, True)], warm=10, overtake_seconds=5) == [(0, 10)]


@given(queues, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_serve_plan_hands_out_at_most_what_is_warm_and_only_the_last_turn_in_part(
    waiters: list[tuple[int, float, bool]], warm: int, overtake: float
) -> None:
    turns = serve_plan(waiters, warm, overtake)
    assert sum(take for _, take in turns) <= warm
    assert len({i for i, _ in turns}) == len(turns)  # each waiter at most once
    for index, take in turns[:-1]:
        assert take == waiters[index][0]
    for index, take in turns:
        missing, waited, batch = waiters[index]
        assert 0 < take <= missing
        if take < missing and not batch:
            assert waited >= overtake  # a whole request gets part only while collecting, when old


@given(queues, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_nobody_overtakes_a_whole_request_that_has_waited_the_bound(
    waiters: list[tuple[int, float, bool]], warm: int, overtake: float
) -> None:
    served = dict(serve_plan(waiters, warm, overtake))
    for later in served:
        for earlier in range(later):
            missing, waited, batch = waiters[earlier]
            if not batch and served.get(earlier) != missing:
                assert waited < overtake


@given(queues, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_a_batch_takes_nothing_that_someone_who_waited_the_bound_could_use(
    waiters: list[tuple[int, float, bool]], warm: int, overtake: float
) -> None:
    turns = serve_plan(waiters, warm, overtake)
    served = dict(turns)
    partial = [(i, t) for i, t in turns if waiters[i][2] and t < waiters[i][0]]
    if not partial:
        return
    ((batch, take),) = partial
    assert all(served.get(i) == waiters[i][0] for i in range(batch) if waiters[i][2])  # the first batch
    for index in range(batch + 1, len(waiters)):
        missing, waited, _ = waiters[index]
        if waited >= overtake and index not in served:
            assert missing > take  # it could not have been served whole with what the batch took


@given(queues, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_serve_plan_leaves_nothing_warm_that_a_waiter_could_take(
    waiters: list[tuple[int, float, bool]], warm: int, overtake: float
) -> None:
    turns = serve_plan(waiters, warm, overtake)
    left = warm - sum(take for _, take in turns)
    if left == 0:
        return
    served = dict(turns)
    for index, (missing, _, batch) in enumerate(waiters):
        if index not in served:
            assert not batch  # a batch takes any number
            assert missing > left


@given(needs, st.integers(0, 60), st.floats(0, 50, allow_nan=False))
def test_serve_order_is_serve_plan_without_batches(
    waiters: list[tuple[int, float]], warm: int, overtake: float
) -> None:
    plan = serve_plan([(m, w, False) for m, w in waiters], warm, overtake)
    assert serve_order(waiters, warm, overtake) == plan


def test_boot_overlap() -> None:
    assert boot_overlap(10.0, 13.0, 11.0, 12.5) == pytest.approx(1.5)  # created after arrival
    assert boot_overlap(10.0, 13.0, 5.0, 12.0) == pytest.approx(2.0)  # booting before arrival
    assert boot_overlap(10.0, 13.0, 5.0, 9.0) == 0.0  # warm on arrival
    assert boot_overlap(10.0, 13.0, 0.0, 12.0) == 0.0  # creation time unknown
    assert boot_overlap(10.0, 13.0, 11.0, None) == 0.0  # never seen becoming ready
