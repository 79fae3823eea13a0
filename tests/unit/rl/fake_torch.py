"""The few torch calls `sandfleet.rl.torch_policy` makes, on numpy: to check its math without torch.

It proves the torch path's update is the numpy update, step by step; that torch itself computes
these ops as numpy does is checked by the `torch` marked test where torch is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

float64 = np.float64


class Tensor(np.ndarray):
    """An ndarray with the tensor methods the policy calls."""

    def cpu(self) -> Tensor:
        return self

    def numpy(self) -> np.ndarray:
        return np.asarray(self)


def _t(value: Any) -> Tensor:
    return np.asarray(value, dtype=np.float64).view(Tensor)


def zeros(n: int, dtype: Any = None, device: str = "cpu") -> Tensor:
    return _t(np.zeros(n))


def zeros_like(value: Tensor) -> Tensor:
    return _t(np.zeros_like(value))


def tensor(data: Sequence[float], dtype: Any = None, device: str = "cpu") -> Tensor:
    return _t(data)


def softmax(value: Tensor, dim: int = 0) -> Tensor:
    shifted = np.asarray(value) - np.max(value)
    exp = np.exp(shifted)
    return _t(exp / exp.sum())


def log(value: Any) -> Tensor:
    return _t(np.log(value))


def exp(value: Any) -> Tensor:
    return _t(np.exp(value))


def clamp(value: Any, max: float) -> Tensor:
    return _t(np.minimum(value, max))


def stack(values: Sequence[Any]) -> Tensor:
    return _t(np.stack([np.asarray(v) for v in values]))


class cuda:  # noqa: N801 - torch's own name
    available = False

    @classmethod
    def is_available(cls) -> bool:
        return cls.available
