"""Kubernetes resource quantities as integers: CPU in millicores, memory in bytes, pods as a count."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL.update({"k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12")})
_DECIMAL.update({"P": Decimal("1e15"), "E": Decimal("1e18")})


def parse_quantity(value: str | int | float) -> Decimal:
    """A quantity such as `250m`, `1.5`, `256Mi` or `1e3` as an exact number of base units."""
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = value.strip()
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix):
            return _number(text[: -len(suffix)], value) * factor
    if text[-1:].isalpha() and text[-1:] in _DECIMAL:
        return _number(text[:-1], value) * _DECIMAL[text[-1]]
    return _number(text, value)


def _number(text: str, original: object) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {original!r}") from None


@dataclass(frozen=True)
class Resources:
    """An amount of the resources the scheduler counts for a sandbox: CPU, memory and a pod slot."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    pods: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_millis + other.cpu_millis, self.memory_bytes + other.memory_bytes, self.pods + other.pods
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_millis - other.cpu_millis, self.memory_bytes - other.memory_bytes, self.pods - other.pods
        )

    def fits(self, request: Resources) -> int:
        """How many copies of `request` fit in this amount (0 when any dimension is exhausted)."""
        counts = []
        for have, need in (
            (self.cpu_millis, request.cpu_millis),
            (self.memory_bytes, request.memory_bytes),
            (self.pods, request.pods),
        ):
            if need > 0:
                counts.append(max(0, have) // need)
            elif have < 0:
                counts.append(0)
        return min(counts) if counts else 0

    @staticmethod
    def from_mapping(values: dict[str, Any] | None, pods: int = 0) -> Resources:
        """CPU and memory from a requests/allocatable mapping; `pods` from it when present."""
        values = values or {}
        cpu = math.ceil(parse_quantity(values["cpu"]) * 1000) if "cpu" in values else 0
        memory = math.ceil(parse_quantity(values["memory"])) if "memory" in values else 0
        pod_slots = int(parse_quantity(values["pods"])) if "pods" in values else pods
        return Resources(cpu, memory, pod_slots)
