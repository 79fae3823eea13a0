"""The torch learner path: the same update as numpy (checked on a numpy fake, and on torch itself)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sandfleet.rl import torch_policy
from sandfleet.rl.policy import SoftmaxPolicy, Trajectory
from sandfleet.rl.torch_policy import TorchSoftmaxPolicy, TorchUnavailable, make_policy, resolve_device
from tests.unit.rl import fake_torch

ACTIONS = {"a": 4, "b": 3}


def batches(seed: int, steps: int) -> list[list[Trajectory]]:
    """Batches from a lagging behaviour policy: rewards, stale versions and large IS ratios alike."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        batch = []
        for _ in range(6):
            task = "a" if rng.random() < 0.6 else "b"
            action = int(rng.integers(ACTIONS[task]))
            logp = float(np.log(rng.uniform(0.05, 0.9)))
            version = max(step - int(rng.integers(0, 7)), 0)  # some beyond the bound of 4
            batch.append(Trajectory(task, action, logp, float(rng.random() < 0.5), version))
        out.append(batch)
    return out


def assert_same_training(torch: object, device: str = "cpu") -> None:
    numpy_policy = SoftmaxPolicy(ACTIONS)
    torch_policy_ = TorchSoftmaxPolicy(ACTIONS, device, torch)
    for batch in batches(seed=5, steps=25):
        expected = numpy_policy.update(batch, staleness_bound=4, learning_rate=0.7, clip=1.5)
        got = torch_policy_.update(batch, staleness_bound=4, learning_rate=0.7, clip=1.5)
        assert (got.used, got.dropped_stale, got.version) == (expected.used, expected.dropped_stale,
                                                              expected.version)  # fmt: skip
        assert got.mean_weight == pytest.approx(expected.mean_weight, rel=1e-12)
    snapshot = torch_policy_.snapshot()
    assert isinstance(snapshot, SoftmaxPolicy)
    assert snapshot.version == numpy_policy.version == 25
    for task in ACTIONS:
        np.testing.assert_allclose(snapshot.logits[task], numpy_policy.logits[task], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(torch_policy_.probabilities(task), numpy_policy.probabilities(task),
                                   rtol=1e-12)  # fmt: skip
    assert torch_policy_.baseline == pytest.approx(numpy_policy.baseline)


def test_the_torch_update_is_the_numpy_update_on_a_numpy_fake() -> None:
    assert_same_training(fake_torch)


def test_device_choice() -> None:
    fake_torch.cuda.available = False
    try:
        assert resolve_device("numpy", fake_torch) == "numpy"
        assert resolve_device("auto", fake_torch) == "numpy"
        assert resolve_device("cpu", fake_torch) == "cpu"
        with pytest.raises(TorchUnavailable, match="no CUDA"):
            resolve_device("cuda", fake_torch)
        fake_torch.cuda.available = True
        assert resolve_device("auto", fake_torch) == "cuda"
        assert isinstance(make_policy(ACTIONS, "cuda", torch=fake_torch), TorchSoftmaxPolicy)
        assert isinstance(make_policy(ACTIONS, "numpy"), SoftmaxPolicy)
        with pytest.raises(ValueError, match="device must be"):
            resolve_device("tpu", fake_torch)
    finally:
        fake_torch.cuda.available = False


def test_without_torch_auto_is_numpy_and_cuda_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what an environment without torch sees
    assert resolve_device("auto") == "numpy"
    with pytest.raises(TorchUnavailable, match="pip install torch"):
        resolve_device("cuda")
    with pytest.raises(TorchUnavailable):
        torch_policy.load_torch()


@pytest.mark.torch
def test_the_torch_update_is_the_numpy_update_on_torch() -> None:
    torch = torch_policy.load_torch()  # fails, rather than skips, where -m torch asked for it
    assert_same_training(torch, "cpu")
    if torch.cuda.is_available():
        assert_same_training(torch, "cuda")
