"""coordination.k8s.io Leases without I/O: what a holder writes, and when a silent holder counts as gone.

Two kinds of holder renew one (sandfleet.kube.heartbeat): the operator's leader, on the one Lease
its replicas contend for, and each gateway replica, on a Lease of its own that its peers read. The
fields and their spelling are a wire format: replicas of different versions share these Leases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandfleet.core.timestamps import format_micro_time

# How long a Lease that says nothing of its duration is held for (client-go's default too).
DEFAULT_DURATION_SECONDS = 15.0


def holder_of(lease: Mapping[str, Any]) -> str:
    """Who holds a Lease object: its spec's holderIdentity, "" when nobody does."""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def duration_of(spec: Mapping[str, Any]) -> float:
    """How long a Lease's holder may stay silent before the others may take it over."""
    return float(spec.get("leaseDurationSeconds") or DEFAULT_DURATION_SECONDS)


def renewal(identity: str, lease_seconds: float, now: float) -> dict[str, Any]:
    """What a holder writes on every renewal: itself, its duration, and the time (`now`, Unix seconds)."""
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": int(lease_seconds),
        "renewTime": format_micro_time(now),
    }


def first_hold(identity: str, lease_seconds: float, now: float) -> dict[str, Any]:
    """The spec of a Lease its first holder creates: acquired and renewed now, no transitions yet."""
    spec = renewal(identity, lease_seconds, now)
    return {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0}


def taken(current: Mapping[str, Any], identity: str, lease_seconds: float, now: float) -> dict[str, Any]:
    """A spec renewed by `identity`; a new holder also stamps acquireTime and counts a transition."""
    spec = {**current, **renewal(identity, lease_seconds, now)}
    if str(current.get("holderIdentity") or "") != identity:
        spec["acquireTime"] = spec["renewTime"]
        spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
    return spec


def handed_back(current: Mapping[str, Any]) -> dict[str, Any]:
    """A spec given up by its holder: unheld, and for a second only, so another takes it at once."""
    return {**current, "holderIdentity": "", "leaseDurationSeconds": 1}


def may_take(holder: str, identity: str, silent_seconds: float, duration_seconds: float) -> bool:
    """Whether `identity` may write itself into a Lease `holder` holds: unheld, ours, or silent too long."""
    return not holder or holder == identity or silent_seconds > duration_seconds


@dataclass
class LastChange:
    """When a Lease was last seen to change (its holder or its resourceVersion), by the reader's clock.

    A holder counts as gone once its Lease has not changed for a whole duration by our own clock (as
    client-go does), never by its renewTime, so clock skew between replicas cannot make two leaders.
    """

    seen: tuple[str, str] | None = None
    at: float = 0.0

    def silent_for(self, lease: Mapping[str, Any], now: float) -> float:
        """Note `lease` as read at `now`; how long it has been the same, by our clock (0.0 if it changed)."""
        seen = (holder_of(lease), str((lease.get("metadata") or {}).get("resourceVersion")))
        if seen != self.seen:
            self.seen, self.at = seen, now
        return now - self.at
