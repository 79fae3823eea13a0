"""The same softmax policy and off-policy update as `policy.SoftmaxPolicy`, on torch tensors (GPU).

Optional: torch is imported only when a learner asks for `--device cuda|cpu|auto`; numpy stays the
default and nothing else imports this module. The math is the numpy update line for line (staleness
drops, truncated importance weights, REINFORCE with a per-task baseline), in float64, so both give
the same weights for the same batches (tests/unit/rl/test_torch_policy.py checks it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from sandfleet.rl.policy import Array, SoftmaxPolicy, Trajectory, UpdateStats, fresh_enough

DEVICES = ("numpy", "auto", "cpu", "cuda")


class TorchUnavailable(RuntimeError):
    """torch (or CUDA) was asked for but is not there; the message says what to install or pass."""


def load_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise TorchUnavailable(
            "torch is not installed: install it (pip install torch) or use --device numpy"
        ) from None


class TorchSoftmaxPolicy:
    """Logits per task as float64 tensors on `device`; `version` counts learner updates."""

    def __init__(self, actions: dict[str, int], device: str = "cpu", torch: Any = None) -> None:
        self.torch = torch if torch is not None else load_torch()
        self.device = device
        self.logits: dict[str, Any] = {
            task: self.torch.zeros(n, dtype=self.torch.float64, device=device) for task, n in actions.items()
        }
        self.baseline: dict[str, float] = dict.fromkeys(actions, 0.0)
        self.version = 0

    def _probs(self, task: str) -> Any:
        return self.torch.softmax(self.logits[task], dim=0)

    def probabilities(self, task: str) -> Array:
        result: Array = np.asarray(self._probs(task).cpu().numpy(), dtype=np.float64)
        return result

    def snapshot(self) -> SoftmaxPolicy:
        """The weights as numpy (actors sample on CPU; the wire format is the numpy policy's)."""
        copy = SoftmaxPolicy({t: int(v.shape[0]) for t, v in self.logits.items()})
        copy.logits = {
            t: np.asarray(v.cpu().numpy(), dtype=np.float64).copy() for t, v in self.logits.items()
        }
        copy.version = self.version
        return copy

    def update(
        self,
        batch: Sequence[Trajectory],
        staleness_bound: int,
        learning_rate: float = 0.5,
        clip: float = 2.0,
        baseline_rate: float = 0.2,
    ) -> UpdateStats:
        """One policy-gradient step, as `SoftmaxPolicy.update` does it, with tensors."""
        if clip <= 0:
            raise ValueError(f"the truncation level must be positive, got {clip}")
        keep = fresh_enough([t.policy_version for t in batch], self.version, staleness_bound)
        used = [t for t, k in zip(batch, keep, strict=True) if k]
        dropped = len(batch) - len(used)
        if not used:
            return UpdateStats(0, dropped, 0.0, 0.0, self.version)
        torch = self.torch
        probs = {task: self._probs(task) for task in {t.task for t in used}}
        target = torch.stack([torch.log(probs[t.task][t.action]) for t in used])
        behaviour = torch.tensor([t.behaviour_logp for t in used], dtype=torch.float64, device=self.device)
        ratios = torch.exp(torch.clamp(target - behaviour, max=50.0))  # no overflow
        weights = torch.clamp(ratios, max=clip)
        gradients = {task: torch.zeros_like(v) for task, v in self.logits.items()}
        for index, trajectory in enumerate(used):
            advantage = trajectory.reward - self.baseline[trajectory.task]
            score = -probs[trajectory.task]
            score[trajectory.action] += 1.0  # d log pi(a) / d logits
            gradients[trajectory.task] += weights[index] * advantage * score
        for task, gradient in gradients.items():
            self.logits[task] = self.logits[task] + learning_rate * gradient / len(used)
        for trajectory in used:
            b = self.baseline[trajectory.task]
            self.baseline[trajectory.task] = b + baseline_rate * (trajectory.reward - b)
        self.version += 1
        rewards = [t.reward for t in used]
        return UpdateStats(
            len(used), dropped, float(np.mean(rewards)), float(weights.mean().item()), self.version
        )


def resolve_device(device: str, torch: Any = None) -> str:
    """Which backend a learner uses: numpy, or torch on cpu/cuda (`auto`: cuda when available)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "numpy":
        return "numpy"
    if torch is None:
        try:
            torch = load_torch()
        except TorchUnavailable:
            if device == "auto":
                return "numpy"
            raise
    cuda = bool(torch.cuda.is_available())
    if device == "auto":
        return "cuda" if cuda else "numpy"
    if device == "cuda" and not cuda:
        raise TorchUnavailable("--device cuda: torch sees no CUDA device (use --device auto or numpy)")
    return device


def make_policy(
    actions: dict[str, int], device: str, seed: int = 0, torch: Any = None
) -> SoftmaxPolicy | TorchSoftmaxPolicy:
    """The learner's policy for `device` (after `resolve_device`): SoftmaxPolicy or TorchSoftmaxPolicy."""
    resolved = resolve_device(device, torch)
    if resolved == "numpy":
        return SoftmaxPolicy(actions, seed=seed)
    return TorchSoftmaxPolicy(actions, resolved, torch)
