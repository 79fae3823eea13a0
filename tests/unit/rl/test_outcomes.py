"""Which episodes the learner trains on: infra errors masked, time-outs scored 0, the rest as rewarded."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.client import (
    Forbidden,
    LeaseEnded,
    NoSandboxInTime,
    NotFound,
    Outcome,
    PolicyConflict,
    QueueFull,
    SandboxError,
    SandboxLost,
    SandfleetError,
    Unavailable,
)
from sandfleet.rl.outcomes import Verdict, is_infrastructure, verdict

REWARDS = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(st.sampled_from(list(Outcome)), REWARDS)
def test_only_infra_errors_are_kept_from_the_learner(outcome: Outcome, reward: float) -> None:
    assert verdict(outcome, reward).train is (outcome is not Outcome.INFRA_ERROR)


@given(REWARDS)
def test_a_time_out_is_the_policys_zero_whatever_the_response_said(reward: float) -> None:
    assert verdict(Outcome.TIMED_OUT, reward) == Verdict(train=True, reward=0.0)


@given(st.sampled_from([Outcome.PASSED, Outcome.FAILED]), REWARDS)
def test_a_scored_episode_keeps_its_reward(outcome: Outcome, reward: float) -> None:
    assert verdict(outcome, reward) == Verdict(train=True, reward=reward)


@pytest.mark.parametrize(
    "error",
    [
        SandboxLost(502, "sandbox_lost", "the agent stopped answering"),
        Unavailable(503, "unavailable", "the Kubernetes API is away"),
        SandboxError(500, "internal", "the agent failed"),
        NoSandboxInTime(504, "no_sandbox", "none warm within 60s"),
        QueueFull(429, "queue_full", "the queue is full"),
        LeaseEnded(410, "lease_ended", "the lease expired"),
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_fleet_failing_is_infrastructure(error: BaseException) -> None:
    assert is_infrastructure(error)


@pytest.mark.parametrize(
    "error",
    [
        Forbidden(403, "forbidden", "not your pool"),
        NotFound(404, "no_pool", "no pool tasks"),
        PolicyConflict(409, "stale", "too stale"),
        SandfleetError(422, "invalid", "timeout_s must be positive"),
        ValueError("the edit's anchor occurs 0 times, not once"),
        KeyError("task"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_callers_own_mistakes_are_not_masked(error: BaseException) -> None:
    assert not is_infrastructure(error)
