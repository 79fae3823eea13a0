"""Times as the Kubernetes API spells them (RFC 3339, UTC): read into Unix seconds, and written back.

`Time` fields (creationTimestamp, a condition's lastTransitionTime, a SandboxPrewarm's expiresAt)
are written to the second; `MicroTime` fields (a Lease's renewTime and acquireTime) to the
microsecond, as are the operator's Events.
"""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(value: str | datetime | None) -> float | None:
    """Unix seconds from an RFC 3339 timestamp as the apiserver writes them (or a parsed one)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if not value:
        return None
    return datetime.fromisoformat(value).timestamp()


def format_time(unix: float) -> str:
    """A `Time`: RFC 3339 to the second, in UTC (2024-05-01T12:00:00Z)."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(unix: float) -> str:
    """A `MicroTime`: RFC 3339 to the microsecond, in UTC (2024-05-01T12:00:00.000000Z)."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
