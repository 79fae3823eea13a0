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
from sandfleet.rl.outcomes import TrainingDecision, is_infrastructure, training_decision

REWARDS = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(st.sampled_from(list(Outcome)), REWARDS)
def test_only_infra_errors_are_kept_from_the_learner(outcome: Outcome, reward: float) -> None:
    assert training_decision(outcome, reward).train is (outcome is not Outcome.INFRA_ERROR)


@given(REWARDS)
def test_a_time_out_is_the_policys_zero_whatever_the_response_said(reward: float) -> None:
    assert training_decision(Outcome.TIMED_OUT, reward) == TrainingDecision(train=True, reward=0.0)


@given(st.sampled_from([Outcome.PASSED, Outcome.FAILED]), REWARDS)
def test_a_scored_episode_keeps_its_reward(outcome: Outcome, reward: float) -> None:
    assert training_decision(outcome, reward) == TrainingDecision(train=True, reward=reward)


# Each error, and whether it is the fleet's failure (masked) or the caller's mistake (an error to fix).
ERRORS: list[tuple[BaseException, bool]] = [
    (SandboxLost(502, "sandbox_lost", "the agent stopped answering"), True),
    (Unavailable(503, "unavailable", "the Kubernetes API is away"), True),
    (SandboxError(500, "internal", "the agent failed"), True),
    (NoSandboxInTime(504, "no_sandbox", "none warm within 60s"), True),
    (QueueFull(429, "queue_full", "the queue is full"), True),
    (LeaseEnded(410, "lease_ended", "the lease expired"), True),
    (httpx.ConnectError("connection refused"), True),
    (httpx.ReadTimeout("timed out"), True),
    (Forbidden(403, "forbidden", "not your pool"), False),
    (NotFound(404, "no_pool", "no pool tasks"), False),
    (PolicyConflict(409, "stale", "too stale"), False),
    (SandfleetError(422, "invalid", "timeout_s must be positive"), False),
    (ValueError("the edit's anchor occurs 0 times, not once"), False),
    (KeyError("task"), False),
]


@pytest.mark.parametrize(("error", "fleets"), ERRORS, ids=[type(e).__name__ for e, _ in ERRORS])
def test_the_fleet_failing_is_infrastructure_and_the_callers_mistakes_are_not(
    error: BaseException, fleets: bool
) -> None:
    assert is_infrastructure(error) is fleets
