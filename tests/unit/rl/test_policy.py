"""The learner's math: truncated importance weights, staleness drops, and learning a real bandit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.rl.policy import (
    SoftmaxPolicy,
    Trajectory,
    fresh_enough,
    softmax,
    truncated_importance_weights,
)


def test_importance_weights_are_truncated_above_only() -> None:
    target = np.log(np.array([0.9, 0.1, 0.5]))
    behaviour = np.log(np.array([0.3, 0.5, 0.5]))
    weights = truncated_importance_weights(target, behaviour, clip=2.0)
    assert weights == pytest.approx([2.0, 0.2, 1.0])
    with pytest.raises(ValueError, match="positive"):
        truncated_importance_weights(target, behaviour, clip=0)


@given(
    st.lists(st.floats(-30, 0), min_size=1, max_size=20),
    st.lists(st.floats(-30, 0), min_size=1, max_size=20),
    st.floats(0.1, 10),
)
def test_importance_weights_bounds(target: list[float], behaviour: list[float], clip: float) -> None:
    n = min(len(target), len(behaviour))
    weights = truncated_importance_weights(np.array(target[:n]), np.array(behaviour[:n]), clip)
    assert np.all(weights >= 0)
    assert np.all(weights <= clip + 1e-12)


def test_staleness_drop() -> None:
    assert list(fresh_enough([10, 8, 7, 11], current=10, bound=2)) == [True, True, False, True]


def test_update_drops_stale_and_counts_versions() -> None:
    policy = SoftmaxPolicy({"t": 3})
    policy.version = 5
    batch = [Trajectory("t", 0, np.log(1 / 3), 1.0, 5), Trajectory("t", 1, np.log(1 / 3), 0.0, 1)]
    stats = policy.update(batch, staleness_bound=2)
    assert (stats.used, stats.dropped_stale, stats.version) == (1, 1, 6)
    assert policy.probabilities("t")[0] > 1 / 3
    all_stale = policy.update([Trajectory("t", 1, 0.0, 1.0, 0)], staleness_bound=2)
    assert (all_stale.used, all_stale.dropped_stale, all_stale.version) == (0, 1, 6)


def test_softmax_is_a_distribution() -> None:
    probs = softmax(np.array([1000.0, 0.0, -1000.0]))
    assert probs.sum() == pytest.approx(1.0)
    assert probs[0] == pytest.approx(1.0)


def test_learns_the_right_edit_with_lagging_actors() -> None:
    # Reward 1 only for action 2; actors act on a policy two versions old, like async actors do.
    rng = np.random.default_rng(3)
    learner = SoftmaxPolicy({"task": 4})
    snapshots = [learner.snapshot(), learner.snapshot()]
    for _ in range(60):
        behaviour = snapshots[0]
        batch = []
        for _ in range(8):
            action, logp = behaviour.sample("task", rng)
            batch.append(Trajectory("task", action, logp, float(action == 2), behaviour.version))
        learner.update(batch, staleness_bound=4)
        snapshots = [snapshots[1], learner.snapshot()]
    assert learner.probabilities("task")[2] > 0.9
