"""Demand-driven warm targets: lease rate x spin-up time plus headroom (Little's law), with a cool-down."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sandfleet.core.model import AutoscalingSpec

RATE_WINDOW_SECONDS = 60.0
# Until the operator has seen a sandbox start, assume a cold start costs this much.
DEFAULT_SPINUP_SECONDS = 2.0


@dataclass(frozen=True)
class AutoscaleState:
    """Recent recommendations (unix seconds, target): the target falls only once all of them have."""

    recommendations: tuple[tuple[float, int], ...] = ()


def lease_rate(lease_times: Sequence[float], now: float, window: float = RATE_WINDOW_SECONDS) -> float:
    """Leases per second over the last `window` seconds."""
    recent = sum(1 for t in lease_times if now - window < t <= now)
    return recent / window


def littles_law_target(rate: float, spinup_seconds: float, headroom: float) -> int:
    """Warm sandboxes needed so leases arriving at `rate` find one while replacements spin up."""
    return math.ceil(rate * max(0.0, spinup_seconds) * (1.0 + headroom) - 1e-9)


def desired_replicas(
    spec: AutoscalingSpec,
    lease_times: Sequence[float],
    spinup_seconds: float | None,
    state: AutoscaleState,
    now: float,
) -> tuple[int, AutoscaleState]:
    """The warm target now and the state to pass next time.

    Rises at once with demand; falls only after demand has stayed lower for scaleDownDelaySeconds
    (the highest recommendation within that delay wins), so a lull does not drain the pool.
    """
    spinup = DEFAULT_SPINUP_SECONDS if spinup_seconds is None else spinup_seconds
    raw = littles_law_target(lease_rate(lease_times, now), spinup, spec.headroom)
    bounded = max(spec.min_replicas, min(spec.max_replicas, raw))
    horizon = now - spec.scale_down_delay_seconds
    kept = tuple((t, v) for t, v in state.recommendations if t > horizon)
    recommendations = (*kept, (now, bounded))
    target = max(v for _, v in recommendations)
    # Only the running maximum matters: drop entries that can never win again to stay small.
    compact: list[tuple[float, int]] = []
    for t, v in recommendations:
        while compact and compact[-1][1] <= v:
            compact.pop()
        compact.append((t, v))
    return target, AutoscaleState(tuple(compact))
