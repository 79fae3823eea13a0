"""What an episode's outcome means for the learner: train on it, or mask it as the fleet's failure.

An `infra_error` (the verifier could not run, the sandbox was lost) and a lease or transport
failure before scoring say nothing about the policy's edit: training on them as reward 0 would
teach the policy to avoid whatever the fleet happened to break on. Such episodes are dropped and
counted. `timed_out` is the policy's doing (its edit made the tests hang): reward 0, trained on,
and counted too. These are pure decisions over plain data; `sandfleet.rl.loop` applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from sandfleet.client import (
    LeaseEnded,
    NoSandboxInTime,
    QueueFull,
    SandfleetError,
)
from sandfleet.wire import Outcome


@dataclass(frozen=True)
class TrainingDecision:
    """Whether an evaluated episode reaches the learner, with which reward."""

    train: bool
    reward: float


def training_decision(outcome: Outcome, reward: float) -> TrainingDecision:
    """The learner's view of an evaluation: masked if the fleet failed, reward 0 if it timed out."""
    if outcome is Outcome.INFRA_ERROR:
        return TrainingDecision(train=False, reward=0.0)
    if outcome is Outcome.TIMED_OUT:
        return TrainingDecision(train=True, reward=0.0)
    return TrainingDecision(train=True, reward=reward)


# The fleet could not give (or keep) a sandbox: no room in the queue, none in time, the lease gone.
_FLEET_FAILURES = (QueueFull, NoSandboxInTime, LeaseEnded)


def is_infrastructure(error: BaseException) -> bool:
    """Whether an episode that raised failed because of the fleet (mask it), not the caller's setup.

    Gateway 5xx answers, a lost sandbox, a lease that ended or never came, and connection failures
    are the fleet's; 4xx refusals (a bad token, an unknown pool, a malformed request) and errors in
    the episode's own code (a task whose anchor is not in the image) stay errors to be fixed.
    """
    if isinstance(error, SandfleetError):
        return error.infrastructure or isinstance(error, _FLEET_FAILURES)
    return isinstance(error, httpx.TransportError)
