"""Sandbox resource limits: parsing Kubernetes-style quantities (512Mi, 500m) into plain numbers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i|[kMGT])?\s*$")

MIN_MEMORY_BYTES = 32 << 20
MIN_PIDS = 8


class LimitError(ValueError):
    """A limit that cannot be parsed or makes no sense; the message says which and why."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandbox may use: memory in bytes, CPUs (fractional), and process count."""

    memory_bytes: int = 512 << 20
    cpus: float = 1.0
    pids: int = 256

    def cpu_quota(self, period_us: int = 100_000) -> tuple[int, int]:
        """CFS (quota, period) in microseconds for this many CPUs."""
        return max(round(self.cpus * period_us), 1000), period_us


def parse_memory(text: str | int) -> int:
    """Bytes from an integer or a quantity such as 512Mi, 1Gi or 1.5G."""
    if isinstance(text, int):
        value = text
    else:
        match = _QUANTITY.match(text)
        if match is None:
            raise LimitError(f"memory {text!r} is not a quantity like 512Mi or 1Gi")
        number, suffix = match.groups()
        scale = _BINARY.get(suffix or "", 0) or _DECIMAL.get(suffix or "", 1)
        try:
            value = int(Decimal(number) * scale)
        except InvalidOperation:
            raise LimitError(f"memory {text!r} is not a number") from None
    if value < MIN_MEMORY_BYTES:
        raise LimitError(f"memory {text!r} is below the minimum of {MIN_MEMORY_BYTES >> 20}Mi")
    return value


def parse_cpus(text: str | float | int) -> float:
    """CPUs from a number (1, 0.5) or millicores (500m)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    elif isinstance(text, str):
        raw = text.strip()
        try:
            value = float(Decimal(raw[:-1]) / 1000) if raw.endswith("m") else float(Decimal(raw))
        except InvalidOperation:
            raise LimitError(f"cpu {text!r} is not a number or millicores like 500m") from None
    else:
        raise LimitError(f"cpu {text!r} is not a number")
    if not 0.01 <= value <= 1024:
        raise LimitError(f"cpu {text!r} must be between 10m and 1024")
    return value


def parse_pids(value: str | int) -> int:
    """A process-count limit."""
    try:
        pids = int(value)
    except (TypeError, ValueError):
        raise LimitError(f"pids {value!r} is not an integer") from None
    if pids < MIN_PIDS:
        raise LimitError(f"pids {value!r} is below the minimum of {MIN_PIDS}")
    return pids


def limits_from(
    memory: str | int | None = None, cpus: str | float | None = None, pids: str | int | None = None
) -> SandboxLimits:
    """Build limits from optional quantities, keeping defaults for what is not given."""
    default = SandboxLimits()
    return SandboxLimits(
        memory_bytes=default.memory_bytes if memory is None else parse_memory(memory),
        cpus=default.cpus if cpus is None else parse_cpus(cpus),
        pids=default.pids if pids is None else parse_pids(pids),
    )
