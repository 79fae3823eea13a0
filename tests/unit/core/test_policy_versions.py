"""Policy versions per run: publishing and the staleness decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.policy_versions import PolicyError, RunPolicy, decide, publish, staleness


def test_first_publish_gets_defaults() -> None:
    policy = publish(None, "r1", 0, now=10.0)
    assert (policy.version, policy.staleness_bound, policy.mode, policy.updated_at) == (0, 4, "refuse", 10.0)


def test_publish_keeps_bound_and_mode_unless_given() -> None:
    first = publish(None, "r1", 1, now=1.0, staleness_bound=2, mode="flag")
    second = publish(first, "r1", 5, now=2.0)
    assert (second.version, second.staleness_bound, second.mode) == (5, 2, "flag")
    third = publish(second, "r1", 5, now=3.0, staleness_bound=0)
    assert (third.version, third.staleness_bound) == (5, 0)


def test_versions_never_go_backwards() -> None:
    current = publish(None, "r1", 7, now=1.0)
    with pytest.raises(PolicyError, match="go backwards"):
        publish(current, "r1", 6, now=2.0)


@pytest.mark.parametrize(("version", "bound", "mode"), [(-1, 1, "refuse"), (1, -1, "refuse"), (1, 1, "drop")])
def test_bad_publish_is_refused(version: int, bound: int, mode: str) -> None:
    with pytest.raises(PolicyError):
        publish(None, "r1", version, now=0.0, staleness_bound=bound, mode=mode)  # type: ignore[arg-type]


def test_refuse_mode_refuses_beyond_the_bound_with_a_clear_detail() -> None:
    policy = publish(None, "r1", 10, now=0.0, staleness_bound=2)
    assert decide(policy, 8).allowed
    refused = decide(policy, 7)
    assert not refused.allowed
    assert refused.staleness == 3
    assert "3 versions behind" in refused.detail
    assert "version >= 8" in refused.detail


def test_flag_mode_lets_stale_through_flagged() -> None:
    policy = publish(None, "r1", 10, now=0.0, staleness_bound=1, mode="flag")
    flagged = decide(policy, 2)
    assert flagged.allowed
    assert flagged.flagged
    assert flagged.staleness == 8


def test_no_policy_or_no_version_is_never_refused() -> None:
    policy = publish(None, "r1", 10, now=0.0, staleness_bound=0)
    assert decide(None, 0).allowed
    assert decide(policy, None).allowed
    assert decide(policy, 11).staleness == 0  # ahead of the learner is fresh


def test_round_trip_and_unreadable() -> None:
    policy = publish(None, "r1", 3, now=1.5, staleness_bound=2, mode="flag")
    assert RunPolicy.from_json(policy.to_json()) == policy
    for raw in ("{", "{}", '{"run":"r","version":"x","staleness_bound":1,"mode":"refuse","updated_at":0}',
                '{"run":"r","version":1,"staleness_bound":1,"mode":"nope","updated_at":0}'):  # fmt: skip
        with pytest.raises(PolicyError):
            RunPolicy.from_json(raw)


@given(
    current=st.integers(0, 10_000),
    used=st.integers(0, 10_000),
    bound=st.integers(0, 100),
    mode=st.sampled_from(["refuse", "flag"]),
)
def test_decision_matches_the_bound(current: int, used: int, bound: int, mode: str) -> None:
    policy = publish(None, "r", current, now=0.0, staleness_bound=bound, mode=mode)  # type: ignore[arg-type]
    decision = decide(policy, used)
    lag = staleness(current, used)
    assert decision.staleness == lag >= 0
    within = lag <= bound
    assert decision.allowed == (within or mode == "flag")
    assert decision.flagged == (not within and mode == "flag")
    assert bool(decision.detail) == (not within)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=20))
def test_publishing_in_order_always_succeeds_and_is_monotonic(versions: list[int]) -> None:
    policy = None
    for version in sorted(versions):
        policy = publish(policy, "r", version, now=0.0)
    assert policy is not None
    assert policy.version == max(versions)
